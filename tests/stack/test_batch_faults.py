"""Faults around the batch protocol: a killed extract, bad END messages, backfills and re-runs."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import psycopg2
import pytest

from tidemark.batch.steps import BatchFailed, commit_state
from tidemark.protocol import control
from tidemark.protocol.kafka_io import end_offsets
from tidemark.sink import stage_table
from tidemark_workshop.stack.batchrun import PAYMENTS_DDL, dead_letters, insert_payments, make_pipeline
from tidemark_workshop.stack.spark import submit_command


def target_count(pipe) -> int:
    return pipe.query_wh(f"SELECT count(*) FROM {pipe.spec.target_table}")[0][0]


@pytest.mark.kafka_transport("it watches the extract's records reach the topic; a direct extract killed mid-way: "
                             "test_scheduler's worker killed mid-extract")
def test_killed_extract_leaves_nothing_and_the_retry_applies_once(settings, tmp_path):
    pipe = make_pipeline(settings, tmp_path, PAYMENTS_DDL)
    insert_payments(pipe, 1, 400_000)
    plan = pipe.plan("run-kill")
    attempt1 = pipe.begin(plan)
    cmd, env = submit_command(settings, "extract_window.py", pipe.extract_args(plan, attempt1, tmp_path / "r1.json"),
                              secret=settings.pg_password)
    before = sum(end_offsets(settings.kafka_bootstrap, pipe.spec.topic).values())
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while sum(end_offsets(settings.kafka_bootstrap, pipe.spec.topic).values()) < before + 1000:
            assert proc.poll() is None, "extract finished before it could be killed"
            assert time.monotonic() < deadline, "extract never started writing"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    written = sum(end_offsets(settings.kafka_bootstrap, pipe.spec.topic).values()) - before
    assert 1000 <= written < 400_000, f"kill came too late to test anything: {written} records written"

    pipe.sink()  # the partial attempt is staged but never applied: there is no END
    assert target_count(pipe) == 0
    assert pipe.state(plan.batch_id, attempt1) == "open"

    attempt2 = pipe.begin(plan)  # what the extract task's retry does
    pipe.end(plan, attempt2, pipe.extract(plan, attempt2))
    summary = pipe.sink()
    assert pipe.state(plan.batch_id, attempt2) == "committed"
    assert pipe.state(plan.batch_id, attempt1) == "superseded"
    assert target_count(pipe) == 400_000
    assert summary["staged"] == 400_000
    assert pipe.query_wh("SELECT count(*) FROM tidemark_control.staged_totals WHERE batch_id = %s", (plan.batch_id,))[0][0] == 0
    for attempt in (attempt1, attempt2):  # both attempts' stage tables are gone
        assert pipe.query_wh("SELECT to_regclass(%s)", (stage_table(plan.batch_id, attempt),))[0][0] is None
    source_sum = pipe.rows("source", "amount")
    assert sum(v[0] for v in source_sum.values()) == pipe.query_wh(
        f"SELECT sum(amount) FROM {pipe.spec.target_table}")[0][0]


def test_bad_end_messages_are_handled_and_explained(settings, tmp_path):
    """Duplicated, tampered, missing, ghost and replayed ENDs. Through Kafka the sink refuses tampered
    totals at END; a direct batch's (``make test-direct``) are refused before END, its attempt left open."""
    pipe = make_pipeline(settings, tmp_path, PAYMENTS_DDL)
    direct = pipe.spec.transport == "direct"
    bootstrap = settings.kafka_bootstrap
    insert_payments(pipe, 1, 300)
    a = pipe.plan("run-a")
    a1 = pipe.begin(a)
    report_a = pipe.extract(a, a1)
    pipe.end(a, a1, report_a)
    pipe.send_end(a, a1, report_a)  # duplicated END: same totals, a no-op

    insert_payments(pipe, 1001, 1100)
    b = pipe.plan("run-b")
    b1 = pipe.begin(b)
    report_b = pipe.extract(b, b1)
    report_b["totals"]["0"]["rows"] += 1  # wrong count on partition 0
    report_b["totals"]["1"]["checksum"] += 12345  # wrong checksum on partition 1
    if direct:
        with pytest.raises(control.ProtocolError, match="staged loads do not add up to its totals: partition 0: loads"):
            pipe.end(b, b1, report_b)
    else:
        pipe.end(b, b1, report_b)

    d = pipe.plan("run-d")
    d1 = pipe.begin(d)  # BEGIN without END

    ghost = control.messages("END", pipeline=pipe.spec.name, batch_id="ghost-batch", attempt=1, window=a.window.to_json(),
                             partitions=3, totals={p: control.PartitionTotals(rows=1, checksum=1) for p in range(3)})
    control.send(bootstrap, pipe.spec.topic, ghost, transactional_id="test-ghost", keyring=pipe.keyring)

    pipe.sink()
    assert pipe.state(a.batch_id, a1) == "committed"
    assert target_count(pipe) == 300  # only batch A; B refused (direct: open, no END), D still open
    wh = pipe.wh()
    if direct:  # no END was sent: B waits, open, for an END that matches its stage
        assert commit_state(pipe.spec, wh, b.batch_id, b1) is False
        assert pipe.state(b.batch_id, b1) == "open"
    else:
        with pytest.raises(BatchFailed) as refused:
            commit_state(pipe.spec, wh, b.batch_id, b1)
        text = str(refused.value)
        assert "REFUSED" in text and "partition 0: 1 record(s) the extract wrote never reached the stage" in text
        assert "partition 1: as many records as the extract wrote, other content" in text
        exp_rows = report_b["totals"]["0"]["rows"]
        assert f"rows={exp_rows}" in text and f"staged rows={exp_rows - 1}" in text
        assert "clear the DAG run" in text  # says what to do next
    assert commit_state(pipe.spec, wh, d.batch_id, d1) is False  # waiting: BEGIN seen, no END
    assert pipe.state(d.batch_id, d1) == "open"
    rejects = pipe.query_wh("SELECT batch_id, reason FROM tidemark_control.sink_rejects WHERE topic = %s", (pipe.spec.topic,))
    assert [r[0] for r in rejects] == ["ghost-batch"] * 3
    assert all("END for unknown batch ghost-batch" in r[1] for r in rejects)
    dead = [d["tidemark.reason"] for d in dead_letters(bootstrap, pipe.spec.topic)]
    assert len(dead) == 3 and all(b"unknown batch ghost-batch" in reason for reason in dead)

    committed_at = pipe.query_wh("SELECT committed_at FROM tidemark_control.batches WHERE batch_id = %s", (a.batch_id,))
    pipe.send_end(a, a1, report_a)  # replayed END of a committed batch
    pipe.sink()
    assert pipe.query_wh("SELECT committed_at FROM tidemark_control.batches WHERE batch_id = %s", (a.batch_id,)) == committed_at
    assert target_count(pipe) == 300
    wh.close()


def test_backfill_reloads_an_interval_without_moving_the_watermark(settings, tmp_path):
    from datetime import datetime, timezone

    pipe = make_pipeline(settings, tmp_path, PAYMENTS_DDL)
    for day, first in ((1, 1), (2, 1001), (3, 2001)):
        insert_payments(pipe, first, first + 999, stamp=f"'2026-03-0{day}T12:00:00Z'::timestamptz + g * interval '1 ms'")
    pipe.run("nightly-1")
    watermark = pipe.watermark()
    assert target_count(pipe) == 3000
    with psycopg2.connect(settings.dsn("tidemark_warehouse")) as conn, conn.cursor() as cur:
        cur.execute(f"DELETE FROM {pipe.spec.target_table} WHERE id BETWEEN 1001 AND 2000")  # day 2 lost downstream
    conn.close()
    interval = (datetime(2026, 3, 2, tzinfo=timezone.utc), datetime(2026, 3, 3, tzinfo=timezone.utc))
    plan, _ = pipe.run("backfill-1", interval=interval)
    assert plan.window.backfill and str(plan.window) == (
        "backfill (2026-03-01T23:59:59.999999+00:00, 2026-03-02T23:59:59.999999+00:00]")
    assert target_count(pipe) == 3000
    assert pipe.watermark() == watermark, "a backfill moved the watermark"
    snapshot = pipe.rows("target", "amount, updated_at")
    pipe.run("backfill-2", interval=interval)  # the same interval again: nothing changes
    assert pipe.rows("target", "amount, updated_at") == snapshot == pipe.rows("source", "amount, updated_at")
    assert pipe.watermark() == watermark


def test_an_empty_window_commits_zero_rows_and_the_next_batch_follows(settings, tmp_path):
    pipe = make_pipeline(settings, tmp_path, PAYMENTS_DDL, write_mode="append_window_replace")
    empty, attempt = pipe.run("nightly-empty")  # nothing in the source yet: no record, only BEGIN and END
    assert pipe.ledger(empty.batch_id) == [(attempt, "committed", 0, None)]
    assert target_count(pipe) == 0  # the target was created from the source's columns, and is empty
    assert pipe.query_wh("SELECT to_regclass(%s)", (stage_table(empty.batch_id, attempt),))[0][0] is None
    assert pipe.watermark() is not None

    insert_payments(pipe, 1, 50)
    pipe.run("nightly-next")
    assert pipe.rows("target", "amount, updated_at") == pipe.rows("source", "amount, updated_at")


def test_abort_drops_what_the_attempt_staged_and_a_later_end_cannot_apply_it(settings, tmp_path):
    pipe = make_pipeline(settings, tmp_path, PAYMENTS_DDL)
    insert_payments(pipe, 1, 500)
    plan = pipe.plan("run-abort")
    attempt = pipe.begin(plan)
    report = pipe.extract(plan, attempt)
    pipe.sink()  # the records are staged; no END yet
    stage = stage_table(plan.batch_id, attempt)
    assert pipe.query_wh(f"SELECT count(*) FROM {stage}")[0][0] == 500

    pipe.abort(plan, attempt, "extract failed on its last try: test")  # what the extract task sends
    pipe.end(plan, attempt, report)  # even a correct END after the ABORT must not apply it
    pipe.sink()
    assert pipe.state(plan.batch_id, attempt) == "aborted"
    assert target_count(pipe) == 0
    assert pipe.query_wh("SELECT to_regclass(%s)", (stage,))[0][0] is None
    assert pipe.query_wh("SELECT count(*) FROM tidemark_control.staged_totals WHERE batch_id = %s", (plan.batch_id,))[0][0] == 0
    with pytest.raises(BatchFailed, match="aborted: aborted by producer: extract failed on its last try: test"):
        commit_state(pipe.spec, pipe.wh(), plan.batch_id, attempt)

    pipe.run("run-abort")  # clearing the task loads the same batch as a new attempt
    assert pipe.rows("target", "amount, updated_at") == pipe.rows("source", "amount, updated_at")

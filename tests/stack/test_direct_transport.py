"""transport: direct against the real stack: the extract's Spark tasks stage the rows in the warehouse,
BEGIN and END still go through the topic and the ledger, and the sink verifies the stage against the
sealed totals before it applies (docs/control-protocol.md, "The direct transport")."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from test_protocol_v2 import payment, stages
from test_untrusted_input import _corrected_and_loaded, _failed_extract, extracted_batch, produce, rejects, same_rows

from tidemark.protocol.control import ProtocolError
from tidemark.sink import stage_table
from tidemark.status import pipeline_ledger
from tidemark_workshop.stack.batchrun import PAYMENTS_DDL, insert_payments, make_pipeline


def test_a_direct_batch_stages_through_the_warehouse_and_a_record_on_the_topic_cannot_join_it(settings, tmp_path):
    """The extract reports loads, not offsets; a valid record another producer sends with the attempt's
    headers is a dead letter, never applied, and the batch commits equal to the source."""
    pipe, a, a1, report, tags = extracted_batch(settings, tmp_path, transport="direct")
    assert "offsets" not in report and report["loads"], report
    assert sum(rows for _, _, rows, _ in report["loads"]) == report["rows"] == 300
    assert stage_table(a.batch_id, a1) in stages(pipe)  # the tasks staged it before END
    wh = pipe.wh()
    with wh, wh.cursor() as cur:  # the status page counts it already: the ledger has no loads before the report
        (open_attempt,) = pipeline_ledger(cur, pipe.spec.name).unfinished
    wh.close()
    assert (open_attempt.attempt, open_attempt.staged, open_attempt.staged_directly) == (a1, 300, True)
    assert open_attempt.staged_text() == "about 300 rows staged directly"
    tampered = json.loads(json.dumps(report))  # totals changed after the tasks staged: refused before any END
    tampered["totals"]["0"]["rows"] += 1
    with pytest.raises(ProtocolError, match="staged loads do not add up to its totals: partition 0: loads"):
        pipe.end(a, a1, tampered)
    assert pipe.state(a.batch_id, a1) == "open"
    inside = int(datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp() * 1e6)
    produce(settings.kafka_bootstrap, pipe.spec.topic, [(b"900001", payment(900001, 125, b"EUR", inside), tags)])
    pipe.end(a, a1, report)
    summary = pipe.sink()
    state, message, transport = pipe.query_wh(
        "SELECT state, message, transport FROM tidemark_control.batches WHERE batch_id = %s", (a.batch_id,))[0]
    assert (state, transport) == ("committed", "direct"), message
    assert summary["staged"] == 0  # nothing of it came through the topic
    same_rows(pipe)
    assert pipe.query_wh(f"SELECT count(*) FROM {pipe.spec.target_table} WHERE id = 900001") == [(0,)]
    assert [r for *_, r in rejects(pipe) if "staged directly (transport: direct)" in r], rejects(pipe)
    assert stage_table(a.batch_id, a1) not in stages(pipe)

    insert_payments(pipe, 301, 400)  # the next batch, direct too, goes on from its watermark
    pipe.run("run-b")
    same_rows(pipe)


def test_a_superseded_direct_attempt_stages_nothing_more_and_its_stage_never_applies(settings, tmp_path):
    """Attempt 1 staged everything but was never sealed; attempt 2 supersedes it. Attempt 1's extract run
    again (a zombie) is refused by the ledger, attempt 2 commits each row once, and attempt 1's stage goes."""
    pipe, a, a1, _, _ = extracted_batch(settings, tmp_path, transport="direct")
    a2 = pipe.begin(a)
    assert a2 == a1 + 1
    zombie = pipe._submit("extract_window.py", pipe.extract_args(a, a1, tmp_path / "zombie.json"),
                          env={"TIDEMARK_WAREHOUSE_PASSWORD": settings.pg_password})
    assert zombie.returncode == 3, zombie.stderr[-3000:]
    failed = [line for line in (zombie.stdout + zombie.stderr).splitlines() if "FAILED" in line]
    assert failed and f"attempt {a1}" in failed[0] and "superseded" in failed[0], (failed, zombie.stdout[-3000:])
    pipe.end(a, a2, pipe.extract(a, a2))
    pipe.sink()
    assert pipe.state(a.batch_id, a2) == "committed", pipe.ledger(a.batch_id)
    same_rows(pipe)
    assert pipe.query_wh(f"SELECT count(*) FROM {pipe.spec.target_table}") == [(300,)]
    assert {stage_table(a.batch_id, a1), stage_table(a.batch_id, a2)}.isdisjoint(stages(pipe))


def test_a_source_row_the_typed_stage_refuses_fails_the_direct_extract_and_the_next_attempt_loads_exactly(
        settings, tmp_path):
    """The source widened a column after the plan registered its record schema, and a row used the
    room: the stage's types refuse it. Through Kafka that record would be a dead letter and the batch
    refused; a direct extract cannot dead-letter the source's own row, so it fails (exit 3) naming the
    refusal and what to do, and stages nothing that could apply. Undone at the source, the next attempt
    of the same window loads it exactly."""
    pipe = make_pipeline(settings, tmp_path, PAYMENTS_DDL, transport="direct")
    insert_payments(pipe, 1, 300)
    plan = pipe.plan("run-a")
    src = pipe.src()
    with src, src.cursor() as cur:  # after the plan: its record schema says character(3)
        cur.execute(f"ALTER TABLE {pipe.source_table} ALTER COLUMN currency TYPE char(4)")
        cur.execute(f"UPDATE {pipe.source_table} SET currency = 'EURO' WHERE id = 7")
    src.close()
    plan, attempt, cause = _failed_extract(pipe, tmp_path, plan=plan)
    assert "the typed stage refused one of" in cause and "character(3)" in cause, cause
    assert "Next: make the target's record schema hold the value" in cause, cause
    assert pipe.state(plan.batch_id, attempt) == "open"  # the DAG's teardown aborts it: nothing of it applies
    assert stage_table(plan.batch_id, attempt) in stages(pipe)  # made before the tasks ran; the abort drops it
    _corrected_and_loaded(pipe, plan, attempt, "UPDATE {table} SET currency = 'EUR' WHERE id = 7; "
                          "ALTER TABLE {table} ALTER COLUMN currency TYPE char(3)")
    assert stage_table(plan.batch_id, attempt) not in stages(pipe)
    same_rows(pipe)

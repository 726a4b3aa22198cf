"""Protocol version 2 (record_format: avro) against the real stack: typed records, exact values,
schema drift, untrusted records, and version-1 batches still applied (docs/control-protocol.md)."""

from __future__ import annotations

import subprocess
from datetime import datetime, timezone
from decimal import Decimal

import pytest
from test_untrusted_input import extracted_batch, produce, rejects, same_rows

from tidemark.protocol import faults
from tidemark.protocol.control import loads_totals
from tidemark.protocol.window import PlanError
from tidemark.sink import stage_table
from tidemark.spark import jobs
from tidemark_workshop.stack.batchrun import PAYMENTS_DDL, dead_letters, insert_payments, make_pipeline
from tidemark_workshop.stack.spark import submit_command

WIDE_DDL = """
CREATE TABLE {table} (
    id bigint PRIMARY KEY,
    amount numeric(38,10) NOT NULL,
    rate double precision,
    booked date,
    memo text,
    flag boolean,
    small integer,
    updated_at timestamptz NOT NULL DEFAULT now()
)"""


def stages(pipe) -> set[str]:
    return {f"tidemark_stage.{t}" for (t,) in pipe.query_wh(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'tidemark_stage'")}


@pytest.mark.parametrize("transport", ["kafka", "direct"])
def test_decimals_at_full_precision_and_microsecond_timestamps_survive_bit_for_bit(settings, tmp_path, transport):
    pipe = make_pipeline(settings, tmp_path, WIDE_DDL, record_format="avro", transport=transport)
    conn = pipe.src()
    with conn, conn.cursor() as cur:
        cur.execute(f"""INSERT INTO {pipe.source_table} (id, amount, rate, booked, memo, flag, small, updated_at) VALUES
            (1, 9999999999999999999999999999.9999999999, 0.1, '2026-02-28', 'Zürich "quoted", comma', true, -2147483648,
             '2026-03-01 12:34:56.123456+00'),
            (2, -9999999999999999999999999999.9999999999, NULL, NULL, NULL, NULL, NULL, '1999-12-31 23:59:59.999999+00'),
            (3, 0.0000000001, -1e300, '0001-01-01', '', false, 2147483647, '2026-03-01 12:34:56.000001+00'),
            (4, 0, 'NaN', '9999-12-31', E'line\\nbreak\\ttab', true, 0, '2026-03-01 12:34:56.123457+00')""")
    conn.close()
    plan, attempt = pipe.run("run-1")
    assert plan.schema_version == 1 and plan.writer_schema is not None
    columns = "amount, rate, booked, memo, flag, small, updated_at"
    source, target = pipe.rows("source", columns), pipe.rows("target", columns)
    # compared by repr: exact digits of every Decimal, microseconds and zone of every timestamp, and NaN
    assert len(source) == 4 and {k: repr(v) for k, v in target.items()} == {k: repr(v) for k, v in source.items()}
    assert target[1][0] == Decimal("9999999999999999999999999999.9999999999")
    assert target[1][-1] == datetime(2026, 3, 1, 12, 34, 56, 123456, tzinfo=timezone.utc)
    assert pipe.query_wh("SELECT schema_version, state, transport FROM tidemark_control.batches WHERE batch_id = %s",
                         (plan.batch_id,)) == [(1, "committed", transport)]
    assert stage_table(plan.batch_id, attempt) not in stages(pipe)


@pytest.mark.kafka_transport("the sink's executors stage what they read from the topic; a direct extract killed "
                             "mid-stage: test_scheduler's worker killed mid-extract")
def test_rows_the_executors_staged_for_a_micro_batch_that_never_committed_are_never_applied(settings, tmp_path):
    """The Spark tasks COPY into the stage and commit before the sink's micro-batch transaction does
    (tidemark.batch.stage). Killed in between, their rows stay in the stage under loads nobody accepted;
    the restart stages the records again, and the apply reads the accepted loads only. Upserts: a
    second copy of each row would not break a key, only the counts."""
    pipe = make_pipeline(settings, tmp_path, PAYMENTS_DDL, write_mode="upsert")
    insert_payments(pipe, 1, 5_000)
    plan = pipe.plan("run-1")
    attempt = pipe.begin(plan)
    pipe.end(plan, attempt, pipe.extract(plan, attempt))
    cmd, env = submit_command(settings, jobs.SINK_JOB, pipe.sink_args(), secret=settings.pg_password)
    killed = subprocess.run(cmd, env={**env, faults.ENV: "staged"}, capture_output=True, text=True, timeout=600,
                            start_new_session=True)
    assert killed.returncode != 0, killed.stdout[-3000:]
    stage = stage_table(plan.batch_id, attempt)
    # one load per Spark task and attempt: one task per Kafka partition here
    assert (pipe.query_wh(f'SELECT count(*), count(DISTINCT "tidemark.load") FROM {stage}')
            == [(5_000, pipe.spec.partitions)])
    assert pipe.query_wh("SELECT count(*) FROM tidemark_control.staged_loads WHERE batch_id = %s",
                         (plan.batch_id,)) == [(0,)]
    assert pipe.state(plan.batch_id, attempt) == "sealed"  # END sent, nothing applied

    summary = pipe.sink()  # the same micro-batch again: staged again, under new loads
    assert pipe.state(plan.batch_id, attempt) == "committed", pipe.ledger(plan.batch_id)
    assert summary["staged"] == 5_000
    assert pipe.query_wh(f"SELECT count(*) FROM {pipe.spec.target_table}") == [(5_000,)]
    same_rows(pipe)
    assert stage not in stages(pipe)
    assert pipe.query_wh("SELECT count(*) FROM tidemark_control.staged_loads WHERE batch_id = %s",
                         (plan.batch_id,)) == [(0,)]


@pytest.mark.kafka_transport("the sink's executors stage what they read from the topic; a direct attempt ended "
                             "while its tasks stage: test_direct_transport's superseded attempt")
def test_what_the_executors_staged_for_an_attempt_aborted_in_the_same_micro_batch_is_discarded(settings, tmp_path):
    """The tasks stage the records of an attempt open when the micro-batch began; its ABORT, read in
    the same micro-batch, aborts it first in the driver's transaction: their loads are discarded."""
    pipe, plan, attempt, report, _ = extracted_batch(settings, tmp_path, record_format="avro")
    pipe.abort(plan, attempt, "extract failed on its last try: test")  # the message only; the ledger still open
    summary = pipe.sink()
    assert pipe.state(plan.batch_id, attempt) == "aborted"
    assert summary["staged"] == 0 and summary["discarded"] == report["rows"] == 300, summary
    assert "the executors staged for a now aborted attempt discarded" in pipe.jobs[-1].stdout
    assert stage_table(plan.batch_id, attempt) not in stages(pipe)
    for table in ("staged_loads", "staged_totals"):
        assert pipe.query_wh(f"SELECT count(*) FROM tidemark_control.{table} WHERE batch_id = %s",
                             (plan.batch_id,)) == [(0,)], table
    assert pipe.query_wh(f"SELECT count(*) FROM {pipe.spec.target_table}") == [(0,)]


@pytest.mark.kafka_transport("a stage an earlier sink filled from the topic; no direct counterpart: a direct stage "
                             "always had load ids")
def test_a_stage_an_earlier_version_filled_gains_the_load_column_and_all_its_rows_apply(settings, tmp_path):
    """An upgrade mid-batch: the earlier sink's driver staged records in its own committed transactions,
    into a stage without load ids. The new sink adds the column at start; those rows all count."""
    pipe, plan, attempt, report, _ = extracted_batch(settings, tmp_path, record_format="avro")
    pipe.sink()  # staged, not applied: no END yet
    stage = stage_table(plan.batch_id, attempt)
    wh = pipe.wh()
    with wh, wh.cursor() as cur:  # what the earlier version leaves: its rows, no load column, no loads
        cur.execute(f'ALTER TABLE {stage} DROP COLUMN "tidemark.load"')
        cur.execute("DELETE FROM tidemark_control.staged_loads WHERE batch_id = %s", (plan.batch_id,))
    wh.close()
    pipe.end(plan, attempt, report)
    pipe.sink()
    assert pipe.state(plan.batch_id, attempt) == "committed", pipe.ledger(plan.batch_id)
    same_rows(pipe)
    assert f"stage {stage}, from an earlier version, gained the load column" in pipe.jobs[-1].stdout


def avro_long(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)  # zigzag
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def payment(i: int, cents: int, currency: bytes, micros: int) -> bytes:
    """A PAYMENTS_DDL row in Avro binary, as the extract writes it (schema version 1)."""
    unscaled = cents.to_bytes((cents.bit_length() + 8) // 8, "big", signed=True)
    return (avro_long(i) + avro_long(len(unscaled)) + unscaled + avro_long(len(currency)) + currency
            + avro_long(micros))


@pytest.mark.kafka_transport("records on the topic are checked one by one; with a direct attempt's headers each is "
                             "a dead letter (test_direct_transport)")
def test_untrusted_records_are_dead_letters_and_the_genuine_batch_loads(settings, tmp_path):
    """Records another producer sends with the attempt's headers: each a dead letter with its reason;
    outside the offsets the extract wrote, they cannot refuse its batch."""
    pipe, a, a1, report, tags = extracted_batch(settings, tmp_path, record_format="avro")
    bootstrap = settings.kafka_bootstrap
    inside = int(datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp() * 1e6)
    bad = {
        "is not an Avro record of schema version 1": (b"900001", b"{\"id\": 900001}"),
        "does not match the primary key in the value": (b"900099", payment(900002, 125, b"EUR", inside)),
        # 1960, below the window's start (above its end lies inside what a batch that reads above may carry)
        "outside the batch's window": (b"900003", payment(900003, 125, b"EUR", -315619200 * 10**6)),
        "not valid UTF-8": (b"900004", payment(900004, 125, b"E\xffR", inside)),
        "contains a NUL character": (b"900005", payment(900005, 125, b"E\x00R", inside)),
    }
    produce(bootstrap, pipe.spec.topic, [(k, v, tags) for k, v in bad.values()])
    pipe.end(a, a1, report)
    pipe.sink()
    state, message = pipe.query_wh("SELECT state, message FROM tidemark_control.batches WHERE batch_id = %s",
                                   (a.batch_id,))[0]
    assert state == "committed", message
    same_rows(pipe)
    got = rejects(pipe)
    for expected in bad:
        assert sum(expected in reason for *_, reason in got) == 1, (expected, got)
    assert {d["value"] for d in dead_letters(bootstrap, pipe.spec.topic)} == {v for _, v in bad.values()}
    assert stage_table(a.batch_id, a1) not in stages(pipe)

    insert_payments(pipe, 301, 400)
    pipe.run("run-b")
    same_rows(pipe)


def test_a_version_1_batch_on_the_topic_still_applies_and_added_and_widened_columns_reach_the_target(settings, tmp_path):
    pipe = make_pipeline(settings, tmp_path, PAYMENTS_DDL, record_format="json")  # protocol version 1
    insert_payments(pipe, 1, 100)
    v1 = pipe.plan("run-1")
    v1_attempt = pipe.begin(v1)
    pipe.end(v1, v1_attempt, pipe.extract(v1, v1_attempt))  # on the topic, not yet applied
    assert v1.schema_version is None

    pipe = pipe.with_fields(record_format="avro")  # the sink that applies it reads version 2 too
    insert_payments(pipe, 101, 200)
    v2, _ = pipe.run("run-2")
    assert v2.schema_version == 1
    assert pipe.query_wh("SELECT batch_id, state FROM tidemark_control.batches WHERE batch_id IN (%s, %s) "
                         "ORDER BY planned_at", (v1.batch_id, v2.batch_id)) == [(v1.batch_id, "committed"),
                                                                               (v2.batch_id, "committed")]
    same_rows(pipe)

    conn = pipe.src()
    with conn, conn.cursor() as cur:  # a column added at the source between two batches
        cur.execute(f"ALTER TABLE {pipe.source_table} ADD COLUMN fee numeric(10,4)")
        cur.execute(f"INSERT INTO {pipe.source_table} (id, amount, fee) SELECT g, g * 0.37, g * 0.0001 "
                    "FROM generate_series(201, 250) g")
    conn.close()
    v3, _ = pipe.run("run-3")
    assert v3.schema_version == 2
    assert pipe.rows("target", "amount, fee") == pipe.rows("source", "amount, fee")

    conn = pipe.src()
    with conn, conn.cursor() as cur:  # widened: the target widens as the next batch commits, its rows kept
        cur.execute(f"ALTER TABLE {pipe.source_table} ALTER COLUMN fee TYPE numeric(14,6), "
                    "ALTER COLUMN amount TYPE numeric(22,2)")
        cur.execute(f"INSERT INTO {pipe.source_table} (id, amount, fee) SELECT g, 10.0 ^ 19 + g, g * 0.000001 "
                    "FROM generate_series(251, 260) g")  # amounts its old type could not hold
    conn.close()
    v4, _ = pipe.run("run-4")
    assert v4.schema_version == 3
    assert pipe.query_wh("SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = %s::regclass "
                         "AND attname IN ('amount', 'fee') ORDER BY attname",
                         (pipe.spec.target_table,)) == [("numeric(22,2)",), ("numeric(14,6)",)]
    assert pipe.rows("target", "amount, fee") == pipe.rows("source", "amount, fee")

    conn = pipe.src()
    with conn, conn.cursor() as cur:  # narrowed: refused at plan, with both schemas
        cur.execute(f"ALTER TABLE {pipe.source_table} ALTER COLUMN fee TYPE numeric(6,4)")
    conn.close()
    with pytest.raises(PlanError) as refused:
        pipe.plan("run-5")
    text = str(refused.value)
    assert "changed fee: numeric(14,6) -> numeric(6,4)" in text
    assert "Registered schema: (id bigint NOT NULL, amount numeric(22,2) NOT NULL" in text
    assert "source now: (" in text and "fee numeric(6,4))" in text


@pytest.mark.kafka_transport("the sink's executors COPY what they read from the topic; a source row the typed "
                             "stage refuses fails a direct extract instead (test_direct_transport)")
def test_a_record_the_typed_stage_refuses_is_a_dead_letter_alone_and_the_genuine_batch_commits(settings, tmp_path):
    """A record that decodes and passes Spark's checks but that the stage's types refuse (here a
    four-letter currency for char(3)), sent into the batch by another producer: the task that read
    it halves its COPY until that record stands alone, stages the genuine records it read beside it,
    and hands back only that one, as a dead letter with the refusal and its bytes; the genuine batch
    commits (issue 29: before, the task's genuine records went with it and the batch was refused)."""
    pipe, a, a1, report, tags = extracted_batch(settings, tmp_path, record_format="avro")
    bootstrap = settings.kafka_bootstrap
    inside = int(datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp() * 1e6)
    forged = payment(900001, 125, b"EURO", inside)
    produce(bootstrap, pipe.spec.topic, [(b"900001", forged, tags)], partition=0)  # after the extract's records
    assert loads_totals(report["totals"])[0].rows > 1  # the forged record shares its task with genuine ones
    pipe.end(a, a1, report)
    pipe.sink()

    assert pipe.state(a.batch_id, a1) == "committed", pipe.ledger(a.batch_id)
    same_rows(pipe)
    (partition, reason), = pipe.query_wh("SELECT partition, reason FROM tidemark_control.sink_rejects "
                                         "WHERE topic = %s", (pipe.spec.topic,))
    assert partition == 0 and "the typed stage refused this record of batch" in reason and "character(3)" in reason
    assert [d["value"] for d in dead_letters(bootstrap, pipe.spec.topic)] == [forged]  # the bytes that travelled
    assert pipe.query_wh(f"SELECT count(*) FROM {pipe.spec.target_table} WHERE id = 900001") == [(0,)]
    assert stage_table(a.batch_id, a1) not in stages(pipe)

    insert_payments(pipe, 301, 400)
    pipe.run("run-b")
    same_rows(pipe)



def test_a_column_added_with_a_constant_default_keeps_the_rows_loaded_before_equal_to_the_source(settings, tmp_path):
    pipe = make_pipeline(settings, tmp_path, PAYMENTS_DDL, record_format="avro")
    insert_payments(pipe, 1, 100)
    pipe.run("run-1")
    conn = pipe.src()
    with conn, conn.cursor() as cur:  # between two batches: the 100 rows loaded get 'n/a' at the source
        cur.execute(f"ALTER TABLE {pipe.source_table} ADD COLUMN note text NOT NULL DEFAULT 'n/a', "
                    "ADD COLUMN fee numeric(10,4) DEFAULT 0.5, ADD COLUMN memo text")
    conn.close()
    insert_payments(pipe, 101, 150)
    pipe.run("run-2")
    assert pipe.rows("target", "amount, note, fee, memo") == pipe.rows("source", "amount, note, fee, memo")
    assert pipe.query_wh(f"SELECT count(*) FROM {pipe.spec.target_table} WHERE note = 'n/a' AND fee = 0.5") == [(150,)]

    conn = pipe.src()
    with conn, conn.cursor() as cur:  # a volatile default: PostgreSQL writes each row its own value
        cur.execute(f"ALTER TABLE {pipe.source_table} ADD COLUMN token text DEFAULT md5(random()::text)")
    conn.close()
    with pytest.raises(PlanError) as refused:
        pipe.plan("run-3")
    text = str(refused.value)
    assert "source column token text (default md5((random())::text)) is new to the target" in text, text
    assert "150 source row(s) the batches loaded" in text and "refused" in text
    assert f"run tidemark_reconcile_{pipe.spec.name} with scope full and repair true" in text
    assert pipe.query_wh("SELECT count(*) FROM information_schema.columns WHERE table_name = %s AND column_name = "
                         "'token'", (pipe.spec.target_table.split(".")[-1],)) == [(0,)]

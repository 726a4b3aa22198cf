"""Nothing on a topic can stall a pipeline or corrupt the books (real Kafka, Spark, PostgreSQL).

Malformed data records and forged or malformed control messages are injected next to a real
batch; each becomes a dead letter with its reason, the sink never crash-loops, and the next good
batch of the same pipeline loads and equals the source key by key.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

from confluent_kafka import Producer
from pydantic import ValidationError

from tidemark.batch import steps
from tidemark.protocol.control import HEADER_ATTEMPT, HEADER_BATCH, HEADER_CONTROL, ControlMessage
from tidemark.protocol.kafka_io import producer_config
from tidemark_workshop.stack.batchrun import PAYMENTS_DDL, dead_letters, insert_payments, make_pipeline

INSIDE = "2026-01-01T00:00:00.000000Z"  # inside every window planned here (from 2000 to now)


def produce(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes, list[tuple[str, bytes]]]],
            partition: int | None = None) -> None:
    producer = Producer(producer_config(bootstrap))
    for key, value, headers in records:
        kwargs = {"partition": partition} if partition is not None else {}
        producer.produce(topic, key=key, value=value, headers=headers, **kwargs)
    assert producer.flush(30) == 0


def same_rows(pipe) -> None:
    source, target = pipe.rows("source", "amount, currency, updated_at"), pipe.rows("target", "amount, currency, updated_at")
    assert source and target == source


def rejects(pipe) -> list[tuple]:
    return pipe.query_wh("SELECT batch_id, attempt, reason FROM tidemark_control.sink_rejects WHERE topic = %s "
                         "ORDER BY partition, kafka_offset", (pipe.spec.topic,))


def extracted_batch(settings, tmp_path, **fields):
    """A PAYMENTS_DDL pipeline (spec ``fields`` added) whose rows 1..300 are extracted as a batch,
    before END: the pipeline, plan, attempt, extract report, and the headers a record of that
    attempt carries (to forge records with)."""
    pipe = make_pipeline(settings, tmp_path, PAYMENTS_DDL, **fields)
    insert_payments(pipe, 1, 300)
    plan = pipe.plan("run-a")
    attempt = pipe.begin(plan)
    report = pipe.extract(plan, attempt)
    return pipe, plan, attempt, report, [(HEADER_BATCH, plan.batch_id.encode()), (HEADER_ATTEMPT, str(attempt).encode())]


def test_malformed_records_of_another_producer_go_to_the_dlq_and_the_genuine_batch_loads(settings, tmp_path,
                                                                                            monkeypatch):
    # Checked on Spark's executors, as a backlog is (tidemark.protocol.records.Checker); the other tests'
    # small micro-batches are checked in the sink's own process.
    monkeypatch.setenv("TIDEMARK_EXECUTOR_CHECKS_FROM", "0")
    # Version 1's per-value checks of JSON records; version 2's forged Avro records are
    # test_protocol_v2's (its types are checked once, at plan).
    pipe, a, a1, report, tags = extracted_batch(settings, tmp_path, record_format="json")
    bootstrap = settings.kafka_bootstrap

    def row(i: int, **fields) -> bytes:
        return json.dumps({"id": i, "amount": 1.25, "currency": "EUR", "updated_at": INSIDE, **fields}).encode()

    bad = {
        "not valid UTF-8": (b"900001", b'{"id": 900001, "amount": 1.00, "currency": "EU\xff", "updated_at": "x"}'),
        "nested deeper than 32 levels": (b"900002", b'{"id": 900002, "memo": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
        "'NaN' is not a number a financial column may hold": (b"900003", row(900003, amount="NaN")),
        "has more than 2 decimal place(s) and would be rounded": (
            b"900004", b'{"id": 900004, "amount": 1.123456789012345678901234567890, "currency": "EUR", '
                       b'"updated_at": "' + INSIDE.encode() + b'"}'),
        "is not an ISO-8601 timestamp": (b"900005", row(900005, updated_at="10000-01-01T00:00:00.000000Z")),
        "field 'amount' appears twice": (
            b"900006", b'{"id": 900006, "amount": 1.00, "amount": 2.00, "currency": "EUR", "updated_at": "'
                       + INSIDE.encode() + b'"}'),
        "does not match the primary key in the value": (b"900099", row(900007)),
        # below the window's start (above its end lies inside what a batch that reads above may carry)
        "outside the batch's window": (b"900008", row(900008, updated_at="1960-01-01T00:00:00.000000Z")),
        "field 'iban' is not a column of target": (b"900009", row(900009, iban="DE00")),
        "contains a NUL character": (b"900010", row(900010, currency="E\u0000R")),
    }
    produce(bootstrap, pipe.spec.topic, [(k, v, tags) for k, v in bad.values()])
    pipe.end(a, a1, report)
    pipe.sink()  # would crash-loop on the first three before (CharacterNotInRepertoire, StatementTooComplex)
    sink_log = pipe.jobs[-1].stdout
    assert "spark read and checks" in sink_log and "spark read " not in sink_log.replace("spark read and", ""), \
        "every micro-batch was to be checked on the executors"

    # Sent with the attempt's headers but outside the offsets the extract wrote: each a dead letter with
    # its own reason, and they cannot refuse the genuine batch (a refusal of the extract's own values
    # is test_scheduler's narrow target).
    state, message = pipe.query_wh("SELECT state, message FROM tidemark_control.batches WHERE batch_id = %s",
                                   (a.batch_id,))[0]
    assert state == "committed", message
    same_rows(pipe)
    got = rejects(pipe)
    assert len(got) == len(bad) and all(b == a.batch_id and n == a1 for b, n, _ in got)
    for expected in bad:
        assert sum(expected in reason for *_, reason in got) == 1, (expected, got)
    letters = dead_letters(bootstrap, pipe.spec.topic)
    assert len(letters) == len(bad)
    assert all(d["tidemark.batch"] == a.batch_id.encode() and d["tidemark.attempt"] == str(a1).encode() for d in letters)
    assert {d["value"] for d in letters} == {v for _, v in bad.values()}  # the original bytes, untouched

    insert_payments(pipe, 301, 400)
    b, b1 = pipe.run("run-b")  # the next good batch loads everything the source has
    same_rows(pipe)

    produce(bootstrap, pipe.spec.topic, [(b"400", row(400), [(HEADER_BATCH, b.batch_id.encode()),
                                                            (HEADER_ATTEMPT, str(b1).encode())])])
    pipe.sink()  # a late record of a committed batch is a dead letter, not a silent discard
    late = [r for r in rejects(pipe) if r[0] == b.batch_id]
    assert len(late) == 1 and "late record of batch" in late[0][2] and "not applied" in late[0][2]
    same_rows(pipe)


def _control(what: str, plan: steps.Plan, pipe, attempt: int, **changes) -> bytes:
    """A control message as the orchestrator would send it for ``plan``, with ``changes`` applied
    (dotted paths into the JSON), as a broken producer or a forger holding the key would: signed
    with the stack's own key when it still parses, so the checks behind the signature's are what
    is tested here (unsigned and wrongly signed messages: test_forgery.py)."""
    msg = ControlMessage(kind=what, version=2 if plan.schema_version else 1, schema_version=plan.schema_version or 1,
                         pipeline=pipe.spec.name, batch_id=plan.batch_id, attempt=attempt,
                         window=plan.window.to_json(), partitions=pipe.spec.partitions, partition=0,
                         sent_at=datetime(2026, 1, 1, tzinfo=timezone.utc), **({"reason": "forged"} if what == "ABORT" else {}))
    data = json.loads(msg.model_dump_json())
    for path, value in changes.items():
        node = data
        *parents, leaf = path.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    try:
        return pipe.keyring.sign(ControlMessage.model_validate_json(json.dumps(data))).encode()
    except ValidationError:  # it does not parse: signed or not, the sink refuses it as malformed
        return json.dumps(data).encode()


def test_forged_and_malformed_control_messages_are_dead_letters_and_the_batch_commits(settings, tmp_path):
    pipe = make_pipeline(settings, tmp_path, PAYMENTS_DDL)
    bootstrap = settings.kafka_bootstrap
    insert_payments(pipe, 1, 200)
    a = pipe.plan("run-a")
    a1 = pipe.begin(a)
    pipe.end(a, a1, pipe.extract(a, a1))
    hi = a.window.hi.to_json()["cursor"]
    forged = {
        "has id cursors, pipeline": _control("BEGIN", a, pipe, a1, window={
            "lo": {"cursor": 0, "pk": None}, "hi": {"cursor": 4102444800, "pk": None}, "backfill": False}),
        "is after hi": _control("BEGIN", a, pipe, a1, **{"window.lo.cursor": "2099-01-01T00:00:00+00:00"}),
        "2100-01-01T00:00:00+00:00], the ledger planned": _control("BEGIN", a, pipe, a1, **{"window.hi.cursor": "2100-01-01T00:00:00+00:00"}),
        "which was never planned": _control("BEGIN", a, pipe, 1, batch_id=f"{pipe.spec.name}:forged"),
        "which the orchestrator never opened": _control("BEGIN", a, pipe, a1 + 6),
        "totals.rows: Input should be a valid integer": _control(
            "BEGIN", a, pipe, a1, kind="END", batch_rows=5, totals={"rows": "5", "checksum": "1"}),
        "ABORT rejected": _control("ABORT", a, pipe, a1, **{"window.lo.cursor": "2000-01-01T00:00:00+00:00"}),
        "schema version 2, the ledger planned version 2 schema version 1": _control("BEGIN", a, pipe, a1,
                                                                                    schema_version=2),
    }
    kinds = {"totals.rows: Input should be a valid integer": b"END", "ABORT rejected": b"ABORT"}
    produce(bootstrap, pipe.spec.topic,
            [(None, v, [(HEADER_CONTROL, kinds.get(k, b"BEGIN"))]) for k, v in forged.items()], partition=0)
    pipe.sink()  # before: the integer window crashed the sink (DatatypeMismatch) at every restart

    assert pipe.state(a.batch_id, a1) == "committed"
    got = rejects(pipe)
    assert len(got) == len(forged), got
    for expected in forged:
        assert sum(expected in reason for *_, reason in got) == 1, (expected, got)
    assert pipe.watermark()["cursor"] == hi  # the planned hi, never the forged 2100
    same_rows(pipe)

    steps._broadcast("BEGIN", pipe.spec, bootstrap, a, a1, keyring=pipe.keyring)  # a replayed BEGIN of the committed attempt
    pipe.sink()
    assert pipe.query_wh("SELECT state FROM tidemark_control.batches WHERE batch_id = %s", (a.batch_id,)) == [
        ("committed",)]  # known gap 8: it went back to 'open'
    reasons = [reason for *_, reason in rejects(pipe)]  # a copy of a committed BEGIN: one dead letter per partition
    assert len(reasons) == len(forged) + pipe.spec.partitions, reasons
    assert sum("arrived after its attempt committed" in r for r in reasons) == pipe.spec.partitions, reasons

    insert_payments(pipe, 201, 260)
    pipe.run("run-b")
    same_rows(pipe)


def _failed_extract(pipe, tmp_path, *changes: str, plan=None):
    """The source changed by ``changes`` (SQL, ``{table}`` for the source table), a batch planned (or
    ``plan``) and begun, and its extract failed as a job error (exit 3: no retry helps): the plan,
    attempt and the extract's own cause."""
    from tidemark.spark.entry import EXIT_JOB_ERROR

    src = pipe.src()
    with src, src.cursor() as cur:
        for change in changes:
            cur.execute(change.format(table=pipe.source_table))
    src.close()
    plan = plan or pipe.plan("run-a")
    attempt = pipe.begin(plan)
    proc = pipe.extract_job(plan, attempt, tmp_path / f"failed-{attempt}.json")
    output = proc.stdout + proc.stderr  # the job's own lines go to stdout
    assert proc.returncode == EXIT_JOB_ERROR and "extract_window: FAILED: " in output, output[-3000:]
    return plan, attempt, output.split("extract_window: FAILED: ")[-1]


def _corrected_and_loaded(pipe, plan, attempt, fix: str) -> None:
    """As the DAG does: the failed attempt aborted; then the source corrected and the same window
    loaded by a new attempt, equal to the source."""
    pipe.abort(plan, attempt, "extract failed")
    src = pipe.src()
    with src, src.cursor() as cur:
        cur.execute(fix.format(table=pipe.source_table))
    src.close()
    again = pipe.begin(plan)
    pipe.end(plan, again, pipe.extract(plan, again))
    pipe.sink()
    assert again > attempt and pipe.state(plan.batch_id, again) == "committed"


def test_a_numeric_nan_at_the_source_fails_the_extract_by_key_and_loads_once_corrected(settings, tmp_path):
    """PostgreSQL's numeric holds NaN; no decimal (JDBC's BigDecimal, Avro's decimal) can. The
    extract names the rows instead of the driver's bare "Bad value for type BigDecimal"."""
    pipe = make_pipeline(settings, tmp_path, PAYMENTS_DDL)
    insert_payments(pipe, 1, 300)
    plan, attempt, cause = _failed_extract(pipe, tmp_path, "UPDATE {table} SET amount = 'NaN' WHERE id IN (7, 250)")
    assert f"{pipe.source_table} holds NaN or infinite numerics, which no decimal can carry" in cause, cause
    assert "amount: 2 row(s), e.g. key 7 NaN, key 250 NaN" in cause and "correct those rows at the source" in cause
    _corrected_and_loaded(pipe, plan, attempt, "UPDATE {table} SET amount = id * 0.37 WHERE id IN (7, 250)")
    same_rows(pipe)


def test_an_infinite_date_or_timestamp_stops_the_extract_by_key_instead_of_loading_9999(settings, tmp_path):
    """Spark reads PostgreSQL's infinite dates and timestamps as 9999-12-31 and year 1 and would load
    them without a word: the extract's span query counts them and names the rows instead."""
    pipe = make_pipeline(settings, tmp_path, PAYMENTS_DDL.replace(
        "updated_at", "booked date, settled timestamptz, updated_at"))
    insert_payments(pipe, 1, 300)
    plan, attempt, cause = _failed_extract(
        pipe, tmp_path, "UPDATE {table} SET booked = '2026-01-02', settled = '2026-01-03 04:05:06.789+00'",
        "UPDATE {table} SET booked = 'infinity' WHERE id = 3", "UPDATE {table} SET settled = '-infinity' WHERE id IN (4, 5)")
    assert f"{pipe.source_table} holds infinite dates or timestamps" in cause, cause
    assert "booked: 1 row(s), e.g. key 3 infinity; settled: 2 row(s), e.g. key 4 -infinity, key 5 -infinity" in cause
    _corrected_and_loaded(pipe, plan, attempt,
                          "UPDATE {table} SET booked = NULL, settled = '2026-01-03+00' WHERE id IN (3, 4, 5)")
    columns = "amount, booked, settled, updated_at"
    assert pipe.rows("target", columns) == pipe.rows("source", columns) and len(pipe.rows("source", columns)) == 300

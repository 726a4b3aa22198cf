"""A producer on the pipeline's topic cannot commit anything (real Kafka, Spark, PostgreSQL).

The ledger, written by the orchestrator alone, says what a batch is: the sink accepts an END only
for an attempt the orchestrator sealed and only with the totals it sealed, and applies a batch only
when what it staged equals those totals. Forged ENDs are dead letters with their reason; a record
the extract did not write makes the attempt refused with the cause named, and a new attempt loads.
"""

from __future__ import annotations

from confluent_kafka import Consumer, TopicPartition

from tidemark import control
from tidemark.control import HEADER_CONTROL
from tidemark.kafka_io import end_offsets
from tidemark_workshop.stack.batchrun import PAYMENTS_DDL, dead_letters, insert_payments, make_pipeline

from test_untrusted_input import produce, rejects, same_rows


def _forged_end(pipe, plan, attempt, rows: int) -> None:
    """END on every partition, built from what BEGIN carries on the topic, as anyone could."""
    msgs = control.messages("END", pipeline=pipe.spec.name, batch_id=plan.batch_id, attempt=attempt,
                            window=plan.window.to_json(), partitions=pipe.spec.partitions,
                            schema_version=plan.schema_version,
                            totals={p: control.PartitionTotals(rows=rows, checksum=rows) for p in range(pipe.spec.partitions)})
    control.send(pipe.settings.kafka_bootstrap, pipe.spec.topic, msgs, transactional_id="forger")


def _a_data_record(bootstrap: str, topic: str, since: dict[int, int]):
    """One data record (with its headers) written after ``since``: to send again, as a replay would."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "forger", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    try:
        consumer.assign([TopicPartition(topic, p, o) for p, o in since.items()])
        for _ in range(200):
            msg = consumer.poll(5)
            if msg is None or msg.error():
                continue
            headers = msg.headers() or []
            if not any(k == HEADER_CONTROL for k, _ in headers):
                return msg.partition(), msg.key(), msg.value(), headers
    finally:
        consumer.close()
    raise AssertionError(f"no data record on {topic} after {since}")


def test_forged_ends_before_and_after_the_extract_commit_nothing_and_the_genuine_batch_loads(settings, tmp_path):
    pipe = make_pipeline(settings, tmp_path, PAYMENTS_DDL)
    insert_payments(pipe, 1, 510)
    plan = pipe.plan("run-a")
    attempt = pipe.begin(plan)
    _forged_end(pipe, plan, attempt, rows=0)  # before the extract: rows=0 on every partition
    pipe.sink()
    assert pipe.state(plan.batch_id, attempt) == "open", pipe.ledger(plan.batch_id)
    watermark = pipe.watermark()
    assert pipe.query_wh(f"SELECT count(*) FROM {pipe.spec.target_table}") == [(0,)]  # the plan created it

    report = pipe.extract(plan, attempt)
    _forged_end(pipe, plan, attempt, rows=1_000_000)  # well formed, before the genuine END: never "first wins"
    pipe.end(plan, attempt, report)
    pipe.sink()

    assert pipe.state(plan.batch_id, attempt) == "committed", pipe.ledger(plan.batch_id)
    assert pipe.watermark() != watermark
    same_rows(pipe)
    got = [reason for *_, reason in rejects(pipe)]
    partitions = pipe.spec.partitions
    assert len(got) == 2 * partitions, got
    assert sum("while the ledger shows the attempt open" in r and "not sent by the orchestrator" in r
               for r in got) == partitions, got
    assert sum("says rows=1000000" in r and "not the orchestrator's totals" in r for r in got) == partitions, got
    dead = [d["tidemark.reason"] for d in dead_letters(settings.kafka_bootstrap, pipe.spec.topic)]
    assert len(dead) == 2 * partitions and all(b"END rejected" in reason for reason in dead)


def test_a_record_sent_again_is_never_applied_and_the_refusal_names_the_cause(settings, tmp_path):
    pipe = make_pipeline(settings, tmp_path, PAYMENTS_DDL)
    bootstrap = settings.kafka_bootstrap
    insert_payments(pipe, 1, 300)
    plan = pipe.plan("run-a")
    attempt = pipe.begin(plan)
    before = end_offsets(bootstrap, pipe.spec.topic)
    report = pipe.extract(plan, attempt)
    partition, key, value, headers = _a_data_record(bootstrap, pipe.spec.topic, before)
    produce(bootstrap, pipe.spec.topic, [(key, value, headers)], partition=partition)  # the replay
    pipe.end(plan, attempt, report)
    pipe.sink()

    assert pipe.state(plan.batch_id, attempt) == "refused"
    (message,), = pipe.query_wh("SELECT message FROM tidemark_control.batch_attempts WHERE batch_id = %s "
                                "AND attempt = %s", (plan.batch_id, attempt))
    assert f"partition {partition}: 1 record(s) more than the extract wrote, a record sent twice" in message, message
    assert "sealed in the ledger" in message and "another producer" in message and "check the extract log" not in message
    assert pipe.query_wh(f"SELECT count(*) FROM {pipe.spec.target_table}") == [(0,)]

    again = pipe.begin(plan)  # what clearing the run from 'begin' does
    pipe.end(plan, again, pipe.extract(plan, again))
    pipe.sink()
    assert pipe.state(plan.batch_id, again) == "committed"
    same_rows(pipe)

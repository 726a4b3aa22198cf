"""A producer on the pipeline's topic cannot commit anything (real Kafka, Spark, PostgreSQL).

Every control message is signed by the orchestrator (HMAC-SHA256, key id): unsigned, wrongly
signed, altered and replayed ones are dead letters with their reason. Behind the signature, the
ledger, written by the orchestrator alone, says what a batch is (what a leaked key still cannot
do): the sink accepts an END only for an attempt the orchestrator sealed and only with the totals
it sealed, and applies only the staged records inside the Kafka offsets the extract wrote, and
only when they equal its totals. Forged ENDs and records the extract did not write (replayed,
injected) are dead letters naming partition, offset and key; the genuine batch commits.
"""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Consumer, TopicPartition
from test_untrusted_input import INSIDE, produce, rejects, same_rows

from tidemark.protocol import control
from tidemark.protocol.control import HEADER_ATTEMPT, HEADER_BATCH, HEADER_CONTROL
from tidemark.protocol.kafka_io import end_offsets
from tidemark_workshop.stack.batchrun import PAYMENTS_DDL, dead_letters, insert_payments, make_pipeline


def _forged_end(pipe, plan, attempt, rows: int) -> None:
    """END on every partition, built from what BEGIN carries on the topic, signed with the stack's
    own key: a forger holding a leaked key (without it, the signature check stops it first)."""
    msgs = control.messages("END", pipeline=pipe.spec.name, batch_id=plan.batch_id, attempt=attempt,
                            window=plan.window.to_json(), partitions=pipe.spec.partitions,
                            schema_version=plan.schema_version,
                            totals={p: control.PartitionTotals(rows=rows, checksum=rows) for p in range(pipe.spec.partitions)})
    control.send(pipe.settings.kafka_bootstrap, pipe.spec.topic, msgs, transactional_id="forger", keyring=pipe.keyring)


def _a_record(bootstrap: str, topic: str, since: dict[int, int], control_kind: bytes | None = None):
    """One record (with its headers) written after ``since``: a data record, or with ``control_kind``
    a control message of that kind: to send again, as a replay would."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "forger", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    try:
        consumer.assign([TopicPartition(topic, p, o) for p, o in since.items()])
        deadline = time.monotonic() + 60  # what it looks for was written before the call: a minute is plenty
        while time.monotonic() < deadline:
            msg = consumer.poll(1)
            if msg is None or msg.error():
                continue
            headers = msg.headers() or []
            if dict(headers).get(HEADER_CONTROL) == control_kind:
                return msg.partition(), msg.key(), msg.value(), headers
    finally:
        consumer.close()
    raise AssertionError(f"no {control_kind or 'data'} record on {topic} after {since}")


def test_unsigned_wrongly_signed_altered_and_replayed_control_messages_are_dead_letters(settings, tmp_path):
    pipe = make_pipeline(settings, tmp_path, PAYMENTS_DDL)
    bootstrap, topic = settings.kafka_bootstrap, pipe.spec.topic
    insert_payments(pipe, 1, 300)
    start = {p: 0 for p in range(pipe.spec.partitions)}
    a, _ = pipe.run("run-a")
    insert_payments(pipe, 301, 600)
    b = pipe.plan("run-b")
    b1 = pipe.begin(b)

    def unsigned(kind, partition, **extra):
        msg = control.messages(kind, pipeline=pipe.spec.name, batch_id=b.batch_id, attempt=b1,
                               window=b.window.to_json(), partitions=pipe.spec.partitions,
                               schema_version=b.schema_version, **extra)[partition]
        return msg

    foreign = control.Keyring.parse("forger-1:" + "f" * 64, source="test")
    ours_stolen_id = control.Keyring.parse(f"{pipe.keyring.key_ids[0]}:" + "e" * 64, source="test")
    a_end_partition, _, a_end, _ = _a_record(bootstrap, topic, start, b"END")
    a_begin = json.loads(_a_record(bootstrap, topic, start, b"BEGIN")[2])
    retargeted = json.dumps({**a_begin, "batch_id": b.batch_id, "attempt": b1, "window": b.window.to_json(),
                             "partition": 1}).encode()  # A's signed BEGIN, edited to pass for B's
    totals = {"totals": control.PartitionTotals(rows=1, checksum=1), "batch_rows": 1}
    forged = [  # (partition, kind, value): before B's extract
        (0, b"ABORT", unsigned("ABORT", 0, reason="forged").encode()),  # would abort B's attempt
        (1, b"ABORT", unsigned("ABORT", 1, reason="forged").encode()),
        (2, b"BEGIN", foreign.sign(unsigned("BEGIN", 2)).encode()),
        (0, b"END", ours_stolen_id.sign(unsigned("BEGIN", 0).model_copy(update={"kind": "END", **totals})).encode()),
        (a_end_partition, b"END", a_end),  # A's genuine END, sent again
        (1, b"BEGIN", retargeted),
    ]
    for partition, kind, value in forged:
        produce(bootstrap, topic, [(None, value, [(HEADER_CONTROL, kind)])], partition=partition)
    pipe.end(b, b1, pipe.extract(b, b1))
    pipe.sink()

    assert pipe.state(b.batch_id, b1) == "committed", pipe.ledger(b.batch_id)
    same_rows(pipe)
    got = [reason for *_, reason in rejects(pipe)]
    expected = {
        "unsigned (no key_id and signature): not sent by the orchestrator": 2,
        "signed with key id forger-1, which this sink's keyring": 1,
        f"its signature under key {pipe.keyring.key_ids[0]} does not match its content: forged or altered": 2,
        "arrived after its attempt committed": 1,
    }
    assert len(got) == len(forged), got
    for text, count in expected.items():
        assert sum(text in r for r in got) == count, (text, got)
    assert any(f"batch={a.batch_id}" in r and "arrived after" in r for r in got), got
    dead = dead_letters(bootstrap, topic)
    assert {d["value"] for d in dead} >= {value for *_, value in forged}  # the forged bytes, kept as evidence


@pytest.mark.parametrize("transport", ["kafka", "direct"])
def test_forged_ends_before_and_after_the_extract_commit_nothing_and_the_genuine_batch_loads(settings, tmp_path,
                                                                                            transport):
    pipe = make_pipeline(settings, tmp_path, PAYMENTS_DDL, transport=transport)
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


@pytest.mark.kafka_transport("a record of the extract's sent again on the topic: a direct extract writes none there "
                             "(a record with a direct attempt's headers: test_direct_transport)")
def test_a_record_sent_again_or_injected_is_a_dead_letter_by_offset_and_the_genuine_batch_loads(settings, tmp_path):
    pipe = make_pipeline(settings, tmp_path, PAYMENTS_DDL)
    bootstrap = settings.kafka_bootstrap
    insert_payments(pipe, 1, 300)
    plan = pipe.plan("run-a")
    attempt = pipe.begin(plan)
    before = end_offsets(bootstrap, pipe.spec.topic)
    report = pipe.extract(plan, attempt)
    partition, key, value, headers = _a_record(bootstrap, pipe.spec.topic, before)
    produce(bootstrap, pipe.spec.topic, [(key, value, headers)], partition=partition)  # the replay
    pipe.end(plan, attempt, report)
    pipe.sink()

    assert pipe.state(plan.batch_id, attempt) == "committed", pipe.ledger(plan.batch_id)
    same_rows(pipe)
    (_, _, reason), = rejects(pipe)
    first, nxt = report["offsets"][str(partition)]
    assert f"/{partition}@{nxt}, key (id)=(" in reason and "is not one the extract wrote" in reason, reason
    assert f"its offsets on partition {partition}: {first}..{nxt - 1}" in reason and "sent again" in reason, reason


def test_a_forged_end_and_an_injected_row_of_999999_99_never_reach_the_books(settings, tmp_path):
    pipe = make_pipeline(settings, tmp_path, PAYMENTS_DDL, record_format="json")
    insert_payments(pipe, 1, 100)
    plan = pipe.plan("run-a")
    attempt = pipe.begin(plan)
    tags = [(HEADER_BATCH, plan.batch_id.encode()), (HEADER_ATTEMPT, str(attempt).encode())]
    forged = json.dumps({"id": 777, "amount": 999999.99, "currency": "EUR", "updated_at": INSIDE}).encode()
    produce(settings.kafka_bootstrap, pipe.spec.topic, [(b"777", forged, tags)])  # before the extract
    _forged_end(pipe, plan, attempt, rows=1)
    pipe.end(plan, attempt, pipe.extract(plan, attempt))
    pipe.sink()

    assert pipe.state(plan.batch_id, attempt) == "committed", pipe.ledger(plan.batch_id)
    same_rows(pipe)
    assert pipe.query_wh(f"SELECT count(*) FROM {pipe.spec.target_table} WHERE amount = 999999.99") == [(0,)]
    got = [reason for *_, reason in rejects(pipe)]
    assert sum("key (id)=(777), is not one the extract wrote" in r for r in got) == 1, got
    assert sum("says rows=1 checksum=1" in r and "not the orchestrator's totals" in r for r in got) == \
        pipe.spec.partitions, got
    letters = dead_letters(settings.kafka_bootstrap, pipe.spec.topic)
    assert forged in {d["value"] for d in letters}  # the forged bytes, kept as evidence

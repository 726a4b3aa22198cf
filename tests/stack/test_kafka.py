"""The real KRaft broker: transactions, read_committed, aborted writes stay invisible."""

import pytest
from confluent_kafka import Producer

from tidemark.protocol.kafka_io import end_offsets, producer_config, read_committed

pytestmark = pytest.mark.stack


def _transactional(bootstrap: str, txn_id: str) -> Producer:
    producer = Producer(producer_config(bootstrap, **{"transactional.id": txn_id}))
    producer.init_transactions(30)
    return producer


def test_committed_transaction_is_read_and_aborted_one_is_invisible(bootstrap, topic):
    start = end_offsets(bootstrap, topic)
    producer = _transactional(bootstrap, f"{topic}-txn")

    producer.begin_transaction()
    for i in range(50):
        producer.produce(topic, key=f"committed-{i}", value=b"keep")
    producer.commit_transaction(30)

    producer.begin_transaction()
    for i in range(50):
        producer.produce(topic, key=f"aborted-{i}", value=b"drop")
    producer.flush(30)  # the aborted records really reach the log before the abort
    producer.abort_transaction(30)

    producer.begin_transaction()
    producer.produce(topic, key="after-abort", value=b"keep")
    producer.commit_transaction(30)

    raw_offsets = sum(end_offsets(bootstrap, topic).values()) - sum(start.values())
    records = list(read_committed(bootstrap, topic, start))
    keys = {r.key.decode() for r in records}
    assert len(records) == 51
    assert keys == {f"committed-{i}" for i in range(50)} | {"after-abort"}
    assert {r.value for r in records} == {b"keep"}
    # the aborted records occupy offsets in the log: read_committed skipped them
    assert raw_offsets >= 101


def test_open_transaction_blocks_read_committed_until_commit(bootstrap, topic):
    start = end_offsets(bootstrap, topic)
    producer = _transactional(bootstrap, f"{topic}-open")
    producer.begin_transaction()
    producer.produce(topic, key="pending", value=b"v")
    producer.flush(30)
    assert list(read_committed(bootstrap, topic, start)) == []
    producer.commit_transaction(30)
    assert [r.key for r in read_committed(bootstrap, topic, start)] == [b"pending"]

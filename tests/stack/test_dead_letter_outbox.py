"""The dead-letter outbox (tidemark.sink.dead_letters) against the real broker and warehouse: rejects
spread over several Kafka transactions, some already sent by an instance that died before marking
them, each reach the dead-letter topic exactly once and are all marked."""

from __future__ import annotations

import uuid

import pytest

from tidemark import ledger
from tidemark.protocol.kafka_io import delete_topic, ensure_topic
from tidemark.sink import dead_letters
from tidemark.sink.dead_letters import HEADER_REJECT, DeadLetterOutbox
from tidemark_workshop.stack.batchrun import dead_letters as read_dead_letters

pytestmark = pytest.mark.stack


def test_rejects_over_several_chunks_some_sent_before_a_crash_reach_the_topic_once(
        settings, warehouse_conn, monkeypatch):
    monkeypatch.setattr(dead_letters, "CHUNK", 3)  # 11 rejects: four Kafka transactions
    consumer, topic = f"test-outbox-{uuid.uuid4().hex[:8]}", f"tidemark.test.dlq.{uuid.uuid4().hex[:8]}"
    ensure_topic(settings.kafka_bootstrap, topic, 1)
    try:
        with warehouse_conn, warehouse_conn.cursor() as cur:
            ledger.ensure_control_schema(cur)
            ledger.record_rejects(cur, consumer, "tidemark.some_pipeline", [
                {"partition": i % 3, "offset": i, "batch_id": "b", "attempt": 1, "reason": f"bad record {i}",
                 "payload": f"payload {i}", "raw": f"payload {i}".encode(), "raw_key": str(i).encode()}
                for i in range(11)])
            pending = ledger.pending_rejects(cur, consumer, limit=100)
        assert len(pending) == 11
        # An earlier instance sent the first five (two chunks' worth) and died before marking them.
        DeadLetterOutbox(settings.kafka_bootstrap, topic, consumer)._publish(pending[:5])

        sent = DeadLetterOutbox(settings.kafka_bootstrap, topic, consumer).flush(warehouse_conn)

        assert sent == 6
        ids = [r["id"] for r in pending]
        in_topic = read_dead_letters(settings.kafka_bootstrap, "tidemark.some_pipeline", topic)
        assert sorted(int(d[HEADER_REJECT]) for d in in_topic) == sorted(ids)  # each exactly once
        with warehouse_conn, warehouse_conn.cursor() as cur:
            cur.execute("""SELECT count(*) FILTER (WHERE in_dlq AND dlq_offset IS NOT NULL AND raw IS NULL),
                                  count(DISTINCT dlq_offset)
                             FROM tidemark_control.sink_rejects WHERE consumer = %s""", (consumer,))
            assert cur.fetchone() == (11, 11)
            assert ledger.pending_rejects(cur, consumer, limit=100) == []
        assert DeadLetterOutbox(settings.kafka_bootstrap, topic, consumer).flush(warehouse_conn) == 0
    finally:
        with warehouse_conn, warehouse_conn.cursor() as cur:
            cur.execute("DELETE FROM tidemark_control.sink_rejects WHERE consumer = %s", (consumer,))
        delete_topic(settings.kafka_bootstrap, topic)

"""The dead-letter outbox: every reject reaches the dead-letter topic exactly once.

The sink writes each reject to ``tidemark_control.sink_rejects`` in the micro-batch's own
transaction, with the record's original bytes: if the job dies at any point, the reject is either
not committed (the micro-batch is read again and rejected again) or committed and pending. After
each commit, and when the sink starts, ``DeadLetterOutbox.flush`` publishes what is pending in a
Kafka transaction (its transactional id is the consumer's, so a zombie instance is fenced) and
then marks it published with its DLQ offset. A job that died after the Kafka commit but before
the mark leaves rows pending that are already in the topic: ``flush`` first reads the topic from
just before the oldest pending reject and marks those it finds (header ``tidemark.reject``, the
row id), so none is published twice.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from tidemark import ledger
from tidemark.protocol import faults
from tidemark.protocol.replication import Replication

log = logging.getLogger(__name__)

SCAN_MARGIN = timedelta(minutes=5)  # how far before the oldest pending reject the topic is read (clock skew)
CHUNK = 5_000  # rejects per Kafka transaction (the producer's queue and memory stay bounded)
MAX_VALUE = 900_000  # bytes of a dead letter's value; a longer one is cut, with header tidemark.truncated
MAX_REASON = 2_000  # characters of the reason header
HEADER_REJECT = "tidemark.reject"
HEADER_CONSUMER = "tidemark.consumer"


class DeadLetterError(RuntimeError):
    """The dead-letter topic cannot be written now; the rejects stay pending and are sent at the next flush."""


class DeadLetterOutbox:
    def __init__(self, bootstrap: str, topic: str, consumer: str, *, timeout_s: float = 30.0,
                 replication: Replication = Replication()):
        self.bootstrap, self.topic, self.consumer, self.timeout_s = bootstrap, topic, consumer, timeout_s
        self.replication = replication
        self._producer = None

    def flush(self, conn) -> int:
        """Publish the consumer's pending rejects, in chunks; returns how many were published now."""
        sent = 0
        in_topic: dict[int, int] | None = None  # reject id -> DLQ offset of what an earlier instance sent
        while True:
            with conn, conn.cursor() as cur:
                pending = ledger.pending_rejects(cur, self.consumer, limit=CHUNK)
                oldest = ledger.pending_reject_summary(cur, self.consumer)[1] if in_topic is None else None
            if not pending:
                return sent
            self._transactional()  # first: it fences an older instance, whose commits the scan then sees
            if in_topic is None:  # once per flush: after the fence only this instance writes our dead letters,
                in_topic = self._already_published(  # and it marks each chunk it sends (a flood is linear)
                    oldest or min(r["rejected_at"] for r in pending))
            found = {r["id"]: in_topic[r["id"]] for r in pending if r["id"] in in_topic}
            todo = [r for r in pending if r["id"] not in found]
            offsets = self._publish(todo) if todo else {}
            faults.point("dlq_published")
            with conn, conn.cursor() as cur:
                ledger.mark_published(cur, {**found, **offsets})
            if found:
                log.warning("consumer=%s %s dead letter(s) were in %s already (the job died before marking them): "
                            "marked, not sent again", self.consumer, len(found), self.topic)
            log.info("consumer=%s %s dead letter(s) published to %s", self.consumer, len(offsets), self.topic)
            sent += len(offsets)

    def _publish(self, rejects: list[dict]) -> dict[int, int]:
        from confluent_kafka import KafkaException

        from tidemark.protocol.kafka_io import ensure_topic, produce_waiting

        ensure_topic(self.bootstrap, self.topic, partitions=1, replication=self.replication)
        producer = self._transactional()
        offsets: dict[int, int] = {}

        def delivered(err, msg, reject_id):
            if err is None:
                offsets[reject_id] = msg.offset()

        try:
            producer.begin_transaction()
            for r in rejects:
                value, headers = _fit(r["raw"]), _headers(self.consumer, r)
                if value is not r["raw"]:
                    headers.append(("tidemark.truncated", str(len(r["raw"])).encode()))
                produce_waiting(producer, self.topic, value=value, key=r["raw_key"], headers=headers,
                                on_delivery=lambda err, msg, i=r["id"]: delivered(err, msg, i))
            producer.commit_transaction(self.timeout_s)
        except KafkaException as exc:
            self._producer = None  # a fenced or broken producer is not reused
            raise DeadLetterError(f"consumer={self.consumer}: could not publish {len(rejects)} dead letter(s) to "
                                  f"{self.topic} ({exc}); they stay pending in tidemark_control.sink_rejects and are "
                                  "published when the sink flushes again (next micro-batch or start)") from exc
        producer.poll(0)
        if len(offsets) != len(rejects):
            raise DeadLetterError(f"consumer={self.consumer}: {len(rejects) - len(offsets)} of {len(rejects)} dead "
                                  f"letter(s) got no delivery report from {self.topic}; they stay pending")
        return offsets

    def _transactional(self):
        if self._producer is None:
            from confluent_kafka import Producer

            from tidemark.protocol.kafka_io import producer_config

            producer = Producer(producer_config(self.bootstrap, **{"transactional.id": f"tidemark.dlq.{self.consumer}"}))
            producer.init_transactions(self.timeout_s)  # fences an older instance's producer
            self._producer = producer
        return self._producer

    def _already_published(self, since) -> dict[int, int]:
        """The consumer's reject ids in the topic (committed) from ``since`` (less the margin) on, with
        their offsets."""
        from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

        from tidemark.protocol.kafka_io import client_config

        consumer = Consumer(client_config(self.bootstrap, **{
            "group.id": f"tidemark-dlq-check-{self.consumer}", "isolation.level": "read_committed",
            "enable.auto.commit": False, "enable.partition.eof": True}))
        found: dict[int, int] = {}
        try:
            meta = consumer.list_topics(self.topic, timeout=self.timeout_s).topics.get(self.topic)
            if meta is None or meta.error is not None:
                return found  # no topic yet: nothing was published
            start_ms = int((since - SCAN_MARGIN).timestamp() * 1000)
            (start,) = consumer.offsets_for_times([TopicPartition(self.topic, 0, start_ms)], timeout=self.timeout_s)
            _, end = consumer.get_watermark_offsets(TopicPartition(self.topic, 0), timeout=self.timeout_s)
            if start.offset < 0 or start.offset >= end:  # nothing written since then
                return found
            consumer.assign([TopicPartition(self.topic, 0, start.offset)])
            mine = self.consumer.encode()
            while True:
                msg = consumer.poll(self.timeout_s)
                if msg is None:  # e.g. another consumer's open transaction holds the stable offset back
                    raise DeadLetterError(f"consumer={self.consumer}: reading {self.topic} stalled below offset "
                                          f"{end} while checking for dead letters sent already; they stay pending")
                if msg.error():
                    # under read_committed the end of the partition may be an open transaction's start:
                    # only the high watermark read at the start counts as the end
                    if msg.error().code() == KafkaError._PARTITION_EOF and msg.offset() >= end:
                        break
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(msg.error())
                headers = dict(msg.headers() or [])
                if headers.get(HEADER_CONSUMER) == mine and headers.get(HEADER_REJECT) is not None:
                    found[int(headers[HEADER_REJECT])] = msg.offset()
                if msg.offset() + 1 >= end:
                    break
        finally:
            consumer.close()
        return found


def _fit(raw: bytes | None) -> bytes | None:
    return raw if raw is None or len(raw) <= MAX_VALUE else raw[:MAX_VALUE]


def _headers(consumer: str, r: dict) -> list[tuple[str, bytes]]:
    headers = [
        ("tidemark.reason", r["reason"][:MAX_REASON].encode()),
        ("tidemark.source", f"{r['topic']}/{r['partition']}@{r['kafka_offset']}".encode()),
        (HEADER_CONSUMER, consumer.encode()),
        (HEADER_REJECT, str(r["id"]).encode()),
    ]
    if r.get("batch_id") is not None:
        headers.append(("tidemark.batch", str(r["batch_id"]).encode()))
    if r.get("attempt") is not None:
        headers.append(("tidemark.attempt", str(r["attempt"]).encode()))
    return headers

"""Kafka helpers shared by DAG tasks, Spark drivers and tests (confluent-kafka, no Airflow)."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType
from tenacity import retry, retry_if_exception, stop_after_delay, wait_fixed

from tidemark.protocol.config import kafka_timeout_s
from tidemark.protocol.replication import MIN_INSYNC_KEY, UNCLEAN, Replication, TopicRefused

# librdkafka's default partitioner (consistent_random, CRC32) differs from Java's (murmur2).
# Spark writes with the Java client, so every Python producer must hash keys the same way.
PARTITIONER = "murmur2_random"


class OncePerCause(logging.Filter):
    """librdkafka repeats a failure (say, `Connection refused` while the broker is down) every few
    milliseconds: let one line per cause through per interval, and say how many were held back."""

    def __init__(self, every_s: float = 60.0):
        super().__init__()
        self.every_s = every_s
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        cause = re.sub(r"\d+", "#", record.getMessage())[:300]  # offsets, ms, ports: one cause
        now = time.monotonic()
        if now - self._last.get(cause, -self.every_s) < self.every_s:
            self._held[cause] = self._held.get(cause, 0) + 1
            return False
        self._last[cause] = now
        if record.levelno == logging.WARNING and record.getMessage().endswith(": retrying"):
            record.levelno, record.levelname = logging.INFO, "INFO"  # librdkafka heals it itself: no warning
        held = self._held.pop(cause, 0)
        if held:
            record.msg = f"{record.getMessage()} (and {held} more like it in the last {self.every_s:.0f}s)"
            record.args = ()
        return True


RDKAFKA_LOG = logging.getLogger("tidemark.rdkafka")
RDKAFKA_LOG.addFilter(OncePerCause())


def client_config(bootstrap: str, **extra: object) -> dict[str, object]:
    """Settings every confluent-kafka client of ours shares: its log lines go through RDKAFKA_LOG."""
    return {"bootstrap.servers": bootstrap, "logger": RDKAFKA_LOG, **extra}


def producer_config(bootstrap: str, **extra: object) -> dict[str, object]:
    """Every producer of ours: a record counts once every in-sync replica holds it, and a retry never
    writes it twice."""
    return client_config(bootstrap, partitioner=PARTITIONER, **{"enable.idempotence": True, "acks": "all"}, **extra)


def produce_waiting(producer, topic: str, **record: object) -> None:
    """``producer.produce`` that waits while the local queue is full (BufferError) instead of
    failing: a flood larger than ``queue.buffering.max.messages`` is sent, not dropped."""
    while True:
        try:
            producer.produce(topic, **record)
            return
        except BufferError:  # let delivered records leave the queue
            producer.poll(0.1)


def ensure_topic(bootstrap: str, topic: str, partitions: int, timeout_s: float | None = None, *,
                 replication: Replication = Replication()) -> None:
    """Create the topic if missing, with ``replication`` settled for the cluster (unclean leader election
    off); refuse (:class:`TopicRefused`, with the next step) one that exists with another partition count,
    fewer replicas, a lower ``min.insync.replicas`` or unclean leader election on, or one the cluster has
    too few brokers for. A broker that does not answer within ``timeout_s`` (default:
    ``config.kafka_timeout_s()``) fails it."""
    if timeout_s is None:
        timeout_s = kafka_timeout_s()
    admin = AdminClient(client_config(bootstrap))
    meta = admin.list_topics(timeout=timeout_s)
    brokers = cluster_size(meta)
    want = replication.settle(brokers)
    existing = meta.topics.get(topic)
    if existing is None or existing.error is not None:
        _refuse(want.refusals(topic, brokers, replicas=None, min_insync=None, unclean=None))
        futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=want.factor,
                                                config=want.topic_config())])
        try:
            futures[topic].result(timeout=timeout_s)
            _wait_for_leaders(admin, topic, timeout_s)
            return
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise
        _wait_for_leaders(admin, topic, timeout_s)  # made meanwhile by another caller: checked as any other
        existing = admin.list_topics(topic, timeout=timeout_s).topics[topic]
    if len(existing.partitions) != partitions:
        raise TopicRefused(f"topic {topic!r} exists with {len(existing.partitions)} partitions, expected {partitions}")
    _refuse(want.refusals(topic, brokers, **_replication_of(admin, existing, timeout_s)))


def cluster_size(meta) -> int:
    """The brokers of the cluster, those down now included (named among a partition's replicas): a topic made
    while one is away gets the replicas the whole cluster would give it."""
    known = set(meta.brokers)
    for topic in meta.topics.values():
        for partition in topic.partitions.values():
            known.update(partition.replicas)
    return len(known)


def settled_replication(bootstrap: str, replication: Replication = Replication(),
                        timeout_s: float | None = None) -> Replication:
    """``replication`` settled for the cluster at ``bootstrap`` (what ``ensure_topic`` would make)."""
    admin = AdminClient(client_config(bootstrap))
    return replication.settle(cluster_size(admin.list_topics(timeout=timeout_s or kafka_timeout_s())))


def ensure_topic_if_reachable(bootstrap: str, topic: str, partitions: int, *,
                              replication: Replication = Replication()) -> str | None:
    """:func:`ensure_topic` when a broker answers (a plan refuses a topic it cannot trust before anything
    is recorded); else why not, for the caller to say (the first step that needs the broker checks again)."""
    unreachable = probe_broker(bootstrap)
    if unreachable is None:
        ensure_topic(bootstrap, topic, partitions, replication=replication)
    return unreachable


def _refuse(refusals: list[str]) -> None:
    if refusals:
        raise TopicRefused("; ".join(refusals))


def _replication_of(admin: AdminClient, topic_meta, timeout_s: float) -> dict[str, object]:
    """An existing topic's fewest replicas of a partition, its ``min.insync.replicas`` and unclean election."""
    resource = ConfigResource(ResourceType.TOPIC, topic_meta.topic)
    try:
        entries = admin.describe_configs([resource])[resource].result(timeout=timeout_s)
    except KafkaException as exc:
        if "AUTHORIZATION" not in str(exc).upper():
            raise
        raise TopicRefused(f"topic {topic_meta.topic!r}: this principal may not read its configuration ({exc}): "
                           "grant it DescribeConfigs on the topic (Tidemark checks min.insync.replicas and unclean "
                           "leader election before it writes or reads a batch)") from None
    return {"replicas": min(len(p.replicas) for p in topic_meta.partitions.values()),
            "min_insync": int(entries[MIN_INSYNC_KEY].value), "unclean": entries[UNCLEAN].value == "true"}


def delete_topic(bootstrap: str, topic: str, timeout_s: float = 30.0) -> None:
    """Delete a topic and its data (benchmarks clean up the gigabytes they write); absent is fine."""
    admin = AdminClient(client_config(bootstrap))  # must outlive the future
    futures = admin.delete_topics([topic], operation_timeout=timeout_s)
    try:
        futures[topic].result(timeout=timeout_s)
    except KafkaException as exc:
        if "UNKNOWN_TOPIC_OR_PART" not in str(exc):
            raise


# Transient while a new topic's leaders are being elected or metadata is catching up.
_TRANSIENT = {
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
}


def _retriable(exc: BaseException) -> bool:
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return isinstance(err, KafkaError) and (err.code() in _TRANSIENT or err.retriable())


def _wait_for_leaders(admin: AdminClient, topic: str, timeout_s: float) -> None:
    """A created topic is usable only once every partition has a leader."""

    @retry(stop=stop_after_delay(timeout_s), wait=wait_fixed(0.2), reraise=True)
    def check() -> None:
        meta = admin.list_topics(topic, timeout=timeout_s).topics[topic]
        if meta.error is not None or any(p.leader < 0 or p.error for p in meta.partitions.values()):
            raise TimeoutError(f"topic {topic!r} has partitions without a leader after {timeout_s}s")

    check()


def end_offsets(bootstrap: str, topic: str, timeout_s: float = 30.0) -> dict[int, int]:
    """High watermark of every partition (for read_committed: the last stable offset); transient
    broker errors are retried for at most ``timeout_s`` in all."""

    @retry(retry=retry_if_exception(_retriable), stop=stop_after_delay(timeout_s), wait=wait_fixed(0.5),
           reraise=True)
    def read() -> dict[int, int]:
        consumer = Consumer(
            client_config(bootstrap, **{"group.id": "tidemark-offsets", "isolation.level": "read_committed"})
        )
        try:
            meta = consumer.list_topics(topic, timeout=timeout_s).topics[topic]
            if meta.error is not None:
                raise KafkaException(meta.error)
            return {
                p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)[1]
                for p in sorted(meta.partitions)
            }
        finally:
            consumer.close()

    return read()


@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


def read_committed(
    bootstrap: str, topic: str, start: dict[int, int], *, idle_timeout_s: float = 10.0
) -> Iterator[Record]:
    """Committed records from ``start`` offsets up to each partition's end at call time.

    Stops when every partition has reached its end; raises if no progress is made for
    ``idle_timeout_s`` (the broker stalled or an open transaction blocks the stable offset).
    """
    stop = end_offsets(bootstrap, topic)
    pending = {p: stop[p] for p in stop if stop[p] > start.get(p, 0)}
    if not pending:
        return
    consumer = Consumer(client_config(bootstrap, **{
        "group.id": f"tidemark-reader-{topic}",
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
    }))
    try:
        consumer.assign([TopicPartition(topic, p, start.get(p, 0)) for p in pending])
        while pending:
            msg = consumer.poll(idle_timeout_s)
            if msg is None:
                raise TimeoutError(
                    f"no progress reading {topic} for {idle_timeout_s}s; still waiting on partitions "
                    f"{sorted(pending)} up to offsets {pending}"
                )
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    if msg.offset() >= pending.get(msg.partition(), 0):
                        pending.pop(msg.partition(), None)
                    continue
                raise KafkaException(msg.error())
            if msg.offset() < pending.get(msg.partition(), -1):
                yield Record(msg.partition(), msg.offset(), msg.key(), msg.value())
            if msg.offset() + 1 >= pending.get(msg.partition(), 0):
                pending.pop(msg.partition(), None)
    finally:
        consumer.close()


def probe_broker(bootstrap: str, timeout_s: float = 2.0) -> str | None:
    """None when a broker answers a metadata request, else why not. A TCP connect to the bootstrap
    servers first (a stopped broker refuses at once, and librdkafka would log every refusal), then
    the metadata request: at most about twice ``timeout_s`` in all, never longer."""
    import socket

    servers = [h.strip().split("://")[-1] for h in (bootstrap or "").split(",") if h.strip()]
    if not servers:
        return "no bootstrap servers configured"
    deadline = time.monotonic() + timeout_s
    refused = []
    for server in servers:
        host, _, port = server.rpartition(":")
        try:
            socket.create_connection((host.strip("[]") or "localhost", int(port)),
                                     timeout=max(0.2, deadline - time.monotonic())).close()
            break
        except (OSError, ValueError) as exc:
            refused.append(f"{server}: {getattr(exc, 'strerror', None) or exc}")
    else:
        return "no bootstrap server accepts a connection (" + "; ".join(refused) + ")"
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": int(timeout_s * 1000),
                         "socket.connection.setup.timeout.ms": int(timeout_s * 1000), "log_level": 0})
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except Exception as exc:  # KafkaException: the port is open but no broker answers (starting, stopping)
        return f"the broker accepts connections but does not answer: {' '.join(str(exc).split())}"
    if not metadata.brokers:
        return "the cluster's metadata lists no broker"
    return None

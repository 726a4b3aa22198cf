"""Kafka client helpers: librdkafka's connection noise reaches task logs as one line per cause; a full
local producer queue is waited out."""

from __future__ import annotations

import logging

from tidemark.protocol.kafka_io import OncePerCause


def _record(msg: str) -> logging.LogRecord:
    return logging.LogRecord("tidemark.rdkafka", logging.ERROR, __file__, 1, msg, (), None)


def test_a_repeated_cause_passes_once_per_interval_and_counts_what_it_held(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr("tidemark.protocol.kafka_io.time.monotonic", lambda: clock[0])
    f = OncePerCause(every_s=60)
    refused = "FAIL [thrd:127.0.0.1:29092/bootstrap]: Connect to ipv4#127.0.0.1:29092 failed: Connection refused (after {}ms)"
    passed = [f.filter(_record(refused.format(ms))) for ms in range(580)]
    assert passed.count(True) == 1  # 580 lines differing only in numbers: one cause
    assert f.filter(_record("another cause: broker transport failure"))
    clock[0] += 61
    again = _record(refused.format(3))
    assert f.filter(again) and "(and 579 more like it in the last 60s)" in again.getMessage()


def test_a_step_waits_for_a_broker_that_is_not_there_only_as_long_as_configured(monkeypatch):
    """TIDEMARK_KAFKA_TIMEOUT_S, not the default 30 s, is how long the client is told to wait for a
    broker; one that is not there then fails the step (its task's retries try again later)."""
    import socket

    import pytest
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    from tidemark.protocol import kafka_io

    waits = []

    class Spy(AdminClient):
        def list_topics(self, *args, **kwargs):
            waits.append(kwargs.get("timeout", args[1] if len(args) > 1 else None))
            return super().list_topics(*args, **kwargs)

    monkeypatch.setattr(kafka_io, "AdminClient", Spy)
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("TIDEMARK_KAFKA_TIMEOUT_S", "1.5")
    with pytest.raises(KafkaException):
        kafka_io.ensure_topic(f"127.0.0.1:{port}", "t", 1)
    assert waits == [1.5]


def test_a_full_local_queue_is_waited_out_not_dropped():
    from tidemark.protocol.kafka_io import produce_waiting

    class QueueOfTwo:  # librdkafka's produce raises BufferError while its queue is full
        def __init__(self):
            self.queued, self.sent, self.polls = [], [], 0

        def produce(self, topic, **record):
            if len(self.queued) == 2:
                raise BufferError("Local: Queue full")
            self.queued.append((topic, record))

        def poll(self, timeout):
            self.polls += 1
            self.sent += self.queued[:1]
            del self.queued[:1]

    producer = QueueOfTwo()
    for i in range(5):
        produce_waiting(producer, "t", key=str(i).encode(), value=b"v", headers=[("h", b"1")])
    delivered = producer.sent + producer.queued
    assert [r["key"] for _, r in delivered] == [b"0", b"1", b"2", b"3", b"4"]
    assert all(t == "t" and r["headers"] == [("h", b"1")] for t, r in delivered)
    assert producer.polls == 3


def test_a_failure_librdkafka_retries_by_itself_is_information_not_a_warning():
    """The demo printed `GETPID ... Coordinator load in progress: retrying` as a warning on stderr."""
    f = OncePerCause(every_s=60)
    record = logging.LogRecord("tidemark.rdkafka", logging.WARNING, __file__, 1, "GETPID [rdkafka#producer-10] "
                               "[thrd:main]: Failed to acquire idempotence PID from broker 127.0.0.1:29092/1: "
                               "Broker: Coordinator load in progress: retrying", (), None)
    assert f.filter(record) and record.levelno == logging.INFO
    lost = logging.LogRecord("tidemark.rdkafka", logging.WARNING, __file__, 1, "FAIL [rdkafka#producer-1]: "
                             "Connect to ipv4#127.0.0.1:29092 failed: Connection refused", (), None)
    assert f.filter(lost) and lost.levelno == logging.WARNING

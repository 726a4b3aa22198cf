"""The peer a data team would deploy instead of Tidemark, run on the same stack and data
(``make bench-peers``, issue 32): Debezium's PostgreSQL connector and Debezium's JDBC sink on the
stack's Kafka Connect worker (both resolved from Maven Central by ``make up``).

* ``debezium_copy``: a table's rows through the connector's initial snapshot onto Kafka and the JDBC
  sink's upserts into an empty warehouse table of the same shape: seconds from the two connectors'
  creation until the table holds every row. The worker is already running, as Tidemark's JVM
  start-ups are not counted either.
* ``jdbc_sink_drain``: a backlog of keyed events (Connect's JSON with its schema, which the sink
  needs) drained by the JDBC sink alone into a table: events/s from the first row written to the
  last, as ``bench/stream_events.py`` counts Tidemark's.

Tuned as a trial on this machine found best (``SINK_TUNING``): batches of 5,000, the driver's
rewritten batch inserts, the reduction buffer (without it a key twice in one batch fails the
upsert), one task per core. Not its UNNEST insert: it truncates a char(n) value to one character.
The peer delivers at least once; Tidemark's figures are exactly once. Everything this module
creates (connectors, slot, publication, topics, its secret file) is removed on leaving; the
sink's consumer group stays (Kafka expires it).
"""

from __future__ import annotations

import base64
import json
import os
import re
import time
import uuid
from contextlib import contextmanager
from typing import Iterator

import psycopg2

from tidemark.protocol.kafka_io import delete_topic, ensure_topic, produce_waiting, producer_config
from tidemark.realtime.cdc.connect import ConnectClient
from tidemark.realtime.cdc.connector import write_secret
from tidemark_workshop.settings import WAREHOUSE_DB, Settings
from tidemark_workshop.stack.cdcrun import drop_capture
from tidemark_workshop.stack.connect import DEBEZIUM_POSTGRES, JDBC_SINK

CORES = os.cpu_count() or 2  # the sink's tasks: one per core (more did not help in the trial, on 2 cores)
SINK_TUNING = {
    "batch.size": "5000",
    "consumer.override.max.poll.records": "5000",
    "use.reduction.buffer": "true",
}


def say(message: str) -> None:
    print(f"[peer] {message}", flush=True)


@contextmanager
def _connectors(settings: Settings) -> Iterator[tuple[ConnectClient, list[str], str]]:
    """The worker's client, a list of connector names to delete on leaving, and the reference to
    the password (a file of this run's own, resolved by the worker; gone on leaving too)."""
    secret = f"peer_{uuid.uuid4().hex[:8]}.password"
    write_secret(settings.connect_secrets_dir, secret, settings.pg_password)
    client, names = ConnectClient(settings.connect_url), []
    try:
        yield client, names, f"${{dir:{settings.connect_secrets_dir}:{secret}}}"
    finally:
        for name in names:
            try:
                client.delete(name)
            except Exception as exc:  # cleaning up: say so, go on
                say(f"could not delete connector {name}: {exc}")
        (settings.connect_secrets_dir / secret).unlink(missing_ok=True)


def sink_config(settings: Settings, password: str, topics: str, table: str, tasks: int) -> dict[str, str]:
    """Debezium's JDBC sink upserting ``topics`` into the warehouse's ``table`` (which must exist)."""
    return {
        "connector.class": JDBC_SINK, "tasks.max": str(tasks), "topics": topics,
        "connection.url": f"jdbc:postgresql://{settings.pg_host}:{settings.pg_port}/{WAREHOUSE_DB}"
                          "?reWriteBatchedInserts=true",
        "connection.username": settings.pg_user, "connection.password": password,
        "insert.mode": "upsert", "primary.key.mode": "record_key", "schema.evolution": "none",
        "collection.name.format": table, "use.time.zone": "UTC",
        "consumer.override.auto.offset.reset": "earliest", **SINK_TUNING,
    }


def source_config(settings: Settings, password: str, name: str, table: str, partitions: int) -> dict[str, str]:
    """Debezium's PostgreSQL connector taking an initial snapshot of the source's ``table``."""
    return {
        "connector.class": DEBEZIUM_POSTGRES, "tasks.max": "1", "plugin.name": "pgoutput",
        "database.hostname": settings.pg_host, "database.port": str(settings.pg_port),
        "database.dbname": settings.source_db, "database.user": settings.pg_user,
        "database.password": password,
        "topic.prefix": name, "slot.name": name, "publication.name": name,
        "publication.autocreate.mode": "filtered", "table.include.list": re.escape(table),
        "snapshot.mode": "initial", "snapshot.fetch.size": "10240",
        "max.batch.size": "8192", "max.queue.size": "32768",
        "topic.creation.default.replication.factor": "1", "topic.creation.default.partitions": str(partitions),
    }


def _wait_rows(settings: Settings, client: ConnectClient, names: list[str], table: str, rows: int,
               timeout: float = 3600) -> tuple[float, float, int]:
    """Poll ``table`` until it holds ``rows`` rows: (first time it held any, time it held all, rows
    at the first look). Each count takes CPU from the peer: once a second, every 0.25 s near the
    end (the figure's error). A failed connector or task ends the wait with its trace."""
    wh = psycopg2.connect(settings.dsn(WAREHOUSE_DB))
    wh.autocommit = True
    first, at_first, deadline, last_said = None, 0, time.monotonic() + timeout, 0.0
    try:
        with wh.cursor() as cur:
            while True:
                cur.execute(f"SELECT count(*) FROM {table}")
                n = cur.fetchone()[0]
                now = time.monotonic()
                if n and first is None:
                    first, at_first = now, n
                if n >= rows:
                    return first, now, at_first
                if now > deadline:
                    raise TimeoutError(f"the peer wrote {n} of {rows} rows into {table} in {timeout:.0f} s")
                if now - last_said >= 10:
                    last_said = now
                    say(f"  {table}: {n}/{rows} rows ({100 * n / rows:.0f}%)")
                    for name in names:
                        state = client.state(name)
                        if state.state == "FAILED" or state.failed_tasks:
                            raise RuntimeError(f"connector {name} failed: "
                                               f"{(state.failed_tasks[0] if state.failed_tasks else state.trace)}")
                time.sleep(0.25 if n >= 0.9 * rows else 1.0)
    finally:
        wh.close()


def debezium_copy(settings: Settings, source_table: str, target_table: str, rows: int, partitions: int = CORES) -> float:
    """Seconds for Debezium's snapshot of ``source_table`` and its JDBC sink to fill ``target_table``
    (empty, of the same shape) with its ``rows`` rows."""
    name = f"peer_{uuid.uuid4().hex[:8]}"
    topic = f"{name}.{source_table}"
    try:
        with _connectors(settings) as (client, names, password):
            started = time.monotonic()
            names.append(f"{name}-source")
            client.put_config(names[-1], source_config(settings, password, name, source_table, partitions))
            names.append(f"{name}-sink")
            client.put_config(names[-1], sink_config(settings, password, topic, target_table, min(partitions, CORES)))
            _, done, _ = _wait_rows(settings, client, names, target_table, rows)
        seconds = done - started
        say(f"debezium snapshot + JDBC sink: {rows} rows in {seconds:.1f} s")
        return round(seconds, 2)
    finally:
        drop_capture(settings, name)
        delete_topic(settings.kafka_bootstrap, topic)


# Connect's JSON with its schema: the key, and a payment as bench/stream_events.py publishes it
KEY_SCHEMA = {"type": "struct", "name": "payment_key", "optional": False,
              "fields": [{"field": "id", "type": "int64", "optional": False}]}
VALUE_SCHEMA = {"type": "struct", "name": "payment", "optional": False, "fields": [
    {"field": "id", "type": "int64", "optional": False},
    {"field": "amount", "type": "bytes", "optional": False, "name": "org.apache.kafka.connect.data.Decimal",
     "version": 1, "parameters": {"scale": "2"}},
    {"field": "currency", "type": "string", "optional": False},
    {"field": "updated_at", "type": "int64", "optional": False, "name": "org.apache.kafka.connect.data.Timestamp",
     "version": 1}]}
EVENTS_DDL = ("CREATE TABLE {table} (id bigint PRIMARY KEY, amount numeric(18,2) NOT NULL, "
              "currency char(3) NOT NULL, updated_at timestamptz NOT NULL)")


def _decimal(unscaled: int) -> str:
    """A Connect Decimal's payload: the unscaled value, big-endian two's complement, in base64."""
    return base64.b64encode(unscaled.to_bytes((unscaled.bit_length() + 8) // 8 or 1, "big", signed=True)).decode()


def peer_event(i: int, at: float) -> tuple[bytes, bytes]:
    """Key and value of event ``i`` (the amount and currency of ``stream_events._event``)."""
    key = json.dumps({"schema": KEY_SCHEMA, "payload": {"id": i}}, separators=(",", ":")).encode()
    value = {"id": i, "amount": _decimal((i % 100000) * 100 + i % 100), "currency": "EUR", "updated_at": int(at * 1000)}
    return key, json.dumps({"schema": VALUE_SCHEMA, "payload": value}, separators=(",", ":")).encode()


def jdbc_sink_drain(settings: Settings, table: str, events: int, partitions: int) -> dict:
    """The JDBC sink alone draining a backlog of ``events`` events (keys 1..events) into ``table``
    (made here, dropped after): its events/s from the first row written to the last."""
    from confluent_kafka import Producer

    topic = f"peer_events_{uuid.uuid4().hex[:8]}"
    wh = psycopg2.connect(settings.dsn(WAREHOUSE_DB))
    try:
        with wh, wh.cursor() as cur:
            cur.execute(EVENTS_DDL.format(table=table))
        ensure_topic(settings.kafka_bootstrap, topic, partitions)
        producer = Producer(producer_config(settings.kafka_bootstrap, **{"linger.ms": 5, "batch.size": 1_000_000}))
        t0 = time.monotonic()
        for i in range(1, events + 1):
            key, value = peer_event(i, time.time())
            produce_waiting(producer, topic, value=value, key=key)
            if i % 10_000 == 0:
                producer.poll(0)
        if producer.flush(120) != 0:
            raise RuntimeError(f"could not deliver every event to {topic}")
        say(f"published a backlog of {events} events (JSON with schema) in {time.monotonic() - t0:.1f} s")
        with _connectors(settings) as (client, names, password):
            names.append(f"{topic}-sink")
            created = time.monotonic()
            client.put_config(names[-1], sink_config(settings, password, topic, table, min(partitions, CORES)))
            first, last, at_first = _wait_rows(settings, client, names, table, events)
        if at_first >= events:  # drained between two looks (a small backlog): from the connector's creation
            first, at_first = created, 0
        rate = round((events - at_first) / max(last - first, 1e-3))
        say(f"debezium JDBC sink: {events} events drained, {rate} events/s")
        return {"debezium_jdbc_sink_events_per_s": rate, "debezium_jdbc_sink_drain_s": round(last - first, 1)}
    finally:
        with wh, wh.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS {table}")
        wh.close()
        delete_topic(settings.kafka_bootstrap, topic)

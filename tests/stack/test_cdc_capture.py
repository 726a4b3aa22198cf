"""Change data capture, the capture half: Debezium's PostgreSQL connector on the stack's Kafka Connect
worker, configured from a pipeline's spec, reads the source table's own inserts, updates and deletes
from its replication slot, each tagged with its source transaction (issue 31, item 1).

Real PostgreSQL (wal_level=logical), a real Connect worker with Debezium, a real broker. The source
is set up as a DBA would: the replication role exists; until the table's owner runs the pipeline's
grants, the check names what is missing and the statements that supply it.
"""

from __future__ import annotations

import json
import os
import time
import uuid

import psycopg2
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from tidemark.cdc.connect import ConnectClient
from tidemark.cdc.connector import SourceEndpoint, connector_config, connector_name
from tidemark.cdc.source import CaptureNotReady, check_capture, grant_sql, slot
from tidemark_workshop.settings import SOURCE_DB
from tidemark_workshop.stack.batchrun import PAYMENTS_DDL, make_pipeline, until

STANDING = {"mode": "standing", "trigger": "PT1S", "heartbeat": "PT1S"}


def _events(bootstrap: str, topic: str, count: int) -> list[dict]:
    """The first ``count`` records of a one-partition topic, their JSON payloads in order."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"it-cdc-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    found: list[dict] = []
    deadline = time.monotonic() + 60
    try:
        while len(found) < count:
            assert time.monotonic() < deadline, f"{topic}: {len(found)} of {count} records after 60 s: {found}"
            msg = consumer.poll(1)
            if msg is not None and not msg.error():
                found.append(json.loads(msg.value())["payload"])
    finally:
        consumer.close()
    return found


@pytest.fixture
def captured(settings, tmp_path, bootstrap):
    """A CDC pipeline over a fresh table; afterwards its connector is deleted and its slot and
    publication dropped (as stopping a pipeline for good does)."""
    unique = uuid.uuid4().hex[:10]
    pipe = make_pipeline(settings, tmp_path, PAYMENTS_DDL, sink=STANDING,
                         cdc={"target_table": f"public.it_{unique}_rt", "serving_view": f"public.it_{unique}_serving",
                              "heartbeat": "PT1S"})
    client = ConnectClient(settings.connect_url)
    yield pipe, client
    if client.config(connector_name(pipe.spec)) is not None:
        client.delete(connector_name(pipe.spec))
    owner = psycopg2.connect(settings.dsn(SOURCE_DB))
    owner.autocommit = True
    try:
        with owner.cursor() as cur:
            deadline = time.monotonic() + 60
            while (held := slot(cur, pipe.spec)) is not None and held.active and time.monotonic() < deadline:
                time.sleep(0.5)
            if held is not None:
                cur.execute("SELECT pg_drop_replication_slot(%s)", (pipe.spec.cdc_slot,))
            cur.execute(f'DROP PUBLICATION IF EXISTS "{pipe.spec.cdc_slot}"')
    finally:
        owner.close()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    mine = [t for t in admin.list_topics(timeout=10).topics if pipe.spec.cdc_topic_prefix in t]
    for future in admin.delete_topics(mine).values() if mine else ():
        future.result(timeout=30)


def _as(settings, user: str, password: str):
    import dataclasses

    return psycopg2.connect(dataclasses.replace(settings, pg_user=user, pg_password=password).dsn(SOURCE_DB))


def test_debezium_captures_inserts_updates_and_deletes_with_their_source_transactions(settings, captured, bootstrap):
    pipe, client = captured
    spec, role = pipe.spec, settings.cdc_user
    cdc = _as(settings, role, settings.cdc_password)
    try:
        with cdc, cdc.cursor() as cur:  # the replication role cannot read the table until the owner grants it
            with pytest.raises(CaptureNotReady) as missing:
                check_capture(cur, spec, role)
        text = str(missing.value)
        assert f"publication {spec.cdc_slot} does not exist: CREATE PUBLICATION \"{spec.cdc_slot}\"" in text
        assert f"role {role} may not read {spec.table}: GRANT USAGE ON SCHEMA" in text and "Next: have" in text
        owner = psycopg2.connect(settings.dsn(SOURCE_DB))
        try:
            with owner, owner.cursor() as cur:  # what the DBA runs, once per pipeline
                for statement in grant_sql(spec, role):
                    cur.execute(statement)
        finally:
            owner.close()
        with cdc, cdc.cursor() as cur:
            check_capture(cur, spec, role)
    finally:
        cdc.close()

    secret = settings.connect_secrets_dir / "tidemark_cdc"
    fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(settings.cdc_password)
    name = connector_name(spec)
    client.put_config(name, connector_config(spec, SourceEndpoint(
        settings.pg_host, settings.pg_port, SOURCE_DB, role, "tidemark_cdc", str(settings.connect_secrets_dir))))
    until("the connector and its task running", lambda: client.state(name).running)
    stored = client.config(name)
    assert stored["database.password"].startswith("${dir:") and settings.cdc_password not in json.dumps(stored)

    def slot_read():
        conn = psycopg2.connect(settings.dsn(SOURCE_DB))
        try:
            with conn, conn.cursor() as cur:
                return slot(cur, spec)
        finally:
            conn.close()

    held = until("Debezium reading its slot", lambda: (s := slot_read()) is not None and s.active and s)
    assert held.name == spec.cdc_slot and held.wal_status in ("reserved", "extended")

    src = pipe.src()
    try:
        with src, src.cursor() as cur:  # one transaction of three inserts
            cur.executemany(f"INSERT INTO {spec.table} (id, amount) VALUES (%s, %s)", [(1, "0.37"), (2, "0.74"),
                                                                                       (3, "1.11")])
        with src, src.cursor() as cur:  # then one transaction: an update and a delete
            cur.execute(f"UPDATE {spec.table} SET amount = 99999999999999.99 WHERE id = 2")
            cur.execute(f"DELETE FROM {spec.table} WHERE id = 3")
    finally:
        src.close()

    changes = _events(bootstrap, spec.cdc_topic, 5)
    assert [c["op"] for c in changes] == ["c", "c", "c", "u", "d"]
    assert [c["after"]["amount"] for c in changes[:4]] == ["0.37", "0.74", "1.11", "99999999999999.99"]  # exact
    assert changes[4]["after"] is None and changes[4]["before"]["id"] == 3
    # Debezium's PostgreSQL transaction id is "<txId>:<lsn>" with each event's own LSN: a source
    # transaction is its txId, its events numbered 1..n by total_order, n given by its END
    first, second = changes[0]["source"]["txId"], changes[3]["source"]["txId"]
    assert [c["source"]["txId"] for c in changes] == [first] * 3 + [second] * 2 and first != second
    assert [c["transaction"]["total_order"] for c in changes] == [1, 2, 3, 1, 2]
    assert all(c["source"]["table"] == spec.table.split(".")[1] and c["source"]["lsn"] for c in changes)

    boundaries = _events(bootstrap, f"{spec.cdc_topic_prefix}.transaction", 4)
    assert [(b["status"], b["id"].split(":")[0]) for b in boundaries] == [
        ("BEGIN", str(first)), ("END", str(first)), ("BEGIN", str(second)), ("END", str(second))]
    assert [b["event_count"] for b in boundaries if b["status"] == "END"] == [3, 2]

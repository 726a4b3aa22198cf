"""Change data capture, the capture half: Debezium's PostgreSQL connector on the stack's Kafka Connect
worker, configured from a pipeline's spec, reads the source table's own inserts, updates and deletes
from its replication slot, each tagged with its source transaction (issue 31, item 1).

Real PostgreSQL (wal_level=logical), a real Connect worker with Debezium, a real broker. The source
is set up as a DBA would: the replication role exists; until the table's owner runs the pipeline's
grants, the check names what is missing and the statements that supply it.
"""

from __future__ import annotations

import json
import time
import uuid

import psycopg2
import pytest
from confluent_kafka import Consumer, TopicPartition

from tidemark.realtime.cdc.groups import capture_of, connector_name
from tidemark.realtime.cdc.source import CaptureNotReady, check_capture
from tidemark_workshop.stack.cdcrun import grant, make_cdc_pipeline, read_slot, remove_capture, start_connector


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
    """A CDC pipeline over a fresh table; afterwards its connector, slot, publication and topics go."""
    pipe = make_cdc_pipeline(settings, tmp_path)
    yield pipe
    remove_capture(settings, pipe.spec)


def _as(settings, user: str, password: str):
    import dataclasses

    return psycopg2.connect(dataclasses.replace(settings, pg_user=user, pg_password=password).dsn(settings.source_db))


def test_debezium_captures_inserts_updates_and_deletes_with_their_source_transactions(settings, captured, bootstrap):
    pipe = captured
    spec, role = pipe.spec, settings.cdc_user
    cdc = _as(settings, role, settings.cdc_password)
    try:
        with cdc, cdc.cursor() as cur:  # the replication role cannot read the table until the owner grants it
            with pytest.raises(CaptureNotReady) as missing:
                check_capture(cur, capture_of(spec, [spec]), role)
        text = str(missing.value)
        assert f"publication {spec.cdc_slot} does not exist: DO $$ BEGIN IF EXISTS" in text  # runs again as it is
        assert f"ELSE CREATE PUBLICATION \"{spec.cdc_slot}\" FOR TABLE" in text
        assert f"role {role} may not read {spec.table}: GRANT USAGE ON SCHEMA" in text and "Next: have" in text
        assert "would carry only its key, not the row it deleted: ALTER TABLE \"public\"" in text
        grant(settings, spec)  # what the DBA runs, once per pipeline
        with cdc, cdc.cursor() as cur:
            check_capture(cur, capture_of(spec, [spec]), role)
    finally:
        cdc.close()

    client = start_connector(settings, spec)
    stored = client.config(connector_name(spec))
    assert stored["database.password"].startswith("${dir:") and settings.cdc_password not in json.dumps(stored)
    held = read_slot(settings, spec)
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
    assert changes[4]["after"] is None and changes[4]["before"] == {**changes[2]["after"]}  # the whole row
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

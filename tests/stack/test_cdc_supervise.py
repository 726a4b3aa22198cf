"""Change data capture, supervised (issue 31, items 2 and 7): each supervisor cycle creates the
pipeline's connector from its spec once its handoff batch committed (and refuses to when that
batch's slot is gone: the next batch hands off anew), follows the desired state a person sets (pause, resume, stop),
restarts a failed task within the budget and then reports the crash loop with the task's own error,
and watches the WAL the slot keeps on the source: a warning, then a failure past the spec's limit. A
capture stopped for good and made again under the same connector name streams from its new slot,
not from the offsets Connect kept for that name.

Real PostgreSQL with logical decoding, a real Connect worker with Debezium. The cycle is
``tidemark.streams.capture.supervise_capture``, as the ``tidemark_supervisor`` DAG runs it.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import psycopg2
import pytest
from confluent_kafka import KafkaException

from tidemark import ledger
from tidemark.protocol.config import CONN_CDC
from tidemark.protocol.kafka_io import end_offsets, settled_replication
from tidemark.realtime.cdc.connect import ConnectClient
from tidemark.realtime.cdc.connector import write_secret as write_secret_file
from tidemark.realtime.cdc.groups import connector_name
from tidemark.streams.capture import supervise_capture
from tidemark.streams.cycle import prepare_stream_tables
from tidemark.streams.policy import Policy
from tidemark_workshop.stack.batchrun import query, until
from tidemark_workshop.stack.cdcrun import (
    captured,
    drop_slot,
    grant,
    make_cdc_pipeline,
    remove_capture,
    source_endpoint,
    write_secret,
)

POLICY = Policy(trigger_interval=timedelta(seconds=1), restart_budget=1, backoff=timedelta(seconds=1),
                stall_factor=5, min_stall=timedelta(seconds=5))  # the stall window: 5 s


def _on_topic(settings, topic: str) -> int:
    """Records on the topic (0 until Debezium's first record creates it)."""
    try:
        return sum(end_offsets(settings.kafka_bootstrap, topic, timeout_s=2).values())
    except KafkaException:
        return 0


@pytest.mark.serial("writes a wrong password into the Connect worker's secret file, which every lane's connectors read")
def test_the_supervisor_creates_restarts_pauses_and_stops_the_connector_and_watches_the_slot(
        settings, tmp_path, bootstrap):
    pipe = make_cdc_pipeline(settings, tmp_path)
    pipe = pipe.with_fields(cdc={**json.loads(pipe.path.read_text())["cdc"], "retained_wal_warning": "64KiB",
                                 "retained_wal_limit": "2MiB"})
    spec, client, name = pipe.spec, ConnectClient(settings.connect_url), connector_name(pipe.spec)
    endpoint = source_endpoint(settings)
    wh = pipe.wh()

    def cycle() -> tuple[str, str | None]:
        source = psycopg2.connect(settings.dsn(settings.source_db))
        try:
            return supervise_capture(captured(spec), wh, source, client, endpoint, POLICY, datetime.now(timezone.utc),
                                     replication=settled_replication(settings.kafka_bootstrap))
        finally:
            source.close()

    def desired(state: str) -> None:
        with wh, wh.cursor() as cur:
            ledger.set_desired(cur, spec.name, state, "it-person", "test")

    try:
        with wh, wh.cursor() as cur:
            ledger.ensure_control_schema(cur)
        line, failure = cycle()  # the DBA has not granted anything yet: nothing is created
        assert "capture: not set up" in line and f"CREATE PUBLICATION \"{spec.cdc_slot}\"" in failure
        assert client.state(name).state == "MISSING"

        grant(settings, spec)
        line, failure = cycle()  # granted, but no handoff batch has created the slot to stream from
        assert "action=wait" in line and "no handoff batch committed yet" in line and failure is None, line
        prepare_stream_tables(spec, wh, pipe.src)
        first, _ = pipe.run("handoff-1")
        assert first.handoff
        # the slot lost after the handoff (dropped by hand here): refused by name, and the next batch hands off anew
        drop_slot(settings, spec)
        line, failure = cycle()
        assert failure is not None and f"the replication slot {spec.cdc_slot} that its handoff batch" in failure
        assert "its next batch is a new handoff" in failure and client.state(name).state == "MISSING"
        again, _ = pipe.run("handoff-2")
        assert again.handoff
        line, failure = cycle()
        assert "action=create" in line and failure is None, line
        until("the connector running", lambda: client.state(name).running)
        until("its slot read", lambda: "active=True" in cycle()[0])
        line, failure = cycle()
        assert "state=RUNNING tasks=0:RUNNING desired=running action=none" in line and failure is None, line

        # a wrong password: Debezium's task fails to connect and Connect retries its poll forever while the
        # task looks RUNNING; the supervisor sees its slot unread, restarts it once, then reports the crash loop
        write_secret_file(settings.connect_secrets_dir, CONN_CDC, "not-the-password")
        client.restart(name, only_failed=False)
        line, failure = until("the crash loop", lambda: (r := cycle())[1] is not None and r, timeout=120)
        assert "action=crash_loop" in line and f"its connector {name} is crash-looping" in failure, (line, failure)
        assert "its slot unread for" in failure and "Connect worker's log" in failure and "action=clear" in failure
        write_secret(settings)  # fixed: the task reads its slot again
        client.restart(name, only_failed=False)
        until("the slot read again", lambda: "active=True" in cycle()[0], timeout=120)

        desired("paused")  # a paused pipeline's slot keeps WAL on the source: shown, warned, then a failure
        assert "action=pause" in cycle()[0]
        until("the connector paused", lambda: client.state(name).state == "PAUSED")
        query(settings, settings.source_db, f"INSERT INTO {spec.table} (id, amount) SELECT g, g FROM generate_series(1, 30000) g")
        line, failure = cycle()
        assert "state=PAUSED" in line and "retained_wal=" in line, line
        assert failure is not None and "past cdc.retained_wal_limit 2.0 MiB" in failure, (line, failure)
        assert "Next: resume the pipeline" in failure

        with wh, wh.cursor() as cur:
            cur.execute("SELECT kind, actor FROM tidemark_control.stream_events WHERE pipeline = %s AND kind LIKE "
                        "'connector_%%' ORDER BY at", (spec.name,))
            assert cur.fetchall() == [("connector_create", "supervisor"), ("connector_restart", "supervisor"),
                                      ("connector_pause", "supervisor")]

        desired("stopped")
        assert "action=stop" in cycle()[0]
        until("the connector stopped", lambda: client.state(name).state == "STOPPED")

        # stopped for good (connector, slot, publication and topics gone), then captured again under the same
        # name: Connect still keeps the old connector's offsets by that name, which point before the new slot's
        # start; the connector made again starts from the new slot, and a change made after it reaches the topic
        remove_capture(settings, spec)
        grant(settings, spec)
        desired("running")
        third, _ = pipe.run("handoff-3")
        assert third.handoff
        line, failure = cycle()  # (this test's WAL limit is tiny: the new slot may be past it already)
        assert "action=create" in line and (failure is None or "past cdc.retained_wal_limit" in failure), line
        until("the connector made again running", lambda: client.state(name).running)
        until("its new slot read", lambda: "active=True" in cycle()[0])
        query(settings, settings.source_db, f"INSERT INTO {spec.table} (id, amount) VALUES (40001, 1)")
        until("the change after the new handoff on the topic", lambda: _on_topic(settings, spec.cdc_topic) == 1,
              timeout=60)
        assert client.state(name).running, client.state(name)
    finally:
        write_secret(settings)
        wh.close()
        remove_capture(settings, spec)

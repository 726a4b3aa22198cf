"""Change data capture on the local stack, as the tests and the demo set it up: the DBA's grants,
the replication role's secret for the Connect worker, the pipeline's connector, and its removal."""

from __future__ import annotations

import random
import threading
import time
import uuid
from pathlib import Path

import psycopg2

from tidemark.protocol.config import CONN_CDC
from tidemark.protocol.kafka_io import client_config, settled_replication
from tidemark.protocol.spec import PipelineSpec
from tidemark.realtime.cdc.connect import ConnectClient
from tidemark.realtime.cdc.connector import SourceEndpoint, connector_config
from tidemark.realtime.cdc.connector import write_secret as write_secret_file
from tidemark.realtime.cdc.groups import Capture, capture_of, connector_name
from tidemark.realtime.cdc.signing import sign, signing_key
from tidemark.realtime.cdc.source import grant_sql, slot_named
from tidemark_workshop.settings import Settings
from tidemark_workshop.stack.batchrun import PAYMENTS_DDL, Pipeline, make_pipeline, until

STANDING = {"mode": "standing", "heartbeat": "PT1S"}  # the trigger: a CDC pipeline's default


def make_cdc_pipeline(settings: Settings, tmp_path: Path, trigger: str | None = None,
                      transport: str = "kafka", record_format: str = "avro") -> Pipeline:
    """A fresh PAYMENTS_DDL pipeline whose real-time input is the source table's own changes
    (``trigger``: its standing sink's, an ISO 8601 duration; a CDC pipeline's default, ``CDC_TRIGGER``,
    when None; ``transport``: its batches', the handoff's among them; ``record_format``: theirs too)."""
    unique = uuid.uuid4().hex[:10]
    return make_pipeline(settings, tmp_path, PAYMENTS_DDL, sink={**STANDING, **({"trigger": trigger} if trigger else {})},
                         cdc={"target_table": f"public.it_{unique}_rt", "serving_view": f"public.it_{unique}_serving",
                              "heartbeat": "PT1S"}, transport=transport, record_format=record_format)


def captured(what: PipelineSpec | Capture) -> Capture:
    """A capture group as it is, a pipeline as captured alone."""
    return what if isinstance(what, Capture) else capture_of(what, [what])


def grant(settings: Settings, what: PipelineSpec | Capture) -> None:
    """What the tables' owner runs once per capture (tidemark.realtime.cdc.source.grant_sql)."""
    owner = psycopg2.connect(settings.dsn(settings.source_db))
    try:
        with owner, owner.cursor() as cur:
            for statement in grant_sql(captured(what), settings.cdc_user):
                cur.execute(statement)
    finally:
        owner.close()


def write_secret(settings: Settings) -> str:
    """The replication role's password where the worker resolves ``${dir:...:tidemark_cdc}``; its file name."""
    return write_secret_file(settings.connect_secrets_dir, CONN_CDC, settings.cdc_password)


def source_endpoint(settings: Settings) -> SourceEndpoint:
    """What a connector on the local stack is given, as the supervisor gives it (``hooks.ConnectHook.capture``): the
    replication role and the key it signs records with, both secrets written where the worker reads them."""
    signing, key = signing_key(settings.control_keyring())
    write_secret_file(settings.connect_secrets_dir, signing.secret_file, key)
    return SourceEndpoint(settings.pg_host, settings.pg_port, settings.source_db, settings.cdc_user,
                          write_secret(settings), str(settings.connect_secrets_dir), signing)


def signature(settings: Settings, topic: str, value: bytes) -> str:
    """The ``tidemark.signature`` header the local stack's Connect worker gives a record: its key id, and
    the record signed with the key ``source_endpoint`` gives it."""
    signing, key = signing_key(settings.control_keyring())
    return f"{signing.key_id}:{sign(key, topic, value)}"


def read_slot(settings: Settings, spec: PipelineSpec):
    conn = psycopg2.connect(settings.dsn(settings.source_db))
    try:
        with conn, conn.cursor() as cur:
            return slot_named(cur, spec.cdc_slot)
    finally:
        conn.close()


def drop_slot(settings: Settings, spec: PipelineSpec) -> None:
    """The pipeline's slot gone from the source (as a DBA's drop or a lost slot leaves it)."""
    owner = psycopg2.connect(settings.dsn(settings.source_db))
    owner.autocommit = True
    try:
        with owner.cursor() as cur:
            cur.execute("SELECT pg_drop_replication_slot(%s)", (spec.cdc_slot,))
    finally:
        owner.close()


def start_connector(settings: Settings, what: PipelineSpec | Capture) -> ConnectClient:
    """Create the capture's connector and wait until its task runs and reads its slot."""
    client, capture = ConnectClient(settings.connect_url), captured(what)
    spec = capture.lead
    client.put_config(connector_name(spec), connector_config(capture, source_endpoint(settings),
                                                             replication=settled_replication(settings.kafka_bootstrap)))
    until("the connector and its task running", lambda: client.state(connector_name(spec)).running, timeout=120)
    until("Debezium reading its slot", lambda: (s := read_slot(settings, spec)) is not None and s.active, timeout=120)
    return client


def drop_capture(settings: Settings, name: str, wait_s: float = 60) -> None:
    """The source's slot and publication ``name`` gone: the slot once its reader let go (a deleted
    connector's task; after ``wait_s`` its connection is ended), then the publication."""
    owner = psycopg2.connect(settings.dsn(settings.source_db))
    owner.autocommit = True
    try:
        with owner.cursor() as cur:
            deadline, ended = time.monotonic() + wait_s, False
            while (held := slot_named(cur, name)) is not None and held.active:
                if time.monotonic() > deadline:
                    if ended:
                        raise RuntimeError(f"replication slot {name} is still read after its reader's connection "
                                           "was ended: who reads it? (pg_replication_slots.active_pid)")
                    cur.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                                "WHERE slot_name = %s AND active", (name,))
                    deadline, ended = time.monotonic() + 10, True
                time.sleep(0.5)
            if held is not None:
                cur.execute("SELECT pg_drop_replication_slot(%s)", (name,))
            cur.execute(f'DROP PUBLICATION IF EXISTS "{name}"')
    finally:
        owner.close()


def remove_capture(settings: Settings, spec: PipelineSpec) -> None:
    """Stop capturing for good: the connector, then its slot, publication and topics."""
    from confluent_kafka.admin import AdminClient

    client = ConnectClient(settings.connect_url)
    if client.config(connector_name(spec)) is not None:
        client.delete(connector_name(spec))
    drop_capture(settings, spec.cdc_slot)
    admin = AdminClient(client_config(settings.kafka_bootstrap))
    mine = [t for t in admin.list_topics(timeout=10).topics if spec.cdc_topic_prefix in t]
    for future in admin.delete_topics(mine).values() if mine else ():
        future.result(timeout=30)


class SourceWriters:
    """Source transactions from a seeded generator: inserts of new ids, updates (the cursor moves)
    and deletes of existing ones, each its own transaction, until stopped."""

    def __init__(self, settings: Settings, table: str, ids: set[int], seed: int, pause_s: float = 0.02):
        self.settings, self.table, self.ids, self.rng = settings, table, set(ids), random.Random(seed)
        self.pause_s = pause_s
        self.next_id, self.done, self.counts = max(ids) + 1, threading.Event(), {"I": 0, "U": 0, "D": 0}
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        conn = psycopg2.connect(self.settings.dsn(self.settings.source_db))
        try:
            while not self.done.is_set():
                kind = self.rng.choice("IIUUD") if self.ids else "I"
                with conn, conn.cursor() as cur:
                    if kind == "I":
                        cur.execute(f"INSERT INTO {self.table} (id, amount) VALUES (%s, %s)",
                                    (self.next_id, self.rng.randint(1, 10**6) / 100))
                        self.ids.add(self.next_id)
                        self.next_id += 1
                    else:
                        key = self.rng.choice(sorted(self.ids))
                        if kind == "U":
                            cur.execute(f"UPDATE {self.table} SET amount = amount + 1, updated_at = clock_timestamp() "
                                        "WHERE id = %s", (key,))
                        else:
                            cur.execute(f"DELETE FROM {self.table} WHERE id = %s", (key,))
                            self.ids.discard(key)
                self.counts[kind] += 1
                time.sleep(self.pause_s)
        finally:
            conn.close()

    def __enter__(self) -> "SourceWriters":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join()

"""The handoff's foundation against the real source: a slot created with an exported snapshot
(tidemark.realtime.cdc.handoff). What the snapshot shows and what the slot streams split the writes exactly,
whoever writes meanwhile; a read outside a transaction block fails instead of reading the present;
a failed handoff leaves no slot; a slot in the way is refused, or replaced when stale."""

from __future__ import annotations

import json
import uuid

import psycopg2
import pytest

from tidemark.batch.extract.snapshot import import_snapshot, snapshot_init
from tidemark.realtime.cdc.handoff import HandoffError, exported_snapshot
from tidemark.realtime.cdc.source import slot_named

pytestmark = pytest.mark.stack


def _params(settings, conn_id: str) -> dict:
    c = json.loads(settings.airflow_connections()[f"AIRFLOW_CONN_{conn_id}"])
    return {"host": c["host"], "port": c["port"], "dbname": c["schema"], "user": c["login"], "password": c["password"]}


@pytest.fixture
def table(settings):
    """A source table with rows 1..100, its publication, and the read grants of both roles; the
    slot and publication of the test dropped afterwards."""
    name = f"handoff_{uuid.uuid4().hex[:8]}"
    owner = psycopg2.connect(settings.dsn(settings.source_db))
    owner.autocommit = True
    with owner.cursor() as cur:
        cur.execute(f"CREATE TABLE public.{name} (id int PRIMARY KEY, v text NOT NULL)")
        cur.execute(f"INSERT INTO public.{name} SELECT g, 'before' FROM generate_series(1, 100) g")
        cur.execute(f"CREATE PUBLICATION {name} FOR TABLE public.{name}")
        cur.execute(f"GRANT SELECT ON public.{name} TO {settings.source_user}, {settings.cdc_user}")
    yield name, owner
    with owner.cursor() as cur:
        cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (name,))
        cur.execute(f"DROP PUBLICATION IF EXISTS {name}")
        cur.execute(f"DROP TABLE public.{name}")
    owner.close()


def _changes(owner, slot: str, publication: str) -> dict[str, int]:
    """The slot's pending changes by kind (pgoutput's message type: I, U, D), without consuming them."""
    with owner.cursor() as cur:
        cur.execute("SELECT chr(get_byte(data, 0)), count(*) FROM pg_logical_slot_peek_binary_changes("
                    "%s, NULL, NULL, 'proto_version', '1', 'publication_names', %s) GROUP BY 1", (slot, publication))
        return {kind: n for kind, n in cur.fetchall() if kind in "IUD"}


def test_the_snapshot_and_the_slot_split_the_writes_exactly(settings, table):
    name, owner = table
    reader = psycopg2.connect(**_params(settings, "TIDEMARK_SOURCE"))  # the extract's read-only role imports it
    try:
        with exported_snapshot(_params(settings, "TIDEMARK_CDC"), name, name) as handoff:
            with owner.cursor() as cur:  # writers go on while the batch reads
                cur.execute(f"INSERT INTO public.{name} SELECT g, 'after' FROM generate_series(101, 130) g")
                cur.execute(f"UPDATE public.{name} SET v = 'changed' WHERE id <= 5")
                cur.execute(f"DELETE FROM public.{name} WHERE id BETWEEN 6 AND 8")
            with reader.cursor() as cur:
                import_snapshot(cur, handoff.snapshot)
                cur.execute(f"SELECT count(*), count(*) FILTER (WHERE v <> 'before'), max(id) FROM public.{name}")
                assert cur.fetchone() == (100, 0, 100)  # the table as it was when the slot began
            reader.commit()
        with owner.cursor() as cur:
            found = slot_named(cur, name)
        assert not found.active and found.confirmed_flush_lsn == handoff.consistent_point  # Debezium starts exactly there
        assert _changes(owner, name, name) == {"I": 30, "U": 5, "D": 3}  # and streams exactly the rest
    finally:
        reader.close()


def test_a_read_outside_a_transaction_block_fails_instead_of_reading_the_present(settings, table):
    name, _ = table
    reader = psycopg2.connect(**_params(settings, "TIDEMARK_SOURCE"))
    reader.autocommit = True  # as Spark's JDBC read is with fetchsize 0 or a camel-case fetchSize
    try:
        with exported_snapshot(_params(settings, "TIDEMARK_CDC"), name, name) as handoff:
            with reader.cursor() as cur, pytest.raises(psycopg2.errors.NoActiveSqlTransaction):
                cur.execute(snapshot_init(handoff.snapshot))
    finally:
        reader.close()


def test_a_failed_handoff_leaves_no_slot_and_a_slot_in_the_way_is_refused_or_replaced(settings, table):
    name, owner = table
    with pytest.raises(RuntimeError, match="the read failed"):
        with exported_snapshot(_params(settings, "TIDEMARK_CDC"), name, name):
            raise RuntimeError("the read failed")
    with owner.cursor() as cur:
        assert slot_named(cur, name) is None  # no WAL held for a handoff that did not happen

    with exported_snapshot(_params(settings, "TIDEMARK_CDC"), name, name) as first:
        pass
    with pytest.raises(HandoffError, match=f"replication slot {name} already exists.*pg_drop_replication_slot"):
        with exported_snapshot(_params(settings, "TIDEMARK_CDC"), name, name):
            pass
    with exported_snapshot(_params(settings, "TIDEMARK_CDC"), name, name, replace_stale=True) as second:
        pass  # the ledger says no handoff completed: the stale slot of a dead attempt gives way
    assert second.snapshot != first.snapshot
    with pytest.raises(HandoffError, match="publication nothing_here does not exist"):
        with exported_snapshot(_params(settings, "TIDEMARK_CDC"), f"{name}_2", "nothing_here"):
            pass

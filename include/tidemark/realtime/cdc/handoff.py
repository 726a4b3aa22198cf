"""The exact handoff of a CDC pipeline from its first batch to its change stream: the pipeline's
replication slot created with an exported snapshot.

``exported_snapshot`` opens a replication connection (``replication=database``), creates the
pipeline's logical slot (pgoutput) and leaves that connection idle while the batch reads. Every
session of the read imports the snapshot first (``tidemark.batch.extract.snapshot``), so the batch holds exactly the
rows committed before the slot's consistent point, and the slot streams exactly what came after
(PostgreSQL's guarantee for a slot's exported snapshot). On success the replication connection
closes and the slot stays at its consistent point, where Debezium starts (``snapshot.mode`` no_data,
the same slot). On failure the slot is dropped: no WAL is held for a handoff that did not happen.

What it costs the source: the exporting transaction and every importing one hold back the xmin
horizon (vacuum) for the length of the read, and the slot holds WAL from its creation until the
connector reads it. Creating the slot waits for the transactions running at that moment to end.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager as ContextManager
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

from tidemark.protocol.errors import Terminal, Transient
from tidemark.realtime.cdc.source import slot_named

SLOT_NAME = re.compile(r"[a-z0-9_]{1,63}")  # PostgreSQL's rule for replication slot names
RELEASE_WAIT_S = 30.0  # how long a handoff waits for a slot in the way to lose its reader


class HandoffError(Terminal):
    """The handoff cannot start as things stand (a slot in the way, no publication): the message
    says what to do first."""


class SlotBusy(Transient):
    """The slot a planned handoff replaces still has a reader (a connector the supervisor has not
    stopped yet): a later try finds it free."""


@dataclass(frozen=True)
class Handoff:
    slot: str
    consistent_point: str  # the LSN the slot streams from, as PostgreSQL spells it (``0/16B3748``)
    snapshot: str  # the exported snapshot's name, for ``SET TRANSACTION SNAPSHOT``
    made_slot: bool = True  # this handoff made the slot (a capture group's later members read after it)


def drop_slot(cur, slot: str) -> bool:
    """Drop ``slot`` when no one reads it; whether it was dropped."""
    cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                "WHERE slot_name = %s AND database = current_database() AND NOT active", (slot,))
    return cur.rowcount == 1


@contextmanager
def exported_snapshot(params: dict[str, Any], slot: str, publication: str, *,
                      replace_stale: bool = False, keep_on_failure: bool = False) -> Iterator[Handoff]:
    """Create ``slot`` with an exported snapshot and hold the snapshot for the ``with`` block.

    ``params``: psycopg2 connection parameters of a role with REPLICATION on the source database.
    The publication must exist before the slot (a change decoded before it existed is not
    published). A slot of that name that no one reads (within ``RELEASE_WAIT_S``) is dropped first
    when ``replace_stale`` (the ledger planned a handoff: none completed, an earlier attempt died
    holding the slot, or a person asked for a re-snapshot and the supervisor stopped the connector);
    any other slot in the way refuses the handoff. ``keep_on_failure``: a capture group's slot stays when
    the handoff fails (another member's handoff may already read in a snapshot taken after it)."""
    import psycopg2
    import psycopg2.extras

    if not SLOT_NAME.fullmatch(slot):
        raise HandoffError(f"not a replication slot name: {slot!r} (a-z, 0-9 and _, at most 63)")
    admin = psycopg2.connect(**params)
    admin.autocommit = True
    replication = None
    try:
        with admin.cursor() as cur:
            _check_way_clear(cur, slot, publication, replace_stale)
        # idle in its exporting transaction while the batch reads: no server timeout may end it
        replication = psycopg2.connect(**{**params, "options": _with_option(
            params.get("options"), "idle_in_transaction_session_timeout=0")},
            connection_factory=psycopg2.extras.LogicalReplicationConnection)
        with replication.cursor() as cur:
            cur.execute(f"CREATE_REPLICATION_SLOT {slot} LOGICAL pgoutput EXPORT_SNAPSHOT")
            name, point, snapshot, _ = cur.fetchone()
        yield Handoff(name, point, snapshot)
    except BaseException:
        if replication is not None:
            replication.close()  # the slot is free once its creator is gone
            replication = None
            if not keep_on_failure:
                with admin.cursor() as cur:
                    drop_slot(cur, slot)
        raise
    finally:
        if replication is not None:
            replication.close()
        admin.close()


@contextmanager
def member_handoff(params: dict[str, Any], slot: str, publication: str,
                   snapshot_after: Callable[[], ContextManager[Any]]) -> Iterator[Handoff]:
    """The handoff of a capture group's member (``tidemark.realtime.cdc.groups``): the group's slot is made once,
    by the first member's handoff, with its exported snapshot as a pipeline's own (``exported_snapshot``;
    made again when lost). A later member's handoff leaves the slot as it is and reads in a snapshot
    taken after it (``snapshot_after``: a context giving the snapshot's ``name`` and ``wal`` position):
    every change committed after that snapshot is in the slot's stream, every one before it in the
    snapshot, and one in both lands twice, the newest cursor winning (an idempotent upsert). The
    members' handoffs take turns to look at the slot (a session advisory lock on the source), so two
    running at once never make it twice."""
    import psycopg2

    turn = psycopg2.connect(**params)
    turn.autocommit = True
    try:
        with turn.cursor() as cur:
            cur.execute("SET lock_timeout = '15min'")  # a slot's creation waits for the transactions running then
            cur.execute("SELECT pg_advisory_lock(hashtext(%s))", (f"tidemark handoff {slot}",))
            held = slot_named(cur, slot)
        with ExitStack() as stack:
            if held is None or held.wal_status == "lost":
                handoff = stack.enter_context(exported_snapshot(params, slot, publication,
                                                                replace_stale=held is not None, keep_on_failure=True))
            else:
                taken = stack.enter_context(snapshot_after())
                handoff = Handoff(slot, taken.wal, taken.name, made_slot=False)
            turn.close()  # the slot exists now: the next member's handoff may look
            yield handoff
    finally:
        turn.close()


def _check_way_clear(cur, slot: str, publication: str, replace_stale: bool) -> None:
    cur.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,))
    if cur.fetchone() is None:
        raise HandoffError(f"publication {publication} does not exist on the source: it must exist before the slot "
                           "(`python -m tidemark.realtime.cdc.grants <pipeline>` prints the statements for the table's owner)")
    found = slot_named(cur, slot)
    deadline = time.monotonic() + RELEASE_WAIT_S
    while replace_stale and found is not None and found.active and time.monotonic() < deadline:
        time.sleep(1.0)  # a connector stopped a moment ago (a re-snapshot) lets go of its slot within seconds
        found = slot_named(cur, slot)
    if found is None:
        return
    active = found.active
    if active and replace_stale:
        raise SlotBusy(
            f"replication slot {slot} is still read by a connector after {RELEASE_WAIT_S:.0f} s: the supervisor stops "
            "the connector of a pipeline asked to re-snapshot at its next cycle (each minute), and Airflow retries this "
            "step. If it keeps failing, read the pipeline's line in the tidemark_supervisor task's log")
    if active or not replace_stale:
        raise HandoffError(
            f"replication slot {slot} already exists{' and is read by a connector' if active else ''}: a new "
            "handoff would start a second stream. Next: if the pipeline's stream is to start over, stop its connector "
            f"(tidemark_stream_control) and drop the slot on the source: SELECT pg_drop_replication_slot('{slot}')")
    drop_slot(cur, slot)


def _with_option(options: str | None, setting: str) -> str:
    return f"{options} -c {setting}".strip() if options else f"-c {setting}"

"""CDC handoffs: where each handoff batch's extract attempt left its replication slot, and which of
them committed (the pipeline's handoff position: its stream starts there)."""

from __future__ import annotations

import psycopg2.errors

from dataclasses import dataclass
from typing import Any

from tidemark.ledger.streams import record_stream_event


@dataclass(frozen=True)
class HandoffPosition:
    batch_id: str
    attempt: int
    slot: str
    consistent_point: str  # as PostgreSQL spells an LSN (``0/16B3748``)


def record_handoff(cur, pipeline: str, batch_id: str, attempt: int, slot: str, consistent_point: str,
                   made_slot: bool = True) -> None:
    """What the handoff batch's extract attempt reported (the orchestrator records it, as the totals)."""
    cur.execute("""INSERT INTO tidemark_control.cdc_handoffs (batch_id, attempt, pipeline, slot, consistent_point,
                                                             made_slot)
                   VALUES (%s, %s, %s, %s, %s::pg_lsn, %s)
                   ON CONFLICT (batch_id, attempt) DO UPDATE
                   SET slot = EXCLUDED.slot, consistent_point = EXCLUDED.consistent_point,
                       made_slot = EXCLUDED.made_slot""",
                (batch_id, attempt, pipeline, slot, consistent_point, made_slot))


def slot_made_after_handoff(cur, pipeline: str, slot: str) -> bool:
    """Whether ``slot`` was made (by any handoff's extract) after ``pipeline``'s committed handoff was
    read: a capture group's slot lost and made again by another member, whose stream misses what
    happened to this member's table in between (this member hands off again)."""
    cur.execute("""SELECT EXISTS (
                     SELECT 1 FROM tidemark_control.cdc_handoffs made
                      WHERE made.slot = %(slot)s AND made.made_slot AND made.recorded_at > (
                            SELECT max(h.recorded_at) FROM tidemark_control.cdc_handoffs h
                              JOIN tidemark_control.batches b ON b.batch_id = h.batch_id
                                                             AND b.committed_attempt = h.attempt
                             WHERE h.pipeline = %(p)s AND b.state = 'committed'))""", {"slot": slot, "p": pipeline})
    return cur.fetchone()[0]


def record_snapshot_wal(cur, batch_id: str, attempt: int, wal: str) -> None:
    """The WAL position just after a capture group member's extract took its snapshot (its report's)."""
    cur.execute("UPDATE tidemark_control.batch_attempts SET snapshot_wal = %s::pg_lsn WHERE batch_id = %s AND attempt = %s",
                (wal, batch_id, attempt))


def snapshot_wal(cur, batch_id: str, attempt: int) -> int | None:
    """Where a capture group member's attempt read the source, as a WAL position: its handoff's, or its
    snapshot's (None: not recorded, a batch of a pipeline in no group)."""
    cur.execute("""SELECT coalesce(h.consistent_point, a.snapshot_wal) - '0/0'::pg_lsn
                     FROM tidemark_control.batch_attempts a
                     LEFT JOIN tidemark_control.cdc_handoffs h ON h.batch_id = a.batch_id AND h.attempt = a.attempt
                    WHERE a.batch_id = %s AND a.attempt = %s""", (batch_id, attempt))
    row = cur.fetchone()
    return int(row[0]) if row and row[0] is not None else None


def stream_position(cur, consumer: str, *, hold: bool = False) -> int:
    """The commit position a capture's stream has applied (-1: none yet). ``hold``: its row is kept
    from the applier's next move (FOR SHARE) until the caller's transaction ends, waiting at most a
    minute for the applier's micro-batch in flight (past it: -1, ask again)."""
    if not hold:
        cur.execute("SELECT commit_lsn FROM tidemark_control.cdc_positions WHERE consumer = %s", (consumer,))
        row = cur.fetchone()
        return row[0] if row else -1
    cur.execute("SAVEPOINT stream_position")
    try:
        cur.execute("SET LOCAL lock_timeout = '60s'")
        cur.execute("SELECT commit_lsn FROM tidemark_control.cdc_positions WHERE consumer = %s FOR SHARE", (consumer,))
        row = cur.fetchone()
    except psycopg2.errors.LockNotAvailable:
        cur.execute("ROLLBACK TO SAVEPOINT stream_position")  # (the lock_timeout too)
        return -1
    cur.execute("SET LOCAL lock_timeout TO DEFAULT")
    cur.execute("RELEASE SAVEPOINT stream_position")
    return row[0] if row else -1


def sealed_with_every_end(cur, pipeline: str, partitions: int) -> list[tuple[str, int]]:
    """The pipeline's sealed attempts whose END came on every partition: complete, not yet committed
    (a capture group member's waits for the group's stream to pass its snapshot)."""
    cur.execute("""SELECT a.batch_id, a.attempt FROM tidemark_control.batch_attempts a
                     JOIN tidemark_control.batches b ON b.batch_id = a.batch_id
                    WHERE b.pipeline = %s AND a.state = 'sealed'
                      AND (SELECT count(*) FROM tidemark_control.batch_ends e
                            WHERE e.batch_id = a.batch_id AND e.attempt = a.attempt) = %s
                    ORDER BY a.sealed_at""", (pipeline, partitions))
    return [(batch_id, attempt) for batch_id, attempt in cur.fetchall()]


def register_group(cur, name: str, members: list[str]) -> None:
    """A capture group's members as its lead sees them (its serving views wait for every one's handoff)."""
    cur.execute("""INSERT INTO tidemark_control.capture_groups (name, members) VALUES (%s, %s)
                   ON CONFLICT (name) DO UPDATE SET members = EXCLUDED.members, updated_at = clock_timestamp()
                   WHERE capture_groups.members IS DISTINCT FROM EXCLUDED.members""", (name, members))


def group_members(cur, name: str) -> list[str] | None:
    """The members whose change topics the group's running lead reads (it registered them at its start)."""
    cur.execute("SELECT members FROM tidemark_control.capture_groups WHERE name = %s", (name,))
    row = cur.fetchone()
    return list(row[0]) if row else None


def record_group_streamed(cur, name: str, members: list[str]) -> None:
    """The members whose tables the group's connector captures: set once it runs with their tables (created
    with them, or stopped, reconfigured and resumed), so a later member's handoff snapshot is in its stream."""
    cur.execute("""INSERT INTO tidemark_control.capture_groups (name, members, streamed) VALUES (%s, '{}', %s)
                   ON CONFLICT (name) DO UPDATE SET streamed = EXCLUDED.streamed""", (name, members))


def group_streamed(cur, name: str) -> list[str] | None:
    """The members the group's connector captures (None: its connector was never started)."""
    cur.execute("SELECT streamed FROM tidemark_control.capture_groups WHERE name = %s", (name,))
    row = cur.fetchone()
    return list(row[0]) if row and row[0] is not None else None


def record_sink_capture(cur, pipeline: str, fence: int, signature: str) -> None:
    """The capture a capture group member's sink started with, under its fencing token."""
    cur.execute("""INSERT INTO tidemark_control.sink_captures (pipeline, fence, signature) VALUES (%s, %s, %s)
                   ON CONFLICT (pipeline) DO UPDATE SET fence = EXCLUDED.fence, signature = EXCLUDED.signature,
                                                        at = clock_timestamp()""", (pipeline, fence, signature))


def sink_capture(cur, pipeline: str, fence: int) -> str | None:
    """The capture signature the sink holding ``fence`` started with (None: not recorded for that token)."""
    cur.execute("SELECT signature FROM tidemark_control.sink_captures WHERE pipeline = %s AND fence = %s",
                (pipeline, fence))
    row = cur.fetchone()
    return row[0] if row else None


def committed_handoff(cur, pipeline: str) -> HandoffPosition | None:
    """The pipeline's handoff: the latest committed handoff batch's position (None: none committed)."""
    cur.execute("""SELECT h.batch_id, h.attempt, h.slot, h.consistent_point::text
                   FROM tidemark_control.cdc_handoffs h
                   JOIN tidemark_control.batches b ON b.batch_id = h.batch_id AND b.committed_attempt = h.attempt
                   WHERE h.pipeline = %s AND b.state = 'committed'
                   ORDER BY b.committed_at DESC LIMIT 1""", (pipeline,))
    row = cur.fetchone()
    return HandoffPosition(*row) if row else None


@dataclass(frozen=True)
class ResnapshotRequest:
    actor: str
    at: Any
    reason: str | None


def request_resnapshot(cur, pipeline: str, actor: str, reason: str | None = None) -> None:
    """A person asks for the pipeline's stream to start over from a new handoff (who, when, why): until
    a handoff batch commits after it, the supervisor keeps the connector stopped and the next batch
    run is that handoff."""
    record_stream_event(cur, pipeline, "resnapshot", actor, reason)


def resnapshot_asked(cur, pipeline: str) -> ResnapshotRequest | None:
    """The newest re-snapshot asked for since the pipeline's last committed handoff (None: none waits;
    a pipeline with no committed handoff has its first one coming anyway)."""
    cur.execute("""SELECT e.actor, e.at, e.detail
                     FROM tidemark_control.stream_events e
                    WHERE e.pipeline = %(p)s AND e.kind = 'resnapshot'
                      AND e.at > (SELECT max(b.committed_at) FROM tidemark_control.cdc_handoffs h
                                    JOIN tidemark_control.batches b
                                      ON b.batch_id = h.batch_id AND b.committed_attempt = h.attempt
                                   WHERE h.pipeline = %(p)s AND b.state = 'committed')
                    ORDER BY e.at DESC LIMIT 1""", {"p": pipeline})
    row = cur.fetchone()
    return ResnapshotRequest(*row) if row else None

"""CDC handoffs: where each handoff batch's extract attempt left its replication slot, and which of
them committed (the pipeline's handoff position: its stream starts there)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tidemark.ledger.streams import record_stream_event


@dataclass(frozen=True)
class HandoffPosition:
    batch_id: str
    attempt: int
    slot: str
    consistent_point: str  # as PostgreSQL spells an LSN (``0/16B3748``)


def record_handoff(cur, pipeline: str, batch_id: str, attempt: int, slot: str, consistent_point: str) -> None:
    """What the handoff batch's extract attempt reported (the orchestrator records it, as the totals)."""
    cur.execute("""INSERT INTO tidemark_control.cdc_handoffs (batch_id, attempt, pipeline, slot, consistent_point)
                   VALUES (%s, %s, %s, %s, %s::pg_lsn)
                   ON CONFLICT (batch_id, attempt) DO UPDATE
                   SET slot = EXCLUDED.slot, consistent_point = EXCLUDED.consistent_point""",
                (batch_id, attempt, pipeline, slot, consistent_point))


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

"""CDC handoffs: where each handoff batch's extract attempt left its replication slot, and which of
them committed (the pipeline's handoff position: its stream starts there)."""

from __future__ import annotations

from dataclasses import dataclass


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

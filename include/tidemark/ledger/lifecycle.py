"""Attempts and their one state machine, and the per-pipeline turn (one run from plan to commit)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tidemark.ledger.batches import AlreadyCommitted
from tidemark.protocol.control import PartitionTotals, dumps_totals, loads_totals
from tidemark.protocol.window import Bound, Window


def take_turn(cur, pipeline: str, run_id: str, *, stale: str | None = None) -> tuple[str, Any] | None:
    """Take the pipeline's turn for ``run_id`` (again, if it holds it already); None when taken,
    else (the run holding it, since when). ``stale``: a holder the caller knows has ended, whose
    turn is taken over."""
    cur.execute(
        """INSERT INTO tidemark_control.pipeline_turns AS t (pipeline, run_id) VALUES (%(p)s, %(run)s)
           ON CONFLICT (pipeline) DO UPDATE SET run_id = EXCLUDED.run_id, taken_at = clock_timestamp()
            WHERE t.run_id = EXCLUDED.run_id OR t.run_id = %(stale)s
           RETURNING run_id""",
        {"p": pipeline, "run": run_id, "stale": stale},
    )
    if cur.fetchone() is not None:
        return None
    cur.execute("SELECT run_id, taken_at FROM tidemark_control.pipeline_turns WHERE pipeline = %s", (pipeline,))
    return cur.fetchone()


def release_turn(cur, pipeline: str, run_id: str) -> bool:
    """The run is done with the pipeline (committed, skipped or failed): the next run may go."""
    cur.execute("DELETE FROM tidemark_control.pipeline_turns WHERE pipeline = %s AND run_id = %s", (pipeline, run_id))
    return cur.rowcount == 1


#   batches:        planned -> open -> sealed -> committed | refused | aborted   (a new attempt: -> open)
#   batch_attempts: open -> sealed -> committed | refused | aborted | superseded
# Nothing leaves committed, refused, aborted or superseded. Every state change goes through
# ``open_attempt`` (a new attempt) or ``transition`` (everything else), each guarded in SQL.
FINAL = ("committed", "refused", "aborted", "superseded")


MOVES = {  # target state -> the attempt states it may come from
    "sealed": ("open",),
    "committed": ("sealed",),  # only the totals the orchestrator sealed can commit (the sink checks it too)
    "refused": ("open", "sealed"),
    "aborted": ("open", "sealed"),
    "superseded": ("open", "sealed"),
}


def transition(cur, batch_id: str, attempt: int, to: str, *, message: str | None = None,
               rows: int | None = None, checksum: int | None = None) -> bool:
    """Move an attempt to ``to`` if its current state allows it (else False, nothing changed), and
    the batch with it when this is the batch's current attempt and the batch is not committed."""
    if to not in MOVES:
        raise ValueError(f"no transition to {to!r}; states reachable: {sorted(MOVES)}")
    cur.execute(
        """UPDATE tidemark_control.batch_attempts
              SET state = %(to)s, message = coalesce(%(message)s, message), rows = coalesce(%(rows)s, rows),
                  checksum = coalesce(%(checksum)s, checksum),
                  sealed_at = CASE WHEN %(to)s = 'sealed' THEN clock_timestamp() ELSE sealed_at END,
                  finished_at = CASE WHEN %(to)s = 'sealed' THEN finished_at ELSE clock_timestamp() END
            WHERE batch_id = %(batch)s AND attempt = %(attempt)s AND state = ANY(%(froms)s)""",
        {"to": to, "message": message, "rows": rows, "checksum": checksum, "batch": batch_id, "attempt": attempt,
         "froms": list(MOVES[to])},
    )
    if cur.rowcount != 1:
        return False
    if to == "superseded":  # a newer attempt is the batch's current one
        return True
    cur.execute(
        """UPDATE tidemark_control.batches
              SET state = %(to)s, updated_at = clock_timestamp(),
                  message = CASE WHEN %(to)s = 'committed' THEN NULL ELSE coalesce(%(message)s, message) END,
                  committed_attempt = CASE WHEN %(to)s = 'committed' THEN attempt ELSE committed_attempt END,
                  rows = CASE WHEN %(to)s = 'committed' THEN %(rows)s ELSE rows END,
                  checksum = CASE WHEN %(to)s = 'committed' THEN %(checksum)s ELSE checksum END,
                  committed_at = CASE WHEN %(to)s = 'committed' THEN clock_timestamp() ELSE committed_at END
            WHERE batch_id = %(batch)s AND attempt = %(attempt)s AND state <> 'committed'""",
        {"to": to, "message": message, "rows": rows, "checksum": checksum, "batch": batch_id, "attempt": attempt},
    )
    return True


def open_attempt(cur, batch_id: str) -> int:
    """The next attempt number for the batch, recorded as open; every older open or sealed attempt
    is superseded (fenced). A committed batch is never reopened (``AlreadyCommitted``)."""
    cur.execute(
        """UPDATE tidemark_control.batches SET attempt = attempt + 1, state = 'open',
                  updated_at = clock_timestamp()
            WHERE batch_id = %s AND state <> 'committed' RETURNING attempt""",
        (batch_id,),
    )
    row = cur.fetchone()
    if row is None:
        cur.execute("SELECT committed_attempt, rows, committed_at FROM tidemark_control.batches WHERE batch_id = %s",
                    (batch_id,))
        done = cur.fetchone()
        if done is None:
            raise LookupError(f"batch {batch_id} was never planned")
        raise AlreadyCommitted(f"batch {batch_id} was committed by attempt {done[0]} at {done[2]:%Y-%m-%dT%H:%M:%S%z} "
                               f"with rows={done[1]}; it is never reopened")
    attempt = row[0]
    cur.execute("INSERT INTO tidemark_control.batch_attempts (batch_id, attempt, state) VALUES (%s, %s, 'open') "
                "ON CONFLICT DO NOTHING", (batch_id, attempt))
    cur.execute("SELECT attempt FROM tidemark_control.batch_attempts WHERE batch_id = %s AND attempt < %s "
                "AND state IN ('open', 'sealed')", (batch_id, attempt))
    for (older,) in cur.fetchall():
        transition(cur, batch_id, older, "superseded", message=f"superseded by attempt {attempt}")
    return attempt


def record_extract(cur, batch_id: str, attempt: int, totals: dict[int, PartitionTotals],
                   offsets: dict[int, tuple[int, int]] | None = None) -> None:
    """Keep what the extract counted, per partition, for the END step (never in XCom: the sums
    pass 64 bits), and the Kafka offsets it wrote, [first, next) per partition."""
    cur.execute(
        """UPDATE tidemark_control.batch_attempts SET extract_totals = %s, rows = %s, checksum = %s,
                  extract_offsets = %s
            WHERE batch_id = %s AND attempt = %s AND state = 'open' RETURNING attempt""",
        (dumps_totals(totals), sum(t.rows for t in totals.values()), sum(t.checksum for t in totals.values()),
         json.dumps({str(p): list(r) for p, r in sorted(offsets.items())}) if offsets is not None else None,
         batch_id, attempt),
    )
    if cur.fetchone() is None:
        status = attempt_status(cur, batch_id, attempt)
        raise LookupError(f"batch {batch_id} attempt {attempt} is {status.state or 'not in the ledger'}, not open: "
                          f"its extract cannot be recorded ({status.message or 'no message'})")


def extract_totals(cur, batch_id: str, attempt: int) -> dict[int, PartitionTotals]:
    cur.execute("SELECT extract_totals FROM tidemark_control.batch_attempts WHERE batch_id = %s AND attempt = %s",
                (batch_id, attempt))
    row = cur.fetchone()
    if row is None or row[0] is None:
        raise LookupError(f"batch {batch_id} attempt {attempt}: no extract totals in the ledger (the extract did "
                          "not finish)")
    return loads_totals(row[0])


def extract_offsets(cur, batch_id: str, attempt: int) -> dict[int, tuple[int, int]] | None:
    """The Kafka offsets the attempt's extract wrote, [first, next) per partition (None: an extract
    of an earlier version did not record them)."""
    cur.execute("SELECT extract_offsets FROM tidemark_control.batch_attempts WHERE batch_id = %s AND attempt = %s",
                (batch_id, attempt))
    row = cur.fetchone()
    if row is None or row[0] is None:
        return None
    return {int(p): (int(first), int(nxt)) for p, (first, nxt) in row[0].items()}


def seal_attempt(cur, batch_id: str, attempt: int, totals: dict[int, PartitionTotals]) -> None:
    """The attempt's extract is complete: sealed, with the totals END will carry. Sealing again
    (a retried END step) only rewrites the same totals."""
    cur.execute(
        """UPDATE tidemark_control.batch_attempts SET extract_totals = %s, rows = %s, checksum = %s
            WHERE batch_id = %s AND attempt = %s AND state IN ('open', 'sealed')""",
        (dumps_totals(totals), sum(t.rows for t in totals.values()), sum(t.checksum for t in totals.values()),
         batch_id, attempt),
    )
    transition(cur, batch_id, attempt, "sealed")


def lock_batch(cur, batch_id: str) -> None:
    """Lock a batch's row, then read its attempts: the one lock order of the orchestrator and the
    sink, so an abort and an apply never deadlock and the state read under it is the one that counts."""
    cur.execute("SELECT 1 FROM tidemark_control.batches WHERE batch_id = %s FOR UPDATE", (batch_id,))


def abort_unfinished(cur, batch_id: str, reason: str) -> int | None:
    """Mark the batch's latest attempt aborted if it is still open or sealed; returns it.

    The sink discards records of attempts that are not open or sealed, so once this commits
    nothing of the attempt can be applied, whether or not an ABORT message ever reaches it.
    """
    lock_batch(cur, batch_id)
    cur.execute("SELECT attempt FROM tidemark_control.batches WHERE batch_id = %s", (batch_id,))
    row = cur.fetchone()
    if row is None or not transition(cur, batch_id, row[0], "aborted", message=reason):
        return None
    cur.execute("UPDATE tidemark_control.batches SET message = %s WHERE batch_id = %s AND attempt = %s",
                (f"attempt {row[0]} aborted: {reason}", batch_id, row[0]))
    return row[0]


@dataclass(frozen=True)
class AttemptStatus:
    state: str | None  # None: the ledger has no such attempt
    rows: int | None
    message: str | None
    ends_received: int
    partitions: int | None


def attempt_status(cur, batch_id: str, attempt: int) -> AttemptStatus:
    cur.execute(
        """SELECT a.state, a.rows, a.message, b.partitions,
                  (SELECT count(*) FROM tidemark_control.batch_ends e
                    WHERE e.batch_id = a.batch_id AND e.attempt = a.attempt)
             FROM tidemark_control.batch_attempts a JOIN tidemark_control.batches b USING (batch_id)
            WHERE a.batch_id = %s AND a.attempt = %s""",
        (batch_id, attempt),
    )
    row = cur.fetchone()
    if row is None:
        return AttemptStatus(None, None, None, 0, None)
    state, rows, message, partitions, received = row
    return AttemptStatus(state, rows, message, received, partitions)


def batch_summary(cur, batch_id: str) -> dict[str, Any]:
    cur.execute(
        """SELECT b.pipeline, b.state, b.committed_attempt, b.rows, b.checksum::text, b.window_lo, b.window_hi,
                  b.backfill, w.bound, b.transport
             FROM tidemark_control.batches b
             LEFT JOIN tidemark_control.watermarks w ON w.pipeline = b.pipeline
            WHERE b.batch_id = %s""",
        (batch_id,),
    )
    row = cur.fetchone()
    if row is None:
        raise LookupError(f"batch {batch_id} is not in the ledger")
    pipeline, state, attempt, rows, checksum, lo, hi, backfill, bound, transport = row
    return {
        "pipeline": pipeline, "batch_id": batch_id, "state": state, "attempt": attempt, "rows": rows,
        "checksum": checksum, "window": str(Window(Bound.from_json(lo), Bound.from_json(hi), backfill)),
        "watermark": str(Bound.from_json(bound)) if bound else None, "transport": transport,
    }


def finished_attempts(cur, pipeline: str) -> list[tuple[str, int, str]]:
    """(batch_id, attempt, state) of the pipeline's attempts that can no longer be applied."""
    cur.execute(
        """SELECT a.batch_id, a.attempt, a.state FROM tidemark_control.batch_attempts a
             JOIN tidemark_control.batches b USING (batch_id)
            WHERE b.pipeline = %s AND a.state NOT IN ('open', 'sealed')""",
        (pipeline,),
    )
    return cur.fetchall()


def attempt_state(cur, batch_id: str, attempt: int, *, lock: bool = False) -> str | None:
    """The attempt's state (None: no such attempt). ``lock``: batch row, then attempt row, locked."""
    if lock:
        lock_batch(cur, batch_id)
    cur.execute("SELECT state FROM tidemark_control.batch_attempts WHERE batch_id = %s AND attempt = %s"
                + (" FOR UPDATE" if lock else ""), (batch_id, attempt))
    row = cur.fetchone()
    return row[0] if row else None


def attempt_finished_at(cur, batch_id: str, attempt: int):
    cur.execute("SELECT finished_at FROM tidemark_control.batch_attempts WHERE batch_id = %s AND attempt = %s",
                (batch_id, attempt))
    row = cur.fetchone()
    return row[0] if row else None

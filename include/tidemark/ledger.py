"""The batch ledger and watermarks in the warehouse's control schema (DB-API cursors, psycopg2).

The orchestration side writes here (plan, attempts, extract totals); the sink writes the outcome
(committed, refused, superseded) in the same transaction as the data it applies.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidemark.avro import Format, SourceColumn, columns_from_json, drift
from tidemark.avro import schema as avro_schema
from tidemark.control import PartitionTotals, dumps_totals, loads_totals
from tidemark.spec import PipelineSpec, quote
from tidemark.window import Bound, PlanError, Window

CONTROL_SCHEMA_LOCK = 7_411_000  # advisory lock: concurrent first runs create the schema once


def ensure_control_schema(cur) -> None:
    """Create or upgrade the control schema, only when it is not at this code's version.

    The script's ``ALTER TABLE ... ADD COLUMN IF NOT EXISTS`` takes an ACCESS EXCLUSIVE lock even
    when the column exists: run at every plan and sink start, it deadlocked with a sink committing.
    The schema's comment records the script's hash; when it matches, nothing is locked."""
    script = (Path(__file__).parent / "sql" / "control_schema.sql").read_text()
    version = f"tidemark control schema {hashlib.sha256(script.encode()).hexdigest()[:16]}"
    current = "SELECT obj_description(to_regnamespace('tidemark_control'), 'pg_namespace')"
    cur.execute(current)
    if cur.fetchone()[0] == version:
        return
    cur.execute("SELECT pg_advisory_xact_lock(%s)", (CONTROL_SCHEMA_LOCK,))
    cur.execute(current)  # another process may have upgraded it while this one waited
    if cur.fetchone()[0] == version:
        return
    cur.execute(script)
    cur.execute("COMMENT ON SCHEMA tidemark_control IS %s", (version,))


def batch_id_for(pipeline: str, run_id: str) -> str:
    """One batch per pipeline and DAG run: re-running the run re-uses its window."""
    return f"{pipeline}:{run_id}"


def committed_watermark(cur, pipeline: str, *, lock: bool = False) -> Bound | None:
    cur.execute("SELECT bound FROM tidemark_control.watermarks WHERE pipeline = %s"
                + (" FOR UPDATE" if lock else ""), (pipeline,))
    row = cur.fetchone()
    return Bound.from_json(row[0]) if row else None


@dataclass(frozen=True)
class PlannedBatch:
    batch_id: str
    window: Window
    reused: bool  # the run was planned before (a retry or a cleared run): same window
    schema_version: int | None = None  # protocol version 2's record schema (None: version 1, JSON)


def record_plan(cur, spec: PipelineSpec, batch_id: str, run_id: str, window: Window,
                schema_version: int | None = None) -> PlannedBatch:
    """Store the batch's window and record schema, or return those an earlier try of the same run
    stored."""
    cur.execute(
        """INSERT INTO tidemark_control.batches
               (batch_id, pipeline, run_id, window_lo, window_hi, backfill, partitions, state, schema_version)
           VALUES (%s, %s, %s, %s, %s, %s, %s, 'planned', %s)
           ON CONFLICT (batch_id) DO NOTHING""",
        (batch_id, spec.name, run_id, json.dumps(window.lo.to_json()), json.dumps(window.hi.to_json()),
         window.backfill, spec.partitions, schema_version),
    )
    if cur.rowcount == 1:
        return PlannedBatch(batch_id, window, reused=False, schema_version=schema_version)
    cur.execute(
        "SELECT window_lo, window_hi, backfill, schema_version FROM tidemark_control.batches WHERE batch_id = %s",
        (batch_id,)
    )
    lo, hi, backfill, version = cur.fetchone()
    return PlannedBatch(batch_id, Window(Bound.from_json(lo), Bound.from_json(hi), backfill), reused=True,
                        schema_version=version)


def register_schema(cur, pipeline: str, columns: list[SourceColumn], required: set[str]) -> tuple[int, str]:
    """The pipeline's record schema version for these source columns, and its Avro writer schema:
    the latest if the columns are the same, a new one if they only grew (``avro.drift``), else
    ``avro.SchemaError`` with both schemas."""
    cur.execute("SELECT pg_advisory_xact_lock(hashtext('tidemark.record_schemas'), hashtext(%s))", (pipeline,))
    cur.execute("SELECT version, columns, writer_schema FROM tidemark_control.record_schemas WHERE pipeline = %s "
                "ORDER BY version DESC LIMIT 1", (pipeline,))
    row = cur.fetchone()
    if row is not None and columns_from_json(row[1]) == columns:
        return row[0], row[2]
    if row is not None:
        drift(columns_from_json(row[1]), columns)
    version, writer = (row[0] + 1 if row else 1), avro_schema(columns, required)
    cur.execute("INSERT INTO tidemark_control.record_schemas (pipeline, version, columns, writer_schema) "
                "VALUES (%s, %s, %s, %s)", (pipeline, version, json.dumps([c.to_json() for c in columns]), writer))
    return version, writer


def record_schema(cur, pipeline: str, version: int) -> tuple[list[SourceColumn], str]:
    """A registered schema version's source columns and Avro writer schema."""
    cur.execute("SELECT columns, writer_schema FROM tidemark_control.record_schemas WHERE pipeline = %s "
                "AND version = %s", (pipeline, version))
    row = cur.fetchone()
    if row is None:
        raise LookupError(f"pipeline {pipeline}: no record schema version {version} in tidemark_control.record_schemas")
    return columns_from_json(row[0]), row[1]


def record_repair_plan(cur, spec: PipelineSpec, batch_id: str, window: Window, keys: list[list[str]],
                       repair_of: str | None, repair_run: str, deletes: dict[str, Any] | None = None) -> PlannedBatch:
    """Store a repair batch: ``keys`` (text forms of the key columns) re-loaded from the source
    within ``window`` (a backfill window: the watermark never moves). ``deletes`` (``repair.deletes``):
    which of them its apply may delete where nothing is staged for them (None: every one)."""
    if not window.backfill:
        raise ValueError("a repair batch's window is a backfill window: it must never move the watermark")
    cur.execute(
        """INSERT INTO tidemark_control.batches
               (batch_id, pipeline, run_id, window_lo, window_hi, backfill, partitions, state, repair_keys, repair_of,
                repair_run, repair_deletes)
           VALUES (%s, %s, NULL, %s, %s, true, %s, 'planned', %s, %s, %s, %s)""",
        (batch_id, spec.name, json.dumps(window.lo.to_json()), json.dumps(window.hi.to_json()), spec.partitions,
         json.dumps(keys), repair_of, repair_run, json.dumps(deletes) if deletes is not None else None),
    )
    return PlannedBatch(batch_id, window, reused=False)


@dataclass(frozen=True)
class Repair:
    batch_id: str
    pipeline: str
    state: str
    window: Window
    keys: list[list[str]]
    repair_of: str | None  # the repaired batch; None: the whole table
    repair_run: str  # the reconciliation run that found the keys
    deletes: dict[str, Any] | None = None  # what its apply may delete (``repair.deletes``); None: every key


def repair(cur, batch_id: str) -> Repair | None:
    """The repair batch ``batch_id`` (None: no such batch, or not a repair)."""
    cur.execute("SELECT pipeline, state, window_lo, window_hi, repair_keys, repair_of, repair_run::text, "
                "repair_deletes FROM tidemark_control.batches WHERE batch_id = %s AND repair_keys IS NOT NULL",
                (batch_id,))
    row = cur.fetchone()
    if row is None:
        return None
    pipeline, state, lo, hi, keys, repair_of, run, deletes = row
    return Repair(batch_id, pipeline, state, Window(Bound.from_json(lo), Bound.from_json(hi), True), keys, repair_of,
                  run, deletes)


def repair_deletes(cur, batch_id: str) -> dict[str, Any] | None:
    """What a repair batch's apply may delete where nothing is staged for a key:
    ``{"apply_source_deletes": bool, "extra": [[key text]], "deleted_at_source": [[key text]]}``
    (None: planned before deletions were told apart, every repair key)."""
    cur.execute("SELECT repair_deletes FROM tidemark_control.batches WHERE batch_id = %s", (batch_id,))
    row = cur.fetchone()
    return row[0] if row else None


@dataclass(frozen=True)
class RepairDeletion:
    kind: str  # "deleted_at_source", "extra" or "unclassified" (a plan recorded before kinds were kept)
    key: list[str]  # the key columns' text
    old_values: dict[str, Any]  # the target row before the repair deleted it


def repair_deletions(cur, batch_id: str) -> list[RepairDeletion]:
    """The target rows the repair batch ``batch_id`` deleted without a staged replacement, with
    their old values (tidemark_control.repair_deletions: the sink writes them with the delete)."""
    cur.execute("SELECT kind, key, old_values FROM tidemark_control.repair_deletions WHERE batch_id = %s ORDER BY id",
                (batch_id,))
    return [RepairDeletion(kind, key, old) for kind, key, old in cur.fetchall()]


class AlreadyCommitted(RuntimeError):
    """The batch is committed: nothing may reopen it (a cleared run, a replay)."""


# --- turns: one run of a pipeline at a time from plan to commit ---------------------------------
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


# --- the one state machine ---------------------------------------------------------------------
#   batches:        planned -> open -> sealed -> committed | refused | aborted   (a new attempt: -> open)
#   batch_attempts: open -> sealed -> committed | refused | aborted | superseded
# Nothing leaves committed, refused, aborted or superseded. Every state change goes through
# ``open_attempt`` (a new attempt) or ``transition`` (everything else), each guarded in SQL.
FINAL = ("committed", "refused", "aborted", "superseded")
MOVES = {  # target state -> the attempt states it may come from
    "sealed": ("open",),
    "committed": ("open", "sealed"),
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
                  b.backfill, w.bound
             FROM tidemark_control.batches b
             LEFT JOIN tidemark_control.watermarks w ON w.pipeline = b.pipeline
            WHERE b.batch_id = %s""",
        (batch_id,),
    )
    row = cur.fetchone()
    if row is None:
        raise LookupError(f"batch {batch_id} is not in the ledger")
    pipeline, state, attempt, rows, checksum, lo, hi, backfill, bound = row
    return {
        "pipeline": pipeline, "batch_id": batch_id, "state": state, "attempt": attempt, "rows": rows,
        "checksum": checksum, "window": str(Window(Bound.from_json(lo), Bound.from_json(hi), backfill)),
        "watermark": str(Bound.from_json(bound)) if bound else None,
    }


# --- the sink's side: fences, offsets, ENDs, staged totals, rejects, the watermark ---------------

def consumer_for(pipeline: str) -> str:
    """The sink's identity in this warehouse database: its fence, offsets and rejects are keyed by it."""
    return f"batch-sink.{pipeline}"


class LeaseHeld(RuntimeError):
    """A live instance of the pipeline's sink holds the lease: this one must not start."""


def acquire_fence(cur, pipeline: str, holder: str, lease: Any = None) -> int:
    """Take the next fencing token of the pipeline's sink; any older holder fails on its next commit.

    With ``lease`` (a duration), refuse with ``LeaseHeld`` while the current token's instance still
    beats (a heartbeat younger than ``lease`` and not ended): a second copy never steals from a live one."""
    cur.execute(
        """INSERT INTO tidemark_control.sink_fences AS f (consumer, fence, holder) VALUES (%(c)s, 1, %(holder)s)
           ON CONFLICT (consumer) DO UPDATE
              SET fence = f.fence + 1, holder = EXCLUDED.holder, acquired_at = clock_timestamp()
            WHERE %(lease)s::interval IS NULL OR NOT EXISTS (
                  SELECT 1 FROM tidemark_control.stream_heartbeats h
                   WHERE h.pipeline = %(p)s AND h.fence = f.fence AND h.ended_at IS NULL
                     AND h.heartbeat_at > clock_timestamp() - %(lease)s::interval)
           RETURNING fence""",
        {"c": consumer_for(pipeline), "holder": holder, "p": pipeline, "lease": lease},
    )
    row = cur.fetchone()
    if row is None:
        live = heartbeat(cur, pipeline) or {}
        raise LeaseHeld(
            f"pipeline {pipeline}: the sink's lease is held by {live.get('holder')} (fence {live.get('fence')}, "
            f"last heartbeat {live.get('heartbeat_at')}); a second copy does not start. Next: stop that instance "
            "(desired state 'stopped'), or wait for its lease to expire if it is dead")
    return row[0]


def end_lease(cur, pipeline: str, fence: int) -> bool:
    """The instance holding ``fence`` has ended (it stopped, or the supervisor saw its process gone):
    its lease is free at once instead of after its expiry."""
    cur.execute("""UPDATE tidemark_control.stream_heartbeats SET ended_at = clock_timestamp()
                    WHERE pipeline = %s AND fence = %s AND ended_at IS NULL""", (pipeline, fence))
    return cur.rowcount == 1


def current_fence(cur, consumer: str) -> int | None:
    """The latest token, locked until the transaction ends (so no takeover lands mid-commit)."""
    cur.execute("SELECT fence FROM tidemark_control.sink_fences WHERE consumer = %s FOR UPDATE", (consumer,))
    row = cur.fetchone()
    return row[0] if row else None


def stored_offsets(cur, consumer: str, topic: str) -> dict[int, int]:
    cur.execute("SELECT partition, next_offset FROM tidemark_control.sink_offsets WHERE consumer = %s AND topic = %s",
                (consumer, topic))
    return dict(cur.fetchall())


def store_offset(cur, consumer: str, topic: str, partition: int, next_offset: int, fence: int | None) -> None:
    cur.execute(
        """INSERT INTO tidemark_control.sink_offsets (consumer, topic, partition, next_offset, fence)
           VALUES (%s, %s, %s, %s, %s)
           ON CONFLICT (consumer, topic, partition) DO UPDATE
              SET next_offset = EXCLUDED.next_offset, fence = EXCLUDED.fence, updated_at = clock_timestamp()""",
        (consumer, topic, partition, next_offset, fence),
    )


def finished_attempts(cur, pipeline: str) -> list[tuple[str, int, str]]:
    """(batch_id, attempt, state) of the pipeline's attempts that can no longer be applied."""
    cur.execute(
        """SELECT a.batch_id, a.attempt, a.state FROM tidemark_control.batch_attempts a
             JOIN tidemark_control.batches b USING (batch_id)
            WHERE b.pipeline = %s AND a.state NOT IN ('open', 'sealed')""",
        (pipeline,),
    )
    return cur.fetchall()


@dataclass(frozen=True)
class LedgerBatch:
    pipeline: str
    window: Window
    latest_attempt: int
    repair_keys: list[list[str]] | None = None  # a repair batch: only these keys (text forms) are re-loaded
    schema_version: int | None = None  # protocol version 2's record schema (None: version 1, JSON)


def planned_batch(cur, batch_id: str) -> LedgerBatch | None:
    """What the orchestrator planned for a batch (None: never planned)."""
    cur.execute("SELECT pipeline, window_lo, window_hi, backfill, attempt, repair_keys, schema_version "
                "FROM tidemark_control.batches WHERE batch_id = %s", (batch_id,))
    row = cur.fetchone()
    if row is None:
        return None
    pipeline, lo, hi, backfill, latest, keys, version = row
    return LedgerBatch(pipeline, Window(Bound.from_json(lo), Bound.from_json(hi), backfill), latest, keys, version)


def open_windows(cur, pipeline: str) -> dict[tuple[str, int], Window]:
    """The planned window of each open or sealed attempt of the pipeline, by (batch id, attempt)."""
    cur.execute(
        """SELECT a.batch_id, a.attempt, b.window_lo, b.window_hi, b.backfill FROM tidemark_control.batch_attempts a
             JOIN tidemark_control.batches b USING (batch_id)
            WHERE b.pipeline = %s AND a.state IN ('open', 'sealed')""",
        (pipeline,),
    )
    return {(b, a): Window(Bound.from_json(lo), Bound.from_json(hi), bf) for b, a, lo, hi, bf in cur.fetchall()}


def open_formats(cur, pipeline: str) -> dict[tuple[str, int], Format]:
    """The record format of each open or sealed protocol-version-2 attempt, by (batch id, attempt)."""
    cur.execute(
        """SELECT a.batch_id, a.attempt, b.window_lo, b.window_hi, b.backfill, s.version, s.columns, s.writer_schema
             FROM tidemark_control.batch_attempts a
             JOIN tidemark_control.batches b USING (batch_id)
             JOIN tidemark_control.record_schemas s ON s.pipeline = b.pipeline AND s.version = b.schema_version
            WHERE b.pipeline = %s AND a.state IN ('open', 'sealed')""",
        (pipeline,),
    )
    return {(b, a): Format(v, columns_from_json(cols), writer, Window(Bound.from_json(lo), Bound.from_json(hi), bf))
            for b, a, lo, hi, bf, v, cols, writer in cur.fetchall()}


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


def add_staged(cur, batch_id: str, attempt: int, partition: int, rows: int, checksum: int) -> None:
    cur.execute(
        """INSERT INTO tidemark_control.staged_totals (batch_id, attempt, partition, rows, checksum)
           VALUES (%s, %s, %s, %s, %s)
           ON CONFLICT (batch_id, attempt, partition) DO UPDATE
              SET rows = staged_totals.rows + EXCLUDED.rows, checksum = staged_totals.checksum + EXCLUDED.checksum""",
        (batch_id, attempt, partition, rows, checksum),
    )


def staged(cur, batch_id: str, attempt: int) -> dict[int, tuple[int, int]]:
    cur.execute("SELECT partition, rows, checksum FROM tidemark_control.staged_totals WHERE batch_id = %s "
                "AND attempt = %s", (batch_id, attempt))
    return {p: (rows, int(checksum)) for p, rows, checksum in cur.fetchall()}


def forget_staged(cur, batch_id: str, attempt: int) -> None:
    cur.execute("DELETE FROM tidemark_control.staged_totals WHERE batch_id = %s AND attempt = %s", (batch_id, attempt))
    cur.execute("DELETE FROM tidemark_control.staged_loads WHERE batch_id = %s AND attempt = %s", (batch_id, attempt))


def add_loads(cur, batch_id: str, attempt: int, loads: list[int]) -> None:
    """Accept loads the executors staged (``tidemark.stage``): only their rows are applied."""
    cur.execute("INSERT INTO tidemark_control.staged_loads (batch_id, attempt, load) "
                "SELECT %s, %s, unnest(%s::bigint[])", (batch_id, attempt, loads))


def record_end(cur, batch_id: str, attempt: int, partition: int, totals: PartitionTotals, batch_rows: int | None,
               kafka_offset: int) -> tuple[int, int] | None:
    """Store an END's totals; if this partition's END was stored before, return its (rows, checksum)."""
    cur.execute(
        """INSERT INTO tidemark_control.batch_ends
               (batch_id, attempt, partition, rows, checksum, kafka_offset, batch_rows)
           VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING""",
        (batch_id, attempt, partition, totals.rows, totals.checksum, kafka_offset, batch_rows),
    )
    if cur.rowcount == 1:
        return None
    cur.execute("SELECT rows, checksum FROM tidemark_control.batch_ends WHERE batch_id = %s AND attempt = %s "
                "AND partition = %s", (batch_id, attempt, partition))
    rows, checksum = cur.fetchone()
    return rows, int(checksum)


def ends(cur, batch_id: str, attempt: int) -> tuple[dict[int, tuple[int, int]], set[int]]:
    """The ENDs received: (rows, checksum) per partition, and the batch_rows they claim."""
    cur.execute("SELECT partition, rows, checksum, batch_rows FROM tidemark_control.batch_ends "
                "WHERE batch_id = %s AND attempt = %s", (batch_id, attempt))
    found = cur.fetchall()
    return {p: (rows, int(checksum)) for p, rows, checksum, _ in found}, {b for *_, b in found if b is not None}


def micro_batch_committed(cur, consumer: str, fence: int, micro_batch: int) -> bool:
    cur.execute("SELECT 1 FROM tidemark_control.sink_micro_batches WHERE consumer = %s AND fence = %s "
                "AND micro_batch = %s", (consumer, fence, micro_batch))
    return cur.fetchone() is not None


MICRO_BATCHES_KEPT = 1000  # Spark replays only its last micro-batch; a few more rows show recent history


def record_micro_batch(cur, consumer: str, fence: int, micro_batch: int, records: int, events: int,
                       duplicates: int, rejected: int) -> None:
    cur.execute(
        """INSERT INTO tidemark_control.sink_micro_batches
               (consumer, fence, micro_batch, records, events, duplicates, rejected)
           VALUES (%s, %s, %s, %s, %s, %s, %s)""", (consumer, fence, micro_batch, records, events, duplicates, rejected))
    cur.execute("DELETE FROM tidemark_control.sink_micro_batches WHERE consumer = %s AND (fence < %s OR "
                "(fence = %s AND micro_batch < %s))", (consumer, fence, fence, micro_batch - MICRO_BATCHES_KEPT))


def record_rejects(cur, consumer: str, topic: str, rejects: list[dict[str, Any]]) -> None:
    """Rejects of the consumer's micro-batch (each on its own ``topic`` if it names one, else
    ``topic``), pending for the dead-letter topic with their original bytes (``raw``, ``raw_key``).
    Set-based: a flood of bad records costs one statement per thousand, not one per record."""
    from psycopg2.extras import execute_values

    execute_values(
        cur,
        """INSERT INTO tidemark_control.sink_rejects (consumer, topic, partition, kafka_offset, batch_id, attempt,
                                                      reason, payload, control, raw, raw_key, in_dlq) VALUES %s""",
        [(consumer, r.get("topic") or topic, r["partition"], r["offset"], r["batch_id"], r["attempt"], r["reason"],
          r["payload"], r.get("control"), _bytes(r.get("raw")), _bytes(r.get("raw_key")), False) for r in rejects],
        page_size=1000,
    )


def _bytes(value: Any) -> bytes | None:
    import psycopg2

    if value is None:
        return None
    return psycopg2.Binary(value.encode() if isinstance(value, str) else bytes(value))


def pending_rejects(cur, consumer: str, *, limit: int) -> list[dict[str, Any]]:
    """The consumer's oldest ``limit`` rejects not yet in the dead-letter topic."""
    cur.execute(
        """SELECT id, topic, partition, kafka_offset, batch_id, attempt, reason, raw, raw_key, rejected_at
             FROM tidemark_control.sink_rejects WHERE consumer = %s AND NOT in_dlq ORDER BY id LIMIT %s""",
        (consumer, limit))
    names = ("id", "topic", "partition", "kafka_offset", "batch_id", "attempt", "reason", "raw", "raw_key", "rejected_at")
    return [{**dict(zip(names, row)), "raw": _plain(row[7]), "raw_key": _plain(row[8])} for row in cur.fetchall()]


def _plain(value: Any) -> bytes | None:
    return bytes(value) if value is not None else None


def mark_published(cur, offsets: dict[int, int]) -> None:
    """Rejects now in the dead-letter topic, at these offsets: their bytes are there, not kept here."""
    from psycopg2.extras import execute_values

    execute_values(
        cur,
        """UPDATE tidemark_control.sink_rejects s SET in_dlq = true, dlq_offset = v.dlq_offset, raw = NULL,
                  raw_key = NULL
             FROM (VALUES %s) AS v(id, dlq_offset) WHERE s.id = v.id""",
        sorted(offsets.items()), template="(%s::bigint, %s::bigint)", page_size=1000,
    )


def pending_reject_summary(cur, consumer: str) -> tuple[int, Any]:
    """How many of the consumer's rejects are not yet in the dead-letter topic, and when the oldest
    of them was recorded (None: none)."""
    cur.execute("SELECT count(*), min(rejected_at) FROM tidemark_control.sink_rejects "
                "WHERE consumer = %s AND NOT in_dlq", (consumer,))
    count, oldest = cur.fetchone()
    return count, oldest


def data_rejects(cur, consumer: str, batch_id: str, attempt: int, first: int,
                 written: dict[int, tuple[int, int]] | None = None) -> tuple[int, list[str]]:
    """How many data records of the attempt were rejected, and the first reasons (offset order).
    ``written``: the offsets the extract wrote ([first, next) per partition); a rejected record
    outside them was not the extract's (a dead letter still, but no reason to refuse the batch)."""
    inside = " OR ".join(f"(partition = {int(p)} AND kafka_offset >= {int(lo)} AND kafka_offset < {int(hi)})"
                         for p, (lo, hi) in written.items()) or "false" if written is not None else "true"
    cur.execute(
        f"""SELECT count(*), (array_agg(reason ORDER BY partition, kafka_offset))[1:%s]
             FROM tidemark_control.sink_rejects
            WHERE consumer = %s AND batch_id = %s AND attempt = %s AND control IS NULL AND ({inside})""",
        (first, consumer, batch_id, attempt),
    )
    count, reasons = cur.fetchone()
    return count, reasons or []


def advance_watermark(cur, pipeline: str, batch_id: str, window: Window) -> bool:
    """Move the pipeline's watermark to a committed window's end: never for a backfill, never
    backwards (the window is the ledger's planned one, never a message's). Within one cursor value
    (windows capped at a key) it moves only along the chain: from the bound the window started at."""
    if window.backfill:
        return False
    hi = window.hi
    current = committed_watermark(cur, pipeline, lock=True)  # the row stays locked until the commit
    if current is not None:
        if current.kind != hi.kind or hi.cursor < current.cursor:
            return False
        if hi.cursor == current.cursor and (current.pk is None or (hi.pk is not None and window.lo != current)):
            return False
    values = (json.dumps(hi.to_json()), hi.cursor if hi.kind == "timestamp" else None,
              hi.cursor if hi.kind == "id" else None, batch_id, pipeline)
    if current is None:
        cur.execute(
            """INSERT INTO tidemark_control.watermarks (bound, cursor_ts, cursor_id, batch_id, pipeline)
               VALUES (%s, %s, %s, %s, %s) ON CONFLICT (pipeline) DO NOTHING""", values)
    else:
        cur.execute(
            """UPDATE tidemark_control.watermarks SET bound = %s, cursor_ts = %s, cursor_id = %s, batch_id = %s,
                      updated_at = clock_timestamp() WHERE pipeline = %s""", values)
    return cur.rowcount == 1


def forget_pipeline(cur, pipeline: str) -> None:
    """Remove everything the ledger holds for a pipeline (its batches by their ``<pipeline>:`` ids,
    record schemas, watermark, id observations, stream state) and its sink's offsets, fences and rejects: for a demo
    that starts afresh, never for a production pipeline (the ledger is its audit trail)."""
    prefix = f"{pipeline}:"
    for table in ("batch_ends", "staged_totals", "staged_loads", "batch_attempts", "batches"):
        cur.execute(f"DELETE FROM tidemark_control.{table} WHERE starts_with(batch_id, %s)", (prefix,))
    cur.execute("DELETE FROM tidemark_control.record_schemas WHERE pipeline = %s", (pipeline,))
    cur.execute("DELETE FROM tidemark_control.watermarks WHERE pipeline = %s", (pipeline,))
    cur.execute("DELETE FROM tidemark_control.id_observations WHERE pipeline = %s", (pipeline,))
    for table in ("streams", "stream_events", "stream_heartbeats"):
        cur.execute(f"DELETE FROM tidemark_control.{table} WHERE pipeline = %s", (pipeline,))
    for table in ("sink_offsets", "sink_fences", "sink_rejects", "sink_micro_batches", "stream_event_times"):
        cur.execute(f"DELETE FROM tidemark_control.{table} WHERE consumer = %s", (consumer_for(pipeline),))


# --- streams: desired state, the supervisor's events, heartbeats ------------------------------

STREAM_STATES = ("running", "paused", "stopped")


@dataclass(frozen=True)
class StreamState:
    desired: str
    changed_by: str | None  # None: never set, the default
    changed_at: Any
    reason: str | None
    crash_looping_since: Any


def stream_state(cur, pipeline: str) -> StreamState:
    cur.execute("""SELECT desired, changed_by, changed_at, reason, crash_looping_since
                     FROM tidemark_control.streams WHERE pipeline = %s""", (pipeline,))
    row = cur.fetchone()
    return StreamState(*row) if row else StreamState("running", None, None, None, None)


def set_desired(cur, pipeline: str, desired: str, actor: str, reason: str | None = None) -> str:
    """Record what a person wants of the pipeline's stream (and who, when, why); returns the state before."""
    if desired not in STREAM_STATES:
        raise ValueError(f"desired state is one of {STREAM_STATES}, got {desired!r}")
    before = stream_state(cur, pipeline).desired
    cur.execute(
        """INSERT INTO tidemark_control.streams (pipeline, desired, changed_by, reason) VALUES (%s, %s, %s, %s)
           ON CONFLICT (pipeline) DO UPDATE SET desired = EXCLUDED.desired, changed_by = EXCLUDED.changed_by,
               reason = EXCLUDED.reason, changed_at = clock_timestamp()""",
        (pipeline, desired, actor, reason))
    record_stream_event(cur, pipeline, "desired", actor, f"{before} -> {desired}" + (f": {reason}" if reason else ""))
    return before


def observe_stream(cur, pipeline: str, lag: int | None) -> int | None:
    """Keep the supervisor's look at the lag; returns the previous one (is the lag growing?)."""
    cur.execute(
        """INSERT INTO tidemark_control.streams AS s (pipeline, changed_by, observed_lag, observed_at)
           VALUES (%s, 'supervisor', %s, clock_timestamp())
           ON CONFLICT (pipeline) DO UPDATE SET observed_lag = EXCLUDED.observed_lag, observed_at = EXCLUDED.observed_at
           RETURNING (SELECT observed_lag FROM tidemark_control.streams WHERE pipeline = s.pipeline)""",
        (pipeline, lag))
    return cur.fetchone()[0]


def record_stream_event(cur, pipeline: str, kind: str, actor: str, detail: str | None = None) -> None:
    cur.execute("INSERT INTO tidemark_control.stream_events (pipeline, kind, actor, detail) VALUES (%s, %s, %s, %s)",
                (pipeline, kind, actor, detail))


def restarts_since(cur, pipeline: str, window: Any) -> list[Any]:
    """When the supervisor restarted the stream within ``window`` (a duration) of now and since a
    person last cleared a crash loop (the budget starts afresh then), oldest first."""
    cur.execute("""SELECT at FROM tidemark_control.stream_events
                    WHERE pipeline = %(p)s AND kind = 'restart' AND at >= clock_timestamp() - %(w)s
                      AND at > coalesce((SELECT max(at) FROM tidemark_control.stream_events
                                          WHERE pipeline = %(p)s AND kind = 'cleared'), '-infinity')
                    ORDER BY at""",
                {"p": pipeline, "w": window})
    return [r[0] for r in cur.fetchall()]


def mark_crash_looping(cur, pipeline: str, detail: str) -> None:
    cur.execute(
        """INSERT INTO tidemark_control.streams (pipeline, changed_by, crash_looping_since)
           VALUES (%s, 'supervisor', clock_timestamp())
           ON CONFLICT (pipeline) DO UPDATE
              SET crash_looping_since = coalesce(streams.crash_looping_since, EXCLUDED.crash_looping_since)""",
        (pipeline,))
    record_stream_event(cur, pipeline, "crash_loop", "supervisor", detail)


def clear_crash_loop(cur, pipeline: str, actor: str) -> bool:
    """A person's 'fixed, try again': the supervisor may restart the stream (its budget starts afresh)."""
    cur.execute("""UPDATE tidemark_control.streams SET crash_looping_since = NULL
                    WHERE pipeline = %s AND crash_looping_since IS NOT NULL""", (pipeline,))
    cleared = cur.rowcount == 1
    if cleared:
        record_stream_event(cur, pipeline, "cleared", actor, "crash loop cleared")
    return cleared


def beat(cur, pipeline: str, fence: int, holder: str, started_at: Any, *, records: int = 0,
         lag: dict[int, int] | None = None, offsets: dict[int, int] | None = None,
         batch_seconds: float | None = None) -> bool:
    """The running instance's heartbeat (and progress when ``records``), under its fencing token.
    False: the token is no longer current (another instance took over) or its lease was ended; this
    instance must stop."""
    cur.execute(
        """INSERT INTO tidemark_control.stream_heartbeats AS h (pipeline, fence, holder, started_at, heartbeat_at,
               progress_at, micro_batches, records, lag, offsets, batch_seconds)
           SELECT %(p)s, %(fence)s, %(holder)s, %(started)s, clock_timestamp(),
                  CASE WHEN %(records)s > 0 THEN clock_timestamp() END, %(batches)s, %(records)s,
                  %(lag)s, %(offsets)s, %(secs)s
             FROM tidemark_control.sink_fences f WHERE f.consumer = %(consumer)s AND f.fence = %(fence)s
           ON CONFLICT (pipeline) DO UPDATE SET
               fence = EXCLUDED.fence, holder = EXCLUDED.holder, heartbeat_at = EXCLUDED.heartbeat_at,
               ended_at = NULL,  -- only a new token gets here with an ended row (see WHERE)
               started_at = CASE WHEN h.fence = EXCLUDED.fence THEN h.started_at ELSE EXCLUDED.started_at END,
               progress_at = coalesce(EXCLUDED.progress_at, CASE WHEN h.fence = EXCLUDED.fence THEN h.progress_at END),
               micro_batches = CASE WHEN h.fence = EXCLUDED.fence THEN h.micro_batches ELSE 0 END
                               + EXCLUDED.micro_batches,
               records = CASE WHEN h.fence = EXCLUDED.fence THEN h.records ELSE 0 END + EXCLUDED.records,
               lag = coalesce(EXCLUDED.lag, h.lag), offsets = coalesce(EXCLUDED.offsets, h.offsets),
               batch_seconds = coalesce(EXCLUDED.batch_seconds, h.batch_seconds)
           WHERE h.fence < EXCLUDED.fence OR (h.fence = EXCLUDED.fence AND h.ended_at IS NULL)""",
        {"p": pipeline, "fence": fence, "holder": holder, "started": started_at, "records": records,
         "batches": 1 if batch_seconds is not None else 0, "consumer": consumer_for(pipeline),
         "lag": json.dumps({str(k): v for k, v in lag.items()}) if lag is not None else None,
         "offsets": json.dumps({str(k): v for k, v in offsets.items()}) if offsets is not None else None,
         "secs": batch_seconds})
    return cur.rowcount == 1


def heartbeat(cur, pipeline: str) -> dict[str, Any] | None:
    names = ("fence", "holder", "started_at", "heartbeat_at", "progress_at", "micro_batches", "records", "lag",
             "offsets", "batch_seconds", "ended_at")
    cur.execute(f"SELECT {', '.join(names)} FROM tidemark_control.stream_heartbeats WHERE pipeline = %s", (pipeline,))
    row = cur.fetchone()
    return dict(zip(names, row)) if row else None


# --- read-only views for the status page and CLI (autocommit, read-only sessions) ----------------

CONTROL_TABLES = ("tidemark_control.batches", "tidemark_control.batch_attempts", "tidemark_control.watermarks")
ATTEMPT_COLUMNS = ("batch_id", "attempt", "state", "rows", "message", "begun_at", "finished_at")


def control_schema_exists(cur) -> bool:
    cur.execute("SELECT " + ", ".join(["to_regclass(%s) IS NOT NULL"] * len(CONTROL_TABLES)), CONTROL_TABLES)
    return all(cur.fetchone())


def stream_tables_exist(cur) -> bool:
    """A control schema from before standing sinks has none (a read-only reader never creates them)."""
    cur.execute("SELECT to_regclass('tidemark_control.streams') IS NOT NULL "
                "AND to_regclass('tidemark_control.stream_heartbeats') IS NOT NULL")
    return cur.fetchone()[0]


def last_committed(cur, pipeline: str) -> tuple[str, Window, int | None, Any, int | None, str | None] | None:
    """(batch id, window, rows, committed at, attempt, reconciliation verdict or None) of the
    pipeline's newest committed batch (a repair batch, which re-loads a few keys, is not one)."""
    cur.execute(
        """SELECT batch_id, window_lo, window_hi, backfill, rows, committed_at, committed_attempt, reconciliation
             FROM tidemark_control.batches WHERE pipeline = %s AND state = 'committed' AND repair_keys IS NULL
            ORDER BY committed_at DESC NULLS LAST LIMIT 1""",
        (pipeline,),
    )
    row = cur.fetchone()
    if row is None:
        return None
    batch_id, lo, hi, backfill, rows, committed_at, attempt, verdict = row
    return batch_id, Window(Bound.from_json(lo), Bound.from_json(hi), backfill), rows, committed_at, attempt, verdict


def watermark_row(cur, pipeline: str) -> tuple[Bound, str, Any] | None:
    """(bound, the batch that moved it, when) of the pipeline's watermark."""
    cur.execute("SELECT bound, batch_id, updated_at FROM tidemark_control.watermarks WHERE pipeline = %s",
                (pipeline,))
    row = cur.fetchone()
    return (Bound.from_json(row[0]), row[1], row[2]) if row else None


def attempts(cur, pipeline: str, states: tuple[str, ...], *, newest_first: bool = False, since: Any = None,
             limit: int = 50) -> list[tuple]:
    """The pipeline's attempts in ``states`` (rows of ATTEMPT_COLUMNS): oldest begun first, or newest
    finished first; with ``since`` (a duration) only those finished within it."""
    finished = "coalesce(a.finished_at, a.begun_at)"
    where, params = "", [pipeline, list(states)]
    if since is not None:
        where, params = f" AND {finished} >= clock_timestamp() - %s", [*params, since]
    order = f"{finished} DESC" if newest_first else "a.begun_at, a.attempt"
    cur.execute(
        f"""SELECT {", ".join("a." + c for c in ATTEMPT_COLUMNS)} FROM tidemark_control.batch_attempts a
              JOIN tidemark_control.batches b USING (batch_id)
             WHERE b.pipeline = %s AND a.state = ANY(%s){where} ORDER BY {order} LIMIT {int(limit)}""",
        params,
    )
    return cur.fetchall()


def every_attempt(cur) -> list[tuple[str, int, str, str]]:
    """(batch id, attempt, pipeline, state) of every attempt in the ledger."""
    cur.execute("""SELECT a.batch_id, a.attempt, b.pipeline, a.state FROM tidemark_control.batch_attempts a
                     JOIN tidemark_control.batches b USING (batch_id)""")
    return cur.fetchall()


# --- source side -----------------------------------------------------------------------------

def source_columns(cur, table: str) -> list[tuple[str, str, bool]]:
    """(name, SQL type, not null) of a source table, in column order."""
    cur.execute(
        """SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull
             FROM pg_attribute a
            WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped
            ORDER BY a.attnum""",
        (quote(table),),
    )
    return cur.fetchall()


def added_column_fill(cur, table: str, column: str) -> tuple[bool, str | None, str | None]:
    """How a source column added to a table with rows filled them: (whether PostgreSQL keeps one
    value for every row older than the column, that value as text, the column's default now).
    A constant default is kept once (``atthasmissing``); a volatile one, or a table rewritten
    since, wrote each row its own value."""
    cur.execute(
        """SELECT a.atthasmissing, CASE WHEN a.atthasmissing THEN (a.attmissingval::text::text[])[1] END,
                  pg_get_expr(d.adbin, d.adrelid)
             FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
            WHERE a.attrelid = %s::regclass AND a.attname = %s""",
        (quote(table), column),
    )
    row = cur.fetchone()
    return (bool(row[0]), row[1], row[2]) if row else (False, None, None)


def loaded_rows_with_values(cur, spec: PipelineSpec, column: str, watermark: Bound) -> int:
    """Source rows the batches loaded (cursor up to the committed watermark) that hold a value in
    ``column``: values the target, which lacks the column, never received."""
    cur.execute(f"SELECT count(*) FROM {quote(spec.table)} WHERE {quote(column)} IS NOT NULL "
                f"AND {quote(spec.cursor.column)} <= %s", (watermark.cursor,))
    return cur.fetchone()[0]


def record_column_fills(cur, batch_id: str, fills: dict[str, str | None]) -> None:
    """What the target's rows loaded before get in each column this batch adds (the source's value
    for its rows older than the column, as text; None: NULL)."""
    cur.execute("UPDATE tidemark_control.batches SET column_fills = %s WHERE batch_id = %s",
                (json.dumps(fills) if fills else None, batch_id))


def column_fills(cur, batch_id: str) -> dict[str, str | None]:
    cur.execute("SELECT column_fills FROM tidemark_control.batches WHERE batch_id = %s", (batch_id,))
    row = cur.fetchone()
    return dict(row[0]) if row and row[0] else {}


def check_source_access(cur, spec: PipelineSpec) -> None:
    """The source connection's role can read the pipeline's table: if not, say which grant is missing."""
    schema = spec.table.split(".")[0] if "." in spec.table else "public"
    cur.execute("SELECT current_user, has_schema_privilege(%s, 'USAGE')", (schema,))
    user, usage = cur.fetchone()
    if not usage:
        raise PlanError(f"pipeline {spec.name}: the source role {user} may not use schema {schema}: "
                        f"GRANT USAGE ON SCHEMA {quote(schema)} TO {user}")
    cur.execute("SELECT to_regclass(%s)", (quote(spec.table),))
    if cur.fetchone()[0] is None:
        raise PlanError(f"pipeline {spec.name}: source table {spec.table} does not exist (field 'table' of its spec)")
    cur.execute("SELECT has_table_privilege(%s, 'SELECT')", (quote(spec.table),))
    if not cur.fetchone()[0]:
        raise PlanError(f"pipeline {spec.name}: the source role {user} may not read {spec.table}: "
                        f"GRANT SELECT ON {quote(spec.table)} TO {user}")


def ensure_target(source_cur, warehouse_cur, spec: PipelineSpec) -> bool:
    """Create the target table from the source table's columns if it does not exist yet (its
    schema only if the spec says ``create_target_schema: true``)."""
    warehouse_cur.execute("SELECT to_regclass(%s)", (quote(spec.target_table),))
    if warehouse_cur.fetchone()[0] is not None:
        return False
    schema = spec.target_table.split(".")[0] if "." in spec.target_table else "public"
    warehouse_cur.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,))
    if warehouse_cur.fetchone() is None and not spec.create_target_schema:
        raise PlanError(f"pipeline {spec.name}: the warehouse has no schema {schema} for target_table "
                        f"{spec.target_table}: create it, or set create_target_schema: true in the spec")
    columns = source_columns(source_cur, spec.table)
    names = {c[0] for c in columns}
    missing = [c for c in (*spec.primary_key, spec.cursor.column) if c not in names]
    if missing:
        raise LookupError(f"pipeline {spec.name}: source table {spec.table} has no column(s) {missing}")
    ddl = ",\n  ".join(
        f"{quote(name)} {sql_type}{' NOT NULL' if not_null else ''}" for name, sql_type, not_null in columns
    )
    pk = ", ".join(quote(c) for c in spec.primary_key)
    _take_ddl_turn(warehouse_cur)  # the nightly plan and the stream supervisor both create it on a first run
    if "." in spec.target_table:
        warehouse_cur.execute(f"CREATE SCHEMA IF NOT EXISTS {quote(spec.target_table.split('.')[0])}")
    warehouse_cur.execute(f"CREATE TABLE IF NOT EXISTS {quote(spec.target_table)} (\n  {ddl},\n  PRIMARY KEY ({pk}))")
    return True


def _take_ddl_turn(cur) -> None:
    """Concurrent first runs creating one schema or table: IF NOT EXISTS alone still races on the
    catalog's unique indexes (``pg_namespace_nspname_index``, seen in the demo), so they take turns
    until the transaction ends; the second then finds what the first made."""
    cur.execute("SELECT pg_advisory_xact_lock(%s)", (CONTROL_SCHEMA_LOCK,))


STREAM_COLUMNS = ("_tm_partition", "_tm_offset", "_tm_fence", "_tm_micro_batch", "_tm_applied_at")


def ensure_stream_target(cur, spec: PipelineSpec) -> bool:
    """Create the spec's real-time table (``stream.target_table``) if it does not exist: the batch
    target's columns and primary key, plus each event's source position, fencing token, micro-batch
    and time applied; and its serving views (``ensure_serving_view``). ``LookupError`` while the
    batch target does not exist (the supervisor creates it from the source first)."""
    assert spec.stream is not None
    table = spec.stream.target_table
    cur.execute("SELECT to_regclass(%s), to_regclass(%s)", (quote(table), quote(spec.target_table)))
    existing, target = cur.fetchone()
    if target is None:
        raise LookupError(f"pipeline {spec.name}: stream.target_table {table} is made like the target "
                          f"{spec.target_table}, which does not exist yet: the supervisor creates it from the source "
                          f"table {spec.table} (or run the nightly DAG tidemark_batch_{spec.name} once)")
    created = existing is None
    if created:
        _ensure_schema(cur, spec, table, "stream.target_table")
        pk = ", ".join(quote(c) for c in spec.primary_key)
        cur.execute(f"""CREATE TABLE IF NOT EXISTS {quote(table)} (
            LIKE {quote(spec.target_table)} INCLUDING DEFAULTS,
            _tm_partition integer NOT NULL, _tm_offset bigint NOT NULL, _tm_fence bigint NOT NULL,
            _tm_micro_batch bigint, _tm_applied_at timestamptz NOT NULL DEFAULT clock_timestamp(),
            PRIMARY KEY ({pk}))""")
    ensure_serving_view(cur, spec)
    return created


def _ensure_schema(cur, spec: PipelineSpec, table: str, field: str) -> None:
    schema = table.split(".")[0] if "." in table else "public"
    cur.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,))
    if cur.fetchone() is None:
        if not spec.create_target_schema:
            raise LookupError(f"pipeline {spec.name}: the warehouse has no schema {schema} for {field} {table}: "
                              "create it, or set create_target_schema: true in the spec")
        _take_ddl_turn(cur)
        cur.execute(f"CREATE SCHEMA IF NOT EXISTS {quote(schema)}")


def ensure_serving_view(cur, spec: PipelineSpec) -> None:
    """The serving view (one row per key over the batch target and the real-time table: the newest
    version by cursor, the batch's on a tie) and ``<view>_freshness`` (the batch watermark, the
    stream's event-time watermark, and the later of the two: up to when the view is complete)."""
    from tidemark.records import target_columns

    stream = spec.stream
    assert stream is not None
    view, freshness = stream.serving_view, f"{stream.serving_view}_freshness"
    cur.execute("SELECT to_regclass(%s), to_regclass(%s)", (quote(view), quote(freshness)))
    if None not in cur.fetchone():
        return
    _ensure_schema(cur, spec, view, "stream.serving_view")
    names = [c.name for c in target_columns(cur, spec.target_table)]
    batch, live, cursor = quote(spec.target_table), quote(stream.target_table), quote(spec.cursor.column)
    same_key = " AND ".join(f"b.{quote(c)} = r.{quote(c)}" for c in spec.primary_key)
    cur.execute(f"""CREATE OR REPLACE VIEW {quote(view)} AS
        SELECT {", ".join(f"b.{quote(c)}" for c in names)} FROM {batch} b
         WHERE NOT EXISTS (SELECT 1 FROM {live} r WHERE {same_key} AND r.{cursor} > b.{cursor})
        UNION ALL
        SELECT {", ".join(f"r.{quote(c)}" for c in names)} FROM {live} r
         WHERE NOT EXISTS (SELECT 1 FROM {batch} b WHERE {same_key} AND b.{cursor} >= r.{cursor})""")
    cur.execute(f"COMMENT ON VIEW {quote(view)} IS %s",
                (f"Tidemark pipeline {spec.name}: {spec.target_table} merged with {stream.target_table}, one row "
                 f"per key, newest {spec.cursor.column} wins; complete up to {freshness}.complete_up_to",))
    cur.execute(f"""CREATE OR REPLACE VIEW {quote(freshness)} AS
        SELECT w.batch_watermark, s.stream_watermark, greatest(w.batch_watermark, s.stream_watermark) AS complete_up_to
          FROM (SELECT (SELECT cursor_ts FROM tidemark_control.watermarks WHERE pipeline = %(pipeline)s)
                       AS batch_watermark) w,
               (SELECT CASE WHEN count(*) = %(partitions)s THEN min(event_time) END AS stream_watermark
                  FROM tidemark_control.stream_event_times WHERE consumer = %(consumer)s AND topic = %(topic)s) s""",
                {"pipeline": spec.name, "partitions": stream.partitions, "consumer": consumer_for(spec.name),
                 "topic": stream.topic})


def advance_event_times(cur, consumer: str, topic: str, newest: dict[int, Any]) -> None:
    """Per partition, the newest event time applied so far (never moves back)."""
    for partition, event_time in newest.items():
        cur.execute(
            """INSERT INTO tidemark_control.stream_event_times AS t (consumer, topic, partition, event_time)
               VALUES (%s, %s, %s, %s)
               ON CONFLICT (consumer, topic, partition) DO UPDATE
                  SET event_time = greatest(t.event_time, EXCLUDED.event_time), updated_at = clock_timestamp()""",
            (consumer, topic, partition, event_time))


def freshness(cur, spec: PipelineSpec) -> dict[str, Any] | None:
    """The serving view's freshness row (None: the pipeline has no stream, or its view is not made yet)."""
    if spec.stream is None:
        return None
    view = f"{spec.stream.serving_view}_freshness"
    cur.execute("SELECT to_regclass(%s)", (quote(view),))
    if cur.fetchone()[0] is None:
        return None
    cur.execute(f"SELECT batch_watermark, stream_watermark, complete_up_to FROM {quote(view)}")
    return dict(zip(("batch_watermark", "stream_watermark", "complete_up_to"), cur.fetchone()))


def observe_id_high(cur, spec: PipelineSpec) -> tuple[int | None, Any]:
    """The largest visible id, then the source's clock: two statements, so every transaction
    the first one's snapshot could not see started before the time returned."""
    cur.execute(f"SELECT max({quote(spec.cursor.column)}) FROM {quote(spec.table)}")
    high = cur.fetchone()[0]
    cur.execute("SELECT clock_timestamp()")
    return high, cur.fetchone()[0]


def safe_id_high(cur, pipeline: str, observed: tuple[int | None, Any], horizon: Any) -> int | None:
    """Record this plan's id observation and return the largest id that is final: seen at a time
    before the oldest transaction open now started (``horizon``; None: none open). A transaction
    open when an id was read may commit a lower id; once all of them have ended, none can.
    (Ids must come from a sequence or identity without a per-session cache.)"""
    high, at = observed
    if high is not None:
        cur.execute("INSERT INTO tidemark_control.id_observations (pipeline, observed_at, max_id) "
                    "VALUES (%s, %s, %s) ON CONFLICT DO NOTHING", (pipeline, at, high))
    cur.execute(
        "SELECT max(max_id), max(observed_at) FROM tidemark_control.id_observations "
        "WHERE pipeline = %s AND (%s::timestamptz IS NULL OR observed_at < %s::timestamptz)",
        (pipeline, horizon, horizon),
    )
    final, newest = cur.fetchone()
    if newest is not None:  # older observations can never be needed again
        cur.execute("DELETE FROM tidemark_control.id_observations WHERE pipeline = %s AND observed_at < %s",
                    (pipeline, newest))
    return final


# --- reconciliation evidence (append-only: the table refuses UPDATE and DELETE) ---------------

def record_reconciliation(cur, *, run_id: str, pipeline: str, batch_id: str | None, attempt: int | None,
                          window: Window | None, checks, tolerance, tolerance_reason: str | None,
                          code_version: str, repair_batch: str | None = None) -> bool:
    """Append one row per check (``tidemark.reconcile.Check``) and, for a batch, its verdict on the
    ledger (``reconciled`` or ``reconciliation_failed``; the latest run's stands), also on the
    ``repair_batch`` whose load set the run off. Returns the verdict."""
    from psycopg2.extras import execute_values

    passed = all(c.passed for c in checks)
    lo, hi = (json.dumps(window.lo.to_json()), json.dumps(window.hi.to_json())) if window is not None else (None, None)
    execute_values(cur, """
        INSERT INTO tidemark_control.reconciliation_results (run_id, pipeline, batch_id, attempt, scope, window_lo,
            window_hi, check_name, subject, expected, actual, difference, verdict, tolerance, tolerance_reason,
            code_version) VALUES %s""",
        [(run_id, pipeline, batch_id, attempt, "batch" if batch_id else "full", lo, hi, c.check, c.subject,
          c.expected, c.actual, c.difference, "pass" if c.passed else "fail", tolerance, tolerance_reason,
          code_version) for c in checks])
    batches = [b for b in (batch_id, repair_batch) if b is not None]
    if batches:
        cur.execute("UPDATE tidemark_control.batches SET reconciliation = %s, reconciled_at = clock_timestamp() "
                    "WHERE batch_id = ANY(%s)", ("reconciled" if passed else "reconciliation_failed", batches))
    return passed


def reconciliation_results(cur, run_id: str) -> list[dict[str, Any]]:
    cur.execute("SELECT check_name, subject, expected, actual, difference, verdict, tolerance, tolerance_reason "
                "FROM tidemark_control.reconciliation_results WHERE run_id = %s ORDER BY id", (run_id,))
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


def committed_batch(cur, batch_id: str) -> tuple[str, Window, int]:
    """(pipeline, window, committed attempt) of a committed batch; LookupError names what it is instead."""
    cur.execute("SELECT pipeline, state, window_lo, window_hi, backfill, committed_attempt "
                "FROM tidemark_control.batches WHERE batch_id = %s", (batch_id,))
    row = cur.fetchone()
    if row is None:
        raise LookupError(f"batch {batch_id} is not in the ledger")
    pipeline, state, lo, hi, backfill, attempt = row
    if state != "committed":
        raise LookupError(f"batch {batch_id} is {state}, not committed: only a committed batch can be reconciled")
    return pipeline, Window(Bound.from_json(lo), Bound.from_json(hi), backfill), attempt


# Read-only queries of the evidence page (tidemark.evidence): what each reconciliation run of a batch
# found, and the repair batches planned from them.

RESULT_COLUMNS = ("run_id", "pipeline", "batch_id", "attempt", "scope", "window_lo", "window_hi", "check_name",
                  "subject", "expected", "actual", "difference", "verdict", "tolerance", "tolerance_reason",
                  "checked_at", "code_version")


def _subjects(subjects: list[tuple[str, str | None]]) -> dict[str, Any]:
    """(pipeline, batch id or None: its full-table runs) pairs as query parameters."""
    return {"pipelines": sorted({p for p, _ in subjects}), "batches": sorted({b for _, b in subjects if b}),
            "full": sorted({p for p, b in subjects if b is None})}


def reconciliation_evidence(cur, subjects: list[tuple[str, str | None]], *, runs: int = 50) -> list[dict[str, Any]]:
    """Every result of the newest ``runs`` reconciliation runs of each (pipeline, batch id) in
    ``subjects`` (batch id None: the pipeline's full-table runs): dicts of RESULT_COLUMNS, oldest run
    first, each run's checks in the order recorded."""
    if not subjects:
        return []
    cols = ", ".join(f"r.{c}" for c in RESULT_COLUMNS).replace("r.run_id", "r.run_id::text")
    cur.execute(f"""
        WITH runs AS (
            SELECT run_id, max(id) AS last,
                   row_number() OVER (PARTITION BY pipeline, batch_id ORDER BY max(id) DESC) AS nth
              FROM tidemark_control.reconciliation_results
             WHERE pipeline = ANY(%(pipelines)s)
               AND (batch_id = ANY(%(batches)s) OR (batch_id IS NULL AND pipeline = ANY(%(full)s)))
             GROUP BY run_id, pipeline, batch_id)
        SELECT {cols} FROM tidemark_control.reconciliation_results r JOIN runs USING (run_id)
         WHERE runs.nth <= %(runs)s ORDER BY runs.last, r.id""", {**_subjects(subjects), "runs": runs})
    wanted = set(subjects)
    found = [dict(zip(RESULT_COLUMNS, row)) for row in cur.fetchall()]
    return [r for r in found if (r["pipeline"], r["batch_id"]) in wanted]


def repair_batches(cur, subjects: list[tuple[str, str | None]]) -> list[dict[str, Any]]:
    """The repair batches planned for each (pipeline, repaired batch id or None: the whole table) in
    ``subjects``, oldest first: batch_id, pipeline, repair_of, repair_run (the reconciliation run
    that found the keys), state, repair_keys, planned_at, committed_at, reconciliation."""
    if not subjects:
        return []
    names = ("batch_id", "pipeline", "repair_of", "repair_run", "state", "repair_keys", "planned_at", "committed_at",
             "reconciliation")
    cur.execute("""SELECT batch_id, pipeline, repair_of, repair_run::text, state, repair_keys, planned_at, committed_at,
                          reconciliation
                     FROM tidemark_control.batches
                    WHERE repair_keys IS NOT NULL AND pipeline = ANY(%(pipelines)s)
                      AND (repair_of = ANY(%(batches)s) OR (repair_of IS NULL AND pipeline = ANY(%(full)s)))
                    ORDER BY planned_at, batch_id""", _subjects(subjects))
    wanted = set(subjects)
    found = [dict(zip(names, row)) for row in cur.fetchall()]
    return [r for r in found if (r["pipeline"], r["repair_of"]) in wanted]


def batch_overview(cur, batch_id: str) -> dict[str, Any] | None:
    """One batch as the evidence page shows it (None: not in the ledger): batch_id, pipeline, state,
    window, rows, committed_at, reconciliation, reconciled_at, repair_of, is_repair."""
    cur.execute("""SELECT batch_id, pipeline, state, window_lo, window_hi, backfill, rows, committed_at, reconciliation,
                          reconciled_at, repair_of, repair_keys IS NOT NULL
                     FROM tidemark_control.batches WHERE batch_id = %s""", (batch_id,))
    row = cur.fetchone()
    if row is None:
        return None
    batch, pipeline, state, lo, hi, backfill, rows, committed_at, verdict, reconciled_at, repair_of, is_repair = row
    return {"batch_id": batch, "pipeline": pipeline, "state": state,
            "window": Window(Bound.from_json(lo), Bound.from_json(hi), backfill), "rows": rows,
            "committed_at": committed_at, "reconciliation": verdict, "reconciled_at": reconciled_at,
            "repair_of": repair_of, "is_repair": is_repair}


def latest_reconciliation(cur, pipeline: str) -> tuple[str | None, str] | None:
    """(batch id or None, scope) of the pipeline's newest reconciliation run (None: never reconciled)."""
    cur.execute("SELECT batch_id, scope FROM tidemark_control.reconciliation_results WHERE pipeline = %s "
                "ORDER BY checked_at DESC, id DESC LIMIT 1", (pipeline,))
    row = cur.fetchone()
    return (row[0], row[1]) if row else None


def reconciliation_runs(cur, pipeline: str, *, limit: int = 20) -> list[dict[str, Any]]:
    """The pipeline's newest reconciliation runs, one dict each: run_id, batch_id (None: full table),
    scope, checked_at, checks, failed, rows_source, rows_target (the row_count check's figures)."""
    names = ("run_id", "batch_id", "scope", "checked_at", "checks", "failed", "rows_source", "rows_target")
    cur.execute("""SELECT run_id::text, batch_id, scope, max(checked_at), count(*), count(*) FILTER (WHERE verdict = 'fail'),
                          max(expected) FILTER (WHERE check_name = 'row_count'),
                          max(actual) FILTER (WHERE check_name = 'row_count')
                     FROM tidemark_control.reconciliation_results WHERE pipeline = %s
                    GROUP BY run_id, batch_id, scope ORDER BY max(id) DESC LIMIT %s""", (pipeline, limit))
    return [dict(zip(names, row)) for row in cur.fetchall()]

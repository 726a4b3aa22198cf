"""The batch ledger and watermarks in the warehouse's control schema (DB-API cursors, psycopg2).

The orchestration side writes here (plan, attempts, extract totals); the sink writes the outcome
(committed, refused, superseded) in the same transaction as the data it applies.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidemark.control import PartitionTotals, dumps_totals, loads_totals
from tidemark.spec import PipelineSpec, quote
from tidemark.window import Bound, PlanError, Window

CONTROL_SCHEMA_LOCK = 7_411_000  # advisory lock: concurrent first runs create the schema once


def ensure_control_schema(cur) -> None:
    cur.execute("SELECT pg_advisory_xact_lock(%s)", (CONTROL_SCHEMA_LOCK,))
    cur.execute((Path(__file__).parent / "sql" / "control_schema.sql").read_text())


def batch_id_for(pipeline: str, run_id: str) -> str:
    """One batch per pipeline and DAG run: re-running the run re-uses its window."""
    return f"{pipeline}:{run_id}"


def committed_watermark(cur, pipeline: str) -> Bound | None:
    cur.execute("SELECT bound FROM tidemark_control.watermarks WHERE pipeline = %s", (pipeline,))
    row = cur.fetchone()
    return Bound.from_json(row[0]) if row else None


@dataclass(frozen=True)
class PlannedBatch:
    batch_id: str
    window: Window
    reused: bool  # the run was planned before (a retry or a cleared run): same window


def record_plan(cur, spec: PipelineSpec, batch_id: str, run_id: str, window: Window) -> PlannedBatch:
    """Store the batch's window, or return the window stored by an earlier try of the same run."""
    cur.execute(
        """INSERT INTO tidemark_control.batches
               (batch_id, pipeline, run_id, window_lo, window_hi, backfill, partitions, state)
           VALUES (%s, %s, %s, %s, %s, %s, %s, 'planned')
           ON CONFLICT (batch_id) DO NOTHING""",
        (batch_id, spec.name, run_id, json.dumps(window.lo.to_json()), json.dumps(window.hi.to_json()),
         window.backfill, spec.partitions),
    )
    if cur.rowcount == 1:
        return PlannedBatch(batch_id, window, reused=False)
    cur.execute(
        "SELECT window_lo, window_hi, backfill FROM tidemark_control.batches WHERE batch_id = %s", (batch_id,)
    )
    lo, hi, backfill = cur.fetchone()
    return PlannedBatch(batch_id, Window(Bound.from_json(lo), Bound.from_json(hi), backfill), reused=True)


class AlreadyCommitted(RuntimeError):
    """The batch is committed: nothing may reopen it (a cleared run, a replay)."""


def open_attempt(cur, batch_id: str) -> int:
    """The next attempt number for the batch, recorded as open (it fences all older ones)."""
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
    record_attempt(cur, batch_id, attempt)
    return attempt


def record_attempt(cur, batch_id: str, attempt: int) -> list[int]:
    """Record ``attempt`` as open and supersede every older open or sealed attempt (returned).

    Used by the orchestration side when it opens an attempt and by the sink when BEGIN arrives.
    """
    cur.execute(
        "INSERT INTO tidemark_control.batch_attempts (batch_id, attempt, state) VALUES (%s, %s, 'open') "
        "ON CONFLICT DO NOTHING",
        (batch_id, attempt),
    )
    cur.execute(
        """UPDATE tidemark_control.batch_attempts SET state = 'superseded', finished_at = clock_timestamp(),
                  message = coalesce(message, '') || format('superseded by attempt %%s', %s::int)
            WHERE batch_id = %s AND attempt < %s AND state IN ('open', 'sealed') RETURNING attempt""",
        (attempt, batch_id, attempt),
    )
    return [old for (old,) in cur.fetchall()]


def record_extract(cur, batch_id: str, attempt: int, totals: dict[int, PartitionTotals]) -> None:
    """Keep what the extract counted, per partition, for the END step (never in XCom: the sums
    pass 64 bits)."""
    cur.execute(
        """UPDATE tidemark_control.batch_attempts SET extract_totals = %s, rows = %s, checksum = %s
            WHERE batch_id = %s AND attempt = %s AND state = 'open' RETURNING attempt""",
        (dumps_totals(totals), sum(t.rows for t in totals.values()), sum(t.checksum for t in totals.values()),
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


def seal_attempt(cur, batch_id: str, attempt: int, totals: dict[int, PartitionTotals]) -> None:
    cur.execute(
        """UPDATE tidemark_control.batch_attempts
              SET state = CASE WHEN state = 'open' THEN 'sealed' ELSE state END,
                  extract_totals = %s, sealed_at = clock_timestamp(), rows = %s, checksum = %s
            WHERE batch_id = %s AND attempt = %s""",
        (dumps_totals(totals), sum(t.rows for t in totals.values()), sum(t.checksum for t in totals.values()),
         batch_id, attempt),
    )
    cur.execute(
        "UPDATE tidemark_control.batches SET state = 'sealed', updated_at = clock_timestamp() "
        "WHERE batch_id = %s AND attempt = %s AND state = 'open'",
        (batch_id, attempt),
    )


def abort_unfinished(cur, batch_id: str, reason: str) -> int | None:
    """Mark the batch's latest attempt aborted if it is still open or sealed; returns it.

    The sink discards records of attempts that are not open or sealed, so once this commits
    nothing of the attempt can be applied, whether or not an ABORT message ever reaches it.
    """
    # Lock order batches, then batch_attempts, as the sink takes them: no deadlock with a running sink.
    cur.execute("SELECT 1 FROM tidemark_control.batches WHERE batch_id = %s FOR UPDATE", (batch_id,))
    cur.execute(
        """UPDATE tidemark_control.batch_attempts a SET state = 'aborted', finished_at = clock_timestamp(),
                  message = %s
             FROM tidemark_control.batches b
            WHERE a.batch_id = b.batch_id AND b.batch_id = %s AND a.attempt = b.attempt
              AND a.state IN ('open', 'sealed')
        RETURNING a.attempt""",
        (reason, batch_id),
    )
    row = cur.fetchone()
    if row is None:
        return None
    cur.execute(
        "UPDATE tidemark_control.batches SET state = 'aborted', message = %s, updated_at = clock_timestamp() "
        "WHERE batch_id = %s AND attempt = %s",
        (f"attempt {row[0]} aborted: {reason}", batch_id, row[0]),
    )
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
    state, rows, message, partitions, ends = row
    return AttemptStatus(state, rows, message, ends, partitions)


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
    if "." in spec.target_table:
        warehouse_cur.execute(f"CREATE SCHEMA IF NOT EXISTS {quote(spec.target_table.split('.')[0])}")
    warehouse_cur.execute(f"CREATE TABLE IF NOT EXISTS {quote(spec.target_table)} (\n  {ddl},\n  PRIMARY KEY ({pk}))")
    return True


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

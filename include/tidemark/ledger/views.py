"""Read-only views for the status page and CLI (autocommit, read-only sessions)."""

from __future__ import annotations

from typing import Any

from tidemark.protocol.window import Bound, Window

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


def batch_transport(cur, batch_id: str) -> str:
    """How a batch's records reach its stage, "kafka" or "direct": read through to_jsonb, so a control
    schema from before the column (never upgraded by a reader) says "kafka", as every batch then was."""
    cur.execute("SELECT to_jsonb(b) ->> 'transport' FROM tidemark_control.batches b WHERE batch_id = %s", (batch_id,))
    row = cur.fetchone()
    return (row and row[0]) or "kafka"


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

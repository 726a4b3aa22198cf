"""Reconciliation evidence (append-only: the table refuses UPDATE and DELETE) and what the evidence pages read."""

from __future__ import annotations

import json
from typing import Any

from tidemark.protocol.window import Bound, Window


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


def record_left_out(cur, run_id: str, pipeline: str, batch_id: str, left_out: dict[str, tuple]) -> None:
    """The keys a batch's reconciliation run left out that the batch did not carry (``reconcile.left_out``)."""
    from psycopg2.extras import execute_values

    if left_out:
        execute_values(cur, """INSERT INTO tidemark_control.reconcile_left_out (run_id, pipeline, batch_id, first_key,
                                   source_cursor, target_cursor) VALUES %s""",
                       [(run_id, pipeline, batch_id, key, at, held) for key, (at, held) in left_out.items()])


def left_out_before(cur, pipeline: str, batch_id: str, batches: int) -> dict[str, list[str]] | None:
    """First key -> its source cursors, for the keys that the newest reconciliation run of each of the
    ``batches`` committed batches before ``batch_id`` (scheduled ones, in commit order) left out uncarried;
    None when fewer batches, or one of them never reconciled, so nothing can be said yet."""
    cur.execute("""
        WITH recent AS (
            SELECT b.batch_id FROM tidemark_control.batches b
             WHERE b.pipeline = %(p)s AND b.state = 'committed' AND b.repair_keys IS NULL AND NOT b.backfill
               AND b.committed_at < (SELECT committed_at FROM tidemark_control.batches WHERE batch_id = %(b)s)
             ORDER BY b.committed_at DESC LIMIT %(n)s),
        runs AS (
            SELECT DISTINCT ON (r.batch_id) r.batch_id, r.run_id FROM tidemark_control.reconciliation_results r
             WHERE r.pipeline = %(p)s AND r.batch_id IN (SELECT batch_id FROM recent)
             ORDER BY r.batch_id, r.id DESC)
        SELECT (SELECT count(*) FROM recent), (SELECT count(*) FROM runs), l.first_key, array_agg(l.source_cursor)
          FROM runs LEFT JOIN tidemark_control.reconcile_left_out l USING (run_id)
         GROUP BY l.first_key HAVING l.first_key IS NULL OR count(*) = %(n)s""",
        {"p": pipeline, "b": batch_id, "n": batches})
    rows = cur.fetchall()
    if not rows or rows[0][0] < batches or rows[0][1] < batches:
        return None
    return {key: cursors for _, _, key, cursors in rows if key is not None}


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

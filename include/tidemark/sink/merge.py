"""The SQL that writes a verified batch into the target, in the sink's transaction: the merge (newest
version per key wins, or a whole window replaced), a repair batch's keyed replace with the evidence
of every row it deletes, and the compaction of the real-time rows a committed window covers."""

from __future__ import annotations

import logging

import psycopg2
import psycopg2.errors
import psycopg2.extensions

from tidemark import ledger
from tidemark.batch.repair import key_filter, key_types
from tidemark.protocol.spec import PipelineSpec, quote
from tidemark.protocol.window import Window, covered, predicate

log = logging.getLogger("tidemark.sink")


def newest_wins(spec: PipelineSpec, columns: list[str]) -> str:
    """The upsert's conflict clause: an older version never replaces a newer one."""
    target, cursor_col = quote(spec.target_table), quote(spec.cursor.column)
    updates = ", ".join(f"{quote(c)} = EXCLUDED.{quote(c)}" for c in columns
                        if c not in spec.primary_key)
    pk = ", ".join(quote(c) for c in spec.primary_key)
    return (f"ON CONFLICT ({pk}) DO UPDATE SET {updates} WHERE {target}.{cursor_col} <= EXCLUDED.{cursor_col}"
            if updates else f"ON CONFLICT ({pk}) DO NOTHING")


def apply_batch(cur, spec: PipelineSpec, window: Window, columns: list[str], records: str, *,
                savepoint: str | None = None) -> int:
    """Write a batch into the target (``records``: SQL reading its staged records; ``columns``: the
    ones it writes). Returns the target rows written. ``savepoint``: one the caller set just before
    (after any change to the target's columns), which makes an upsert try the plain insert first."""
    target = quote(spec.target_table)
    cols = ", ".join(quote(c) for c in columns)
    if spec.write_mode == "append_window_replace":
        # The window's rows are replaced whole. A key that is already there (outside the window,
        # or twice in the batch) is not append-only data: the insert fails and the batch is refused.
        cur.execute(f"DELETE FROM {target} WHERE {predicate(spec, window)}")
        cur.execute(f"INSERT INTO {target} ({cols}) SELECT {cols} FROM ({records}) batch")
        return cur.rowcount
    if savepoint is not None:
        # No key of the target lies between the batch's first and last: unless a key comes twice in
        # the batch (a spec key the source does not hold unique), the upsert would only insert. The
        # unique key itself says so: a plain insert, without the upsert's sort and per-row conflict
        # checks (about 2.5x faster); whatever it or the probe meets, the merge decides as always.
        # It rolls back to the caller's savepoint, not one of its own: the rows must be written by
        # the subtransaction that goes on to write the ledger (their xmin is how
        # reconcile.checks.loaded_by_batches knows the batch that loaded them).
        try:
            if _new_keys(cur, spec, target, records):
                cur.execute(f"INSERT INTO {target} ({cols}) SELECT {cols} FROM ({records}) batch")
                log.info("pipeline=%s window %s: every key new to the target: %s row(s) appended without a merge",
                         spec.name, window, cur.rowcount)
                return cur.rowcount
        except (psycopg2.IntegrityError, psycopg2.DataError, psycopg2.errors.UndefinedFunction) as exc:
            cur.execute(f"ROLLBACK TO SAVEPOINT {savepoint}")
            log.info("pipeline=%s window %s: the plain insert of keys new to the target met %s: merged instead, the "
                     "newest version of each key wins", spec.name, window, type(exc).__name__)
    pk = ", ".join(quote(c) for c in spec.primary_key)
    # The newest version of each key wins, within the batch and against the target.
    cur.execute(
        f"""INSERT INTO {target} ({cols})
            SELECT {cols} FROM (SELECT DISTINCT ON ({pk}) * FROM ({records}) batch
                                ORDER BY {pk}, {quote(spec.cursor.column)} DESC) latest
            {newest_wins(spec, columns)}"""
    )
    return cur.rowcount


def _new_keys(cur, spec: PipelineSpec, target: str, records: str) -> bool:
    """Whether the target holds no key between the batch's least and greatest (by the key's first
    column: one probe of the primary key's index, after two top-1 passes over the stage; ORDER BY,
    not min/max, which uuid lacks; the stage's values cast to the target column's type, which a
    target made by hand may have other than the source's). False when no immediate unique index on
    exactly the key guards the plain insert: the merge then decides, or fails, as always."""
    cur.execute("""SELECT EXISTS (SELECT 1 FROM pg_index i
                                   WHERE i.indrelid = %s::regclass AND i.indisunique AND i.indimmediate
                                     AND i.indpred IS NULL AND i.indexprs IS NULL
                                     AND (SELECT array_agg(a.attname::text ORDER BY a.attname::text COLLATE "C") FROM pg_attribute a
                                           WHERE a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)) = %s),
                          (SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
                            WHERE a.attrelid = %s::regclass AND a.attname = %s AND NOT a.attisdropped)""",
                (target, sorted(spec.primary_key), target, spec.primary_key[0]))
    guarded, kind = cur.fetchone()
    if not guarded:
        return False
    first = quote(spec.primary_key[0])

    def bound(order: str) -> str:  # (kind: the catalog's own spelling of a type)
        return f"(SELECT {first}::{kind} FROM ({records}) batch WHERE {first} IS NOT NULL ORDER BY 1 {order} LIMIT 1)"

    cur.execute(f"SELECT NOT EXISTS (SELECT 1 FROM {target} WHERE {first} BETWEEN {bound('ASC')} AND {bound('DESC')})")
    return cur.fetchone()[0]


def apply_repair(cur, spec: PipelineSpec, batch_id: str, attempt: int, keys: list[list[str]], window: Window,
           columns: list[str], records: str) -> tuple[int, int]:
    """A repair batch: the target's rows of its keys, as far as its window reaches, are replaced by
    what was staged. A key with nothing staged (the source holds no version of it there) is
    deleted only where the plan allows it (``ledger.repair_deletes``): an extra row always, a row
    deleted at the source after a batch loaded it only when the run set apply_source_deletes;
    any other stays as it is, for the next reconciliation to report. Each row deleted without a
    staged replacement goes, with its old values, into tidemark_control.repair_deletions in this
    transaction. A plan recorded before (no ``repair_deletes``) deletes every key's rows, as it
    did. A newer version that a later batch loaded meanwhile (cursor past the window) is neither
    deleted nor replaced. Returns (staged records whose key is not one of ``keys``, target rows
    written); the caller refuses the batch if the first is not 0."""
    target = quote(spec.target_table)
    cols = ", ".join(quote(c) for c in columns)
    pk = list(spec.primary_key)
    types = key_types(cur, spec.target_table, pk)
    keyed = key_filter(pk, types, keys)
    cur.execute(f"SELECT count(*) FROM ({records}) batch WHERE NOT ({keyed})")
    (outside,) = cur.fetchone()
    if outside:
        return outside, 0
    plan = ledger.repair_deletes(cur, batch_id)
    pks = ", ".join(quote(c) for c in pk)
    staged = f"({pks}) IN (SELECT {pks} FROM ({records}) batch)"
    if plan is None:  # planned before deletions were told apart: every key's rows, as before
        allowed, kind = "true", "'unclassified'"
    else:
        at_source = plan.get("deleted_at_source") or []
        may = list(plan.get("extra") or []) + (at_source if plan.get("apply_source_deletes") else [])
        allowed = key_filter(pk, types, may) if may else "false"
        kind = (f"CASE WHEN {key_filter(pk, types, at_source)} THEN 'deleted_at_source' ELSE 'extra' END"
                if at_source else "'extra'")
    kept = ledger.recording_repair_deletions(cur, batch_id, spec.name, spec.target_table, deleted="gone", kind=kind,
                                             key=", ".join(f"{quote(c)}::text" for c in pk),
                                             unreplaced=f"NOT ({staged})", order=pks)
    # one statement: the delete, and the evidence of every row it took without a replacement, in key
    # order (the delete returns heap order, which an appended batch leaves unsorted)
    cur.execute(
        f"""WITH gone AS (DELETE FROM {target}
                           WHERE {keyed} AND {covered(spec, window.hi, spec.target_table)}
                             AND ({staged} OR {allowed})
                       RETURNING *),
                 {kept}
            SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM kept),
                   (SELECT count(*) FROM kept WHERE kind = 'deleted_at_source')""")
    deleted, without, at_source_deleted = cur.fetchone()
    # a row still there is newer than the window (loaded since): the newest version stays
    conflict = newest_wins(spec, columns) if spec.write_mode != "append_window_replace" else ""
    cur.execute(f"INSERT INTO {target} ({cols}) SELECT {cols} FROM ({records}) batch {conflict}")
    log.info("pipeline=%s batch=%s attempt=%s repair of %s key(s) up to %s: %s target row(s) deleted (%s without a "
             "staged replacement, %s of them deleted at the source; kept in tidemark_control.repair_deletions), "
             "%s written", spec.name, batch_id, attempt, len(keys), window.hi, deleted, without, at_source_deleted,
             cur.rowcount)
    return 0, cur.rowcount

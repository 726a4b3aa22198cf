"""The checks one pass cannot make: unique keys, double entry, balances, freshness, deletions."""

from __future__ import annotations

import json
import time
from decimal import Decimal
from typing import Any

from tidemark.protocol.spec import PipelineSpec, key_text, quote
from tidemark.protocol.window import Window, predicate
from tidemark.reconcile.verdict import DELETED_AT_SOURCE, Check, Difference, Verdict

MAX_MOVED_KEYS = 100_000

def tell_deletions_apart(cur, spec: PipelineSpec, where: str, verdict: Verdict) -> None:  # ``where``: %% for %
    """Of the keys the target holds and the source does not, those Tidemark loaded become
    ``deleted_at_source``, each with a failing result (its key and the target's old values) for the
    evidence; the others stay ``extra``."""
    extra = [d for d in verdict.differences if d.kind == "extra"]
    if not extra:
        return
    loaded = loaded_by_batches(cur, spec, where, [d.key for d in extra])
    for d in extra:
        if d.key in loaded:
            d.kind, d.loaded_by = DELETED_AT_SOURCE, loaded[d.key]
            verdict.checks.append(deletion_check(d))


def deletion_check(d: Difference) -> Check:
    """A row deleted at the source after a committed batch loaded it, as the evidence keeps it."""
    return Check(DELETED_AT_SOURCE, f"key {key_text(d.key)}, loaded by batch {d.loaded_by}", "no row at the source",
                 json.dumps(d.target, default=str), "deleted at the source after it was loaded", False)


def loaded_by_batches(cur, spec: PipelineSpec, where: str, keys: list[tuple]) -> dict[tuple, str]:
    """Of ``keys`` (target rows inside ``where``), those whose target row was written by the
    transaction that committed a batch of this pipeline (the row's ``xmin`` is the committed
    attempt's ledger row's: the sink writes both in one transaction), with that batch's id.

    Nothing else marks a row as Tidemark's: a row inserted or updated in the warehouse by hand has
    another writer, and stays ``extra``. PostgreSQL keeps a row's ``xmin`` when it freezes it; a
    dump and restore (or a tool that rewrites rows) gives every row a new one, and such rows are
    then reported ``extra``, as before deletions were told apart."""
    from tidemark.batch.repair import RepairError, key_filter, key_types

    if not keys:
        return {}
    try:
        names = list(spec.primary_key)
        keyed = key_filter(names, key_types(cur, spec.target_table, names), [[str(v) for v in k] for k in keys])
    except RepairError:  # a key type no filter can cast to: they stay extra
        return {}
    cols = ", ".join(quote(c) for c in names)
    cur.execute(f"""SELECT {', '.join(f't.{quote(c)}' for c in names)}, w._tm_batch
                      FROM (SELECT {cols}, xmin AS _tm_writer FROM {quote(spec.target_table)}
                             WHERE ({where}) AND {keyed.replace('%', '%%')}) t
                      JOIN (SELECT a.xmin AS _tm_writer, a.batch_id AS _tm_batch
                              FROM tidemark_control.batch_attempts a JOIN tidemark_control.batches b USING (batch_id)
                             WHERE b.pipeline = %(pipeline)s AND a.state = 'committed') w USING (_tm_writer)""",
                {"pipeline": spec.name})
    n = len(names)
    return {tuple(row[:n]): row[n] for row in cur.fetchall()}


def invariant_checks(cur, spec: PipelineSpec, where: str, timings: dict[str, float]) -> list[Check]:
    """The target's accounting invariants the spec declares, each timed into ``timings``."""
    checks: list[Check] = []
    for rule, step, check in (
            (spec.reconcile.double_entry, "double entry", lambda: [double_entry(cur, spec, where)]),
            (spec.reconcile.balance_continuity, "balance continuity", lambda: balance_continuity(cur, spec, where)),
            (spec.reconcile.movements_match_ledger, "movements against the ledger",
             lambda: [movements_match_ledger(cur, spec, where)])):
        if rule is not None:
            started = time.perf_counter()
            checks += check()
            timings[step] = round(time.perf_counter() - started, 3)
    return checks


def moved_keys(cur, spec: PipelineSpec, window: Window, target_cur=None) -> list[Any]:
    """First key columns of source rows updated past the window's end (none for append-only data).

    With ``target_cur`` (a batch that read above its window: ``LedgerBatch.reads_above``), only the
    keys whose source version past the end is not the one the target holds: a version the batch
    carried, still the source's, is compared like any other row."""
    if spec.append_only or spec.write_mode == "append_window_replace":
        return []
    after = predicate(spec, Window(window.hi, window.hi)).split(" AND ")[0]  # cursor > hi, as the window says it
    keys = [quote(k) for k in spec.primary_key]
    first, cursor = keys[0], quote(spec.cursor.column)
    cur.execute(f"SELECT {first}, jsonb_build_array({', '.join(f'{k}::text' for k in keys)})::text, {cursor}::text "
                f"FROM {quote(spec.table)} WHERE {after.replace('%', '%%')} LIMIT %s", (MAX_MOVED_KEYS + 1,))
    rows = cur.fetchall()
    if len(rows) > MAX_MOVED_KEYS:
        raise ReconcileError(f"pipeline {spec.name}: more than {MAX_MOVED_KEYS} rows of {spec.table} changed after "
                             f"the window's end {window.hi}: reconcile right after the load, or run a full "
                             "reconciliation up to the current watermark")
    if target_cur is None or not rows:
        return list(dict.fromkeys(k for k, _, _ in rows))
    target_cur.execute(
        f"SELECT jsonb_build_array({', '.join(f'{k}::text' for k in keys)})::text, {cursor}::text "
        f"FROM {quote(spec.target_table)} WHERE {first} = ANY(%s)", (list({k for k, _, _ in rows}),))
    held = dict(target_cur.fetchall())
    return list(dict.fromkeys(k for k, full, at in rows if held.get(full) != at))


def left_out(source_cur, target_cur, spec: PipelineSpec, window: Window, moved: list[Any]) -> dict[str, tuple]:
    """Of the keys left out (``moved_keys``), those the batch did not carry either: the target's newest
    version of the first key is at or before the window's start, or there is none. First key (text) ->
    (its newest cursor at the source, its newest in the target or None), both as text."""
    if not moved:
        return {}
    first, cursor = quote(spec.primary_key[0]), quote(spec.cursor.column)
    newest = (f"SELECT {first}::text, max({cursor})::text, max({cursor}) > %s FROM {{table}} "
              f"WHERE {first} = ANY(%s) GROUP BY 1")
    target_cur.execute(newest.format(table=quote(spec.target_table)), (window.lo.cursor, moved))
    carried = {k: (at, above) for k, at, above in target_cur.fetchall()}
    source_cur.execute(newest.format(table=quote(spec.table)), (window.lo.cursor, moved))
    return {k: (at, carried.get(k, (None, False))[0]) for k, at, _ in source_cur.fetchall()
            if not carried.get(k, (None, False))[1]}


def starved_keys(spec: PipelineSpec, now: dict[str, tuple], before: dict[str, list[str]], batches: int) -> list[Check]:
    """A failed check for each key left out, and not carried, by this batch (``now``, ``left_out``) and by
    every one of the ``batches - 1`` batches before it (``before``: first key -> its source cursors then,
    ``ledger.left_out_before``): a key its writers change so often that no window holds it."""
    checks = []
    for key in sorted(set(now) & set(before)):
        cursors = sorted({*before[key], now[key][0]})
        checks.append(Check(
            "starved_key", f"{spec.primary_key[0]} {key}",
            f"in one of the last {batches} batches (at its source version then)",
            f"left out of all {batches}: the target holds {now[key][1] or 'no version'}",
            f"its source version changed at least {len(cursors)} time(s) meanwhile (cursor {cursors[0]} .. "
            f"{cursors[-1]}) and no window held it", False))
    return checks


def unreachable_rows(cur, spec: PipelineSpec, sample: int = 5) -> Check | None:
    """Source rows no window will ever hold: a timestamp cursor that is NULL or infinite. Windows
    are bounded by finite cursor values, so such a row is never extracted, and every check over a
    window (row counts and totals included) passes without it: only this count can see it. An id
    cursor is a primary-key column, never NULL nor infinite."""
    if spec.cursor.kind != "timestamp" or not spec.reconcile.unreachable_rows:
        return None
    column = quote(spec.cursor.column)
    keys = ", ".join(quote(k) for k in spec.primary_key)
    stranded = f"{column} IS NULL OR {column} IN ('infinity', '-infinity')"  # both use an index on the cursor
    cur.execute(f"SELECT count(*) FROM {quote(spec.table)} WHERE {stranded}")
    n = cur.fetchone()[0]
    subject = f"{spec.table} rows whose {spec.cursor.column} is NULL or infinite"
    if n:
        cur.execute(f"SELECT {keys}, {column}::text FROM {quote(spec.table)} WHERE {stranded} ORDER BY {keys} LIMIT %s",
                    (sample,))
        shown = ", ".join(f"key {key_text(r[:-1])} {r[-1] or 'NULL'}" for r in cur.fetchall())
        subject += (f": {shown}{' ...' if n > sample else ''}; no batch loads them until {spec.cursor.column} "
                    "is set after the committed watermark (now() is)")
    return Check("unreachable_rows", subject, "0", str(n), str(n) if n else None, n == 0)


class ReconcileError(RuntimeError):
    """The reconciliation could not be run (not: it found differences)."""


def check_equal(check: str, subject: str, expected, actual, tolerance: Decimal = Decimal(0)) -> Check:
    difference = actual - expected
    return Check(check, subject, str(expected), str(actual), str(difference) if difference else None,
                 abs(difference) <= tolerance)


def unique_keys(cur, spec: PipelineSpec, where: str) -> Check:  # ``where``: %% for %
    """No key twice in the target's window: enforced by a unique index, or counted."""
    schema, _, table = spec.target_table.rpartition(".")
    cur.execute("""SELECT i.indexrelid::regclass::text FROM pg_index i
                     JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace
                    WHERE n.nspname = %s AND c.relname = %s AND i.indisunique AND i.indpred IS NULL
                      AND (SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_attribute a
                            WHERE a.attrelid = c.oid AND a.attnum = ANY (i.indkey)) = %s::text[]""",
                (schema or "public", table, sorted(spec.primary_key)))
    index = cur.fetchone()
    if index:
        return Check("unique_keys", ", ".join(spec.primary_key), "unique", f"enforced by {index[0]}", None, True)
    keys = ", ".join(quote(c) for c in spec.primary_key)
    cur.execute(f"SELECT count(*) FROM (SELECT 1 FROM {quote(spec.target_table)} WHERE {where} GROUP BY {keys} "
                f"HAVING count(*) > 1) d", {})
    n = cur.fetchone()[0]
    return Check("unique_keys", ", ".join(spec.primary_key), "unique", f"{n} keys more than once",
                 str(n) if n else None, n == 0)


def double_entry(cur, spec: PipelineSpec, where: str) -> Check:
    rule = spec.reconcile.double_entry
    journal, amount, currency = quote(rule.journal), quote(rule.amount), quote(rule.currency)
    cur.execute(f"SELECT count(*), string_agg(j || ' ' || c || ' ' || s, '; ') FILTER (WHERE n <= 5) FROM ("
                f"SELECT {journal}::text j, {currency}::text c, sum({amount})::text s, "
                f"row_number() OVER (ORDER BY {journal}) n FROM {quote(spec.target_table)} WHERE {where} "
                f"GROUP BY {journal}, {currency} HAVING sum({amount}) <> 0) u", {})
    n, examples = cur.fetchone()
    return Check("double_entry", f"sum({rule.amount}) per {rule.journal} and {rule.currency}", "0 unbalanced",
                 f"{n} unbalanced" + (f": {examples}" if examples else ""), str(n) if n else None, n == 0)


def balance_continuity(cur, spec: PipelineSpec, where: str) -> list[Check]:
    """Opening + movements = closing on the window's rows, and each row's opening equals the same
    account's previous closing (the previous row may be older than the window)."""
    rule = spec.reconcile.balance_continuity
    account, day = quote(rule.account), quote(rule.date)
    opening, movements, closing = quote(rule.opening), quote(rule.movements), quote(rule.closing)
    cur.execute(f"""SELECT count(*) FILTER (WHERE {opening} + {movements} <> {closing}),
                           string_agg({account}::text || ' ' || {day}::text, '; ' ORDER BY {account}, {day})
                               FILTER (WHERE {opening} + {movements} <> {closing}),
                           count(*) FILTER (WHERE {opening} <> _tm_previous),
                           string_agg({account}::text || ' ' || {day}::text || ': opening ' || {opening}::text
                                      || ', previous closing ' || _tm_previous::text, '; ' ORDER BY {account}, {day})
                               FILTER (WHERE {opening} <> _tm_previous)
                      FROM (SELECT *, lag({closing}) OVER (PARTITION BY {account} ORDER BY {day}) AS _tm_previous
                              FROM {quote(spec.target_table)}) t
                     WHERE {where}""", {})
    unbalanced, rows, broken, chain = cur.fetchone()
    examples = lambda text: f": {'; '.join(text.split('; ')[:5])}" if text else ""  # noqa: E731
    return [
        Check("balance_continuity", f"{rule.opening} + {rule.movements} = {rule.closing}", "0 rows",
              f"{unbalanced} rows{examples(rows)}", str(unbalanced) if unbalanced else None, unbalanced == 0),
        Check("balance_continuity", f"{rule.opening} = previous {rule.closing} per {rule.account}", "0 rows",
              f"{broken} rows{examples(chain)}", str(broken) if broken else None, broken == 0),
    ]


def movements_match_ledger(cur, spec: PipelineSpec, where: str) -> Check:  # ``where``: %% for %
    """Each balance row's movements equal the sum of the ledger's amounts for its account and date.

    Only rows the ledger pipeline's committed watermark covers are compared (their cursor at or
    before it: every entry posted with that version is loaded); newer ones are left out and counted,
    for the next reconciliation. A posting for the same account and date after the row's version
    would have changed the row at the source: such keys are left out already (``moved_keys``)."""
    from tidemark import ledger

    rule = spec.reconcile.movements_match_ledger
    account, day, movements, amount = (quote(c) for c in (rule.account, rule.date, rule.movements, rule.amount))
    subject = f"{rule.movements} = sum({rule.ledger_table}.{rule.amount}) per {rule.account}, {rule.date}"
    mark = ledger.committed_watermark(cur, rule.ledger)
    if mark is None or mark.kind != spec.cursor.kind:  # a name mistyped in the spec must not pass for ever
        why = (f"pipeline {rule.ledger} has no committed batch (yet, or no such pipeline)" if mark is None else
               f"pipeline {rule.ledger} has a {mark.kind} cursor, this one a {spec.cursor.kind} cursor")
        return Check("movements_match_ledger", subject, "0 rows differ", f"not compared: {why}", "not compared", False)
    covered = f"{quote(spec.cursor.column)} {'<=' if mark.pk is None else '<'} %(mark)s"
    cur.execute(f"""WITH b AS (SELECT {account} a, {day} d, {movements} m, {covered} AS covered
                                 FROM {quote(spec.target_table)} WHERE {where}),
                         e AS (SELECT e.{account} a, e.{day} d, sum(e.{amount}) total
                                 FROM {quote(rule.ledger_table)} e
                                 JOIN (SELECT DISTINCT a, d FROM b WHERE covered) k ON k.a = e.{account} AND k.d = e.{day}
                                GROUP BY 1, 2)
                    SELECT count(*) FILTER (WHERE covered),
                           count(*) FILTER (WHERE covered AND m IS DISTINCT FROM coalesce(total, 0)),
                           string_agg(b.a::text || ' ' || b.d::text || ': ' || coalesce(m::text, 'null') || ', ledger '
                                      || coalesce(total, 0)::text, '; ' ORDER BY b.a, b.d)
                               FILTER (WHERE covered AND m IS DISTINCT FROM coalesce(total, 0)),
                           count(*) FILTER (WHERE NOT covered)
                      FROM b LEFT JOIN e ON e.a = b.a AND e.d = b.d""", {"mark": mark.cursor})
    compared, differ, examples, newer = cur.fetchone()
    shown = f": {'; '.join(examples.split('; ')[:5])}" if examples else ""
    left = f", {newer} newer than {rule.ledger}'s watermark {mark} left out" if newer else ""
    return Check("movements_match_ledger", subject, "0 rows differ",
                 f"{differ} of {compared} rows differ{shown}{left}", str(differ) if differ else None, differ == 0)


def freshness(spec: PipelineSpec, source_cur, watermark: Any) -> Check | None:
    """The committed watermark is no older than ``reconcile.max_staleness`` by the source's clock."""
    limit = spec.reconcile.max_staleness
    if limit is None or not hasattr(watermark, "isoformat"):  # id cursors have no age
        return None
    source_cur.execute("SELECT now()")
    age = source_cur.fetchone()[0] - watermark
    return Check("freshness", f"watermark {watermark.isoformat()}", f"at most {limit} old", f"{age} old",
                 str(age - limit) if age > limit else None, age <= limit)


def speed_layer_findings(cur, spec: PipelineSpec, batch_id: str) -> list[Check]:
    """What the batch's commit corrected in a CDC pipeline's speed layer (``tidemark.realtime.cdc.compact``):
    each key whose real-time version disagreed with the nightly truth at the same cursor, with both
    values, and each deletion the change stream learned that left the batch target. Findings, not
    failures: the batch, which this reconciliation checks against the source, is the truth."""
    cur.execute("SELECT key, realtime, batch FROM tidemark_control.cdc_drift WHERE batch_id = %s ORDER BY id",
                (batch_id,))
    found = [Check("speed_layer_drift", f"key {key_text(tuple(key))}", json.dumps(batch, sort_keys=True),
                   json.dumps(realtime, sort_keys=True), "the real-time version before this batch corrected it", True)
             for key, realtime, batch in cur.fetchall()]
    cur.execute("SELECT key, old_values, commit_lsn FROM tidemark_control.cdc_batch_deletions WHERE batch_id = %s "
                "ORDER BY id", (batch_id,))
    found += [Check("cdc_deletion_applied", f"key {key_text(tuple(key))}, deleted at the source (commit LSN {lsn})",
                    "no row at the source", json.dumps(old, sort_keys=True), None, True)
              for key, old, lsn in cur.fetchall()]
    return found

"""Reconcile a committed batch: the source against the target for the batch's window, in the databases.

One pass per side (both at once) computes, grouped by key range (``width_bucket`` over equal-width
ranges of integer keys, else the target's key quantiles) and by the control totals' grouping
columns: row counts, hash totals over the full content of every row (the values' own hashes), and
exact decimal sums. Separate queries on the target check what one pass cannot: duplicate keys
(skipped when a unique index enforces them), double-entry journals that do not sum to zero per
currency, balance continuity, and balances against the ledger pipeline's movements; given a second
warehouse connection, these invariants run beside the passes on the target's snapshot. Required
fields and accepted values are Great Expectations' (``tidemark.expectations``), run by ``run``
over the same rows.

When the sides differ, only the key ranges whose count or hash total differ are read again,
split further while they hold more than ``leaf_rows`` rows, down to the rows: the report lists
missing, extra and changed keys, with both versions and the columns that differ. A key the target
holds and the source does not is *deleted at the source* when Tidemark loaded it (the target row
was written by the transaction that committed a batch of the pipeline), else *extra*. The rows read
while localising are counted, so a report can say what fraction of the batch it had to read.

Pure SQL over psycopg2 cursors: no Spark, no Airflow. Both sessions run in UTC so that every
value's text form (what localisation compares, and the row hash of types hashed as text) is the
same on both sides.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from tidemark.spec import PipelineSpec, key_text, quote
from tidemark.window import Window, predicate

BUCKETS = 256  # key ranges of the first pass: 2M rows -> about 8,000 rows per range
LEAF_ROWS = 10_000  # a differing range with more rows than this is split again before its rows are read


@dataclass(frozen=True)
class Check:
    """One result, as the evidence table keeps it."""

    check: str  # e.g. "row_count", "control_total amount by currency, business_date", "hash_total"
    subject: str  # what was compared: "" for the whole window, or the group ("EUR, 2026-11-23")
    expected: str | None  # the source's figure (or the rule)
    actual: str | None  # the target's figure
    difference: str | None
    passed: bool


@dataclass
class Difference:
    key: tuple
    # "missing" (in the source, not in the target), "changed", "deleted_at_source" (in the target, not
    # in the source, and a committed batch of the pipeline wrote the target row: the source deleted it
    # after the load) or "extra" (in the target, not in the source, and no batch wrote it)
    kind: str
    source: dict[str, str | None] | None
    target: dict[str, str | None] | None
    columns: list[str] = field(default_factory=list)  # the columns that differ (changed only)
    loaded_by: str | None = None  # deleted_at_source: the batch whose commit wrote the target row


DELETED_AT_SOURCE = "deleted_at_source"
KIND_LABELS = {DELETED_AT_SOURCE: "deleted at the source after loading"}  # the summary's words for a kind


@dataclass
class Verdict:
    checks: list[Check]
    differences: list[Difference]
    rows_source: int
    rows_target: int
    rows_read_localising: int = 0  # rows the databases scanned to localise the differences
    rows_fetched: int = 0  # of those, rows sent here to be compared column by column
    moved_keys: int = 0  # keys left out on both sides: updated at the source after the window
    complete: bool = True  # False: localisation stopped at its limit, more rows differ than listed
    where: str = ""  # the rows compared (SQL), for the declarative checks on the same rows
    seconds: float = 0.0  # the checks (both passes and the target's own queries)
    seconds_localising: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)  # seconds per step, for the log and the benchmark
    # after a repair batch: the rows it deleted because the source had deleted them (the run asked
    # for it, apply_source_deletes), one passing result each, kept in the evidence beside the checks
    deletions_applied: list[Check] = field(default_factory=list)

    @property
    def read_fraction(self) -> float:
        """Rows read while localising over the rows the window holds on both sides."""
        return self.rows_read_localising / max(self.rows_source + self.rows_target, 1)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def deleted_at_source(self) -> list[Difference]:
        return [d for d in self.differences if d.kind == DELETED_AT_SOURCE]

    def summary(self, spec: PipelineSpec, batch_id: str) -> str:
        """One line an analyst understands."""
        moved = (f" ({self.moved_keys} keys changed at the source after the window left out: the next batch "
                 "carries them)") if self.moved_keys else ""
        if self.passed:
            n = len(self.deletions_applied)
            applied = f" after applying {n} source deletion{'s' if n != 1 else ''}" if n else ""
            if self.rows_source == self.rows_target == 0 and not n:  # every check holds over no rows: not a proof
                return (f"{spec.target_table} batch {batch_id}: nothing to compare yet, 0 rows in the window{moved}, "
                        f"{len(self.checks)} checks passed")
            return (f"{spec.target_table} batch {batch_id}: reconciled{applied}, {self.rows_target} rows{moved}, "
                    f"{len(self.checks)} checks passed")
        failed = [c for c in self.checks if not c.passed]
        kinds: dict[str, int] = {}
        for d in self.differences:
            label = f"{', '.join(d.columns)} changed" if d.kind == "changed" else KIND_LABELS.get(d.kind, d.kind)
            kinds[label] = kinds.get(label, 0) + 1
        parts = ", ".join(f"{n} {label}" for label, n in sorted(kinds.items()))
        more = "" if self.complete else " (localisation stopped there: more differ)"
        rows = f"{len(self.differences)} rows differ{more}: {parts}; " if self.differences else ""
        return (f"{spec.target_table} batch {batch_id}: {rows}{len(failed)} of {len(self.checks)} checks failed "
                f"({', '.join(sorted({c.check for c in failed}))})")


# --- the row content ---------------------------------------------------------------------------

def compared_columns(cur, spec: PipelineSpec) -> list[tuple[str, str]]:
    """The source table's columns and their types: what the target holds of each row (its own
    _tm_ columns aside)."""
    schema, _, table = spec.table.rpartition(".")
    cur.execute("SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = %s "
                "AND table_name = %s ORDER BY ordinal_position", (schema or "public", table))
    columns = [(c, t) for c, t in cur.fetchall()]
    if not columns:
        raise LookupError(f"pipeline {spec.name}: the source table {spec.table} is missing or not readable")
    return columns


# Types PostgreSQL hashes by value (hash_record_extended); any other column is hashed as its text.
HASHED_BY_VALUE = frozenset({
    "smallint", "integer", "bigint", "numeric", "real", "double precision", "text", "character varying", "character",
    "boolean", "date", "timestamp with time zone", "timestamp without time zone", "time without time zone",
    "interval", "uuid", "bytea", "jsonb", "inet"})


def _row_hash(columns: list[tuple[str, str]]) -> str:
    # 64 bits per row from the values themselves (no text round trip: three times cheaper), summed as
    # numeric: order-independent, no overflow. Source and target columns have the same types.
    values = ", ".join(quote(c) if t in HASHED_BY_VALUE else f"{quote(c)}::text" for c, t in columns)
    return f"hash_record_extended(ROW({values}), 0)"


def set_session(cur) -> None:
    """UTC, so that every value's text form is the same on both sides; room to aggregate in memory."""
    cur.execute("SET LOCAL TimeZone = 'UTC'")
    cur.execute("SET LOCAL extra_float_digits = 3")
    cur.execute("SET LOCAL work_mem = '256MB'")


# --- one pass per side -------------------------------------------------------------------------

@dataclass
class Pass:
    rows: int = 0
    hash_total: int = 0
    buckets: dict[int, tuple[int, int]] = field(default_factory=dict)  # bucket -> (rows, hash total)
    totals: dict[tuple[str, tuple], Decimal] = field(default_factory=dict)  # (total's label, group) -> sum


def key_type(cur, spec: PipelineSpec) -> str:
    """The first key column's SQL type in the target (bounds travel as parameters cast to it)."""
    cur.execute("SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = to_regclass(%s) "
                "AND attname = %s AND NOT attisdropped", (quote(spec.target_table), spec.primary_key[0]))
    row = cur.fetchone()
    if row is None:
        raise LookupError(f"pipeline {spec.name}: the target {spec.target_table} has no column {spec.primary_key[0]}")
    return row[0]


def key_bounds(cur, spec: PipelineSpec, table: str, where: str, kind: str, buckets: int = BUCKETS) -> list[Any]:
    """Lower bounds of ``buckets`` key ranges of the first key column: equal widths between the
    smallest and largest integer key (ids are dense), else the key's quantiles (a sort)."""
    key = quote(spec.primary_key[0])
    if kind in ("smallint", "integer", "bigint"):
        cur.execute(f"SELECT min({key}), max({key}) FROM {quote(table)} WHERE {where}", ())
        lo, hi = cur.fetchone()
        if lo is None:
            return []
        width = max(1, -(-(hi - lo + 1) // buckets))
        return [lo + i * width for i in range(1, buckets) if lo + i * width <= hi]
    fractions = [i / buckets for i in range(1, buckets)]
    cur.execute(f"SELECT percentile_disc(%s::float8[]) WITHIN GROUP (ORDER BY {key}) FROM {quote(table)} WHERE {where}",
                (fractions,))
    found = cur.fetchone()[0] or []
    return list(dict.fromkeys(b for b in found if b is not None))  # in the database's order (its collation)


def one_pass(cur, spec: PipelineSpec, table: str, where: str, columns: list[tuple[str, str]], bounds: list[Any],
             kind: str) -> Pass:
    """Counts and hash totals per key range, and control totals per group, in one scan of ``table``:
    one hash aggregate by (range, every grouping column), rolled up here both ways."""
    totals = spec.reconcile.control_totals
    key = quote(spec.primary_key[0])
    params: dict[str, Any] = {"bounds": bounds}
    if kind in ("smallint", "integer", "bigint") and len(bounds) >= 2:  # equal widths: arithmetic, no search
        params.update(width=bounds[1] - bounds[0], lo=bounds[0] - (bounds[1] - bounds[0]), n=len(bounds))
        bucket = f"least(greatest(({key}::bigint - %(lo)s) / %(width)s, 0), %(n)s)"  # = width_bucket(key, bounds)
    else:
        bucket = f"width_bucket({key}, %(bounds)s::{kind}[])" if bounds else "0"
    group_cols = list(dict.fromkeys(c for total in totals for c in total.group_by))
    amounts = list(dict.fromkeys(c for total in totals for c in total.columns))
    select = [bucket, *[quote(c) for c in group_cols], "count(*)", f"sum({_row_hash(columns)})::text",
              *[f"sum({quote(c)})::text" for c in amounts]]
    # A hash aggregate, always: the planner cannot know that the groups are few (key ranges times
    # the grouping columns' values) and would sort every row of the window first (on disk, 3x slower).
    cur.execute("SET LOCAL enable_sort = off")
    cur.execute(f"SELECT {', '.join(select)} FROM {quote(table)} WHERE {where} "
                f"GROUP BY {', '.join(str(i + 1) for i in range(1 + len(group_cols)))}", params)
    found = cur.fetchall()
    cur.execute("SET LOCAL enable_sort = DEFAULT")
    out = Pass()
    n = len(group_cols)
    for row in found:
        b, groups, count, hashed, sums = row[0], row[1:1 + n], row[1 + n], int(Decimal(row[2 + n] or 0)), row[3 + n:]
        rows, hash_sum = out.buckets.get(b, (0, 0))
        out.buckets[b] = (rows + count, hash_sum + hashed)
        out.rows += count
        out.hash_total += hashed
        for total in totals:
            values = tuple(_text(groups[group_cols.index(c)]) for c in total.group_by)
            for c in total.columns:
                label = (f"{c} by {', '.join(total.group_by) or 'window'}", values)
                out.totals[label] = out.totals.get(label, Decimal(0)) + Decimal(sums[amounts.index(c)] or 0)
    return out


def _text(value: Any) -> str | None:
    return None if value is None else str(value).strip() if isinstance(value, str) else str(value)


# --- the whole reconciliation ------------------------------------------------------------------

MAX_MOVED_KEYS = 100_000


def reconcile(spec: PipelineSpec, window: Window, source_cur, target_cur, *, invariants_cur=None,
              buckets: int = BUCKETS, leaf_rows: int = LEAF_ROWS, localise_limit: int = 1000) -> Verdict:
    """Every check of the spec's ``reconcile`` section for ``window``; the differing rows localised.

    ``invariants_cur``, a cursor on a second warehouse connection whose transaction has not begun,
    runs the target's accounting invariants at the same time as the two passes, on the target
    cursor's snapshot (exported and imported, as ``pg_dump -j`` does); without it they run after.

    A pipeline that updates rows in place (upserts) may have moved a row past the window since the
    batch (a newer version for the next batch): the keys whose source version lies after ``hi``
    are left out on both sides (by the first key column, so both sides leave out the same rows)."""
    started = time.perf_counter()
    set_session(source_cur)
    set_session(target_cur)
    columns = compared_columns(source_cur, spec)
    kind = key_type(target_cur, spec)
    where = predicate(spec, window).replace("%", "%%")  # a text key in a bound may hold a %
    moved = moved_keys(source_cur, spec, window)
    if moved:
        where += " AND " + source_cur.mogrify(f"{quote(spec.primary_key[0])} <> ALL (%s::{kind}[])",
                                               (moved,)).decode().replace("%", "%%")
    timings: dict[str, float] = {}

    def timed(step: str, since: float) -> float:
        now = time.perf_counter()
        timings[step] = round(now - since, 3)
        return now

    mark = timed("columns, moved keys", started)
    checks: list[Check] = [unique_keys(target_cur, spec, where)]
    mark = timed("unique keys", mark)
    bounds = key_bounds(target_cur, spec, spec.target_table, where, kind, buckets)
    mark = timed("key ranges", mark)
    invariants: list[Check] = []
    if invariants_cur is not None:
        target_cur.execute("SELECT pg_export_snapshot()")
        snapshot = target_cur.fetchone()[0]
        invariants_cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        invariants_cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot,))
        set_session(invariants_cur)
    with ThreadPoolExecutor(2) as others:  # one pass per side, at the same time (one backend each)
        source_pass = others.submit(one_pass, source_cur, spec, spec.table, where, columns, bounds, kind)
        target_invariants = (others.submit(invariant_checks, invariants_cur, spec, where, timings)
                             if invariants_cur is not None else None)
        tgt = one_pass(target_cur, spec, spec.target_table, where, columns, bounds, kind)
        src = source_pass.result()
        mark = timed("one pass per side", mark)
        if target_invariants is not None:
            invariants = target_invariants.result()
            mark = timed("invariants (beside the passes), waited for", mark)
    checks.append(_compare("row_count", "", src.rows, tgt.rows))
    checks.append(_compare("hash_total", "", src.hash_total, tgt.hash_total))
    tolerance = spec.reconcile.tolerance
    for label_group in sorted(set(src.totals) | set(tgt.totals), key=lambda k: (k[0], [str(v) for v in k[1]])):
        label, group = label_group
        checks.append(_compare(f"control_total {label}", ", ".join(str(v) for v in group),
                               src.totals.get(label_group, Decimal(0)), tgt.totals.get(label_group, Decimal(0)),
                               tolerance))
    if invariants_cur is None:
        invariants = invariant_checks(target_cur, spec, where, timings)  # each timed on its own
        mark = time.perf_counter()
    checks += invariants
    stranded = unreachable_rows(source_cur, spec)
    if stranded is not None:
        checks.append(stranded)
        timed("unreachable rows", mark)
    verdict = Verdict(checks, [], src.rows, tgt.rows, moved_keys=len(moved), where=where.replace("%%", "%"),
                      timings=timings)
    verdict.seconds = time.perf_counter() - started
    if src.buckets != tgt.buckets:
        differing = sorted(b for b in set(src.buckets) | set(tgt.buckets) if src.buckets.get(b) != tgt.buckets.get(b))
        for b in differing:
            lo = bounds[b - 1] if b > 0 else None
            hi = bounds[b] if b < len(bounds) else None
            size = max(src.buckets.get(b, (0, 0))[0], tgt.buckets.get(b, (0, 0))[0])
            _localise(spec, source_cur, target_cur, where, columns, kind, lo, hi, size, leaf_rows, verdict)
            if len(verdict.differences) >= localise_limit:
                verdict.complete = False
                break
        tell_deletions_apart(target_cur, spec, where, verdict)
        verdict.seconds_localising = time.perf_counter() - started - verdict.seconds
    return verdict


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
    from tidemark.repair import RepairError, key_filter, key_types

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


def moved_keys(cur, spec: PipelineSpec, window: Window) -> list[Any]:
    """First key columns of source rows updated past the window's end (none for append-only data)."""
    if spec.append_only or spec.write_mode == "append_window_replace":
        return []
    after = predicate(spec, Window(window.hi, window.hi)).split(" AND ")[0]  # cursor > hi, as the window says it
    cur.execute(f"SELECT DISTINCT {quote(spec.primary_key[0])} FROM {quote(spec.table)} "
                f"WHERE {after.replace('%', '%%')} LIMIT %s", (MAX_MOVED_KEYS + 1,))
    found = [k for (k,) in cur.fetchall()]
    if len(found) > MAX_MOVED_KEYS:
        raise ReconcileError(f"pipeline {spec.name}: more than {MAX_MOVED_KEYS} rows of {spec.table} changed after "
                             f"the window's end {window.hi}: reconcile right after the load, or run a full "
                             "reconciliation up to the current watermark")
    return found


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


def _compare(check: str, subject: str, expected, actual, tolerance: Decimal = Decimal(0)) -> Check:
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


# --- localisation ------------------------------------------------------------------------------

def _range(spec: PipelineSpec, kind: str, lo: Any, hi: Any) -> tuple[str, dict[str, Any]]:
    key = quote(spec.primary_key[0])
    parts, params = [], {}
    if lo is not None:
        parts.append(f"{key} >= %(lo)s::{kind}")
        params["lo"] = lo
    if hi is not None:
        parts.append(f"{key} < %(hi)s::{kind}")
        params["hi"] = hi
    return " AND ".join(parts) or "true", params


def _localise(spec: PipelineSpec, source_cur, target_cur, where: str, columns: list[tuple[str, str]], kind: str, lo: Any,
              hi: Any, size: int, leaf_rows: int, verdict: Verdict) -> None:
    in_range, params = _range(spec, kind, lo, hi)
    scoped = f"({where}) AND {in_range}"
    if size > leaf_rows:  # split this range again, on the target's quantiles inside it
        sub = key_bounds(target_cur, spec, spec.target_table, _bind(target_cur, scoped, params), kind,
                         max(2, size // leaf_rows * 2))
        edges = [lo, *[b for b in sub if b != lo and b != hi], hi]
        if len(edges) > 2:
            for a, z in zip(edges, edges[1:]):
                src = _range_digest(source_cur, spec, spec.table, where, columns, kind, a, z)
                tgt = _range_digest(target_cur, spec, spec.target_table, where, columns, kind, a, z)
                verdict.rows_read_localising += src[0] + tgt[0]
                if src != tgt:
                    _localise(spec, source_cur, target_cur, where, columns, kind, a, z, max(src[0], tgt[0]),
                              leaf_rows, verdict)
            return
    s_rows = _rows(source_cur, spec, spec.table, scoped, params, columns)
    t_rows = _rows(target_cur, spec, spec.target_table, scoped, params, columns)
    verdict.rows_read_localising += len(s_rows) + len(t_rows)
    verdict.rows_fetched += len(s_rows) + len(t_rows)
    for key in sorted(set(s_rows) | set(t_rows), key=lambda k: [str(v) for v in k]):
        s, t = s_rows.get(key), t_rows.get(key)
        if s == t:
            continue
        if t is None:
            verdict.differences.append(Difference(key, "missing", s, None))
        elif s is None:
            verdict.differences.append(Difference(key, "extra", None, t))
        else:
            verdict.differences.append(Difference(key, "changed", s, t, [c for c, _ in columns if s[c] != t[c]]))


def _bind(cur, sql: str, params: dict[str, Any]) -> str:
    """``sql`` with its parameters in it, its % doubled again for the next execute."""
    return cur.mogrify(sql, params).decode().replace("%", "%%")


def _range_digest(cur, spec: PipelineSpec, table: str, where: str, columns: list[tuple[str, str]], kind: str, lo: Any,
                  hi: Any):
    in_range, params = _range(spec, kind, lo, hi)
    cur.execute(f"SELECT count(*), coalesce(sum({_row_hash(columns)}), 0)::text FROM {quote(table)} "
                f"WHERE ({where}) AND {in_range}", params)
    n, hashed = cur.fetchone()
    return n, int(Decimal(hashed))


def _rows(cur, spec: PipelineSpec, table: str, where: str, params: dict[str, Any],
          columns: list[tuple[str, str]]) -> dict[tuple, dict[str, str | None]]:
    """Rows of a range by key, every column as text (a duplicated key keeps its last row)."""
    keys = ", ".join(quote(c) for c in spec.primary_key)
    order = ", ".join(str(i + 1) for i in range(len(spec.primary_key)))
    names = [c for c, _ in columns]
    cur.execute(f"SELECT {keys}, {', '.join(f'{quote(c)}::text' for c in names)} FROM {quote(table)} "
                f"WHERE {where} ORDER BY {order}", params)
    n = len(spec.primary_key)
    return {tuple(row[:n]): dict(zip(names, row[n:])) for row in cur.fetchall()}


def differences_csv(differences: Iterable[Difference], columns: list[str]) -> str:
    """The report as CSV: one line per differing row and side."""
    import csv
    import io

    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["key", "kind", "side", "differing_columns", *columns])
    for d in differences:
        for side, row in (("source", d.source), ("target", d.target)):
            if row is not None:
                writer.writerow([" ".join(map(str, d.key)), d.kind, side, " ".join(d.columns),
                                 *[row.get(c) for c in columns]])
    return out.getvalue()


# --- one reconciliation run: the verdict, its evidence and its report --------------------------

@dataclass
class Outcome:
    run_id: str
    batch_id: str | None  # None: a full-table reconciliation
    window: Window
    verdict: Verdict
    line: str  # one line for the log: the verdict, and where the report is
    report: Path | None = None  # the HTML report (the CSV beside it), when rows differ
    data_docs: Path | None = None  # Great Expectations' Data Docs index
    after_repair: str | None = None  # the repair batch whose load set this run off


def run(spec: PipelineSpec, source_conn, warehouse_conn, root: Path, *, batch_id: str | None = None,
        warehouse_url: str | None = None, code_version: str = "unknown", invariants_conn=None,
        **options: Any) -> Outcome:
    """Reconcile one committed batch (``batch_id``) or, without one, the whole table up to the
    committed watermark; with ``warehouse_url`` (SQLAlchemy), run the declarative checks through
    Great Expectations and render Data Docs under ``root``; record every check in the evidence
    table and the batch's verdict on the ledger; write a CSV and HTML report of the differing rows
    under ``root/reports``. With ``invariants_conn`` (a second warehouse connection) the target's
    accounting invariants run beside the two passes."""
    import uuid

    from tidemark import ledger
    from tidemark.window import Bound

    after_repair, deleted = None, []
    with warehouse_conn, warehouse_conn.cursor() as cur:
        mark = ledger.committed_watermark(cur, spec.name)
        repaired = ledger.repair(cur, batch_id) if batch_id is not None else None
        if repaired is not None:  # a repair batch: reconcile what it repaired (a batch, or the whole table)
            after_repair, batch_id = batch_id, repaired.repair_of
            deleted = [d for d in ledger.repair_deletions(cur, after_repair) if d.kind == DELETED_AT_SOURCE]
        if batch_id is not None:
            pipeline, window, attempt = ledger.committed_batch(cur, batch_id)
            if pipeline != spec.name:
                raise ReconcileError(f"batch {batch_id} belongs to pipeline {pipeline}, not {spec.name}")
        else:
            if mark is None:
                raise ReconcileError(f"pipeline {spec.name} has no committed batch yet: nothing to reconcile")
            window, attempt = Window(Bound(spec.start), mark), None
    try:
        with source_conn, source_conn.cursor() as s, warehouse_conn, warehouse_conn.cursor() as t:
            s.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")  # one snapshot per side
            t.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            if invariants_conn is None:
                verdict = reconcile(spec, window, s, t, **options)
            else:
                with invariants_conn, invariants_conn.cursor() as i:
                    verdict = reconcile(spec, window, s, t, invariants_cur=i, **options)
            fresh = freshness(spec, s, mark.cursor if mark is not None else None)
            if fresh is not None:
                verdict.checks.append(fresh)
    except LookupError as exc:
        raise ReconcileError(str(exc)) from None
    verdict.deletions_applied = [
        Check("source_deletion_applied", f"key {_joined(d.key)}, deleted by repair batch {after_repair}",
              "no row at the source", json.dumps(d.old_values, default=str), None, True) for d in deleted]
    run_id = str(uuid.uuid4())
    docs = None
    if warehouse_url is not None:
        from tidemark import expectations

        expected, docs = expectations.validate(spec, verdict.where, verdict.rows_source, root, warehouse_url,
                                               run_id)
        verdict.checks += [Check(e.check, e.subject, e.expected, e.actual, e.difference, e.passed) for e in expected]
    subject = f"batch {batch_id}" if batch_id else f"up to the watermark {window.hi}"
    line = verdict.summary(spec, batch_id or "(full table)")
    if after_repair is not None:
        line += f" (after repair batch {after_repair})"
    report = None
    if verdict.differences:
        report = write_report(root / "reports" / spec.name / run_id, spec, subject, verdict)
        line += f"; report: {report}"
    if docs is not None:
        line += f"; Data Docs: {docs}"
    with warehouse_conn, warehouse_conn.cursor() as cur:
        ledger.record_reconciliation(cur, run_id=run_id, pipeline=spec.name, batch_id=batch_id, attempt=attempt,
                                     window=window, checks=verdict.checks + verdict.deletions_applied,
                                     tolerance=spec.reconcile.tolerance,
                                     tolerance_reason=spec.reconcile.tolerance_reason, code_version=code_version,
                                     repair_batch=after_repair)
    return Outcome(run_id, batch_id, window, verdict, line, report, docs, after_repair)


def _joined(key: list[str]) -> str:
    return key[0] if len(key) == 1 else f"({', '.join(key)})"


def write_report(folder: Path, spec: PipelineSpec, subject: str, verdict: Verdict) -> Path:
    """differences.csv and differences.html in ``folder``; returns the HTML's path."""
    import html

    folder.mkdir(parents=True, exist_ok=True)
    first = verdict.differences[0]
    columns = list((first.source or first.target or {}).keys())  # every row has the compared columns
    (folder / "differences.csv").write_text(differences_csv(verdict.differences, columns))
    cells = []
    for d in verdict.differences:
        for side, row in (("source", d.source), ("target", d.target)):
            if row is None:
                continue
            tds = "".join(f'<td class="{"differs" if c in d.columns else ""}">{html.escape(str(row.get(c)))}</td>'
                          for c in columns)
            kind = d.kind if d.loaded_by is None else f"{d.kind} (loaded by batch {html.escape(d.loaded_by)})"
            cells.append(f"<tr><td>{html.escape(' '.join(map(str, d.key)))}</td><td>{kind}</td><td>{side}</td>{tds}</tr>")
    failed = "".join(f"<tr><td>{html.escape(c.check)}</td><td>{html.escape(c.subject)}</td>"
                     f"<td>{html.escape(str(c.expected))}</td><td>{html.escape(str(c.actual))}</td>"
                     f"<td>{html.escape(str(c.difference))}</td></tr>" for c in verdict.checks if not c.passed)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    gone = verdict.deleted_at_source
    deletions = (f"""<p><b>{len(gone)} rows deleted at the source after a committed batch loaded them</b> (kind
deleted_at_source; their old values are the target rows below). A repair deletes them from the target only when its
run sets apply_source_deletes, and keeps each one in tidemark_control.repair_deletions; otherwise they stay and
every reconciliation reports them.</p>""" if gone else "")
    (folder / "differences.html").write_text(f"""<!doctype html><meta charset="utf-8">
<title>Tidemark reconciliation: {html.escape(spec.name)}</title>
<style>body{{font-family:sans-serif}} td,th{{border:1px solid #ccc;padding:2px 6px}} .differs{{background:#fdd}}</style>
<h1>{html.escape(spec.target_table)}: {html.escape(subject)}</h1>
<p>{len(verdict.differences)} rows differ ({verdict.rows_source} source rows, {verdict.rows_target} target rows;
{verdict.rows_read_localising} rows read to localise them). CSV: differences.csv</p>{deletions}
<h2>Failed checks</h2><table><tr><th>check</th><th>subject</th><th>expected (source)</th><th>actual (target)</th>
<th>difference</th></tr>{failed}</table>
<h2>Rows</h2><table><tr><th>key</th><th>kind</th><th>side</th>{head}</tr>{''.join(cells)}</table>
""")
    return folder / "differences.html"

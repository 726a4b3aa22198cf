"""One pass per side: the row content and its per-range counts, hash totals and sums."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from tidemark.protocol.spec import PipelineSpec, quote

BUCKETS = 256  # key ranges of the first pass: 2M rows -> about 8,000 rows per range
LEAF_ROWS = 10_000  # a differing range with more rows than this is split again before its rows are read


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


def row_hash(columns: list[tuple[str, str]]) -> str:
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
    select = [bucket, *[quote(c) for c in group_cols], "count(*)", f"sum({row_hash(columns)})::text",
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

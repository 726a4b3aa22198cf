"""What the extract decides, apart from Spark: read ranges, its report, and the checks that keep a
wrong attempt from being sealed. ``tidemark.batch.extract.job`` wires these to Spark.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from tidemark.protocol.errors import Terminal, Transient
from tidemark.protocol.spec import PipelineSpec, key_text, quote
from tidemark.protocol.totals import Totals
from tidemark.protocol.window import Window, predicate

CURSOR_TYPES = ("timestamp with time zone", "timestamp without time zone", "bigint", "integer", "smallint")


class ExtractError(Terminal):
    """The extract read something it must not seal, and a re-run would read it again."""


class ExtractInterrupted(Transient):
    """The extract wrote something it must not seal, and a new attempt may not meet it again."""


def edges(lo: datetime | int | None, hi: datetime | int | None, parts: int) -> list[datetime | int]:
    """Evenly spaced cut points between the window's smallest and largest cursor values read."""
    if lo is None or hi is None or parts < 2 or lo == hi:
        return []
    if isinstance(lo, int) and isinstance(hi, int):
        return [lo + (hi - lo) * i // parts for i in range(1, parts)]
    return [lo + (hi - lo) * i / parts for i in range(1, parts)]  # type: ignore[operator]


def read_span(cur, spec: PipelineSpec, window: Window, relation: str,
              temporal: list[str] = ()) -> tuple[Any, Any, int, int]:
    """The smallest and largest cursor value in the window, its row count, and how many of its rows
    hold an infinite value in a ``temporal`` (date or timestamp) column, in one scan of the source
    (``relation``: the table, or a repair's subquery of it)."""
    cursor = quote(spec.cursor.column)
    infinite = " OR ".join(f"{quote(c)} IN ('infinity', '-infinity')" for c in temporal) or "false"
    cur.execute(f"SELECT min({cursor}), max({cursor}), count(*), count(*) FILTER (WHERE {infinite}) "
                f"FROM {relation} WHERE {predicate(spec, window)}")
    lo, hi, n, infinite_rows = cur.fetchone()
    return lo, hi, n, infinite_rows


NUMERIC, DATE, TIMESTAMP, TIMESTAMPTZ = 1700, 1082, 1114, 1184  # PostgreSQL's type oids


def kinds_of_columns(cur, spec: PipelineSpec) -> tuple[list[str], list[str]]:
    """The source table's numeric columns, and its date and timestamp columns other than the cursor
    (a window's cursor values are finite), by base type (domains included, arrays not): the values
    no record type carries exactly are NaN and infinity in the first, infinity in the second."""
    cur.execute(
        """SELECT a.attname, CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE a.atttypid END
             FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
            WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum""",
        (quote(spec.table),))
    columns = cur.fetchall()
    return ([name for name, base in columns if base == NUMERIC],
            [name for name, base in columns if base in (DATE, TIMESTAMP, TIMESTAMPTZ) and name != spec.cursor.column])


def unrepresentable(cur, spec: PipelineSpec, window: Window, relation: str, columns: list[str],
                    values: tuple[str, ...], sample: int = 5) -> list[str]:
    """One line per column whose rows in the window hold one of ``values`` (by their text form),
    e.g. ``amount: 2 row(s), e.g. key 7 NaN, key 9 NaN``. PostgreSQL holds NaN and infinite numerics
    and infinite dates and timestamps; no decimal holds the first (the JDBC read fails with a bare
    "Bad value for type BigDecimal"), and Spark reads the second as 9999-12-31 or year 1 (a silent
    change): both are named by key instead."""
    keys = ", ".join(quote(k) for k in spec.primary_key)
    listed = ", ".join(f"'{v}'" for v in values)  # our own constants
    found = []
    for name in columns:
        where = f"{predicate(spec, window)} AND {quote(name)}::text IN ({listed})"
        cur.execute(f"SELECT count(*) FROM {relation} WHERE {where}")
        n = cur.fetchone()[0]
        if n:
            cur.execute(f"SELECT {keys}, {quote(name)}::text FROM {relation} WHERE {where} "
                        f"ORDER BY {keys} LIMIT {int(sample)}")
            shown = ", ".join(f"key {key_text(r[:-1])} {r[-1]}" for r in cur.fetchall())
            found.append(f"{name}: {n} row(s), e.g. {shown}{' ...' if n > sample else ''}")
    return found


NAN_OR_INFINITE = ("NaN", "Infinity", "-Infinity")  # numeric's text forms
INFINITE = ("infinity", "-infinity")  # date's and timestamp's


def unrepresentable_error(tag: str, spec: PipelineSpec, found: list[str], *, temporal: bool) -> str:
    """Why the extract stops, which rows, and the fix that works (the window stays until then)."""
    what = ("infinite dates or timestamps, which Spark would load as 9999-12-31 or year 1 (a silent change)"
            if temporal else "NaN or infinite numerics, which no decimal can carry (the JDBC read refuses them; "
            "allow_non_finite_numbers is for JSON events, not a source table)")
    return (f"{tag}: {spec.table} holds {what} in this window ({'; '.join(found)}); nothing of this attempt is "
            "sealed: correct those rows at the source (a real value, or NULL where the column allows it) and a "
            "new attempt of the same window loads them")


def cursor_histogram(cur, spec: PipelineSpec) -> list[datetime | int] | None:
    """The source's histogram bounds of the cursor column (None: never analysed, or not readable)."""
    schema, _, table = spec.table.rpartition(".")
    cur.execute(
        """SELECT s.histogram_bounds::text, format_type(a.atttypid, NULL) FROM pg_stats s
             JOIN pg_attribute a ON a.attrelid = to_regclass(%s) AND a.attname = s.attname
            WHERE s.schemaname = %s AND s.tablename = %s AND s.attname = %s LIMIT 1""",
        (quote(spec.table), schema or "public", table, spec.cursor.column),
    )
    row = cur.fetchone()
    if row is None or row[0] is None or row[1] not in CURSOR_TYPES:
        return None
    cur.execute(f"SELECT unnest(%s::{row[1]}[])", (row[0],))  # the type is one of CURSOR_TYPES
    return [v for (v,) in cur.fetchall()]


def balanced_edges(bounds: list[datetime | int] | None, lo: datetime | int | None, hi: datetime | int | None,
                   parts: int) -> list[datetime | int]:
    """Cut points that give each parallel read about as many rows: taken from the source's own
    histogram of the cursor column (``pg_stats.histogram_bounds``, equally populated buckets)
    where it covers the range read; evenly spaced (``edges``) where it does not, e.g. a window of
    rows newer than the table's last ANALYZE."""
    if lo is None or hi is None or parts < 2 or lo == hi:
        return []
    inside = sorted(b for b in bounds or () if lo < b < hi)
    if len(inside) < parts:
        return edges(lo, hi, parts)
    return [inside[len(inside) * i // parts] for i in range(1, parts)]


def report(counted: Totals, partitions: int) -> dict[str, dict[str, int]]:
    """Per-partition rows and checksums for END, every partition present (0 rows where none went)."""
    out = {str(p): {"rows": 0, "checksum": 0} for p in range(partitions)}
    for p, t in counted.items():
        if not 0 <= p < partitions:
            raise ExtractError(f"records counted on partition {p}, the topic has {partitions}")
        out[str(p)] = {"rows": t["rows"], "checksum": t["checksum"]}
    return out


def check_read_range(tag: str, window: Window, counted: Totals) -> None:
    """Every cursor value read lies inside the window (exact at both bounds), or nothing is sealed."""
    if not any(t["rows"] for t in counted.values()):
        return
    lo = min(t["lo"] for t in counted.values() if t["rows"])
    hi = max(t["hi"] for t in counted.values() if t["rows"])
    if not window.holds_cursors(lo, hi):
        raise ExtractError(f"{tag}: read cursor values {lo}..{hi} outside the window {window}; nothing is sealed")


def check_offsets(tag: str, before: dict[int, int], after: dict[int, int], written: dict[str, Any],
                  partitions: int) -> None:
    """Each partition's end offset moved by exactly the rows counted for it: no other writer, no
    retried write. Otherwise the attempt must not be sealed (a re-run writes a new attempt)."""
    moved = {p: after.get(p, 0) - before.get(p, 0) for p in range(partitions)}
    wrong = {p: (written[str(p)]["rows"], moved[p]) for p in moved if moved[p] != written[str(p)]["rows"]}
    if wrong:
        raise ExtractInterrupted(
            f"{tag}: Kafka offsets moved by other amounts than rows written (partition: counted, moved) {wrong}; "
            "another writer on the topic or a retried write; this attempt must not be sealed")

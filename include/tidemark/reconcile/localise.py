"""Localisation: the differing key ranges read again, down to the rows, and their report."""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from tidemark.protocol.spec import PipelineSpec, quote
from tidemark.reconcile.passes import key_bounds, row_hash
from tidemark.reconcile.verdict import Difference, Verdict


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


def localise_range(spec: PipelineSpec, source_cur, target_cur, where: str, columns: list[tuple[str, str]], kind: str, lo: Any,
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
                    localise_range(spec, source_cur, target_cur, where, columns, kind, a, z, max(src[0], tgt[0]),
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
    cur.execute(f"SELECT count(*), coalesce(sum({row_hash(columns)}), 0)::text FROM {quote(table)} "
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

"""END totals of records in Arrow form: per partition, the row count and the exact sum of 64-bit row hashes.

The extract computes them on Spark's executors as it writes (``TotalsParam`` accumulator) and the
sink as it stages; both hash with Spark's ``xxhash64(key, value)``. This module needs only
pyarrow, so the extract can ship it to executors by value (nothing to install on a cluster).
"""

from __future__ import annotations

from typing import Any

# {partition: {"rows": int, "checksum": int, "lo": cursor or None, "hi": cursor or None}}
Totals = dict[int, dict[str, Any]]


def arrow_totals(batch, cursor: str | None = None) -> Totals:
    """Totals of a pyarrow table or record batch with ``partition`` and ``row_hash`` (int64) columns,
    and the smallest and largest value of the ``cursor`` column if one is named."""
    import pyarrow as pa
    import pyarrow.compute as pc

    hashes = batch.column("row_hash")
    # Exact sums from int64 arithmetic: the high and low 32-bit halves are summed apart.
    columns = {
        "partition": batch.column("partition"),
        "high": pc.shift_right(hashes, 32),
        "low": pc.bit_wise_and(hashes, pa.scalar(0xFFFFFFFF, pa.int64())),
    }
    aggregates = [("high", "count"), ("high", "sum"), ("low", "sum")]
    if cursor:
        columns["cursor"] = batch.column(cursor)
        aggregates += [("cursor", "min"), ("cursor", "max")]
    out: Totals = {}
    for g in pa.table(columns).group_by("partition").aggregate(aggregates).to_pylist():
        out[g["partition"]] = {
            "rows": g["high_count"], "checksum": (g["high_sum"] << 32) + g["low_sum"],
            "lo": g.get("cursor_min"), "hi": g.get("cursor_max"),
        }
    return out


def add_totals(into: Totals, more: Totals) -> Totals:
    """Add ``more`` to ``into`` (in place) and return it."""
    for p, t in more.items():
        have = into.get(p)
        if have is None:
            into[p] = dict(t)
            continue
        have["rows"] += t["rows"]
        have["checksum"] += t["checksum"]
        have["lo"] = min((v for v in (have["lo"], t["lo"]) if v is not None), default=None)
        have["hi"] = max((v for v in (have["hi"], t["hi"]) if v is not None), default=None)
    return into


class TotalsParam:
    """The ``AccumulatorParam`` of a Spark accumulator of ``Totals`` (duck-typed: no pyspark import).

    Exact when each task's update counts once: the extract runs with ``spark.task.maxFailures=1``
    and adds in its final (result) stage."""

    def zero(self, value: Totals) -> Totals:
        return {}

    def addInPlace(self, value1: Totals, value2: Totals) -> Totals:
        return add_totals(value1, value2)

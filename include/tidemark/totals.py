"""END totals of records in Arrow form: per partition, the row count and the exact sum of 64-bit row hashes.

The extract computes them in Spark's JVM as it writes (``tidemark.Tally``, read with ``from_tally``)
and the sink as it stages (``arrow_totals``); both hash with Spark's ``xxhash64(key, value)``. This module needs only
pyarrow: no database, no Spark.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
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


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def from_tally(text: str, timestamps: bool) -> Totals:
    """The totals the extract's JVM counted (``tidemark.Tally``, one line per partition: rows, sums of
    the hashes' high and low 32 bits, smallest and largest cursor as a long, microseconds since
    the epoch when ``timestamps``)."""
    out: Totals = {}
    for line in text.splitlines():
        p, rows, high, low, lo, hi = map(int, line.split())
        cursor = (lambda v: _EPOCH + timedelta(microseconds=v)) if timestamps else (lambda v: v)
        out[p] = {"rows": rows, "checksum": (high << 32) + low, "lo": cursor(lo), "hi": cursor(hi)}
    return out

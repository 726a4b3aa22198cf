"""END totals of records in Arrow form: per partition, the row count and the exact sum of 64-bit row hashes.

The extract computes them in Spark's JVM as it writes (``tidemark.Tally``, read with ``from_tally``)
and the sink as it stages (``arrow_totals``); both hash with Spark's ``xxhash64(key, value)``. This module needs only
pyarrow: no database, no Spark.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, NamedTuple

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


class Mismatch(NamedTuple):
    """Where what the sink staged differs from the extract's sealed totals, partition by partition,
    each with its likely cause, and the one next step that fits them all."""
    findings: list[str]
    next_step: str

    def __bool__(self) -> bool:
        return bool(self.findings)


# The extract checks that each partition's offsets moved by exactly the rows it wrote, so a record
# more than it wrote was written by someone else; fewer means records vanished between them.
_NEXT = {
    "more": ("find the extra records on {topic} after the extract's offsets (a producer other than the extract "
             "writes there, or a record was sent again); revoke that producer's rights"),
    "fewer": ("check the topic {topic}'s retention and that nothing deleted records from it; a new attempt writes the "
              "window again"),
    "altered": "check who else writes to {topic}: a record of the batch was replaced with other content",
}


def staged_mismatch(expected: dict[int, tuple[int, int]], staged: dict[int, tuple[int, int]]) -> Mismatch:
    """Compare (rows, checksum) per partition: the extract's sealed totals against the stage's."""
    findings, kinds = [], []
    for p in sorted(set(expected) | set(staged)):
        (rows, checksum), (got_rows, got_checksum) = expected.get(p, (0, 0)), staged.get(p, (0, 0))
        if (rows, checksum) == (got_rows, got_checksum):
            continue
        numbers = f"extract rows={rows} checksum={checksum}, staged rows={got_rows} checksum={got_checksum}"
        if got_rows > rows:
            kinds.append("more")
            findings.append(f"partition {p}: {got_rows - rows} record(s) more than the extract wrote, a record "
                            f"sent twice or by another producer ({numbers})")
        elif got_rows < rows:
            kinds.append("fewer")
            findings.append(f"partition {p}: {rows - got_rows} record(s) the extract wrote never reached the stage "
                            f"({numbers})")
        else:
            kinds.append("altered")
            findings.append(f"partition {p}: as many records as the extract wrote, other content ({numbers})")
    steps = [_NEXT[k] for k in ("more", "altered", "fewer") if k in kinds]
    return Mismatch(findings, "; ".join(steps))

"""What the extract decides, apart from Spark: read ranges, its report, and the checks that keep a
wrong attempt from being sealed. ``spark_jobs/extract_window.py`` only wires these to Spark.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from tidemark.totals import Totals
from tidemark.window import Window


class ExtractError(RuntimeError):
    """The extract read or wrote something it must not seal; ``transient`` if a re-run may heal it."""

    def __init__(self, message: str, *, transient: bool = False):
        super().__init__(message)
        self.transient = transient


def edges(lo: datetime | int | None, hi: datetime | int | None, parts: int) -> list[datetime | int]:
    """Evenly spaced cut points between the window's smallest and largest cursor values read."""
    if lo is None or hi is None or parts < 2 or lo == hi:
        return []
    if isinstance(lo, int) and isinstance(hi, int):
        return [lo + (hi - lo) * i // parts for i in range(1, parts)]
    return [lo + (hi - lo) * i / parts for i in range(1, parts)]  # type: ignore[operator]


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
        raise ExtractError(
            f"{tag}: Kafka offsets moved by other amounts than rows written (partition: counted, moved) {wrong}; "
            "another writer on the topic or a retried write; this attempt must not be sealed", transient=True)

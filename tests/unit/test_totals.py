"""END totals over Arrow batches: exact 64-bit hash sums, counts and cursor range per partition."""

from datetime import datetime, timezone

import pyarrow as pa

from tidemark.protocol.totals import arrow_totals, from_tally

HASHES = [2**63 - 1, -(2**63), -1, 0, 1, 123456789012345678, -98765432109876543]
PARTITIONS = [0, 1, 0, 2, 1, 0, 2]
STAMPS = [datetime(2026, 1, d, tzinfo=timezone.utc) for d in (5, 1, 9, 3, 2, 7, 4)]


def batch(lo: int = 0, hi: int = len(HASHES)) -> pa.RecordBatch:
    return pa.record_batch({
        "partition": pa.array(PARTITIONS[lo:hi], pa.int32()), "row_hash": pa.array(HASHES[lo:hi], pa.int64()),
        "_cursor": pa.array(STAMPS[lo:hi], pa.timestamp("us", tz="UTC")),
    })


def expected(p: int) -> dict:
    mine = [i for i, q in enumerate(PARTITIONS) if q == p]
    return {"rows": len(mine), "checksum": sum(HASHES[i] for i in mine),
            "lo": min(STAMPS[i] for i in mine), "hi": max(STAMPS[i] for i in mine)}


def test_sums_are_exact_python_integers_with_extreme_hashes():
    got = arrow_totals(batch(), cursor="_cursor")
    assert got == {p: expected(p) for p in (0, 1, 2)}
    assert got[0]["checksum"] == 2**63 - 1 - 1 + 123456789012345678  # beyond int64: no wrap-around


def test_without_a_cursor_the_range_is_none():
    assert arrow_totals(batch())[1] == {"rows": 2, "checksum": -(2**63) + 1, "lo": None, "hi": None}


def test_the_jvm_tally_reads_back_as_the_totals_arrow_gives():
    """tidemark.Tally (the extract's JVM side) sums the high and low 32 bits of each hash apart, as
    arrow_totals does, and writes one line per partition; from_tally rebuilds the exact sums."""
    lines = []
    for p in (0, 1, 2):
        mine = [i for i, q in enumerate(PARTITIONS) if q == p]
        micros = [int((STAMPS[i] - datetime(1970, 1, 1, tzinfo=timezone.utc)).total_seconds()) * 10**6 for i in mine]
        high = sum(HASHES[i] >> 32 for i in mine)
        low = sum(HASHES[i] & 0xFFFFFFFF for i in mine)
        lines.append(f"{p} {len(mine)} {high} {low} {min(micros)} {max(micros)}")
    assert from_tally("\n".join(lines) + "\n", timestamps=True) == arrow_totals(batch(), cursor="_cursor")
    assert from_tally("0 1 0 7 5 9\n", timestamps=False) == {0: {"rows": 1, "checksum": 7, "lo": 5, "hi": 9}}

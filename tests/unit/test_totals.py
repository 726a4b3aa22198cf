"""END totals over Arrow batches: exact 64-bit hash sums, counts and cursor range per partition."""

from datetime import datetime, timezone

import pyarrow as pa

from tidemark.totals import TotalsParam, add_totals, arrow_totals

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


def test_batches_added_in_any_order_give_the_totals_of_the_whole():
    param = TotalsParam()
    for order in ([(0, 3), (3, 7)], [(3, 7), (0, 3)], [(0, 1), (1, 2), (2, 7)]):
        acc = param.zero({})
        for lo, hi in order:
            acc = param.addInPlace(acc, arrow_totals(batch(lo, hi), cursor="_cursor"))
        assert acc == {p: expected(p) for p in (0, 1, 2)}


def test_adding_keeps_partitions_apart_and_ignores_missing_ranges():
    into = {0: {"rows": 1, "checksum": 5, "lo": None, "hi": None}}
    add_totals(into, {0: {"rows": 2, "checksum": -7, "lo": 3, "hi": 9}, 1: {"rows": 1, "checksum": 1, "lo": 4, "hi": 4}})
    assert into == {0: {"rows": 3, "checksum": -2, "lo": 3, "hi": 9}, 1: {"rows": 1, "checksum": 1, "lo": 4, "hi": 4}}

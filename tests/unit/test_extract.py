"""What the extract decides (tidemark.batch.extract): read ranges, its report, and what it refuses to seal."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tidemark.batch.extract import ExtractError, ExtractInterrupted, check_offsets, check_read_range, edges, report
from tidemark.protocol.errors import Terminal, Transient
from tidemark.protocol.window import Bound, Window

UTC = timezone.utc
T0 = datetime(2026, 1, 1, tzinfo=UTC)
WINDOW = Window(Bound(T0), Bound(T0 + timedelta(days=1)))


def test_edges_cut_the_read_range_evenly_and_not_at_all_when_there_is_nothing_to_cut():
    assert edges(0, 100, 4) == [25, 50, 75]
    assert edges(T0, T0 + timedelta(hours=4), 4) == [T0 + timedelta(hours=h) for h in (1, 2, 3)]
    assert edges(None, None, 4) == [] and edges(5, 5, 4) == [] and edges(0, 100, 1) == []


def test_the_report_has_every_partition_and_refuses_one_the_topic_lacks():
    counted = {1: {"rows": 2, "checksum": -(1 << 64), "lo": T0, "hi": T0}}
    assert report(counted, 3) == {"0": {"rows": 0, "checksum": 0}, "1": {"rows": 2, "checksum": -(1 << 64)},
                                  "2": {"rows": 0, "checksum": 0}}
    with pytest.raises(ExtractError, match="records counted on partition 3, the topic has 3"):
        report({3: {"rows": 1, "checksum": 1}}, 3)


def _counted(lo, hi, rows=1):
    return {0: {"rows": rows, "checksum": 0, "lo": lo, "hi": hi}}


def test_the_read_range_check_is_exact_at_both_bounds():
    check_read_range("t", WINDOW, _counted(T0 + timedelta(microseconds=1), WINDOW.hi.cursor))
    check_read_range("t", WINDOW, _counted(None, None, rows=0))  # nothing read: nothing to check
    with pytest.raises(ExtractError, match="outside the window"):
        check_read_range("t", WINDOW, _counted(T0, T0 + timedelta(hours=1)))  # lo itself is loaded already
    with pytest.raises(ExtractError, match="outside the window"):
        check_read_range("t", WINDOW, _counted(T0 + timedelta(hours=1), WINDOW.hi.cursor + timedelta(microseconds=1)))
    keyed = Window(Bound(T0, (7,)), WINDOW.hi)
    check_read_range("t", keyed, _counted(T0, T0))  # rows at lo with greater keys belong to a keyed bound


def test_offsets_that_moved_by_other_amounts_than_counted_refuse_to_seal_transiently():
    written = {"0": {"rows": 3}, "1": {"rows": 0}}
    check_offsets("t", {0: 10, 1: 5}, {0: 13, 1: 5}, written, 2)
    with pytest.raises(ExtractInterrupted, match=r"\(partition: counted, moved\) \{1: \(0, 2\)\}") as err:
        check_offsets("t", {0: 10, 1: 5}, {0: 13, 1: 7}, written, 2)
    assert isinstance(err.value, Transient) and not isinstance(err.value, Terminal)


def test_balanced_edges_follow_the_source_histogram_and_fall_back_to_even_cuts_where_it_says_nothing():
    from tidemark.batch.extract import balanced_edges

    skewed = [0, 1, 2, 3, 4, 5, 6, 7, 90, 100]  # most rows at small ids: the cuts follow them
    assert balanced_edges(skewed, 0, 100, 4) == [3, 5, 7]
    assert balanced_edges(skewed, 3, 100, 2) == [6]  # only the bounds inside the range read count
    assert balanced_edges([T0 + timedelta(hours=h) for h in range(10)], T0, T0 + timedelta(hours=9), 3) == [
        T0 + timedelta(hours=3), T0 + timedelta(hours=6)]
    assert balanced_edges(None, 0, 100, 4) == [25, 50, 75]  # no statistics (never analysed)
    assert balanced_edges(skewed, 200, 400, 4) == [250, 300, 350]  # rows newer than the last ANALYZE
    assert balanced_edges(skewed, 5, 5, 4) == [] and balanced_edges(skewed, 0, 100, 1) == []

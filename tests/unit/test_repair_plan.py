"""Repair planning apart from the databases: keys, the window, the key filter's SQL and its checks."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest

from tidemark.batch import repair
from tidemark.protocol.spec import PipelineSpec
from tidemark.protocol.window import Bound, Window

SPEC = {"name": "p", "table": "public.src", "primary_key": ["account_id", "day"],
        "cursor": {"kind": "timestamp", "column": "updated_at"}, "target_table": "public.tgt", "safe_lag": "PT2S"}


def test_keys_are_their_columns_text_once_each_in_the_order_found():
    diffs = [SimpleNamespace(key=(7, "2026-11-01")), SimpleNamespace(key=(3, "x")), SimpleNamespace(key=(7, "2026-11-01"))]
    assert repair.keys_of(diffs) == [["7", "2026-11-01"], ["3", "x"]]


def test_the_repair_window_reaches_back_to_the_start_and_never_moves_the_watermark():
    spec = PipelineSpec.model_validate(SPEC)
    hi = Bound.from_json({"cursor": "2026-11-23T00:00:00+00:00", "pk": None})
    window = repair.window_for(spec, Window(Bound.from_json({"cursor": "2026-11-22T00:00:00+00:00", "pk": None}), hi))
    assert window.lo.cursor == spec.start and window.hi == hi and window.backfill


def test_the_repair_of_a_backfill_before_the_start_starts_where_the_backfill_did():
    """Found by the browser journey (issue 29): a backfill of days before initial_watermark, repaired,
    planned the window (start, backfill's hi] whose lo is after its hi, and begin failed on it."""
    spec = PipelineSpec.model_validate({**SPEC, "initial_watermark": "2026-10-06T00:00:00+00:00"})
    backfill = Window.from_json({"lo": {"cursor": "2026-10-03T23:59:59.999999+00:00", "pk": None},
                                 "hi": {"cursor": "2026-10-04T23:59:59.999999+00:00", "pk": None}, "backfill": True})
    window = repair.window_for(spec, backfill)
    assert (window.lo, window.hi, window.backfill) == (backfill.lo, backfill.hi, True)
    assert Window.from_json(window.to_json()) == window  # what begin reads back from the plan
    keyed = Window(Bound(datetime(2026, 10, 3, tzinfo=timezone.utc), ("7",)), backfill.hi, backfill=True)
    assert repair.window_for(spec, keyed).lo == keyed.lo  # a lower bound inside a cursor value keeps its key


def test_the_key_filter_casts_each_value_to_its_column_type_and_quotes_what_it_carries():
    sql = repair.key_filter(["account_id", "day"], ["bigint", "character(3)"], [["1", "o'clock"]])
    assert sql == ('("account_id", "day") IN (SELECT (k->>0)::bigint, (k->>1)::character(3) FROM '
                   'jsonb_array_elements(\'[["1", "o\'\'clock"]]\'::jsonb) k)')


@pytest.mark.parametrize("columns, types, keys, message", [
    (["id"], ["bigint; DROP TABLE x"], [["1"]], "is not one a repair can cast to"),
    (["id"], ["bigint"], [["1", "2"]], "is not 1 text value"),
    (["id"], ["bigint"], [[1]], "is not 1 text value"),
    (["id", "day"], ["bigint"], [["1"]], "do not match"),
])
def test_the_key_filter_refuses_what_it_cannot_say_exactly(columns, types, keys, message):
    with pytest.raises(repair.RepairError, match=message):
        repair.key_filter(columns, types, keys)


def test_a_keys_document_must_name_the_pipelines_key(tmp_path):
    spec = PipelineSpec.model_validate(SPEC)
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"columns": ["id"], "types": ["bigint"], "keys": [["1"]]}))
    with pytest.raises(repair.RepairError, match=r"not pipeline p's key \['account_id', 'day'\]"):
        repair.read_document(path, spec)
    path.write_text(json.dumps({"columns": ["account_id", "day"], "types": ["bigint", "date"], "keys": [["1", "2026-11-01"]]}))
    assert repair.read_document(path, spec)["keys"] == [["1", "2026-11-01"]]
    path.write_text("{not json")
    with pytest.raises(repair.RepairError, match="keys.json"):
        repair.read_document(path, spec)


def test_nothing_to_repair_or_too_much_is_said_before_anything_is_planned():
    spec = PipelineSpec.model_validate(SPEC)
    window = repair.window_for(spec, Window(Bound(spec.start), Bound(spec.start)))
    with pytest.raises(repair.RepairError, match="no differing rows"):
        repair.plan(spec, None, reconcile_run="r", repaired_batch=None, repaired=window, differences=[])
    many = [SimpleNamespace(key=(i, "d")) for i in range(repair.MAX_KEYS + 1)]
    with pytest.raises(repair.RepairError, match="backfill run instead"):
        repair.plan(spec, None, reconcile_run="r", repaired_batch=None, repaired=window, differences=many)


def _diff(key, kind):
    return SimpleNamespace(key=(key,), kind=kind)


DIFFS = [_diff(10, "changed"), _diff(5, "missing"), _diff(9999, "extra"), _diff(30, "deleted_at_source"),
         _diff(31, "deleted_at_source")]


def test_rows_deleted_at_the_source_are_re_extracted_and_deletable_only_when_the_run_asks():
    assert repair.repair_keys(DIFFS) == [["10"], ["5"], ["9999"]]
    assert repair.deletes(DIFFS) == {"apply_source_deletes": False, "extra": [["9999"]],
                                     "deleted_at_source": [["30"], ["31"]]}
    assert repair.repair_keys(DIFFS, apply_source_deletes=True) == [["10"], ["5"], ["9999"], ["30"], ["31"]]
    assert repair.deletes(DIFFS, True)["apply_source_deletes"] is True


def test_a_repair_of_deletions_alone_without_the_flag_is_refused_with_the_next_step():
    spec = PipelineSpec.model_validate(SPEC)
    window = repair.window_for(spec, Window(Bound(spec.start), Bound(spec.start)))
    with pytest.raises(repair.RepairError, match="2 differing row.s. were deleted at the source.*"
                                                 "repair=true and apply_source_deletes=true"):
        repair.plan(spec, None, reconcile_run="r", repaired_batch=None, repaired=window, differences=DIFFS[3:])


@pytest.mark.parametrize("record", ["plan", "repair"])
def test_the_ledger_refuses_to_record_a_window_whose_lo_is_after_its_hi(record):
    """Issue 29: such a window was recorded, and every later step failed reading it back."""
    from tidemark.ledger import batches

    spec = PipelineSpec.model_validate(SPEC)
    lo, hi = (Bound(datetime(2026, 10, d, tzinfo=timezone.utc)) for d in (6, 4))
    with pytest.raises(ValueError, match=r"batch p:r: refusing to plan window .* lo .* is after hi"):
        if record == "plan":  # the check comes before any SQL: no cursor is needed to reach it
            batches.record_plan(None, spec, "p:r", "r", Window(lo, hi))
        else:
            batches.record_repair_plan(None, spec, "p:r", Window(lo, hi, backfill=True), [["1"]], None, "r")

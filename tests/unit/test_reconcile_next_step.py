"""A failed reconciliation's last line names the next step that works for what failed."""

from __future__ import annotations

from tidemark.reconcile import Check, Difference, Verdict
from tidemark_airflow.reconcile import failure


def _verdict(*failed: str) -> Verdict:
    checks = [Check("row_count", "", "3", "3", None, True)]
    checks += [Check(name, f"{name} subject: key 7 NULL", "0", "1", "1", False) for name in failed]
    return Verdict(checks, [], 3, 3)


def test_rows_no_window_holds_get_their_keys_and_the_cursor_fix_not_the_report():
    text = failure("t batch b: 1 of 2 checks failed (unreachable_rows)", _verdict("unreachable_rows"), "b")
    assert text.startswith("t batch b: 1 of 2 checks failed (unreachable_rows): unreachable_rows subject: key 7 NULL")
    assert "Next: set the cursor of those source rows to now()" in text and "open the report" not in text


def test_any_other_failure_points_at_the_report_and_the_rerun():
    for failed in (("hash_total",), ("unreachable_rows", "hash_total")):
        text = failure("t batch b: checks failed", _verdict(*failed), "b")
        assert "Next: open the report" in text and "batch_id=b" in text


def _with_deletions(*kinds: str) -> Verdict:
    verdict = _verdict("row_count")
    verdict.differences = [Difference((i,), kind, None, {}) for i, kind in enumerate(kinds)]
    return verdict


def test_rows_deleted_at_the_source_point_at_apply_source_deletes_or_restoring_them():
    text = failure("t batch b: 2 rows differ", _with_deletions("deleted_at_source", "deleted_at_source"), "b", "p")
    assert ("Next: 2 row(s) were deleted at the source after a committed batch loaded them" in text
            and "run tidemark_reconcile_p with batch_id=b, repair=true and apply_source_deletes=true" in text and "restore them at the source" in text)
    assert "open the report, find why" not in text
    full = failure("t batch (full table): 1 rows differ", _with_deletions("deleted_at_source"), None)
    assert "scope=full, repair=true and apply_source_deletes=true" in full


def test_deletions_beside_other_differences_name_both_next_steps():
    text = failure("t batch b: 2 rows differ", _with_deletions("deleted_at_source", "changed"), "b")
    assert "Next: 1 row(s) were deleted at the source" in text and "for the other 1 row(s): open the report" in text


def test_a_verdict_that_compared_nothing_says_so_and_what_will_compare():
    """Issue 52: a proof over no rows while the source has rows is a failure, never 'OK'."""
    verdict = Verdict([Check("row_count", "", "0", "0", None, True),
                       Check("compared_rows", "rows of the window compared", "at least 1", "0",
                             "every one of the 50 key(s) changed at the source since the batch read it", False)],
                      [], 0, 0, moved_keys=50)
    assert not verdict.passed
    text = failure("t batch b: 1 of 2 checks failed (compared_rows)", verdict, "b")
    assert "every one of the 50 key(s) changed" in text and "Next: every key of the batch changed" in text
    assert "open the report" not in text


def test_a_starved_key_is_named_with_how_often_it_changed_and_the_next_step():
    from tidemark.protocol.spec import PipelineSpec
    from tidemark.reconcile import starved_keys
    from tidemark_airflow.reconcile import NEXT_STARVED

    spec = PipelineSpec.model_validate({"name": "p", "table": "public.t", "primary_key": ["id"], "partitions": 1,
                                        "cursor": {"kind": "timestamp", "column": "updated_at"},
                                        "target_table": "public.t_tgt", "safe_lag": "PT2S"})
    now = {"7": ("2026-11-29 01:00:03", None), "8": ("2026-11-29 01:00:03", "2026-11-28 00:00:00")}
    before = {"7": ["2026-11-29 01:00:01", "2026-11-29 01:00:02"]}  # 8 was carried by an earlier batch
    checks = starved_keys(spec, now, before, 3)
    assert [(c.check, c.subject, c.passed) for c in checks] == [("starved_key", "id 7", False)]
    assert "changed at least 3 time(s)" in checks[0].difference and "no version" in checks[0].actual
    verdict = Verdict([Check("row_count", "", "0", "0", None, True), *checks], [], 0, 0, moved_keys=1)
    text = failure("t batch b: 1 of 2 checks failed (starved_key)", verdict, "b")
    assert "id 7 left out of all 3" in text and text.endswith(NEXT_STARVED)


def test_a_mismatch_line_names_up_to_five_differing_keys_and_the_repair_form_values():
    """Issue 53 item 6: the reconciliation's failure line named neither the differing key nor the repair."""
    verdict = _verdict("hash_total")
    verdict.differences = [Difference((k,), "changed", {}, {}, ["amount"]) for k in range(1, 8)]
    text = failure("t batch b: 7 rows differ", verdict, "b")
    assert "differing key(s): 1 (amount changed); 2 (amount changed)" in text and "5 (amount changed) and 2 more" in text
    assert "6 (amount changed)" not in text
    assert "run it with batch_id=b and repair=true" in text
    full = failure("t batch (full table): 1 rows differ", _with_deletions("missing"), None)
    assert "differing key(s): 0 (missing)" in full and "scope=full and repair=true" in full

"""Deletions are never silent: how a verdict words rows deleted at the source, and the repair's
deletions applied, apart from the databases."""

from __future__ import annotations

from tidemark.protocol.spec import PipelineSpec
from tidemark.reconcile import Check, Difference, Verdict, deletion_check, differences_csv, write_report

SPEC = PipelineSpec.model_validate({
    "name": "p", "table": "public.src", "primary_key": ["id"], "cursor": {"kind": "timestamp", "column": "updated_at"},
    "target_table": "public.tgt", "safe_lag": "PT2S"})
OLD = {"id": "30", "amount": "11.10"}


def _deleted(key: int) -> Difference:
    return Difference((key,), "deleted_at_source", None, {"id": str(key), "amount": "11.10"}, loaded_by="p:run-1")


def _verdict(differences: list[Difference], *failed: Check) -> Verdict:
    checks = [Check("row_count", "", "98", "100", "2", False), *failed]
    return Verdict(checks + [deletion_check(d) for d in differences if d.kind == "deleted_at_source"], differences,
                   98, 100)


def test_a_deletion_at_the_source_is_named_as_such_never_as_extra_and_fails_the_verdict():
    verdict = _verdict([_deleted(30), _deleted(31), Difference((9999,), "extra", None, OLD)])
    line = verdict.summary(SPEC, "p:run-1")
    assert not verdict.passed
    assert line.startswith("public.tgt batch p:run-1: 3 rows differ: 2 deleted at the source after loading, 1 extra; "
                           "3 of 3 checks failed (deleted_at_source, row_count)"), line
    assert [d.key for d in verdict.deleted_at_source] == [(30,), (31,)]


def test_each_deletion_is_a_failing_result_with_its_key_the_batch_and_the_old_values():
    check = deletion_check(_deleted(30))
    assert check == Check("deleted_at_source", "key 30, loaded by batch p:run-1", "no row at the source",
                          '{"id": "30", "amount": "11.10"}', "deleted at the source after it was loaded", False)


def test_a_repair_that_applied_deletions_says_so_never_plain_reconciled():
    applied = [Check("source_deletion_applied", f"key {k}, deleted by repair batch r", "no row at the source", "{}",
                     None, True) for k in (30, 31)]
    verdict = Verdict([Check("row_count", "", "98", "98", None, True)], [], 98, 98, deletions_applied=applied)
    assert verdict.passed
    assert verdict.summary(SPEC, "b").startswith("public.tgt batch b: reconciled after applying 2 source deletions, "
                                                 "98 rows, 1 checks passed")
    verdict.deletions_applied = applied[:1]
    assert "reconciled after applying 1 source deletion, 98 rows" in verdict.summary(SPEC, "b")
    verdict.deletions_applied = []
    assert "b: reconciled, 98 rows" in verdict.summary(SPEC, "b")


def test_the_report_lists_the_deleted_rows_with_the_target_values_and_says_what_a_repair_does(tmp_path):
    differences = [_deleted(30), Difference((9999,), "extra", None, OLD)]
    csv = differences_csv(differences, ["id", "amount"])
    assert "30,deleted_at_source,target,,30,11.10" in csv and "9999,extra,target,,30,11.10" in csv
    html = write_report(tmp_path, SPEC, "batch p:run-1", _verdict(differences)).read_text()
    assert "1 rows deleted at the source after a committed batch loaded them" in html
    assert "deleted_at_source (loaded by batch p:run-1)" in html and "apply_source_deletes" in html

"""Repair runs: the keys a reconciliation localised are re-loaded through BEGIN/END as a new batch,
then the reconciliation passes and the evidence keeps both verdicts (real PostgreSQL, Kafka, Spark).
"""

from __future__ import annotations

import json

import psycopg2
import psycopg2.errors
import pytest

from tidemark import reconcile
from tidemark.batch import repair
from tidemark.spark import jobs
from tidemark_workshop.stack.batchrun import PAYMENTS_DDL, insert_payments, make_pipeline

RECONCILE = {"control_totals": [{"columns": ["amount"], "group_by": ["currency"]}]}


def _reconcile(pipe, root, **kwargs) -> reconcile.Outcome:
    src, wh = pipe.src(), pipe.wh()
    try:
        return reconcile.run(pipe.spec, src, wh, root, code_version="test", **kwargs)
    finally:
        src.close()
        wh.close()


def _verdicts(pipe, batch_id):
    return pipe.query_wh(
        "SELECT run_id::text, bool_and(verdict = 'pass') FROM tidemark_control.reconciliation_results "
        "WHERE batch_id = %s GROUP BY run_id ORDER BY min(id)", (batch_id,))


def test_a_repair_batch_reloads_exactly_the_differing_keys_and_the_second_verdict_passes(settings, tmp_path):
    pipe = make_pipeline(settings, tmp_path, PAYMENTS_DDL, write_mode="append_window_replace", reconcile=RECONCILE)
    insert_payments(pipe, 1, 200)
    plan, _ = pipe.run("run-1")
    watermark = pipe.watermark()
    target = pipe.spec.target_table
    wh = pipe.wh()
    with wh, wh.cursor() as cur:  # three faults in the committed target: missing, changed, extra
        cur.execute(f"DELETE FROM {target} WHERE id = 5")
        cur.execute(f"UPDATE {target} SET amount = amount + 0.01 WHERE id = 10")
        cur.execute(f"UPDATE {target} SET currency = 'USD' WHERE id = 20")
        cur.execute(f"INSERT INTO {target} (id, amount, currency, updated_at) "
                    f"SELECT 9999, 1.00, 'EUR', updated_at FROM {target} WHERE id = 1")
    wh.close()

    first = _reconcile(pipe, tmp_path, batch_id=plan.batch_id)
    assert not first.verdict.passed
    assert sorted((d.key[0], d.kind) for d in first.verdict.differences) == [
        (5, "missing"), (10, "changed"), (20, "changed"), (9999, "extra")]

    fixed, attempt = pipe.repair(first)
    assert fixed.batch_id == repair.batch_id_for(pipe.spec.name, first.run_id)
    assert pipe.query_wh("SELECT backfill, repair_of, jsonb_array_length(repair_keys) FROM tidemark_control.batches "
                         "WHERE batch_id = %s", (fixed.batch_id,)) == [(True, plan.batch_id, 4)]
    # only the keys the source holds were extracted and staged: 5, 10 and 20 (9999 is only deleted)
    assert pipe.ledger(fixed.batch_id) == [(attempt, "committed", 3, None)]
    assert pipe.watermark() == watermark, "a repair never moves the watermark"
    assert pipe.rows("source", "amount, currency") == pipe.rows("target", "amount, currency")

    second = _reconcile(pipe, tmp_path, batch_id=fixed.batch_id)  # as the repair's Asset event asks
    assert second.verdict.passed, [c for c in second.verdict.checks if not c.passed]
    assert second.batch_id == plan.batch_id and second.after_repair == fixed.batch_id
    assert "after repair batch" in second.line
    assert _verdicts(pipe, plan.batch_id) == [(first.run_id, False), (second.run_id, True)]
    assert pipe.query_wh("SELECT batch_id, reconciliation FROM tidemark_control.batches WHERE batch_id = ANY(%s) "
                         "ORDER BY batch_id", ([plan.batch_id, fixed.batch_id],)) == sorted(
        [(plan.batch_id, "reconciled"), (fixed.batch_id, "reconciled")])

    # a run's repair_batch param that names no repair batch of this pipeline is refused by name
    wh = pipe.wh()
    try:
        assert repair.load(pipe.spec, wh, fixed.batch_id)[0].window == fixed.window
        for wrong in (plan.batch_id, "no-such-batch"):
            with pytest.raises(repair.RepairError) as refused:
                repair.load(pipe.spec, wh, wrong)
            assert f"batch {wrong} is not a repair batch of pipeline {pipe.spec.name}" in str(refused.value)
    finally:
        wh.close()


def test_a_full_reconciliation_repairs_a_row_no_incremental_pull_can_see(settings, tmp_path):
    """Source rows updated with a cursor older than the version loaded: no batch carries them; the
    full-table reconciliation finds them and its repair loads them. A key that a later batch loaded
    anew meanwhile keeps that newer version. A repair whose staged records carry a key outside its
    keys is refused and changes nothing."""
    pipe = make_pipeline(settings, tmp_path, PAYMENTS_DDL, reconcile=RECONCILE)  # upserts
    insert_payments(pipe, 1, 100)
    pipe.run("run-1")
    assert len(pipe.rows("target", "amount")) == 100, (
        "run-1 must load all 100 rows; a source transaction left open elsewhere (another test session on "
        "this stack?) holds the window back")
    src = pipe.src()
    with src, src.cursor() as cur:
        cur.execute(f"UPDATE {pipe.spec.table} SET amount = 12345.67, updated_at = updated_at - interval '1 hour' "
                    "WHERE id IN (7, 8)")
    src.close()
    found = _reconcile(pipe, tmp_path)  # no batch: the whole table up to the watermark
    assert [(d.key[0], d.kind, d.columns) for d in found.verdict.differences] == [
        (7, "changed", ["amount", "updated_at"]), (8, "changed", ["amount", "updated_at"])]

    # a repair batch whose extract reads more keys than the ledger gave it (a tampered document)
    wh = pipe.wh()
    tampered = repair.plan(pipe.spec, wh, reconcile_run="00000000-0000-0000-0000-000000000001",
                           repaired_batch=None, repaired=found.window, differences=found.verdict.differences)
    wh.close()
    attempt = pipe.begin(tampered)
    doc = tmp_path / "tampered.json"
    doc.write_text(json.dumps({"columns": ["id"], "types": ["bigint"], "keys": [["7"], ["9"]]}))
    report = tmp_path / "tampered-report.json"
    s = settings
    proc = pipe._submit(jobs.EXTRACT_JOB, [
        *s.database_args(s.source_db),
        *jobs.extract_args(pipe.path, tampered.batch_id, attempt, tampered.window, s.kafka_bootstrap, report,
                           repair_keys=doc)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    pipe.end(tampered, attempt, json.loads(report.read_text()))

    # meanwhile key 8 changes again at the source and the next nightly batch loads that newer version
    src = pipe.src()
    with src, src.cursor() as cur:
        cur.execute(f"UPDATE {pipe.spec.table} SET amount = 888.88, updated_at = now() WHERE id = 8")
    src.close()
    pipe.run("run-2")  # its sink also meets the tampered repair's END first
    (state, message), = [(a[1], a[3]) for a in pipe.ledger(tampered.batch_id)]
    assert state == "refused" and "1 of 2 staged record(s) carry keys that are not among its 2 repair keys" in message
    assert pipe.query_wh(f"SELECT id, amount::text FROM {pipe.spec.target_table} WHERE id IN (7, 9) ORDER BY id") == [
        (7, "2.59"), (9, "3.33")]

    fixed, _ = pipe.repair(found)
    assert pipe.ledger(fixed.batch_id)[-1][1:3] == ("committed", 1)  # key 7 only: 8's version is past the window
    assert pipe.rows("source", "amount, updated_at") == pipe.rows("target", "amount, updated_at")
    assert pipe.query_wh(f"SELECT amount::text FROM {pipe.spec.target_table} WHERE id = 8") == [("888.88",)]
    again = _reconcile(pipe, tmp_path, batch_id=fixed.batch_id)
    assert again.verdict.passed and again.batch_id is None and again.after_repair == fixed.batch_id


def _repair_with(pipe, outcome, *, apply_source_deletes: bool):
    """The repair batch of ``outcome`` planned as the DAG plans it with that param, then loaded."""
    wh = pipe.wh()
    try:
        planned = repair.plan(pipe.spec, wh, reconcile_run=outcome.run_id, repaired_batch=outcome.batch_id,
                              repaired=outcome.window, differences=outcome.verdict.differences,
                              complete=outcome.verdict.complete, apply_source_deletes=apply_source_deletes)
    finally:
        wh.close()
    return pipe.load(planned)


def _freeze(pipe, *tables):
    """VACUUM FREEZE: a row's xmin, what tells a loaded row from a forged one, survives it."""
    wh = pipe.wh()
    wh.autocommit = True
    try:
        with wh.cursor() as cur:
            for table in tables:
                cur.execute(f"VACUUM (FREEZE) {table}")
    finally:
        wh.close()


def test_rows_deleted_at_the_source_after_their_load_are_a_finding_and_leave_only_when_asked(settings, tmp_path):
    """Two loaded rows deleted at the source: reported as deleted at the source (not extra) with
    their old values, in the line, the report and the evidence; a row forged in the target stays
    extra. A repair without apply_source_deletes re-loads the others and leaves them, and the
    second verdict still reports them; with it they are deleted, each kept with its old values,
    and the verdict says so."""
    pipe = make_pipeline(settings, tmp_path, PAYMENTS_DDL, reconcile=RECONCILE)  # upserts
    insert_payments(pipe, 1, 100)
    plan, _ = pipe.run("run-1")
    target = pipe.spec.target_table
    src = pipe.src()
    with src, src.cursor() as cur:
        cur.execute(f"DELETE FROM {pipe.spec.table} WHERE id IN (30, 31)")
    src.close()
    wh = pipe.wh()
    with wh, wh.cursor() as cur:  # a forged row (its cursor inside the window) and a changed one
        cur.execute(f"INSERT INTO {target} (id, amount, currency, updated_at) "
                    f"SELECT 9999, 1.00, 'EUR', updated_at FROM {target} WHERE id = 1")
        cur.execute(f"UPDATE {target} SET amount = amount + 0.01 WHERE id = 10")
    wh.close()
    _freeze(pipe, target, "tidemark_control.batch_attempts")

    first = _reconcile(pipe, tmp_path, batch_id=plan.batch_id)
    assert not first.verdict.passed
    assert sorted((d.key[0], d.kind, d.loaded_by) for d in first.verdict.differences) == [
        (10, "changed", None), (30, "deleted_at_source", plan.batch_id), (31, "deleted_at_source", plan.batch_id),
        (9999, "extra", None)]
    assert "4 rows differ: 1 amount changed, 2 deleted at the source after loading, 1 extra;" in first.line, first.line
    assert ": reconciled" not in first.line
    csv = (first.report.parent / "differences.csv").read_text()
    assert "30,deleted_at_source,target,,30,11.10," in csv and "9999,extra,target" in csv, csv
    assert "2 rows deleted at the source after a committed batch loaded them" in first.report.read_text()
    evidence = pipe.query_wh("SELECT subject, expected, actual, verdict FROM tidemark_control.reconciliation_results "
                             "WHERE run_id = %s AND check_name = 'deleted_at_source' ORDER BY id", (first.run_id,))
    assert [(s, e, json.loads(a)["amount"], v) for s, e, a, v in evidence] == [
        (f"key 30, loaded by batch {plan.batch_id}", "no row at the source", "11.10", "fail"),
        (f"key 31, loaded by batch {plan.batch_id}", "no row at the source", "11.47", "fail")]

    # without apply_source_deletes: the changed and the extra row are repaired, the deletions stay
    fixed, attempt = _repair_with(pipe, first, apply_source_deletes=False)
    (keys, deletes), = pipe.query_wh("SELECT repair_keys, repair_deletes FROM tidemark_control.batches "
                                     "WHERE batch_id = %s", (fixed.batch_id,))
    assert keys == [["10"], ["9999"]] and deletes == {
        "apply_source_deletes": False, "extra": [["9999"]], "deleted_at_source": [["30"], ["31"]]}
    assert pipe.ledger(fixed.batch_id) == [(attempt, "committed", 1, None)]
    assert pipe.query_wh(f"SELECT id FROM {target} WHERE id IN (10, 30, 31, 9999) ORDER BY id") == [
        (10,), (30,), (31,)]
    assert pipe.query_wh("SELECT kind, key, old_values->>'amount' FROM tidemark_control.repair_deletions "
                         "WHERE batch_id = %s", (fixed.batch_id,)) == [("extra", ["9999"], "1.00")]
    second = _reconcile(pipe, tmp_path, batch_id=fixed.batch_id)
    assert not second.verdict.passed and second.after_repair == fixed.batch_id
    assert [(d.key[0], d.kind) for d in second.verdict.differences] == [
        (30, "deleted_at_source"), (31, "deleted_at_source")]
    assert "2 rows differ: 2 deleted at the source after loading;" in second.line and ": reconciled" not in second.line
    with pytest.raises(repair.RepairError, match="apply_source_deletes=true"):  # nothing else to repair
        _repair_with(pipe, second, apply_source_deletes=False)

    # with apply_source_deletes: the repair deletes them and keeps each one with its old values
    applied, attempt = _repair_with(pipe, second, apply_source_deletes=True)
    assert pipe.ledger(applied.batch_id) == [(attempt, "committed", 0, None)]
    assert pipe.query_wh("SELECT repair_of, repair_keys, repair_deletes->'apply_source_deletes' "
                         "FROM tidemark_control.batches WHERE batch_id = %s", (applied.batch_id,)) == [
        (plan.batch_id, [["30"], ["31"]], True)]
    assert pipe.rows("source", "amount, currency, updated_at") == pipe.rows("target", "amount, currency, updated_at")
    kept = pipe.query_wh("SELECT kind, key, old_values FROM tidemark_control.repair_deletions WHERE batch_id = %s "
                         "ORDER BY id", (applied.batch_id,))
    assert [(k, key, old["id"], old["amount"], old["currency"]) for k, key, old in kept] == [
        ("deleted_at_source", ["30"], 30, 11.10, "EUR"), ("deleted_at_source", ["31"], 31, 11.47, "EUR")]
    third = _reconcile(pipe, tmp_path, batch_id=applied.batch_id)
    assert third.verdict.passed, [c for c in third.verdict.checks if not c.passed]
    assert f"batch {plan.batch_id}: reconciled after applying 2 source deletions, 98 rows" in third.line, third.line
    assert pipe.query_wh("SELECT subject, verdict FROM tidemark_control.reconciliation_results WHERE run_id = %s "
                         "AND check_name = 'source_deletion_applied' ORDER BY id", (third.run_id,)) == [
        (f"key 30, deleted by repair batch {applied.batch_id}", "pass"),
        (f"key 31, deleted by repair batch {applied.batch_id}", "pass")]
    assert _verdicts(pipe, plan.batch_id) == [(first.run_id, False), (second.run_id, False), (third.run_id, True)]

    for change in ("UPDATE tidemark_control.repair_deletions SET kind = 'extra' WHERE batch_id = %s",
                   "DELETE FROM tidemark_control.repair_deletions WHERE batch_id = %s"):
        with pytest.raises(psycopg2.errors.InsufficientPrivilege, match="append-only evidence"):
            pipe.query_wh(change, (applied.batch_id,))

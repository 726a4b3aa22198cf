"""Repair runs: the keys a reconciliation localised are re-loaded through BEGIN/END as a new batch,
then the reconciliation passes and the evidence keeps both verdicts (real PostgreSQL, Kafka, Spark).
"""

from __future__ import annotations

import json

import pytest

from tidemark import jobs, reconcile, repair
from tidemark_workshop.settings import SOURCE_DB
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
        *jobs.jdbc_args(s.jdbc_url(SOURCE_DB), s.pg_user),
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

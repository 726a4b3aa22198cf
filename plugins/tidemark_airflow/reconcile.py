"""Reconciliation as an Airflow task: which batch (the Asset event that scheduled the run, a
``batch_id`` param, or the whole table), connections at run time, and one failing line when the
books differ. The work is ``tidemark.reconcile.run``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from tidemark.protocol.config import CONN_WAREHOUSE
from tidemark_airflow.hooks import DatabaseHook

NEXT_MISMATCH = ("open the report, find why the target differs from the source (a manual edit, a source row "
                 "updated without moving its cursor), fix it, then run this DAG again with batch_id={batch} "
                 "(the evidence keeps both verdicts); to load the source's rows again instead, run it with "
                 "{which} and repair=true (a repair batch re-loads exactly the differing keys)")


NEXT_UNREACHABLE = ("set the cursor of those source rows to now() (any time after the committed watermark): the "
                    "next batch loads them; if such rows are meant to wait, set reconcile.unreachable_rows: false "
                    "in the spec")


NEXT_SOURCE_DELETES = ("{n} row(s) were deleted at the source after a committed batch loaded them (the report "
                       "lists each with its old values): if the deletion is legitimate, run {dag} with "
                       "{which}, repair=true and apply_source_deletes=true (the repair batch deletes them and keeps "
                       "each row in tidemark_control.repair_deletions); if not, restore them at the source")


NEXT_NOTHING_COMPARED = ("every key of the batch changed at the source after the batch read it, so nothing could be "
                         "compared: the next batch carries their new versions, and its reconciliation compares them "
                         "(trigger the pipeline's nightly DAG once the source is quieter); a key left out batch after "
                         "batch is named as a starved key")


NEXT_STARVED = ("those keys change at the source faster than the safe lag and the batches did not read above their "
                "windows (docs/control-protocol.md §16: max_batch_rows caps a window, and a backfill or a batch planned "
                "by an older Tidemark never reads above): let the next scheduled batch run uncapped, then run this DAG "
                "with that batch's batch_id")


def failure(line: str, verdict, batch_id: str | None, pipeline: str | None = None) -> str:
    """A failed verdict's last words: what failed and the next step that works for it (``pipeline``:
    to name the DAG that repairs)."""
    failed = [c for c in verdict.checks if not c.passed]
    if [c.check for c in failed] == ["compared_rows"]:  # nothing differs: nothing was compared
        return f"{line}: {failed[0].difference}. Next: {NEXT_NOTHING_COMPARED}"
    starved = [c for c in failed if c.check == "starved_key"]
    if starved and all(c.check in ("starved_key", "compared_rows") for c in failed):
        return (f"{line}: {starved[0].subject} {starved[0].actual}, {starved[0].difference}"
                f"{f' (and {len(starved) - 1} more)' if len(starved) > 1 else ''}. Next: {NEXT_STARVED}")
    if [c.check for c in failed] == ["unreachable_rows"]:  # nothing differs inside the window: no report
        return f"{line}: {failed[0].subject}. Next: {NEXT_UNREACHABLE}"
    deleted = [d for d in verdict.differences if d.kind == "deleted_at_source"]
    if deleted:
        which = f"batch_id={batch_id}" if batch_id else "scope=full"
        rest = len(verdict.differences) - len(deleted)
        others = (f"; for the other {rest} row(s): " + NEXT_MISMATCH.format(batch=batch_id or "''", which=which)
                  if rest else "")
        dag = f"tidemark_reconcile_{pipeline}" if pipeline else "the reconciliation DAG"
        return f"{line}. Next: " + NEXT_SOURCE_DELETES.format(n=len(deleted), dag=dag, which=which) + others
    which = f"batch_id={batch_id}" if batch_id else "scope=full"
    return f"{line}{differing(verdict)}. Next: " + NEXT_MISMATCH.format(batch=batch_id or "''", which=which)


def differing(verdict, shown: int = 5) -> str:
    """The first differing keys and what differs in each, for the failure line (the report lists all)."""
    if not verdict.differences:
        return ""
    keys = [f"{' '.join(map(str, d.key))} ({', '.join(d.columns) + ' changed' if d.kind == 'changed' else d.kind})"
            for d in verdict.differences[:shown]]
    more = len(verdict.differences) - shown
    return f"; differing key(s): {'; '.join(keys)}" + (f" and {more} more in the report" if more > 0 else "")


def batch_from_events(context: dict[str, Any]) -> str | None:
    """The batch id of the newest Asset event that scheduled this run (the nightly DAG's publish)."""
    events = context.get("triggering_asset_events") or {}
    newest = None
    for asset_events in events.values():
        for event in asset_events:
            if (event.extra or {}).get("batch_id") and (newest is None or event.timestamp >= newest.timestamp):
                newest = event
    return newest.extra["batch_id"] if newest is not None else None


REPAIR_BATCH = "repair_batch"  # XCom key: the repair batch planned by a run with repair=true


class ReconcileOperator(BaseOperator):
    """Reconcile a committed batch of the pipeline (or the whole table: param ``scope: full``).

    With param ``repair: true`` differing rows do not fail the task: their keys become a repair
    batch (pushed as XCom ``repair_batch``) for the nightly DAG to load; rows deleted at the source
    after a batch loaded them are part of it only with ``apply_source_deletes: true``. ``again_after``:
    reconcile what that task reconciled (the second verdict, after the repair)."""

    template_fields = ("spec_path",)

    def __init__(self, *, spec_path: str, warehouse_conn_id: str = CONN_WAREHOUSE, again_after: str | None = None,
                 **kwargs: Any):
        super().__init__(**kwargs)
        self.spec_path = spec_path
        self.warehouse_conn_id = warehouse_conn_id
        self.again_after = again_after

    def execute(self, context) -> dict[str, Any]:
        from tidemark import ledger, reconcile
        from tidemark.protocol.config import code_version, reconcile_dir
        from tidemark.protocol.spec import load_spec
        from tidemark.reconcile.expectations import sqlalchemy_url

        spec = load_spec(Path(self.spec_path))
        params = context["params"]
        full = params.get("scope") == "full"
        batch_id = None if full else (params.get("batch_id") or batch_from_events(context))
        if self.again_after:  # the repair batch: its reconciliation is of what it repaired, noted on both
            before = context["ti"].xcom_pull(task_ids=self.again_after) or {}
            full, batch_id = False, before.get(REPAIR_BATCH) or before.get("batch_id")
        repairing = bool(params.get("repair")) and not self.again_after
        warehouse = DatabaseHook(self.warehouse_conn_id, application_name="tidemark-reconcile").get_conn()
        source = DatabaseHook(spec.source_conn_id, application_name="tidemark-reconcile").get_conn()
        invariants = DatabaseHook(self.warehouse_conn_id, application_name="tidemark-reconcile-invariants").get_conn()
        try:
            if full and getattr(context.get("dag_run"), "run_type", None) == "scheduled":
                with warehouse, warehouse.cursor() as cur:
                    if ledger.last_committed(cur, spec.name) is None:  # skipped, never "passed" over nothing
                        raise AirflowSkipException(f"pipeline={spec.name} full table: no committed batch yet, so "
                                                   "nothing to prove. Next: nothing; the next scheduled run proves "
                                                   f"what tidemark_batch_{spec.name} has committed by then")
            if not full and batch_id is None:  # a manual run without a batch: the newest committed one
                with warehouse, warehouse.cursor() as cur:
                    newest = ledger.last_committed(cur, spec.name)
                if newest is None:
                    raise AirflowFailException(f"pipeline={spec.name}: no committed batch to reconcile yet. Next: run "
                                               f"tidemark_batch_{spec.name} first")
                batch_id = newest[0]
            what = f"pipeline={spec.name} batch={batch_id}" if batch_id else f"pipeline={spec.name} full table"
            self.log.info("%s: reconciling %s against %s", what, spec.table, spec.target_table)
            conn = DatabaseHook(self.warehouse_conn_id).endpoint()
            url = sqlalchemy_url(conn.host, conn.port, conn.schema, conn.login or "", conn.password or "")
            try:
                outcome = reconcile.run(spec, source, warehouse, reconcile_dir(), batch_id=batch_id, warehouse_url=url,
                                        code_version=code_version(), invariants_conn=invariants)
            except (reconcile.ReconcileError, LookupError) as exc:
                raise AirflowFailException(f"{what}: cannot reconcile: {exc}. Next: fix the cause named here, then "
                                           "run this DAG again") from None
        finally:
            for conn in (source, warehouse, invariants):
                conn.close()
        verdict = outcome.verdict
        for check in verdict.checks:
            self.log.info("%s check=%s %s expected=%s actual=%s%s", what, check.check, check.subject, check.expected,
                          check.actual, "" if check.passed else f" difference={check.difference} FAILED")
        self.log.info("%s window=%s rows source=%s target=%s, localising read %s rows (%.2f%%), run %s", what,
                      outcome.window, verdict.rows_source, verdict.rows_target, verdict.rows_read_localising,
                      100 * verdict.read_fraction, outcome.run_id)
        result = {"run_id": outcome.run_id, "batch_id": outcome.batch_id, "passed": verdict.passed,
                  "rows": verdict.rows_target, "data_docs": str(outcome.data_docs) if outcome.data_docs else None}
        if not verdict.passed:
            self.log.error("%s: %s", what, outcome.line)
            if repairing and verdict.differences:
                result[REPAIR_BATCH] = self._plan_repair(spec, outcome, what, context)
                return result
            raise AirflowFailException(failure(outcome.line, verdict, outcome.batch_id, spec.name))
        self.log.info("%s: %s", what, outcome.line)
        return result

    def _plan_repair(self, spec, outcome, what: str, context) -> str:
        from tidemark.batch import repair

        warehouse = DatabaseHook(self.warehouse_conn_id, application_name="tidemark-reconcile").get_conn()
        apply_deletes = bool(context["params"].get("apply_source_deletes"))
        differences = outcome.verdict.differences
        try:
            plan = repair.plan(spec, warehouse, reconcile_run=outcome.run_id, repaired_batch=outcome.batch_id,
                               repaired=outcome.window, differences=differences,
                               complete=outcome.verdict.complete, apply_source_deletes=apply_deletes)
        except repair.RepairError as exc:
            raise AirflowFailException(f"{outcome.line}. {exc}") from None
        finally:
            warehouse.close()
        self.log.warning("%s: repair batch %s planned for %s differing key(s); tidemark_batch_%s loads it next "
                         "(BEGIN/END, a new batch that never moves the watermark), then this run reconciles again",
                         what, plan.batch_id, len(repair.repair_keys(differences, apply_deletes)), spec.name)
        deleted = repair.deletes(differences, apply_deletes)["deleted_at_source"]
        if deleted and apply_deletes:
            self.log.warning("%s: apply_source_deletes=true: the repair deletes %s row(s) deleted at the source from "
                             "the target, each kept with its old values in tidemark_control.repair_deletions",
                             what, len(deleted))
        elif deleted:
            self.log.warning("%s: %s row(s) deleted at the source after a batch loaded them stay in the target "
                             "(apply_source_deletes is false): the second verdict reports them", what, len(deleted))
        context["ti"].xcom_push(key=REPAIR_BATCH, value=plan.batch_id)
        return plan.batch_id

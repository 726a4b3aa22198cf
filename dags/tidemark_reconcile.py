"""
### Tidemark reconciliation: proof that the warehouse equals the source, after every load

Every pipeline spec in `include/pipelines/` gets a DAG `tidemark_reconcile_<name>`, scheduled on
the Asset `tidemark.batch.<name>` that its nightly DAG updates when a batch commits: it runs right
after each load and reconciles that batch's window, source against target, in the databases:

- **unique keys** in the target (first: a precondition);
- **row counts** and **hash totals** over the full content of every row;
- **control totals**: exact decimal sums of the spec's `reconcile.control_totals`, per group;
- **double entry** (`reconcile.double_entry`): every journal sums to zero per currency;
- **balance continuity** and **balances against the ledger's movements**
  (`reconcile.balance_continuity`, `reconcile.movements_match_ledger`);
- **freshness** (`reconcile.max_staleness`) of the committed watermark;
- **unreachable rows**: source rows whose timestamp cursor is NULL or infinite, which no window can
  hold (every windowed check passes without them), named by key;
- **required fields** and **accepted values**, by Great Expectations, with Data Docs.

Zero tolerance unless the spec sets `reconcile.tolerance` with a `tolerance_reason`. Every result
goes into the append-only `tidemark_control.reconciliation_results`; the batch ledger shows
`reconciled` or `reconciliation_failed`. When the sides differ, only the key ranges whose totals
differ are read again, down to the rows: the task fails with one line (how many rows, which
kind) and the path of a CSV and HTML report of the missing, extra and changed rows, and of the
rows **deleted at the source** after a committed batch loaded them (kind `deleted_at_source`,
with the target's old values: a finding, never "reconciled"; a target row no batch wrote is `extra`).

Run it by hand (**Trigger**) for any past batch with `batch_id`, or with `scope: full` for the
whole table up to the committed watermark.

**Repair** (`repair: true`): when rows differ, their keys become a repair batch. `repair` triggers
`tidemark_batch_<name>` with it and waits (deferred, no worker slot): that run re-extracts only those
keys through BEGIN/END as a new batch, and the sink replaces the target's rows of those keys in one
transaction (the watermark stays). `reconcile_again` then gives the second verdict; the evidence
keeps both. Rows deleted at the source stay in the target (the second verdict still reports them)
unless the run sets **`apply_source_deletes: true`**: then the repair deletes them too, keeps each
with its old values in `tidemark_control.repair_deletions`, and the second verdict says
"reconciled after applying N source deletions".
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pendulum
from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import DAG, Param, task

from tidemark.protocol.config import pipelines_dir
from tidemark.protocol.spec import PipelineSpec, load_specs
from tidemark_airflow.batch import batch_asset
from tidemark_airflow.reconcile import REPAIR_BATCH, ReconcileOperator


def _reconcile_dag(path: Path, spec: PipelineSpec) -> DAG:
    with DAG(
        dag_id=f"tidemark_reconcile_{spec.name}",
        doc_md=f"### Reconciliation: `{spec.name}`\n\n`{spec.table}` against `{spec.target_table}`\n\n---\n{__doc__}",
        schedule=[batch_asset(spec.name)],
        start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,
        default_args={"retries": 2, "retry_delay": timedelta(seconds=30), "owner": "tidemark"},
        params={
            "batch_id": Param(None, type=["null", "string"], description="a committed batch (default: the one that scheduled "
                                                             "this run, else the newest)"),
            "scope": Param("batch", type="string", enum=["batch", "full"],
                           description="full: the whole table up to the watermark"),
            "repair": Param(False, type=["boolean", "null"], description="re-load the differing rows' keys as a repair batch, "
                                                                "then reconcile again"),
            "apply_source_deletes": Param(False, type=["boolean", "null"],
                                          description="with repair: also delete from the target the rows deleted at "
                                                      "the source after a batch loaded them (each kept, with its old "
                                                      "values, in tidemark_control.repair_deletions); without it they "
                                                      "stay and the verdict reports them"),
        },
        tags=["tidemark", "reconcile", spec.name],
    ) as dag:
        first = ReconcileOperator(task_id="reconcile", spec_path=str(path))

        @task.short_circuit(task_id="repair_planned")
        def repair_planned(ti=None) -> bool:
            """Go on to the repair only when the first verdict planned one."""
            return bool(ti.xcom_pull(task_ids="reconcile", key=REPAIR_BATCH))

        load = TriggerDagRunOperator(
            task_id="repair", trigger_dag_id=f"tidemark_batch_{spec.name}",
            conf={"repair_batch": "{{ ti.xcom_pull(task_ids='reconcile', key='%s') }}" % REPAIR_BATCH},
            wait_for_completion=True, deferrable=True, poke_interval=10, fail_when_dag_is_paused=True,
            retries=0)  # a retry would load a refused repair batch again: a new reconciliation plans a new one
        again = ReconcileOperator(task_id="reconcile_again", spec_path=str(path), again_after="reconcile")
        first >> repair_planned() >> load >> again
    return dag


_specs, _ = load_specs(pipelines_dir())  # the invalid ones: dags/tidemark_spec_errors.py
for _path, _spec in _specs:
    _dag = _reconcile_dag(_path, _spec)
    globals()[_dag.dag_id] = _dag

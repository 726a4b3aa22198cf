"""
### Tidemark whole-table reconciliation, on a schedule

A pipeline whose spec sets `reconcile.full_schedule` (for example `@weekly`) gets a DAG
`tidemark_reconcile_full_<name>`: on that schedule it reconciles the whole table up to the committed
watermark, source against target, with the same checks as after each batch
(`tidemark_reconcile_<name>`). A batch proven once can drift later (a row changed in the
warehouse, a source column added with a default, a row deleted at the source): this run finds it.

It runs from the moment the spec asks for it (the DAG is not paused at creation); a scheduled run
before the pipeline's first committed batch is skipped, never passed, since there is nothing to prove.
It never repairs: a difference fails the run with its report (which rows, which kind). To repair,
trigger `tidemark_reconcile_<name>` with `scope: full` and `repair: true`.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pendulum
from airflow.sdk import DAG, Param

from tidemark.protocol.config import pipelines_dir
from tidemark.protocol.spec import PipelineSpec, load_specs
from tidemark_airflow.reconcile import ReconcileOperator


def _full_dag(path: Path, spec: PipelineSpec) -> DAG:
    with DAG(
        dag_id=f"tidemark_reconcile_full_{spec.name}",
        doc_md=(f"### Whole-table reconciliation: `{spec.name}`\n\n`{spec.table}` against `{spec.target_table}`, "
                f"schedule `{spec.reconcile.full_schedule}`\n\n---\n{__doc__}"),
        schedule=spec.reconcile.full_schedule,
        start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,
        # a weekly proof runs without anyone unpausing it; and a paused DAG's Trigger form ticks "unpause on
        # trigger", which would start a scheduled run beside the one asked for
        is_paused_upon_creation=False,
        default_args={"retries": 2, "retry_delay": timedelta(minutes=1), "owner": "tidemark"},
        params={"scope": Param("full", type="string", enum=["full"],
                               description="always the whole table up to the watermark")},
        tags=["tidemark", "reconcile", spec.name],
    ) as dag:
        ReconcileOperator(task_id="reconcile", spec_path=str(path))
    return dag


_specs, _ = load_specs(pipelines_dir())  # the invalid ones: dags/tidemark_spec_errors.py
for _path, _spec in _specs:
    if _spec.reconcile.full_schedule is not None:
        _dag = _full_dag(_path, _spec)
        globals()[_dag.dag_id] = _dag

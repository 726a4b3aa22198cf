"""
### Tidemark nightly batch loads: one DAG per pipeline spec

Every YAML file in `include/pipelines/` becomes a DAG `tidemark_batch_<name>`:

0. **wait_for_sink** (only with `sink.max_lag` in the spec): backpressure; the run waits, holding
   no worker slot, while the pipeline's standing sink is more than that many records behind.
1. **plan**: the window `(watermark, safe bound]` on the source's own clock: now minus the safe
   lag, and before the oldest transaction still open on the source. Backfill runs load their
   data interval `[start, end)` instead and never move the watermark.
2. **begin**: BEGIN control messages open a new attempt on every partition of `tidemark.<name>`
   (a run whose batch is already committed, e.g. cleared after success, skips the rest).
3. **extract**: Spark reads the window over JDBC and writes it to the topic with per-partition
   counts and checksums, kept in the ledger (a retry is a new attempt that fences the failed one).
4. **end**: END control messages carry those counts and checksums.
5. **sink**: the two-phase sink applies the batch in one warehouse transaction, only if every
   partition's END arrived and the numbers match (with `sink.mode: standing` the sink kept running
   by `tidemark_supervisor` applies it, and this step submits nothing).
6. **wait_committed** / **publish**: the ledger shows the batch committed; the Asset
   `tidemark.batch.<name>` is updated with the batch facts (`empty: true` for a 0-row batch).
7. **abort_unfinished** (teardown): whatever ended the run, an attempt it left open is aborted.

A run with the param `repair_batch` (set by `tidemark_reconcile_<name>` with `repair: true`) loads
that repair batch instead: only the keys its reconciliation found differing, through the same
steps, without moving the watermark.

Runs have real data intervals (`CronDataIntervalTimetable`), so a backfill of three days loads
exactly those days. An invalid spec file loads no DAG: it is listed under the UI's import errors
(file `tidemark_spec_errors.py`) with its file and field, and every other pipeline keeps working.
"""

from __future__ import annotations

from pathlib import Path

import pendulum
from airflow.sdk import DAG, CronDataIntervalTimetable, Param

from tidemark.protocol.config import pipelines_dir
from tidemark.protocol.spec import PipelineSpec, load_specs
from tidemark_airflow.batch import batch_pipeline
from tidemark_airflow.batch_tasks import last_word

START = pendulum.datetime(2026, 1, 1, tz="UTC")


def _schedule(spec: PipelineSpec):
    """Cron schedules get data intervals: Airflow 3's default trigger timetable gives every run,
    and so every backfill run, an empty interval."""
    if spec.schedule in ("@once", "@continuous"):
        return spec.schedule
    return CronDataIntervalTimetable(spec.schedule, timezone="UTC")


def _pipeline_dag(path: Path, spec: PipelineSpec) -> DAG:
    with DAG(
        dag_id=f"tidemark_batch_{spec.name}",
        doc_md=(f"### Nightly batch load: `{spec.name}`\n\nSpec: `{path}`\n\n`{spec.table}` -> "
                f"`{spec.target_table}` ({spec.write_mode}), cursor `{spec.cursor.column}`, safe lag "
                f"{spec.safe_lag}, topic `{spec.topic}`\n\n---\n{__doc__}"),
        schedule=_schedule(spec),
        start_date=START,
        catchup=False,
        max_active_runs=1,
        # Transient failures (broker, connections) retry with growing delays (the spec's retries);
        # what will not heal fails at once (the operators raise AirflowFailException for it).
        default_args={"retries": spec.retries.count, "retry_delay": spec.retries.delay,
                      "retry_exponential_backoff": True, "max_retry_delay": spec.retries.max_delay, "owner": "tidemark",
                      "on_failure_callback": last_word, "on_retry_callback": last_word},
        params={"repair_batch": Param(None, type=["null", "string"], description=(
            "set by tidemark_reconcile_<name> with repair=true: the repair batch (its keys are in the ledger) "
            "this run loads instead of the next window; leave it empty for a nightly load or a backfill"))},
        tags=["tidemark", "batch", spec.name],
    ) as dag:
        batch_pipeline(path, source_conn_id=spec.source_conn_id, backpressure=spec.sink.max_lag is not None)
    return dag


_specs, _ = load_specs(pipelines_dir())  # the invalid ones: dags/tidemark_spec_errors.py
for _path, _spec in _specs:
    _dag = _pipeline_dag(_path, _spec)
    globals()[_dag.dag_id] = _dag

"""
### Tidemark nightly batch loads: one DAG per pipeline spec

Every YAML file in `include/pipelines/` becomes a DAG `tidemark_batch_<name>`:

1. **plan**: the window `(watermark, safe bound]` on the source's own clock: now minus the safe
   lag, and before the oldest transaction still open on the source. Backfill runs load their
   data interval instead and never move the watermark.
2. **begin**: BEGIN control messages open a new attempt on every partition of `tidemark.<name>`.
3. **extract**: Spark reads the window over JDBC and writes it to the topic with per-partition
   counts and checksums (a retry is a new attempt that fences the failed one).
4. **end**: END control messages carry those counts and checksums.
5. **sink**: the two-phase sink applies the batch in one warehouse transaction, only if every
   partition's END arrived and the numbers match.
6. **wait_committed** / **publish**: the ledger shows the batch committed; the Asset
   `tidemark.batch.<name>` is updated with the batch facts.

An invalid spec file shows up as a paused DAG with the same id whose only task fails with the
validation error (file and field), plus an import warning; every other pipeline keeps working.
"""

from __future__ import annotations

import os
import warnings
from datetime import timedelta
from pathlib import Path

import pendulum
from airflow.sdk import DAG, task

from tidemark.settings import REPO_ROOT
from tidemark.spec import SpecError, load_spec
from tidemark_airflow.batch import batch_pipeline

PIPELINES = Path(os.environ.get("TIDEMARK_PIPELINES_DIR", REPO_ROOT / "include" / "pipelines"))
DEFAULTS = {"retries": 2, "retry_delay": timedelta(minutes=1), "owner": "tidemark"}
START = pendulum.datetime(2026, 1, 1, tz="UTC")


def _doc(name: str, path: Path, body: str) -> str:
    return f"### Nightly batch load: `{name}`\n\nSpec: `{path}`\n\n{body}\n\n---\n{__doc__}"


def _pipeline_dag(path: Path) -> DAG:
    spec = load_spec(path)
    with DAG(
        dag_id=f"tidemark_batch_{spec.name}",
        doc_md=_doc(spec.name, path, f"`{spec.table}` -> `{spec.target_table}` ({spec.write_mode}), "
                    f"cursor `{spec.cursor.column}`, safe lag {spec.safe_lag}, topic `{spec.topic}`"),
        schedule=spec.schedule,
        start_date=START,
        catchup=False,
        max_active_runs=1,
        default_args=DEFAULTS,
        tags=["tidemark", "batch", spec.name],
    ) as dag:
        batch_pipeline(path, source_conn_id=spec.source_conn_id)
    return dag


def _broken_dag(path: Path, error: Exception) -> DAG:
    """Stand-in for an invalid spec: visible, paused, and failing with the validation message."""
    warnings.warn(str(error), stacklevel=1)
    with DAG(
        dag_id=f"tidemark_batch_{path.stem}",
        doc_md=_doc(path.stem, path, f"**This pipeline spec is invalid and will not load:**\n\n    {error}"),
        schedule=None,
        start_date=START,
        catchup=False,
        max_active_runs=1,
        default_args=DEFAULTS,
        is_paused_upon_creation=True,
        tags=["tidemark", "batch", "invalid-spec"],
    ) as dag:

        @task(task_id="invalid_spec")
        def invalid_spec(message: str) -> None:
            raise SpecError(f"{message} -- fix the file; the DAG reloads on the next parse")

        invalid_spec(str(error))
    return dag


for _path in sorted(PIPELINES.glob("*.yaml")):
    try:
        _dag = _pipeline_dag(_path)
    except SpecError as _exc:
        _dag = _broken_dag(_path, _exc)
    globals()[_dag.dag_id] = _dag

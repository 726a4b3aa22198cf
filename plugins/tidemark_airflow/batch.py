"""Operators for the nightly batch of one pipeline: plan, BEGIN, extract, END, sink, commit check.

Thin wrappers over ``tidemark.batch``: they resolve Airflow connections at run time, pass plans
between steps as XCom, and log what the person on call needs (pipeline, batch id, attempt,
window, counts, and what to do next on failure). ``batch_pipeline`` wires them in a DAG; the
operators can equally be used one by one in a hand-written DAG file.
"""

from __future__ import annotations

import json
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import Asset, BaseOperator, BaseSensorOperator, Connection

from tidemark.settings import CONN_KAFKA, CONN_WAREHOUSE
from tidemark_airflow.spark import SparkJdbcSubmitOperator

PLAN, BEGIN, EXTRACT, END, SINK, COMMITTED = "plan", "begin", "extract", "end", "sink", "wait_committed"


def pg_connect(conn_id: str):
    """A psycopg2 connection from an Airflow connection (the core package speaks psycopg2)."""
    import psycopg2

    c = Connection.get(conn_id)
    return psycopg2.connect(host=c.host, port=c.port or 5432, dbname=c.schema, user=c.login, password=c.password)


def kafka_bootstrap(conn_id: str = CONN_KAFKA) -> str:
    return Connection.get(conn_id).extra_dejson["bootstrap.servers"]


def batch_asset(pipeline: str) -> Asset:
    """The Asset a committed batch of ``pipeline`` updates (reconciliation is scheduled on it)."""
    return Asset(name=f"tidemark.batch.{pipeline}", uri=f"tidemark://warehouse/batch/{pipeline}")


class _PipelineOperator(BaseOperator):
    template_fields = ("spec_path",)

    def __init__(self, *, spec_path: str, warehouse_conn_id: str = CONN_WAREHOUSE,
                 kafka_conn_id: str = CONN_KAFKA, **kwargs: Any):
        super().__init__(**kwargs)
        self.spec_path = spec_path
        self.warehouse_conn_id = warehouse_conn_id
        self.kafka_conn_id = kafka_conn_id

    @property
    def spec(self):
        from tidemark.spec import load_spec

        return load_spec(Path(self.spec_path))


def _plan(context) -> Any:
    from tidemark.batch import Plan

    raw = context["ti"].xcom_pull(task_ids=PLAN)
    if not raw:
        raise RuntimeError(f"no plan from task '{PLAN}' in this run; clear the run from '{PLAN}'")
    return Plan.from_xcom(raw)


class PlanWindowOperator(_PipelineOperator):
    """Plan the batch window on the source's clock (backfill runs: their data interval)."""

    def execute(self, context) -> dict[str, Any]:
        from tidemark import batch

        spec = self.spec
        run = context["dag_run"]
        interval = None
        if str(getattr(run, "run_type", "")).lower().endswith("backfill"):
            interval = (context["data_interval_start"], context["data_interval_end"])
        source, warehouse = pg_connect(spec.source_conn_id), pg_connect(self.warehouse_conn_id)
        try:
            plan = batch.plan(spec, source, warehouse, run_id=run.run_id, interval=interval,
                              bootstrap=kafka_bootstrap(self.kafka_conn_id))
        finally:
            source.close()
            warehouse.close()
        self.log.info("pipeline=%s batch=%s window=%s%s", spec.name, plan.batch_id, plan.window,
                      " (same window as the earlier try of this run)" if plan.reused else "")
        return plan.to_xcom()


class BeginBatchOperator(_PipelineOperator):
    """Open the next attempt and send BEGIN to every partition of the pipeline topic."""

    def execute(self, context) -> int:
        from tidemark import batch

        spec, plan = self.spec, _plan(context)
        warehouse = pg_connect(self.warehouse_conn_id)
        try:
            return batch.begin(spec, warehouse, kafka_bootstrap(self.kafka_conn_id), plan)
        finally:
            warehouse.close()


class ExtractWindowOperator(SparkJdbcSubmitOperator):
    """Run spark_jobs/extract_window.py for the planned window; returns attempt and totals.

    A retry of this task starts a new attempt (new BEGIN), which fences whatever the failed
    try wrote: the sink discards records of superseded attempts.
    """

    def __init__(self, *, spec_path: str, source_conn_id: str, warehouse_conn_id: str = CONN_WAREHOUSE,
                 kafka_conn_id: str = CONN_KAFKA, read_partitions: int = 4, **kwargs: Any):
        super().__init__(script="extract_window.py", jdbc_conn_id=source_conn_id, **kwargs)
        self.spec_path = spec_path
        self.warehouse_conn_id = warehouse_conn_id
        self.kafka_conn_id = kafka_conn_id
        self.read_partitions = read_partitions

    def execute(self, context) -> dict[str, Any]:
        from tidemark import batch
        from tidemark.spec import load_spec

        spec, plan = load_spec(Path(self.spec_path)), _plan(context)
        bootstrap = kafka_bootstrap(self.kafka_conn_id)
        attempt = context["ti"].xcom_pull(task_ids=BEGIN)
        if context["ti"].try_number > 1:
            warehouse = pg_connect(self.warehouse_conn_id)
            try:
                attempt = batch.begin(spec, warehouse, bootstrap, plan)
            finally:
                warehouse.close()
            self.log.warning("pipeline=%s batch=%s: retry of the extract, loading as attempt %s",
                             spec.name, plan.batch_id, attempt)
        tag = f"pipeline={spec.name} batch={plan.batch_id} attempt={attempt} window={plan.window}"
        with tempfile.TemporaryDirectory(prefix="tidemark-extract-") as tmp:
            report_path = Path(tmp) / "report.json"
            self.job_args = [
                "--spec", str(Path(self.spec_path).resolve()), "--batch-id", plan.batch_id,
                "--attempt", str(attempt), "--window", json.dumps(plan.window.to_json()),
                "--bootstrap", bootstrap, "--report", str(report_path),
                "--read-partitions", str(self.read_partitions),
            ]
            self.log.info("%s: extracting", tag)
            try:
                super().execute(context)
            except Exception as exc:
                ti = context["ti"]
                if ti.try_number <= ti.max_tries:  # Airflow's own test for "will retry"
                    self.log.error("%s: extract FAILED. Nothing of this attempt can be applied (no END was sent). "
                                   "Airflow retries it as a new attempt.", tag)
                    raise
                self.log.error("%s: extract FAILED on its last try. Next: read the Spark output above, fix the "
                               "cause, then clear this task (it loads the batch as a new attempt).", tag)
                try:  # the sink drops what this attempt staged now, not when a later attempt supersedes it
                    batch.abort(spec, bootstrap, plan, attempt, f"extract failed on its last try: {exc}"[:500])
                    self.log.error("%s: ABORT sent: nothing of this attempt will be applied", tag)
                except Exception as why:  # the extract's own failure stays the error raised
                    self.log.error("%s: could not send ABORT (%s); the attempt stays open until a new attempt "
                                   "supersedes it", tag, why)
                raise
            report = json.loads(report_path.read_text())
        self.log.info("%s: extracted rows=%s per partition %s in %.1fs", tag, report["rows"],
                      {p: t["rows"] for p, t in report["totals"].items()}, report["seconds"])
        return {"attempt": attempt, "report": report}


class EndBatchOperator(_PipelineOperator):
    """Seal the attempt with the extract's totals and send END to every partition."""

    def execute(self, context) -> int:
        from tidemark import batch

        spec, plan = self.spec, _plan(context)
        extracted = context["ti"].xcom_pull(task_ids=EXTRACT)
        warehouse = pg_connect(self.warehouse_conn_id)
        try:
            return batch.end(spec, warehouse, kafka_bootstrap(self.kafka_conn_id), plan,
                             extracted["attempt"], extracted["report"])
        finally:
            warehouse.close()


class BatchSinkOperator(SparkJdbcSubmitOperator):
    """Run the two-phase sink (spark_jobs/batch_sink.py) until the topic is drained.

    Until the streaming supervisor keeps a sink running, the nightly DAG runs it available-now.
    """

    def __init__(self, *, spec_path: str, warehouse_conn_id: str = CONN_WAREHOUSE,
                 kafka_conn_id: str = CONN_KAFKA, **kwargs: Any):
        super().__init__(script="batch_sink.py", jdbc_conn_id=warehouse_conn_id, **kwargs)
        self.spec_path = spec_path
        self.kafka_conn_id = kafka_conn_id

    def execute(self, context) -> None:
        self.job_args = ["--spec", str(Path(self.spec_path).resolve()),
                         "--bootstrap", kafka_bootstrap(self.kafka_conn_id), "--available-now"]
        super().execute(context)


class BatchCommittedSensor(BaseSensorOperator):
    """Wait until the sink has committed this run's attempt; fail at once if it was refused.

    Runs in reschedule mode by default: between pokes it holds no worker slot.
    """

    template_fields = ("spec_path",)

    def __init__(self, *, spec_path: str, warehouse_conn_id: str = CONN_WAREHOUSE, **kwargs: Any):
        kwargs.setdefault("mode", "reschedule")
        kwargs.setdefault("poke_interval", 30)
        kwargs.setdefault("timeout", timedelta(hours=6).total_seconds())
        super().__init__(**kwargs)
        self.spec_path = spec_path
        self.warehouse_conn_id = warehouse_conn_id

    def poke(self, context) -> bool:
        from tidemark import batch
        from tidemark.spec import load_spec

        spec, plan = load_spec(Path(self.spec_path)), _plan(context)
        attempt = context["ti"].xcom_pull(task_ids=EXTRACT)["attempt"]
        warehouse = pg_connect(self.warehouse_conn_id)
        try:
            done = batch.commit_state(spec, warehouse, plan.batch_id, attempt)
            if done:
                facts = batch.summary(warehouse, plan.batch_id)
                self.log.info("pipeline=%s batch=%s attempt=%s window=%s COMMITTED rows=%s watermark=%s",
                              spec.name, plan.batch_id, attempt, facts["window"], facts["rows"], facts["watermark"])
                context["ti"].xcom_push(key="summary", value=facts)
            return done
        finally:
            warehouse.close()


def batch_pipeline(spec_path: str | Path, *, source_conn_id: str) -> BaseOperator:
    """Wire plan >> begin >> extract >> end >> sink >> wait_committed >> publish in the current DAG.

    Returns the last task, whose outlet is the pipeline's Asset, so callers can chain more work.
    """
    from airflow.sdk import task

    path, name = str(spec_path), Path(spec_path).stem
    asset = batch_asset(name)
    plan = PlanWindowOperator(task_id=PLAN, spec_path=path)
    begin = BeginBatchOperator(task_id=BEGIN, spec_path=path)
    extract = ExtractWindowOperator(task_id=EXTRACT, spec_path=path, source_conn_id=source_conn_id)
    end = EndBatchOperator(task_id=END, spec_path=path)
    sink = BatchSinkOperator(task_id=SINK, spec_path=path)
    committed = BatchCommittedSensor(task_id=COMMITTED, spec_path=path)

    @task(task_id="publish", outlets=[asset])
    def publish(*, outlet_events=None, ti=None) -> dict[str, Any]:
        """Emit the Asset event for the committed batch (reconciliation is scheduled on it)."""
        from tidemark.summary import summary_line

        facts = ti.xcom_pull(task_ids=COMMITTED, key="summary")
        outlet_events[asset].extra = facts
        print(summary_line("batch", **facts), flush=True)
        return facts

    chain = plan >> begin >> extract >> end >> sink >> committed
    last = publish()
    chain >> last
    return last

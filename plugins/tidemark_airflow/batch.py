"""Operators for the nightly batch of one pipeline: plan, BEGIN, extract, END, sink, commit check.

Thin wrappers over ``tidemark.batch``: they resolve Airflow connections at run time, pass small
identifiers between steps as XCom (the extract's totals live in the ledger: their sums pass 64
bits), and log what the person on call needs. A failure's last line names the pipeline, batch,
attempt and window, the cause in one line and the next step that will work; failures that will
recur (a bad spec, a refused batch, a schema mismatch) fail at once instead of retrying.
``batch_pipeline`` wires the operators in a DAG, with a teardown that aborts whatever attempt a
failed or killed run left open. What every task shares (the run's plan and attempt, the log tag,
the failure's last line) is ``tidemark_airflow.batch_tasks``.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import Asset, BaseOperator, BaseSensorOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from tidemark.batch.sequence import BEGIN, CLEANUP, COMMITTED, END, EXTRACT, GATE, PLAN, PUBLISH, SINK, STEPS, TURN
from tidemark.protocol.config import CONN_CDC, CONN_KAFKA, CONN_WAREHOUSE
from tidemark.spark import jobs
from tidemark_airflow.batch_tasks import NEXT_FIX_THEN_CLEAR, failure_line, on_call, run_attempt, run_plan, run_tag
from tidemark_airflow.hooks import ControlKeysHook, DatabaseHook, KafkaHook
from tidemark_airflow.spark import SparkJdbcSubmitOperator


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
        from tidemark.protocol.spec import SpecError, load_spec

        try:
            return load_spec(Path(self.spec_path))
        except SpecError as exc:  # the file changed since the DAG was parsed
            raise AirflowFailException(f"{exc}. Next: fix the file, then clear this task") from exc


class PlanWindowOperator(_PipelineOperator):
    """Plan the batch window on the source's clock (backfill runs: their data interval)."""

    def execute(self, context) -> dict[str, Any]:
        from tidemark.batch import steps

        spec = self.spec
        run = context["dag_run"]
        repair_batch = (context.get("params") or {}).get("repair_batch")
        if repair_batch:
            return self._repair(spec, run, repair_batch)
        from tidemark.ledger import batch_id_for

        interval = None
        if str(getattr(run, "run_type", "")).lower().endswith("backfill"):
            interval = (context["data_interval_start"], context["data_interval_end"])
        tag = (f"pipeline={spec.name} batch={batch_id_for(spec.name, run.run_id)} run={run.run_id} window="
               + (f"backfill [{interval[0]}, {interval[1]})" if interval else "not planned yet"))
        with on_call(self.log, tag, "fix the cause named here (spec, source table, grants or topic), then clear this task",
                     clear_from=PLAN):
            self._check_topic(spec)
            source = DatabaseHook(spec.source_conn_id).get_conn()
            warehouse = DatabaseHook(self.warehouse_conn_id).get_conn()
            try:
                plan = steps.plan(spec, source, warehouse, run_id=run.run_id, interval=interval)
            finally:
                source.close()
                warehouse.close()
        self.log.info("%s planned%s", run_tag(spec, plan), " (same window as the earlier try of this run)" if plan.reused else "")
        return plan.to_xcom()

    def _check_topic(self, spec) -> None:
        """A topic with fewer replicas than the Kafka connection asks for is refused here, before anything is
        recorded; with the broker away the plan goes on (it needs only the databases) and begin checks."""
        from tidemark.protocol.kafka_io import ensure_topic_if_reachable

        kafka = KafkaHook(self.kafka_conn_id)
        away = ensure_topic_if_reachable(kafka.bootstrap(), spec.topic, spec.partitions, replication=kafka.replication())
        if away is not None:
            self.log.warning("pipeline=%s topic %s not checked now: Kafka does not answer (%s); begin checks it "
                             "before it opens an attempt", spec.name, spec.topic, away)

    def _repair(self, spec, run, batch_id: str) -> dict[str, Any]:
        """A run with ``repair_batch``: the repair batch a reconciliation planned (its keys are in the ledger)."""
        from tidemark.batch import repair

        tag = f"pipeline={spec.name} run={run.run_id} repair_batch={batch_id}"
        with on_call(self.log, tag, f"run tidemark_reconcile_{spec.name} with repair=true: it plans the repair "
                     "batch and triggers this DAG with it", clear_from=PLAN):
            self._check_topic(spec)
            warehouse = DatabaseHook(self.warehouse_conn_id).get_conn()
            try:
                plan, found = repair.load(spec, warehouse, batch_id)
            finally:
                warehouse.close()
        self.log.info("%s repair of %s key(s) found by reconciliation run %s (of %s), planned; the watermark "
                      "stays where it is", run_tag(spec, plan), len(found.repair_keys), found.repair_run,
                      f"batch {found.repair_of}" if found.repair_of else "the whole table")
        return plan.to_xcom()


class BeginBatchOperator(_PipelineOperator):
    """Open the next attempt and send BEGIN to every partition; skip the run if already committed."""

    def execute(self, context) -> int:
        spec, plan = self.spec, run_plan(context)
        return open_attempt(self, spec, plan, context)


def open_attempt(op: BaseOperator, spec, plan, context) -> int:
    """BEGIN for a new attempt of the run's batch. A committed batch is never reopened: clearing a
    successful run skips the rest of it and changes nothing."""
    from tidemark.batch import steps
    from tidemark.ledger import AlreadyCommitted

    with on_call(op.log, run_tag(spec, plan), NEXT_FIX_THEN_CLEAR.format(task=BEGIN)):
        warehouse = DatabaseHook(op.warehouse_conn_id).get_conn()
        try:
            kafka = KafkaHook(op.kafka_conn_id)
            return steps.begin(spec, warehouse, kafka.bootstrap(), plan, keyring=ControlKeysHook().keyring(),
                               replication=kafka.replication())
        except AlreadyCommitted as done:
            op.log.info("%s: %s. Nothing to do: the rest of this run is skipped. To load this window again, "
                        "trigger a new run; if this run never published its Asset event, clear only its "
                        "'%s' task with downstream.", run_tag(spec, plan), done, COMMITTED)
            raise AirflowSkipException(str(done)) from None
        finally:
            warehouse.close()


class ExtractWindowOperator(SparkJdbcSubmitOperator):
    """Run spark_jobs/extract_window.py for the planned window and keep its totals in the ledger.

    Returns only ``{"attempt", "rows"}``. A retry of this task starts a new attempt (new BEGIN),
    which fences whatever the failed try wrote: the sink discards records of superseded attempts.
    """

    def __init__(self, *, spec_path: str, source_conn_id: str, warehouse_conn_id: str = CONN_WAREHOUSE,
                 kafka_conn_id: str = CONN_KAFKA, read_partitions: int = jobs.READ_PARTITIONS, **kwargs: Any):
        super().__init__(script=jobs.EXTRACT_JOB, jdbc_conn_id=source_conn_id, **kwargs)
        self.spec_path = spec_path
        self.warehouse_conn_id = warehouse_conn_id
        self.kafka_conn_id = kafka_conn_id
        self.read_partitions = read_partitions

    def execute(self, context) -> dict[str, Any]:
        import json
        import tempfile

        from tidemark.batch import steps
        from tidemark.protocol.spec import load_spec

        spec, plan = load_spec(Path(self.spec_path)), run_plan(context)
        bootstrap = KafkaHook(self.kafka_conn_id).bootstrap()
        attempt = context["ti"].xcom_pull(task_ids=BEGIN)
        if context["ti"].try_number > 1:
            attempt = open_attempt(self, spec, plan, context)
            self.log.warning("%s: retry of the extract, loading as attempt %s", run_tag(spec, plan), attempt)
        tag = run_tag(spec, plan, attempt)
        with on_call(self.log, tag, NEXT_FIX_THEN_CLEAR.format(task=BEGIN)), \
                tempfile.TemporaryDirectory(prefix="tidemark-extract-") as tmp:
            report_path = Path(tmp) / "report.json"
            keys_path = Path(tmp) / "repair_keys.json" if plan.repair else None
            if keys_path is not None:  # a repair batch: the extract reads only the ledger's keys
                from tidemark.batch import repair

                source = DatabaseHook(spec.source_conn_id).get_conn()
                warehouse = DatabaseHook(self.warehouse_conn_id).get_conn()
                try:
                    repair.write_document(keys_path, spec, source, warehouse, plan.batch_id)
                finally:
                    source.close()
                    warehouse.close()
            self.job_args = jobs.extract_args(self.spec_path, plan.batch_id, attempt, plan.read_window, bootstrap,
                                              report_path, self.read_partitions, repair_keys=keys_path,
                                              writer_schema=plan.writer_schema, handoff=plan.handoff,
                                              warehouse=self._direct(plan))
            if plan.handoff:  # the slot is created, and the snapshot read, as the replication role
                self.jdbc_conn_id = CONN_CDC
                self.log.info("%s: the CDC handoff batch: extracting as connection %s, in the snapshot of the "
                              "replication slot %s it creates", tag, CONN_CDC, spec.cdc_slot)
            self.log.info("%s: extracting", tag)
            super().execute(context)
            report = json.loads(report_path.read_text())
            warehouse = DatabaseHook(self.warehouse_conn_id).get_conn()
            try:
                rows = steps.record_extract(spec, warehouse, plan, attempt, report)
            finally:
                warehouse.close()
        self.log.info("%s: extracted rows=%s per partition %s in %.1fs (totals kept in the ledger)", tag, rows,
                      {p: t["rows"] for p, t in report["totals"].items()}, report["seconds"])
        return {"attempt": attempt, "rows": rows}


    def _direct(self, plan) -> list[str] | None:
        """A direct batch's warehouse arguments (its tasks stage the rows); the password goes apart."""
        if plan.transport != "direct":
            return None
        c = DatabaseHook(self.warehouse_conn_id).endpoint()
        self.env_vars = {**(self.env_vars or {}), jobs.WAREHOUSE_PASSWORD_ENV: c.password or ""}
        return jobs.warehouse_args(c.host, c.port, c.schema, c.login or "", c.extra_dejson)


class EndBatchOperator(_PipelineOperator):
    """Seal the attempt with the extract's totals (from the ledger) and send END to every partition."""

    def execute(self, context) -> int:
        from tidemark.batch import steps

        spec, plan, attempt = self.spec, run_plan(context), run_attempt(context)
        with on_call(self.log, run_tag(spec, plan, attempt), NEXT_FIX_THEN_CLEAR.format(task=BEGIN)):
            warehouse = DatabaseHook(self.warehouse_conn_id).get_conn()
            try:
                return steps.end(spec, warehouse, KafkaHook(self.kafka_conn_id).bootstrap(), plan, attempt,
                                 keyring=ControlKeysHook().keyring())
            finally:
                warehouse.close()


class BatchSinkOperator(SparkJdbcSubmitOperator):
    """Run the two-phase sink (spark_jobs/batch_sink.py) until the topic is drained.

    A pipeline whose spec says ``sink: {mode: standing}`` has a sink running under the
    ``tidemark_supervisor`` DAG: this step then submits nothing and the next one waits for it.
    """

    def __init__(self, *, spec_path: str, warehouse_conn_id: str = CONN_WAREHOUSE,
                 kafka_conn_id: str = CONN_KAFKA, **kwargs: Any):
        super().__init__(script=jobs.SINK_JOB, jdbc_conn_id=warehouse_conn_id, **kwargs)
        self.spec_path = spec_path
        self.kafka_conn_id = kafka_conn_id

    def execute(self, context) -> None:
        from tidemark.protocol.spec import load_spec

        spec, plan = load_spec(Path(self.spec_path)), run_plan(context)
        tag = run_tag(spec, plan, run_attempt(context))
        if spec.sink.mode == "standing":
            self.log.info("%s: the standing sink (supervised by tidemark_supervisor) applies this batch; "
                          "%s waits for it", tag, COMMITTED)
            return
        from tidemark.protocol.control import CONTROL_KEYS_ENV

        kafka = KafkaHook(self.kafka_conn_id)
        self.job_args = jobs.sink_args(self.spec_path, kafka.bootstrap(), replication=kafka.replication())
        with on_call(self.log, tag, NEXT_FIX_THEN_CLEAR.format(task=BEGIN)):
            # the sink verifies the control messages' signatures: the keyring only in its environment
            self.env_vars = {**(self.env_vars or {}), CONTROL_KEYS_ENV: ControlKeysHook().keyring().text()}
            super().execute(context)


class SinkBackpressureSensor(BaseSensorOperator):
    """Backpressure: hold the nightly batch while the pipeline's sink is more than ``sink.max_lag``
    records behind its topic (a standing sink that fell behind), for at most ``sink.max_lag_wait``.

    Runs in reschedule mode: between pokes it holds no worker slot. Each poke logs how far behind
    the sink is and since when this run waits; past the limit it fails with what to look at."""

    template_fields = ("spec_path",)

    def __init__(self, *, spec_path: str, warehouse_conn_id: str = CONN_WAREHOUSE,
                 kafka_conn_id: str = CONN_KAFKA, **kwargs: Any):
        kwargs.setdefault("mode", "reschedule")
        kwargs.setdefault("poke_interval", 30)
        super().__init__(**kwargs)
        self.spec_path = spec_path
        self.warehouse_conn_id = warehouse_conn_id
        self.kafka_conn_id = kafka_conn_id

    def poke(self, context) -> bool:
        from datetime import datetime, timezone

        from tidemark.protocol.spec import load_spec
        from tidemark.sink.lag import backpressure

        spec = load_spec(Path(self.spec_path))
        warehouse = DatabaseHook(self.warehouse_conn_id).get_conn()
        try:
            go, why = backpressure(spec, warehouse, KafkaHook(self.kafka_conn_id).bootstrap())
        finally:
            warehouse.close()
        if go:
            self.log.info("%s: the batch goes on", why)
            return True
        since = context["ti"].start_date or datetime.now(timezone.utc)
        waited = datetime.now(timezone.utc) - since
        if waited > spec.sink.max_lag_wait:
            raise AirflowFailException(
                f"{why}: waited {waited} (sink.max_lag_wait {spec.sink.max_lag_wait}). Next: see the pipeline on the "
                "Tidemark status page and the tidemark_supervisor log (a stalled or crash-looping sink), then clear "
                "this task")
        self.log.warning("%s: the batch waits (since %s, %s so far)", why, since.isoformat(), waited)
        return False


class PipelineTurnSensor(BaseSensorOperator):
    """One run of a pipeline at a time from plan to commit, whatever started it (the schedule,
    Trigger, a backfill, a repair): Airflow's ``max_active_runs`` does not count backfill runs with
    the others, and two runs loading at once collide on the topic and plan windows over each other.

    The run takes the pipeline's turn in the ledger or waits for it, in reschedule mode (no worker
    slot), each poke naming the run that holds it; the teardown hands the turn on. A turn held by a
    run that has ended without its teardown (marked failed by hand, deleted) is taken over."""

    template_fields = ("spec_path",)

    def __init__(self, *, spec_path: str, warehouse_conn_id: str = CONN_WAREHOUSE, **kwargs: Any):
        kwargs.setdefault("mode", "reschedule")
        kwargs.setdefault("poke_interval", 10)
        kwargs.setdefault("timeout", timedelta(hours=12).total_seconds())
        super().__init__(**kwargs)
        self.spec_path = spec_path
        self.warehouse_conn_id = warehouse_conn_id

    def poke(self, context) -> bool:
        from tidemark import ledger
        from tidemark.protocol.spec import load_spec

        name, run_id = load_spec(Path(self.spec_path)).name, context["dag_run"].run_id
        warehouse = DatabaseHook(self.warehouse_conn_id).get_conn()
        try:
            with warehouse, warehouse.cursor() as cur:
                ledger.ensure_control_schema(cur)
                held = ledger.take_turn(cur, name, run_id)
                if held is not None and self._ended(context, held[0]):
                    self.log.warning("pipeline=%s run=%s: run %s held the pipeline's turn since %s but has ended "
                                     "without handing it on; taken over", name, run_id, *held)
                    held = ledger.take_turn(cur, name, run_id, stale=held[0])
        finally:
            warehouse.close()
        if held is None:
            self.log.info("pipeline=%s run=%s: this run's turn; other runs of the pipeline wait until it ends",
                          name, run_id)
            return True
        self.log.warning("pipeline=%s run=%s WAITS: run %s holds the pipeline's turn since %s (one run at a time from "
                         "plan to commit); this run goes on when that one ends", name, run_id, *held)
        return False

    def _ended(self, context, holder: str) -> bool:
        try:
            state = context["ti"].get_dagrun_state(dag_id=context["dag"].dag_id, run_id=holder)
        except Exception as exc:  # a run deleted from the UI is gone for good; anything else: ask again later
            return "not found" in str(exc).lower() or "not_found" in str(exc).lower()
        return str(getattr(state, "value", state)).lower() in ("success", "failed")


class BatchCommittedSensor(BaseSensorOperator):
    """Wait until the sink has committed this run's attempt; fail at once if it was refused.

    Runs in reschedule mode by default: between pokes it holds no worker slot. A batch sink has
    committed by the first poke; a standing sink within seconds, or later when it is behind: the
    pokes start 2-5 s apart and back off to one a minute (a fixed 30 s kept every standing batch
    waiting half a minute for nothing).
    """

    template_fields = ("spec_path",)

    def __init__(self, *, spec_path: str, warehouse_conn_id: str = CONN_WAREHOUSE, **kwargs: Any):
        kwargs.setdefault("mode", "reschedule")
        kwargs.setdefault("poke_interval", 5)
        kwargs.setdefault("exponential_backoff", True)
        kwargs.setdefault("max_wait", timedelta(minutes=1))
        kwargs.setdefault("timeout", timedelta(hours=6).total_seconds())
        super().__init__(**kwargs)
        self.spec_path = spec_path
        self.warehouse_conn_id = warehouse_conn_id

    def poke(self, context) -> bool:
        from tidemark.batch import steps
        from tidemark.protocol.spec import load_spec

        spec, plan, attempt = load_spec(Path(self.spec_path)), run_plan(context), run_attempt(context)
        # A refused batch says in its message what to do (alter the target, or load a new attempt).
        with on_call(self.log, run_tag(spec, plan, attempt), "see the refusal above for the next step"):
            warehouse = DatabaseHook(self.warehouse_conn_id).get_conn()
            try:
                done = steps.commit_state(spec, warehouse, plan.batch_id, attempt)
                if done:
                    facts = steps.summary(warehouse, plan.batch_id)
                    self.log.info("pipeline=%s batch=%s attempt=%s window=%s COMMITTED rows=%s watermark=%s "
                                  "transport=%s", spec.name, plan.batch_id, attempt, facts["window"], facts["rows"],
                                  facts["watermark"], facts["transport"])
                    context["ti"].xcom_push(key="summary", value=facts)
                return done
            finally:
                warehouse.close()


class AbortUnfinishedOperator(_PipelineOperator):
    """Teardown: whatever ended this run (a failed task, a killed worker, a timeout), its batch's
    latest attempt must not stay open. Aborts it in the ledger, then sends ABORT, then hands the
    pipeline's turn on to the next run."""

    def execute(self, context) -> None:
        from tidemark import ledger

        spec = self.spec
        self._abort(context, spec)
        # Then the next run of the pipeline may go: nothing of this one stays open. (If the abort keeps
        # failing, the turn goes when this run has ended: wait_turn takes over an ended run's turn.)
        warehouse = DatabaseHook(self.warehouse_conn_id).get_conn()
        try:
            with warehouse, warehouse.cursor() as cur:
                if ledger.release_turn(cur, spec.name, context["dag_run"].run_id):
                    self.log.info("pipeline=%s run=%s: the pipeline's turn is handed on to the next run", spec.name,
                                  context["dag_run"].run_id)
        finally:
            warehouse.close()

    def _abort(self, context, spec) -> None:
        from tidemark.batch import steps

        try:
            plan = run_plan(context, required=False)
        except AirflowFailException as unreadable:  # nothing can have begun from it: hand the turn on
            self.log.warning("pipeline=%s: %s", spec.name, unreadable)
            return
        if plan is None:
            self.log.info("pipeline=%s: nothing was planned in this run; nothing to clean up", spec.name)
            return
        reason = f"DAG run {context['dag_run'].run_id} ended without committing it (see that run's failed task)"
        warehouse = DatabaseHook(self.warehouse_conn_id).get_conn()
        try:  # the ledger row is what fences the attempt: its failure fails this task (and it retries)
            attempt = steps.abort_in_ledger(spec, warehouse, plan, reason)
        finally:
            warehouse.close()
        if attempt is not None:
            try:  # ABORT only lets a running sink drop the stage at once
                steps.abort(spec, KafkaHook(self.kafka_conn_id).bootstrap(), plan, attempt, reason,
                            keyring=ControlKeysHook().keyring())
            except Exception as exc:
                self.log.error("%s: could not send ABORT (%s); the ledger marks the attempt aborted, so the sink "
                               "discards its records and drops its stage table at its next start",
                               run_tag(spec, plan), failure_line(exc))
        if attempt is None:
            self.log.info("%s: no unfinished attempt (committed, refused or never begun): nothing to abort",
                          run_tag(spec, plan))
        else:
            self.log.warning("%s: attempt %s was left unfinished and is now ABORTED; nothing of it will be applied. "
                             "Next: fix what failed, then clear the run from '%s' to load a new attempt",
                             run_tag(spec, plan), attempt, BEGIN)


def batch_pipeline(spec_path: str | Path, *, source_conn_id: str, backpressure: bool = False) -> BaseOperator:
    """Wire wait_turn >> plan >> begin >> extract >> end >> sink >> wait_committed >> publish in the
    current DAG, after ``wait_for_sink`` with ``backpressure`` (the spec sets ``sink.max_lag``),
    with ``abort_unfinished`` as the teardown of the whole chain (wait_turn and plan its setups).

    Returns the publish task, whose outlet is the pipeline's Asset, so callers can chain more work.
    """
    from airflow.sdk import chain, task

    path, name = str(spec_path), Path(spec_path).stem
    asset = batch_asset(name)
    gate = [SinkBackpressureSensor(task_id=GATE, spec_path=path)] if backpressure else []
    turn = PipelineTurnSensor(task_id=TURN, spec_path=path)
    plan = PlanWindowOperator(task_id=PLAN, spec_path=path)
    begin = BeginBatchOperator(task_id=BEGIN, spec_path=path)
    extract = ExtractWindowOperator(task_id=EXTRACT, spec_path=path, source_conn_id=source_conn_id)
    end = EndBatchOperator(task_id=END, spec_path=path)
    sink = BatchSinkOperator(task_id=SINK, spec_path=path)
    committed = BatchCommittedSensor(task_id=COMMITTED, spec_path=path)
    cleanup = AbortUnfinishedOperator(task_id=CLEANUP, spec_path=path, retries=3)

    @task(task_id=PUBLISH, outlets=[asset])
    def publish(*, outlet_events=None, ti=None) -> dict[str, Any]:
        """Emit the Asset event for the committed batch (reconciliation is scheduled on it).

        An empty batch says so (``empty: true``), so nobody takes it for fresh data."""
        from tidemark.protocol.progress import summary_line

        facts = ti.xcom_pull(task_ids=COMMITTED, key="summary")
        facts = {**facts, "empty": not facts.get("rows")}
        outlet_events[asset].extra = facts
        print(summary_line("batch", **facts), flush=True)
        return facts

    last = publish()
    step_tasks = {PLAN: plan, BEGIN: begin, EXTRACT: extract, END: end, SINK: sink, COMMITTED: committed}
    chain(*gate, turn, *(step_tasks[name] for name in STEPS), last, cleanup.as_teardown(setups=[turn, plan]))
    return last

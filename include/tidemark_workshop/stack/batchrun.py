"""One pipeline's batch steps run locally, for tests and benchmarks.

The steps are the same code the DAG runs: tidemark.batch for plan/BEGIN/END and spark-submit
of spark_jobs/extract_window.py and spark_jobs/batch_sink.py. ``make_pipeline`` makes a
throwaway pipeline (spec file, source table, topic).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psycopg2

from tidemark import ledger
from tidemark.batch import repair, steps
from tidemark.protocol.spec import PipelineSpec, load_spec
from tidemark.spark import jobs
from tidemark_workshop.settings import TEST_TRANSPORT_ENV, WAREHOUSE_DB, Settings
from tidemark_workshop.stack.spark import Submitted, submit


def query(settings: Settings, db: str, sql: str, params=()) -> list[tuple]:
    """One statement in its own connection and transaction: its rows (none for a statement without)."""
    conn = psycopg2.connect(settings.dsn(db))
    try:
        with conn, conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall() if cur.description else []
    finally:
        conn.close()


@dataclass
class Pipeline:
    settings: Settings
    spec: PipelineSpec
    path: Path
    jobs: list[Submitted] = field(default_factory=list)  # every spark-submit, in order (timings, memory)

    def with_fields(self, **fields) -> "Pipeline":
        """The same pipeline with its spec file changed (what the DAG and sink read from then on)."""
        raw = {**json.loads(self.path.read_text()), **fields}
        self.path.write_text(json.dumps(raw))
        return Pipeline(self.settings, load_spec(self.path), self.path, self.jobs)

    @property
    def keyring(self):
        """The orchestrator's control keyring (the stack's; the DAG reads the Airflow connection's)."""
        return self.settings.control_keyring()

    @property
    def source_table(self) -> str:
        return self.spec.table

    def src(self):
        return psycopg2.connect(self.settings.dsn(self.settings.source_db))

    def wh(self):
        return psycopg2.connect(self.settings.dsn(WAREHOUSE_DB))

    # --- steps -----------------------------------------------------------------------------
    def plan(self, run_id: str, interval=None) -> steps.Plan:
        src, wh = self.src(), self.wh()
        try:
            return steps.plan(self.spec, src, wh, run_id=run_id, interval=interval,
                              bootstrap=self.settings.kafka_bootstrap)
        finally:
            src.close()
            wh.close()

    def begin(self, plan: steps.Plan) -> int:
        wh = self.wh()
        try:
            return steps.begin(self.spec, wh, self.settings.kafka_bootstrap, plan, keyring=self.keyring)
        finally:
            wh.close()

    def extract_args(self, plan: steps.Plan, attempt: int, report: Path) -> list[str]:
        s = self.settings
        keys = None
        if plan.repair:  # as the DAG's extract step does: the keys document beside the report
            keys = report.with_suffix(".keys.json")
            src, wh = self.src(), self.wh()
            try:
                repair.write_document(keys, self.spec, src, wh, plan.batch_id)
            finally:
                src.close()
                wh.close()
        # as the DAG's extract step does: a CDC handoff batch runs as the replication role
        direct = jobs.warehouse_args(s.pg_host, s.pg_port, WAREHOUSE_DB, s.pg_user) if plan.transport == "direct" else None
        return [*s.database_args(s.source_db, user=s.cdc_user if plan.handoff else None),
                *jobs.extract_args(self.path, plan.batch_id, attempt, plan.read_window, s.kafka_bootstrap, report,
                                   repair_keys=keys, writer_schema=plan.writer_schema, handoff=plan.handoff,
                                   warehouse=direct)]

    def extract(self, plan: steps.Plan, attempt: int) -> dict:
        report = self.path.with_suffix(f".{uuid.uuid4().hex[:6]}.report.json")
        proc = self.extract_job(plan, attempt, report)
        assert proc.returncode == 0, f"extract failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        return json.loads(report.read_text())

    def extract_job(self, plan: steps.Plan, attempt: int, report: Path) -> Submitted:
        """The extract as the DAG's task runs it (either transport), whatever its exit; ``extract`` wants 0."""
        return self._submit(jobs.EXTRACT_JOB, self.extract_args(plan, attempt, report),
                            secret=self.settings.cdc_password if plan.handoff else None,
                            env={jobs.WAREHOUSE_PASSWORD_ENV: self.settings.pg_password})

    def end(self, plan: steps.Plan, attempt: int, report: dict) -> None:
        wh = self.wh()
        try:
            steps.record_extract(self.spec, wh, plan, attempt, report)
            steps.end(self.spec, wh, self.settings.kafka_bootstrap, plan, attempt, keyring=self.keyring)
        finally:
            wh.close()

    def send_end(self, plan: steps.Plan, attempt: int, report: dict) -> None:
        """END on the topic only, as a duplicated or replayed message would arrive (no ledger step)."""
        from tidemark.protocol.control import loads_totals

        steps.send_end(self.spec, self.settings.kafka_bootstrap, plan, attempt, loads_totals(report["totals"]),
                       keyring=self.keyring)

    def abort(self, plan: steps.Plan, attempt: int, reason: str) -> None:
        steps.abort(self.spec, self.settings.kafka_bootstrap, plan, attempt, reason, keyring=self.keyring)

    def sink_args(self, *, available_now: bool = True) -> list[str]:
        s = self.settings
        return [*s.database_args(WAREHOUSE_DB),
                *jobs.sink_args(self.path, s.kafka_bootstrap, available_now=available_now)]

    def sink(self) -> dict:
        proc = self._submit(jobs.SINK_JOB, self.sink_args())
        assert proc.returncode == 0, f"sink failed:\n{proc.stdout[-5000:]}\n{proc.stderr[-5000:]}"
        from tidemark.protocol.progress import parse_summaries

        return parse_summaries(proc.stdout)[-1]

    def _submit(self, script: str, args: list[str], secret: str | None = None,
                env: dict[str, str] | None = None) -> Submitted:
        proc = submit(self.settings, script, args, secret=secret or self.settings.pg_password, env=env)
        self.jobs.append(proc)
        return proc

    def run(self, run_id: str, interval=None) -> tuple[steps.Plan, int]:
        """One whole batch, plan to commit; asserts it committed."""
        return self.load(self.plan(run_id, interval))

    def repair(self, outcome) -> tuple[steps.Plan, int]:
        """The repair batch of a reconciliation's ``outcome`` (``tidemark.reconcile.Outcome``), loaded."""
        wh = self.wh()
        try:
            plan = repair.plan(self.spec, wh, reconcile_run=outcome.run_id, repaired_batch=outcome.batch_id,
                               repaired=outcome.window, differences=outcome.verdict.differences,
                               complete=outcome.verdict.complete)
        finally:
            wh.close()
        return self.load(plan)

    def load(self, plan: steps.Plan) -> tuple[steps.Plan, int]:
        """BEGIN, extract, END and sink of a planned batch; asserts it committed."""
        attempt = self.begin(plan)
        self.end(plan, attempt, self.extract(plan, attempt))
        self.sink()
        assert self.state(plan.batch_id, attempt) == "committed", self.ledger(plan.batch_id)
        return plan, attempt

    # --- inspection ------------------------------------------------------------------------
    def state(self, batch_id: str, attempt: int) -> str | None:
        conn = self.wh()
        try:
            with conn, conn.cursor() as cur:
                return ledger.attempt_state(cur, batch_id, attempt)
        finally:
            conn.close()

    def ledger(self, batch_id: str) -> list[tuple]:
        return self.query_wh(
            "SELECT attempt, state, rows, message FROM tidemark_control.batch_attempts WHERE batch_id = %s ORDER BY attempt",
            (batch_id,),
        )

    def watermark(self):
        conn = self.wh()
        try:
            with conn, conn.cursor() as cur:
                bound = ledger.committed_watermark(cur, self.spec.name)
        finally:
            conn.close()
        return bound.to_json() if bound else None

    def query_wh(self, sql: str, params=()) -> list[tuple]:
        return query(self.settings, WAREHOUSE_DB, sql, params)

    def rows(self, side: str, columns: str) -> dict:
        conn = self.src() if side == "source" else self.wh()
        table = self.spec.table if side == "source" else self.spec.target_table
        key = ", ".join(self.spec.primary_key)
        try:
            with conn, conn.cursor() as cur:
                cur.execute(f"SELECT {key}, {columns} FROM {table} ORDER BY {key}")
                return {r[0]: r[1:] for r in cur.fetchall()}
        finally:
            conn.close()


def until(what: str, predicate, timeout: float = 180.0, every: float = 0.5):
    """Poll ``predicate`` until it returns something true, and return that; fail the test naming ``what``."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every)
    return value


PAYMENTS_DDL = """
CREATE TABLE {table} (
    id bigint PRIMARY KEY,
    amount numeric(18,2) NOT NULL,
    currency char(3) NOT NULL DEFAULT 'EUR',
    updated_at timestamptz NOT NULL DEFAULT now()
)"""  # the tests' usual source table: make_pipeline(settings, tmp_path, PAYMENTS_DDL)


def insert_payments(pipe: Pipeline, first: int, last: int, stamp: str = "now()") -> None:
    """Rows ``first``..``last`` of a PAYMENTS_DDL source, amount = id * 0.37, stamped ``stamp`` (SQL)."""
    conn = pipe.src()
    try:
        with conn, conn.cursor() as cur:
            cur.execute(f"INSERT INTO {pipe.source_table} (id, amount, updated_at) "
                        f"SELECT g, g * 0.37, {stamp} FROM generate_series(%s, %s) g", (first, last))
    finally:
        conn.close()


def make_pipeline(settings: Settings, tmp_path: Path, source_ddl: str, **fields) -> Pipeline:
    """A fresh pipeline named it_<random>: source table `<name>_src`, target `<name>_tgt`; its transport
    the test's, else ``TEST_TRANSPORT_ENV``'s (`make test-direct`) where the record format allows it, else Kafka."""
    name = f"it_{uuid.uuid4().hex[:10]}"
    spec = {
        "name": name, "table": f"public.{name}_src", "primary_key": ["id"],
        "cursor": {"kind": "timestamp", "column": "updated_at"}, "safe_lag": "PT0S",
        "target_table": f"public.{name}_tgt", "partitions": 3, **fields,
    }
    transport = os.environ.get(TEST_TRANSPORT_ENV)
    if transport and transport not in ("kafka", "direct"):  # a typo never runs the suite on Kafka unsaid
        raise ValueError(f"{TEST_TRANSPORT_ENV}={transport!r}: kafka or direct")
    if transport and "transport" not in fields and fields.get("record_format", "avro") == "avro":
        spec["transport"] = transport
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps(spec))  # JSON is YAML
    conn = psycopg2.connect(settings.dsn(settings.source_db))
    try:
        with conn, conn.cursor() as cur:
            cur.execute(source_ddl.format(table=spec["table"]))
    finally:
        conn.close()
    return Pipeline(settings, load_spec(path), path)


def dead_letters(bootstrap: str, source_topic: str, dlq_topic: str = "tidemark.dlq") -> list[dict[str, bytes]]:
    """Every dead letter that came from ``source_topic``: its headers, and its value as ``value``."""
    from confluent_kafka import Consumer, TopicPartition

    from tidemark.protocol.kafka_io import client_config

    consumer = Consumer(client_config(bootstrap, **{"group.id": "tidemark-test-dlq", "enable.partition.eof": True,
                                                    "isolation.level": "read_committed"}))
    consumer.assign([TopicPartition(dlq_topic, 0, 0)])
    found = []
    try:
        while True:
            msg = consumer.poll(10)
            if msg is None:
                raise TimeoutError(f"reading {dlq_topic} stalled")
            if msg.error():
                break
            headers = dict(msg.headers() or [])
            if headers.get("tidemark.source", b"").startswith(source_topic.encode() + b"/"):
                found.append({**headers, "value": msg.value() or b""})
    finally:
        consumer.close()
    return found


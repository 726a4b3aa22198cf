"""The Airflow side of stream supervision: launch commands from Tidemark's connections, one
supervisor cycle, and what a person asks of a stream (pause, resume, stop, clear a crash loop).

The cycle itself is ``tidemark.streams.cycle.run_cycle``; this module only resolves connections
(at run time) and turns crash loops into one failing line per pipeline.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from airflow.sdk.exceptions import AirflowFailException

from tidemark.protocol.config import (
    CONN_KAFKA,
    CONN_SPARK,
    CONN_WAREHOUSE,
    pipelines_dir,
    spark_jars,
    spark_job,
    streams_dir,
)
from tidemark.spark import jobs
from tidemark_airflow.hooks import ControlKeysHook, DatabaseHook, KafkaHook, SparkHook

log = logging.getLogger(__name__)
ACTIONS = {"pause": "paused", "resume": "running", "stop": "stopped", "clear": None, "resnapshot": None}


def _standing_specs():
    from tidemark.protocol.spec import load_specs

    valid, _ = load_specs(pipelines_dir())  # an invalid spec is the DAG processor's import error
    return [(path, spec) for path, spec in valid if spec.sink.mode == "standing"]


def sink_command(paths: dict[str, Path]):
    """spec -> (argv, env) of its standing sink: spark-submit exactly as the Spark provider's operator
    builds it from the ``tidemark_spark`` connection, the password only in the environment."""
    from tidemark.protocol.control import CONTROL_KEYS_ENV

    warehouse = DatabaseHook(CONN_WAREHOUSE).endpoint()
    kafka = KafkaHook(CONN_KAFKA)
    bootstrap, replication = kafka.bootstrap(), kafka.replication()
    keyring = ControlKeysHook().keyring()  # the sink verifies the control messages' signatures

    def command(spec):
        args = [*jobs.database_args(warehouse.host, warehouse.port, warehouse.schema, warehouse.login or "",
                                    warehouse.extra_dejson),
                *jobs.sink_args(paths[spec.name], bootstrap, available_now=False, replication=replication)]
        argv = SparkHook(CONN_SPARK).submit_command(
            str(spark_job(jobs.SINK_JOB)), conf=dict(jobs.SPARK_CONF), driver_memory=spec.sink.driver_memory,
            name=f"tidemark-stream-{spec.name}", jars=",".join(spark_jars()) or None, application_args=args)
        return argv, {**os.environ, jobs.PASSWORD_ENV: warehouse.password or "", CONTROL_KEYS_ENV: keyring.text()}

    return command


def launcher():
    """Where standing sinks run, from the ``tidemark_spark`` connection as the Spark provider resolves it:
    a ``spark://`` master with extra ``deploy-mode: cluster`` runs each sink's driver on that standalone
    cluster (extras ``master-ui``, default ``http://<host>:8080``; ``python``, the workers' interpreter);
    anything else runs it detached on this machine."""
    import shutil
    import sys

    from tidemark.streams.launch import LocalLauncher

    cluster = SparkHook(CONN_SPARK).cluster(standing=True)  # master and deploy mode, as the operator submits
    if not cluster.standalone_cluster:
        return LocalLauncher(streams_dir())
    from urllib.parse import urlsplit

    from tidemark.streams.standalone import StandaloneLauncher

    extra = cluster.extra
    jars = [j for j in spark_jars() if j.endswith(".jar")]
    if not jars:
        raise AirflowFailException("a standalone cluster runs a sink's Python driver through a jar, and "
                                   "TIDEMARK_SPARK_JARS names none; set it to the connector jars (with tidemark-udf.jar)")
    runner = next((j for j in jars if j.endswith("tidemark-udf.jar")), jars[0])
    master_ui = extra.get("master-ui") or f"http://{urlsplit(cluster.master).hostname}:8080"
    python = extra.get("python") or os.environ.get("PYSPARK_PYTHON") or sys.executable
    spark_class = shutil.which("spark-class") or "spark-class"
    return StandaloneLauncher(streams_dir(), cluster.master, master_ui, runner, python, spark_class=spark_class)


def supervise() -> list[str]:
    """One supervisor cycle over every standing pipeline; fails (one line per pipeline) on crash loops."""
    from tidemark.streams.cycle import prepare_stream_tables, run_cycle

    standing = _standing_specs()
    if not standing:
        log.info("no pipeline has sink.mode standing: nothing to supervise")
        return []
    from tidemark.ledger import ensure_control_schema

    warehouse = DatabaseHook(CONN_WAREHOUSE, application_name="tidemark-supervisor").get_conn()
    try:
        with warehouse, warehouse.cursor() as cur:
            ensure_control_schema(cur)
        for _, spec in standing:
            if spec.stream is not None or spec.cdc is not None:
                source = DatabaseHook(spec.source_conn_id, application_name="tidemark-supervisor")
                prepare_stream_tables(spec, warehouse, source.get_conn)
        report = run_cycle([spec for _, spec in standing], warehouse, launcher(),
                           KafkaHook(CONN_KAFKA).bootstrap(),
                           sink_command({spec.name: path for path, spec in standing}))
        failures = [*report.crash_looping, *_supervise_capture([spec for _, spec in standing if spec.cdc], warehouse,
                                                               report.lines)]
    finally:
        warehouse.close()
    if failures:
        raise AirflowFailException(" | ".join(failures))
    return report.lines


def _supervise_capture(specs, warehouse, lines: list[str]) -> list[str]:
    """Each capture's connector and slot (a CDC pipeline's, or a capture group's: ``tidemark.streams.capture``);
    the failures, one line each."""
    if not specs:
        return []
    from datetime import datetime, timezone

    from tidemark.protocol.config import CONN_CDC
    from confluent_kafka import KafkaException

    from tidemark.protocol.kafka_io import probe_broker, settled_replication
    from tidemark.realtime.cdc.groups import captures
    from tidemark.streams.capture import supervise_capture
    from tidemark.streams.cycle import policy_for
    from tidemark_airflow.hooks import ConnectHook

    client, endpoint = ConnectHook().capture()
    kafka = KafkaHook(CONN_KAFKA)
    bootstrap = kafka.bootstrap()
    broken = probe_broker(bootstrap)
    outage = None if broken is None else f"Kafka ({bootstrap}): {broken}"
    try:  # the change topics' replicas, settled for the cluster (unknown while it does not answer)
        replication = settled_replication(bootstrap, kafka.replication()) if broken is None else None
    except KafkaException as exc:
        replication, outage = None, f"Kafka ({bootstrap}): {exc}"
    failures = []
    for each in captures(specs):
        source = None
        try:
            source = DatabaseHook(CONN_CDC, application_name="tidemark-supervisor").get_conn()
            line, failure = supervise_capture(each, warehouse, source, client, endpoint, policy_for(each.lead),
                                              datetime.now(timezone.utc), outage, replication)
        except Exception as exc:  # one capture must not hide the others'
            line, failure = f"capture={each.name} capture: {exc}", f"{each.describe()}: capture: {exc}"
        finally:
            if source is not None:
                source.close()
        log.log(logging.ERROR if failure else logging.INFO, "%s", line)
        lines.append(line)
        if failure:
            failures.append(failure)
    return failures


def control(pipeline: str, action: str, reason: str, actor: str) -> str:
    """Record what a person asks of a pipeline's stream; the supervisor acts on it at its next cycle."""
    from tidemark import ledger

    specs = {spec.name: spec for _, spec in _standing_specs()}
    if pipeline not in specs:
        raise AirflowFailException(f"pipeline {pipeline!r} has no standing sink (standing: {sorted(specs) or 'none'}); "
                                   "set sink.mode: standing in its spec first")
    if action not in ACTIONS:
        raise AirflowFailException(f"action {action!r} is not one of {sorted(ACTIONS)}")
    if action == "resnapshot" and specs[pipeline].cdc is None:
        raise AirflowFailException(f"pipeline {pipeline!r} has no cdc section: only a pipeline that captures its "
                                   "table's changes is re-snapshotted")
    warehouse = DatabaseHook(CONN_WAREHOUSE, application_name="tidemark-stream-control").get_conn()
    try:
        with warehouse, warehouse.cursor() as cur:
            ledger.ensure_control_schema(cur)
            if action == "clear":
                done = ledger.clear_crash_loop(cur, pipeline, actor)
                return (f"pipeline={pipeline} crash loop cleared by {actor}: the supervisor restarts it at its next cycle"
                        if done else f"pipeline={pipeline} was not crash-looping: nothing to clear")
            if action == "resnapshot":
                ledger.request_resnapshot(cur, pipeline, actor, reason or None)
                return (f"pipeline={pipeline} re-snapshot asked for by {actor}" + (f" ({reason})" if reason else "")
                        + ": the supervisor stops its connector at its next cycle; the next batch run is a new "
                        "handoff (its slot made again, every row above the watermark read in its snapshot), then "
                        "the stream resumes on it")
            before = ledger.set_desired(cur, pipeline, ACTIONS[action], actor, reason or None)
    finally:
        warehouse.close()
    return (f"pipeline={pipeline} desired state {before} -> {ACTIONS[action]} by {actor}"
            + (f" ({reason})" if reason else "") + "; the supervisor acts at its next cycle")

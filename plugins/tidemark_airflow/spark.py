"""Spark submission wired to Tidemark's connections."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk.exceptions import AirflowException

from tidemark.protocol.config import CONN_SPARK, spark_driver_memory, spark_jars, spark_job
from tidemark.spark.entry import ERROR_FILE_ENV, EXIT_JOB_ERROR, read_cause
from tidemark.spark.jobs import PASSWORD_ENV, database_args, spark_conf
from tidemark_airflow.hooks import DatabaseHook, KafkaHook


class SparkJdbcSubmitOperator(SparkSubmitOperator):
    """Submit a job from ``spark_jobs/`` that reads a PostgreSQL connection over JDBC.

    At run time (never at parse time) it resolves ``jdbc_conn_id`` and adds ``--database`` (libpq
    parameters: host, port, database and the TLS options and connect timeout among the connection's
    extras, ``tidemark.spark.jobs.DATABASE_OPTIONS``) and ``--user`` to the job's arguments, which its
    psycopg2 and JDBC connections both honour; the password travels as an environment variable of
    spark-submit (``--password-env``), so it is in no command line, rendered field or log in local or
    standalone mode (on YARN or Kubernetes the Spark provider hands ``env_vars`` to spark-submit as
    ``--conf`` values: masked in the log, but on spark-submit's command line).
    With ``bootstrap_conn_id`` (a Kafka connection), ``--bootstrap`` and its bootstrap servers follow the job's
    arguments.
    The connector jars come from ``TIDEMARK_SPARK_JARS`` (resolved by the stack), so the job
    downloads nothing.
    """

    template_fields = (*SparkSubmitOperator.template_fields, "job_args")

    def __init__(self, *, script: str, jdbc_conn_id: str, job_args: Sequence[str] = (),
                 bootstrap_conn_id: str | None = None, **kwargs: Any):
        kwargs.setdefault("conn_id", CONN_SPARK)
        kwargs.setdefault("driver_memory", spark_driver_memory())
        kwargs.setdefault("name", f"tidemark-{script.removesuffix('.py')}")
        # a DAG's own conf is merged with Tidemark's, never instead of it: its JVMs still run in UTC
        kwargs["conf"] = spark_conf(kwargs.get("conf"))
        super().__init__(application=str(spark_job(script)), **kwargs)
        self.jdbc_conn_id, self.bootstrap_conn_id = jdbc_conn_id, bootstrap_conn_id
        self.job_args = list(job_args)

    def execute(self, context: Any) -> None:
        conn = DatabaseHook(self.jdbc_conn_id).endpoint()
        database = database_args(conn.host, conn.port, conn.schema, conn.login or "", conn.extra_dejson)
        broker = ["--bootstrap", KafkaHook(self.bootstrap_conn_id).bootstrap()] if self.bootstrap_conn_id else []
        self.application_args = [*database, *self.job_args, *broker]
        self.jars = self.jars or ",".join(spark_jars()) or None
        self.log.info("submitting %s against %s as %s", self.application, database[1], conn.login)
        with tempfile.TemporaryDirectory(prefix="tidemark-job-") as tmp:
            cause_file = Path(tmp) / "cause.txt"
            self.env_vars = {**(self.env_vars or {}), PASSWORD_ENV: conn.password or "", ERROR_FILE_ENV: str(cause_file)}
            try:
                super().execute(context)
            except AirflowException:
                code, cause = read_cause(cause_file)  # the job's own exit code, not the provider's message
                raise SparkJobFailed(
                    code, cause or "the job printed no cause (killed, or failed before starting); see its output above",
                ) from None


class SparkJobFailed(RuntimeError):
    """A spark-submit job ended non-zero; ``cause`` is the job's own one-line reason."""

    def __init__(self, exit_code: int | None, cause: str):
        super().__init__(f"Spark job exited {exit_code}: {cause}")
        self.exit_code, self.cause = exit_code, cause

    @property
    def deterministic(self) -> bool:
        return self.exit_code == EXIT_JOB_ERROR  # a JobError: the same input fails the same way

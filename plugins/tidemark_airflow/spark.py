"""Spark submission wired to Tidemark's connections."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Connection

from tidemark.settings import CONN_SPARK, REPO_ROOT, SPARK_DRIVER_MEMORY, jdbc_url

PASSWORD_ENV = "TIDEMARK_JDBC_PASSWORD"


class SparkJdbcSubmitOperator(SparkSubmitOperator):
    """Submit a job from ``spark_jobs/`` that reads a PostgreSQL connection over JDBC.

    At run time (never at parse time) it resolves ``jdbc_conn_id`` and adds ``--jdbc-url`` and
    ``--user`` to the job's arguments; the password travels as an environment variable of
    spark-submit (``--password-env``), so it is in no command line, rendered field or log.
    The connector jars come from ``TIDEMARK_SPARK_JARS`` (resolved by the stack), so the job
    downloads nothing.
    """

    template_fields = (*SparkSubmitOperator.template_fields, "job_args")

    def __init__(self, *, script: str, jdbc_conn_id: str, job_args: Sequence[str] = (), **kwargs: Any):
        kwargs.setdefault("conn_id", CONN_SPARK)
        kwargs.setdefault("driver_memory", SPARK_DRIVER_MEMORY)
        kwargs.setdefault("name", f"tidemark-{script.removesuffix('.py')}")
        super().__init__(application=str(REPO_ROOT / "spark_jobs" / script), **kwargs)
        self.jdbc_conn_id = jdbc_conn_id
        self.job_args = list(job_args)

    def execute(self, context: Any) -> None:
        conn = Connection.get(self.jdbc_conn_id)
        url = jdbc_url(conn.host, conn.port, conn.schema)
        self.application_args = [
            "--jdbc-url", url, "--user", conn.login or "", "--password-env", PASSWORD_ENV,
            *self.job_args,
        ]
        self.env_vars = {**(self.env_vars or {}), PASSWORD_ENV: conn.password or ""}
        self.jars = self.jars or os.environ.get("TIDEMARK_SPARK_JARS") or None
        self.log.info("submitting %s against %s as %s", self.application, url, conn.login)
        super().execute(context)

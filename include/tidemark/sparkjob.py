"""What every Tidemark Spark entry script needs: arguments, secrets, a session, a DB connection.

Kept free of Airflow; imported by the scripts in ``spark_jobs/`` only (pyspark is imported
lazily so the core package stays light for DAG parsing).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any

# Every record's JSON carries timestamps to the microsecond, in UTC, like PostgreSQL stores them.
JSON_OPTIONS = {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX", "ignoreNullFields": "true"}


class JobError(RuntimeError):
    """A job-level inconsistency: the script prints it and exits non-zero."""


def jdbc_args(parser: argparse.ArgumentParser) -> None:
    """The arguments SparkJdbcSubmitOperator fills in from an Airflow connection."""
    parser.add_argument("--jdbc-url", required=True)
    parser.add_argument("--user", required=True)
    parser.add_argument("--password-env", required=True, help="name of the env var holding the password")


def password(args: argparse.Namespace) -> str:
    value = os.environ.get(args.password_env)
    if value is None:
        raise JobError(f"environment variable {args.password_env} (the database password) is not set")
    return value


def session(app: str, **conf: Any):
    import time

    from pyspark.sql import SparkSession

    os.environ["TZ"] = "UTC"  # PySpark turns timestamps into naive datetimes in the process's zone
    time.tzset()
    builder = SparkSession.builder.appName(app).config("spark.sql.session.timeZone", "UTC")
    for key, value in conf.items():
        builder = builder.config(key, str(value))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")  # the job's own lines are what the person on call needs
    # When the JVM was ready for work: benchmarks report start-up apart from the job's work.
    from tidemark.summary import summary_line

    print(summary_line("spark-session", app=app, ready_at=round(time.time(), 3)), flush=True)
    return spark


def connect(jdbc_url: str, user: str, secret: str):
    """A psycopg2 connection to the database a JDBC URL names."""
    import psycopg2

    match = re.fullmatch(r"jdbc:postgresql://([^:/]+)(?::(\d+))?/([^?]+)(?:\?.*)?", jdbc_url)
    if not match:
        raise JobError(f"not a PostgreSQL JDBC URL: {jdbc_url}")
    host, port, db = match.groups()
    return psycopg2.connect(host=host, port=int(port or 5432), dbname=db, user=user, password=secret)


def run(main, argv: list[str], name: str) -> int:
    """Run ``main``; a JobError becomes one clear line on stderr and exit code 3."""
    try:
        return main(argv) or 0
    except JobError as exc:
        print(f"{name}: FAILED: {exc}", file=sys.stderr, flush=True)
        return 3

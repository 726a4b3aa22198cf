"""What every Tidemark Spark entry script needs: arguments, secrets, a session, a DB connection.

Kept free of Airflow; imported by the scripts in ``spark_jobs/`` only (pyspark is imported
lazily so the core package stays light for DAG parsing).
"""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import contextmanager
from typing import Any, Iterator

from tidemark.protocol.config import environment, job_error_file
from tidemark.protocol.errors import EXIT_OUTAGE, OUTAGE_LINE, Outage, Terminal, TidemarkError, Transient
from tidemark.spark.jobs import DATABASE_OPTIONS, SERVER_TYPES

# Every record's JSON carries timestamps to the microsecond, in UTC, like PostgreSQL stores them.


class JobError(Terminal):
    """A job-level inconsistency the same input meets again: the script prints it and exits 3."""


class TransientJobError(Transient):
    """An inconsistency a new attempt may not meet (e.g. a write retried across a broker restart): exit 4."""


def database_args(parser: argparse.ArgumentParser) -> None:
    """The arguments SparkJdbcSubmitOperator fills in from an Airflow connection
    (``tidemark.spark.jobs.database_args``)."""
    parser.add_argument("--database", required=True,
                        help="libpq parameters without the password, e.g. 'host=db port=5432 dbname=src sslmode=require'")
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
    from tidemark.protocol.progress import summary_line

    print(summary_line("spark-session", app=app, ready_at=round(time.time(), 3)), flush=True)
    return spark




def database(dsn: str) -> dict[str, str]:
    """The libpq parameters of ``--database``, read by libpq's own parser: host, port, dbname and the
    options of ``DATABASE_OPTIONS``. Anything else, the password above all, is refused by name."""
    from psycopg2 import ProgrammingError
    from psycopg2.extensions import parse_dsn

    try:
        params = parse_dsn(dsn)
    except ProgrammingError:  # neither the text nor libpq's message quoting it: it may hold a secret
        raise JobError("--database is not libpq key=value parameters (libpq cannot parse it; not shown here, "
                       "it may hold a secret)") from None
    if "password" in params:
        raise JobError("--database must not hold the password: it travels in the variable --password-env names")
    unknown = sorted(set(params) - {"host", "port", "dbname", *DATABASE_OPTIONS})
    if unknown or not {"host", "dbname"} <= set(params):
        raise JobError(f"--database takes host, port, dbname and {', '.join(DATABASE_OPTIONS)}; got {sorted(params)}")
    hosts, ports = _hosts_and_ports(params)
    if any(not h or h.startswith("/") for h in hosts) or len(ports) not in (1, len(hosts)):
        raise JobError(f"--database host {params['host']!r} port {params.get('port')!r}: a job takes host names or "
                       "addresses (a primary and its replicas), each with its port or one port for all, not a "
                       "socket directory")  # no JDBC URL says the same
    if params.get("target_session_attrs", "read-write") not in SERVER_TYPES:
        raise JobError(f"--database target_session_attrs={params['target_session_attrs']!r}: the JDBC driver knows "
                       f"{', '.join(SERVER_TYPES)}")
    return params


def _hosts_and_ports(params: dict[str, str]) -> tuple[list[str], list[str]]:
    """libpq's comma-separated ``host`` and ``port`` lists (a primary and its replicas)."""
    return params["host"].split(","), (params.get("port") or "5432").split(",")


def connect_params(dsn: str, user: str, secret: str, *, application: str | None = None) -> dict[str, Any]:
    """psycopg2.connect keywords for ``--database`` (the password among them)."""
    params: dict[str, Any] = {**database(dsn), "user": user, "password": secret}
    if application:
        params["application_name"] = application
    return params


def jdbc_url(dsn: str, *, application: str | None = None, **driver: str) -> str:
    """The JDBC URL of ``--database`` for Spark's reads and writes, with its TLS options and timeout
    under the driver's names, the sessions' ``application`` name (Spark hands the driver its
    properties lower-cased, and the driver knows ``ApplicationName`` only) and ``driver`` options."""
    from urllib.parse import quote, urlencode

    params = database(dsn)
    query = {jdbc: params[k] for k, jdbc in DATABASE_OPTIONS.items() if k in params and k != "target_session_attrs"}
    if "target_session_attrs" in params:  # which of several servers: the driver's names for libpq's
        query["targetServerType"] = SERVER_TYPES[params["target_session_attrs"]]
    if params.get("sslmode") == "require" and "sslrootcert" in params:
        query["sslmode"] = "verify-ca"  # what libpq's require does with a root certificate; the driver's does not
    if application:
        query["ApplicationName"] = application
    query.update(driver)
    hosts, ports = _hosts_and_ports(params)
    ports = ports if len(ports) == len(hosts) else ports[:1] * len(hosts)  # libpq: one port serves them all
    servers = ",".join(f"{f'[{h}]' if ':' in h else h}:{p}" for h, p in zip(hosts, ports))
    url = f"jdbc:postgresql://{servers}/{quote(params['dbname'])}"
    return f"{url}?{urlencode(query)}" if query else url


def connect(dsn: str, user: str, secret: str, *, application: str | None = None):
    """A psycopg2 connection to ``--database`` (``application``: its application_name, what
    pg_stat_activity shows the database's administrator)."""
    import psycopg2

    return psycopg2.connect(**connect_params(dsn, user, secret, application=application))


@contextmanager
def side_queries(dsn: str, user: str, secret: str, *, application: str | None = None) -> Iterator[Any]:
    """A psycopg2 connection for a job's few queries beside Spark's reads of a source: in
    autocommit, so no statement leaves a transaction open on the source (``idle in transaction``,
    holding back its vacuum while the job runs on), and closed on leaving, whatever happened."""
    conn = connect(dsn, user, secret, application=application)
    try:
        conn.autocommit = True
        yield conn
    finally:
        conn.close()


# Where a job writes its exit code and the one-line cause of its failure, for the task that submitted it
# (``read_cause``): a JSON object {"exit_code": ..., "cause": ...}.
ERROR_FILE_ENV = "TIDEMARK_JOB_ERROR_FILE"
EXIT_UNCAUGHT = 1  # Python's own exit code for an exception nobody caught
EXIT_JOB_ERROR = 3  # a Terminal error: the same input fails the same way, retrying cannot help
EXIT_TRANSIENT_JOB_ERROR = 4  # a Transient error: a retry, as a new attempt, may succeed


def one_line(exc: BaseException) -> str:
    """The innermost useful line of an error: for a Py4J/Spark exception wrapping a psycopg2 or
    Java error, its first line rather than pages of JVM frames."""
    text = str(exc).strip() or type(exc).__name__
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("at ", "File ", "Traceback", "---", "JVM stacktrace")):
            return f"{type(exc).__name__}: {line}"[:2000]  # a refusal quotes reasons and its next step
    return type(exc).__name__


def run(main, argv: list[str], name: str) -> int:
    """Run ``main``; Tidemark's own error (``tidemark.protocol.errors``) becomes one clear line on stderr and exit
    code 3, or 4 if ``Transient`` (75 for an ``Outage``). Any failure's exit code and one-line cause also go to the
    file named by TIDEMARK_JOB_ERROR_FILE, if set (``read_cause``). The environment is validated first: a bad variable fails the job at
    its start, named (``tidemark.protocol.config.ConfigError``)."""
    try:
        environment()
        return main(argv) or 0
    except TidemarkError as exc:
        print(f"{name}: FAILED: {exc}", file=sys.stderr, flush=True)
        code = (EXIT_OUTAGE if isinstance(exc, Outage) else EXIT_TRANSIENT_JOB_ERROR if isinstance(exc, Transient)
                else EXIT_JOB_ERROR)
        _write_cause(code, str(exc))
        if isinstance(exc, Outage):
            print(f"{name}: {OUTAGE_LINE}", file=sys.stderr, flush=True)
        return code
    except Exception as exc:
        _write_cause(EXIT_UNCAUGHT, one_line(exc))
        raise


def _write_cause(code: int, text: str) -> None:
    import json

    path = job_error_file()
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"exit_code": code, "cause": text}, f)


def read_cause(path) -> tuple[int | None, str | None]:
    """What a job wrote to its TIDEMARK_JOB_ERROR_FILE: its exit code and one-line cause, or (None, None)
    when it wrote nothing (killed, or failed before ``run``)."""
    import json

    try:
        with open(path, encoding="utf-8") as f:
            written = json.load(f)
    except (OSError, ValueError):
        return None, None
    if not isinstance(written, dict):
        return None, None
    return written.get("exit_code"), written.get("cause")

"""The Spark jobs' command lines and settings, written once.

The DAG factory (``tidemark_airflow.batch``) and the local runner (``tidemark_workshop.stack.batchrun``)
both follow the batch's sequence (``tidemark.batch.sequence``) and build each job's arguments and
Spark settings here, so what a test runs is what the scheduler runs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

from tidemark.protocol.errors import Terminal
from tidemark.protocol.replication import Replication
from tidemark.protocol.window import Window

EXTRACT_JOB = "extract_window.py"
SINK_JOB = "batch_sink.py"
PASSWORD_ENV = "TIDEMARK_JDBC_PASSWORD"  # the JDBC password reaches a job only through this variable
# A direct extract's warehouse password (``PipelineSpec.transport``), beside the source's
WAREHOUSE_PASSWORD_ENV = "TIDEMARK_WAREHOUSE_PASSWORD"
# Every Spark JVM (driver, executors) runs in UTC, whatever the zone of the machine or of the
# process that submits it (issue 29): the session zone alone is not enough, the PostgreSQL JDBC
# driver reads a naive `timestamp` as a wall-clock time in the JVM's own zone (a worker in
# Europe/Berlin loaded 22:00 as 20:00). Appended to any options already there, so it wins.
UTC_JVM_OPTION = "-Duser.timezone=UTC"
JAVA_OPTIONS_KEYS = ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions")
_USER_TIMEZONE = re.compile(r"""(?:^|\s)["']?-Duser\.timezone=[^\s"']*["']?(?=\s|$)""")
# The task threads' stack, where Java's regular expressions recurse: the events' screen of a table at its
# cap (tidemark.protocol.screen.SCREEN_FIELDS) needs about 350 KB, more than a third of HotSpot's default 1 MB,
# and an overflow would stop a standing sink at the same offsets on every restart. A caller's -Xss wins.
THREAD_STACK_OPTION = "-Xss4m"
_THREAD_STACK = re.compile(r"""(?:^|\s)["']?-Xss""")


def utc_java_options(options: str | None = None) -> str:
    """JVM ``options`` (a spark.*.extraJavaOptions value) with user.timezone UTC: every other
    option kept as written (quoting included), any other -Duser.timezone dropped, ours last."""
    kept = _USER_TIMEZONE.sub("", options or "").strip()
    return f"{kept} {UTC_JVM_OPTION}".strip()


def thread_stack_options(options: str | None = None) -> str:
    """JVM ``options`` with THREAD_STACK_OPTION first, unless they set a thread stack size of their own."""
    options = (options or "").strip()
    return options if _THREAD_STACK.search(options) else f"{THREAD_STACK_OPTION} {options}".strip()


def spark_conf(conf: Mapping[str, str] | None = None) -> dict[str, str]:
    """Tidemark's settings for a job merged with ``conf`` (a caller's own, which win) but for the
    zone: both extraJavaOptions keep the caller's options plus UTC (and THREAD_STACK_OPTION where
    the caller sets no stack size), and executors' processes (Python workers included) get TZ=UTC,
    as the driver's Python sets for itself."""
    merged = {**_BASE_CONF, **{str(k): str(v) for k, v in (conf or {}).items()}}
    for key in JAVA_OPTIONS_KEYS:
        merged[key] = utc_java_options(thread_stack_options(merged.get(key)))
    merged["spark.executorEnv.TZ"] = "UTC"
    return merged


_BASE_CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "4",
}
SPARK_CONF = spark_conf()  # every Tidemark job, in local mode and on a cluster alike
READ_PARTITIONS = 4  # parallel JDBC range reads of the extract


# What of a connection's extras a job honours too, on its psycopg2 and its JDBC connections alike
# (``tidemark.spark.entry.jdbc_url``): TLS, the connect timeout and which of several servers a session takes,
# libpq's name -> the JDBC driver's.
# The rest stays with Airflow.
DATABASE_OPTIONS = {"sslmode": "sslmode", "sslrootcert": "sslrootcert", "connect_timeout": "connectTimeout",
                    "target_session_attrs": "targetServerType"}
# libpq's target_session_attrs -> the JDBC driver's targetServerType (which server of several a session takes)
SERVER_TYPES = {"read-write": "primary", "primary": "primary", "any": "any", "read-only": "secondary",
                "standby": "secondary", "prefer-standby": "preferSecondary"}
# A client certificate's key is PEM to libpq and DER PKCS-8 to the JDBC driver (42.7.8): no one file
# serves both of a job's connections, so a connection that logs in with one is refused, by name.
CLIENT_CERTIFICATE = ("sslcert", "sslkey")


class UnsupportedOption(Terminal, ValueError):
    """A connection extra a Spark job cannot honour exactly on both of its connections."""


def servers(host: str, port: int | None) -> dict[str, str]:
    """libpq's ``host`` and ``port`` for a connection's host field: one server, or several for a primary and
    its replicas (``db1:5432,db2:5433``, or ``db1,db2`` on the connection's port): every session then goes to
    the one that takes writes (``target_session_attrs=read-write``, unless the extra says otherwise), so a
    promotion is followed without a configuration change."""
    names, ports = [], []
    for part in (p.strip() for p in (host or "").split(",")):
        name, colon, number = part.rpartition(":") if part.count(":") == 1 else ("", "", part)
        if not colon:
            name, number = part, ""
        if not name or (number and not number.isdigit()):
            raise UnsupportedOption(f"the connection's host {host!r} is not host[:port][,host[:port]...]")
        names.append(name)
        ports.append(number or str(port or 5432))
    found = {"host": ",".join(names), "port": ",".join(ports)}
    return {**found, "target_session_attrs": "read-write"} if len(names) > 1 else found


def database_args(host: str, port: int | None, dbname: str, user: str,
                  options: Mapping[str, object] | None = None) -> list[str]:
    """A job's database as libpq parameters (port 5432 when a connection has none), with the
    ``options`` of ``DATABASE_OPTIONS`` among a connection's extras; never the password, which
    travels in the environment variable ``PASSWORD_ENV``."""
    from psycopg2.extensions import make_dsn

    given = {k: str(v) for k, v in (options or {}).items() if v not in (None, "")}
    refused = sorted(set(given) & set(CLIENT_CERTIFICATE))
    if refused:
        raise UnsupportedOption(
            f"the connection's extra sets {', '.join(refused)}: Spark jobs cannot log in with a client certificate "
            "yet (libpq reads its key as PEM, the JDBC driver as DER PKCS-8). Next: give this connection's user a "
            "password login (TLS with sslmode and sslrootcert still applies)")
    if given.get("target_session_attrs", "read-write") not in SERVER_TYPES:
        raise UnsupportedOption(f"the connection's extra sets target_session_attrs={given['target_session_attrs']!r}: "
                                f"a Spark job's JDBC reads know {', '.join(SERVER_TYPES)}")
    kept = {k: v for k, v in given.items() if k in DATABASE_OPTIONS}
    dsn = make_dsn(**{**servers(host, port), "dbname": dbname, **kept})
    return ["--database", dsn, "--user", user, "--password-env", PASSWORD_ENV]


def warehouse_args(host: str, port: int | None, dbname: str, user: str,
                   options: Mapping[str, object] | None = None) -> list[str]:
    """A direct extract's warehouse (``--warehouse``, ``--warehouse-user``), like ``database_args``;
    its password travels in ``WAREHOUSE_PASSWORD_ENV``."""
    _, dsn, _, user, *_ = database_args(host, port, dbname, user, options)
    return ["--warehouse", dsn, "--warehouse-user", user, "--warehouse-password-env", WAREHOUSE_PASSWORD_ENV]


def extract_args(spec_path: Path | str, batch_id: str, attempt: int, window: Window, bootstrap: str,
                 report: Path | str, read_partitions: int = READ_PARTITIONS,
                 repair_keys: Path | str | None = None, writer_schema: str | None = None,
                 handoff: bool = False, warehouse: list[str] | None = None) -> list[str]:
    """spark_jobs/extract_window.py's arguments after the JDBC ones (``repair_keys``: the keys
    document of a repair batch, ``tidemark.batch.repair.write_document``; ``writer_schema``: the Avro
    schema of a protocol-version-2 batch; ``handoff``: a CDC pipeline's handoff batch, run as the
    replication role; ``warehouse``: ``warehouse_args`` of a direct batch, whose tasks stage its rows)."""
    return [
        "--spec", str(Path(spec_path).resolve()), "--batch-id", batch_id, "--attempt", str(attempt),
        "--window", json.dumps(window.to_json()), "--bootstrap", bootstrap, "--report", str(report),
        "--read-partitions", str(read_partitions),
        *(["--repair-keys", str(repair_keys)] if repair_keys is not None else []),
        *(["--avro-schema", writer_schema] if writer_schema is not None else []),
        *(["--handoff"] if handoff else []),
        *(warehouse or []),
    ]


def sink_args(spec_path: Path | str, bootstrap: str, *, available_now: bool = True,
              replication: Replication = Replication()) -> list[str]:
    """spark_jobs/batch_sink.py's arguments after the JDBC ones (``replication``: of the topics it makes)."""
    return ["--spec", str(Path(spec_path).resolve()), "--bootstrap", bootstrap, *replication.args(),
            *(["--available-now"] if available_now else [])]

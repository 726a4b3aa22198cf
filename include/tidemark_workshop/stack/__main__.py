"""python -m tidemark_workshop.stack COMMAND: manage the embedded local stack.

  up        start PostgreSQL and Kafka, resolve Spark's jars, migrate Airflow (idempotent)
  down      stop everything this checkout started (Airflow UI, Kafka, PostgreSQL)
  status    one line per component, then one per pipeline (batch, watermark, lag, stream)
  logs [C]  last lines of a component's log (postgres, kafka, airflow-api-server, ...)
  env       the environment of the stack as shell exports (secrets included: do not log)
  dsn       the libpq DSNs (source, source-owner, warehouse, airflow) and Kafka's bootstrap
            servers, one per line after its label (passwords included: do not log)
  run CMD   run CMD with the stack's environment (connections, AIRFLOW_HOME, PATH)
  ui        start the Airflow services and print the UI address
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
import time

from tidemark_workshop.settings import AIRFLOW_DB, SOURCE_DB, WAREHOUSE_DB, Settings
from tidemark_workshop.stack import airflow, spark
from tidemark_workshop.stack.kafka import Kafka
from tidemark_workshop.stack.postgres import Postgres
from tidemark_workshop.stack.proc import StackError, say, tail


def up(s: Settings) -> None:
    t0 = time.monotonic()
    Postgres(s).start()
    Kafka(s).start()
    spark.prepare(s)
    spark.describe(s)
    airflow.migrate(s)
    say("stack", f"up in {time.monotonic() - t0:.1f}s (state: {s.state_dir})")


def down(s: Settings) -> None:
    airflow.AirflowUI(s).stop()  # the supervisor first, so that nothing restarts the sinks
    stop_streams(s)
    Kafka(s).stop()
    Postgres(s).stop()


def status(s: Settings) -> None:
    postgres = Postgres(s)
    print(postgres.status())
    print(Kafka(s).status())
    print(spark.status(s))
    for line in airflow.AirflowUI(s).status():
        print(line)
    if postgres.is_running():
        for line in pipeline_lines(s):
            print(f"pipeline  {line}")


def stop_streams(s: Settings) -> None:
    """Standing sinks the supervisor launched from this checkout (they outlive the Airflow tasks)."""
    from tidemark.launch import LocalLauncher

    root = s.state_dir / "streams"
    launcher = LocalLauncher(root)
    for d in sorted(p for p in root.glob("*") if p.is_dir()) if root.is_dir() else []:
        if launcher.status(d.name).alive:
            launcher.stop(d.name, grace_s=10)
            say("streams", f"stopped the standing sink of {d.name}")
        launcher.forget(d.name)  # stopped on purpose: the supervisor's next look is a start, not a restart


def pipeline_lines(s: Settings) -> list[str]:
    """The status page's facts, one line per pipeline (read-only sessions)."""
    import psycopg2

    from tidemark.config import pipelines_dir
    from tidemark.status import collect, load_pipelines, status_lines
    from tidemark_workshop.settings import SOURCE_DB, WAREHOUSE_DB

    warehouse = psycopg2.connect(s.dsn(WAREHOUSE_DB))
    try:
        report = collect(load_pipelines(pipelines_dir()), warehouse, lambda _conn_id: psycopg2.connect(s.dsn(SOURCE_DB)))
    finally:
        warehouse.close()
    return status_lines(report)


def dsn_lines(s: Settings) -> list[str]:
    """Where to connect, one line per endpoint: a label, then a libpq DSN (``psql "$DSN"``) or,
    for Kafka, the bootstrap servers. ``source`` is the read-only role the pipelines read with;
    ``source-owner`` is the owner role, to create and write source tables (the read-only role may
    read every table the owner creates, by default privileges)."""
    reader = dataclasses.replace(s, pg_user=s.source_user, pg_password=s.source_password)
    endpoints = [
        ("source", reader.dsn(SOURCE_DB)),
        ("source-owner", s.dsn(SOURCE_DB)),
        ("warehouse", s.dsn(WAREHOUSE_DB)),
        ("airflow", s.dsn(AIRFLOW_DB)),
        ("kafka", s.kafka_bootstrap),
    ]
    return [f"{label:<13} {value}" for label, value in endpoints]


def logs(s: Settings, names: list[str]) -> None:
    files = sorted(s.logs_dir.glob("*.log"))
    chosen = [f for f in files if not names or f.stem in names]
    if not chosen:
        known = ", ".join(f.stem for f in files) or "none yet"
        raise StackError(f"no log named {' '.join(names)!r}; available: {known}")
    for f in chosen:
        print(f"==> {f} <==\n{tail(f, 40)}\n")


def main(argv: list[str]) -> int:
    if not argv or argv[0] in {"-h", "--help", "help"}:
        print(__doc__)
        return 0
    command, rest = argv[0], argv[1:]
    s = Settings.from_env()
    try:
        if command == "up":
            up(s)
        elif command == "down":
            down(s)
        elif command == "status":
            status(s)
        elif command == "logs":
            logs(s, rest)
        elif command == "env":
            for key, value in s.runtime_env().items():
                print(f"export {key}={shlex.quote(value)}")
        elif command == "dsn":
            print("\n".join(dsn_lines(s)))
        elif command == "run":
            if rest[:1] == ["--"]:
                rest = rest[1:]
            if not rest:
                raise StackError("usage: python -m tidemark_workshop.stack run -- COMMAND [ARGS...]")
            return airflow.exec_in_env(s, rest)
        elif command == "ui":
            airflow.AirflowUI(s).start()
        else:
            print(__doc__, file=sys.stderr)
            raise StackError(f"unknown command {command!r}")
    except StackError as exc:
        print(f"[tidemark stack] ERROR: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

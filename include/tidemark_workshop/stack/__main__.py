"""python -m tidemark_workshop.stack COMMAND: manage the embedded local stack.

  up        start PostgreSQL, Kafka and Kafka Connect (with Debezium), resolve Spark's jars, migrate
            Airflow (idempotent)
  down      stop everything this checkout started (Airflow UI, Connect, Kafka, PostgreSQL)
  stop C    stop one component, the rest stays up: postgres, kafka, connect, airflow (its four services),
            or one Airflow service (api-server, scheduler, dag-processor, triggerer)
  start C   start it again (kafka, connect and postgres: until they answer)
  status    one line per component; the broker's and the databases' health (since when one is
            unreachable); one line per pipeline (batch, watermark, lag, stream), then what holds it
  logs [C]  last lines of a component's log (postgres, kafka, airflow-api-server, ...)
  env       the environment of the stack as shell exports (secrets included: do not log)
  dsn       the libpq DSNs (source, source-owner, warehouse, airflow), Kafka's bootstrap servers
            and Connect's REST address, one per line after its label (passwords included: do not log)
  run CMD   run CMD with the stack's environment (connections, AIRFLOW_HOME, PATH)
  ui        start the Airflow services and print the UI address
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
import time

from tidemark_workshop.settings import AIRFLOW_DB, WAREHOUSE_DB, Settings
from tidemark_workshop.stack import airflow, spark
from tidemark_workshop.stack.connect import Connect
from tidemark_workshop.stack.kafka import Kafka
from tidemark_workshop.stack.postgres import Postgres
from tidemark_workshop.stack.proc import StackError, say, tail


def up(s: Settings) -> None:
    t0 = time.monotonic()
    Postgres(s).start()
    Kafka(s).start()
    Connect(s).start()
    spark.prepare(s)
    if (cluster := spark.StandaloneCluster.of_stack(s)) is not None:
        cluster.start()
    spark.describe(s)
    airflow.migrate(s)
    say("stack", f"up in {time.monotonic() - t0:.1f}s (state: {s.state_dir})")


def down(s: Settings) -> None:
    airflow.AirflowUI(s).stop()  # the supervisor first, so that nothing restarts the sinks
    stop_streams(s)
    Connect(s).stop()
    if (cluster := spark.StandaloneCluster.of_stack(s)) is not None:
        cluster.stop()
    Kafka(s).stop()
    Postgres(s).stop()


COMPONENTS = ("postgres", "kafka", "connect", "airflow", *airflow.AirflowUI.components)


def component(name: str | None) -> str:
    """The component a start/stop names (``airflow-scheduler`` as ``make logs`` spells it, too)."""
    if name and name != "airflow":
        name = name.removeprefix("airflow-")
    if name not in COMPONENTS:
        raise StackError(f"name one component: {', '.join(COMPONENTS)} (got {name!r})")
    return name


def start_one(s: Settings, name: str) -> None:
    """Start one component of a stack set up by `up` (the others are left as they are)."""
    name = component(name)
    if name == "postgres":
        Postgres(s).start()
    elif name == "kafka":
        Kafka(s).start()
    elif name == "connect":
        Connect(s).start()
    else:
        airflow.AirflowUI(s).start(only=None if name == "airflow" else (name,))


def stop_one(s: Settings, name: str) -> None:
    """Stop one component; the rest keeps running (and says so in `status`, and on the status page)."""
    name = component(name)
    if name == "postgres":
        Postgres(s).stop()
    elif name == "kafka":
        Kafka(s).stop()
    elif name == "connect":
        Connect(s).stop()
    else:
        airflow.AirflowUI(s).stop(only=None if name == "airflow" else (name,))


def status(s: Settings) -> None:
    print(Postgres(s).status())
    print(Kafka(s).status())
    print(Connect(s).status())
    print(spark.status(s))
    for line in airflow.AirflowUI(s).status():
        print(line)
    try:
        health, pipelines = status_report_lines(s)
    except ImportError:  # before bootstrap: no venv packages yet
        return
    for line in health:
        print(f"health    {line}")
    for line in pipelines:
        print(f"pipeline  {line}")


def stop_streams(s: Settings) -> None:
    """Standing sinks the supervisor launched from this checkout (they outlive the Airflow tasks)."""
    from tidemark.streams.launch import LocalLauncher

    root = s.state_dir / "streams"
    launcher = LocalLauncher(root)
    for d in sorted(p for p in root.glob("*") if p.is_dir()) if root.is_dir() else []:
        if launcher.status(d.name).alive:
            launcher.stop(d.name, grace_s=10)
            say("streams", f"stopped the standing sink of {d.name}")
        launcher.forget(d.name)  # stopped on purpose: the supervisor's next look is a start, not a restart


def status_report(s: Settings, health_path=None):
    """The status page's report, from this checkout's stack (read-only sessions; every check gives
    up after a couple of seconds; outages dated in the same health file as the page's)."""
    import psycopg2

    from tidemark.protocol.config import pipelines_dir
    from tidemark.realtime.cdc.connect import ConnectClient
    from tidemark.status import CHECK_TIMEOUT_S, collect, load_pipelines
    from tidemark_workshop.settings import WAREHOUSE_DB

    timeout = max(2, int(CHECK_TIMEOUT_S))
    return collect(load_pipelines(pipelines_dir()), None,
                   lambda _conn_id: psycopg2.connect(s.dsn(s.source_db), connect_timeout=timeout),
                   open_warehouse=lambda: psycopg2.connect(s.dsn(WAREHOUSE_DB), connect_timeout=timeout),
                   kafka_bootstrap=s.kafka_bootstrap, connect=ConnectClient(s.connect_url, timeout_s=timeout),
                   spark_master=s.spark_master, health_path=health_path or s.state_dir / "status" / "health.json")


def status_report_lines(s: Settings, health_path=None) -> tuple[list[str], list[str]]:
    """The health lines and the pipeline lines (each followed by what holds it)."""
    from tidemark.status import health_lines, status_lines

    report = status_report(s, health_path)
    return health_lines(report), status_lines(report)


def pipeline_lines(s: Settings) -> list[str]:
    """The status page's facts, one line per pipeline (read-only sessions), each followed by
    "  held by: ..., next: ..." for what holds it."""
    return status_report_lines(s)[1]


def dsn_lines(s: Settings) -> list[str]:
    """Where to connect, one line per endpoint: a label, then a libpq DSN (``psql "$DSN"``) or,
    for Kafka, the bootstrap servers. ``source`` is the read-only role the pipelines read with;
    ``source-owner`` is the owner role, to create and write source tables (the read-only role may
    read every table the owner creates, by default privileges)."""
    reader = dataclasses.replace(s, pg_user=s.source_user, pg_password=s.source_password)
    endpoints = [
        ("source", reader.dsn(reader.source_db)),
        ("source-owner", s.dsn(s.source_db)),
        ("warehouse", s.dsn(WAREHOUSE_DB)),
        ("airflow", s.dsn(AIRFLOW_DB)),
        ("kafka", s.kafka_bootstrap),
        ("connect", s.connect_url),
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
        elif command in ("start", "stop"):
            if len(rest) != 1:
                raise StackError(f"usage: python -m tidemark_workshop.stack {command} COMPONENT "
                                 f"(one of {', '.join(COMPONENTS)})")
            (start_one if command == "start" else stop_one)(s, rest[0])
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

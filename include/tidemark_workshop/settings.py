"""Where the embedded stack lives and how to reach it, from environment variables.

Every port and path can be overridden so that two checkouts run side by side. Defaults are
chosen away from the usual ports (5432, 9092, 8080) so a system service does not collide, and
below Linux's ephemeral range (32768-60999): a client retrying a connection to a local port in
that range can end up connected to itself on it, and then the server cannot bind it on restart.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from tidemark.protocol.config import (  # noqa: F401 (re-exported: the stack wires these names)
    CONN_CONTROL,
    CONN_KAFKA,
    CONN_SOURCE,
    CONN_SPARK,
    CONN_WAREHOUSE,
    CONNECTION_IDS,
    pipelines_dir,
)
from tidemark.protocol.control import CONTROL_KEYS_ENV, Keyring

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout: the stack's scripts, poms and state

QUICK_JIT = "-XX:TieredStopAtLevel=1"
SOURCE_DB = "tidemark_source"  # the default; Settings.source_db is the one in use (make test gives each lane its own)
WAREHOUSE_DB = "tidemark_warehouse"
# `make test-direct`: every pipeline a test makes (batchrun.make_pipeline) goes direct where its spec may
TEST_TRANSPORT_ENV = "TIDEMARK_TEST_TRANSPORT"
AIRFLOW_DB = "airflow"
DATABASES = (SOURCE_DB, WAREHOUSE_DB, AIRFLOW_DB)  # as docker/postgres-init.sql creates them
DATABASE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def _env(name: str, default: str) -> str:
    value = os.environ.get(name, "").strip()
    return value or default


def _port(name: str, default: int) -> int:
    raw = _env(name, str(default))
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise ValueError(f"environment variable {name}={raw!r} is not a TCP port")
    return int(raw)


def _count(name: str, default: int, *, least: int = 1, most: int) -> int:
    raw = _env(name, str(default))
    if not raw.isdigit() or not least <= int(raw) <= most:
        raise ValueError(f"environment variable {name}={raw!r} is not a whole number from {least} to {most}")
    return int(raw)


def _database(name: str, default: str) -> str:
    raw = _env(name, default)
    if not DATABASE_NAME.fullmatch(raw):
        raise ValueError(f"environment variable {name}={raw!r} is not a database name: "
                         "lower-case letters, digits and _, at most 63, not starting with a digit")
    return raw


@dataclass(frozen=True)
class Settings:
    state_dir: Path
    pg_host: str
    pg_port: int
    pg_user: str
    pg_password: str
    source_user: str  # the source connection's least-privilege role (SELECT, pg_read_all_stats)
    source_password: str
    os_user: str
    kafka_port: int
    kafka_controller_port: int
    airflow_port: int
    spark_master: str
    connect_port: int = 28083  # Kafka Connect's REST API (change data capture)
    cdc_user: str = "tidemark_cdc"  # the replication role Debezium reads the source's WAL as
    cdc_password: str = "tidemark-cdc-local"
    spark_quick_start: bool = True  # local jobs' JVMs: C1 only and a class archive (they start twice as fast)
    source_db: str = SOURCE_DB  # the source database: pipelines read it, CDC captures it
    kafka_nodes: int = 1  # KRaft nodes (broker and controller each); node k listens on kafka_port + 2(k - 1)
    spark_workers: int = 0  # 0: Spark in local mode; else a standalone master and this many workers
    spark_cluster_ports: tuple[int, int] = (27077, 27080)  # the master's and its web UI's (worker k's UI: + k)

    @classmethod
    def from_env(cls) -> "Settings":
        state = Path(_env("TIDEMARK_STATE_DIR", str(REPO_ROOT / ".state"))).resolve()
        workers = _count("TIDEMARK_SPARK_WORKERS", 0, least=0, most=4)
        cluster = (_port("TIDEMARK_SPARK_PORT", 27077), _port("TIDEMARK_SPARK_UI_PORT", 27080))
        return cls(
            state_dir=state,
            pg_host="127.0.0.1",
            pg_port=_port("TIDEMARK_PG_PORT", 25432),
            pg_user=_env("TIDEMARK_PG_USER", "tidemark"),
            pg_password=_env("TIDEMARK_PG_PASSWORD", "tidemark-local"),
            source_user=_env("TIDEMARK_SOURCE_USER", "tidemark_reader"),
            source_password=_env("TIDEMARK_SOURCE_PASSWORD", "tidemark-reader-local"),
            os_user=_env("TIDEMARK_OS_USER", "tidemark"),
            kafka_port=_port("TIDEMARK_KAFKA_PORT", 29092),
            kafka_controller_port=_port("TIDEMARK_KAFKA_CONTROLLER_PORT", 29093),
            airflow_port=_port("TIDEMARK_AIRFLOW_PORT", 28080),
            spark_master=_env("TIDEMARK_SPARK_MASTER",
                              f"spark://127.0.0.1:{cluster[0]}" if workers else "local[2]"),
            connect_port=_port("TIDEMARK_CONNECT_PORT", 28083),
            cdc_user=_env("TIDEMARK_CDC_USER", "tidemark_cdc"),
            cdc_password=_env("TIDEMARK_CDC_PASSWORD", "tidemark-cdc-local"),
            spark_quick_start=_env("TIDEMARK_SPARK_QUICK_START", "1") != "0",
            source_db=_database("TIDEMARK_SOURCE_DB", SOURCE_DB),
            kafka_nodes=_count("TIDEMARK_KAFKA_NODES", 1, most=5),
            spark_workers=workers,
            spark_cluster_ports=cluster,
        )

    # --- paths -------------------------------------------------------------------------
    @property
    def venv(self) -> Path:
        return self.state_dir / "venv"

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def pg_dir(self) -> Path:
        return self.state_dir / "postgres"

    @property
    def kafka_dir(self) -> Path:
        return self.state_dir / "kafka"

    @property
    def connect_dir(self) -> Path:
        return self.state_dir / "connect"

    @property
    def connect_secrets_dir(self) -> Path:
        """Secrets the Connect worker resolves in connector configs (``${dir:<this>:<file>}``)."""
        return self.connect_dir / "secrets"

    @property
    def spark_jars_dir(self) -> Path:
        return self.state_dir / "spark" / "jars"

    @property
    def airflow_home(self) -> Path:
        return self.state_dir / "airflow"

    @property
    def control_keys_file(self) -> Path:
        return self.state_dir / "control-keys"

    def control_keyring(self) -> Keyring:
        """The control messages' keyring: TIDEMARK_CONTROL_KEYS when set, else the state directory's
        own, generated once (a random key, readable by this user only; no secret in the repository)."""
        if os.environ.get(CONTROL_KEYS_ENV, "").strip():
            return Keyring.from_env()
        path = self.control_keys_file
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:  # another process generated it first: use theirs
                pass
            else:
                with os.fdopen(fd, "w") as out:
                    out.write(f"local-1:{secrets.token_hex(32)}\n")
        return Keyring.parse(path.read_text(), source=str(path))

    # --- endpoints ---------------------------------------------------------------------
    def kafka_node_ports(self, node: int) -> tuple[int, int]:
        """Node ``node``'s (1-based) broker and controller ports: the first node's are the settings', each
        further node's two above the one before (29092/29093, 29094/29095, ... by default)."""
        return self.kafka_port + 2 * (node - 1), self.kafka_controller_port + 2 * (node - 1)

    @property
    def kafka_bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{self.kafka_node_ports(k)[0]}" for k in range(1, self.kafka_nodes + 1))

    @property
    def connect_url(self) -> str:
        return f"http://127.0.0.1:{self.connect_port}"

    def dsn(self, database: str) -> str:
        """libpq key/value DSN, quoted by psycopg2 (any password characters survive); the password
        never appears in a log line we write."""
        from psycopg2.extensions import make_dsn

        return make_dsn(host=self.pg_host, port=self.pg_port, dbname=database, user=self.pg_user,
                        password=self.pg_password)

    def database_args(self, database: str, user: str | None = None) -> list[str]:
        """A Spark job's ``--database``, ``--user`` and ``--password-env`` for one of the stack's
        databases, as the DAG's operators make them from a connection (the password goes apart)."""
        from tidemark.spark.jobs import database_args

        return database_args(self.pg_host, self.pg_port, database, user or self.pg_user)

    def spark_jars(self) -> list[Path]:
        return sorted(self.spark_jars_dir.glob("*.jar"))

    # --- Airflow -----------------------------------------------------------------------
    def airflow_connections(self) -> dict[str, str]:
        """AIRFLOW_CONN_* variables (JSON form), the same names docker-compose.yaml defines."""

        def pg(database: str, login: str, password: str) -> str:
            return json.dumps(
                {
                    "conn_type": "postgres",
                    "host": self.pg_host,
                    "port": self.pg_port,
                    "login": login,
                    "password": password,
                    "schema": database,
                }
            )

        return {
            # Pipelines read the source as a role that can only read (least privilege).
            "AIRFLOW_CONN_TIDEMARK_SOURCE": pg(self.source_db, self.source_user, self.source_password),
            "AIRFLOW_CONN_TIDEMARK_WAREHOUSE": pg(WAREHOUSE_DB, self.pg_user, self.pg_password),
            "AIRFLOW_CONN_TIDEMARK_KAFKA": json.dumps(
                {"conn_type": "kafka", "extra": {"bootstrap.servers": self.kafka_bootstrap}}
            ),
            "AIRFLOW_CONN_TIDEMARK_SPARK": json.dumps(
                {"conn_type": "spark", "host": self.spark_master}
            ),
            # Debezium logs in as the replication role (REPLICATION, SELECT on the captured tables)
            "AIRFLOW_CONN_TIDEMARK_CDC": pg(self.source_db, self.cdc_user, self.cdc_password),
            # Kafka Connect's REST API; its worker reads the connectors' secrets from secrets_dir
            "AIRFLOW_CONN_TIDEMARK_CONNECT": json.dumps(
                {"conn_type": "http", "host": "127.0.0.1", "port": self.connect_port, "schema": "http",
                 "extra": {"secrets_dir": str(self.connect_secrets_dir)}}
            ),
            # the control messages' keyring (key_id:secret,...) in the password: only the orchestrator signs
            "AIRFLOW_CONN_TIDEMARK_CONTROL": json.dumps(
                {"conn_type": "generic", "password": self.control_keyring().text()}
            ),
        }

    @property
    def spark_class_archive(self) -> Path:
        """The classes a Spark job's JVM loads, mapped at start instead of loaded (AppCDS): built by ``make up``."""
        return self.state_dir / "spark" / "jvm-classes.jsa"

    def quick_start_opts(self, opts: str = "") -> str:
        """``opts`` plus what starts a short local job's JVM quickly: C1 only (C2's compiler threads
        cost a job of seconds to minutes more than they win) and the class archive, once built.
        A trivial job: 14.8 s plain, 11 s with C1, 7 s with both, on this 2-core machine."""
        wanted = [QUICK_JIT]
        if self.spark_class_archive.exists():
            wanted.append(f"-XX:SharedArchiveFile={self.spark_class_archive}")
        return " ".join([opts.strip(), *[w for w in wanted if w not in opts]]).strip()

    def runtime_env(self) -> dict[str, str]:
        """Environment for every process of the local stack: Airflow, Spark jobs, tests."""
        # the core package, and Tidemark's Airflow plugins for processes outside Airflow (tests)
        pythonpath = os.pathsep.join(str(REPO_ROOT / d) for d in ("include", "plugins"))
        env = {
            "TIDEMARK_STATE_DIR": str(self.state_dir),
            "TIDEMARK_STATUS_DIR": str(self.state_dir / "status"),  # since when each component is down
            "TIDEMARK_STREAMS_DIR": str(self.state_dir / "streams"),  # standing sinks' pid, log, exit code
            "TIDEMARK_RECONCILE_DIR": str(self.state_dir / "reconcile"),  # Data Docs and difference reports
            "TIDEMARK_KAFKA_BOOTSTRAP": self.kafka_bootstrap,
            "TIDEMARK_SPARK_MASTER": self.spark_master,
            "TIDEMARK_SPARK_JARS": ",".join(str(j) for j in self.spark_jars()),
            "PYTHONPATH": pythonpath,
            "PATH": f"{self.venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
            # Spark's Python workers must use the venv's interpreter, not whatever is on PATH.
            "PYSPARK_PYTHON": str(self.venv / "bin" / "python"),
            "PYSPARK_DRIVER_PYTHON": str(self.venv / "bin" / "python"),
            "AIRFLOW_HOME": str(self.airflow_home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO_ROOT / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": (
                f"http://127.0.0.1:{self.airflow_port}/execution/"
            ),
            "AIRFLOW__API__PORT": str(self.airflow_port),
            "AIRFLOW__API__HOST": "127.0.0.1",
            # Spark's driver, block manager and UI listen on loopback only (the UI would take 0.0.0.0:4040).
            "SPARK_LOCAL_IP": "127.0.0.1",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": (
                f"postgresql+psycopg2://{quote(self.pg_user, safe='')}:{quote(self.pg_password, safe='')}"
                f"@{self.pg_host}:{self.pg_port}/{AIRFLOW_DB}"
            ),
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(self.logs_dir / "airflow"),
        }
        if self.spark_quick_start:
            env["SPARK_SUBMIT_OPTS"] = self.quick_start_opts(os.environ.get("SPARK_SUBMIT_OPTS", ""))
        env.update(self.airflow_connections())
        env[CONTROL_KEYS_ENV] = self.control_keyring().text()  # local runner, sinks and tests outside Airflow
        return env

"""Tidemark's Airflow hooks: every connection Tidemark makes, resolved one way, at run time (never at
parse time), through ``BaseHook.get_connection``.

The core package speaks psycopg2 and plain settings, so these turn a connection id into what it needs:
a psycopg2 connection (``DatabaseHook``; the Postgres provider's hook hands out psycopg 3 where
SQLAlchemy 2 is installed), the broker's bootstrap servers (``KafkaHook``), the control messages'
keyring (``ControlKeysHook``), Kafka Connect and Debezium's login (``ConnectHook``), and where and how
Spark runs (``SparkHook``: a batch job goes through the Spark provider's operator itself, a standing
sink's spark-submit is started detached, which the provider's public API does not do). Secrets stay
in the connection objects and the processes they are handed to; nothing here logs them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from airflow.sdk import BaseHook

from tidemark.protocol.config import CONN_CDC, CONN_CONNECT, CONN_CONTROL, CONN_KAFKA, CONN_SPARK, CONN_WAREHOUSE


class _TidemarkHook(BaseHook):
    """One connection id, its default the hook's own connection."""

    conn_name_attr = "conn_id"
    default_conn_name: str

    def __init__(self, conn_id: str | None = None):
        super().__init__()
        self.conn_id = conn_id or self.default_conn_name


class DatabaseHook(_TidemarkHook):
    """A PostgreSQL connection (host, port, schema = database, login, password) as psycopg2."""

    default_conn_name = CONN_WAREHOUSE
    conn_type = "postgres"
    hook_name = "Tidemark PostgreSQL (psycopg2)"

    def __init__(self, conn_id: str = CONN_WAREHOUSE, *, application_name: str = "tidemark-airflow",
                 connect_timeout: int = 10):
        super().__init__(conn_id)
        self.application_name, self.connect_timeout = application_name, connect_timeout

    @classmethod
    def for_page(cls, conn_id: str) -> DatabaseHook:
        """For the status and evidence pages: resolved per request (``tidemark.status.collect`` makes the
        session read-only), giving up after ``CHECK_TIMEOUT_S``: a database that does not answer is shown
        as unreachable, it never holds the page."""
        from tidemark.status import APPLICATION_NAME, CHECK_TIMEOUT_S

        return cls(conn_id, application_name=APPLICATION_NAME, connect_timeout=max(2, int(CHECK_TIMEOUT_S)))

    def endpoint(self):
        """The connection itself: what a Spark job is told (its password goes to the job's environment)."""
        return self.get_connection(self.conn_id)

    def get_conn(self):
        """psycopg2, honouring the options among the connection's extras as a Spark job does (TLS, which server of
        several); a host field
        naming several servers reaches the one that takes writes (``tidemark.spark.jobs.servers``)."""
        import psycopg2

        from tidemark.spark.jobs import DATABASE_OPTIONS, servers

        c = self.get_connection(self.conn_id)
        options = {k: v for k, v in c.extra_dejson.items() if k in DATABASE_OPTIONS and k != "connect_timeout"}
        where = servers(c.host, c.port) if c.host else {"port": c.port or 5432}  # no host: libpq's default socket
        return psycopg2.connect(**{**where, **options}, dbname=c.schema, user=c.login,
                                password=c.password, connect_timeout=self.connect_timeout,
                                application_name=self.application_name)


class KafkaHook(_TidemarkHook):
    """The broker: ``bootstrap.servers`` in the Kafka connection's extra (as the Kafka provider keeps it)."""

    default_conn_name = CONN_KAFKA
    hook_name = "Tidemark Kafka"

    def bootstrap(self) -> str:
        servers = self.get_connection(self.conn_id).extra_dejson.get("bootstrap.servers")
        if not servers:
            raise ValueError(f"Airflow connection {self.conn_id} has no 'bootstrap.servers' in its extra "
                             '(e.g. {"bootstrap.servers": "127.0.0.1:29092"})')
        return servers

    def replication(self):
        """How many replicas Tidemark's topics get and how many must hold a write: ``replication.factor`` and
        ``min.insync.replicas`` in the extra (Tidemark's keys), else sized for the cluster
        (``tidemark.protocol.replication``)."""
        from tidemark.protocol.replication import Replication

        return Replication.from_extra(self.get_connection(self.conn_id).extra_dejson,
                                      source=f"Airflow connection {self.conn_id} (its extra)")


class ControlKeysHook(_TidemarkHook):
    """The control messages' keyring: the password of the ``tidemark_control`` connection (a secrets
    backend serves it like any connection). Only the orchestrator signs; sinks get it to verify."""

    default_conn_name = CONN_CONTROL
    hook_name = "Tidemark control keys"

    def keyring(self):
        from tidemark.protocol.control import Keyring

        return Keyring.parse(self.get_connection(self.conn_id).password,
                             source=f"Airflow connection {self.conn_id} (its password)")


class ConnectHook(_TidemarkHook):
    """Kafka Connect's REST API, from the Connect connection (host, port; schema: http or https)."""

    default_conn_name = CONN_CONNECT
    hook_name = "Tidemark Kafka Connect"

    def client(self, *, timeout_s: float = 10.0):
        from tidemark.realtime.cdc.connect import ConnectClient

        connect = self.get_connection(self.conn_id)
        return ConnectClient(f"{connect.schema or 'http'}://{connect.host}:{connect.port or 8083}", timeout_s=timeout_s)

    def capture(self, cdc_conn_id: str = CONN_CDC):
        """The REST client, and the source endpoint Debezium logs in with: the replication role's
        connection, its password and the key change records are signed with (derived from the control
        keyring's signing key) written (0600) where the worker resolves them (the Connect connection's
        extra ``secrets_dir``), never into a connector config."""
        from tidemark.realtime.cdc.connector import SourceEndpoint, write_secret
        from tidemark.realtime.cdc.signing import signing_key

        connect, cdc = self.get_connection(self.conn_id), self.get_connection(cdc_conn_id)
        secrets_dir = connect.extra_dejson.get("secrets_dir")
        if not secrets_dir:
            raise ValueError(f"Airflow connection {self.conn_id} has no 'secrets_dir' in its extra: where its worker "
                             "reads the replication role's password and the key it signs change records with")
        write_secret(secrets_dir, cdc_conn_id, cdc.password or "")
        signing, key = signing_key(ControlKeysHook().keyring())
        write_secret(secrets_dir, signing.secret_file, key)
        endpoint = SourceEndpoint(cdc.host, cdc.port or 5432, cdc.schema, cdc.login, cdc_conn_id, secrets_dir, signing)
        return self.client(), endpoint


SPARK_BINARIES = ("spark-submit", "spark2-submit", "spark3-submit")  # what the Spark provider allows
UNSUPPORTED_SPARK_EXTRAS = ("principal", "keytab", "namespace")  # Kerberos and Kubernetes: the provider's operator only


@dataclass(frozen=True)
class SparkCluster:
    master: str
    deploy_mode: str | None
    binary: str
    queue: str | None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def standalone_cluster(self) -> bool:
        """A ``spark://`` master in cluster mode: the driver runs on a worker of the standalone cluster."""
        return self.master.startswith("spark://") and self.deploy_mode == "cluster"


class SparkHook(_TidemarkHook):
    """The ``tidemark_spark`` connection read as the Spark provider reads it (master from its type, host and
    port; extras ``deploy-mode``, ``spark-binary``, ``queue``), and a standing sink's spark-submit command
    built as the provider's operator builds one (``tests/unit/test_hooks.py`` holds the two side by side)."""

    default_conn_name = CONN_SPARK
    conn_type = "spark"
    hook_name = "Tidemark Spark"

    def cluster(self, *, standing: bool = False) -> SparkCluster:
        """Where the jobs run; ``standing``: for a standing sink, which refuses what it cannot honour."""
        conn = self.get_connection(self.conn_id)
        if conn.conn_type == "spark" and conn.host and ("://" in conn.host or not conn.port):
            master = conn.host  # the whole master URL in the host (a connection made in the UI)
        else:
            master = f"{conn.conn_type}://{conn.host or ''}"
        master = f"{master}:{conn.port}" if conn.port else master
        extra = conn.extra_dejson
        binary = extra.get("spark-binary") or "spark-submit"
        if binary not in SPARK_BINARIES:
            raise ValueError(f"Airflow connection {self.conn_id}: extra spark-binary is {binary!r}, one of "
                             f"{', '.join(SPARK_BINARIES)} is needed (on the PATH)")
        if standing and (unsupported := [k for k in UNSUPPORTED_SPARK_EXTRAS if extra.get(k)]):
            raise ValueError(f"Airflow connection {self.conn_id}: extra {', '.join(unsupported)} is not supported for "
                             "a standing sink (it runs locally or on a Spark standalone cluster); remove it")
        return SparkCluster(master, extra.get("deploy-mode"), binary, extra.get("queue"), extra)

    def submit_command(self, application: str, *, conf: dict[str, str], name: str, driver_memory: str | None = None,
                       jars: str | None = None, application_args: list[str] = ()) -> list[str]:
        cluster = self.cluster(standing=True)
        argv = [cluster.binary, "--master", cluster.master]
        for key, value in conf.items():
            argv += ["--conf", f"{key}={value}"]
        argv += ["--jars", jars] if jars else []
        argv += ["--driver-memory", driver_memory] if driver_memory else []
        argv += ["--name", name]
        argv += ["--queue", cluster.queue] if cluster.queue else []
        argv += ["--deploy-mode", cluster.deploy_mode] if cluster.deploy_mode else []
        return [*argv, application, *application_args]

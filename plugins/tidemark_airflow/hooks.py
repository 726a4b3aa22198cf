"""Tidemark's Airflow connections, resolved one way, at run time (never at parse time).

The core package speaks psycopg2 and plain settings, so the Airflow layer turns a connection id
into what it needs here: a psycopg2 connection, the broker's bootstrap servers, the control
messages' keyring. Secrets stay in the connection objects and the processes they are handed to;
nothing here logs them.
"""

from __future__ import annotations

from airflow.sdk import Connection

from tidemark.protocol.config import CONN_CDC, CONN_CONNECT, CONN_CONTROL, CONN_KAFKA


def pg_connect(conn_id: str, *, application_name: str = "tidemark-airflow", connect_timeout: int = 10):
    """A psycopg2 connection from a Postgres connection (host, port, schema = database, login, password)."""
    import psycopg2

    c = Connection.get(conn_id)
    return psycopg2.connect(host=c.host, port=c.port or 5432, dbname=c.schema, user=c.login, password=c.password,
                            connect_timeout=connect_timeout, application_name=application_name)


def page_connect(conn_id: str):
    """For the status and evidence pages: resolved per request (``tidemark.status.collect`` makes the
    session read-only), giving up after ``CHECK_TIMEOUT_S``: a database that does not answer is shown
    as unreachable, it never holds the page."""
    from tidemark.status import APPLICATION_NAME, CHECK_TIMEOUT_S

    return pg_connect(conn_id, application_name=APPLICATION_NAME, connect_timeout=max(2, int(CHECK_TIMEOUT_S)))


def kafka_bootstrap(conn_id: str = CONN_KAFKA) -> str:
    """The broker's bootstrap servers: ``bootstrap.servers`` in the Kafka connection's extra."""
    servers = Connection.get(conn_id).extra_dejson.get("bootstrap.servers")
    if not servers:
        raise ValueError(f"Airflow connection {conn_id} has no 'bootstrap.servers' in its extra "
                         '(e.g. {"bootstrap.servers": "127.0.0.1:29092"})')
    return servers


def control_keyring(conn_id: str = CONN_CONTROL):
    """The control messages' keyring: the password of the ``tidemark_control`` connection (a secrets
    backend serves it like any connection). Only the orchestrator signs; sinks get it to verify."""
    from tidemark.protocol.control import Keyring

    return Keyring.parse(Connection.get(conn_id).password, source=f"Airflow connection {conn_id} (its password)")


def capture(conn_id: str = CONN_CONNECT, cdc_conn_id: str = CONN_CDC):
    """Kafka Connect's REST client, and the source endpoint Debezium logs in with: the replication
    role's connection, its password and the key change records are signed with (derived from the
    control keyring's signing key) written (0600) where the worker resolves them (the Connect
    connection's extra ``secrets_dir``), never into a connector config."""
    from tidemark.realtime.cdc.connector import SourceEndpoint, write_secret
    from tidemark.realtime.cdc.signing import signing_key

    connect, cdc = Connection.get(conn_id), Connection.get(cdc_conn_id)
    secrets_dir = connect.extra_dejson.get("secrets_dir")
    if not secrets_dir:
        raise ValueError(f"Airflow connection {conn_id} has no 'secrets_dir' in its extra: where its worker reads "
                         "the replication role's password and the key it signs change records with")
    write_secret(secrets_dir, cdc_conn_id, cdc.password or "")
    signing, key = signing_key(control_keyring())
    write_secret(secrets_dir, signing.secret_file, key)
    endpoint = SourceEndpoint(cdc.host, cdc.port or 5432, cdc.schema, cdc.login, cdc_conn_id, secrets_dir, signing)
    return connect_client(conn_id), endpoint


def connect_client(conn_id: str = CONN_CONNECT, *, timeout_s: float = 10.0):
    """Kafka Connect's REST client, from the Connect connection (host, port; schema: http or https)."""
    from tidemark.realtime.cdc.connect import ConnectClient

    connect = Connection.get(conn_id)
    return ConnectClient(f"{connect.schema or 'http'}://{connect.host}:{connect.port or 8083}", timeout_s=timeout_s)

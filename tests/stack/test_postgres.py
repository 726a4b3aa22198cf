"""The private PostgreSQL cluster: reachable, the expected databases, not run by root."""

import dataclasses

import psycopg2
import pytest

from tidemark_workshop.settings import DATABASES

pytestmark = pytest.mark.stack


def test_every_database_is_reachable(settings):
    for name in DATABASES:
        conn = psycopg2.connect(settings.dsn(name))
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT current_database(), current_setting('port')::int")
                assert cur.fetchone() == (name, settings.pg_port)
        finally:
            conn.close()


def test_server_runs_as_unprivileged_owner_of_state_dir(settings, source_conn):
    with source_conn.cursor() as cur:
        cur.execute("SHOW data_directory")
        data_dir = cur.fetchone()[0]
    assert data_dir == str(settings.pg_dir / "data")
    owner_uid = (settings.pg_dir / "data").stat().st_uid
    assert owner_uid != 0, "the cluster must not belong to root"


def test_wrong_password_is_refused(settings):
    bad = dataclasses.replace(settings, pg_password="not-it").dsn("postgres")
    with pytest.raises(psycopg2.OperationalError, match="password authentication failed"):
        psycopg2.connect(bad)


def test_a_connection_naming_a_primary_and_its_replica_follows_the_replicas_promotion(settings, tmp_path):
    """The host field names a streaming replica first, then the primary: every session (psycopg2 as the DAG's tasks
    and the sinks make it, from the same parameters a Spark job gets) reaches the server that takes writes; once
    the replica is promoted, the same parameters reach it, without a configuration change."""
    from tidemark.spark.entry import connect
    from tidemark.spark.jobs import database_args
    from tidemark_workshop.settings import WAREHOUSE_DB
    from tidemark_workshop.stack.postgres import Standby

    standby = Standby(settings, tmp_path / "standby", port=settings.pg_port + 1000)
    standby.start()
    try:
        dsn = database_args(f"{settings.pg_host}:{standby.port},{settings.pg_host}:{settings.pg_port}", None,
                            WAREHOUSE_DB, settings.pg_user)[1]

        def reached() -> tuple[bool, int]:
            conn = connect(dsn, settings.pg_user, settings.pg_password)
            try:
                with conn, conn.cursor() as cur:
                    cur.execute("SELECT pg_is_in_recovery(), current_setting('port')::int")
                    return cur.fetchone()
            finally:
                conn.close()

        replica = psycopg2.connect(host=settings.pg_host, port=standby.port, dbname=WAREHOUSE_DB,
                                   user=settings.pg_user, password=settings.pg_password)
        with replica, replica.cursor() as cur:
            cur.execute("SELECT pg_is_in_recovery()")
            assert cur.fetchone() == (True,), "the replica is not in recovery: nothing would be skipped"
        replica.close()
        assert reached() == (False, settings.pg_port), "the session went to the replica, which refuses writes"
        standby.promote()
        assert reached() == (False, standby.port), "after the promotion the session still went to the old primary"
    finally:
        standby.stop("immediate")

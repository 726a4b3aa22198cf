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

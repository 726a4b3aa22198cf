"""Pipelines read the source with least privilege, and a missing grant says which one."""

from __future__ import annotations

import json

import psycopg2
import pytest

from tidemark import batch
from tidemark_workshop.settings import SOURCE_DB, WAREHOUSE_DB
from tidemark_workshop.stack.batchrun import make_pipeline
from tidemark.window import PlanError

pytestmark = pytest.mark.stack
DDL = "CREATE TABLE {table} (id bigint PRIMARY KEY, amount numeric(18,2) NOT NULL, updated_at timestamptz NOT NULL)"


def _as_source_role(settings):
    c = json.loads(settings.airflow_connections()["AIRFLOW_CONN_TIDEMARK_SOURCE"])
    return psycopg2.connect(host=c["host"], port=c["port"], dbname=c["schema"], user=c["login"], password=c["password"])


def test_the_source_connection_can_read_and_see_sessions_but_not_write(settings):
    conn = _as_source_role(settings)
    try:
        with conn, conn.cursor() as cur:
            cur.execute("SELECT rolsuper, pg_has_role(current_user, 'pg_read_all_stats', 'MEMBER') "
                        "FROM pg_roles WHERE rolname = current_user")
            assert cur.fetchone() == (False, True)
        with pytest.raises(psycopg2.errors.InsufficientPrivilege):
            with conn, conn.cursor() as cur:
                cur.execute("CREATE TABLE public.should_not_exist (id int)")
    finally:
        conn.close()


def test_a_revoked_select_fails_the_plan_naming_the_table_and_the_grant(settings, tmp_path):
    pipe = make_pipeline(settings, tmp_path, DDL)
    reader = settings.source_user
    src = pipe.src()
    with src, src.cursor() as cur:
        cur.execute(f"REVOKE SELECT ON {pipe.spec.table} FROM {reader}")
    src.close()
    source, warehouse = _as_source_role(settings), psycopg2.connect(settings.dsn(WAREHOUSE_DB))
    try:
        with pytest.raises(PlanError, match=rf"the source role {reader} may not read {pipe.spec.table}: "
                                            rf'GRANT SELECT ON "public"."{pipe.spec.name}_src" TO {reader}'):
            batch.plan(pipe.spec, source, warehouse, run_id="manual__no-grant")
    finally:
        source.close()
        warehouse.close()
    src = psycopg2.connect(settings.dsn(SOURCE_DB))
    with src, src.cursor() as cur:
        cur.execute(f"GRANT SELECT ON {pipe.spec.table} TO {reader}")
    src.close()
    source, warehouse = _as_source_role(settings), psycopg2.connect(settings.dsn(WAREHOUSE_DB))
    try:
        assert batch.plan(pipe.spec, source, warehouse, run_id="manual__granted").window.lo is not None
    finally:
        source.close()
        warehouse.close()

"""Pipelines read the source with least privilege, and a missing grant says which one."""

from __future__ import annotations

import json
import uuid

import psycopg2
import pytest

from tidemark.batch import steps
from tidemark.protocol.window import PlanError
from tidemark_workshop.settings import WAREHOUSE_DB
from tidemark_workshop.stack.batchrun import make_pipeline

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
            steps.plan(pipe.spec, source, warehouse, run_id="manual__no-grant")
    finally:
        source.close()
        warehouse.close()
    src = psycopg2.connect(settings.dsn(settings.source_db))
    with src, src.cursor() as cur:
        cur.execute(f"GRANT SELECT ON {pipe.spec.table} TO {reader}")
    src.close()
    source, warehouse = _as_source_role(settings), psycopg2.connect(settings.dsn(WAREHOUSE_DB))
    try:
        assert steps.plan(pipe.spec, source, warehouse, run_id="manual__granted").window.lo is not None
    finally:
        source.close()
        warehouse.close()


def test_a_target_in_a_missing_schema_fails_the_plan_unless_the_spec_says_to_create_it(settings, tmp_path):
    schema = f"wh_missing_{uuid.uuid4().hex[:8]}"
    pipe = make_pipeline(settings, tmp_path, DDL, target_table=f"{schema}.payments")
    with pytest.raises(PlanError, match=rf"the warehouse has no schema {schema} for target_table {schema}.payments: "
                                        "create it, or set create_target_schema: true in the spec"):
        pipe.plan("manual__no-schema")
    assert pipe.query_wh("SELECT to_regnamespace(%s)", (schema,)) == [(None,)]  # nothing created silently
    allowed = make_pipeline(settings, tmp_path, DDL, target_table=f"{schema}.payments", create_target_schema=True)
    try:
        allowed.plan("manual__create-schema")
        assert pipe.query_wh("SELECT to_regclass(%s)", (f"{schema}.payments",))[0][0] is not None
    finally:
        pipe.query_wh(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_first_runs_creating_one_schema_and_table_at_once_take_turns(settings, tmp_path):
    """The nightly plan and the stream supervisor create a target on a first run, and two pipelines
    may share a new schema: CREATE ... IF NOT EXISTS alone raced on the catalog's unique index
    (the demo's plan failed with pg_namespace_nspname_index)."""
    import threading

    from tidemark.ledger import catalog

    schemas = [f"wh_race_{uuid.uuid4().hex[:8]}" for _ in range(8)]
    specs = [make_pipeline(settings, tmp_path, DDL, target_table=f"{schema}.payments", create_target_schema=True).spec
             for schema in schemas]
    errors: list[BaseException] = []
    try:
        for spec in specs:
            start = threading.Barrier(3)

            def first_run(spec=spec, start=start):
                src, wh = psycopg2.connect(settings.dsn(settings.source_db)), psycopg2.connect(settings.dsn(WAREHOUSE_DB))
                try:
                    with src, src.cursor() as s, wh, wh.cursor() as w:
                        start.wait()
                        catalog.ensure_target(s, w, spec)
                except BaseException as exc:  # collected: a thread's exception would be lost
                    errors.append(exc)
                finally:
                    src.close()
                    wh.close()

            runs = [threading.Thread(target=first_run) for _ in range(3)]
            for t in runs:
                t.start()
            for t in runs:
                t.join(60)
        assert errors == [], errors
        wh = psycopg2.connect(settings.dsn(WAREHOUSE_DB))
        with wh, wh.cursor() as cur:
            for spec in specs:
                cur.execute("SELECT to_regclass(%s) IS NOT NULL", (spec.target_table,))
                assert cur.fetchone() == (True,), spec.target_table
        wh.close()
    finally:
        wh = psycopg2.connect(settings.dsn(WAREHOUSE_DB))
        with wh, wh.cursor() as cur:
            for schema in schemas:
                cur.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        wh.close()

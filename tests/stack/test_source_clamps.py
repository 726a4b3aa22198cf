"""Every cursor is clamped, and the clamp names what holds it (real PostgreSQL, Kafka, Spark).

A prepared (two-phase) transaction, an id taken by a transaction still open, and a session left
idle in a transaction: none may lose a row, and none may hold a pipeline back without saying who.
"""

from __future__ import annotations

import logging
import time
import uuid

import psycopg2
import pytest

from tidemark.protocol.window import PlanError
from tidemark_workshop.stack.batchrun import make_pipeline

pytestmark = [pytest.mark.stack]  # holds prepared and idle source transactions: only its own lane's database

DDL = """
CREATE TABLE {table} (
    id bigint PRIMARY KEY,
    amount numeric(18,2) NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
)"""
ID_DDL = """
CREATE TABLE {table} (
    id bigserial PRIMARY KEY,
    amount numeric(18,2) NOT NULL
)"""


def same_rows(pipe, count: int) -> None:
    source, target = pipe.rows("source", "amount"), pipe.rows("target", "amount")
    assert len(source) == count and target == source


def test_a_prepared_transaction_holds_the_window_until_it_commits(settings, tmp_path, caplog):
    pipe = make_pipeline(settings, tmp_path, DDL)
    gid = f"tidemark-test-{uuid.uuid4().hex[:8]}"
    src = pipe.src()
    with src, src.cursor() as cur:
        cur.execute(f"INSERT INTO {pipe.source_table} (id, amount) VALUES (1, 1.00)")
    writer = psycopg2.connect(settings.dsn(settings.source_db))
    try:
        with writer.cursor() as cur:
            cur.execute(f"INSERT INTO {pipe.source_table} (id, amount) VALUES (2, 2.00)")  # stamped now ...
            cur.execute("PREPARE TRANSACTION %s", (gid,))  # ... committed after the next batch
        time.sleep(0.2)
        with caplog.at_level(logging.WARNING, logger="tidemark.batch"):
            held, _ = pipe.run("run-held")
        assert held.window.empty, held.window  # before: it loaded row 1, moved past row 2's time, and lost it
        assert f"prepared transaction gid='{gid}'" in caplog.text and "window held back by" in caplog.text
        src.autocommit = True  # COMMIT PREPARED runs outside a transaction block
        with src.cursor() as cur:
            cur.execute("COMMIT PREPARED %s", (gid,))
        gid = None
    finally:
        if gid is not None:  # a prepared transaction left behind would hold every pipeline of the database
            src.autocommit = True
            with src.cursor() as cur:
                cur.execute("ROLLBACK PREPARED %s", (gid,))
        writer.close()
        src.close()
    pipe.run("run-after")
    same_rows(pipe, 2)


def test_an_id_taken_by_an_open_transaction_is_never_passed(settings, tmp_path, caplog):
    pipe = make_pipeline(settings, tmp_path, ID_DDL, cursor={"kind": "id", "column": "id"}, append_only=True)
    src = pipe.src()
    with src, src.cursor() as cur:
        cur.execute(f"INSERT INTO {pipe.source_table} (amount) SELECT g FROM generate_series(1, 10) g")
    first, _ = pipe.run("run-1")  # ids 1..10, and the ledger keeps what it saw
    assert first.window.hi.cursor == 10
    slow = psycopg2.connect(settings.dsn(settings.source_db))
    slow.set_session(autocommit=False)
    try:
        with slow.cursor() as cur:
            cur.execute(f"INSERT INTO {pipe.source_table} (amount) VALUES (11) RETURNING id")
            assert cur.fetchone()[0] == 11  # taken, not yet committed
        with src, src.cursor() as cur:
            cur.execute(f"INSERT INTO {pipe.source_table} (amount) SELECT g FROM generate_series(12, 20) g")
        with caplog.at_level(logging.WARNING, logger="tidemark.batch"):
            held, _ = pipe.run("run-2")
        # Before: hi = 20 (the largest visible id), and id 11 committed beneath the watermark, lost.
        assert held.window.hi.cursor == 10, held.window
        assert f"pid={slow.get_backend_pid()}" in caplog.text and "window held back by" in caplog.text
        slow.commit()
    finally:
        slow.close()
    after, _ = pipe.run("run-3")
    assert after.window.hi.cursor == 20
    same_rows(pipe, 20)
    src.close()


def test_an_idle_session_in_a_transaction_is_named_and_fails_the_plan_past_max_hold(settings, tmp_path, caplog):
    pipe = make_pipeline(settings, tmp_path, DDL, max_hold="PT2S")
    idle = psycopg2.connect(settings.dsn(settings.source_db), application_name="teller-42")
    try:
        with idle.cursor() as cur:
            cur.execute("SELECT 1")  # opens a transaction and leaves it idle
        with caplog.at_level(logging.WARNING, logger="tidemark.batch"):
            plan = pipe.plan("run-held")
        named = f"session pid={idle.get_backend_pid()} user={settings.pg_user} application='teller-42'"
        assert named in caplog.text and "state='idle in transaction'" in caplog.text
        status = pipe.query_wh("SELECT window_hi FROM tidemark_control.batches WHERE batch_id = %s", (plan.batch_id,))
        assert status  # planned, clamped before the session's transaction
        time.sleep(2.5)
        with pytest.raises(PlanError) as failed:
            pipe.plan("run-too-long")
        text = str(failed.value)
        assert "held the window back for longer than max_hold 0:00:02" in text and named in text
        assert "Next: end that transaction on the source (SELECT pg_terminate_backend(<pid>)" in text
    finally:
        idle.close()
    pipe.plan("run-free")  # the session is gone: planning goes on

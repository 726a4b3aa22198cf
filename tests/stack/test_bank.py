"""The demo core-banking source (tidemark_workshop.bank, bank_traffic) against the real source PostgreSQL.

The nightly pipelines are only as well tested as their source is realistic: these tests pin the
books' invariants under concurrent writers and the late-commit behaviour the window planner has
to survive.
"""

from __future__ import annotations

import random
import time
from datetime import date, timedelta

import psycopg2
import pytest

from tidemark.protocol.window import read_source_clock
from tidemark_workshop import bank, bank_traffic

pytestmark = [pytest.mark.stack, pytest.mark.serial("holds a source transaction open")]

BULK_DAY = date(2001, 2, 3)  # no other writer posts to this business date


@pytest.fixture(scope="module", autouse=True)
def fresh_bank(settings):
    """Schema ``bank`` from nothing, so no test depends on another having run (or not)."""
    conn = psycopg2.connect(settings.dsn(settings.source_db))
    try:
        bank.reset(conn)
        assert bank.seed(conn, customers=50, accounts_per_customer=2, seed=0) == {"customers": 50, "accounts": 100}
    finally:
        conn.close()


@pytest.fixture
def dsn(settings) -> str:
    return settings.dsn(settings.source_db)


def _one(conn, sql: str, params=None):
    with conn.cursor() as cur:
        cur.execute(sql, params)
        row = cur.fetchone()
    conn.rollback()
    return row


def _unbalanced(conn, where: str = "true") -> int:
    return _one(conn, f"""
        SELECT count(*) FROM (SELECT txn_id FROM bank.ledger_entries WHERE {where} GROUP BY txn_id
                              HAVING sum(amount) <> 0 OR count(*) <> 2 OR count(DISTINCT currency) <> 1
                                  OR count(DISTINCT account_id) <> 2) x""")[0]


def test_create_schema_is_idempotent_and_keeps_rows(source_conn):
    bank_traffic.post_transfers(source_conn, 3, rng=random.Random(1))
    before = [bank.source_totals(source_conn, t) for t in ("customers", "accounts", "ledger_entries", "daily_balances")]

    bank.create_schema(source_conn)
    bank.create_schema(source_conn)
    assert bank.seed(source_conn) == {"customers": 50, "accounts": 100}  # re-seeding adds nothing

    after = [bank.source_totals(source_conn, t) for t in ("customers", "accounts", "ledger_entries", "daily_balances")]
    assert after == before
    with source_conn.cursor() as cur:
        cur.execute("SELECT tablename, indexdef FROM pg_indexes WHERE schemaname = 'bank'")
        indexes = cur.fetchall()
    for table, column in (("customers", "updated_at"), ("accounts", "updated_at"),
                          ("ledger_entries", "created_at"), ("daily_balances", "updated_at")):
        leading = [d for t, d in indexes if t == table and f"btree ({column}," in d]
        assert leading, f"no index leading with {table}.{column}"


def test_concurrent_simulator_keeps_the_books_balanced(source_conn, dsn):
    rows_before = bank.source_totals(source_conn).rows
    started = _one(source_conn, "SELECT now()")[0]

    with bank_traffic.Simulator(dsn, writers=3, seed=7) as sim:
        time.sleep(3)
    stats = sim.stats

    assert stats["transfers"] > 50 and stats["entries"] == 2 * stats["transfers"], stats
    assert bank.source_totals(source_conn).rows - rows_before == stats["entries"]
    assert _unbalanced(source_conn) == 0
    balances, broken = _one(source_conn, """
        SELECT count(*), count(*) FILTER (WHERE opening + movements <> closing) FROM bank.daily_balances""")
    assert balances > 0 and broken == 0
    edited = _one(source_conn, """
        SELECT (SELECT count(*) FROM bank.customers WHERE updated_at > %(t)s)
             + (SELECT count(*) FROM bank.accounts WHERE updated_at > %(t)s)""", {"t": started})[0]
    assert edited > 0, "the simulator also edits customer and account rows"
    assert bank.check_books(source_conn) == []


def test_held_transaction_commits_late_with_an_early_created_at(source_conn, dsn):
    source_conn.autocommit = True
    with bank_traffic.hold_open(dsn, 2.0, rows=4, seed=3) as held:
        assert len(held.entry_ids) == 4
        with source_conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM bank.ledger_entries WHERE entry_id = ANY(%s)", (held.entry_ids,))
            assert cur.fetchone()[0] == 0, "uncommitted rows must be invisible to other sessions"
            clock = read_source_clock(cur)
        # the planner sees the open transaction and stops the window before its rows' timestamp
        assert clock.oldest_open_xact is not None and clock.oldest_open_xact <= held.started_at
        assert clock.safe_bound(timedelta(0)) < held.started_at

        writer = psycopg2.connect(dsn)
        try:
            meanwhile = bank_traffic.post_transfers(writer, 3, rng=random.Random(5))
        finally:
            writer.close()
        visible = _one(source_conn, "SELECT count(*) FROM bank.ledger_entries WHERE entry_id = ANY(%s)", (meanwhile,))
        assert visible == (6,), "committed meanwhile: visible at once"

    assert held.committed and held.wait() == held.entry_ids
    held_min, held_max, visible = _one(source_conn, """
        SELECT min(created_at), max(created_at), count(*) FROM bank.ledger_entries WHERE entry_id = ANY(%s)""",
        (held.entry_ids,))
    assert visible == 4 and held_min == held_max == held.started_at
    [later] = _one(source_conn, "SELECT min(created_at) FROM bank.ledger_entries WHERE entry_id = ANY(%s)", (meanwhile,))
    assert held_max < later, "committed last, yet stamped before rows committed meanwhile"
    assert _unbalanced(source_conn, f"entry_id IN ({','.join(map(str, held.entry_ids))})") == 0
    assert bank.check_books(source_conn) == []


def test_many_entries_share_one_created_at(source_conn):
    ids = bank.many_at_one_timestamp(source_conn, 10)
    assert len(ids) == 10
    stamps, rows = _one(source_conn, """
        SELECT count(DISTINCT created_at), count(*) FROM bank.ledger_entries WHERE entry_id = ANY(%s)""", (ids,))
    assert (stamps, rows) == (1, 10)
    with pytest.raises(ValueError, match="even"):
        bank.many_at_one_timestamp(source_conn, 3)


def test_bulk_ledger_is_balanced(source_conn):
    assert bank.bulk_ledger(source_conn, 100_000, business_date=BULK_DAY, chunk=40_000) == 100_000

    where = f"business_date = '{BULK_DAY.isoformat()}'"
    rows, txns, stamps, net = _one(source_conn, f"""
        SELECT count(*), count(DISTINCT txn_id), count(DISTINCT created_at), sum(amount)
        FROM bank.ledger_entries WHERE {where}""")
    assert (rows, txns, stamps, net) == (100_000, 50_000, 3, 0)  # one created_at per chunk
    assert _unbalanced(source_conn, where) == 0

    totals = bank.source_totals(source_conn, "ledger_entries", where=where)
    assert totals.rows == 100_000 and set(totals.amounts) == set(bank.CURRENCIES)
    gross = dict(_one(source_conn, f"""
        SELECT array_agg(ARRAY[currency::text, s::text]) FROM (
            SELECT currency, sum(abs(amount)) AS s FROM bank.ledger_entries WHERE {where} GROUP BY currency) x""")[0])
    assert {c: str(v) for c, v in totals.amounts.items()} == gross
    # back-dated postings carried into later days' balances: the chain still holds
    assert bank.check_books(source_conn) == []


def test_the_demo_drops_only_what_it_owns(source_conn):
    """A table a data engineer put in schema bank survives the demo's reset; the schema itself is
    dropped only when the demo created it and nothing else is in it."""
    def scalar(sql, params=()):
        with source_conn, source_conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchone()[0] if cur.description else None

    scalar("DROP TABLE IF EXISTS bank.engineers_own")  # left by an interrupted run
    scalar("CREATE TABLE bank.engineers_own (id int PRIMARY KEY)")
    scalar("INSERT INTO bank.engineers_own VALUES (1)")
    bank.reset(source_conn)
    assert scalar("SELECT count(*) FROM bank.engineers_own") == 1
    assert scalar("SELECT count(*) FROM bank.customers") == 0  # the demo's own tables start afresh

    bank.drop_schema(source_conn)
    assert scalar("SELECT to_regclass('bank.engineers_own') IS NOT NULL")
    assert scalar("SELECT to_regnamespace('bank') IS NOT NULL"), "the schema still holds someone's table"
    scalar("DROP TABLE bank.engineers_own")
    bank.drop_schema(source_conn)
    assert scalar("SELECT to_regnamespace('bank') IS NULL")  # the demo's, and empty: dropped

    scalar("CREATE SCHEMA bank")  # someone else's schema: the demo uses it, never drops it
    bank.create_schema(source_conn)
    bank.drop_schema(source_conn)
    assert scalar("SELECT to_regnamespace('bank') IS NOT NULL")
    scalar("DROP SCHEMA bank")
    bank.create_schema(source_conn)
    assert scalar("SELECT obj_description('bank'::regnamespace, 'pg_namespace')") == bank.OWNED_MARK

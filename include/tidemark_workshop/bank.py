"""The demo source: a small core-banking schema in the source database, its seed, bulk loads and checks.

The nightly pipelines need a source that behaves like a real one: double-entry ledger entries
appended concurrently, balances updated in place, reference rows edited now and then, and
transactions that stamp their rows early but commit late. This module makes, fills and checks the
books; ``bank_traffic`` writes to them as the bank's applications would, while pipelines run, with
what every writer shares here. Everything is psycopg2 and SQL, no Airflow, so DAGs, tests and
benchmarks drive exactly the same writers.

Invariants every writer keeps (``check_books`` verifies them):

* each ``txn_id`` has entries in one currency summing to zero (amounts signed, debits negative);
* ``daily_balances.movements`` is the sum of that account's entries for that business date,
  ``opening + movements = closing``, and ``opening`` is the previous day's ``closing`` (0 first).

Rows are stamped with the database's ``now()`` (the transaction start), never a client clock,
because that is exactly the clock the window planner reasons about.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, NamedTuple

import psycopg2
import psycopg2.extensions

from tidemark.protocol.spec import quote

SCHEMA = "bank"
CURRENCIES = ("EUR", "USD", "GBP")
MAX_AMOUNT_CENTS = 500_000

_FIRST = ("Ada", "Bram", "Chloe", "Dario", "Elif", "Femi", "Greta", "Hugo", "Ines", "Jonas",
          "Kaja", "Luca", "Mira", "Noah", "Olga", "Pavel", "Rosa", "Sami", "Tess", "Uwe")
_LAST = ("Andersen", "Bianchi", "Costa", "Dubois", "Eriksen", "Fischer", "Garcia", "Horvat",
         "Ivanova", "Jansen", "Kowalski", "Larsen", "Moreau", "Novak", "O'Brien", "Peeters")
_COUNTRIES = ("DE", "FR", "NL", "GB", "US", "IE", "ES", "IT", "CH", "SE")

Connection = psycopg2.extensions.connection

# One statement per entry: idempotent, and safe to run while writers are active.
_DDL = (
    f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}",
    f"CREATE SEQUENCE IF NOT EXISTS {SCHEMA}.customer_id_seq",
    f"CREATE SEQUENCE IF NOT EXISTS {SCHEMA}.account_id_seq",
    f"CREATE SEQUENCE IF NOT EXISTS {SCHEMA}.entry_id_seq",
    f"""CREATE TABLE IF NOT EXISTS {SCHEMA}.customers (
        customer_id bigint PRIMARY KEY DEFAULT nextval('{SCHEMA}.customer_id_seq'),
        name        text NOT NULL,
        country     char(2) NOT NULL,
        updated_at  timestamptz NOT NULL DEFAULT now()
    )""",
    f"""CREATE TABLE IF NOT EXISTS {SCHEMA}.accounts (
        account_id  bigint PRIMARY KEY DEFAULT nextval('{SCHEMA}.account_id_seq'),
        customer_id bigint NOT NULL REFERENCES {SCHEMA}.customers,
        currency    char(3) NOT NULL,
        status      text NOT NULL CHECK (status IN ('open', 'frozen', 'closed')),
        opened_at   timestamptz NOT NULL,
        updated_at  timestamptz NOT NULL DEFAULT now()
    )""",
    # append-only; balance per txn_id cannot be a row constraint, check_books verifies it
    f"""CREATE TABLE IF NOT EXISTS {SCHEMA}.ledger_entries (
        entry_id      bigint PRIMARY KEY DEFAULT nextval('{SCHEMA}.entry_id_seq'),
        txn_id        uuid NOT NULL,
        account_id    bigint NOT NULL REFERENCES {SCHEMA}.accounts,
        business_date date NOT NULL,
        amount        numeric(18, 2) NOT NULL,
        currency      char(3) NOT NULL,
        side          text NOT NULL CHECK (side IN ('debit', 'credit')),
        created_at    timestamptz NOT NULL DEFAULT now(),
        CONSTRAINT ledger_entries_signed CHECK (amount <> 0 AND (side = 'debit') = (amount < 0))
    )""",
    f"""CREATE TABLE IF NOT EXISTS {SCHEMA}.daily_balances (
        account_id    bigint NOT NULL REFERENCES {SCHEMA}.accounts,
        business_date date NOT NULL,
        opening       numeric(18, 2) NOT NULL,
        movements     numeric(18, 2) NOT NULL,
        closing       numeric(18, 2) NOT NULL,
        currency      char(3) NOT NULL,
        updated_at    timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (account_id, business_date)
    )""",
    f"ALTER SEQUENCE {SCHEMA}.customer_id_seq OWNED BY {SCHEMA}.customers.customer_id",
    f"ALTER SEQUENCE {SCHEMA}.account_id_seq OWNED BY {SCHEMA}.accounts.account_id",
    f"ALTER SEQUENCE {SCHEMA}.entry_id_seq OWNED BY {SCHEMA}.ledger_entries.entry_id",
    # (cursor, primary key): window reads filter on the cursor and order/tie-break on the key
    f"CREATE INDEX IF NOT EXISTS customers_updated_at ON {SCHEMA}.customers (updated_at, customer_id)",
    f"CREATE INDEX IF NOT EXISTS accounts_updated_at ON {SCHEMA}.accounts (updated_at, account_id)",
    f"CREATE INDEX IF NOT EXISTS ledger_entries_created_at ON {SCHEMA}.ledger_entries (created_at, entry_id)",
    f"""CREATE INDEX IF NOT EXISTS daily_balances_updated_at
        ON {SCHEMA}.daily_balances (updated_at, account_id, business_date)""",
)


@contextmanager
def transaction(conn: Connection) -> Iterator[Any]:
    """One transaction on ``conn`` (even an autocommit one): commit on success, else roll back."""
    autocommit = conn.autocommit
    if autocommit:
        conn.autocommit = False
    try:
        with conn.cursor() as cur:
            yield cur
        conn.commit()
    except BaseException:
        conn.rollback()
        raise
    finally:
        if autocommit:
            conn.autocommit = True


@contextmanager
def _reading(conn: Connection) -> Iterator[Any]:
    """A cursor for reads; ends the read transaction only if it was ours to begin with.

    An idle-in-transaction session would hold back the window planner (oldest open
    transaction), while ending a caller's own transaction would discard its work.
    """
    ours = conn.get_transaction_status() == psycopg2.extensions.TRANSACTION_STATUS_IDLE
    try:
        with conn.cursor() as cur:
            yield cur
    finally:
        if ours and not conn.autocommit:
            conn.rollback()


# --- schema and seed ----------------------------------------------------------------------------
# The demo's own objects, dependents first. It drops these and nothing else: a table a data
# engineer added to the schema stays, and so does the schema if the demo did not create it.
_TABLES = ("daily_balances", "ledger_entries", "accounts", "customers")
_SEQUENCES = ("entry_id_seq", "account_id_seq", "customer_id_seq")
OWNED_MARK = "created by the Tidemark demo (tidemark_workshop.bank)"
OLDER_MARKS = ("created by the Tidemark demo (tidemark.bank)",)  # before the module moved: still the demo's


def create_schema(conn: Connection) -> None:
    """Create schema ``bank`` if missing; never touches existing rows (safe to call every run)."""
    with transaction(conn) as cur:
        # concurrent first calls would otherwise race on the catalogs
        cur.execute("SELECT pg_advisory_xact_lock(hashtext('tidemark_workshop.bank.create_schema'))")
        cur.execute("SELECT to_regnamespace(%s) IS NULL", (SCHEMA,))
        creating = cur.fetchone()[0]
        for statement in _DDL:
            cur.execute(statement)
        if creating:
            cur.execute(f"COMMENT ON SCHEMA {SCHEMA} IS %s", (OWNED_MARK,))


def drop_schema(conn: Connection) -> None:
    """Drop the demo's tables and sequences; then the schema, only if the demo created it and
    nothing else is left in it. An object of someone else's that depends on a demo table makes
    this fail with PostgreSQL's message naming it, rather than be dropped with it."""
    with transaction(conn) as cur:
        for table in _TABLES:
            cur.execute(f"DROP TABLE IF EXISTS {SCHEMA}.{table}")
        for sequence in _SEQUENCES:
            cur.execute(f"DROP SEQUENCE IF EXISTS {SCHEMA}.{sequence}")
        cur.execute(
            """SELECT obj_description(n.oid, 'pg_namespace') = ANY(%s)
                      AND NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.relnamespace = n.oid)
                      AND NOT EXISTS (SELECT 1 FROM pg_proc p WHERE p.pronamespace = n.oid)
                      AND NOT EXISTS (SELECT 1 FROM pg_type t WHERE t.typnamespace = n.oid AND t.typrelid = 0
                                        AND t.typelem = 0)
                 FROM pg_namespace n WHERE n.nspname = %s""",
            ([OWNED_MARK, *OLDER_MARKS], SCHEMA),
        )
        row = cur.fetchone()
        if row and row[0]:
            cur.execute(f"DROP SCHEMA {SCHEMA}")


def reset(conn: Connection) -> None:
    drop_schema(conn)
    create_schema(conn)


def seed(conn: Connection, *, customers: int = 50, accounts_per_customer: int = 2, seed: int = 0) -> dict[str, int]:
    """Deterministic customers and accounts (ids 1..n); re-running adds only what is missing.

    Customer ``i`` and its accounts depend only on ``seed`` and ``i``, so a larger seed extends a
    smaller one instead of reshuffling it. Returns the row counts of both tables afterwards.
    """
    rng = random.Random(seed)
    customer_rows, account_rows = [], []
    epoch = datetime(2015, 1, 1, tzinfo=timezone.utc)
    for customer_id in range(1, customers + 1):
        name = random_customer_name(rng)
        customer_rows.append((customer_id, name, rng.choice(_COUNTRIES)))
        for j in range(accounts_per_customer):
            account_id = (customer_id - 1) * accounts_per_customer + j + 1
            opened = epoch + timedelta(days=rng.randrange(3650), seconds=rng.randrange(86_400))
            account_rows.append((account_id, customer_id, rng.choice(CURRENCIES), "open", opened))
    with transaction(conn) as cur:
        cur.execute(
            f"""INSERT INTO {SCHEMA}.customers (customer_id, name, country)
                SELECT * FROM unnest(%s::bigint[], %s::text[], %s::text[])
                ON CONFLICT (customer_id) DO NOTHING""",
            as_columns(customer_rows, 3),
        )
        cur.execute(
            f"""INSERT INTO {SCHEMA}.accounts (account_id, customer_id, currency, status, opened_at)
                SELECT * FROM unnest(%s::bigint[], %s::bigint[], %s::text[], %s::text[], %s::timestamptz[])
                ON CONFLICT (account_id) DO NOTHING""",
            as_columns(account_rows, 5),
        )
        # explicit ids bypassed the sequences: move them past what is there
        for table, column, seq in (("customers", "customer_id", "customer_id_seq"),
                                   ("accounts", "account_id", "account_id_seq")):
            cur.execute(f"SELECT setval('{SCHEMA}.{seq}', greatest((SELECT max({column}) FROM {SCHEMA}.{table}), 1))")
        cur.execute(f"SELECT (SELECT count(*) FROM {SCHEMA}.customers), (SELECT count(*) FROM {SCHEMA}.accounts)")
        n_customers, n_accounts = cur.fetchone()
    return {"customers": n_customers, "accounts": n_accounts}


# --- what every writer shares (bank_traffic's too) ----------------------------------------------
def random_customer_name(rng: random.Random) -> str:
    return f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"


def as_columns(rows: list[tuple], width: int) -> list[list]:
    """One list per column, the arrays ``unnest()`` takes to insert many rows in one statement."""
    return [[row[i] for row in rows] for i in range(width)]


def require_even(rows: int, what: str) -> None:
    if rows < 0 or rows % 2:
        raise ValueError(f"{what} must be a non-negative even number (entries come in balanced pairs), got {rows}")


def business_day(cur, business_date: date | None) -> date:
    if business_date is not None:
        return business_date
    cur.execute("SELECT current_date")  # the source's calendar, like every other timestamp here
    return cur.fetchone()[0]


def open_accounts(cur) -> dict[str, list[int]]:
    """Open accounts per currency, only currencies where a transfer is possible (two accounts)."""
    cur.execute(
        f"""SELECT currency, array_agg(account_id ORDER BY account_id) FROM {SCHEMA}.accounts
            WHERE status = 'open' GROUP BY currency HAVING count(*) >= 2 ORDER BY currency"""
    )
    return {currency.strip(): ids for currency, ids in cur.fetchall()}


# Applies per-account deltas of one business date from a relation ``d(account_id, delta,
# currency)``: upsert that day's row (opening = the previous day's closing), then carry the delta
# into later days' opening/closing so back-dated postings keep the chain consistent. Rows are
# locked in account_id order so concurrent writers cannot deadlock on each other.
BALANCES_UPSERT = f"""
    INSERT INTO {SCHEMA}.daily_balances AS b (account_id, business_date, opening, movements, closing, currency)
    SELECT d.account_id, %(day)s, coalesce(p.closing, 0), d.delta, coalesce(p.closing, 0) + d.delta, d.currency
    FROM {{deltas}} LEFT JOIN LATERAL (
        SELECT q.closing FROM {SCHEMA}.daily_balances q
        WHERE q.account_id = d.account_id AND q.business_date < %(day)s
        ORDER BY q.business_date DESC LIMIT 1) p ON true
    ORDER BY d.account_id
    ON CONFLICT (account_id, business_date) DO UPDATE
       SET movements = b.movements + excluded.movements, closing = b.closing + excluded.movements,
           updated_at = now()"""
BALANCES_FORWARD = f"""
    UPDATE {SCHEMA}.daily_balances AS b
       SET opening = b.opening + d.delta, closing = b.closing + d.delta, updated_at = now()
    FROM {{deltas}} WHERE b.account_id = d.account_id AND b.business_date > %(day)s"""


# --- bulk loads ---------------------------------------------------------------------------------
# Generates ``rows`` entries as ``rows / 2`` balanced pairs entirely inside PostgreSQL. Pair p
# uses currency k = p mod ncur and two distinct accounts of that currency from a flat array (a
# slice per currency at ``offsets[k]``); amounts are exact cents derived from p; txn_id is the
# md5 of a per-call token and p, so both entries of a pair share it and calls never collide.
_GENERATE = f"""
WITH gen AS (
    SELECT mod(g, 2) AS s, g / 2 + %(base)s AS p, (mod(g / 2 + %(base)s, %(ncur)s) + 1)::int AS k
    FROM generate_series(0::bigint, %(rows)s::bigint - 1) AS g
), pick AS (
    SELECT s, p, k, (%(counts)s::int[])[k] AS n, (%(offsets)s::int[])[k] AS off,
           mod(p * 7919, (%(counts)s::int[])[k]) AS h
    FROM gen
), ins AS (
    INSERT INTO {SCHEMA}.ledger_entries (txn_id, account_id, business_date, amount, currency, side)
    SELECT md5(%(token)s || p::text)::uuid,
           (%(ids)s::bigint[])[(off + 1 + CASE WHEN s = 0 THEN h ELSE mod(h + 1 + mod(p, n - 1), n) END)::int],
           %(day)s,
           (CASE WHEN s = 0 THEN -1 ELSE 1 END) * (1 + mod(p * 104729, {MAX_AMOUNT_CENTS})) * 0.01,
           (%(curs)s::text[])[k],
           CASE WHEN s = 0 THEN 'debit' ELSE 'credit' END
    FROM pick
    RETURNING entry_id, account_id, amount, currency
), d AS (
    SELECT account_id, sum(amount) AS delta, min(currency) AS currency FROM ins GROUP BY account_id
), up AS ({BALANCES_UPSERT.format(deltas="d")}
    RETURNING 1
), fwd AS ({BALANCES_FORWARD.format(deltas="d")}
    RETURNING 1
)
SELECT {{result}} FROM ins"""


def _generate(cur, rows: int, day: date, *, token: str, base: int, accounts: dict[str, list[int]], result: str) -> list:
    currencies = sorted(accounts)
    ids, offsets = [], []
    for currency in currencies:
        offsets.append(len(ids))
        ids.extend(accounts[currency])
    # JIT compilation costs more than it saves on this statement
    cur.execute("SET LOCAL jit = off")
    # The account_id foreign keys would run one SELECT ... FOR KEY SHARE per row (a third of the
    # statement's time). Every row references one of these ~100 accounts, so take exactly those
    # locks once, here, and -- where the role may (superuser) -- skip the per-row triggers for
    # this transaction only. The guarantee is the same: each key exists and cannot be deleted or
    # changed before commit. Without the right, the triggers simply run.
    cur.execute(
        f"SELECT count(*) FROM (SELECT 1 FROM {SCHEMA}.accounts WHERE account_id = ANY(%s) FOR KEY SHARE) x", (ids,)
    )
    if cur.fetchone()[0] != len(ids):
        raise RuntimeError("accounts disappeared while generating ledger entries")
    cur.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
    if cur.fetchone()[0]:
        cur.execute("SET LOCAL session_replication_role = replica")
    cur.execute(
        _GENERATE.format(result=result),
        {"rows": rows, "base": base, "token": token, "day": day, "ncur": len(currencies), "ids": ids,
         "offsets": offsets, "counts": [len(accounts[c]) for c in currencies], "curs": currencies},
    )
    return cur.fetchall()


def bulk_ledger(conn: Connection, rows: int, *, business_date: date, chunk: int = 200_000) -> int:
    """Append ``rows`` entries (balanced pairs) fast: one INSERT ... SELECT per chunk.

    Each chunk is its own transaction, so all of a chunk's rows share one ``created_at`` (large
    ties on the cursor, as a real bulk load produces) and balances stay consistent per chunk.
    Returns the number of entries written.
    """
    require_even(rows, "rows")
    chunk = max(2, chunk - chunk % 2)
    token, written = uuid.uuid4().hex, 0
    while written < rows:
        size = min(chunk, rows - written)
        with transaction(conn) as cur:
            accounts = open_accounts(cur)
            if not accounts:
                raise RuntimeError(f"no currency has two open accounts in {SCHEMA}.accounts: call seed() first")
            [(count,)] = _generate(cur, size, business_date, token=token, base=written // 2,
                                   accounts=accounts, result="count(*)")
        written += count
    return written


def many_at_one_timestamp(conn: Connection, n: int, *, business_date: date | None = None) -> list[int]:
    """Insert ``n`` entries (balanced pairs) in ONE transaction, so all share one ``created_at``.

    Exercises the primary-key tie-break of timestamp cursors. Returns the entry ids.
    """
    require_even(n, "n")
    if n == 0:
        return []
    with transaction(conn) as cur:
        day = business_day(cur, business_date)
        accounts = open_accounts(cur)
        if not accounts:
            raise RuntimeError(f"no currency has two open accounts in {SCHEMA}.accounts: call seed() first")
        rows = _generate(cur, n, day, token=uuid.uuid4().hex, base=0, accounts=accounts, result="entry_id")
    return sorted(row[0] for row in rows)


# --- control totals and invariants --------------------------------------------------------------
class Totals(NamedTuple):
    rows: int
    amounts: dict[str, Decimal]  # per currency


# What is summed per currency: absolute values, because double entry makes the signed sums net to
# zero (every txn_id, and every day's closings across accounts), so a lost or duplicated pair, or
# a missed update of both sides of a transfer, would leave a signed total unchanged.
_SUMMED = {"ledger_entries": "abs(amount)", "daily_balances": "abs(closing)"}


def source_totals(conn: Connection, table: str = "ledger_entries", *, where: str | None = None) -> Totals:
    """Row count and exact amount per currency of ``table``, to compare a source with a target.

    ``table`` is ``ledger_entries`` / ``daily_balances`` (schema ``bank``) or a qualified name of
    a table with the same columns (e.g. the warehouse copy). ``where`` is an optional SQL
    condition such as ``tidemark.protocol.window.predicate(spec, window)``. Other tables: count only.
    """
    qualified = table if "." in table else f"{SCHEMA}.{table}"
    expression = _SUMMED.get(qualified.rsplit(".", 1)[1])
    condition = f"WHERE {where}" if where else ""
    with _reading(conn) as cur:
        if expression is None:
            cur.execute(f"SELECT count(*) FROM {quote(qualified)} {condition}")
            return Totals(cur.fetchone()[0], {})
        cur.execute(
            f"SELECT currency, count(*), sum({expression}) FROM {quote(qualified)} {condition} GROUP BY currency"
        )
        rows = cur.fetchall()
    return Totals(sum(r[1] for r in rows), {r[0].strip(): r[2] for r in sorted(rows)})


_CHECKS = (
    ("transactions not balanced per currency", f"""
        SELECT txn_id::text || ' ' || currency || ' sums to ' || sum(amount) FROM {SCHEMA}.ledger_entries
        GROUP BY txn_id, currency HAVING sum(amount) <> 0 OR count(*) < 2"""),
    ("entries without their account or in another currency", f"""
        SELECT 'entry ' || e.entry_id FROM {SCHEMA}.ledger_entries e LEFT JOIN {SCHEMA}.accounts a USING (account_id)
        WHERE a.currency IS DISTINCT FROM e.currency"""),
    ("balances with opening + movements <> closing", f"""
        SELECT account_id || '@' || business_date FROM {SCHEMA}.daily_balances
        WHERE opening + movements <> closing"""),
    ("balances whose movements differ from their entries", f"""
        SELECT account_id || '@' || business_date || ': ' || coalesce(b.movements::text, 'no row')
               || ' vs entries ' || coalesce(e.total::text, 'none')
        FROM {SCHEMA}.daily_balances b
        FULL JOIN (SELECT account_id, business_date, sum(amount) AS total FROM {SCHEMA}.ledger_entries
                   GROUP BY account_id, business_date) e USING (account_id, business_date)
        WHERE b.movements IS DISTINCT FROM e.total"""),
    ("balances whose opening is not the previous closing", f"""
        SELECT account_id || '@' || business_date FROM (
            SELECT *, lag(closing) OVER (PARTITION BY account_id ORDER BY business_date) AS previous
            FROM {SCHEMA}.daily_balances) x
        WHERE opening <> coalesce(previous, 0)"""),
)


def check_books(conn: Connection, *, examples: int = 3) -> list[str]:
    """Every broken invariant of the demo books, with a few examples each; empty when sound.

    Reads whole tables: meant for tests and the demo, not for millions of rows in a hot path.
    """
    problems = []
    with _reading(conn) as cur:
        for title, sql in _CHECKS:
            cur.execute(f"SELECT count(*) OVER (), x.* FROM ({sql}) x LIMIT %s", (examples,))
            found = cur.fetchall()
            if found:
                problems.append(f"{found[0][0]} {title}, e.g. {', '.join(row[1] for row in found)}")
    return problems

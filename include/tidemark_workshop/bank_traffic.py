"""The demo source's live traffic: transfers posted as the bank's applications post them.

Small transactions of a few balanced transfers (``post_transfers``, now and then editing a customer
or account row), a transaction that stamps its rows early and commits late (``hold_open``),
concurrent writer threads (``Simulator``) and the payment events an application publishes after
it commits (``entry_events``, ``publish_events``). This is what runs while the pipelines run, with
threads and Kafka; making, seeding, bulk-filling and checking the books (``bank``) needs none of
it, hence its own module. It keeps the invariants ``bank`` states, through the same balance
statements.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from datetime import date, datetime
from decimal import Decimal
from typing import Any, NamedTuple

import psycopg2
import psycopg2.extensions

from tidemark_workshop.bank import (
    BALANCES_FORWARD,
    BALANCES_UPSERT,
    MAX_AMOUNT_CENTS,
    SCHEMA,
    Connection,
    as_columns,
    business_day,
    open_accounts,
    random_customer_name,
    require_even,
    transaction,
)

UPDATE_PROBABILITY = 0.2  # per post_transfers call: also edit one customer or account row


# --- postings -----------------------------------------------------------------------------------
class _Entry(NamedTuple):
    txn_id: str
    account_id: int
    amount: Decimal
    currency: str
    side: str


def _transfers(rng: random.Random, accounts: dict[str, list[int]], n: int) -> list[_Entry]:
    if n and not accounts:
        raise RuntimeError(f"no currency has two open accounts in {SCHEMA}.accounts: call seed() first")
    currencies = sorted(accounts)
    entries: list[_Entry] = []
    for _ in range(n):
        currency = rng.choice(currencies)
        debit, credit = rng.sample(accounts[currency], 2)
        amount = Decimal(rng.randint(1, MAX_AMOUNT_CENTS)).scaleb(-2)  # exact cents, never a float
        txn_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        entries.append(_Entry(txn_id, debit, -amount, currency, "debit"))
        entries.append(_Entry(txn_id, credit, amount, currency, "credit"))
    return entries


def _insert_entries(cur, entries: list[_Entry], day: date) -> list[int]:
    if not entries:
        return []
    cur.execute(
        f"""INSERT INTO {SCHEMA}.ledger_entries (txn_id, account_id, business_date, amount, currency, side)
            SELECT t, a, %s, m, c, s
            FROM unnest(%s::uuid[], %s::bigint[], %s::numeric[], %s::text[], %s::text[]) AS v(t, a, m, c, s)
            RETURNING entry_id""",
        (day, *as_columns(entries, 5)),
    )
    return [row[0] for row in cur.fetchall()]


_UNNEST_DELTAS = "unnest(%(ids)s::bigint[], %(deltas)s::numeric[], %(curs)s::text[]) AS d(account_id, delta, currency)"


def _apply_balances(cur, day: date, entries: list[_Entry]) -> None:
    deltas: dict[int, tuple[Decimal, str]] = {}
    for e in entries:
        total, _ = deltas.get(e.account_id, (Decimal(0), e.currency))
        deltas[e.account_id] = (total + e.amount, e.currency)
    if not deltas:
        return
    ids = sorted(deltas)
    params = {"day": day, "ids": ids, "deltas": [deltas[i][0] for i in ids], "curs": [deltas[i][1] for i in ids]}
    cur.execute(BALANCES_UPSERT.format(deltas=_UNNEST_DELTAS), params)
    cur.execute(BALANCES_FORWARD.format(deltas=_UNNEST_DELTAS), params)


def _edit_reference_row(cur, rng: random.Random, accounts: dict[str, list[int]]) -> None:
    """Rename a customer, or freeze/unfreeze an account: the upsert pipelines' changes."""
    if not accounts:
        return
    account_id = rng.choice(rng.choice(list(accounts.values())))
    roll = rng.random()
    if roll < 0.5:
        cur.execute(
            f"""UPDATE {SCHEMA}.customers SET name = %s, updated_at = now()
                WHERE customer_id = (SELECT customer_id FROM {SCHEMA}.accounts WHERE account_id = %s)""",
            (random_customer_name(rng), account_id),
        )
    elif roll < 0.7:
        cur.execute(
            f"UPDATE {SCHEMA}.accounts SET status = 'frozen', updated_at = now() WHERE account_id = %s",
            (account_id,),
        )
    else:  # unfreeze more often than freeze, so the number of frozen accounts stays small
        cur.execute(
            f"""UPDATE {SCHEMA}.accounts SET status = 'open', updated_at = now()
                WHERE account_id = (SELECT account_id FROM {SCHEMA}.accounts WHERE status = 'frozen'
                                    ORDER BY updated_at, account_id LIMIT 1 FOR UPDATE SKIP LOCKED)"""
        )


def post_transfers(conn: Connection, n: int, *, rng: random.Random, business_date: date | None = None) -> list[int]:
    """Post ``n`` balanced transfers and their balance updates in one transaction, and commit.

    Every row is stamped with the same ``now()``. ``business_date`` defaults to the source's
    ``current_date``. With probability ``UPDATE_PROBABILITY`` one customer or account row is
    edited too. Returns the entry ids written (two per transfer).
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    with transaction(conn) as cur:
        day = business_day(cur, business_date)
        accounts = open_accounts(cur)
        entries = _transfers(rng, accounts, n)
        ids = _insert_entries(cur, entries, day)
        _apply_balances(cur, day, entries)
        if rng.random() < UPDATE_PROBABILITY:
            _edit_reference_row(cur, rng, accounts)
    return ids


# --- late commits -------------------------------------------------------------------------------
class HeldTransaction:
    """A transaction that inserted ledger entries and stays open, on its own thread and connection.

    Its rows carry ``created_at = started_at`` (the transaction start) but only become visible at
    commit, ``seconds`` later: the late-committing rows a timestamp cursor loses unless the
    window stops before the oldest open transaction. Use as a context manager (the exit waits
    for the commit) or call ``wait()``.
    """

    def __init__(self, dsn: str, seconds: float, *, rows: int, business_date: date | None, seed: int | None):
        require_even(rows, "rows")
        self.seconds = seconds
        self.entry_ids: list[int] = []
        self.started_at: datetime | None = None
        self.pid: int | None = None
        self.committed = False
        self._dsn, self._rows, self._day, self._rng = dsn, rows, business_date, random.Random(seed)
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="bank-hold-open", daemon=True)

    def _run(self) -> None:
        try:
            conn = psycopg2.connect(self._dsn, application_name="tidemark-bank-hold-open")
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            self._error = exc
            self._ready.set()
            return
        try:
            with transaction(conn) as cur:
                cur.execute("SELECT now(), pg_backend_pid()")
                self.started_at, self.pid = cur.fetchone()
                opened = time.monotonic()
                day = business_day(cur, self._day)
                entries = _transfers(self._rng, open_accounts(cur), self._rows // 2)
                self.entry_ids = _insert_entries(cur, entries, day)
                self._ready.set()
                time.sleep(max(0.0, self.seconds - (time.monotonic() - opened)))
                # balances last: their row locks are held for milliseconds, not `seconds`
                _apply_balances(cur, day, entries)
            self.committed = True
        except BaseException as exc:  # noqa: BLE001
            self._error = exc
        finally:
            self._ready.set()
            conn.close()

    def start(self) -> "HeldTransaction":
        """Start, and return once the rows are inserted (not yet committed)."""
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error
        return self

    def wait(self, timeout: float | None = None) -> list[int]:
        """Wait for the commit; the entry ids written."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"held transaction (pid {self.pid}) still open after {timeout}s")
        if self._error is not None:
            raise self._error
        return self.entry_ids

    def __enter__(self) -> "HeldTransaction":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.wait()


def hold_open(dsn: str, seconds: float, *, rows: int = 10, business_date: date | None = None,
              seed: int | None = None) -> HeldTransaction:
    """Open a transaction, insert ``rows`` entries, keep it open ``seconds``, then commit.

    Returns as soon as the rows are inserted; ``.entry_ids`` are known then, ``.wait()``
    returns them after the commit. ``with hold_open(dsn, 10) as held: ...`` runs the block
    while the transaction is open.
    """
    return HeldTransaction(dsn, seconds, rows=rows, business_date=business_date, seed=seed).start()


# --- concurrent writers -------------------------------------------------------------------------
EVENTS_TOPIC = "bank.payment_events"


def entry_events(cur, entry_ids: list[int]) -> list[tuple[bytes, bytes]]:
    """The payment events of ledger entries as applications publish them: (key, value), keyed by
    account, the entry as one JSON object written by PostgreSQL (numbers exact, times with their
    zone, ``created_at`` the event time)."""
    cur.execute(f"SELECT account_id::text, row_to_json(e)::text FROM {SCHEMA}.ledger_entries e "
                "WHERE entry_id = ANY(%s) ORDER BY entry_id", (entry_ids,))
    return [(key.encode(), value.encode()) for key, value in cur.fetchall()]


def publish_events(conn: Connection, bootstrap: str, entry_ids: list[int], topic: str = EVENTS_TOPIC) -> int:
    """Publish the payment events of committed entries (as the application that wrote them would)."""
    from confluent_kafka import Producer

    from tidemark.protocol.kafka_io import producer_config

    producer = Producer(producer_config(bootstrap))
    with conn, conn.cursor() as cur:
        events = entry_events(cur, entry_ids)
    for key, value in events:
        producer.produce(topic, value=value, key=key)
    if producer.flush(30) != 0:
        raise RuntimeError(f"could not deliver {len(events)} payment event(s) to {topic} within 30 s")
    return len(events)


class Simulator:
    """Concurrent writer threads, each with its own connection, posting small batches of transfers.

    With ``events`` (a Kafka bootstrap), each writer also publishes the payment events of what it
    committed to ``EVENTS_TOPIC`` (``entry_events``), after the commit, as an application would:
    the real-time and batch paths see the same facts.

    Deadlocks and serialization failures are retried (counted in ``retries``); any other error
    stops that writer and is raised by ``stop()``.
    """

    def __init__(self, dsn: str, *, writers: int = 3, seed: int = 0, max_transfers: int = 5, pause: float = 0.01,
                 events: str | None = None, events_topic: str = EVENTS_TOPIC, events_partitions: int = 3):
        if writers < 1:
            raise ValueError(f"writers must be >= 1, got {writers}")
        self._events, self._events_topic, self._events_partitions = events, events_topic, events_partitions
        self._dsn, self._writers, self._seed = dsn, writers, seed
        self._max_transfers, self._pause = max_transfers, pause
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._errors: list[BaseException] = []
        self._stats = {"transactions": 0, "transfers": 0, "entries": 0, "retries": 0, "events": 0}
        self._started = 0.0
        self.stats: dict[str, Any] = {}  # filled by stop(), also when used as a context manager

    def start(self) -> "Simulator":
        if self._threads:
            raise RuntimeError("simulator already started")
        if self._events is not None:  # the broker creates no topic by itself
            from tidemark.protocol.kafka_io import ensure_topic

            ensure_topic(self._events, self._events_topic, self._events_partitions)
        self._started = time.monotonic()
        for i in range(self._writers):
            thread = threading.Thread(target=self._write, args=(i,), name=f"bank-writer-{i}", daemon=True)
            self._threads.append(thread)
            thread.start()
        return self

    def _write(self, index: int) -> None:
        rng = random.Random(self._seed * 1_000 + index)
        try:
            conn = psycopg2.connect(self._dsn, application_name=f"tidemark-bank-writer-{index}")
        except BaseException as exc:  # noqa: BLE001
            with self._lock:
                self._errors.append(exc)
            return
        producer = None
        try:
            if self._events is not None:
                from confluent_kafka import Producer

                from tidemark.protocol.kafka_io import producer_config

                producer = Producer(producer_config(self._events))
            while not self._stop.is_set():
                n = rng.randint(1, self._max_transfers)
                try:
                    ids = post_transfers(conn, n, rng=rng)
                except psycopg2.extensions.TransactionRollbackError:
                    with self._lock:
                        self._stats["retries"] += 1
                    continue
                published = 0
                if producer is not None:
                    with conn, conn.cursor() as cur:
                        for key, value in entry_events(cur, ids):
                            producer.produce(self._events_topic, value=value, key=key)
                            published += 1
                    producer.poll(0)
                with self._lock:
                    self._stats["transactions"] += 1
                    self._stats["transfers"] += n
                    self._stats["entries"] += len(ids)
                    self._stats["events"] += published
                self._stop.wait(self._pause)
            if producer is not None and producer.flush(30) != 0:
                raise RuntimeError(f"could not deliver every payment event to {self._events_topic} within 30 s")
        except BaseException as exc:  # noqa: BLE001
            with self._lock:
                self._errors.append(exc)
        finally:
            conn.close()

    def stop(self, timeout: float = 30.0) -> dict[str, Any]:
        """Stop every writer; what was committed: transactions, transfers, entries, retries."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout)
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            raise TimeoutError(f"writers still running after {timeout}s: {alive}")
        if self._errors:
            raise RuntimeError(f"{len(self._errors)} writer(s) failed: {self._errors[0]!r}") from self._errors[0]
        with self._lock:
            elapsed = round(time.monotonic() - self._started, 3)
            self.stats = {**self._stats, "writers": self._writers, "seconds": elapsed}
        return self.stats

    def __enter__(self) -> "Simulator":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


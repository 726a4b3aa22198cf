"""Late-committing transactions and shared timestamps: Tidemark loses nothing, a naive pull does.

One source table, concurrent writers, a transaction held open across a batch boundary and 500
rows sharing one timestamp. After consecutive batches the target equals the source key by key.
The same history pulled with `updated_at > last_value` misses the late rows: the test can fail.
"""

from __future__ import annotations

import threading
import time

import psycopg2
import pytest

from tidemark_workshop.stack.batchrun import make_pipeline

pytestmark = [pytest.mark.stack]  # holds a source transaction: only its own lane's database (tests/conftest.py)

DDL = """
CREATE TABLE {table} (
    id bigint PRIMARY KEY,
    amount numeric(18,2) NOT NULL,
    note text,
    updated_at timestamptz NOT NULL DEFAULT now()
)"""


class Writers:
    """Threads that insert and update rows, each commit stamped with its transaction's now()."""

    def __init__(self, dsn: str, table: str, n: int = 2):
        self.dsn, self.table, self.stop_flag = dsn, table, threading.Event()
        self.threads = [threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(n)]
        self.commits = 0
        self.errors: list[BaseException] = []

    def _loop(self, i: int) -> None:
        try:
            self._write(i)
        except BaseException as exc:  # surfaced by __exit__: a silent writer would prove nothing
            self.errors.append(exc)

    def _write(self, i: int) -> None:
        conn = psycopg2.connect(self.dsn)
        next_id = 1_000_000 * (i + 1)
        while not self.stop_flag.is_set():
            with conn, conn.cursor() as cur:
                cur.execute(f"INSERT INTO {self.table} (id, amount, note) SELECT g, g %% 997 + 0.01, 'w' "
                            "FROM generate_series(%s, %s) g", (next_id, next_id + 19))
                cur.execute(f"UPDATE {self.table} SET amount = amount + 1.25, updated_at = now() "
                            "WHERE id = (SELECT id FROM " + self.table + " ORDER BY random() LIMIT 1)")
            next_id += 20
            self.commits += 1
            time.sleep(0.02)
        conn.close()

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop_flag.set()
        for t in self.threads:
            t.join(10)
        assert not self.errors, f"writer failed: {self.errors[0]!r}"
        assert self.commits > 10, f"writers committed only {self.commits} transactions"


def naive_pull(conn, table: str, last):
    """What Kafka Connect's JDBC source / Airbyte incremental do: updated_at > last seen value."""
    with conn, conn.cursor() as cur:
        if last is None:
            cur.execute(f"SELECT id, amount, updated_at FROM {table}")
        else:
            cur.execute(f"SELECT id, amount, updated_at FROM {table} WHERE updated_at > %s", (last,))
        rows = cur.fetchall()
    return rows, max([r[2] for r in rows], default=last)


def test_late_commits_and_shared_timestamps_lose_nothing(settings, tmp_path):
    pipe = make_pipeline(settings, tmp_path, DDL)
    table = pipe.source_table
    dsn = settings.dsn(settings.source_db)
    src = psycopg2.connect(dsn)
    with src, src.cursor() as cur:
        cur.execute(f"INSERT INTO {table} (id, amount, note) SELECT g, g * 1.01, 'seed' FROM generate_series(1, 2000) g")
    naive_target: dict = {}
    naive_last = None

    def naive_round():
        nonlocal naive_last
        rows, naive_last = naive_pull(src, table, naive_last)
        naive_target.update({r[0]: r[1:] for r in rows})

    naive_round()
    # A transaction that stamps its rows now and commits only after the next batch has run.
    held = psycopg2.connect(dsn)
    held_cur = held.cursor()
    held_cur.execute(f"INSERT INTO {table} (id, amount, note) SELECT g, 7.77, 'late' FROM generate_series(900001, 900050) g")
    time.sleep(0.05)
    with src, src.cursor() as cur:  # 500 rows sharing one timestamp, committed in one transaction
        cur.execute(f"INSERT INTO {table} (id, amount, note) SELECT g, 3.33, 'same-ts' FROM generate_series(800001, 800500) g")
    with Writers(dsn, table):
        time.sleep(1.0)
        naive_round()
        plan1, _ = pipe.run("run-1")
        # The held transaction started before the safe bound could pass it: the window stops before it, and its
        # rows, uncommitted, are in no snapshot (the batch reads the writers' newer rows above the window: issue 52).
        assert pipe.query_wh("SELECT count(*) FROM " + pipe.spec.target_table + " WHERE id BETWEEN 900001 AND 900050"
                             )[0][0] == 0
        assert plan1.reads_above and pipe.watermark() == plan1.window.hi.to_json()
        held.commit()  # the late rows commit now, stamped earlier than rows already loaded
        held.close()
        time.sleep(0.5)
        naive_round()
        pipe.run("run-2")
    # writers stopped: one more batch catches up with everything committed
    naive_round()
    pipe.run("run-3")

    source = pipe.rows("source", "amount, updated_at")
    target = pipe.rows("target", "amount, updated_at")
    missing = sorted(set(source) - set(target))
    extra = sorted(set(target) - set(source))
    differing = [k for k in source if k in target and source[k] != target[k]]
    assert not missing and not extra and not differing, (
        f"target differs from source: {len(missing)} missing (e.g. {missing[:5]}), {len(extra)} extra, "
        f"{len(differing)} differing (e.g. {differing[:5]})"
    )
    assert len(source) > 2550
    # The naive pull lost the late-committing rows (their updated_at is below its last value).
    # (writers may have updated a few late rows again, giving them a newer stamp: those it sees)
    naive_missing = {k for k in source if k not in naive_target}
    held_stamp = min(source[k][1] for k in range(900001, 900051))
    late_untouched = {k for k in range(900001, 900051) if source[k][1] == held_stamp}
    assert len(late_untouched) >= 40
    assert late_untouched <= naive_missing, f"naive pull unexpectedly saw late rows: {sorted(late_untouched - naive_missing)}"
    # Ledger: three committed batches with contiguous windows; the watermark is the last hi.
    batches = pipe.query_wh(
        "SELECT window_lo->>'cursor', window_hi->>'cursor', state FROM tidemark_control.batches "
        "WHERE pipeline = %s ORDER BY planned_at", (pipe.spec.name,))
    assert [b[2] for b in batches] == ["committed"] * 3
    assert batches[1][0] == batches[0][1] and batches[2][0] == batches[1][1]
    assert pipe.watermark()["cursor"] == batches[2][1]
    src.close()

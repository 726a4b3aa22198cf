"""Issue 52: a row its writers update faster than the safe lag lands in every batch, at its version in
the batch's one snapshot of the source, on both transports; a proof that compared nothing fails.

Every row of the source table is updated every 200 ms while the batch runs (safe lag 2 s), so no row
ever lies at or below the window's end: before, the batch carried none of them and every check said
OK. A trigger keeps every version with the transaction that wrote it, so the test knows exactly which
version the extract's snapshot (reported by the extract: ``pg_current_snapshot()``) saw of each key.
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time

import psycopg2
import pytest

from tidemark import reconcile
from tidemark.status.model import Lag
from tidemark.status.queries import extract_snapshots
from tidemark_airflow.reconcile import NEXT_STARVED, failure
from tidemark_workshop.stack.batchrun import make_pipeline

pytestmark = [pytest.mark.stack]

ROWS = 120

DDL = """
CREATE TABLE {table} (
    id bigint PRIMARY KEY,
    amount numeric(18,2) NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE {table}_versions (
    seq bigserial PRIMARY KEY, id bigint NOT NULL, amount numeric(18,2) NOT NULL, updated_at timestamptz NOT NULL,
    xid xid8 NOT NULL DEFAULT pg_current_xact_id()
);
CREATE FUNCTION {table}_keep() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {table}_versions (id, amount, updated_at) VALUES (NEW.id, NEW.amount, NEW.updated_at);
    RETURN NEW;
END $$;
CREATE TRIGGER keep AFTER INSERT OR UPDATE ON {table} FOR EACH ROW EXECUTE FUNCTION {table}_keep()"""


class HotWriters:
    """Two sessions that update every row of the table every 200 ms (half the rows each, one short
    transaction per row, stamped by the clock at the update)."""

    def __init__(self, dsn: str, table: str):
        self.dsn, self.table, self.stop = dsn, table, threading.Event()
        self.updates, self.errors = 0, []
        self.threads = [threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(2)]

    def _loop(self, half: int) -> None:
        try:
            conn = psycopg2.connect(self.dsn)
            conn.autocommit = True
            with conn.cursor() as cur:
                while not self.stop.is_set():
                    started = time.monotonic()
                    for key in range(1 + half, ROWS + 1, 2):
                        cur.execute(f"UPDATE {self.table} SET amount = amount + 1, updated_at = clock_timestamp() "
                                    "WHERE id = %s", (key,))
                        self.updates += 1
                    time.sleep(max(0.0, 0.2 - (time.monotonic() - started)))
            conn.close()
        except BaseException as exc:  # surfaced on leaving: a silent writer would prove nothing
            self.errors.append(exc)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(10)
        assert not self.errors, f"writer failed: {self.errors[0]!r}"


def _as_of(pipe, snapshot: str) -> dict:
    """Each key's newest version that ``snapshot`` sees (one writer per key: ``seq`` orders its versions)."""
    conn = pipe.src()
    try:
        with conn, conn.cursor() as cur:
            cur.execute(f"SELECT DISTINCT ON (id) id, amount, updated_at FROM {pipe.source_table}_versions "
                        "WHERE pg_visible_in_snapshot(xid, %s::pg_snapshot) ORDER BY id, seq DESC", (snapshot,))
            return {r[0]: r[1:] for r in cur.fetchall()}
    finally:
        conn.close()


def _extract_watched(pipe, plan, attempt: int, tmp_path) -> dict:
    """The extract, while the status page's query of the source is asked what it holds: the extract's
    snapshot must show, held for some time, with the spec's limit."""
    report = tmp_path / f"report-{attempt}.json"
    job = concurrent.futures.ThreadPoolExecutor(1).submit(pipe.extract_job, plan, attempt, report)
    seen = []
    conn = pipe.src()
    conn.autocommit = True
    try:
        while not job.done():
            with conn.cursor() as cur:
                held = extract_snapshots(cur).get(pipe.spec.name)
            if held is not None:
                seen.append(held)
            time.sleep(0.2)
    finally:
        conn.close()
    proc = job.result()
    assert proc.returncode == 0, f"extract failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    assert seen and max(seen) > 0, "the extract's snapshot never showed in pg_stat_activity"
    text = Lag(snapshot_held_s=max(seen), snapshot_limit_s=pipe.spec.max_snapshot_hold.total_seconds()).snapshot_text()
    assert text.startswith("extract reading in one snapshot of the source, held") and "max_snapshot_hold 1h" in text
    return json.loads(report.read_text())


def _reconcile(pipe, settings, tmp_path, batch_id: str) -> reconcile.Outcome:
    src, wh = pipe.src(), pipe.wh()
    try:
        return reconcile.run(pipe.spec, src, wh, tmp_path, batch_id=batch_id, code_version="test")
    finally:
        src.close()
        wh.close()


@pytest.mark.parametrize("transport", ["kafka", "direct"])
def test_rows_hotter_than_the_safe_lag_land_at_their_snapshot_version(settings, tmp_path, transport):
    pipe = make_pipeline(settings, tmp_path, DDL, safe_lag="PT2S", transport=transport)
    conn = pipe.src()
    with conn, conn.cursor() as cur:
        cur.execute(f"INSERT INTO {pipe.source_table} (id, amount) SELECT g, g FROM generate_series(1, %s) g", (ROWS,))
    conn.close()
    with HotWriters(settings.dsn(settings.source_db), pipe.source_table) as writers:
        time.sleep(2.5)  # from now on every row was updated within the safe lag: none is at or below a window's end
        plan = pipe.plan("run-1")
        assert plan.reads_above and plan.read_window.lo == plan.window.lo
        attempt = pipe.begin(plan)
        report = _extract_watched(pipe, plan, attempt, tmp_path)
        pipe.end(plan, attempt, report)
        pipe.sink()
        assert pipe.state(plan.batch_id, attempt) == "committed", pipe.ledger(plan.batch_id)
        target = pipe.rows("target", "amount, updated_at")
        expected = _as_of(pipe, report["snapshot"]["snapshot"])
        above = sum(1 for _, at in target.values() if at > plan.window.hi.cursor)
        # reconciled under the writers: every key moved on since the snapshot, so nothing can be compared
        busy = _reconcile(pipe, settings, tmp_path, plan.batch_id)
        updates = writers.updates
    assert updates > 4 * ROWS, f"the writers updated only {updates} rows"
    assert len(expected) == ROWS and len(target) == ROWS, f"{len(target)} of {ROWS} keys landed"
    assert target == expected, [k for k in expected if target.get(k) != expected[k]][:5]
    assert above == ROWS, f"only {above} rows lay past the window's end {plan.window.hi}: not a hot table"
    assert pipe.watermark() == plan.window.hi.to_json()  # the watermark moved only to the window's end
    if busy.verdict.rows_source == 0:  # a proof over nothing fails, never "OK"
        assert not busy.verdict.passed and "compared_rows" in busy.line and busy.verdict.moved_keys == ROWS, busy.line
    else:  # a key the writers had not reached again was compared, at the version the batch carried
        assert busy.verdict.passed, busy.line
    # quiet now: the next batch re-reads the overlap (an idempotent upsert) and the target equals the source
    plan2, _ = pipe.run("run-2")
    assert plan2.window.lo == plan.window.hi
    assert pipe.rows("target", "amount, updated_at") == pipe.rows("source", "amount, updated_at")
    quiet = _reconcile(pipe, settings, tmp_path, plan2.batch_id)
    assert quiet.verdict.passed and quiet.verdict.rows_source == ROWS == quiet.verdict.rows_target, quiet.line
    # and the first batch, reconciled again now: every key it carried is still the source's version
    again = _reconcile(pipe, settings, tmp_path, plan.batch_id)
    assert again.verdict.passed and again.verdict.rows_target == ROWS, again.line


def test_a_key_no_window_holds_for_three_batches_is_named_as_starved(settings, tmp_path):
    """Batches planned as an older Tidemark planned them (no reading above, as a capped window or a backfill
    still is): a key updated every 100 ms with a safe lag of 2 s is in none of their windows, and the third
    batch's reconciliation names it, with how often it changed; the cold keys are compared all along."""
    from dataclasses import replace

    pipe = make_pipeline(settings, tmp_path, DDL, safe_lag="PT2S")
    conn = pipe.src()
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f"INSERT INTO {pipe.source_table} (id, amount, updated_at) SELECT g, g, now() - interval '1 hour' "
                    "FROM generate_series(1, 20) g")
    stop, errors = threading.Event(), []

    def hot():
        try:
            c = psycopg2.connect(settings.dsn(settings.source_db))
            c.autocommit = True  # each update commits at once
            with c.cursor() as cur:
                while not stop.is_set():
                    cur.execute(f"UPDATE {pipe.source_table} SET amount = amount + 1, updated_at = clock_timestamp() "
                                "WHERE id = 7")
                    time.sleep(0.1)
            c.close()
        except BaseException as exc:
            errors.append(exc)

    writer = threading.Thread(target=hot, daemon=True)
    writer.start()
    outcomes = []
    try:
        time.sleep(2.5)
        for n in range(1, 4):
            plan = replace(pipe.plan(f"run-{n}"), reads_above=False)
            pipe.query_wh("UPDATE tidemark_control.batches SET reads_above = false WHERE batch_id = %s RETURNING 1",
                          (plan.batch_id,))
            pipe.load(plan)
            outcomes.append(_reconcile(pipe, settings, tmp_path, plan.batch_id))
    finally:
        stop.set()
        writer.join(10)
        conn.close()
    assert not errors, errors
    first, second, third = outcomes
    assert first.verdict.passed and first.verdict.rows_source == 19 and first.verdict.left_out.keys() == {"7"}, first.line
    # the second window holds no cold row, and its one key moved on: a proof over nothing fails (not yet starved)
    assert [c.check for c in second.verdict.checks if not c.passed] == ["compared_rows"], second.line
    assert second.verdict.left_out.keys() == {"7"}
    starved = [c for c in third.verdict.checks if not c.passed and c.check == "starved_key"]
    assert len(starved) == 1 and starved[0].subject == "id 7", third.line
    assert failure(third.line, third.verdict, third.batch_id).endswith(NEXT_STARVED)
    assert "left out of all 3: the target holds no version" in starved[0].actual
    assert "changed at least 3 time(s)" in starved[0].difference, starved[0].difference
    assert pipe.query_wh("SELECT count(*) FROM tidemark_control.reconcile_left_out WHERE pipeline = %s",
                         (pipe.spec.name,))[0][0] == 3

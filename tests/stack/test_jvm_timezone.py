"""Spark's JVMs run in UTC whatever the worker's zone (issue 29, item 6), and the extract leaves no
source session idle in a transaction (item 8).

A worker in Europe/Berlin (``TZ`` in spark-submit's environment) once shifted every naive
``timestamp`` of a version-1 (JSON) batch by the zone's offset: the session zone was UTC, the
JVM's ``user.timezone`` was not, and the PostgreSQL JDBC driver reads a naive timestamp as a
wall-clock time in the JVM's zone. The values below include a summer and a winter evening, both
edges of a day, microseconds, and the wall-clock times Berlin skips (spring) and repeats (autumn).
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime

import psycopg2
import pytest

from tidemark.spark import jobs
from tidemark_workshop.stack.batchrun import make_pipeline
from tidemark_workshop.stack.spark import submit

pytestmark = [pytest.mark.stack, pytest.mark.serial("watches every session of the reader role")]

DDL = """
CREATE TABLE {table} (
    id bigint PRIMARY KEY,
    booked_at timestamp without time zone,
    updated_at timestamptz NOT NULL DEFAULT now()
)"""

NAIVE = {
    1: datetime(2026, 7, 1, 22, 0, 0),  # the reported row: 22:00 became 20:00 (CEST, +2)
    2: datetime(2026, 1, 15, 22, 0, 0),  # winter (CET, +1)
    3: datetime(2026, 12, 31, 23, 59, 59, 999999),  # a shift would move it into the next year
    4: datetime(2026, 1, 1, 0, 0, 0),
    5: datetime(2026, 3, 29, 2, 30, 0),  # does not exist in Berlin (clocks jump 02:00 -> 03:00)
    6: datetime(2026, 10, 25, 2, 30, 0, 123456),  # exists twice in Berlin (03:00 -> 02:00)
    7: datetime(1970, 1, 1, 0, 0, 0),
    8: None,
}


def _reader_sessions(settings, since: float) -> list[tuple]:
    """The source reader role's sessions that started at or after ``since`` (epoch s): pid,
    application, state, transaction start, query."""
    conn = psycopg2.connect(settings.dsn(settings.source_db))
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT pid, application_name, state, xact_start, left(query, 120) FROM pg_stat_activity "
                        "WHERE usename = %s AND datname = %s AND backend_start >= to_timestamp(%s) "
                        "AND pid <> pg_backend_pid()", (settings.source_user, settings.source_db, since))
            return cur.fetchall()
    finally:
        conn.close()


class Watch:
    """Within ``with``: samples the reader role's new sessions every 0.1 s (what a DBA would see)."""

    def __init__(self, settings, since: float):
        self.settings, self.since, self.seen = settings, since, {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._done.wait(0.1):
            for pid, app, state, xact, query in _reader_sessions(self.settings, self.since):
                self.seen.setdefault((pid, app), set()).add(state)

    def __enter__(self) -> "Watch":
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._done.set()
        self._thread.join()


def test_naive_timestamps_survive_a_worker_in_berlin_and_the_extract_ends_its_source_transactions(
        settings, tmp_path, monkeypatch):
    pipe = make_pipeline(settings, tmp_path, DDL, record_format="json")
    assert pipe.spec.record_format == "json"
    conn = pipe.src()
    with conn, conn.cursor() as cur:
        cur.executemany(f"INSERT INTO {pipe.source_table} (id, booked_at) VALUES (%s, %s)", list(NAIVE.items()))
    conn.close()

    # spark-submit inherits the test's environment (tidemark_workshop.stack.spark.submit_command)
    monkeypatch.setenv("TZ", "Europe/Berlin")
    plan = pipe.plan("manual__berlin")
    attempt = pipe.begin(plan)
    report_path = tmp_path / "extract.report.json"
    # as the DAG runs it: the source read as the least-privilege reader role
    args = [*settings.database_args(settings.source_db, settings.source_user),
            *jobs.extract_args(pipe.path, plan.batch_id, attempt, plan.window, settings.kafka_bootstrap, report_path)]
    started = time.time() - 1  # backend_start and this clock may differ by a rounding
    with Watch(settings, started) as watch:
        proc = submit(settings, jobs.EXTRACT_JOB, args, secret=settings.source_password)
    assert proc.returncode == 0, f"extract failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    ours = f"tidemark-extract-{pipe.spec.name}"  # what the extract names its sessions
    assert any(app == ours for _, app in watch.seen), (
        f"no session of the reader role named {ours!r} seen during the extract: {watch.seen}")

    # After the extract: not one session of the reader role holds a transaction open on the source
    # (during it, each parallel read is a cursor in a transaction, `idle in transaction` between
    # fetches), and none of the extract's own is left at all.
    after = _reader_sessions(settings, started)
    left = [s for s in after if (s[2] or "").startswith("idle in transaction")]
    assert left == [], f"source sessions left in a transaction after the extract: {left}"
    assert [s for s in after if s[1] == ours] == [], f"the extract left its source sessions open: {after}"

    pipe.end(plan, attempt, json.loads(report_path.read_text()))
    pipe.sink()
    assert pipe.state(plan.batch_id, attempt) == "committed", pipe.ledger(plan.batch_id)

    target = pipe.rows("target", "booked_at")
    assert sorted(target) == sorted(NAIVE)
    shifted = {k: (NAIVE[k], target[k][0]) for k in NAIVE if target[k][0] != NAIVE[k]}
    assert shifted == {}, f"naive timestamps changed on their way (key: source, target): {shifted}"
    assert pipe.rows("source", "booked_at") == target  # and the source still holds them

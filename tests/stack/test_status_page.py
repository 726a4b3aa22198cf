"""The "Tidemark status" page through Airflow's own API app, against the real ledger and source.

A real batch is committed, a second one aborted and a third left open; stray stage tables are
made, and a transaction is held open on the source. The page (HTML and JSON) must show all of it
and must leave nothing behind: no transaction, no write, no control schema where there was none.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime, timedelta, timezone

import psycopg2
import pytest

from tidemark import ledger
from tidemark.ledger import consumer_for
from tidemark.sink import stage_table
from tidemark.status import APPLICATION_NAME
from tidemark_workshop.settings import WAREHOUSE_DB
from tidemark_workshop.stack.batchrun import make_pipeline
from tidemark_workshop.stack.cdcrun import make_cdc_pipeline

pytestmark = [pytest.mark.stack, pytest.mark.serial("holds a source transaction; stops the broker; lists every stage table")]

DDL = """
CREATE TABLE {table} (
    id bigint PRIMARY KEY,
    amount numeric(18,2) NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
)"""


@pytest.fixture(scope="module")
def airflow_api():
    """Airflow's API server app as `airflow api-server` builds it: plugins mounted, login enforced
    (locally every user is an admin: AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS)."""
    from airflow.api_fastapi.app import create_app
    from fastapi.testclient import TestClient

    with TestClient(create_app("core")) as client:
        yield client


def fetch(client) -> tuple[str, dict]:
    page = client.get("/tidemark/")
    assert page.status_code == 200, page.text
    data = client.get("/tidemark/api/status")
    assert data.status_code == 200, data.text
    return page.text, data.json()


def status_sessions(settings, wait_s: float = 5.0) -> list[tuple]:
    """The page's sessions still on the server (a closed connection's backend exits a moment later)."""
    conn = psycopg2.connect(settings.dsn(settings.source_db))
    deadline = time.monotonic() + wait_s
    try:
        while True:
            with conn, conn.cursor() as cur:
                cur.execute("SELECT datname, state FROM pg_stat_activity WHERE application_name = %s",
                            (APPLICATION_NAME,))
                sessions = cur.fetchall()
            if not sessions or time.monotonic() > deadline:
                return sessions
            time.sleep(0.1)
    finally:
        conn.close()


def test_page_shows_batches_attempts_orphans_and_the_clamp(settings, tmp_path, monkeypatch, airflow_api, bootstrap):
    pipe = make_pipeline(settings, tmp_path, DDL)
    idle = make_pipeline(settings, tmp_path, DDL)  # never loaded: "no batch yet"
    (tmp_path / "broken.yaml").write_text("name: broken\ntable: public.x\n")
    conn = pipe.src()
    with conn, conn.cursor() as cur:
        cur.execute(f"INSERT INTO {pipe.source_table} (id, amount, updated_at) "
                    "SELECT g, g * 0.5, now() - interval '1 minute' FROM generate_series(1, 500) g")
    conn.close()

    committed = pipe.plan("run-a")
    a1 = pipe.begin(committed)
    pipe.end(committed, a1, pipe.extract(committed, a1))
    aborted = pipe.plan("run-b")
    pipe.abort(aborted, pipe.begin(aborted), "status page test: <b>not</b> loaded")
    unfinished = pipe.plan("run-c")  # planned before run-a commits: the same 500 rows again
    c1 = pipe.begin(unfinished)
    assert pipe.extract(unfinished, c1)["rows"] == 500
    pipe.sink()  # one sink run: run-a committed, run-b aborted, run-c still open (no END), its 500 rows staged
    assert [pipe.state(committed.batch_id, a1), pipe.state(aborted.batch_id, 1), pipe.state(unfinished.batch_id, c1)] \
        == ["committed", "aborted", "open"]

    leftover = stage_table(committed.batch_id, a1)  # a committed attempt's stage that outlived it
    ghost = stage_table(f"ghost-{uuid.uuid4().hex}", 1)  # an attempt the ledger never heard of
    in_use = stage_table(unfinished.batch_id, c1)  # an open attempt's stage: not an orphan
    wh = pipe.wh()
    holder = psycopg2.connect(settings.dsn(settings.source_db), application_name=f"status-test-{uuid.uuid4().hex[:8]}")
    try:
        with wh, wh.cursor() as cur:
            for table in (leftover, ghost, in_use):
                cur.execute(f"CREATE TABLE IF NOT EXISTS {table} (value text)")
            cur.execute(f"INSERT INTO {leftover} SELECT repeat('x', 100) FROM generate_series(1, 1000)")
            # two rejects the outbox has not sent yet (the DLQ was down), one it has: two waiting
            cur.execute("""INSERT INTO tidemark_control.sink_rejects
                               (consumer, topic, partition, kafka_offset, reason, in_dlq, raw, rejected_at)
                           SELECT %s, %s, 0, o, 'status page test', o < 3, 'x', now() - o * interval '1 minute'
                             FROM generate_series(2, 4) o""", (consumer_for(pipe.spec.name), pipe.spec.topic))
        with holder.cursor() as cur:  # a transaction left open on the source: the planner's clamp
            cur.execute("SELECT pg_backend_pid()")
            holder_pid = cur.fetchone()[0]

        monkeypatch.setenv("TIDEMARK_PIPELINES_DIR", str(tmp_path))
        page, data = fetch(airflow_api)
    finally:
        holder.close()
        with wh, wh.cursor() as cur:
            for table in (leftover, ghost, in_use):
                cur.execute(f"DROP TABLE IF EXISTS {table}")
            cur.execute("DELETE FROM tidemark_control.sink_rejects WHERE consumer = %s", (consumer_for(pipe.spec.name),))
        wh.close()

    rows = {p["name"]: p for p in data["pipelines"]}
    assert sorted(rows) == sorted([pipe.spec.name, idle.spec.name, "broken"])
    assert "field 'primary_key'" in rows["broken"]["error"]
    assert rows[idle.spec.name]["ledger"]["last_committed"] is None and rows[idle.spec.name]["lag"] is None

    ledger = rows[pipe.spec.name]["ledger"]
    last = ledger["last_committed"]
    assert (last["batch_id"], last["attempt"], last["rows"]) == (committed.batch_id, a1, 500)
    assert last["window"] == str(committed.window) and last["committed_at"].endswith("+00:00")
    assert ledger["watermark"]["bound"] == str(committed.window.hi) and ledger["watermark"]["batch_id"] == committed.batch_id
    assert [(a["batch_id"], a["attempt"], a["state"], a["staged"], a["staged_directly"]) for a in ledger["unfinished"]] \
        == [(unfinished.batch_id, c1, "open", 500, False)]
    assert [(a["batch_id"], a["state"]) for a in ledger["recent_failures"]] == [(aborted.batch_id, "aborted")]
    assert "status page test: <b>not</b> loaded" in ledger["last_failure"]["message"]
    assert ledger["dead_letters_pending"] == 2 and ledger["oldest_pending_reject"].endswith("+00:00")
    oldest = datetime.fromisoformat(ledger["oldest_pending_reject"])
    assert timedelta(minutes=3, seconds=50) < datetime.now(timezone.utc) - oldest < timedelta(minutes=6)
    lag = rows[pipe.spec.name]["lag"]
    assert 0 <= lag["seconds"] < 3600 and lag["held_back"] is True  # safe lag 0: the open transaction sets the end

    source = next(s for s in data["sources"] if s["conn_id"] == pipe.spec.source_conn_id)
    clamp = source["oldest_open_xact"]
    assert clamp["pid"] == holder_pid and clamp["application_name"].startswith("status-test-")
    assert clamp["state"] == "idle in transaction" and clamp["age"] >= 0
    # the open transaction is what holds this pipeline, with the next step that ends it
    held = [h for h in rows[pipe.spec.name]["held_by"] if h["by"] == "transaction"]
    assert held and f"pid {holder_pid}" in held[0]["what"] and f"pg_terminate_backend({holder_pid})" in held[0]["next"]
    assert held[0]["since"] == clamp["xact_start"] and rows[idle.spec.name]["held_by"] == []

    orphans = {t["table"]: t for t in data["orphan_stage_tables"]}
    assert in_use not in orphans
    assert orphans[leftover]["state"] == "committed" and orphans[leftover]["pipeline"] == pipe.spec.name
    assert orphans[leftover]["bytes"] > 100_000
    assert orphans[ghost]["batch_id"] is None and orphans[ghost]["bytes"] is not None

    # the HTML says the same, escaped
    for text in (pipe.spec.name, idle.spec.name, committed.batch_id, unfinished.batch_id, str(committed.window.hi),
                 str(holder_pid), clamp["application_name"], leftover, ghost, "no batch yet", "invalid spec"):
        assert text in page, text
    assert "&lt;b&gt;not&lt;/b&gt; loaded" in page and "<b>not</b>" not in page
    assert "held back by an open or prepared source transaction" in page
    assert "500 records staged<" in page  # under the open attempt
    assert "dead letters waiting</th>" in page and "<span class=bad>2</span>" in page

    assert status_sessions(settings) == []  # every connection of the page closed, no transaction left


def test_page_is_read_only_and_copes_without_a_control_schema(settings, tmp_path, monkeypatch, airflow_api):
    """A warehouse where no batch ever ran: 'no batch yet', and the page creates nothing there."""
    name = f"tidemark_status_empty_{uuid.uuid4().hex[:8]}"
    admin = psycopg2.connect(settings.dsn(WAREHOUSE_DB))
    admin.autocommit = True
    admin.cursor().execute(f'CREATE DATABASE "{name}"')
    try:
        pipe = make_pipeline(settings, tmp_path, DDL)
        conn = json.loads(settings.airflow_connections()["AIRFLOW_CONN_TIDEMARK_WAREHOUSE"])
        monkeypatch.setenv("AIRFLOW_CONN_TIDEMARK_WAREHOUSE", json.dumps({**conn, "schema": name}))
        monkeypatch.setenv("TIDEMARK_PIPELINES_DIR", str(tmp_path))
        monkeypatch.setenv("TIDEMARK_STATUS_DIR", str(tmp_path / "state" / "status"))  # its outage in its own health file
        page, data = fetch(airflow_api)
        assert data["control_schema"] is False and data["orphan_stage_tables"] == []
        assert [(p["name"], p["ledger"]["last_committed"], p["lag"]) for p in data["pipelines"]] == [
            (pipe.spec.name, None, None)]
        assert "no batch yet" in page

        empty = psycopg2.connect(settings.dsn(name))
        try:
            with empty, empty.cursor() as cur:
                cur.execute("SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'tidemark%'")
                assert cur.fetchone()[0] == 0
        finally:
            empty.close()

        # no warehouse at all: the page says why instead of failing bare
        monkeypatch.setenv("AIRFLOW_CONN_TIDEMARK_WAREHOUSE", json.dumps({**conn, "schema": f"{name}_missing"}))
        broken = airflow_api.get("/tidemark/api/status")
        assert broken.status_code == 503 and f"{name}_missing" in broken.json()["error"]
        assert settings.pg_password not in broken.text
        # ... and still shows what it can: the warehouse unreachable since its first failed check, the
        # other components' health, and each pipeline held by it with the next step
        down = {h["component"]: h for h in broken.json()["health"]}
        assert down["warehouse"]["reachable"] is False and down["warehouse"]["since"].endswith("+00:00")
        assert "fix the Airflow connection tidemark_warehouse" in down["warehouse"]["next_step"]  # it answers: not a start
        assert down["kafka"]["reachable"] and down[f"source {pipe.spec.source_conn_id}"]["reachable"]
        assert [h["by"] for h in broken.json()["pipelines"][0]["held_by"]] == ["warehouse"]
        html_page = airflow_api.get("/tidemark/")
        assert html_page.status_code == 503 and "status unavailable" in html_page.text
        assert "<tr class=down><td><b>warehouse</b></td>" in html_page.text
    finally:
        admin.cursor().execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def test_collect_leaves_its_connections_read_only(settings, tmp_path, warehouse_conn):
    from tidemark.status import collect, load_pipelines

    make_pipeline(settings, tmp_path, DDL)
    collect(load_pipelines(tmp_path), warehouse_conn, lambda conn_id: psycopg2.connect(settings.dsn(settings.source_db)))
    with pytest.raises(psycopg2.errors.ReadOnlySqlTransaction):
        with warehouse_conn.cursor() as cur:
            cur.execute("CREATE TABLE tidemark_control.status_must_not_write (x int)")


def test_a_waiting_re_snapshot_is_on_the_capture_line_until_a_handoff_commits_after_it(settings, tmp_path, bootstrap):
    """The capture's read of a waiting re-snapshot (``ledger.resnapshot_asked``, as the supervisor and the
    plan ask it) in the page's read-only session: a request newer than the last committed handoff shows
    who, when and why, in the text and the JSON; a handoff committed after it answers it. The handoff
    batches are planned and begun for real; their commit is written as the sink's leaves it (no extract,
    slot or connector: this test is about what the page reads, not how a handoff runs)."""
    from tidemark.status import collect, load_pipelines, status_lines

    pipe = make_cdc_pipeline(settings, tmp_path)
    name = pipe.spec.name

    def commit_a_handoff(run_id: str) -> str:
        plan = pipe.plan(run_id)
        attempt = pipe.begin(plan)
        wh = pipe.wh()
        try:
            with wh, wh.cursor() as cur:
                ledger.record_handoff(cur, name, plan.batch_id, attempt, pipe.spec.cdc_slot, "0/16B3748")
                cur.execute("""UPDATE tidemark_control.batch_attempts SET state = 'committed',
                                      finished_at = clock_timestamp() WHERE batch_id = %s AND attempt = %s""",
                            (plan.batch_id, attempt))
                cur.execute("""UPDATE tidemark_control.batches SET state = 'committed', committed_attempt = %s,
                                      committed_at = clock_timestamp() WHERE batch_id = %s""",
                            (attempt, plan.batch_id))
        finally:
            wh.close()
        return plan.batch_id

    def capture_line() -> tuple[str, dict]:
        wh = pipe.wh()  # collect makes it read-only: a fresh one each time
        try:
            report = collect(load_pipelines(tmp_path), wh, lambda conn_id: pipe.src())
        finally:
            wh.close()
        [capture] = [t["capture"] for t in report.to_json()["streams"] if t["pipeline"] == name]
        return next(x for x in status_lines(report) if x.startswith(f"{name}:")), capture

    first = commit_a_handoff("run-1")
    wh = pipe.wh()
    try:
        with wh, wh.cursor() as cur:
            ledger.request_resnapshot(cur, name, "alice", "suspected drift")
    finally:
        wh.close()
    line, capture = capture_line()
    assert "; capture: re-snapshot asked by alice at " in line, line
    assert (" (suspected drift): waiting for the pipeline's next batch run, which will be a new handoff (slot "
            f"{pipe.spec.cdc_slot} made again with a snapshot of the table)") in line, line
    assert capture["handoff_batch"] == first and capture["resnapshot"]["actor"] == "alice"
    assert capture["resnapshot"]["reason"] == "suspected drift" and capture["resnapshot"]["at"].endswith("+00:00")

    second = commit_a_handoff("run-2")  # committed after the request: it answers it
    line, capture = capture_line()
    assert "re-snapshot" not in line and capture["resnapshot"] is None and capture["handoff_batch"] == second, line
    assert status_sessions(settings) == []


def test_broker_down_shows_since_when_and_the_next_step_then_reachable_again(settings, tmp_path, monkeypatch,
                                                                              airflow_api, bootstrap):
    """The broker stopped with the stack's own `stop kafka` (and always started again, within seconds:
    other tests share it): the JSON, the HTML and `make status` say it is unreachable since the first
    failed check and what holds each pipeline, with the next step; once started, reachable again."""
    from tidemark_workshop.stack.__main__ import start_one, status_report_lines, stop_one
    from tidemark_workshop.stack.kafka import Kafka

    pipe = make_pipeline(settings, tmp_path, DDL)
    monkeypatch.setenv("TIDEMARK_PIPELINES_DIR", str(tmp_path))
    monkeypatch.setenv("TIDEMARK_STATUS_DIR", str(tmp_path / "state" / "status"))  # the page's health file: this test's own
    cli_health = tmp_path / "cli-health.json"
    _, before = fetch(airflow_api)
    health = {h["component"]: h for h in before["health"]}
    assert health["kafka"]["reachable"] is True and health["kafka"]["address"] == settings.kafka_bootstrap
    assert health["warehouse"]["reachable"] and health[f"source {pipe.spec.source_conn_id}"]["reachable"]
    assert [p["held_by"] for p in before["pipelines"]] == [[]]

    kafka = Kafka(settings)
    assert kafka.answers()
    t0 = time.monotonic()
    try:
        stop_one(settings, "kafka")
        checked, stopped_at = time.monotonic(), datetime.now(timezone.utc)
        page, down = fetch(airflow_api)  # two checks: the HTML's, then the JSON's
        check_s, checked_at = time.monotonic() - checked, datetime.now(timezone.utc)
        cli = status_report_lines(settings, cli_health)
    finally:
        restart = time.monotonic()
        start_one(settings, "kafka")  # waits until the broker answers again
        outage_s, start_s = time.monotonic() - t0, time.monotonic() - restart
    # (no timing asserted: a loaded machine stretches both; the checks' own timeouts are unit-tested)
    assert kafka.answers(), f"the broker did not come back (outage {outage_s:.1f}s, start {start_s:.1f}s)"
    print(f"broker outage {outage_s:.1f}s (start {start_s:.1f}s); the page's two checks took {check_s:.1f}s")

    kafka_down = next(h for h in down["health"] if h["component"] == "kafka")
    since = datetime.fromisoformat(kafka_down["since"])
    assert kafka_down["reachable"] is False and stopped_at <= since <= checked_at
    assert "Connection refused" in kafka_down["error"] and "make start C=kafka" in kafka_down["next_step"]
    # since: the first failed check (the HTML's), kept in the health file for the JSON's check after it
    assert datetime.fromisoformat(kafka_down["checked_at"]) > since and kafka_down["since"] in page
    assert all(h["reachable"] for h in down["health"] if h["component"] != "kafka")
    [row] = down["pipelines"]
    assert row["held_by"] == [{"by": "broker", "what": f"Kafka broker unreachable ({settings.kafka_bootstrap})",
                               "since": kafka_down["since"], "next": kafka_down["next_step"]}]
    assert "<tr class=down><td><b>kafka</b></td>" in page and "held by: Kafka broker unreachable" in page

    health_lines, lines = cli
    assert any(line.startswith(f"kafka: {settings.kafka_bootstrap} UNREACHABLE since ") for line in health_lines), health_lines
    assert lines[0].startswith(f"{pipe.spec.name}: no batch yet")
    assert lines[1].startswith(f"  held by: Kafka broker unreachable ({settings.kafka_bootstrap}) since ")
    assert lines[1].endswith("next: start the broker: `make start C=kafka` (or `python -m tidemark_workshop.stack "
                             "start kafka`); why it stopped: `make logs C=kafka`")

    _, back = fetch(airflow_api)
    kafka_up = next(h for h in back["health"] if h["component"] == "kafka")
    assert kafka_up["reachable"] is True and kafka_up["since"] is None and kafka_up["error"] is None
    assert datetime.fromisoformat(kafka_up["last_ok"]) > since and back["pipelines"][0]["held_by"] == []
    assert status_report_lines(settings, cli_health)[1] == lines[:1]
    assert status_sessions(settings) == []


def test_great_expectations_progress_never_reaches_stderr_or_an_error_log(settings, tmp_path, capfd, caplog):
    """An Airflow task's stderr is logged at ERROR: GX's tqdm bars ("Calculating Metrics") must not
    be written at all. Run the suite as a reconciliation runs it, with the progress bars left on
    (they show), then as it is (nothing on stderr, no log record at ERROR)."""
    import logging

    from tidemark.reconcile import expectations
    from tidemark.reconcile.expectations import sqlalchemy_url

    pipe = make_pipeline(settings, tmp_path, DDL)
    url = sqlalchemy_url(settings.pg_host, settings.pg_port, WAREHOUSE_DB, settings.pg_user, settings.pg_password)
    wh = pipe.wh()
    try:
        with wh, wh.cursor() as cur:
            cur.execute(f"CREATE TABLE {pipe.spec.target_table} (id bigint PRIMARY KEY, amount numeric(18,2), "
                        "updated_at timestamptz)")
            cur.execute(f"INSERT INTO {pipe.spec.target_table} SELECT g, g, now() FROM generate_series(1, 50) g")

        def run(root):
            capfd.readouterr()
            caplog.clear()
            with caplog.at_level(logging.INFO):
                found, _ = expectations.validate(pipe.spec, "true", 50, root, url, f"run-{uuid.uuid4().hex[:6]}")
            assert found and all(e.passed for e in found), found
            errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
            return capfd.readouterr().err, errors

        with pytest.MonkeyPatch.context() as mp:  # as before the fix: GX's default, bars on
            mp.setattr(expectations, "quiet_progress_bars", lambda context: None)
            loud, _ = run(tmp_path / "loud")
        assert "Calculating Metrics" in loud  # the test sees them when they are there

        quiet, errors = run(tmp_path / "quiet")
        assert "Calculating Metrics" not in quiet and "it/s" not in quiet, quiet[-2000:]
        assert not [e for e in errors if "Calculating Metrics" in e or "%|" in e], errors
        config = (tmp_path / "quiet" / "gx" / "great_expectations.yml").read_text()
        assert "progress_bars:\n  globally: false\n  metric_calculations: false" in config  # saved: reopened, still off
        again, _ = run(tmp_path / "quiet")
        assert "Calculating Metrics" not in again
    finally:
        with wh, wh.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS {pipe.spec.target_table}")
        wh.close()

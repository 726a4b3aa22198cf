"""Tidemark as its users run it: the real Airflow services (api-server, scheduler with
LocalExecutor, dag-processor, triggerer), with runs, backfills and clears made through the REST
API the UI uses, and the warehouse checked key by key. A backfill and a repair run are proven from the
UI's own dialogs (test_ui_clicks.py), which check all the REST versions of them did and more.

The module's pipelines are written before the services start, into a pipelines directory of
their own; the services of `make ui`, if running, are stopped first (two dag-processors on one
metadata database would fight over which DAGs exist).
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from urllib.parse import quote, urlencode

import pytest

from tidemark.sink import stage_table
from tidemark.streams.launch import LocalLauncher
from tidemark_workshop.stack.airflow import AirflowUI, RestApi
from tidemark_workshop.stack.batchrun import make_pipeline

UTC = timezone.utc
DDL = ("CREATE TABLE {table} (id bigint PRIMARY KEY, amount numeric(18,2) NOT NULL, "
       "created_at timestamptz NOT NULL)")
# Fixed dates, so the batch content and so its checksum are the same on every run.
FIRST_DAY = datetime(2026, 10, 1, tzinfo=UTC)
DAYS, ROWS_PER_DAY = 10, 300
WATERMARK_START = datetime(2026, 10, 6, tzinfo=UTC)  # the scheduled run loads Oct 6..10
BACKFILL = (datetime(2026, 10, 2, tzinfo=UTC), datetime(2026, 10, 4, tzinfo=UTC))  # runs for Oct 2, 3, 4
RUN_TIMEOUT_S = 600
KILLED_ROWS = BLIP_ROWS = 300_000  # enough for the extract to be caught mid-write


@pytest.fixture(scope="module")
def scheduled(settings, tmp_path_factory):
    """The module's seven pipelines, then the Airflow services that schedule them, then the REST API."""
    pipelines = tmp_path_factory.mktemp("pipelines")
    nightly = make_pipeline(settings, pipelines, DDL, cursor={"kind": "timestamp", "column": "created_at"},
                            initial_watermark=WATERMARK_START.isoformat(), write_mode="append_window_replace")
    src = nightly.src()
    with src, src.cursor() as cur:
        cur.execute(
            f"INSERT INTO {nightly.spec.table} SELECT g, (g * 7919 %% 100000) / 100.0, "
            f"%s + (g %% %s) * interval '1 day' + (g / %s) * interval '1 second' FROM generate_series(1, %s) g",
            (FIRST_DAY, DAYS, DAYS, DAYS * ROWS_PER_DAY),
        )
    src.close()
    # A target too narrow for the source's amounts. Under protocol version 1 the sink refuses the
    # batch value by value; under version 2 (the default) the plan refuses it, naming both types.
    # Neither is healed by a retry.
    narrow = _narrow_pipeline(settings, pipelines, record_format="json")
    narrowed = _narrow_pipeline(settings, pipelines)

    # Two more for the failure tests: a worker killed mid-extract (its tasks staging straight into the
    # warehouse: transport direct, the extract task's warehouse connection wired), and the broker gone after plan.
    killed = make_pipeline(settings, pipelines, DDL, cursor={"kind": "timestamp", "column": "created_at"},
                           transport="direct")
    brokerless = make_pipeline(settings, pipelines, DDL, cursor={"kind": "timestamp", "column": "created_at"},
                               retries={"count": 2, "delay": "PT5S"})  # the outage is only as long as the test
    blip = make_pipeline(settings, pipelines, DDL, cursor={"kind": "timestamp", "column": "created_at"})
    # And one whose sink stands, under the supervisor DAG.
    streamed = make_pipeline(settings, pipelines, DDL, cursor={"kind": "timestamp", "column": "created_at"},
                             sink={"mode": "standing", "trigger": "PT1S", "heartbeat": "PT2S"})
    for pipe, rows in ((killed, KILLED_ROWS), (brokerless, 100), (blip, BLIP_ROWS), (streamed, 200)):
        src = pipe.src()
        with src, src.cursor() as cur:
            cur.execute(f"INSERT INTO {pipe.spec.table} SELECT g, g / 100.0, now() - interval '1 hour' "
                        "FROM generate_series(1, %s) g", (rows,))
        src.close()

    ui = AirflowUI(settings)
    ui.stop()  # `make ui`'s services parse the default pipelines; ours parse this module's
    ui.start({"TIDEMARK_PIPELINES_DIR": str(pipelines),
              "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
              "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
              # a worker that vanished without a word is noticed in 60 s, not 300 (its task's supervisor
              # process beats every few seconds whatever the Spark job beside it does)
              "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "60",
              # a local broker answers at once or is down: each begin try of the broker test waits 10 s, not 30
              "TIDEMARK_KAFKA_TIMEOUT_S": "10"})
    try:
        ui.wait_healthy()
        api = RestApi(ui.url, timeout_s=RUN_TIMEOUT_S)
        for pipe in (nightly, narrow, killed, brokerless, blip, streamed, narrowed):
            dag_id = f"tidemark_batch_{pipe.spec.name}"
            api.wait_for(f"{dag_id} to be parsed", lambda d=dag_id: api.exists(d), timeout_s=180)
        yield api, nightly, narrow, killed, brokerless, blip, streamed, narrowed
    finally:
        ui.stop()


def _narrow_pipeline(settings, pipelines, **fields):
    pipe = make_pipeline(settings, pipelines, DDL, cursor={"kind": "timestamp", "column": "created_at"}, **fields)
    src = pipe.src()
    with src, src.cursor() as cur:
        cur.execute(f"INSERT INTO {pipe.spec.table} SELECT g, 12345.67, now() - interval '1 hour' "
                    "FROM generate_series(1, 20) g")
    src.close()
    wh = pipe.wh()
    with wh, wh.cursor() as cur:
        cur.execute(f"CREATE TABLE {pipe.spec.target_table} (id bigint PRIMARY KEY, amount numeric(4,2) NOT NULL, "
                    "created_at timestamptz NOT NULL)")
    wh.close()
    return pipe


def _rows(pipe, side: str, where: str = "true", params=()) -> dict:
    conn = pipe.src() if side == "source" else pipe.wh()
    table = pipe.spec.table if side == "source" else pipe.spec.target_table
    try:
        with conn, conn.cursor() as cur:
            cur.execute(f"SELECT id, amount, created_at FROM {table} WHERE {where} ORDER BY id", params)
            return {r[0]: r[1:] for r in cur.fetchall()}
    finally:
        conn.close()


def test_a_scheduled_nightly_run_loads_its_window_with_checksums_past_2_63(scheduled):
    api, pipe, *_ = scheduled
    dag_id, reconcile_id = f"tidemark_batch_{pipe.spec.name}", f"tidemark_reconcile_{pipe.spec.name}"
    api.wait_for(f"{reconcile_id} to be parsed", lambda: api.exists(reconcile_id), timeout_s=180)
    api.call("PATCH", f"/dags/{reconcile_id}", {"is_paused": False})  # a paused DAG is not queued by Asset events
    api.call("PATCH", f"/dags/{dag_id}", {"is_paused": False})  # the scheduler creates the latest interval's run
    run = api.wait_for("the scheduled run", lambda: api.runs(dag_id, run_type="scheduled"))[0]
    run = api.wait_finished(dag_id, run["dag_run_id"])
    assert run["state"] == "success", api.task_states(dag_id, run["dag_run_id"])
    assert run["data_interval_start"] < run["data_interval_end"], "cron schedules must give real data intervals"

    assert _rows(pipe, "target") == _rows(pipe, "source", "created_at > %s", (WATERMARK_START,))
    batch_id, rows, checksum = pipe.query_wh(
        "SELECT batch_id, rows, checksum FROM tidemark_control.batches WHERE pipeline = %s AND NOT backfill",
        (pipe.spec.name,))[0]
    assert rows == len(_rows(pipe, "target")) > 4 * ROWS_PER_DAY  # Oct 6 (after midnight) .. Oct 10
    # The XCom serializer refused such sums before: they now live in the ledger, not in XCom.
    assert abs(checksum) > 2**63, f"choose data whose batch checksum passes 2**63 (got {checksum})"
    events = api.call("GET", "/assets/events?" + urlencode({"source_dag_id": dag_id, "source_run_id": run["dag_run_id"]}))
    extras = [e["extra"] for e in events["asset_events"]]
    assert [(x["batch_id"], x["rows"], x["checksum"], x["empty"]) for x in extras] == [
        (batch_id, rows, str(checksum), False)]
    assert _unfinished(pipe) == 0

    # The batch's Asset event schedules its reconciliation, which proves it and says so in the ledger.
    recon = api.wait_for("the reconciliation the Asset event scheduled",
                         lambda: api.runs(reconcile_id, run_type="asset_triggered"))[0]
    recon = api.wait_finished(reconcile_id, recon["dag_run_id"])  # (a paused DAG's running run stops there)
    api.call("PATCH", f"/dags/{reconcile_id}", {"is_paused": True})  # the module's other batches need no proof
    log = api.log_text(reconcile_id, recon["dag_run_id"], "reconcile", 1)
    assert recon["state"] == "success", log[-3000:]
    assert f"batch={batch_id}" in log and f"batch {batch_id}: reconciled, {rows} rows" in log, log[-3000:]
    verdicts = pipe.query_wh("SELECT check_name, verdict FROM tidemark_control.reconciliation_results "
                             "WHERE batch_id = %s", (batch_id,))
    assert {"row_count", "hash_total", "gx:expect_table_row_count_to_equal"} <= {c for c, _ in verdicts}
    assert {v for _, v in verdicts} == {"pass"}
    assert pipe.query_wh("SELECT reconciliation FROM tidemark_control.batches WHERE batch_id = %s",
                         (batch_id,)) == [("reconciled",)]


def test_clearing_a_committed_run_changes_nothing(scheduled):
    api, pipe, *_ = scheduled
    dag_id = f"tidemark_batch_{pipe.spec.name}"
    run_id = api.runs(dag_id, run_type="scheduled")[0]["dag_run_id"]
    before_rows = _rows(pipe, "target")
    ledger = "SELECT batch_id, state, attempt, committed_at, rows FROM tidemark_control.batches WHERE run_id = %s"
    before = pipe.query_wh(ledger, (run_id,))
    api.call("POST", f"/dags/{dag_id}/clearTaskInstances",
             {"dry_run": False, "dag_run_id": run_id, "only_failed": False, "reset_dag_runs": True})
    api.wait_for("the cleared run to start again",
                 lambda: api.run(dag_id, run_id)["state"] != "success" or
                 api.task_states(dag_id, run_id).get("begin") == "skipped", timeout_s=120)
    run = api.wait_finished(dag_id, run_id)
    states = api.task_states(dag_id, run_id)
    assert run["state"] == "success" and states["begin"] == "skipped", states
    assert pipe.query_wh(ledger, (run_id,)) == before
    assert _rows(pipe, "target") == before_rows


def test_a_refused_batch_fails_at_once_with_the_next_step_and_leaves_nothing_open(scheduled):
    api, _, pipe, *_ = scheduled
    dag_id = f"tidemark_batch_{pipe.spec.name}"
    run = api.wait_finished(dag_id, _scheduled_run(api, dag_id))
    states = api.task_states(dag_id, run["dag_run_id"])
    assert run["state"] == "failed" and states["wait_committed"] == "failed", states
    assert states["abort_unfinished"] == "success"
    tries = {t["task_id"]: t["try_number"] for t in api.task_instances(dag_id, run["dag_run_id"])}
    assert tries["wait_committed"] == 1, "a refused batch must not be retried"
    batch_id, attempt, state, message = pipe.query_wh(
        "SELECT batch_id, attempt, state, message FROM tidemark_control.batches WHERE pipeline = %s", (pipe.spec.name,))[0]
    assert state == "refused" and "numeric field overflow" in message
    assert pipe.query_wh("SELECT to_regclass(%s)", (stage_table(batch_id, attempt),))[0][0] is None
    assert _unfinished(pipe) == 0
    assert _rows(pipe, "target") == {}
    last = _last_word(api.log_text(dag_id, run["dag_run_id"], "wait_committed", 1))
    for part in (f"pipeline={pipe.spec.name}", "batch=", "attempt=1", "window=", "REFUSED",
                 f"change the target table {pipe.spec.target_table}"):
        assert part in last, f"{part!r} missing from the failure line: {last}"


def _last_word(log: str) -> str:
    """Tidemark's closing lines, after Airflow's traceback: the whole line, what failed in words, whether
    Airflow retries and the next step, last; nothing but Airflow's group markers may follow."""
    lines = [line for line in log.splitlines() if line.strip()]
    word = max((i for i, line in enumerate(lines) if "TIDEMARK FAILED: " in line), default=None)
    assert word is not None, "\n".join(lines[-15:])
    block = lines[word:]
    assert not any("Traceback" in line or "Task failed with exception" in line for line in block), block
    last = max(i for i, line in enumerate(block) if "TIDEMARK NEXT (" in line)
    assert all("::endgroup::" in line for line in block[last + 1:]), block
    return "\n".join(block[:last + 1])


def test_a_target_narrower_than_the_source_fails_the_plan_under_version_2_naming_both_types(scheduled):
    api, *_, pipe = scheduled
    assert pipe.spec.record_format == "avro"
    dag_id = f"tidemark_batch_{pipe.spec.name}"
    run = api.wait_finished(dag_id, _scheduled_run(api, dag_id))
    states = api.task_states(dag_id, run["dag_run_id"])
    assert run["state"] == "failed" and states["plan"] == "failed", states
    tries = {t["task_id"]: t["try_number"] for t in api.task_instances(dag_id, run["dag_run_id"])}
    assert tries["plan"] == 1, "a plan the spec and tables refuse must not be retried"
    assert pipe.query_wh("SELECT count(*) FROM tidemark_control.batches WHERE pipeline = %s",
                         (pipe.spec.name,))[0][0] == 0
    assert _rows(pipe, "target") == {}
    last = _last_word(api.log_text(dag_id, run["dag_run_id"], "plan", 1))
    for part in (f"pipeline {pipe.spec.name} (record_format avro)", "amount", "numeric(18,2)", "numeric(4,2)",
                 pipe.spec.target_table, "Next: fix the cause named here", f"batch={pipe.spec.name}:",
                 "window=not planned yet"):
        assert part in last, f"{part!r} missing from the failure line: {last}"


def test_every_listening_socket_of_the_stack_is_on_loopback(scheduled, settings):
    """PostgreSQL, Kafka and the four Airflow services (no serve-logs on 0.0.0.0) while they run."""
    import ipaddress

    import psutil

    state = str(settings.state_dir)
    ours, wrong = {}, []
    for conn in psutil.net_connections(kind="inet"):
        if conn.status != psutil.CONN_LISTEN or conn.pid is None:
            continue
        try:
            proc = psutil.Process(conn.pid)
            cmdline = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if state not in cmdline and "airflow" not in cmdline:
            continue
        ours[conn.laddr.port] = cmdline[:120]
        ip = ipaddress.ip_address(conn.laddr.ip.split("%")[0])
        if not (ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped and ip.ipv4_mapped.is_loopback)):
            wrong.append((conn.laddr.ip, conn.laddr.port, cmdline[:200]))
    assert not wrong, f"listening beyond loopback: {wrong}"
    for port in (settings.pg_port, settings.kafka_port, settings.airflow_port):
        assert port in ours, f"nothing of ours listens on {port}: {ours}"


def _chromium(settings, url: str, shot: str) -> str:
    """The page's DOM after its scripts ran, in headless Chromium; a screenshot goes to the state
    directory (screenshots/<shot>.png) for a person to look at."""
    import shutil
    import subprocess
    import tempfile

    exe = shutil.which("chromium")
    assert exe, "Debian's chromium is missing (stack/bootstrap.sh installs it when run as root)"
    shots = settings.state_dir / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--virtual-time-budget=20000", "--window-size=1400,1000"]
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([exe, *flags, f"--user-data-dir={profile}/a", f"--screenshot={shots / shot}.png", url],
                       capture_output=True, timeout=120, check=True)
        dom = subprocess.run([exe, *flags, f"--user-data-dir={profile}/b", "--dump-dom", url],
                             capture_output=True, text=True, timeout=120, check=True).stdout
    assert (shots / f"{shot}.png").stat().st_size > 10_000, f"{shot}.png looks blank"
    return dom


def test_the_ui_in_headless_chromium_shows_dags_status_and_a_failed_tasks_log(scheduled, settings):
    api, nightly, narrow, *_ = scheduled
    base = api.url
    dags = _chromium(settings, f"{base}/dags", "dag-list")
    for pipe in (nightly, narrow):
        assert f"tidemark_batch_{pipe.spec.name}" in dags

    status = _chromium(settings, f"{base}/tidemark/", "tidemark-status")
    assert "Tidemark status" in status and nightly.spec.name in status and narrow.spec.name in status
    assert "refused" in status and "numeric field overflow" in status  # the narrow target's last failure

    dag_id = f"tidemark_batch_{narrow.spec.name}"
    run_id = api.runs(dag_id)[0]["dag_run_id"]
    log = _chromium(settings, f"{base}/dags/{dag_id}/runs/{quote(run_id, safe='')}/tasks/wait_committed?try_number=1",
                    "failed-task-log")
    assert f"pipeline={narrow.spec.name}" in log and "Next:" in log and "REFUSED" in log


def _scheduled_run(api: RestApi, dag_id: str) -> str:
    """Unpause: the scheduler makes the run of the latest interval (a manual run as well would queue
    behind it, max_active_runs=1)."""
    api.call("PATCH", f"/dags/{dag_id}", {"is_paused": False})
    return api.wait_for("the scheduled run", lambda: api.runs(dag_id, run_type="scheduled"))[0]["dag_run_id"]


def _extract_writing(api: RestApi, dag_id: str, run_id: str, pipe, rows: int):
    """The extract task's process, once its Spark job has written (to the topic, or direct: to the
    first attempt's stage) some but not all of the rows."""
    import psutil

    from tidemark.protocol.kafka_io import end_offsets

    def extracting():
        ti = next((t for t in api.task_instances(dag_id, run_id) if t["task_id"] == "extract"), None)
        if not ti or ti["state"] != "running" or not ti.get("pid"):
            return None
        try:
            if pipe.spec.transport == "direct":
                stage = stage_table(f"{pipe.spec.name}:{run_id}", 1)
                made = pipe.query_wh("SELECT to_regclass(%s)", (stage,))[0][0]
                written = pipe.query_wh(f"SELECT count(*) FROM {stage}")[0][0] if made else 0
            else:
                written = sum(end_offsets(pipe.settings.kafka_bootstrap, pipe.spec.topic).values())
        except Exception:  # the topic's metadata is not there yet
            return None
        assert written < rows, f"the extract wrote all {rows} rows before the fault could hit it"
        return psutil.Process(ti["pid"]) if written > 0 else None

    return api.wait_for("the extract's Spark job to be writing", extracting, timeout_s=300)


def _unfinished(pipe) -> int:
    return pipe.query_wh("SELECT count(*) FROM tidemark_control.batch_attempts a JOIN tidemark_control.batches b "
                         "USING (batch_id) WHERE b.pipeline = %s AND a.state IN ('open', 'sealed')", (pipe.spec.name,))[0][0]


def _stages(pipe) -> list[str]:
    attempts = pipe.query_wh("SELECT a.batch_id, a.attempt FROM tidemark_control.batch_attempts a "
                             "JOIN tidemark_control.batches b USING (batch_id) WHERE b.pipeline = %s", (pipe.spec.name,))
    return [stage_table(b, a) for b, a in attempts
            if pipe.query_wh("SELECT to_regclass(%s)", (stage_table(b, a),))[0][0] is not None]


def test_a_worker_killed_mid_extract_is_retried_as_a_new_attempt_and_leaves_no_debris(scheduled):
    import psutil

    api, _, _, pipe, *_ = scheduled
    dag_id = f"tidemark_batch_{pipe.spec.name}"
    run_id = _scheduled_run(api, dag_id)

    task = _extract_writing(api, dag_id, run_id, pipe, KILLED_ROWS)
    victims = [task, *task.children(recursive=True)]
    for proc in victims:  # the whole worker goes, as when the machine's OOM killer takes it
        try:
            proc.kill()
        except psutil.NoSuchProcess:  # a short-lived child ended by itself meanwhile
            pass
    psutil.wait_procs(victims, timeout=30)

    run = api.wait_finished(dag_id, run_id)
    states = api.task_states(dag_id, run_id)
    assert run["state"] == "success", states
    ledger = pipe.query_wh("SELECT attempt, state FROM tidemark_control.batch_attempts WHERE batch_id = %s "
                           "ORDER BY attempt", (f"{pipe.spec.name}:{run_id}",))
    assert ledger[0] == (1, "superseded") and ledger[-1][1] == "committed", ledger
    assert _unfinished(pipe) == 0 and _stages(pipe) == []
    assert _rows(pipe, "target") == _rows(pipe, "source")


@pytest.mark.serial("stops the broker")
def test_the_broker_gone_at_begin_retries_then_aborts_and_says_what_to_do(scheduled, settings):
    from tidemark_workshop.stack.kafka import Kafka

    api, _, _, _, pipe, *_ = scheduled
    dag_id = f"tidemark_batch_{pipe.spec.name}"
    with Kafka(settings).away():  # plan needs only the databases; begin is the first step that needs the broker
        run_id = _scheduled_run(api, dag_id)
        run = api.wait_finished(dag_id, run_id)
    tis = {t["task_id"]: t for t in api.task_instances(dag_id, run_id)}
    assert run["state"] == "failed" and tis["begin"]["state"] == "failed"
    assert tis["plan"]["state"] == "success"
    assert tis["begin"]["try_number"] == 3, "a broker outage is transient: begin must have been retried"
    assert tis["abort_unfinished"]["state"] == "success"
    # begin makes sure of the topic before it opens an attempt: the outage left no attempt at all
    assert pipe.query_wh("SELECT attempt, state FROM tidemark_control.batches WHERE batch_id = %s",
                         (f"{pipe.spec.name}:{run_id}",)) == [(0, "planned")]
    assert _unfinished(pipe) == 0 and _stages(pipe) == []
    log = api.log_text(dag_id, run_id, "begin", 3)
    last = [line for line in log.splitlines() if "Next:" in line][-1]
    for part in (f"pipeline={pipe.spec.name}", f"batch={pipe.spec.name}:{run_id}", "window=", "make status"):
        assert part in last, f"{part!r} missing from the failure line: {last}"
    assert log.count("Connection refused") <= 5, "rdkafka's connection noise must be one line per cause"


@pytest.mark.serial("stops the broker")
def test_a_broker_restart_mid_extract_ends_with_every_row_loaded_once(scheduled, settings):
    """However the extract weathers it (its producer retries, or the task fails and a new attempt
    loads the batch), the run ends committed with the source's rows exactly once."""
    from tidemark_workshop.stack.kafka import Kafka

    api, _, _, _, _, pipe, *_ = scheduled
    dag_id = f"tidemark_batch_{pipe.spec.name}"
    run_id = _scheduled_run(api, dag_id)
    _extract_writing(api, dag_id, run_id, pipe, BLIP_ROWS)
    with Kafka(settings).away():
        time.sleep(10)
    run = api.wait_finished(dag_id, run_id)
    assert run["state"] == "success", api.task_states(dag_id, run_id)
    ledger = pipe.query_wh("SELECT attempt, state FROM tidemark_control.batch_attempts WHERE batch_id = %s "
                           "ORDER BY attempt", (f"{pipe.spec.name}:{run_id}",))
    assert ledger[-1][1] == "committed" and all(state == "superseded" for _, state in ledger[:-1]), ledger
    assert _unfinished(pipe) == 0 and _stages(pipe) == []
    assert _rows(pipe, "target") == _rows(pipe, "source")


def test_the_supervisor_keeps_a_standing_sink_running_and_a_person_pauses_it_from_the_ui(scheduled, settings):
    api, *_, streamed, _ = scheduled
    name, dag_id = streamed.spec.name, f"tidemark_batch_{streamed.spec.name}"
    launcher = LocalLauncher(settings.state_dir / "streams")  # TIDEMARK_STREAMS_DIR of the stack's services
    try:
        api.call("PATCH", "/dags/tidemark_supervisor", {"is_paused": False})  # a cycle every minute...
        api.trigger("tidemark_supervisor")  # ...and one now, as the Trigger button makes it
        run_id = _scheduled_run(api, dag_id)  # its sink step leaves the batch to the standing sink
        api.wait_for("the supervisor to start the standing sink", lambda: streamed.query_wh(
            "SELECT 1 FROM tidemark_control.stream_heartbeats WHERE pipeline = %s AND ended_at IS NULL", (name,)),
            timeout_s=240)
        run = api.wait_finished(dag_id, run_id)
        assert run["state"] == "success", api.task_states(dag_id, run_id)
        assert _rows(streamed, "target") == _rows(streamed, "source") and len(_rows(streamed, "target")) == 200
        assert "the standing sink (supervised by tidemark_supervisor) applies this batch" in api.log_text(
            dag_id, run_id, "sink", 1)

        api.call("PATCH", "/dags/tidemark_stream_control", {"is_paused": False})
        control = api.trigger("tidemark_stream_control", {"pipeline": name, "action": "pause", "reason": "maintenance"})
        assert api.wait_finished("tidemark_stream_control", control, timeout_s=180)["state"] == "success"
        api.wait_for("the sink to stop itself", lambda: launcher.status(name).exit_code == 0, timeout_s=120)
        (desired, who, why), = streamed.query_wh(
            "SELECT desired, changed_by, reason FROM tidemark_control.streams WHERE pipeline = %s", (name,))
        assert (desired, why) == ("paused", "maintenance") and who not in (None, "", "unknown", "supervisor"), who

        later = api.trigger("tidemark_supervisor")  # a cycle after the pause leaves it stopped, and says so
        assert api.wait_finished("tidemark_supervisor", later, timeout_s=180)["state"] == "success"
        log = api.log_text("tidemark_supervisor", later, "supervise", 1)
        assert f"pipeline={name} desired=paused" in log and "action=none" in log, log[-3000:]
        assert not launcher.status(name).alive
    finally:
        api.call("PATCH", "/dags/tidemark_supervisor", {"is_paused": True})
        launcher.kill(name)


def test_a_scheduled_run_and_a_backfill_started_together_take_turns_and_both_load(scheduled, settings):
    """Airflow's max_active_runs does not hold a backfill run back from the scheduled one: before the
    turn, both extracted onto the topic at once and one failed ('another writer on the topic')."""
    api, nightly, *_ = scheduled
    pipe = make_pipeline(settings, nightly.path.parent, DDL, cursor={"kind": "timestamp", "column": "created_at"},
                         initial_watermark=WATERMARK_START.isoformat(), write_mode="append_window_replace")
    src = pipe.src()
    with src, src.cursor() as cur:
        cur.execute(f"INSERT INTO {pipe.spec.table} SELECT g, g / 100.0, %s + (g %% %s) * interval '1 day' "
                    "+ (g / %s) * interval '1 second' FROM generate_series(1, %s) g", (FIRST_DAY, DAYS, DAYS, 20_000))
    src.close()
    dag_id = f"tidemark_batch_{pipe.spec.name}"
    api.wait_for(f"{dag_id} to be parsed", lambda: api.exists(dag_id), timeout_s=180)
    start, end = BACKFILL[0], BACKFILL[0] + timedelta(days=1)  # runs for Oct 2 and 3
    api.call("PATCH", f"/dags/{dag_id}", {"is_paused": False})  # the scheduled run starts...
    api.call("POST", "/backfills", {"dag_id": dag_id, "from_date": start.isoformat(), "to_date": end.isoformat(),
                                    "max_active_runs": 1})  # ...and the backfill with it
    runs = api.wait_for("the scheduled run and two backfill runs",
                        lambda: (r := api.runs(dag_id)) and len(r) == 3 and r)
    finished = [api.wait_finished(dag_id, r["dag_run_id"]) for r in runs]
    api.call("PATCH", f"/dags/{dag_id}", {"is_paused": True})
    states = {r["dag_run_id"]: api.task_states(dag_id, r["dag_run_id"]) for r in finished}
    assert [r["state"] for r in finished] == ["success"] * 3, states

    # One at a time from plan to commit: every batch committed by its first attempt, none overlapping.
    spans = pipe.query_wh(
        "SELECT b.batch_id, b.committed_attempt, min(a.begun_at), max(a.finished_at) FROM tidemark_control.batches b "
        "JOIN tidemark_control.batch_attempts a USING (batch_id) WHERE b.pipeline = %s GROUP BY 1, 2 ORDER BY 3",
        (pipe.spec.name,))
    assert len(spans) == 3 and all(attempt == 1 for _, attempt, *_ in spans), spans
    for (_, _, _, ended), (_, _, began, _) in zip(spans, spans[1:]):
        assert ended <= began, f"two batches of one pipeline loaded at once: {spans}"
    waited = [api.log_text(dag_id, run_id, "wait_turn", 1) for run_id in states]
    assert any("WAITS: run" in log and "holds the pipeline's turn" in log for log in waited), waited
    expected = {**_rows(pipe, "source", "created_at >= %s AND created_at < %s", (start, end + timedelta(days=1))),
                **_rows(pipe, "source", "created_at > %s", (WATERMARK_START,))}
    assert _rows(pipe, "target") == expected

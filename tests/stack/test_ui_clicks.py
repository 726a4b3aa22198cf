"""The Airflow 3 UI as a person uses it: headless Chromium (Selenium, Debian's chromium-driver)
clicks the real Trigger, Backfill and Clear buttons, the stream control and reconciliation forms, and
the Tidemark status page in the UI's nav with its evidence and Data Docs, against the real Airflow
services; the warehouse and the ledger are checked key by key.

Issue 29: the Trigger button was greyed out on every nightly DAG, because a param defaulting to ""
is a missing required field to the React trigger form. These tests open the dialog, keep its
defaults, check that its submit button is enabled and click it.

As in test_scheduler.py, the services of `make ui` are stopped first and this module's own start
with a pipelines directory of its own (two dag-processors on one metadata database would fight
over which DAGs exist); the two modules must not run at the same time. Locally there is no login.
Screenshots (and the page's DOM when a step fails) go to <state dir>/screenshots/ui-clicks-*.
The tests run in order: the backfill goes to the DAG the first test unpaused and loaded, Clear to
the first test's run, resume after pause, and the reconciliation to the newest (a backfill) batch.

The nightly pipeline here is ``transport: direct`` (its extract's tasks stage the rows in the
warehouse; BEGIN and END still go through the topic): the Trigger and Backfill runs load direct
batches under the real scheduler, Clear finds one committed, and the repair batch goes through the
topic, as every repair does. test_scheduler.py's nightly pipeline is the Kafka transport's.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from decimal import Decimal
from urllib.parse import quote

import pytest
from selenium.webdriver.common.by import By
from ui_driver import SWITCH_INPUT, Browser

from tidemark.protocol.window import MICROSECOND
from tidemark.streams.launch import LocalLauncher
from tidemark_workshop.stack.airflow import AirflowUI, RestApi
from tidemark_workshop.stack.batchrun import make_pipeline

pytestmark = pytest.mark.stack

UTC = timezone.utc
DDL = ("CREATE TABLE {table} (id bigint PRIMARY KEY, amount numeric(18,2) NOT NULL, "
       "created_at timestamptz NOT NULL)")
# Fixed dates, as in test_scheduler.py: ten days of rows, every created_at distinct.
FIRST_DAY = datetime(2026, 10, 1, tzinfo=UTC)
DAYS, ROWS_PER_DAY = 10, 200
WATERMARK_START = datetime(2026, 10, 6, tzinfo=UTC)  # a nightly run loads Oct 6 (after midnight) .. Oct 10
BACKFILL = (datetime(2026, 10, 2, tzinfo=UTC), datetime(2026, 10, 4, tzinfo=UTC))  # runs for Oct 2, 3, 4
RUN_TIMEOUT_S = 600  # a cap: a run takes 40 s to 2.5 min here, as busy as the machine is
SUPERVISOR = "tidemark_supervisor"


@pytest.fixture(scope="module")
def ui(settings, tmp_path_factory):
    """A nightly pipeline with ten days of source rows and a standing one, the Airflow services
    that parse them, the REST API (to wait and to check), and a headless Chromium."""
    pipelines = tmp_path_factory.mktemp("pipelines")
    nightly = make_pipeline(settings, pipelines, DDL, cursor={"kind": "timestamp", "column": "created_at"},
                            initial_watermark=WATERMARK_START.isoformat(), write_mode="append_window_replace",
                            transport="direct")
    src = nightly.src()
    with src, src.cursor() as cur:
        cur.execute(
            f"INSERT INTO {nightly.spec.table} SELECT g, (g * 7919 %% 100000) / 100.0, "
            f"%s + (g %% %s) * interval '1 day' + (g / %s) * interval '1 second' FROM generate_series(1, %s) g",
            (FIRST_DAY, DAYS, DAYS, DAYS * ROWS_PER_DAY),
        )
    src.close()
    # Only its name is needed: tidemark_stream_control refuses a pipeline whose sink does not stand.
    standing = make_pipeline(settings, pipelines, DDL, cursor={"kind": "timestamp", "column": "created_at"},
                             sink={"mode": "standing", "trigger": "PT1S", "heartbeat": "PT2S"})

    services = AirflowUI(settings)
    services.stop()  # `make ui`'s services parse the default pipelines; ours parse this module's
    services.start({"TIDEMARK_PIPELINES_DIR": str(pipelines),
                    "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
                    "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5"})
    supervisor_paused = True
    try:
        services.wait_healthy()
        api = RestApi(services.url, timeout_s=RUN_TIMEOUT_S)
        for dag_id in (f"tidemark_batch_{nightly.spec.name}", "tidemark_stream_control", SUPERVISOR):
            api.wait_for(f"{dag_id} to be parsed", lambda d=dag_id: api.exists(d), timeout_s=180)
        # These journeys record what a person asks of a stream; acting on it is test_scheduler's. The
        # supervisor (unpaused by `make demo`, say) would start the standing sink, a Spark job on this
        # 2-core machine that outlives the services: paused here, as it was given back after.
        supervisor_paused = api.call("GET", f"/dags/{SUPERVISOR}")["is_paused"]
        api.call("PATCH", f"/dags/{SUPERVISOR}", {"is_paused": True})
        with Browser(services.url, settings.state_dir / "screenshots") as browser:
            yield api, browser, nightly, standing
    finally:
        try:
            if not supervisor_paused:
                api.call("PATCH", f"/dags/{SUPERVISOR}", {"is_paused": False})
        finally:
            services.stop()
            LocalLauncher(settings.state_dir / "streams").stop(standing.spec.name)  # if a cycle started it


@pytest.fixture
def browser(ui, request):
    """The module's browser; when a test fails, what the page showed is kept beside the screenshots."""
    _, browser, *_ = ui
    browser.driver.switch_to.default_content()  # a test may end inside the status page's frame
    failed = request.session.testsfailed
    yield browser
    if request.session.testsfailed > failed:
        browser.screenshot(f"ui-clicks-{request.node.name}-failed")
        browser.dump(f"ui-clicks-{request.node.name}-failed")


def _rows(pipe, side: str, where: str = "true", params=()) -> dict:
    conn = pipe.src() if side == "source" else pipe.wh()
    table = pipe.spec.table if side == "source" else pipe.spec.target_table
    try:
        with conn, conn.cursor() as cur:
            cur.execute(f"SELECT id, amount, created_at FROM {table} WHERE {where} ORDER BY id", params)
            return {r[0]: r[1:] for r in cur.fetchall()}
    finally:
        conn.close()


def _batches(pipe, backfill: bool) -> list[tuple]:
    """(run_id, state, rows, window_lo cursor, window_hi cursor) of the pipeline's batches, oldest first."""
    found = pipe.query_wh(
        "SELECT run_id, state, rows, window_lo, window_hi FROM tidemark_control.batches "
        "WHERE pipeline = %s AND backfill = %s ORDER BY planned_at", (pipe.spec.name, backfill))
    return [(run_id, state, rows, *(datetime.fromisoformat(w["cursor"]) for w in (lo, hi)))
            for run_id, state, rows, lo, hi in found]


def _settled(api: RestApi, dag_id: str) -> list[dict]:
    """Every run of the DAG, once none is queued or running."""
    def done():
        runs = api.runs(dag_id)
        return runs if runs and all(r["state"] in ("success", "failed") for r in runs) else None

    return api.wait_for(f"every run of {dag_id} to finish", done)


def _checkbox(browser: Browser, dialog, label_starts: str):
    """A Chakra checkbox by its label's text: (its visible label, its input)."""
    label = browser.wait(f"the checkbox {label_starts!r}", lambda d: (browser.visible(
        By.XPATH, f".//label[@data-part='root' and starts-with(normalize-space(.), '{label_starts}')]", dialog)
        or [None])[0], timeout_s=10)
    return label, label.find_element(By.TAG_NAME, "input")


def test_trigger_with_the_forms_defaults_runs_the_nightly_batch_and_loads_its_window(ui, browser):
    """The regression of issue 29: the dialog's Trigger button is enabled with the form as it opens.
    The nightly DAG is paused, so the dialog's "Unpause ... on trigger" box is there and checked:
    kept (a default), it unpauses the DAG, and the scheduler adds the run of the latest daily
    interval beside the manual one. Whichever runs first, every row loads exactly once."""
    api, _, pipe, _ = ui
    dag_id = f"tidemark_batch_{pipe.spec.name}"
    assert api.call("GET", f"/dags/{dag_id}")["is_paused"], "a new DAG starts paused"
    assert api.runs(dag_id) == []

    dialog = browser.trigger_dialog(dag_id)
    assert browser.field("repair_batch", dialog).get_attribute("value") == ""
    _, unpause = _checkbox(browser, dialog, f"Unpause {dag_id} on trigger")
    assert unpause.is_selected(), "Airflow 3's dialog unpauses on trigger by default"
    submit = browser.button("Trigger", dialog)
    assert submit.get_attribute("data-testid") == "trigger-dag-submit"
    browser.screenshot("ui-clicks-trigger-dialog-defaults")
    # With repair_batch = Param("", type="string") the form rendered the field required (a red *)
    # and the button disabled, with the params' first render; so both are looked at after it.
    required = browser.label("repair_batch", dialog).get_attribute("data-required") is not None
    errors = [e.text for e in browser.visible(By.CSS_SELECTOR, "[data-part=error-text]", dialog)]
    assert (submit.is_enabled(), required) == (True, False), (
        f"issue 29: with the form's defaults the dialog's Trigger button is "
        f"{'enabled' if submit.is_enabled() else 'DISABLED'} and repair_batch is "
        f"{'marked REQUIRED' if required else 'optional'} {errors}")
    browser.click(submit)

    browser.text("Dag Run Triggered")  # the UI's toast
    browser.screenshot("ui-clicks-trigger-submitted")
    manual = api.wait_for("the manual run the click made", lambda: api.runs(dag_id, run_type="manual"), timeout_s=30)
    assert len(manual) == 1, manual
    assert manual[0]["conf"] == {"repair_batch": None}, manual[0]["conf"]  # a nightly load, not a repair
    assert api.call("GET", f"/dags/{dag_id}")["is_paused"] is False, "the dialog's default unpaused the DAG"
    api.wait_for("the run of the latest daily interval, which the unpause makes",
                 lambda: api.runs(dag_id, run_type="scheduled"), timeout_s=60)
    runs = _settled(api, dag_id)  # one after the other (max_active_runs=1), in either order
    assert sorted(r["run_type"] for r in runs) == ["manual", "scheduled"], runs
    assert all(r["state"] == "success" for r in runs), {
        r["dag_run_id"]: (r["state"], api.task_states(dag_id, r["dag_run_id"])) for r in runs}

    # The warehouse: each nightly batch holds exactly the source rows of its window, the windows
    # follow one another, and together they are every row after the initial watermark, once.
    batches = _batches(pipe, backfill=False)
    assert {b[0] for b in batches} == {r["dag_run_id"] for r in runs}, batches
    assert all(state == "committed" for _, state, *_ in batches), batches
    assert pipe.query_wh("SELECT DISTINCT transport FROM tidemark_control.batches WHERE pipeline = %s",
                         (pipe.spec.name,)) == [("direct",)]
    assert batches[0][3] == WATERMARK_START
    for (_, _, _, _, hi), (_, _, _, lo, _) in zip(batches, batches[1:]):
        assert lo == hi, f"the windows must follow one another: {batches}"
    expected: dict = {}
    for run_id, _, rows, lo, hi in batches:
        window = _rows(pipe, "source", "created_at > %s AND created_at <= %s", (lo, hi))
        assert rows == len(window), (run_id, rows, len(window))
        assert not expected.keys() & window.keys()
        expected.update(window)
    assert _rows(pipe, "target") == expected == _rows(pipe, "source", "created_at > %s", (WATERMARK_START,))
    assert len(expected) > 4 * ROWS_PER_DAY  # Oct 6 (after midnight) .. Oct 10

    browser.open(f"/dags/{dag_id}/runs/{quote(manual[0]['dag_run_id'], safe='')}")
    browser.text(manual[0]["dag_run_id"])
    browser.screenshot("ui-clicks-trigger-run")


def test_stream_control_needs_only_a_pipeline_and_records_who_paused_it(ui, browser):
    api, _, _, standing = ui
    dag_id, name = "tidemark_stream_control", standing.spec.name
    before = {r["dag_run_id"] for r in api.runs(dag_id)}

    dialog = browser.trigger_dialog(dag_id)
    pipeline = browser.field_root("pipeline", dialog)  # a select of the standing pipelines, nothing chosen
    submit = browser.button("Trigger", dialog)
    browser.wait("the Trigger button to be disabled while pipeline is empty",
                 lambda d: not submit.is_enabled(), timeout_s=10)
    browser.screenshot("ui-clicks-stream-control-empty")
    assert pipeline.find_element(By.NAME, "element_pipeline").get_attribute("value") == ""
    assert browser.field("reason", dialog).get_attribute("value") == ""  # optional: left empty
    action = browser.field_root("action", dialog)  # a select, showing its default
    assert action.find_element(By.NAME, "element_action").get_attribute("value") == "pause"
    assert "pause" in action.text
    assert browser.label("pipeline", dialog).get_attribute("data-required") is not None

    browser.choose(pipeline, name)
    assert pipeline.find_element(By.NAME, "element_pipeline").get_attribute("value") == name
    browser.wait("the Trigger button to enable once pipeline is chosen", lambda d: submit.is_enabled(), timeout_s=10)
    browser.screenshot("ui-clicks-stream-control-filled")
    browser.click(submit)
    browser.text("Dag Run Triggered")

    new = api.wait_for("the run the click made", lambda: [
        r for r in api.runs(dag_id) if r["dag_run_id"] not in before], timeout_s=30)
    assert len(new) == 1 and new[0]["run_type"] == "manual", new
    assert new[0]["conf"] == {"pipeline": name, "action": "pause", "reason": None}, new[0]["conf"]
    run = api.wait_finished(dag_id, new[0]["dag_run_id"], timeout_s=180)
    assert run["state"] == "success", api.log_text(dag_id, run["dag_run_id"], "apply", 1)[-3000:]

    (desired, who, why), = standing.query_wh(
        "SELECT desired, changed_by, reason FROM tidemark_control.streams WHERE pipeline = %s", (name,))
    assert desired == "paused" and why is None
    assert who == run["triggering_user_name"] and who not in (None, "", "unknown", "supervisor"), (who, run)
    (detail,), = standing.query_wh("SELECT detail FROM tidemark_control.stream_events WHERE pipeline = %s "
                                   "AND kind = 'desired'", (name,))
    assert detail.endswith("-> paused"), detail


def test_stream_control_resume_chosen_in_the_select_records_who_resumed_it(ui, browser):
    """The same form, its action picked as a person picks it (the select opened, the option clicked),
    with a reason typed: the desired state goes back from the pause test's 'paused' to 'running'."""
    api, _, _, standing = ui
    dag_id, name = "tidemark_stream_control", standing.spec.name
    streams = "SELECT desired, changed_by, reason FROM tidemark_control.streams WHERE pipeline = %s"
    assert [d for d, *_ in standing.query_wh(streams, (name,))] == ["paused"], "the pause test runs first"
    before = {r["dag_run_id"] for r in api.runs(dag_id)}

    dialog = browser.trigger_dialog(dag_id)
    browser.choose(browser.field_root("pipeline", dialog), name)
    action = browser.field_root("action", dialog)
    browser.choose(action, "resume")
    assert action.find_element(By.NAME, "element_action").get_attribute("value") == "resume"
    assert "resume" in action.text and "pause" not in action.text, action.text
    browser.type_into(browser.field("reason", dialog), "maintenance over")
    submit = browser.button("Trigger", dialog)
    browser.wait("the Trigger button to enable", lambda d: submit.is_enabled(), timeout_s=10)
    browser.screenshot("ui-clicks-stream-control-resume")
    browser.click(submit)
    browser.text("Dag Run Triggered")

    new = api.wait_for("the run the click made", lambda: [
        r for r in api.runs(dag_id) if r["dag_run_id"] not in before], timeout_s=30)
    assert len(new) == 1 and new[0]["run_type"] == "manual", new
    assert new[0]["conf"] == {"pipeline": name, "action": "resume", "reason": "maintenance over"}, new[0]["conf"]
    run = api.wait_finished(dag_id, new[0]["dag_run_id"], timeout_s=180)
    assert run["state"] == "success", api.log_text(dag_id, run["dag_run_id"], "apply", 1)[-3000:]

    (desired, who, why), = standing.query_wh(streams, (name,))
    assert (desired, why) == ("running", "maintenance over")  # tidemark_airflow.streams.ACTIONS["resume"]
    assert who == run["triggering_user_name"] and who not in (None, "", "unknown", "supervisor"), (who, run)
    events = standing.query_wh("SELECT actor, detail FROM tidemark_control.stream_events WHERE pipeline = %s "
                               "AND kind = 'desired' ORDER BY id", (name,))
    assert [d.split(" -> ", 1)[1] for _, d in events] == ["paused", "running: maintenance over"], events
    assert events[-1] == (who, "paused -> running: maintenance over"), events


def test_a_backfill_from_the_dialog_loads_exactly_its_three_days(ui, browser):
    api, _, pipe, _ = ui
    dag_id = f"tidemark_batch_{pipe.spec.name}"
    _settled(api, dag_id)
    before, watermark = _rows(pipe, "target"), pipe.watermark()
    assert before, "the first test loads the nightly window first"
    start, end = BACKFILL

    dialog = browser.trigger_dialog(dag_id)
    browser.click(browser.text("Run this Dag for a range of dates"))  # the Backfill choice
    run_backfill = browser.button("Run Backfill", dialog)
    assert not run_backfill.is_enabled(), "no dates yet"
    for n, when in enumerate((start, end)):
        browser.click(browser.visible(By.CSS_SELECTOR, "[data-testid=datetime-input]", dialog)[n])  # From, To
        browser.type_into(browser.wait("the date picker", lambda d: (browser.visible(
            By.CSS_SELECTOR, "input[placeholder='YYYY/MM/DD']") or [None])[0]), when.strftime("%Y/%m/%d"))
        browser.type_into(browser.visible(By.CSS_SELECTOR, "input[placeholder='HH:mm']")[0], when.strftime("%H:%M"))
        browser.click(browser.text("Date Range"))  # closes the picker
        browser.wait("the date picker to close", lambda d: not browser.visible(
            By.CSS_SELECTOR, "input[placeholder='YYYY/MM/DD']"), timeout_s=10)
    shown = [e.text for e in browser.visible(By.CSS_SELECTOR, "[data-testid=datetime-input]", dialog)]
    assert shown == [f"{d:%b %d, %Y} 00:00" for d in (start, end)], shown
    browser.text("3 runs will be triggered.")  # the dialog's dry run
    browser.wait("Run Backfill to enable", lambda d: run_backfill.is_enabled(), timeout_s=10)
    browser.screenshot("ui-clicks-backfill-dialog")
    browser.click(run_backfill)
    browser.text("Backfill generated")

    runs = api.wait_for("three backfill runs", lambda: (r := api.runs(dag_id, run_type="backfill")) and len(r) == 3 and r,
                        timeout_s=60)
    finished = [api.wait_finished(dag_id, r["dag_run_id"]) for r in runs]
    assert [r["state"] for r in finished] == ["success"] * 3, [api.task_states(dag_id, r["dag_run_id"]) for r in finished]
    intervals = sorted((datetime.fromisoformat(r["data_interval_start"]), datetime.fromisoformat(r["data_interval_end"]))
                       for r in finished)
    assert intervals == [(start + timedelta(days=d), start + timedelta(days=d + 1)) for d in range(3)]
    _settled(api, dag_id)

    days = _rows(pipe, "source", "created_at >= %s AND created_at < %s", (start, end + timedelta(days=1)))
    assert len(days) == 3 * ROWS_PER_DAY
    assert _rows(pipe, "target") == {**before, **days}  # nothing of Oct 1 or Oct 5, every row of Oct 2-4
    backfills = _batches(pipe, backfill=True)
    # each window is its interval [start, end), kept as (start - 1 µs, end - 1 µs] (tidemark.protocol.window)
    assert sorted((lo + MICROSECOND, hi + MICROSECOND) for *_, lo, hi in backfills) == intervals
    assert [(state, rows) for _, state, rows, *_ in backfills] == [("committed", ROWS_PER_DAY)] * 3
    assert pipe.query_wh("SELECT DISTINCT transport FROM tidemark_control.batches WHERE pipeline = %s AND backfill",
                         (pipe.spec.name,)) == [("direct",)]
    assert pipe.watermark() == watermark  # backfills never move it
    browser.open(f"/dags/{dag_id}/runs")
    browser.text(runs[0]["dag_run_id"])
    browser.screenshot("ui-clicks-backfill-runs")


def _ledger(pipe) -> dict:
    """Everything the ledger and the target hold of the pipeline, as compared whole: every batch and
    attempt row, the watermark row, and each target row with its xmin (a row written again, even
    with the same values, has a new one)."""
    name = pipe.spec.name
    return {
        "batches": pipe.query_wh("SELECT batch_id, to_jsonb(b) FROM tidemark_control.batches b WHERE pipeline = %s "
                                 "ORDER BY batch_id", (name,)),
        "attempts": pipe.query_wh("SELECT a.batch_id, a.attempt, to_jsonb(a) FROM tidemark_control.batch_attempts a "
                                  "JOIN tidemark_control.batches b USING (batch_id) WHERE b.pipeline = %s "
                                  "ORDER BY 1, 2", (name,)),
        "watermark": pipe.query_wh("SELECT to_jsonb(w) FROM tidemark_control.watermarks w WHERE pipeline = %s",
                                   (name,)),
        "target": pipe.query_wh(f"SELECT id, amount, created_at, xmin::text FROM {pipe.spec.target_table} ORDER BY id"),
    }


def _into_the_plugins_frame(browser: Browser) -> None:
    """Into the frame in which the UI shows the plugin's pages (its nav entry "Tidemark status")."""
    browser.driver.switch_to.default_content()
    browser.driver.switch_to.frame(browser.wait("the Tidemark status frame", lambda d: (browser.visible(
        By.CSS_SELECTOR, "iframe[title='Tidemark status']") or [None])[0]))


def test_clear_on_the_committed_manual_run_changes_nothing(ui, browser):
    """The run page's Clear Run, confirmed in its dialog with its defaults ("Clear existing tasks"):
    the run goes again, its begin finds the batch committed and skips the rest, and not one ledger
    row or target row is written (a re-load with the same values would change committed_at and the
    rows' xmin)."""
    api, _, pipe, _ = ui
    dag_id = f"tidemark_batch_{pipe.spec.name}"
    _settled(api, dag_id)
    (manual,) = api.runs(dag_id, run_type="manual")  # the first test's, committed
    run_id = manual["dag_run_id"]
    assert manual["state"] == "success"
    (batch_id, state), = pipe.query_wh("SELECT batch_id, state FROM tidemark_control.batches WHERE run_id = %s",
                                       (run_id,))
    assert state == "committed"
    before = _ledger(pipe)
    tries = {t["task_id"]: t["try_number"] for t in api.task_instances(dag_id, run_id)}

    browser.open(f"/dags/{dag_id}/runs/{quote(run_id, safe='')}")
    browser.text(run_id)
    # an icon button: its tooltip, and its only name, is "Press shift+c to clear"
    browser.click(browser.named("Press shift+c to clear"))
    dialog = browser.dialog()
    assert " ".join(dialog.find_element(By.TAG_NAME, "h2").text.split()) == f"Clear Dag Run: {run_id}"
    browser.text("Affected Tasks: ")
    confirm = browser.button("Confirm", dialog)
    browser.wait("Confirm to enable (the dialog's dry run lists the tasks)", lambda d: confirm.is_enabled(),
                 timeout_s=30)
    browser.screenshot("ui-clicks-clear-dialog")
    browser.click(confirm)
    browser.wait("the dialog to close", lambda d: not browser.visible(By.CSS_SELECTOR, "[role=dialog]"), timeout_s=30)

    again = api.wait_for("the cleared run to run and finish again", lambda: (
        r := api.run(dag_id, run_id))["state"] in ("success", "failed") and r["end_date"] != manual["end_date"] and r,
        timeout_s=RUN_TIMEOUT_S)
    states = api.task_states(dag_id, run_id)
    assert again["state"] == "success", states
    after = {t["task_id"]: t["try_number"] for t in api.task_instances(dag_id, run_id)}
    assert after["begin"] == tries["begin"] + 1, (tries, after)  # it did run again
    assert {t: states[t] for t in ("begin", "extract", "end", "sink", "wait_committed", "publish")} == dict.fromkeys(
        ("begin", "extract", "end", "sink", "wait_committed", "publish"), "skipped"), states
    assert "same window as the earlier try of this run" in api.log_text(dag_id, run_id, "plan", after["plan"])
    begin_log = api.log_text(dag_id, run_id, "begin", after["begin"])
    assert f"batch={batch_id}" in begin_log and "Nothing to do: the rest of this run is skipped" in begin_log, \
        begin_log[-3000:]

    now = _ledger(pipe)
    for part in before:
        assert now[part] == before[part], f"the Clear changed the {part}"
    browser.open(f"/dags/{dag_id}/runs/{quote(run_id, safe='')}")
    browser.text(run_id)
    browser.screenshot("ui-clicks-clear-done")


def test_reconcile_with_repair_from_the_form_puts_a_forged_cent_right_and_the_evidence_shows_it(ui, browser):
    """A cent forged in the target, in the pipeline's newest batch (the one the status page shows);
    tidemark_reconcile_<pipeline>'s dialog with batch_id left empty (the newest batch) and repair
    switched on: the first verdict finds the row, the repair batch re-loads its key, the second passes.
    Then as finance would: the Tidemark status page from the UI's nav, the pipeline's verdict link,
    the evidence page (the check, the row with both amounts), and the Data Docs, which render with
    nothing fetched from another machine."""
    api, _, pipe, _ = ui
    name = pipe.spec.name
    batch_dag, dag_id = f"tidemark_batch_{name}", f"tidemark_reconcile_{name}"
    _settled(api, batch_dag)
    assert api.runs(dag_id) == [], "paused since it was parsed: no Asset event queued a run"
    (batch_id, lo, hi, rows), = pipe.query_wh(  # the batch ledger.last_committed names, the status page shows
        "SELECT batch_id, window_lo->>'cursor', window_hi->>'cursor', rows FROM tidemark_control.batches "
        "WHERE pipeline = %s AND state = 'committed' AND repair_keys IS NULL ORDER BY committed_at DESC LIMIT 1",
        (name,))
    assert rows == ROWS_PER_DAY, "the backfill test runs first: its last day is the newest batch"
    loaded, watermark = _rows(pipe, "target"), pipe.watermark()
    key = min(_rows(pipe, "target", "created_at > %s AND created_at <= %s", (lo, hi)))
    wh = pipe.wh()
    with wh, wh.cursor() as cur:  # a stray manual fix in the warehouse
        cur.execute(f"UPDATE {pipe.spec.target_table} SET amount = amount + 0.01 WHERE id = %s RETURNING amount",
                    (key,))
        (forged,), = cur.fetchall()
    wh.close()
    (source_amount, _), = _rows(pipe, "source", "id = %s", (key,)).values()
    assert forged - source_amount == Decimal("0.01")

    dialog = browser.trigger_dialog(dag_id)
    _, unpause = _checkbox(browser, dialog, f"Unpause {dag_id} on trigger")
    assert unpause.is_selected()
    assert browser.field("batch_id", dialog).get_attribute("value") == ""  # empty: the newest committed batch
    scope = browser.field_root("scope", dialog).find_element(By.NAME, "element_scope")
    assert scope.get_attribute("value") == "batch"
    deletes = browser.field_root("apply_source_deletes", dialog).find_element(By.CSS_SELECTOR, SWITCH_INPUT)
    repair = browser.field_root("repair", dialog)
    assert not repair.find_element(By.CSS_SELECTOR, SWITCH_INPUT).is_selected() and not deletes.is_selected()
    assert browser.toggle(repair).is_selected(), "the click switched repair on"
    submit = browser.button("Trigger", dialog)
    browser.wait("the Trigger button to be enabled", lambda d: submit.is_enabled(), timeout_s=10)
    browser.screenshot("ui-clicks-reconcile-dialog")
    browser.click(submit)
    browser.text("Dag Run Triggered")

    (manual,) = api.wait_for("the run the click made", lambda: api.runs(dag_id, run_type="manual"), timeout_s=30)
    assert manual["conf"] == {"batch_id": None, "scope": "batch", "repair": True, "apply_source_deletes": False}, \
        manual["conf"]
    run = api.wait_finished(dag_id, manual["dag_run_id"], timeout_s=RUN_TIMEOUT_S)
    states = api.task_states(dag_id, run["dag_run_id"])
    assert run["state"] == "success" and set(states.values()) == {"success"}, states
    first = api.log_text(dag_id, run["dag_run_id"], "reconcile", 1)
    assert "1 rows differ: 1 amount changed" in first and "repair batch" in first, first[-3000:]
    # the repair batch's load updates the pipeline's Asset: the now unpaused DAG reconciles it once more
    api.wait_for("the run the repair's Asset event schedules", lambda: api.runs(dag_id, run_type="asset_triggered"),
                 timeout_s=120)
    runs = _settled(api, dag_id)
    assert [r["state"] for r in runs] == ["success"] * 2, runs

    # the warehouse: the row is the source's again, nothing else moved
    assert _rows(pipe, "target") == loaded
    assert pipe.watermark() == watermark, "a repair never moves the watermark"
    assert pipe.query_wh("SELECT transport FROM tidemark_control.batches WHERE pipeline = %s AND repair_keys IS NOT "
                         "NULL", (name,)) == [("kafka",)], "a repair goes through the topic, whatever the spec says"
    verdicts = pipe.query_wh("SELECT run_id::text, bool_and(verdict = 'pass') FROM "
                             "tidemark_control.reconciliation_results WHERE batch_id = %s GROUP BY run_id "
                             "ORDER BY min(checked_at)", (batch_id,))
    assert [passed for _, passed in verdicts] == [False, True, True], verdicts
    found_by = verdicts[0][0]
    failed = pipe.query_wh("SELECT check_name, subject, expected, actual FROM tidemark_control.reconciliation_results "
                           "WHERE run_id = %s AND verdict = 'fail' ORDER BY id", (found_by,))
    assert [c for c, *_ in failed] == ["hash_total"], failed  # a cent: same rows, same keys, another hash
    (repair_batch, state, rows, keys, repair_run), = pipe.query_wh(
        "SELECT batch_id, state, rows, repair_keys, repair_run::text FROM tidemark_control.batches "
        "WHERE repair_of = %s", (batch_id,))
    assert (state, rows, keys, repair_run) == ("committed", 1, [[str(key)]], found_by)
    (repair_run,) = [r for r in api.runs(batch_dag) if (r["conf"] or {}).get("repair_batch")]  # operator_triggered
    assert (repair_run["conf"], repair_run["state"]) == ({"repair_batch": repair_batch}, "success"), repair_run
    assert pipe.query_wh("SELECT reconciliation FROM tidemark_control.batches WHERE batch_id = ANY(%s) ORDER BY 1",
                         ([batch_id, repair_batch],)) == [("reconciled",), ("reconciled",)]

    # the status page, as a person reaches it: the UI's nav, then the pipeline's verdict
    browser.open("/")
    browser.click(browser.text("Tidemark status"))
    _into_the_plugins_frame(browser)
    verdict = browser.wait("the pipeline's verdict link", lambda d: (browser.visible(
        By.XPATH, f"//table[@id='pipelines']//tr[td[1]/b[normalize-space(.)='{name}']]//a[@class='evidence']")
        or [None])[0])
    line = verdict.text
    assert line.startswith("found 1 difference at ") and "; repaired and reconciled at " in line, line
    browser.screenshot("ui-clicks-status-page")
    sideways = browser.driver.execute_script(
        "return document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert sideways <= 1, f"the status page scrolls sideways by {sideways} px: a long value does not wrap"
    browser.click(verdict)

    heading = browser.wait("the evidence page", lambda d: (browser.visible(By.TAG_NAME, "h2") or [None])[0])
    assert " ".join(heading.text.split()) == f"{name}: batch {batch_id}", heading.text
    assert browser.driver.find_element(By.ID, "verdict").text == line
    shown = [[td.text for td in tr.find_elements(By.TAG_NAME, "td")[:4]]
             for tr in browser.driver.find_elements(By.CSS_SELECTOR, "table#failed tr.fail")]
    assert shown == [[c, s, e, a] for c, s, e, a in failed], (shown, failed)
    table = browser.driver.find_element(By.ID, "rows")
    head = [th.text for th in table.find_elements(By.TAG_NAME, "th")]
    amount = head.index("amount")
    differing = {tuple(td.text for td in tr.find_elements(By.TAG_NAME, "td")[:4]): tr.find_elements(
        By.TAG_NAME, "td")[amount] for tr in table.find_elements(By.TAG_NAME, "tr")[1:]}
    assert sorted(differing) == [(str(key), "changed", "amount", "source"), (str(key), "changed", "amount", "target")]
    assert {side: (cell.text, cell.get_attribute("class")) for (*_, side), cell in differing.items()} == {
        "source": (str(source_amount), "differs"), "target": (str(forged), "differs")}
    browser.screenshot("ui-clicks-evidence-page")

    # the Data Docs of the run that found it, then the index: drawn here, from nothing but this machine
    history = browser.driver.find_element(By.XPATH, f"//table[@id='history']//tr[td[2]/code[normalize-space(.)="
                                                    f"'{found_by}']]")
    browser.click(browser.link("Data Docs", history))
    browser.wait("the run's Data Docs page",
                 lambda d: found_by in d.page_source and "Must have exactly" in d.page_source)
    assert browser.outside_requests() == []
    assert browser.visible(By.XPATH, "//*[contains(normalize-space(.), 'values must never be null')]"), \
        "the validation page's expectations"
    browser.screenshot("ui-clicks-data-docs-run")
    browser.driver.back()  # to the evidence page; WebDriver's Back leaves the frame: into it again
    _into_the_plugins_frame(browser)
    browser.wait("the evidence page again", lambda d: browser.visible(By.ID, "verdict"))
    browser.click(browser.link("all Data Docs"))
    browser.wait("the index's table of runs, drawn by its script", lambda d: browser.visible(
        By.XPATH, f"//tbody/tr[contains(@class, 'clickable-row') and contains(., '{found_by}')]"))
    assert browser.outside_requests() == []
    browser.screenshot("ui-clicks-data-docs-index")
    browser.driver.switch_to.default_content()

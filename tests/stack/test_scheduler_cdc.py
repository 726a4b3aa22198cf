"""A CDC pipeline as its users run it (issue 31): the real Airflow services schedule its first nightly
run, which is its handoff batch (the extract runs as the replication connection `tidemark_cdc` and
creates the slot with its snapshot); the `tidemark_supervisor` DAG, on its own schedule, starts the
standing sink, waits for the committed handoff, then creates the connector on that slot; a change
made at the source after it reaches the serving view.

Then the doors a person uses, in headless Chromium: `tidemark_stream_control`'s form pauses the
capture (the supervisor's next cycle pauses the connector; a change made meanwhile waits in the slot)
and resumes it (the change arrives); the CDC DAG's Trigger button runs its next nightly batch, which
is not a handoff and takes the delete the stream learned out of the batch target, audited; and the
form's `resnapshot` starts the stream over from a new handoff batch.

Its own Airflow services over a pipelines directory of its own (the module of test_scheduler.py
would otherwise run this pipeline's standing sink through all its tests). The tests run in order:
each goes on from the state the one before left.
"""

from __future__ import annotations

import urllib.request

import pytest
from selenium.webdriver.common.by import By
from ui_driver import Browser

from tidemark import ledger
from tidemark.protocol.config import CONN_CDC
from tidemark.protocol.kafka_io import end_offsets
from tidemark.realtime.cdc.connect import ConnectClient
from tidemark.realtime.cdc.groups import connector_name
from tidemark.streams.launch import LocalLauncher
from tidemark_workshop.stack.airflow import AirflowUI, RestApi
from tidemark_workshop.stack.cdcrun import grant, make_cdc_pipeline, read_slot, remove_capture
from tidemark_workshop.stack.proc import StackError

pytestmark = pytest.mark.stack
SUPERVISOR, CONTROL = "tidemark_supervisor", "tidemark_stream_control"


@pytest.fixture(scope="module")
def scheduled_cdc(settings, tmp_path_factory):
    pipelines = tmp_path_factory.mktemp("cdc-pipelines")
    pipe = make_cdc_pipeline(settings, pipelines)
    src = pipe.src()
    with src, src.cursor() as cur:
        cur.execute(f"INSERT INTO {pipe.spec.table} (id, amount, updated_at) SELECT g, g / 100.0, "
                    "now() - interval '1 hour' FROM generate_series(1, 500) g")
    src.close()
    grant(settings, pipe.spec)  # the DBA's statements, once
    ui = AirflowUI(settings)
    ui.stop()
    ui.start({"TIDEMARK_PIPELINES_DIR": str(pipelines), "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
              "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5"})
    api = RestApi(ui.url, timeout_s=600)
    dag_id = f"tidemark_batch_{pipe.spec.name}"
    try:
        ui.wait_healthy()
        for dag in (dag_id, SUPERVISOR, CONTROL):
            api.wait_for(f"{dag} to be parsed", lambda d=dag: api.exists(d), timeout_s=180)
        with Browser(ui.url, settings.state_dir / "screenshots") as browser:
            yield api, pipe, browser
    finally:
        try:
            for dag in (SUPERVISOR, dag_id):
                api.call("PATCH", f"/dags/{dag}", {"is_paused": True})
        finally:
            ui.stop()
            LocalLauncher(settings.state_dir / "streams").kill(pipe.spec.name)  # TIDEMARK_STREAMS_DIR of the services
            remove_capture(settings, pipe.spec)


@pytest.fixture
def browser(scheduled_cdc, request):
    """The module's browser; when a test fails, what the page showed is kept beside the screenshots."""
    *_, browser = scheduled_cdc
    failed = request.session.testsfailed
    yield browser
    if request.session.testsfailed > failed:
        browser.screenshot(f"scheduler-cdc-{request.node.name}-failed")
        browser.dump(f"scheduler-cdc-{request.node.name}-failed")


def test_the_first_scheduled_run_hands_off_and_the_supervisor_dag_then_streams_from_its_slot(scheduled_cdc, settings):
    api, pipe, _ = scheduled_cdc
    spec, name = pipe.spec, pipe.spec.name
    dag_id = f"tidemark_batch_{name}"
    client = ConnectClient(settings.connect_url)
    api.call("PATCH", f"/dags/{SUPERVISOR}", {"is_paused": False})  # a cycle every minute
    api.trigger(SUPERVISOR)
    api.call("PATCH", f"/dags/{dag_id}", {"is_paused": False})
    run_id = api.wait_for("the scheduled run", lambda: api.runs(dag_id, run_type="scheduled"))[0]["dag_run_id"]
    run = api.wait_finished(dag_id, run_id)
    assert run["state"] == "success", api.task_states(dag_id, run_id)
    assert f"the CDC handoff batch: extracting as connection {CONN_CDC}" in api.log_text(dag_id, run_id,
                                                                                          "extract", 1)
    handoff = pipe.query_wh("SELECT h.batch_id FROM tidemark_control.cdc_handoffs h JOIN tidemark_control.batches "
                            "b USING (batch_id) WHERE b.pipeline = %s AND b.state = 'committed'", (name,))
    assert handoff == [(ledger.batch_id_for(name, run_id),)]
    assert pipe.query_wh(f"SELECT count(*) FROM {spec.target_table}") == [(500,)]

    api.wait_for("the supervisor DAG to create the connector on the handoff's slot",
                 lambda: client.state(connector_name(spec)).running
                 and (s := read_slot(settings, spec)) is not None and s.active, timeout_s=300)
    with urllib.request.urlopen(f"{api.url}/tidemark/", timeout=60) as page:  # the status page, as a person opens it
        html = page.read().decode()
    assert f"connector {connector_name(spec)} RUNNING, task 0 RUNNING; handoff {handoff[0][0]}" in html, html[-3000:]
    src = pipe.src()
    with src, src.cursor() as cur:
        cur.execute(f"UPDATE {spec.table} SET amount = 12.34, updated_at = now() WHERE id = 7")
        cur.execute(f"DELETE FROM {spec.table} WHERE id = 8")
    src.close()
    api.wait_for("the update and the delete in the serving view", lambda: pipe.query_wh(
        f"SELECT id, amount::text FROM {spec.cdc.serving_view} WHERE id IN (7, 8)") == [(7, "12.34")],
        timeout_s=180)


def _control(api: RestApi, browser: Browser, pipeline: str, action: str, reason: str) -> str:
    """``tidemark_stream_control``'s Trigger form filled and clicked as a person does; the run it made
    succeeds. Who clicked, as Airflow names them."""
    before = {r["dag_run_id"] for r in api.runs(CONTROL)}
    dialog = browser.trigger_dialog(CONTROL)
    browser.choose(browser.field_root("pipeline", dialog), pipeline)  # a select of the standing pipelines
    field = browser.field_root("action", dialog)
    if action != "pause":  # the select's default
        browser.choose(field, action)
    assert field.find_element(By.NAME, "element_action").get_attribute("value") == action
    browser.type_into(browser.field("reason", dialog), reason)
    submit = browser.button("Trigger", dialog)
    browser.wait("the Trigger button to enable", lambda d: submit.is_enabled(), timeout_s=10)
    browser.screenshot(f"scheduler-cdc-{action}")
    browser.click(submit)
    browser.text("Dag Run Triggered")
    new, = api.wait_for("the run the click made", lambda: [
        r for r in api.runs(CONTROL) if r["dag_run_id"] not in before], timeout_s=30)
    assert new["conf"] == {"pipeline": pipeline, "action": action, "reason": reason}, new["conf"]
    run = api.wait_finished(CONTROL, new["dag_run_id"], timeout_s=180)
    assert run["state"] == "success", api.log_text(CONTROL, run["dag_run_id"], "apply", 1)[-3000:]
    api.trigger(SUPERVISOR)  # its next cycle now, not at the next minute (the wait, not the outcome, shortens)
    return run["triggering_user_name"]


def _last_event(pipe) -> int:
    return pipe.query_wh("SELECT coalesce(max(id), 0) FROM tidemark_control.stream_events WHERE pipeline = %s",
                         (pipe.spec.name,))[0][0]


def _at_source(pipe, sql: str) -> None:
    src = pipe.src()
    try:
        with src, src.cursor() as cur:
            cur.execute(sql)
    finally:
        src.close()


def _amount(pipe, key: int) -> list[tuple]:
    return pipe.query_wh(f"SELECT amount::text FROM {pipe.spec.cdc.serving_view} WHERE id = %s", (key,))


def test_pause_and_resume_clicked_in_the_stream_control_form_pause_and_resume_the_capture(scheduled_cdc, browser,
                                                                                          settings):
    """The supervisor's next cycle follows what the form asked: the connector PAUSED, and a change
    made at the source meanwhile stays in the slot until the resume, then arrives."""
    api, pipe, _ = scheduled_cdc
    spec, name, connector = pipe.spec, pipe.spec.name, connector_name(pipe.spec)
    client = ConnectClient(settings.connect_url)
    assert client.state(connector).running, "the test before leaves the capture streaming"
    asked = _last_event(pipe)

    who = _control(api, browser, name, "pause", "source maintenance")
    api.wait_for("the supervisor's next cycle to pause the connector",
                 lambda: client.state(connector).state == "PAUSED", timeout_s=240)
    captured = end_offsets(settings.kafka_bootstrap, spec.cdc_topic)
    _at_source(pipe, f"UPDATE {spec.table} SET amount = 56.78, updated_at = now() WHERE id = 9")
    # Unpaused, Debezium puts a change on its topic within half a second here: 10 s without it shows
    # the connector's pause holds (the sink's own pause would hide it from the view either way).
    with pytest.raises(StackError, match="timed out"):
        api.wait_for("the paused change on the topic (it must not come)",
                     lambda: end_offsets(settings.kafka_bootstrap, spec.cdc_topic) != captured, timeout_s=10)

    assert _control(api, browser, name, "resume", "maintenance over") == who
    api.wait_for("the supervisor's next cycle to resume the connector",
                 lambda: client.state(connector).running, timeout_s=240)
    api.wait_for("the change made while paused in the serving view", lambda: _amount(pipe, 9) == [("56.78",)],
                 timeout_s=180)
    events = pipe.query_wh("SELECT kind, actor, detail FROM tidemark_control.stream_events WHERE pipeline = %s "
                           "AND id > %s AND kind IN ('desired', 'connector_pause', 'connector_resume') ORDER BY id",
                           (name, asked))
    assert [(kind, actor) for kind, actor, _ in events] == [
        ("desired", who), ("connector_pause", "supervisor"), ("desired", who), ("connector_resume", "supervisor")
    ], events
    assert who not in (None, "", "unknown", "supervisor"), events
    assert (events[0][2], events[2][2]) == ("running -> paused: source maintenance",
                                            "paused -> running: maintenance over"), events


def test_the_trigger_button_runs_the_next_nightly_batch_which_takes_the_streamed_delete_out_of_the_target(
        scheduled_cdc, browser):
    """Not a handoff (the slot streams); its commit corrects the speed layer: the row deleted at the
    source (id 8, in the first test) leaves the batch target and is kept in cdc_batch_deletions."""
    api, pipe, _ = scheduled_cdc
    spec, name = pipe.spec, pipe.spec.name
    dag_id = f"tidemark_batch_{name}"
    assert pipe.query_wh(f"SELECT count(*) FROM {spec.target_table} WHERE id = 8") == [(1,)]
    before = {r["dag_run_id"] for r in api.runs(dag_id)}

    dialog = browser.trigger_dialog(dag_id)
    submit = browser.button("Trigger", dialog)
    assert submit.is_enabled(), "the form's defaults are a nightly load"
    browser.click(submit)
    browser.text("Dag Run Triggered")
    new, = api.wait_for("the run the click made", lambda: [
        r for r in api.runs(dag_id) if r["dag_run_id"] not in before], timeout_s=30)
    assert new["run_type"] == "manual" and new["conf"] == {"repair_batch": None}, new
    run = api.wait_finished(dag_id, new["dag_run_id"])
    assert run["state"] == "success", api.task_states(dag_id, run["dag_run_id"])

    batch_id = ledger.batch_id_for(name, run["dag_run_id"])
    assert pipe.query_wh("SELECT state, handoff FROM tidemark_control.batches WHERE batch_id = %s",
                         (batch_id,)) == [("committed", False)]
    assert pipe.query_wh(f"SELECT count(*) FROM {spec.target_table} WHERE id = 8") == [(0,)]
    assert pipe.query_wh("SELECT old_values->>'id' FROM tidemark_control.cdc_batch_deletions WHERE batch_id = %s",
                         (batch_id,)) == [("8",)]
    columns = "id, amount, updated_at"
    source = sorted(tuple(r) for r in _source_rows(pipe, columns))
    assert sorted(pipe.query_wh(f"SELECT {columns} FROM {spec.cdc.serving_view}")) == source


def test_a_resnapshot_asked_for_in_the_form_starts_the_stream_over_from_a_new_handoff(scheduled_cdc, browser,
                                                                                     settings):
    """`resnapshot` in the stream control form: the supervisor stops the connector, the next batch run
    is a new handoff (its slot made again, past the old one's position, with a snapshot that holds the
    change made while nothing streamed), then the supervisor resumes the connector on the new slot."""
    api, pipe, _ = scheduled_cdc
    spec, name, connector = pipe.spec, pipe.spec.name, connector_name(pipe.spec)
    dag_id = f"tidemark_batch_{name}"
    client = ConnectClient(settings.connect_url)
    api.wait_for("the capture streaming", lambda: client.state(connector).running, timeout_s=120)
    wh = pipe.wh()
    with wh, wh.cursor() as cur:
        old = ledger.committed_handoff(cur, name)
    wh.close()
    asked = _last_event(pipe)

    who = _control(api, browser, name, "resnapshot", "suspected drift")
    wh = pipe.wh()
    with wh, wh.cursor() as cur:
        assert ledger.resnapshot_asked(cur, name).actor == who, "the form's request waits for a handoff"
    wh.close()
    api.wait_for("the supervisor's next cycle to stop the connector",
                 lambda: client.state(connector).state == "STOPPED", timeout_s=240)
    # nothing streams it: the new handoff's snapshot has it
    _at_source(pipe, f"UPDATE {spec.table} SET amount = 90.12, updated_at = now() WHERE id = 10")
    run_id = api.trigger(dag_id)  # the next batch run (the Trigger button is the test above's)
    run = api.wait_finished(dag_id, run_id)
    assert run["state"] == "success", api.task_states(dag_id, run_id)
    batch_id = ledger.batch_id_for(name, run_id)
    assert pipe.query_wh("SELECT state, handoff FROM tidemark_control.batches WHERE batch_id = %s",
                         (batch_id,)) == [("committed", True)]
    wh = pipe.wh()
    with wh, wh.cursor() as cur:
        new = ledger.committed_handoff(cur, name)
        assert ledger.resnapshot_asked(cur, name) is None, "the committed handoff answers the request"
    wh.close()
    assert new.batch_id == batch_id and new.slot == old.slot
    assert pipe.query_wh("SELECT %s::pg_lsn > %s::pg_lsn", (new.consistent_point, old.consistent_point)) == [(True,)]
    assert _amount(pipe, 10) == [("90.12",)]

    api.wait_for("the supervisor's next cycle to resume the connector on the new slot",
                 lambda: client.state(connector).running and (s := read_slot(settings, spec)) is not None and s.active,
                 timeout_s=240)
    _at_source(pipe, f"UPDATE {spec.table} SET amount = 34.56, updated_at = now() WHERE id = 11")
    api.wait_for("a change after the new handoff in the serving view", lambda: _amount(pipe, 11) == [("34.56",)],
                 timeout_s=180)
    events = pipe.query_wh("SELECT kind, actor, detail FROM tidemark_control.stream_events WHERE pipeline = %s "
                           "AND id > %s AND kind IN ('resnapshot', 'connector_stop', 'connector_resume') ORDER BY id",
                           (name, asked))
    assert events == [("resnapshot", who, "suspected drift"),
                      ("connector_stop", "supervisor", f"a re-snapshot asked for by {who}"),
                      ("connector_resume", "supervisor", "stopped, but desired running")], events
    columns = "id, amount, updated_at"
    assert sorted(pipe.query_wh(f"SELECT {columns} FROM {spec.cdc.serving_view}")) == sorted(
        _source_rows(pipe, columns))

def _source_rows(pipe, columns: str) -> list[tuple]:
    src = pipe.src()
    try:
        with src, src.cursor() as cur:
            cur.execute(f"SELECT {columns} FROM {pipe.spec.table}")
            return cur.fetchall()
    finally:
        src.close()

"""A CDC pipeline as its users run it (issue 31): the real Airflow services schedule its first nightly
run, which is its handoff batch (the extract runs as the replication connection `tidemark_cdc` and
creates the slot with its snapshot); the `tidemark_supervisor` DAG, on its own schedule, starts the
standing sink, waits for the committed handoff, then creates the connector on that slot; a change
made at the source after it reaches the serving view.

Its own Airflow services over a pipelines directory of its own (the module of test_scheduler.py
would otherwise run this pipeline's standing sink through all its tests).
"""

from __future__ import annotations

import urllib.request

import pytest

from tidemark import ledger
from tidemark.cdc.connect import ConnectClient
from tidemark.cdc.connector import connector_name
from tidemark.config import CONN_CDC
from tidemark.streams.launch import LocalLauncher
from tidemark_workshop.stack.airflow import AirflowUI, RestApi
from tidemark_workshop.stack.cdcrun import grant, make_cdc_pipeline, read_slot, remove_capture

pytestmark = pytest.mark.stack


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
    try:
        ui.wait_healthy()
        api = RestApi(ui.url, timeout_s=600)
        dag_id = f"tidemark_batch_{pipe.spec.name}"
        api.wait_for(f"{dag_id} to be parsed", lambda: api.exists(dag_id), timeout_s=180)
        yield api, pipe
    finally:
        ui.stop()
        remove_capture(settings, pipe.spec)


def test_the_first_scheduled_run_hands_off_and_the_supervisor_dag_then_streams_from_its_slot(scheduled_cdc, settings):
    api, pipe = scheduled_cdc
    spec, name = pipe.spec, pipe.spec.name
    dag_id = f"tidemark_batch_{name}"
    launcher = LocalLauncher(settings.state_dir / "streams")  # TIDEMARK_STREAMS_DIR of the stack's services
    client = ConnectClient(settings.connect_url)
    try:
        api.call("PATCH", "/dags/tidemark_supervisor", {"is_paused": False})  # a cycle every minute
        api.trigger("tidemark_supervisor")
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
    finally:
        api.call("PATCH", "/dags/tidemark_supervisor", {"is_paused": True})
        api.call("PATCH", f"/dags/{dag_id}", {"is_paused": True})
        launcher.kill(name)

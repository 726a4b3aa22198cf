"""Scale-out mode, run rather than parsed: a real Spark standalone master and worker (started from
the PySpark distribution on 127.0.0.1), a nightly batch whose extract and sink run on it, and a
standing sink whose driver the supervisor launches on it in cluster mode, then finds, restarts
and sees stop through the master alone.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import urllib.request

import pytest

from tidemark import ledger
from tidemark.spark import jobs
from tidemark.streams.standalone import StandaloneLauncher
from tidemark.streams.cycle import run_cycle
from tidemark_workshop.stack.batchrun import PAYMENTS_DDL, insert_payments, make_pipeline, until
from tidemark_workshop.stack.spark import UDF_JAR, StandaloneCluster, submit_command

from test_supervisor import STANDING, _batch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(settings, tmp_path_factory):
    with StandaloneCluster(settings, tmp_path_factory.mktemp("spark-standalone"), port=_free_port(),
                           ui_port=_free_port(), worker_ui_ports=[_free_port()]) as running:
        yield running


def _master(cluster) -> dict:
    with urllib.request.urlopen(f"{cluster.master_ui}/json/", timeout=10) as response:
        return json.load(response)


def test_a_nightly_batch_runs_end_to_end_on_a_standalone_cluster(settings, cluster, tmp_path):
    on_cluster = dataclasses.replace(settings, spark_master=cluster.master)
    pipe = make_pipeline(on_cluster, tmp_path, PAYMENTS_DDL)
    before = {app["id"] for app in _master(cluster)["completedapps"]}
    insert_payments(pipe, 1, 120)
    plan, attempt = pipe.run("run-1")  # plan, BEGIN, extract, END, sink: asserts committed
    source = pipe.rows("source", "amount, updated_at")
    assert len(source) == 120 and pipe.rows("target", "amount, updated_at") == source
    apps = [app for app in _master(cluster)["completedapps"] if app["id"] not in before]
    assert len(apps) == 2 and all(app["state"] == "FINISHED" for app in apps), apps  # the extract and the sink
    assert all(job.args[job.args.index("--master") + 1] == cluster.master for job in pipe.jobs)


def test_the_supervisor_runs_a_standing_sink_in_cluster_mode_and_restarts_it_through_the_master(
        settings, cluster, tmp_path):
    on_cluster = dataclasses.replace(settings, spark_master=cluster.master)
    pipe = make_pipeline(on_cluster, tmp_path, PAYMENTS_DDL, sink=STANDING)
    name = pipe.spec.name
    venv = settings.venv / "bin"
    launcher = StandaloneLauncher(tmp_path / "streams", cluster.master, cluster.master_ui,
                                  str(settings.spark_jars_dir / UDF_JAR), str(venv / "python"),
                                  spark_class=str(venv / "spark-class"))

    def command(spec):  # the client-mode command, as for the local launcher; the launcher moves the driver
        return submit_command(on_cluster, jobs.SINK_JOB, pipe.sink_args(available_now=False),
                              secret=settings.pg_password)

    wh = pipe.wh()
    try:
        def cycle():
            return run_cycle([pipe.spec], wh, launcher, settings.kafka_bootstrap, command)

        report = cycle()
        assert report.decisions[name].action == "start", report.lines
        first = launcher.status(name)
        assert first.alive and first.driver.startswith("driver-") and first.pid is None
        assert f"driver {first.driver}" in report.lines[0]
        driver = next(d for d in _master(cluster)["activedrivers"] if d["id"] == first.driver)
        assert driver["mainclass"] == "org.apache.spark.deploy.PythonRunner"  # the driver runs on the worker
        plan, attempt = _batch(pipe, "run-1", 1, 40)  # the extract, on the cluster too
        until("the cluster's standing sink to commit batch 1", lambda: pipe.state(plan.batch_id, attempt) == "committed")

        launcher.kill(name)  # through the master: Client kill
        dead = launcher.status(name)
        assert not dead.alive and dead.exit_code == 137, dead
        assert cycle().decisions[name].action == "restart"
        second = launcher.status(name)
        assert second.alive and second.driver != first.driver
        plan2, attempt2 = _batch(pipe, "run-2", 41, 70)
        until("the restarted sink to commit batch 2", lambda: pipe.state(plan2.batch_id, attempt2) == "committed")

        with wh, wh.cursor() as cur:
            ledger.set_desired(cur, name, "paused", "test", "maintenance")
        until("the driver to stop itself", lambda: not launcher.status(name).alive, timeout=120, every=1)
        assert launcher.status(name).exit_code == 0, launcher.log_tail(name, 40)  # FINISHED: a graceful stop
        assert "batch_sink" in launcher.log_tail(name, 400)  # the driver's own log, read from its worker
        assert cycle().decisions[name].action == "none"
        source = pipe.rows("source", "amount, updated_at")
        assert len(source) == 70 and pipe.rows("target", "amount, updated_at") == source
    finally:
        launcher.kill(name)
        wh.close()


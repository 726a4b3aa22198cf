"""Which launcher the supervisor DAG uses follows the ``tidemark_spark`` connection, resolved the way
the Spark provider's operator resolves it (no services needed)."""

from __future__ import annotations

import json

from tidemark.streams.launch import LocalLauncher
from tidemark.streams.standalone import StandaloneLauncher


def _spark_conn(monkeypatch, **conn):
    monkeypatch.setenv("AIRFLOW_CONN_TIDEMARK_SPARK", json.dumps({"conn_type": "spark", **conn}))
    monkeypatch.setenv("TIDEMARK_SPARK_JARS", "/j/postgresql.jar,/j/tidemark-udf.jar")


def test_a_standalone_master_in_cluster_mode_runs_sinks_on_the_cluster(monkeypatch, tmp_path):
    from tidemark_airflow.streams import launcher

    monkeypatch.setenv("TIDEMARK_STREAMS_DIR", str(tmp_path))
    _spark_conn(monkeypatch, host="spark://10.1.2.3", port=7077, extra={"deploy-mode": "cluster", "python": "/opt/py"})
    chosen = launcher()
    assert isinstance(chosen, StandaloneLauncher)
    assert (chosen.master, chosen.master_ui, chosen.runner_jar, chosen.python) == (
        "spark://10.1.2.3:7077", "http://10.1.2.3:8080", "/j/tidemark-udf.jar", "/opt/py")


def test_local_mode_and_client_mode_run_sinks_on_this_machine(monkeypatch, tmp_path):
    from tidemark_airflow.streams import launcher

    monkeypatch.setenv("TIDEMARK_STREAMS_DIR", str(tmp_path))
    _spark_conn(monkeypatch, host="local[2]")
    assert isinstance(launcher(), LocalLauncher)
    _spark_conn(monkeypatch, host="spark://10.1.2.3", port=7077, extra={"deploy-mode": "client"})
    assert isinstance(launcher(), LocalLauncher)

"""One way to connect (``tidemark_airflow.hooks``): every connection through Tidemark's hooks, and a
standing sink's spark-submit built as the Spark provider's operator builds a batch job's."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

from tidemark_airflow.hooks import KafkaHook, SparkHook

ROOT = Path(__file__).resolve().parents[2]
SPARK = {
    "local": {"conn_type": "spark", "host": "local[2]"},
    "standalone cluster": {"conn_type": "spark", "host": "spark://spark-master", "port": 7077,
                           "extra": {"deploy-mode": "cluster"}},
    "host without scheme": {"conn_type": "spark", "host": "10.0.0.5", "port": 7077},
    "yarn with a queue": {"conn_type": "spark", "host": "yarn", "extra": {"queue": "etl", "deploy-mode": "client",
                                                                          "spark-binary": "spark3-submit"}},
}


@pytest.mark.parametrize("name", sorted(SPARK))
def test_a_standing_sinks_command_is_the_one_the_providers_operator_builds(name, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_TIDEMARK_SPARK", json.dumps(SPARK[name]))
    job = {"conf": {"spark.ui.enabled": "false", "spark.executorEnv.TZ": "UTC"}, "name": "tidemark-stream-p",
           "driver_memory": "1g", "jars": "/j/a.jar,/j/tidemark-udf.jar", "application_args": ["--spec", "p.yaml"]}
    theirs = SparkSubmitHook(conn_id="tidemark_spark", **job)._build_spark_submit_command("batch_sink.py")  # the oracle
    assert SparkHook().submit_command("batch_sink.py", **job) == theirs


def test_the_spark_hook_says_where_a_sink_runs_and_refuses_what_it_cannot_honour(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_TIDEMARK_SPARK", json.dumps(SPARK["standalone cluster"]))
    cluster = SparkHook().cluster()
    assert cluster.master == "spark://spark-master:7077" and cluster.standalone_cluster
    monkeypatch.setenv("AIRFLOW_CONN_TIDEMARK_SPARK", json.dumps(SPARK["local"]))
    assert not SparkHook().cluster().standalone_cluster
    monkeypatch.setenv("AIRFLOW_CONN_TIDEMARK_SPARK", json.dumps({**SPARK["local"], "extra": {"keytab": "eA=="}}))
    assert SparkHook().cluster().master == "local[2]"  # the status page and batch jobs: the provider honours it
    with pytest.raises(ValueError, match="extra keytab is not supported for a standing sink"):
        SparkHook().cluster(standing=True)


def test_the_kafka_hook_names_a_missing_bootstrap(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_TIDEMARK_KAFKA", json.dumps({"conn_type": "kafka", "extra": {}}))
    with pytest.raises(ValueError, match="tidemark_kafka has no 'bootstrap.servers'"):
        KafkaHook().bootstrap()
    monkeypatch.setenv("AIRFLOW_CONN_TIDEMARK_KAFKA",
                       json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": "127.0.0.1:29092"}}))
    assert KafkaHook().bootstrap() == "127.0.0.1:29092"


def test_no_dag_or_plugin_module_connects_another_way():
    """Connections are resolved in ``hooks.py`` alone: no ``Connection.get``, no other hook of a provider for a
    connection, no template reading a connection, no private attribute of the Spark provider."""
    other = re.compile(r"Connection\.get\(|PostgresHook|KafkaBaseHook|\{\{\s*conn\.|\._connection\b|"
                       r"_build_spark_submit_command|_resolve_connection")
    found = {str(p.relative_to(ROOT)): other.findall(p.read_text())
             for folder in ("dags", "plugins") for p in (ROOT / folder).rglob("*.py")
             if p.name != "hooks.py" and other.search(p.read_text())}
    assert found == {}

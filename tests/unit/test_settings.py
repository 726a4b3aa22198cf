import json

import pytest

from tidemark_workshop.settings import CONNECTION_IDS, Settings


def test_ports_and_paths_come_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("TIDEMARK_STATE_DIR", str(tmp_path / "other"))
    monkeypatch.setenv("TIDEMARK_PG_PORT", "6543")
    monkeypatch.setenv("TIDEMARK_KAFKA_PORT", "19092")
    for name in ("TIDEMARK_KAFKA_NODES", "TIDEMARK_SPARK_WORKERS", "TIDEMARK_SPARK_MASTER"):
        monkeypatch.delenv(name, raising=False)
    s = Settings.from_env()
    assert s.state_dir == (tmp_path / "other").resolve()
    assert s.pg_port == 6543 and s.kafka_bootstrap == "127.0.0.1:19092"
    env = s.runtime_env()
    assert env["AIRFLOW_HOME"] == str(tmp_path / "other" / "airflow")
    assert ":6543/airflow" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]


def test_a_replicated_stack_lists_every_kafka_node_and_runs_spark_on_its_own_master(monkeypatch):
    monkeypatch.setenv("TIDEMARK_KAFKA_PORT", "19092")
    monkeypatch.setenv("TIDEMARK_KAFKA_CONTROLLER_PORT", "19093")
    monkeypatch.setenv("TIDEMARK_KAFKA_NODES", "3")
    monkeypatch.setenv("TIDEMARK_SPARK_WORKERS", "2")
    monkeypatch.delenv("TIDEMARK_SPARK_MASTER", raising=False)
    s = Settings.from_env()
    assert s.kafka_bootstrap == "127.0.0.1:19092,127.0.0.1:19094,127.0.0.1:19096"
    assert s.kafka_node_ports(3) == (19096, 19097)
    assert s.spark_master == "spark://127.0.0.1:27077" and s.spark_workers == 2
    assert json.loads(s.airflow_connections()["AIRFLOW_CONN_TIDEMARK_KAFKA"])["extra"]["bootstrap.servers"] == \
        s.kafka_bootstrap
    for name, value in (("TIDEMARK_KAFKA_NODES", "0"), ("TIDEMARK_KAFKA_NODES", "6"), ("TIDEMARK_SPARK_WORKERS", "x")):
        monkeypatch.setenv(name, value)
        with pytest.raises(ValueError, match=f"{name}=.* is not a whole number"):
            Settings.from_env()
        monkeypatch.setenv(name, "1")


def test_the_source_database_comes_from_the_environment_and_is_a_plain_name(monkeypatch):
    monkeypatch.setenv("TIDEMARK_SOURCE_DB", "tidemark_source_gw1")
    conns = Settings.from_env().airflow_connections()
    assert {json.loads(conns[f"AIRFLOW_CONN_{c}"])["schema"] for c in ("TIDEMARK_SOURCE", "TIDEMARK_CDC")} == {
        "tidemark_source_gw1"}
    monkeypatch.setenv("TIDEMARK_SOURCE_DB", 'source"; DROP DATABASE x; --')
    with pytest.raises(ValueError, match="TIDEMARK_SOURCE_DB=.* is not a database name"):
        Settings.from_env()


@pytest.mark.parametrize("value", ["abc", "0", "70000", "-1"])
def test_a_bad_port_names_the_variable(monkeypatch, value):
    monkeypatch.setenv("TIDEMARK_PG_PORT", value)
    with pytest.raises(ValueError, match="TIDEMARK_PG_PORT"):
        Settings.from_env()


def test_connections_are_json_with_the_shared_ids(monkeypatch):
    monkeypatch.delenv("TIDEMARK_SOURCE_DB", raising=False)  # a make test lane sets its own
    monkeypatch.setenv("TIDEMARK_PG_PASSWORD", "s3cret")
    monkeypatch.setenv("TIDEMARK_SOURCE_PASSWORD", "r3ader")
    conns = Settings.from_env().airflow_connections()
    assert set(conns) == {f"AIRFLOW_CONN_{c.upper()}" for c in CONNECTION_IDS}
    source = json.loads(conns["AIRFLOW_CONN_TIDEMARK_SOURCE"])
    assert source["conn_type"] == "postgres" and source["schema"] == "tidemark_source"
    assert (source["login"], source["password"]) == ("tidemark_reader", "r3ader")  # read-only role
    warehouse = json.loads(conns["AIRFLOW_CONN_TIDEMARK_WAREHOUSE"])
    assert (warehouse["login"], warehouse["password"]) == ("tidemark", "s3cret")
    assert json.loads(conns["AIRFLOW_CONN_TIDEMARK_SPARK"])["host"] == "local[2]"


def test_a_job_s_database_defaults_the_port_like_an_airflow_connection_without_one():
    from tidemark.spark.jobs import PASSWORD_ENV, database_args

    assert database_args("warehouse.internal", None, "tidemark_warehouse", "tidemark") == [
        "--database", "host=warehouse.internal port=5432 dbname=tidemark_warehouse", "--user", "tidemark",
        "--password-env", PASSWORD_ENV]
    assert database_args("127.0.0.1", 25432, "src", "u")[1] == "host=127.0.0.1 port=25432 dbname=src"


def test_default_ports_are_below_the_ephemeral_range(monkeypatch):
    """A broker restarted while clients retry must find its port free: an outgoing connection can
    take any port of the ephemeral range as its own (even connect to itself on it)."""
    from pathlib import Path

    for name in ("TIDEMARK_PG_PORT", "TIDEMARK_KAFKA_PORT", "TIDEMARK_KAFKA_CONTROLLER_PORT", "TIDEMARK_AIRFLOW_PORT"):
        monkeypatch.delenv(name, raising=False)
    s = Settings.from_env()
    ranges = Path("/proc/sys/net/ipv4/ip_local_port_range")
    low = int(ranges.read_text().split()[0]) if ranges.exists() else 32768
    for port in (s.pg_port, s.kafka_port, s.kafka_controller_port, s.airflow_port):
        assert 1024 < port < low, f"port {port} is inside the ephemeral range starting at {low}"


def test_local_spark_jobs_start_quickly_unless_a_benchmark_turns_it_off(monkeypatch, tmp_path):
    monkeypatch.setenv("TIDEMARK_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("SPARK_SUBMIT_OPTS", "-Dkeep=me")
    monkeypatch.delenv("TIDEMARK_SPARK_QUICK_START", raising=False)
    settings = Settings.from_env()
    assert settings.runtime_env()["SPARK_SUBMIT_OPTS"] == "-Dkeep=me -XX:TieredStopAtLevel=1"
    settings.spark_class_archive.parent.mkdir(parents=True)
    settings.spark_class_archive.write_bytes(b"")  # once make up has dumped it, jobs map it
    archive = f"-XX:SharedArchiveFile={settings.spark_class_archive}"
    assert settings.runtime_env()["SPARK_SUBMIT_OPTS"] == f"-Dkeep=me -XX:TieredStopAtLevel=1 {archive}"
    monkeypatch.setenv("SPARK_SUBMIT_OPTS", f"-XX:TieredStopAtLevel=1 {archive}")  # a nested run adds nothing
    assert settings.runtime_env()["SPARK_SUBMIT_OPTS"] == f"-XX:TieredStopAtLevel=1 {archive}"
    monkeypatch.setenv("TIDEMARK_SPARK_QUICK_START", "0")
    monkeypatch.delenv("SPARK_SUBMIT_OPTS")
    assert "SPARK_SUBMIT_OPTS" not in Settings.from_env().runtime_env()

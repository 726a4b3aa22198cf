"""docker-compose.yaml: no engine runs here, so check what can be checked without one."""

from __future__ import annotations

import re

import pytest
import yaml

from tidemark_workshop.settings import CONNECTION_IDS, REPO_ROOT, Settings

COMPOSE = REPO_ROOT / "docker-compose.yaml"
AIRFLOW_SERVICES = {"airflow-api-server", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer", "airflow-init"}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_has_the_scale_out_services(compose):
    services = set(compose["services"])
    assert {"postgres", "kafka", "spark-master", "spark-worker"} | AIRFLOW_SERVICES <= services


def test_every_long_running_service_has_a_healthcheck(compose):
    for name, svc in compose["services"].items():
        if name == "airflow-init":
            continue  # one-shot: it exits
        assert "healthcheck" in svc, f"service {name} has no healthcheck"
        assert svc["healthcheck"].get("test"), f"service {name}: empty healthcheck"


def test_airflow_services_share_one_environment_anchor(compose):
    """Every Airflow service has the whole common environment (airflow-init adds the UI's passwords,
    which only it needs)."""
    envs = {name: compose["services"][name].get("environment") for name in AIRFLOW_SERVICES}
    assert all(env is not None for env in envs.values())
    common = compose["services"]["airflow-scheduler"]["environment"]
    for name, env in envs.items():
        for key, value in common.items():
            assert env.get(key) == value, f"{name}: {key}"
        extra = set(env) - set(common)
        assert extra <= ({"TIDEMARK_UI_PASSWORDS"} if name == "airflow-init" else set()), f"{name}: {extra}"


def test_connection_names_match_the_local_stack(compose):
    env = compose["services"]["airflow-scheduler"]["environment"]
    compose_conns = {k for k in env if k.startswith("AIRFLOW_CONN_")}
    local_conns = set(Settings.from_env().airflow_connections())
    assert compose_conns == local_conns
    assert local_conns == {f"AIRFLOW_CONN_{c.upper()}" for c in CONNECTION_IDS}


def test_shared_tidemark_variables_match_the_local_stack(compose):
    env = compose["services"]["airflow-scheduler"]["environment"]
    local = Settings.from_env().runtime_env()
    for key in ("TIDEMARK_KAFKA_BOOTSTRAP", "TIDEMARK_SPARK_MASTER", "AIRFLOW__CORE__LOAD_EXAMPLES",
                "AIRFLOW__CORE__EXECUTOR", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__CORE__EXECUTION_API_SERVER_URL"):
        assert key in env and key in local, key


def test_no_secret_is_written_literally(compose):
    text = COMPOSE.read_text()
    for match in re.finditer(r'"password":\s*"([^"]*)"', text):
        assert match.group(1).startswith("${"), f"literal password in compose: {match.group(0)}"


def test_the_shared_ui_requires_a_login_with_passwords_from_the_environment(compose):
    env = compose["services"]["airflow-api-server"]["environment"]
    assert str(env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"]).lower() == "false"
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"].startswith("${TIDEMARK_UI_USERS")
    init = compose["services"]["airflow-init"]
    assert init["environment"]["TIDEMARK_UI_PASSWORDS"].startswith("${TIDEMARK_UI_PASSWORDS:?")
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"] in " ".join(init["command"])

"""docker-compose.yaml: no engine runs here, so check what can be checked without one.

It must be secure by default (no secret with a default in the repository, the published ports on
loopback, the source read by a role that can only read), wire the same connections as the local
stack, each to the service that serves it, and build its images from the versions the local stack
runs, so DAGs run unchanged in both modes.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from tidemark.protocol.config import CONN_KAFKA, CONN_SOURCE, CONN_SPARK, CONN_WAREHOUSE, CONNECTION_IDS
from tidemark_workshop.settings import AIRFLOW_DB, DATABASES, REPO_ROOT, Settings

COMPOSE = REPO_ROOT / "docker-compose.yaml"
INIT_SQL = REPO_ROOT / "docker" / "postgres-init.sql"
LOCK = REPO_ROOT / "requirements.txt"  # the local stack's venv
BOOTSTRAP = REPO_ROOT / "stack" / "bootstrap.sh"  # makes that venv with this Python
KAFKA_POM = REPO_ROOT / "stack" / "kafka" / "pom.xml"  # the local stack's broker
POSTGRES_PORT = 5432  # the postgres image's: compose sets no other
AIRFLOW_SERVICES = {"airflow-api-server", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer", "airflow-init"}

SECRET_NAME = re.compile(r"SECRET|PASSWORD|FERNET")
REQUIRED = re.compile(r"\$\{(\w+):\?.+\}")  # ${VAR:?message}: compose refuses to start without VAR
REFERENCE = re.compile(r"(?<!\$)\$(?:\{(\w+)([^}]*)\}|(\w+))")  # ${VAR...} or $VAR; $$ is a literal $
DEFAULTED = re.compile(r"\$\{\w+:?-([^}]*)\}")
URL_LOGIN = re.compile(r"^(?P<scheme>[\w+]+)://(?P<user>[^:/@]+):(?P<password>.+)@(?P<host>[^:/@]+):(?P<port>\d+)/(?P<db>\w+)$")


def conn_var(conn_id: str) -> str:
    return f"AIRFLOW_CONN_{conn_id.upper()}"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def environments(compose) -> dict[str, dict[str, str]]:
    """Each service's environment (the anchors merged), list form or map form."""
    out = {}
    for name, svc in compose["services"].items():
        env = svc.get("environment") or {}
        if isinstance(env, list):
            env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
        out[name] = {k: "" if v is None else str(v) for k, v in env.items()}
    return out


@pytest.fixture
def local(monkeypatch) -> Settings:
    """The local stack's settings with its defaults (no TIDEMARK_* override from this shell)."""
    for var in ("TIDEMARK_PG_USER", "TIDEMARK_SOURCE_USER", "TIDEMARK_SOURCE_DB", "TIDEMARK_SPARK_MASTER"):
        monkeypatch.delenv(var, raising=False)
    return Settings.from_env()


def test_has_the_scale_out_services(compose):
    services = set(compose["services"])
    assert {"postgres", "kafka", "connect", "spark-master", "spark-worker"} | AIRFLOW_SERVICES <= services


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


# --- (a) no secret has a default in the repository ----------------------------------------------
def test_every_secret_variable_is_required_without_a_default(environments):
    """JWT secret, API secret key, Fernet key, passwords: each is ${VAR:?...} (an empty Fernet key
    is refused too), so compose does not start without it."""
    checked = set()
    for service, env in environments.items():
        for key, value in env.items():
            if not SECRET_NAME.search(key) or key.endswith("_FILE"):
                continue
            assert REQUIRED.fullmatch(value), f"{service}: {key}={value!r} is not ${{VAR:?message}}"
            checked.add(key)
    assert {"AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__API__SECRET_KEY", "AIRFLOW__CORE__FERNET_KEY",
            "POSTGRES_PASSWORD", "TIDEMARK_UI_PASSWORDS"} <= checked


def test_no_secret_reference_carries_a_default():
    """Also inside other values (connection JSON, the metadata database URL): a secret variable is
    never referenced as ${VAR:-default}, ${VAR-default}, ${VAR} or $VAR."""
    text = COMPOSE.read_text()
    refs = [(m.group(1) or m.group(3), m.group(2) or "") for m in REFERENCE.finditer(text)]
    secret_refs = [(var, rest) for var, rest in refs if SECRET_NAME.search(var)]
    assert secret_refs
    for var, rest in secret_refs:
        assert rest.startswith(":?"), f"${{{var}{rest}}}: a secret must be required (${{{var}:?message}})"


def test_no_password_is_written_literally(environments):
    for service, env in environments.items():
        for key, value in env.items():
            if key.startswith("AIRFLOW_CONN_") and value.lstrip().startswith("{"):
                conn = json.loads(value)
                if "password" in conn:
                    assert REQUIRED.fullmatch(conn["password"]), f"{service}: {key} has a literal password"
            url = URL_LOGIN.match(value)
            if url:
                assert REQUIRED.fullmatch(url["password"]), f"{service}: {key} has a literal password"


# --- (b) published ports on loopback ------------------------------------------------------------
def _resolve(value: str) -> str:
    """A compose value as it resolves with nothing set in the environment."""
    return REFERENCE.sub(lambda m: DEFAULTED.fullmatch(m.group(0)).group(1) if DEFAULTED.fullmatch(m.group(0)) else "",
                         value)


def _host_ip(port) -> str:
    if isinstance(port, dict):  # long syntax
        return _resolve(str(port.get("host_ip", "")))
    parts = _resolve(str(port)).split(":")
    return parts[0] if len(parts) == 3 else ""  # "HOST:CONTAINER" or "CONTAINER": every interface


def test_published_ports_bind_loopback_unless_an_address_is_given(compose):
    published = {}
    for name, svc in compose["services"].items():
        assert svc.get("network_mode") != "host", f"{name}: host networking publishes every port"
        for port in svc.get("ports", []):
            published[f"{name} {port}"] = _host_ip(port)
    assert any(p.startswith("airflow-api-server") for p in published), "the UI is not published"
    for port, ip in published.items():
        assert ip == "127.0.0.1", f"{port} binds {ip or 'every interface'} by default, not 127.0.0.1"
    ui = compose["services"]["airflow-api-server"]["ports"]
    assert any(re.match(r"\$\{\w+:-127\.0\.0\.1\}:", str(p)) for p in ui), "the UI's address cannot be chosen"


# --- (c) the source is read by a role that can only read ----------------------------------------
def _sql(text: str) -> str:
    return " ".join(re.sub(r"--[^\n]*", "", text).split())


def test_the_source_connection_logs_in_as_the_read_only_role(environments, local):
    env, pg = environments["airflow-scheduler"], environments["postgres"]
    source = json.loads(env[conn_var(CONN_SOURCE)])
    assert source["login"] == local.source_user, f"the source connection logs in as {source['login']}"
    assert source["login"] != pg["POSTGRES_USER"], "the source connection logs in as the owner role"
    # its own password, which the postgres container gets to create the role with
    reader_var, owner_var = (REQUIRED.fullmatch(v) for v in (source["password"], pg["POSTGRES_PASSWORD"]))
    assert reader_var and owner_var, "the passwords are not ${VAR:?message}"
    reader_var = reader_var.group(1)
    assert reader_var != owner_var.group(1), "the read-only role shares the owner's password"
    assert REQUIRED.fullmatch(pg.get(reader_var, "")), f"postgres does not get {reader_var}"


def test_compose_postgres_creates_the_read_only_role(compose, environments, local):
    """docker/postgres-init.sql mirrors the local stack's create_source_reader: LOGIN, nothing more;
    SELECT on the owner's tables in the source database, present and future; pg_read_all_stats."""
    mounts = [str(v) for v in compose["services"]["postgres"]["volumes"]]
    assert any(m.startswith("./docker/postgres-init.sql:/docker-entrypoint-initdb.d/") for m in mounts)
    source = json.loads(environments["airflow-scheduler"][conn_var(CONN_SOURCE)])
    password = REQUIRED.fullmatch(source["password"])
    assert password, "the source connection's password is not ${VAR:?message}"
    reader, reader_var = source["login"], password.group(1)
    sql = _sql(INIT_SQL.read_text())
    assert re.search(rf"CREATE ROLE {reader} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD :'(\w+)'", sql), sql
    assert re.search(rf"\\getenv \w+ {reader_var}\b", sql), f"the role's password does not come from {reader_var}"
    in_source = sql.split(rf"\connect {CONN_SOURCE}", 1)
    assert len(in_source) == 2, "grants on the source's tables must be made inside the source database"
    after = in_source[1]
    for grant in (f"ALTER DEFAULT PRIVILEGES FOR ROLE CURRENT_USER GRANT SELECT ON TABLES TO {reader}",
                  f"ALTER DEFAULT PRIVILEGES FOR ROLE CURRENT_USER GRANT USAGE ON SCHEMAS TO {reader}",
                  f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {reader}"):
        assert grant in after, grant
    assert f"GRANT pg_read_all_stats TO {reader}" in sql
    granted = set()
    for grant in re.findall(rf"GRANT ([^;]*?) TO {reader}\b", sql):
        granted |= {p.strip() for p in grant.split(" ON ", 1)[0].split(",")}
    assert granted == {"SELECT", "USAGE", "CONNECT", "pg_read_all_stats"}, f"{reader} is granted {granted}"


def test_change_data_capture_has_logical_wal_a_replication_role_and_secrets_only_the_worker_reads(
        compose, environments, local):
    """As the local stack: wal_level=logical with a cap on what a slot may keep; the replication
    role with LOGIN REPLICATION and nothing more; its password reaches Connect only as a file in
    a volume the worker mounts read-only (connector configs hold a reference)."""
    command = " ".join(compose["services"]["postgres"]["command"])
    assert "wal_level=logical" in command and "max_slot_wal_keep_size=" in command
    cdc = json.loads(environments["airflow-scheduler"][conn_var("tidemark_cdc")])
    assert cdc["login"] == local.cdc_user and REQUIRED.fullmatch(cdc["password"])
    sql = _sql(INIT_SQL.read_text())
    assert re.search(rf"CREATE ROLE {local.cdc_user} LOGIN REPLICATION NOSUPERUSER NOCREATEDB NOCREATEROLE "
                     r"PASSWORD :'(\w+)'", sql), sql
    granted = {g.strip() for g in re.findall(rf"GRANT ([^;]*?) TO {local.cdc_user}\b", sql)}
    assert granted == {"CONNECT ON DATABASE tidemark_source"}, granted
    connect = json.loads(environments["airflow-scheduler"][conn_var("tidemark_connect")])
    secrets = connect["extra"]["secrets_dir"]
    assert f"connect-secrets:{secrets}:ro" in compose["services"]["connect"]["volumes"]
    worker = (REPO_ROOT / "docker" / "connect-worker.properties").read_text()
    assert f"config.providers.dir.param.allowed.paths={secrets}" in worker
    assert "producer.acks=all" in worker and "producer.enable.idempotence=true" in worker


# --- (d) the same connections as the local stack ------------------------------------------------
def test_connection_names_match_the_local_stack(environments, local):
    env = environments["airflow-scheduler"]
    local_conns = local.airflow_connections()
    expected = {conn_var(c) for c in CONNECTION_IDS}
    assert {k for k in env if k.startswith("AIRFLOW_CONN_")} == expected
    assert set(local_conns) == expected
    owner = environments["postgres"]["POSTGRES_USER"]
    for conn_id in CONNECTION_IDS:
        there, here = json.loads(env[conn_var(conn_id)]), json.loads(local_conns[conn_var(conn_id)])
        assert there["conn_type"] == here["conn_type"], conn_id
        # what the DAGs read from a connection's extra (the Kafka provider's bootstrap.servers) is there in both
        assert set(there.get("extra") or {}) == set(here.get("extra") or {}), conn_id
        if conn_id in (CONN_SOURCE, CONN_WAREHOUSE):
            assert there["schema"] == here["schema"] == conn_id, conn_id  # the database
            role_there = "reader" if there["login"] != owner else "owner"
            role_here = "reader" if here["login"] != local.pg_user else "owner"
            assert role_there == role_here, f"{conn_id}: the {role_there} role here, the {role_here} role locally"


def test_shared_tidemark_variables_match_the_local_stack(environments, local):
    env, here = environments["airflow-scheduler"], local.runtime_env()
    assert env["AIRFLOW__CORE__EXECUTOR"] == here["AIRFLOW__CORE__EXECUTOR"]
    assert env["AIRFLOW__CORE__LOAD_EXAMPLES"].lower() == here["AIRFLOW__CORE__LOAD_EXAMPLES"].lower() == "false"
    there_db, here_db = (URL_LOGIN.match(e["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]) for e in (env, here))
    assert there_db and here_db
    assert (there_db["scheme"], there_db["db"]) == (here_db["scheme"], here_db["db"]) == ("postgresql+psycopg2", AIRFLOW_DB)
    assert there_db["user"] == environments["postgres"]["POSTGRES_USER"]
    for e in (env, here):
        assert re.fullmatch(r"http://[\w.-]+:\d+/execution/", e["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"])
        # what the Kafka and Spark connections name is what the jobs are told
        kafka = json.loads(e[conn_var(CONN_KAFKA)])
        assert kafka["extra"]["bootstrap.servers"] == e["TIDEMARK_KAFKA_BOOTSTRAP"]
        spark = json.loads(e[conn_var(CONN_SPARK)])
        master = spark["host"] + (f":{spark['port']}" if spark.get("port") else "")
        assert master == e["TIDEMARK_SPARK_MASTER"]


def test_each_connection_names_the_service_that_serves_it(compose, environments):
    """Host, port and database of every connection (and of the metadata database and the execution
    API) are what the compose service listens on and what docker/postgres-init.sql creates: the
    local stack's three databases."""
    services, env = compose["services"], environments["airflow-scheduler"]
    created = re.findall(r"^CREATE DATABASE (\w+);", INIT_SQL.read_text(), re.M)
    assert sorted(created) == sorted(DATABASES)
    for conn_id in (CONN_SOURCE, CONN_WAREHOUSE):
        conn = json.loads(env[conn_var(conn_id)])
        assert (conn["host"], conn["port"]) == ("postgres", POSTGRES_PORT), conn_id
    metadata = URL_LOGIN.match(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    assert (metadata["host"], int(metadata["port"]), metadata["db"]) == ("postgres", POSTGRES_PORT, AIRFLOW_DB)
    assert "postgres" in services

    broker = environments["kafka"]
    advertised = dict(item.split("://", 1) for item in broker["KAFKA_ADVERTISED_LISTENERS"].split(","))
    assert json.loads(env[conn_var(CONN_KAFKA)])["extra"]["bootstrap.servers"] == advertised["PLAINTEXT"]
    assert advertised["PLAINTEXT"].split(":")[0] in (services["kafka"].get("hostname"), "kafka")

    master_env = environments["spark-master"]
    master = f"spark://{master_env['SPARK_MASTER_HOST']}:{master_env['SPARK_MASTER_PORT']}"
    spark = json.loads(env[conn_var(CONN_SPARK)])
    assert f"{spark['host']}:{spark['port']}" == master
    assert services["spark-worker"]["command"].split()[-1] == master, "the worker joins another master"

    api = re.fullmatch(r"http://([\w.-]+):(\d+)/execution/", env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"])
    assert api and api[1] == "airflow-api-server"
    published = [_resolve(str(p)).split(":")[-1] for p in services["airflow-api-server"]["ports"]]
    assert api[2] in published, f"the execution API is on port {api[2]}; the API server listens on {published}"


def _pins(path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        name, _, version = line.split("#", 1)[0].strip().partition("==")
        if version:
            pins[name.strip().lower()] = version.strip()
    return pins


def test_the_images_run_what_the_local_stack_runs(compose):
    """The Airflow image is built from the local stack's Airflow and Python (and installs its lock),
    the Spark cluster runs the PySpark version the jobs are submitted with (a client talks only to a
    cluster of its own version), and the broker is the one the local stack's tests run against."""
    pins, services = _pins(LOCK), compose["services"]
    common = compose["x-airflow-common"]
    dockerfile = REPO_ROOT / common["build"]["context"] / common["build"]["dockerfile"]
    base = re.search(r"^FROM apache/airflow:(?P<airflow>[\d.]+)-python(?P<python>\d+\.\d+)\s*$",
                     dockerfile.read_text(), re.M)
    assert base, f"{dockerfile.name}: no FROM apache/airflow:<version>-python<version>"
    assert base["airflow"] == pins["apache-airflow"], f"the image has Airflow {base['airflow']}, the lock {pins['apache-airflow']}"
    venv_python = re.search(r"python(\d+\.\d+) -m venv", BOOTSTRAP.read_text())
    assert venv_python and base["python"] == venv_python[1], "the image's Python is not the local venv's"
    assert re.search(rf"^COPY {LOCK.name} ", dockerfile.read_text(), re.M), "the image does not install the lock"
    assert _resolve(common["image"]) == f"tidemark-airflow:{pins['apache-airflow']}"
    for name in AIRFLOW_SERVICES:
        assert (services[name]["image"], services[name]["build"]) == (common["image"], common["build"]), name
    for name in ("spark-master", "spark-worker"):
        assert services[name]["image"] == f"apache/spark:{pins['pyspark']}", name
    kafka = re.search(r"<kafka.version>([^<]+)</kafka.version>", KAFKA_POM.read_text())
    assert kafka and services["kafka"]["image"] == f"apache/kafka:{kafka[1]}"


def test_the_shared_ui_requires_a_login_with_passwords_from_the_environment(compose):
    env = compose["services"]["airflow-api-server"]["environment"]
    assert str(env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"]).lower() == "false"
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"].startswith("${TIDEMARK_UI_USERS")
    init = compose["services"]["airflow-init"]
    assert init["environment"]["TIDEMARK_UI_PASSWORDS"].startswith("${TIDEMARK_UI_PASSWORDS:?")
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"] in " ".join(init["command"])

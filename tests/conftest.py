"""Shared fixtures, the two kinds of test and the lanes `make test` runs them in.

Every test under tests/stack is marked ``stack``: it talks to the real local stack that `make test`
starts. The rest needs none: `make unit` runs it (``-m "not stack"``) without starting anything.

`make test` runs the suite in two phases. First in ``LANES`` lanes (pytest-xdist, ``--dist loadfile``;
each lane reads and writes its own source database, ``tidemark_source_gw0``, ...): each file is one unit of
work, so a module's fixtures are built once, and the files that start Airflow's services on the
stack's ports (``AIRFLOW_FILES``) are one unit together, one after another. Then, alone, the tests
marked ``serial``: they stop or kill a component every lane uses (or break the secret its connectors
read), or watch every session of a role. A transaction a test holds open on the source holds back only
its own lane's database.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import psycopg2
import pytest

from tidemark_workshop.settings import SOURCE_DB, TEST_TRANSPORT_ENV, WAREHOUSE_DB, Settings

PARSE_SECONDS = "dag_parse_seconds"  # tests/test_dag_integrity.py records (file, seconds) per DAG file
PARSE_TIMES: dict[str, float] = {}  # ... and pytest_terminal_summary reports them
STACK_DIR = Path(__file__).resolve().parent / "stack"
STACK_FIXTURES = {"bootstrap", "source_conn", "warehouse_conn", "topic"}  # below: each connects to the stack


# They start Airflow's services on the stack's ports and metadata database, or run a DAG in that database.
AIRFLOW_FILES = {"test_scheduler.py", "test_scheduler_cdc.py", "test_ui_clicks.py", "test_smoke_dag.py"}
# The longest units (CI's JUnit report, .state/test-report.xml) go first, so the lanes end together.
# Only the order depends on this list.
LONGEST_FIRST = ("airflow", "test_protocol_v2.py", "test_batch_faults.py", "test_bench.py", "test_untrusted_input.py",
                 "test_repair.py", "test_forgery.py", "test_standalone_cluster.py", "test_kill_trials.py",
                 "test_failover.py")


def lane_unit(nodeid: str) -> str:
    """What one lane runs from start to end: the test's file, or all of AIRFLOW_FILES."""
    path = nodeid.split("::", 1)[0]
    return "airflow" if Path(path).name in AIRFLOW_FILES else path


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: `-p no:xdist` still runs
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Lanes(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return lane_unit(nodeid)

    return Lanes(config, log)


def pytest_configure(config):
    """A lane (an xdist worker) gets its own source database, so a transaction a test leaves open in one
    lane cannot hold back the windows of another (the plan's clamp is per database). Set before any
    Settings is made: the lane's Airflow connections and every process it starts follow."""
    lane = os.environ.get("PYTEST_XDIST_WORKER")
    if lane:
        os.environ["TIDEMARK_SOURCE_DB"] = f"{SOURCE_DB}_{lane}"
        if "AIRFLOW_CONN_TIDEMARK_SOURCE" in os.environ:  # the stack's environment (`stack run`): follow it
            os.environ.update(Settings.from_env().airflow_connections())


def pytest_collection_modifyitems(config, items):
    outside = []
    for item in items:
        if STACK_DIR in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.stack)
        elif STACK_FIXTURES & set(getattr(item, "fixturenames", ())):
            outside.append(item.nodeid)
    if outside:  # `make unit` would run them with no stack to talk to
        raise pytest.UsageError(f"tests outside tests/stack use the running stack's fixtures; move them there: {outside}")
    # checked in every run, not only where `make test-direct` reads it
    unexplained = [item.nodeid for item in items
                   if (mark := item.get_closest_marker("kafka_transport")) is not None and not mark.args]
    if unexplained:
        raise pytest.UsageError(f"kafka_transport needs its reason, kafka_transport('why'): {unexplained}")
    if os.environ.get(TEST_TRANSPORT_ENV) == "direct":  # make test-direct
        for item in items:
            if (mark := item.get_closest_marker("kafka_transport")) is not None:
                item.add_marker(pytest.mark.skip(reason=f"of the Kafka transport itself: {mark.args[0]}"))
    rank = {unit: i for i, unit in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(Path(lane_unit(item.nodeid)).name, len(rank)))  # stable otherwise


def pytest_runtest_logreport(report):
    # under xdist this runs in the controller too: a report's user_properties travel with it from the worker
    for name, value in report.user_properties:
        if name == PARSE_SECONDS and report.when == "call":
            PARSE_TIMES[value[0]] = value[1]


def pytest_terminal_summary(terminalreporter, config):
    if PARSE_TIMES:
        terminalreporter.section("DAG parse time per file")
        for name, seconds in sorted(PARSE_TIMES.items()):
            terminalreporter.write_line(f"{name:<40} {seconds:6.2f}s")


@pytest.fixture(scope="session")
def settings() -> Settings:
    return Settings.from_env()


@pytest.fixture(scope="session")
def bootstrap(settings: Settings) -> str:
    from tidemark_workshop.stack.kafka import require_broker

    require_broker(settings)
    return settings.kafka_bootstrap


@pytest.fixture(scope="session", autouse=True)
def source_database(request, settings: Settings) -> str | None:
    """The source database, created with the reader's and the replication role's grants when missing
    (a lane's own, the first time), as `make up` does for the default; kept between runs like it.
    First of all fixtures (session scope, autouse), and only when stack tests run."""
    if not any(item.get_closest_marker("stack") for item in request.session.items):
        return None
    import fcntl

    from tidemark_workshop.stack.postgres import Postgres

    # one lane at a time: the roles are the cluster's, and the stack's advisory lock is per database
    with open(settings.state_dir / "source-databases.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        Postgres(settings).create_databases()
    return settings.source_db


@pytest.fixture
def source_conn(settings: Settings):
    conn = psycopg2.connect(settings.dsn(settings.source_db))
    yield conn
    conn.close()


@pytest.fixture
def warehouse_conn(settings: Settings):
    conn = psycopg2.connect(settings.dsn(WAREHOUSE_DB))
    yield conn
    conn.close()


@pytest.fixture
def topic(bootstrap: str) -> str:
    """A fresh 3-partition topic per test, so tests never see each other's records."""
    from confluent_kafka.admin import AdminClient

    from tidemark.protocol.kafka_io import ensure_topic

    name = f"tidemark.test.{uuid.uuid4().hex[:12]}"
    ensure_topic(bootstrap, name, partitions=3)
    yield name
    admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive the future
    admin.delete_topics([name])[name].result(timeout=30)

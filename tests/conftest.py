"""Shared fixtures, the two kinds of test and the lanes `make test` runs them in.

Every test under tests/stack is marked ``stack``: it talks to the real local stack that `make test`
starts. The rest needs none: `make unit` runs it (``-m "not stack"``) without starting anything.

`make test` runs the suite in two phases. First in parallel lanes (pytest-xdist, ``--dist
loadgroup``): each file is one unit of work, so a module's fixtures are built once, and the files
that start Airflow's services on the stack's ports share the group ``airflow`` (one after another).
Then, alone, the tests marked ``serial``: they stop or kill a component every lane uses, hold a
source transaction (which holds back every pipeline's window on that database), or watch every
session of a role.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg2
import pytest

from tidemark_workshop.settings import SOURCE_DB, WAREHOUSE_DB, Settings

PARSE_TIMES = pytest.StashKey[dict]()
STACK_DIR = Path(__file__).resolve().parent / "stack"
STACK_FIXTURES = {"bootstrap", "source_conn", "warehouse_conn", "topic"}  # below: each connects to the stack


# The longest files (CI's JUnit report, .state/test-report.xml) go first, so the lanes end together.
# Only the order depends on this list.
LONGEST_FIRST = ("airflow", "test_protocol_v2", "test_batch_faults", "test_bench", "test_untrusted_input",
                 "test_repair", "test_forgery", "test_standalone_cluster", "test_kill_trials")


def pytest_collection_modifyitems(config, items):
    outside = []
    for item in items:
        if STACK_DIR in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.stack)
        elif STACK_FIXTURES & set(getattr(item, "fixturenames", ())):
            outside.append(item.nodeid)
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(Path(item.path).stem))
    if outside:  # `make unit` would run them with no stack to talk to
        raise pytest.UsageError(f"tests outside tests/stack use the running stack's fixtures; move them there: {outside}")
    rank = {group: i for i, group in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(_group(item), len(rank)))  # stable: the rest keep their order


def _group(item) -> str:
    marker = item.get_closest_marker("xdist_group")
    return marker.args[0] if marker.args else marker.kwargs.get("name", "")


def pytest_terminal_summary(terminalreporter, config):
    times = config.stash.get(PARSE_TIMES, None)
    if times:
        terminalreporter.section("DAG parse time per file")
        for name, seconds in sorted(times.items()):
            terminalreporter.write_line(f"{name:<40} {seconds:6.2f}s")


@pytest.fixture(scope="session")
def settings() -> Settings:
    return Settings.from_env()


@pytest.fixture(scope="session")
def bootstrap(settings: Settings) -> str:
    from tidemark_workshop.stack.kafka import require_broker

    require_broker(settings)
    return settings.kafka_bootstrap


@pytest.fixture
def source_conn(settings: Settings):
    conn = psycopg2.connect(settings.dsn(SOURCE_DB))
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
    from tidemark.kafka_io import ensure_topic

    from confluent_kafka.admin import AdminClient

    name = f"tidemark.test.{uuid.uuid4().hex[:12]}"
    ensure_topic(bootstrap, name, partitions=3)
    yield name
    admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive the future
    admin.delete_topics([name])[name].result(timeout=30)

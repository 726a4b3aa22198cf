"""Shared fixtures. Stack tests talk to the real local stack that `make test` starts."""

from __future__ import annotations

import uuid

import psycopg2
import pytest

from tidemark_workshop.settings import SOURCE_DB, WAREHOUSE_DB, Settings

PARSE_TIMES = pytest.StashKey[dict]()


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

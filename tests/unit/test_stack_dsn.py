"""`python -m tidemark_workshop.stack dsn`: where to connect, one labelled line each (no stack needed)."""

import psycopg2.extensions
import pytest

from tidemark_workshop.stack.__main__ import dsn_lines, main


@pytest.fixture
def lines(monkeypatch) -> dict[str, str]:
    monkeypatch.setenv("TIDEMARK_PG_PORT", "6543")
    monkeypatch.setenv("TIDEMARK_KAFKA_PORT", "19092")
    monkeypatch.setenv("TIDEMARK_CONNECT_PORT", "18083")
    monkeypatch.setenv("TIDEMARK_PG_USER", "owner")
    monkeypatch.setenv("TIDEMARK_PG_PASSWORD", "it's a \\ s3cret")  # quote, backslash, spaces survive
    monkeypatch.setenv("TIDEMARK_SOURCE_USER", "reader")
    monkeypatch.setenv("TIDEMARK_SOURCE_PASSWORD", "r3ader'")
    monkeypatch.delenv("TIDEMARK_SOURCE_DB", raising=False)  # a make test lane sets its own
    from tidemark_workshop.settings import Settings

    out = dsn_lines(Settings.from_env())
    labels = [line.split(maxsplit=1)[0] for line in out]
    assert labels == ["source", "source-owner", "warehouse", "airflow", "kafka", "connect"]
    return {label: line.split(maxsplit=1)[1] for label, line in zip(labels, out)}


def test_the_source_dsn_logs_in_as_the_read_only_role(lines):
    source = psycopg2.extensions.parse_dsn(lines["source"])
    assert source == {"host": "127.0.0.1", "port": "6543", "dbname": "tidemark_source", "user": "reader",
                      "password": "r3ader'"}
    owner = psycopg2.extensions.parse_dsn(lines["source-owner"])
    assert (owner["dbname"], owner["user"], owner["password"]) == ("tidemark_source", "owner", "it's a \\ s3cret")


def test_the_warehouse_and_airflow_dsns_use_the_owner_role(lines):
    for label, database in (("warehouse", "tidemark_warehouse"), ("airflow", "airflow")):
        dsn = psycopg2.extensions.parse_dsn(lines[label])
        assert dsn == {"host": "127.0.0.1", "port": "6543", "dbname": database, "user": "owner",
                       "password": "it's a \\ s3cret"}


def test_kafka_is_its_bootstrap_servers_and_connect_its_rest_address_on_loopback(lines):
    assert lines["kafka"] == "127.0.0.1:19092"
    assert lines["connect"] == "http://127.0.0.1:18083"


def test_the_command_prints_them(monkeypatch, capsys):
    monkeypatch.setenv("TIDEMARK_KAFKA_PORT", "19092")
    assert main(["dsn"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 6 and out[-2].split() == ["kafka", "127.0.0.1:19092"]
    assert main(["--help"]) == 0
    assert "\n  dsn " in capsys.readouterr().out

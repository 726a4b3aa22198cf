"""Pure logic of the stack helpers and the smoke check."""

import json
from decimal import Decimal

import pytest

from tidemark.protocol.progress import parse_summaries, summary_line
from tidemark.status import smoke
from tidemark_workshop.stack.maven import artifact_name


@pytest.mark.parametrize(
    "jar, name",
    [
        ("scala-library-2.13.15.jar", "scala-library"),
        ("kafka-clients-3.9.0.jar", "kafka-clients"),
        ("zstd-jni-1.5.6-10.jar", "zstd-jni"),
        ("log4j-slf4j2-impl-2.24.3.jar", "log4j-slf4j2-impl"),
        ("spark-sql_2.13-4.0.0.jar", "spark-sql_2.13"),
    ],
)
def test_artifact_name_drops_the_version(jar, name):
    assert artifact_name(jar) == name


def test_summary_lines_survive_log_prefixes_and_suffixes():
    line = summary_line("spark", rows=3, amount=Decimal("1.10"))
    log = f"2026-01-01 [info] {line} [airflow.task.hooks] loc=x.py:1\nnoise\n{summary_line('kafka', ok=True)}\n"
    assert parse_summaries(log) == [{"step": "spark", "rows": 3, "amount": "1.10"}, {"step": "kafka", "ok": True}]


def _records(*rows):
    return [json.dumps(r).encode() for r in rows]


def test_totals_are_exact_decimals():
    values = [b'{"id": 1, "balance": 0.10}', b'{"id": 2, "balance": 0.20}', b'{"id": 3, "balance": 99999999999999.99}']
    totals = smoke.totals_of(values)
    assert totals == smoke.Totals(rows=3, balance_sum="100000000000000.29", max_id=3)


def test_duplicate_key_is_refused():
    with pytest.raises(ValueError, match="duplicate key id=7"):
        smoke.totals_of(_records({"id": 7, "balance": 1}, {"id": 7, "balance": 1}))


def test_compare_names_each_difference():
    expected = smoke.Totals(rows=2, balance_sum="3.00", max_id=2)
    actual = smoke.Totals(rows=1, balance_sum="1.00", max_id=2)
    assert smoke.compare(expected, actual) == [
        "rows: source 2 != kafka 1",
        "balance_sum: source 3.00 != kafka 1.00",
    ]
    assert smoke.compare(expected, expected) == []

"""Spark in local mode: JDBC read from PostgreSQL and Kafka write, with the resolved jars only."""

import os
import subprocess
import sys

import pytest
from confluent_kafka import Producer

from tidemark.protocol.kafka_io import end_offsets, producer_config, read_committed
from tidemark.status import smoke
from tidemark_workshop.settings import REPO_ROOT

pytestmark = pytest.mark.stack

JOB = REPO_ROOT / "spark_jobs" / "table_to_topic.py"


def _submit(settings, topic: str) -> subprocess.CompletedProcess:
    from tidemark_workshop.stack.spark import submit

    return submit(settings, JOB.name, [
        *settings.database_args(settings.source_db), "--table", smoke.TABLE, "--key", "id",
        "--topic", topic, "--bootstrap", settings.kafka_bootstrap,
    ], secret=settings.pg_password)


@pytest.fixture(scope="module")
def spark_round_trip(settings, bootstrap, source_conn_module):
    """Seed the source once, run the real Spark job once; the tests below inspect the result."""
    from tidemark.protocol.kafka_io import ensure_topic

    topic = "tidemark.test.spark-round-trip"
    ensure_topic(bootstrap, topic, partitions=3)
    start = end_offsets(bootstrap, topic)
    expected = smoke.seed_source(source_conn_module, rows=2500)
    proc = _submit(settings, topic)
    assert proc.returncode == 0, f"spark-submit failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    records = list(read_committed(bootstrap, topic, start))
    return expected, records, proc


@pytest.fixture(scope="module")
def source_conn_module(settings):
    import psycopg2

    conn = psycopg2.connect(settings.dsn(settings.source_db))
    yield conn
    conn.close()


def test_jdbc_read_to_kafka_write_is_exact(spark_round_trip):
    expected, records, proc = spark_round_trip
    assert smoke.compare(expected, smoke.totals_of(r.value for r in records)) == []
    assert expected.rows == 2500
    assert '"rows": 2500' in proc.stdout


def test_spark_and_python_agree_on_the_partition_of_a_key(spark_round_trip, bootstrap, topic):
    """Spark writes with Java's murmur2 partitioner; our Python producers must place keys alike."""
    _, records, _ = spark_round_trip
    spark_partition = {r.key: r.partition for r in records}
    assert len(set(spark_partition.values())) == 3, "keys should spread over all partitions"

    python_partition: dict[bytes, int] = {}

    def on_delivery(err, msg):
        assert err is None, err
        python_partition[msg.key()] = msg.partition()

    producer = Producer(producer_config(bootstrap))
    for key in spark_partition:
        producer.produce(topic, key=key, value=b"x", on_delivery=on_delivery)
    assert producer.flush(30) == 0
    assert python_partition == spark_partition


def test_job_without_password_exits_non_zero_with_clear_message(settings):
    proc = subprocess.run(
        [sys.executable, str(JOB), "--database", "host=x dbname=y", "--user", "u",
         "--password-env", "TIDEMARK_UNSET_PASSWORD_VAR", "--table", "t", "--key", "id",
         "--topic", "t", "--bootstrap", "127.0.0.1:1"],
        capture_output=True, text=True, env={k: v for k, v in os.environ.items() if k != "TIDEMARK_UNSET_PASSWORD_VAR"},
    )
    assert proc.returncode == 3  # every job's exit code for a terminal error (tidemark.spark.entry.run)
    assert "table_to_topic: FAILED: environment variable TIDEMARK_UNSET_PASSWORD_VAR" in proc.stderr

"""
### Tidemark stack smoke test

Touches every part of the stack for real, once:

1. **seed_source**: (re)creates `smoke_accounts` (1,000 deterministic accounts) in the warehouse
   database, since the pipelines' source connection may only read, and notes the topic's end
   offsets.
2. **extract**: a Spark job (`spark_jobs/table_to_topic.py`, through `SparkSubmitOperator`) reads
   the table over JDBC and writes every row to `tidemark.smoke.accounts`, keyed by `id`.
3. **verify**: consumes what this run wrote (`read_committed`) and compares row count, sum of
   balances (exact decimals) and the highest id with the source. Any difference fails the run.

Manual only (`schedule=None`). If **verify** fails, read its log: it lists each total that
differs, source against Kafka. `make demo` runs this DAG with `airflow dags test`.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import dag, task

from tidemark.protocol.config import CONN_KAFKA, CONN_WAREHOUSE
from tidemark.protocol.progress import summary_line
from tidemark.status import smoke
from tidemark_airflow.hooks import DatabaseHook, KafkaHook
from tidemark_airflow.spark import SparkJdbcSubmitOperator


@dag(
    dag_id="tidemark_smoke",
    doc_md=__doc__,
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["tidemark", "smoke"],
    default_args={"retries": 2, "retry_delay": timedelta(seconds=15)},
)
def tidemark_smoke():
    @task
    def seed_source() -> dict:
        from tidemark.protocol import kafka_io

        kafka = KafkaHook(CONN_KAFKA)
        bootstrap = kafka.bootstrap()
        kafka_io.ensure_topic(bootstrap, smoke.TOPIC, smoke.PARTITIONS, replication=kafka.replication())
        start = kafka_io.end_offsets(bootstrap, smoke.TOPIC)
        conn = DatabaseHook(CONN_WAREHOUSE).get_conn()
        try:
            totals = smoke.seed_source(conn)
        finally:
            conn.close()
        print(summary_line("source", table=smoke.TABLE, rows=totals.rows, balance_sum=totals.balance_sum))
        return {"totals": totals.to_dict(), "start_offsets": {str(p): o for p, o in start.items()}}

    @task
    def verify(seeded: dict) -> dict:
        from tidemark.protocol import kafka_io

        start = {int(p): o for p, o in seeded["start_offsets"].items()}
        records = list(kafka_io.read_committed(KafkaHook(CONN_KAFKA).bootstrap(), smoke.TOPIC, start))
        actual = smoke.totals_of(r.value for r in records)
        expected = smoke.Totals(**seeded["totals"])
        partitions = sorted({r.partition for r in records})
        problems = smoke.compare(expected, actual)
        if problems:
            raise ValueError(
                f"smoke round trip {smoke.TABLE} -> {smoke.TOPIC} differs: " + "; ".join(problems)
                + ". Check the extract task's log for the Spark job's row count."
            )
        print(summary_line("kafka", topic=smoke.TOPIC, read_committed_rows=actual.rows,
                           balance_sum=actual.balance_sum, partitions=len(partitions), matches_source=True))
        return {"rows": actual.rows, "balance_sum": actual.balance_sum, "partitions": partitions}

    seeded = seed_source()
    extract = SparkJdbcSubmitOperator(
        task_id="extract",
        script="table_to_topic.py",
        jdbc_conn_id=CONN_WAREHOUSE,
        bootstrap_conn_id=CONN_KAFKA,
        job_args=["--table", smoke.TABLE, "--key", "id", "--topic", smoke.TOPIC],
    )
    seeded >> extract >> verify(seeded)


tidemark_smoke()

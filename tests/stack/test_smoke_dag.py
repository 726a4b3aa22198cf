"""The smoke DAG run through Airflow for real (`airflow dags test`), as `make demo` runs it."""

import pytest

from tidemark_workshop.demo import run_dag

pytestmark = pytest.mark.stack


def test_smoke_dag_round_trips_the_source_through_spark_and_kafka(settings):
    state, _, steps = run_dag("tidemark_smoke", settings)
    by_step = {s["step"]: s for s in steps}
    assert state == "success", f"see {settings.logs_dir / 'demo-tidemark_smoke.log'}"
    assert set(by_step) == {"source", "spark-session", "spark", "kafka"}  # every Spark job reports its start-up
    assert by_step["source"]["rows"] == by_step["spark"]["rows"] == by_step["kafka"]["read_committed_rows"] == 1000
    assert by_step["source"]["balance_sum"] == by_step["kafka"]["balance_sum"]

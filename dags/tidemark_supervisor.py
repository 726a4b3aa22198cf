"""
### Tidemark stream supervisor

Every minute, for each pipeline whose spec says `sink: {mode: standing}`, compares what a person
wants (running, paused, stopped: set with the DAG `tidemark_stream_control`) with what runs (the
sink process, its heartbeat and progress in the control schema, its lag behind the topic) and acts:

- **starts** a sink that should run and does not; **restarts** one that died, hung (no heartbeat)
  or stalled (lag not shrinking and no progress for ten trigger intervals, at least 2 min), with
  exponential backoff; a healthy idle sink (no lag) is never a stall;
- **never restarts** a sink paused or stopped on purpose; a stop lets the sink finish its
  micro-batch and exit by itself before it is signalled;
- past the spec's restart budget (`sink.restart_budget` within `sink.budget_window`) the pipeline
  is **crash-looping**: nothing restarts it until a person clears it, and this task fails with one
  line per pipeline naming its last error and what to do.

Sinks run outside Airflow's worker slots (detached, with pid, log and exit code under
`TIDEMARK_STREAMS_DIR`); each run is short, and one run at a time. Each run's log has one line
per pipeline: desired, actual, lag per partition, last progress, restarts, action.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG, CronTriggerTimetable, task

with DAG(
    dag_id="tidemark_supervisor",
    doc_md=__doc__,
    schedule=CronTriggerTimetable("* * * * *", timezone="UTC"),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    dagrun_timeout=timedelta(minutes=5),
    default_args={"retries": 2, "retry_delay": timedelta(seconds=10), "owner": "tidemark"},
    tags=["tidemark", "streams"],
):

    @task(execution_timeout=timedelta(minutes=4))
    def supervise() -> list[str]:
        from tidemark_airflow.streams import supervise as cycle

        return cycle()

    supervise()

"""
### Tidemark stream control: pause, resume, stop, clear, re-snapshot

Trigger this DAG (**Trigger** in the UI, or the REST API) with:

- `pipeline`: a pipeline whose spec says `sink: {mode: standing}`;
- `action`: `pause` or `stop` (the sink finishes its micro-batch and exits; the supervisor never
  restarts it), `resume` (the supervisor starts it at its next cycle), or `clear` (a crash-looping
  pipeline may be restarted again, with a fresh restart budget), or `resnapshot` (a CDC pipeline only:
  its stream starts over from a new handoff: the supervisor stops the connector, the next batch run
  makes the slot again and reads every row above the watermark in its snapshot, then the connector
  resumes on it; a row deleted at the source in between, or changed below the watermark, is found by
  reconciliation, not applied; a batch run already planned before the request keeps its plan);
- `reason`: why, kept with the change.

Who asked (the user who triggered the run) and when go into the control schema
(`tidemark_control.streams` and the append-only `tidemark_control.stream_events`), where the
supervisor reads them.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG, Param, task

from tidemark.protocol.config import pipelines_dir
from tidemark.protocol.spec import load_specs

# the form's select: the pipelines with a standing sink (the specs are read anyway by the batch DAGs' file)
STANDING = sorted(spec.name for _, spec in load_specs(pipelines_dir())[0] if spec.sink.mode == "standing")
PIPELINE = (Param(None, type="string", enum=STANDING,
                  description="the pipeline to act on (the select lists those whose spec says sink: {mode: standing}); "
                              "Trigger stays disabled until one is chosen")
            if STANDING else
            Param("", type="string", description="the pipeline to act on: no spec says sink: {mode: standing} yet"))

with DAG(
    dag_id="tidemark_stream_control",
    doc_md=__doc__,
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=4,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=10), "owner": "tidemark"},
    params={
        "pipeline": PIPELINE,
        "action": Param("pause", type="string", enum=["pause", "resume", "stop", "clear", "resnapshot"]),
        "reason": Param(None, type=["null", "string"], description="why (optional, kept with the change)"),
    },
    tags=["tidemark", "streams"],
):

    @task
    def apply(params=None, dag_run=None) -> str:
        from tidemark_airflow.streams import control

        actor = getattr(dag_run, "triggering_user_name", None) or "unknown"
        return control(params["pipeline"], params["action"], params["reason"], actor)

    apply()

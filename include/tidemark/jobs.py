"""The batch sequence and the Spark jobs' command lines, written once.

The DAG factory (``tidemark_airflow.batch``) and the local runner (``tidemark_workshop.stack.batchrun``)
both follow ``STEPS`` and build each job's arguments and Spark settings here, so what a test runs
is what the scheduler runs.
"""

from __future__ import annotations

import json
from pathlib import Path

from tidemark.window import Window

# plan -> begin -> extract -> end -> sink -> wait_committed, then publish; abort_unfinished is the
# teardown of the whole chain (whatever ended the run, no attempt stays open).
PLAN, BEGIN, EXTRACT, END, SINK, COMMITTED = STEPS = ("plan", "begin", "extract", "end", "sink", "wait_committed")
PUBLISH, CLEANUP = "publish", "abort_unfinished"
# Before plan, in the DAG only: backpressure from a standing sink that lags (the local runner
# applies each batch itself, so nothing lags behind it).
GATE = "wait_for_sink"

EXTRACT_JOB = "extract_window.py"
SINK_JOB = "batch_sink.py"
PASSWORD_ENV = "TIDEMARK_JDBC_PASSWORD"  # the JDBC password reaches a job only through this variable
SPARK_CONF = {  # every Tidemark job, in local mode and on a cluster alike
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "4",
}
READ_PARTITIONS = 4  # parallel JDBC range reads of the extract


def jdbc_args(url: str, user: str) -> list[str]:
    return ["--jdbc-url", url, "--user", user, "--password-env", PASSWORD_ENV]


def extract_args(spec_path: Path | str, batch_id: str, attempt: int, window: Window, bootstrap: str,
                 report: Path | str, read_partitions: int = READ_PARTITIONS,
                 repair_keys: Path | str | None = None, writer_schema: str | None = None) -> list[str]:
    """spark_jobs/extract_window.py's arguments after the JDBC ones (``repair_keys``: the keys
    document of a repair batch, ``tidemark.repair.write_document``; ``writer_schema``: the Avro
    schema of a protocol-version-2 batch)."""
    return [
        "--spec", str(Path(spec_path).resolve()), "--batch-id", batch_id, "--attempt", str(attempt),
        "--window", json.dumps(window.to_json()), "--bootstrap", bootstrap, "--report", str(report),
        "--read-partitions", str(read_partitions),
        *(["--repair-keys", str(repair_keys)] if repair_keys is not None else []),
        *(["--avro-schema", writer_schema] if writer_schema is not None else []),
    ]


def sink_args(spec_path: Path | str, bootstrap: str, *, available_now: bool = True) -> list[str]:
    """spark_jobs/batch_sink.py's arguments after the JDBC ones."""
    return ["--spec", str(Path(spec_path).resolve()), "--bootstrap", bootstrap,
            *(["--available-now"] if available_now else [])]

"""What a deployment configures: Airflow connection ids, Spark driver memory and where the
pipeline specs and Spark job scripts are, from environment variables with working defaults.

Nothing here knows the local stack (ports, state directories): that is ``tidemark_workshop.settings``.
"""

from __future__ import annotations

import os
from pathlib import Path

# The project's folders (dags/, include/, spark_jobs/) as deployed: TIDEMARK_PROJECT_DIR, else
# the folder this package is installed under (include/tidemark -> the project), as in the Astro layout.
PROJECT_DIR = Path(os.environ.get("TIDEMARK_PROJECT_DIR") or Path(__file__).resolve().parents[2])

# Airflow connection ids: the same names in the local stack and in docker-compose.yaml.
CONN_SOURCE = "tidemark_source"
CONN_WAREHOUSE = "tidemark_warehouse"
CONN_KAFKA = "tidemark_kafka"
CONN_SPARK = "tidemark_spark"
CONN_CONTROL = "tidemark_control"  # its password: the control messages' keyring (tidemark.control.Keyring)
CONN_CDC = "tidemark_cdc"  # the source as its replication role (Debezium reads the WAL as it)
CONN_CONNECT = "tidemark_connect"  # Kafka Connect's REST API; extra secrets_dir: where its worker reads secrets
CONNECTION_IDS = (CONN_SOURCE, CONN_WAREHOUSE, CONN_KAFKA, CONN_SPARK, CONN_CONTROL, CONN_CDC, CONN_CONNECT)
# Both jobs stream: the extract holds no window in memory (it counts records on their way to
# Kafka) and the sink at most one micro-batch (--max-records-per-trigger).
SPARK_DRIVER_MEMORY = os.environ.get("TIDEMARK_SPARK_DRIVER_MEMORY") or "1g"


def kafka_timeout_s() -> float:
    """How long a step waits for the broker before it fails (its task's retries try again later):
    ``TIDEMARK_KAFKA_TIMEOUT_S``, default 30."""
    return float(os.environ.get("TIDEMARK_KAFKA_TIMEOUT_S") or 30)


def executor_checks_from() -> int:
    """From how many records in the sink's previous micro-batch the next one's record checks run on
    Spark's executors: ``TIDEMARK_EXECUTOR_CHECKS_FROM``, default 50,000. Below it they run in the
    sink's own process: shipping them to the executors costs about a second per micro-batch, which
    a backlog repays and a stream keeping up (a few thousand records a second) does not."""
    return int(os.environ.get("TIDEMARK_EXECUTOR_CHECKS_FROM") or 50_000)


def pipelines_dir() -> Path:
    """Where the pipeline specs are: ``TIDEMARK_PIPELINES_DIR``, or the project's include/pipelines."""
    return Path(os.environ.get("TIDEMARK_PIPELINES_DIR") or PROJECT_DIR / "include" / "pipelines")


def spark_job(script: str) -> Path:
    """A Spark entry script: ``TIDEMARK_SPARK_JOBS_DIR``, or the project's spark_jobs/."""
    return Path(os.environ.get("TIDEMARK_SPARK_JOBS_DIR") or PROJECT_DIR / "spark_jobs") / script


def streams_dir() -> Path:
    """Where the local launcher keeps each standing sink's pid, log and exit code:
    ``TIDEMARK_STREAMS_DIR``, or a folder in the system's temporary directory."""
    import tempfile

    return Path(os.environ.get("TIDEMARK_STREAMS_DIR") or Path(tempfile.gettempdir()) / "tidemark-streams")


def reconcile_dir() -> Path:
    """Where reconciliation writes Great Expectations' Data Docs and the reports of differing rows:
    ``TIDEMARK_RECONCILE_DIR``, or a folder in the system's temporary directory."""
    import tempfile

    return Path(os.environ.get("TIDEMARK_RECONCILE_DIR") or Path(tempfile.gettempdir()) / "tidemark-reconcile")


def code_version() -> str:
    """The deployed code's git commit (recorded with every reconciliation result), else ``unknown``."""
    import subprocess

    try:
        out = subprocess.run(["git", "-C", str(PROJECT_DIR), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"

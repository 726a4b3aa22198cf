"""What a deployment configures: Airflow connection ids, and the environment variables the core
reads (``Environment``: Spark driver memory, where the pipeline specs and Spark job scripts are, ...),
validated together, with working defaults.

Nothing here knows the local stack (ports, state directories): that is ``tidemark_workshop.settings``.
"""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path

from pydantic import Field, NonNegativeInt, PositiveFloat, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from tidemark.protocol.errors import Terminal

# Airflow connection ids: the same names in the local stack and in docker-compose.yaml.
CONN_SOURCE = "tidemark_source"
CONN_WAREHOUSE = "tidemark_warehouse"
CONN_KAFKA = "tidemark_kafka"
CONN_SPARK = "tidemark_spark"
CONN_CONTROL = "tidemark_control"  # its password: the control messages' keyring (tidemark.protocol.control.Keyring)
CONN_CDC = "tidemark_cdc"  # the source as its replication role (Debezium reads the WAL as it)
CONN_CONNECT = "tidemark_connect"  # Kafka Connect's REST API; extra secrets_dir: where its worker reads secrets
CONNECTION_IDS = (CONN_SOURCE, CONN_WAREHOUSE, CONN_KAFKA, CONN_SPARK, CONN_CONTROL, CONN_CDC, CONN_CONNECT)
ENV_PREFIX = "TIDEMARK_"


class ConfigError(Terminal):
    """An environment variable Tidemark reads has a value it cannot use: the message names it."""


class Environment(BaseSettings):
    """Every environment variable the core reads (``TIDEMARK_<FIELD>``), validated together: one bad
    value fails whatever starts (a job, a task, a page) with the variable's name, not deep inside a
    batch. An empty value counts as unset. Secrets are not here: they are read where they are used
    (``spark.jobs.PASSWORD_ENV``, ``control.Keyring``) and never logged."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_ignore_empty=True, extra="ignore")

    # The project's folders (dags/, include/, spark_jobs/) as deployed; default: the folder this package
    # is installed under (include/tidemark -> the project), as in the Astro layout.
    project_dir: Path = Path(__file__).resolve().parents[3]
    # Both jobs stream: the extract holds no window in memory and the sink at most one micro-batch.
    spark_driver_memory: str = Field("1g", pattern=r"(?i)^[0-9]+([kmgtp]b?|b)?$")
    # How long a step waits for the broker before it fails (its task's retries try again later).
    kafka_timeout_s: PositiveFloat = 30.0
    # From how many records in the sink's previous micro-batch the next one's record checks run on
    # Spark's executors. Below it they run in the sink's own process: shipping them costs about a second
    # per micro-batch, which a backlog repays and a stream keeping up (a few thousand a second) does not.
    executor_checks_from: NonNegativeInt = 50_000
    pipelines_dir: Path | None = None  # the pipeline specs; default <project>/include/pipelines
    spark_jobs_dir: Path | None = None  # the Spark entry scripts; default <project>/spark_jobs
    streams_dir: Path | None = None  # the local launcher's pid, log and exit code of each standing sink
    reconcile_dir: Path | None = None  # Great Expectations' Data Docs and the reports of differing rows
    status_dir: Path | None = None  # the health checks' memory: since when each component is down
    spark_jars: str | None = None  # the connector jars a Spark job is given (comma-separated)
    kill_at: str | None = Field(None, pattern=r"^[a-z_]+(:[0-9]+)?$")  # the kill -9 trials' point (faults)
    job_error_file: Path | None = None  # where a Spark job writes its one-line cause


def environment() -> Environment:
    """The environment as Tidemark reads it, validated whole; ``ConfigError`` names each variable that is
    wrong. Parsed again only when a ``TIDEMARK_`` variable changed (tests and the stack set them per
    process; a sink reads some on every micro-batch, and a parse costs a millisecond)."""
    # pydantic-settings reads names in any case: so does the key
    return _parsed(tuple(sorted((k, v) for k, v in os.environ.items() if k.upper().startswith(ENV_PREFIX))))


@functools.lru_cache(maxsize=8)
def _parsed(_variables: tuple[tuple[str, str], ...]) -> Environment:
    try:
        return Environment()
    except ValidationError as exc:
        wrong = "; ".join(f"{ENV_PREFIX}{'_'.join(str(p) for p in e['loc']).upper()}={e.get('input')!r}: {e['msg']}"
                          for e in exc.errors())
        raise ConfigError(f"environment variable {wrong}. Next: fix or unset it (docs/local-stack.md, "
                          "\"The core's variables\", lists each with its default), then start this again") from None


class _ErrorFile(BaseSettings):
    model_config = Environment.model_config  # read as the whole environment reads it
    job_error_file: Path | None = None


def job_error_file() -> Path | None:
    """``TIDEMARK_JOB_ERROR_FILE`` alone: the channel a job's cause takes to its task, so a cause (a bad
    variable among them) reaches the task even when another variable is wrong."""
    return _ErrorFile().job_error_file


def project_dir() -> Path:
    return environment().project_dir


def spark_driver_memory() -> str:
    return environment().spark_driver_memory


def kafka_timeout_s() -> float:
    """How long a step waits for the broker: ``TIDEMARK_KAFKA_TIMEOUT_S``, default 30."""
    return environment().kafka_timeout_s


def executor_checks_from() -> int:
    """``TIDEMARK_EXECUTOR_CHECKS_FROM``, default 50,000 (see ``Environment``)."""
    return environment().executor_checks_from


def pipelines_dir() -> Path:
    """Where the pipeline specs are: ``TIDEMARK_PIPELINES_DIR``, or the project's include/pipelines."""
    env = environment()
    return env.pipelines_dir or env.project_dir / "include" / "pipelines"


def spark_job(script: str) -> Path:
    """A Spark entry script: ``TIDEMARK_SPARK_JOBS_DIR``, or the project's spark_jobs/."""
    env = environment()
    return (env.spark_jobs_dir or env.project_dir / "spark_jobs") / script


def streams_dir() -> Path:
    """Where the local launcher keeps each standing sink's pid, log and exit code:
    ``TIDEMARK_STREAMS_DIR``, or a folder in the system's temporary directory."""
    return environment().streams_dir or Path(tempfile.gettempdir()) / "tidemark-streams"


def reconcile_dir() -> Path:
    """Where reconciliation writes Great Expectations' Data Docs and the reports of differing rows:
    ``TIDEMARK_RECONCILE_DIR``, or a folder in the system's temporary directory."""
    return environment().reconcile_dir or Path(tempfile.gettempdir()) / "tidemark-reconcile"


def status_dir() -> Path:
    """Where the health checks remember since when a component is down: ``TIDEMARK_STATUS_DIR``, or a
    folder in the system's temporary directory."""
    return environment().status_dir or Path(tempfile.gettempdir()) / "tidemark-status"


def spark_jars() -> list[str]:
    """The connector jars for a Spark job: ``TIDEMARK_SPARK_JARS``, comma-separated (empty: none)."""
    return [j for j in (environment().spark_jars or "").split(",") if j]


def code_version() -> str:
    """The deployed code's git commit (recorded with every reconciliation result), else ``unknown``."""
    import subprocess

    try:
        out = subprocess.run(["git", "-C", str(project_dir()), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"

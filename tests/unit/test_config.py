"""The core's environment variables (tidemark.protocol.config.Environment): validated together, a bad value
named with its variable at the start of whatever reads them, an empty value counted as unset."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tidemark.protocol import config
from tidemark.protocol.config import ConfigError
from tidemark.spark.entry import read_cause


def test_defaults_when_nothing_is_set_and_an_empty_value_counts_as_unset(monkeypatch):
    for name in ("TIDEMARK_KAFKA_TIMEOUT_S", "TIDEMARK_PIPELINES_DIR", "TIDEMARK_PROJECT_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TIDEMARK_EXECUTOR_CHECKS_FROM", "")
    assert config.kafka_timeout_s() == 30.0 and config.executor_checks_from() == 50_000
    assert config.pipelines_dir() == Path(config.__file__).resolve().parents[3] / "include" / "pipelines"


@pytest.mark.parametrize(("name", "value"), [
    ("TIDEMARK_KAFKA_TIMEOUT_S", "thirty"), ("TIDEMARK_KAFKA_TIMEOUT_S", "-1"),
    ("TIDEMARK_EXECUTOR_CHECKS_FROM", "1.5"), ("TIDEMARK_SPARK_DRIVER_MEMORY", "lots"),
    ("TIDEMARK_KILL_AT", "staged:x"),
])
def test_a_bad_value_fails_every_read_naming_its_variable_and_value(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=f"environment variable {name}={value!r}") as raised:
        config.pipelines_dir()  # any read: the environment is checked whole
    assert "Next: fix or unset it" in str(raised.value)


def test_a_spark_job_with_a_bad_variable_fails_at_its_start_naming_it(tmp_path):
    """``spark.entry.run`` checks the environment before the job's own code: exit 3, its FAILED line and
    the cause file (the task's failure line) name the variable."""
    cause = tmp_path / "cause.txt"
    code = ("import sys; from tidemark.spark.entry import run; "
            "sys.exit(run(lambda argv: print('the job ran'), [], 'job'))")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(config.__file__).resolve().parents[2]),
           "TIDEMARK_KAFKA_TIMEOUT_S": "soon", "TIDEMARK_JOB_ERROR_FILE": str(cause)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3 and "the job ran" not in done.stdout
    assert "job: FAILED: environment variable TIDEMARK_KAFKA_TIMEOUT_S='soon'" in done.stderr
    assert "TIDEMARK_KAFKA_TIMEOUT_S" in read_cause(cause)[1] and read_cause(cause)[0] == 3


def test_the_core_reads_no_variable_outside_its_environment_but_secrets():
    """Issue 54 item 8: every TIDEMARK_ variable the core reads is a field of ``Environment`` (the secrets,
    read where they are used and never logged, excepted by name); the workshop's are not read."""
    import re

    core = Path(config.__file__).resolve().parents[1]  # the whole core package
    secrets = {"TIDEMARK_JDBC_PASSWORD", "TIDEMARK_WAREHOUSE_PASSWORD", "TIDEMARK_CONTROL_KEYS",
               "TIDEMARK_GX_WAREHOUSE"}  # the last: set here for Great Expectations' config to read
    fields = {f"TIDEMARK_{name.upper()}" for name in config.Environment.model_fields}
    named = {m for path in core.rglob("*.py") for m in re.findall(r"\"(TIDEMARK_[A-Z_]+)\"", path.read_text())}
    assert named - fields - secrets - {"TIDEMARK_"} == set()
    assert not [p for p in core.rglob("*.py") if p.name != "config.py" and "os.environ.get(\"TIDEMARK_" in p.read_text()]


@pytest.mark.parametrize("size", ["1g", "512m", "2gb", "512MB", "1p", "1024"])
def test_driver_memory_takes_what_spark_takes(monkeypatch, size):
    monkeypatch.setenv("TIDEMARK_SPARK_DRIVER_MEMORY", size)
    assert config.spark_driver_memory() == size


def test_a_variable_in_lower_case_is_read_and_its_change_seen(monkeypatch):
    monkeypatch.setenv("tidemark_kafka_timeout_s", "5")
    assert config.kafka_timeout_s() == 5.0
    monkeypatch.setenv("tidemark_kafka_timeout_s", "7")
    assert config.kafka_timeout_s() == 7.0

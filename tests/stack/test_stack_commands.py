"""The stack's own commands: `up` is idempotent, `status` reports every component."""

import subprocess
import sys

import pytest

pytestmark = [pytest.mark.stack, pytest.mark.serial("`up` and `start` act on the whole stack")]


def _stack(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tidemark_workshop.stack", *args], capture_output=True, text=True, timeout=300)


def test_up_again_changes_nothing():
    proc = _stack("up")
    assert proc.returncode == 0, proc.stderr
    assert "postgres: already running" in proc.stdout
    assert "kafka: already running" in proc.stdout
    assert "initdb" not in proc.stdout and "formatting" not in proc.stdout


def test_status_lists_each_component():
    proc = _stack("status")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert any(line.startswith("postgres") and "running" in line for line in lines)
    assert any(line.startswith("kafka") and "running" in line for line in lines)
    assert any(line.startswith("spark") and "ready" in line for line in lines)


def test_unknown_command_fails_with_usage():
    proc = _stack("launch")
    assert proc.returncode == 1
    assert "unknown command 'launch'" in proc.stderr


def test_start_and_stop_name_one_component():
    for command in ("start", "stop"):
        proc = _stack(command)
        assert proc.returncode == 1 and f"usage: python -m tidemark_workshop.stack {command} COMPONENT" in proc.stderr
        proc = _stack(command, "zookeeper")
        assert proc.returncode == 1
        assert "name one component: postgres, kafka, connect, airflow, api-server, scheduler, dag-processor, triggerer" in proc.stderr
    proc = _stack("start", "kafka")  # running: nothing to do
    assert proc.returncode == 0, proc.stderr
    assert "kafka: already running" in proc.stdout


def test_component_names_as_logs_spells_them():
    from tidemark_workshop.stack.__main__ import component

    assert [component(n) for n in ("kafka", "postgres", "airflow", "scheduler", "airflow-api-server")] == [
        "kafka", "postgres", "airflow", "scheduler", "api-server"]


def test_status_shows_the_health_of_the_broker_and_the_databases():
    proc = _stack("status")
    assert proc.returncode == 0, proc.stderr
    health = [line for line in proc.stdout.splitlines() if line.startswith("health ")]
    assert [line.split()[1] for line in health] == ["warehouse:", "source", "kafka:", "connect:"], health
    assert all(line.endswith(" reachable") for line in health), health


def test_kill_9_of_the_connect_worker_is_a_health_row_and_its_keeper_starts_it_again_once(settings):
    """kill -9 of the worker's JVM (what an operator or the OOM killer does): `status` names Connect as
    unreachable with the next step; the stack's keeper starts one worker again, and it answers."""
    import os
    import signal
    import time

    from tidemark_workshop.stack.connect import Connect
    from tidemark_workshop.stack.proc import read_pid

    worker = Connect(settings)
    keeper, jvm = read_pid(worker.pid_file), worker.worker_pid()
    assert keeper and jvm and worker.answers()
    restarts_before = worker.log.read_text(errors="replace").count("keeper: connect ended")
    os.kill(jvm, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while worker.answers():
        assert time.monotonic() < deadline, "the worker still answers after kill -9 of its JVM"
        time.sleep(0.2)
    down = [line for line in _stack("status").stdout.splitlines() if line.split()[:2] == ["health", "connect:"]]
    assert len(down) == 1 and " UNREACHABLE since " in down[0] and "keeper starts a worker" in down[0], down
    deadline = time.monotonic() + 300
    while not worker.answers():
        assert time.monotonic() < deadline, "the keeper did not start the worker again"
        time.sleep(1)
    assert read_pid(worker.pid_file) == keeper and worker.worker_pid() not in (None, jvm)
    log = worker.log.read_text(errors="replace")
    assert log.count("keeper: connect ended") == restarts_before + 1, "one restart, never two workers"
    up = [line for line in _stack("status").stdout.splitlines() if line.split()[:2] == ["health", "connect:"]]
    assert up and up[0].endswith(" reachable"), up

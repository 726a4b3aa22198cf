"""The stack's own commands: `up` is idempotent, `status` reports every component."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.stack


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

"""The stack's keeper (tidemark_workshop.stack.keeper) with real processes: a child killed with -9 is
started again once; a stop ends both; a child that keeps dying is given up, with the reason."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tidemark_workshop.stack.proc import read_pid, spawn, stop_pid

CHILD = "import os, time; print('child', os.getpid(), flush=True); time.sleep(600)"


def _children(log: Path) -> list[int]:
    return [int(line.split()[1]) for line in log.read_text().splitlines() if line.startswith("child ")]


def _until(predicate, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while not (got := predicate()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return got


def test_a_killed_child_is_started_again_once_and_a_stop_ends_the_group(tmp_path: Path):
    log, pid_file = tmp_path / "log", tmp_path / "pid"
    keeper = spawn([sys.executable, "-c", CHILD], log=log, pid_file=pid_file, keep="worker")
    try:
        first = _until(lambda: _children(log))[0]
        os.kill(first, signal.SIGKILL)
        second = _until(lambda: _children(log)[1:])[0]
        assert second != first and "worker ended (exit -9) without being asked to" in log.read_text()
        time.sleep(1.5)
        assert len(_children(log)) == 2  # one restart, never two instances
        assert stop_pid(pid_file, grace_s=10)
        assert read_pid(pid_file) is None
        _until(lambda: not _alive(second))
    finally:
        _kill_group(keeper)


def test_kill_9_of_the_keeper_leaves_its_child_as_the_running_process_of_the_group(tmp_path: Path):
    log, pid_file = tmp_path / "log", tmp_path / "pid"
    keeper = spawn([sys.executable, "-c", CHILD], log=log, pid_file=pid_file, keep="worker")
    try:
        child = _until(lambda: _children(log))[0]
        os.kill(keeper, signal.SIGKILL)
        os.waitpid(keeper, 0)
        assert read_pid(pid_file) == keeper  # the group runs on: still running, so no second start
        assert stop_pid(pid_file, grace_s=10)
        _until(lambda: not _alive(child))
    finally:
        _kill_group(keeper)


def test_a_child_that_keeps_dying_is_given_up_with_the_reason():
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from keeper import keep; "
            "sys.exit(keep('worker', [sys.executable, '-c', 'raise SystemExit(7)'], budget=2, window=60))")
    here = Path(__file__).resolve().parents[2] / "include" / "tidemark_workshop" / "stack"
    done = subprocess.run([sys.executable, "-c", code, str(here)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 7
    assert "restart 2 of 2" in done.stdout and "after 2 restarts within 60 s: not started again" in done.stdout


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] not in "ZX"


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass

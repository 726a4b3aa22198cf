"""The detached local launcher (tidemark.streams.launch) with real processes: no Spark, a few seconds; and the
standalone launcher's command rewrite (tidemark.streams.standalone, pure)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tidemark.protocol.errors import EXIT_OUTAGE, OUTAGE_LINE
from tidemark.streams.launch import LocalLauncher
from tidemark.streams.standalone import StandaloneLauncher, cluster_argv

PY = sys.executable
GRACEFUL = """
import signal, sys, time
def bye(*_):
    print("graceful stop: finished the micro-batch", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, bye)
print("streaming", flush=True)
while True:
    time.sleep(0.1)
"""
STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(f"grandchild {child.pid}", flush=True)
time.sleep(600)
"""


def _printed(launcher: LocalLauncher, name: str) -> list[str]:
    """What the job printed (the launcher's own "--- starting: <command>" lines left out)."""
    return [line for line in launcher.log_tail(name, lines=50).splitlines() if not line.startswith("--- ")]


def _until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_launched_job_outlives_the_process_that_started_it_and_stops_gracefully(launcher, tmp_path: Path):
    starter = f"from tidemark.streams.launch import LocalLauncher; LocalLauncher({str(tmp_path)!r}).start('p1', {[PY, '-c', GRACEFUL]!r})"
    subprocess.run([PY, "-c", starter], check=True, env={"PYTHONPATH": str(Path("include").resolve())})
    _until(lambda: "streaming" in _printed(launcher, "p1"))
    running = launcher.status("p1")  # another process finds it by its files
    assert running.alive and running.pid and running.exit_code is None and running.started_at
    with pytest.raises(RuntimeError, match="already running"):
        launcher.start("p1", [PY, "-c", GRACEFUL])
    stopped = launcher.stop("p1", grace_s=10)
    assert not stopped.alive and stopped.exit_code == 0
    assert "graceful stop" in launcher.log_tail("p1")
    launcher.forget("p1")  # stopped on purpose: the next look sees nothing launched, the log stays
    forgotten = launcher.status("p1")
    assert forgotten.pid is None and forgotten.exit_code is None and "graceful stop" in launcher.log_tail("p1")


@pytest.fixture()
def launcher(tmp_path: Path):
    launcher = LocalLauncher(tmp_path)
    yield launcher
    for name in ("p1", "p2", "p3"):  # a failed test leaves nothing running
        launcher.kill(name)


def test_a_job_that_ignores_sigterm_is_killed_with_its_whole_group(launcher):
    launcher.start("p2", [PY, "-c", STUBBORN])
    _until(lambda: any(line.startswith("grandchild ") for line in _printed(launcher, "p2")))
    grandchild = int(_printed(launcher, "p2")[-1].split()[1])
    stopped = launcher.stop("p2", grace_s=1)
    assert not stopped.alive and stopped.exit_code == 137
    _until(lambda: not Path(f"/proc/{grandchild}").exists()
           or Path(f"/proc/{grandchild}/stat").read_text().split(") ")[1][0] in "ZX")


def test_a_crash_is_seen_with_its_exit_code_and_last_log_lines(launcher):
    assert launcher.status("p3").pid is None and not launcher.status("p3").alive  # never launched
    launcher.start("p3", [PY, "-c", "import sys; print('cannot connect to the broker', flush=True); sys.exit(3)"])
    _until(lambda: launcher.status("p3").exit_code is not None)
    ended = launcher.status("p3")
    assert not ended.alive and ended.exit_code == 3
    assert "cannot connect to the broker" in launcher.log_tail("p3", lines=2)
    again = launcher.start("p3", [PY, "-c", "import time; time.sleep(30)"])  # a restart clears the old exit code
    assert again.alive and again.exit_code is None
    launcher.kill("p3")
    _until(lambda: not launcher.status("p3").alive)


def test_names_are_pipeline_names(tmp_path: Path):
    with pytest.raises(ValueError, match="not a pipeline name"):
        LocalLauncher(tmp_path).status("../etc")


def test_cluster_argv_moves_a_python_driver_onto_the_cluster():
    argv = ["spark-submit", "--master", "local[2]", "--conf", "spark.ui.enabled=false", "--verbose",
            "--deploy-mode=client", "--jars", "a.jar,b.jar", "/x/batch_sink.py", "--spec", "s.yaml"]
    assert cluster_argv(argv, "spark://m:7077", "/j/udf.jar", "/v/python") == [
        "spark-submit", "--master", "spark://m:7077", "--deploy-mode", "cluster",
        "--class", "org.apache.spark.deploy.PythonRunner", "--conf", "spark.pyspark.python=/v/python",
        "--conf", "spark.ui.enabled=false", "--verbose", "--jars", "a.jar,b.jar",
        "/j/udf.jar", "/x/batch_sink.py", "", "--spec", "s.yaml"]
    with pytest.raises(ValueError, match="not a spark-submit of a Python application"):
        cluster_argv(["spark-submit", "--class", "Main", "app.jar"], "spark://m:7077", "/j/udf.jar", "/v/python")


class _Master(StandaloneLauncher):
    """The master's view and the driver's log as given (the exit-code rule is what is tested)."""

    def __init__(self, root: Path, state: str, log: str):
        super().__init__(root, "spark://m:7077", "http://m:8080", "/j/udf.jar", PY)
        self.state, self.log = state, log

    def _master_state(self) -> dict:
        return {"completeddrivers": [{"id": "driver-1", "state": self.state, "worker": "w"}], "workers": []}

    def _driver_log(self, driver: dict, lines: int) -> str:
        return self.log


@pytest.mark.parametrize(("state", "log", "code"), [
    ("FAILED", f"sink: FAILED: pipeline p: standing sink stopped: the broker ...\nsink: {OUTAGE_LINE}", EXIT_OUTAGE),
    ("FAILED", "sink: FAILED: pipeline p: a record was refused", 1),
    ("FINISHED", f"sink: {OUTAGE_LINE}", 0),
    ("KILLED", "", 137),
])
def test_a_cluster_driver_that_ended_for_an_outage_reads_as_exit_75(tmp_path: Path, state, log, code):
    """The master keeps a state, not an exit code: a failed driver whose log ends with the outage line
    is an outage (waited out by the supervisor), any other failure is exit 1 (counted)."""
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "driver").write_text("driver-1 1700000000\n")
    instance = _Master(tmp_path, state, log).status("p")
    assert (instance.alive, instance.exit_code) == (False, code)


def test_kill_9_of_the_wrapper_leaves_the_job_running_as_the_one_instance_and_a_stop_ends_it(launcher):
    """Issue 53: the pid file names an sh wrapper; kill -9 of it left the command (a Spark JVM) running,
    re-parented to init, while status said ended and the supervisor started a second one beside it."""
    import os
    import signal

    launcher.start("p1", [PY, "-c", GRACEFUL])
    _until(lambda: "streaming" in _printed(launcher, "p1"))
    wrapper = launcher.status("p1").pid
    os.kill(wrapper, signal.SIGKILL)
    _until(lambda: not Path(f"/proc/{wrapper}").exists() or Path(f"/proc/{wrapper}/stat").read_text()
           .split(") ")[1][0] in "ZX")
    orphaned = launcher.status("p1")
    assert orphaned.alive and orphaned.exit_code is None  # its command still runs: it is the instance
    with pytest.raises(RuntimeError, match="already running"):
        launcher.start("p1", [PY, "-c", GRACEFUL])
    stopped = launcher.stop("p1", grace_s=10)  # TERM to the group: the command ends as it would
    assert not stopped.alive
    assert "graceful stop" in launcher.log_tail("p1")
    again = launcher.start("p1", [PY, "-c", GRACEFUL])  # now a new instance may start
    assert again.alive and again.pid != wrapper
    launcher.kill("p1")
    _until(lambda: not launcher.status("p1").alive)

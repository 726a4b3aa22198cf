"""Run a standing sink's driver on a Spark standalone cluster, and find it again through the master.

``spark-submit --deploy-mode cluster`` to a standalone master refuses Python applications (Spark 4.0:
"Cluster deploy mode is currently not supported for python applications on standalone clusters").
The master does run any JVM main class, though, and the Python driver of client mode is started by
one: ``org.apache.spark.deploy.PythonRunner <script> <py-files> <args>``. So the launcher submits
that class with a jar as the primary resource (any jar the workers can read; Tidemark's UDF jar),
and the worker runs the Python driver exactly as spark-submit would have on this machine. The
script, the spec and the interpreter (``spark.pyspark.python``) must be at the same paths on the
workers (one machine locally; a shared image or volume on a real cluster).

The legacy submission client hands its whole environment to the driver, so the JDBC password
travels as an environment variable, never on a command line. The master's JSON view
(``/json/``) gives the driver's state; ``org.apache.spark.deploy.Client kill`` stops it through
the master; its log is read from the worker's web UI. What the launcher keeps itself, under
``<root>/<name>/``: the driver id and when it was submitted, and the submission's own log.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.parse
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

from tidemark.protocol.errors import EXIT_OUTAGE, OUTAGE_LINE, Transient
from tidemark.streams.launch import Instance, Launcher

RUNNER = "org.apache.spark.deploy.PythonRunner"
ALIVE = frozenset({"SUBMITTED", "RUNNING", "RELAUNCHING", "UNKNOWN"})
EXIT_CODES = {"FINISHED": 0, "FAILED": 1, "ERROR": 1, "KILLED": 137}  # the master keeps a state, not a code
# spark-submit options that take no value; every other --option is followed by one.
FLAGS = frozenset({"--verbose", "-v", "--supervise", "--help", "-h", "--version"})


class ClusterUnavailable(Transient, RuntimeError):
    """The master did not answer: nothing can be said about the driver now."""


def cluster_argv(argv: list[str], master: str, runner_jar: str, python: str) -> list[str]:
    """A client-mode ``spark-submit ... app.py args`` rewritten to run its Python driver on ``master``."""
    options, i = [], 1
    while i < len(argv) and argv[i].startswith("-"):
        take = 1 if argv[i] in FLAGS or "=" in argv[i] else 2
        if argv[i].split("=", 1)[0] not in ("--master", "--deploy-mode", "--class"):
            options += argv[i:i + take]
        i += take
    if i >= len(argv) or not argv[i].endswith(".py"):
        raise ValueError(f"not a spark-submit of a Python application: {' '.join(argv[:i + 1])}")
    app, args = argv[i], argv[i + 1:]
    return [argv[0], "--master", master, "--deploy-mode", "cluster", "--class", RUNNER,
            "--conf", f"spark.pyspark.python={python}", *options, runner_jar, app, "", *args]


class StandaloneLauncher(Launcher):
    records = ("driver",)

    def __init__(self, root: Path, master: str, master_ui: str, runner_jar: str, python: str,
                 *, spark_class: str = "spark-class", timeout_s: float = 120.0):
        if not master.startswith("spark://"):
            raise ValueError(f"not a standalone master URL: {master!r} (spark://host:port)")
        super().__init__(root)
        self.master, self.master_ui = master, master_ui.rstrip("/")
        self.runner_jar, self.python, self.timeout_s = runner_jar, python, timeout_s
        self.spark_class = spark_class

    # --- the master's view ------------------------------------------------------------------
    def _master_state(self) -> dict:
        try:
            with urllib.request.urlopen(f"{self.master_ui}/json/", timeout=10) as response:
                return json.load(response)
        except OSError as exc:
            raise ClusterUnavailable(f"the Spark master's web UI {self.master_ui} did not answer ({exc}); "
                                     f"is the master {self.master} up?") from None

    def _driver(self, driver_id: str) -> tuple[dict | None, dict]:
        state = self._master_state()
        for driver in (*state.get("activedrivers", []), *state.get("completeddrivers", [])):
            if driver.get("id") == driver_id:
                return driver, state
        return None, state

    # --- the Launcher interface -------------------------------------------------------------
    def _launch(self, name: str, d: Path, argv: list[str], env: dict[str, str] | None) -> None:
        """Submits the driver to the master and records its id."""
        command = cluster_argv(argv, self.master, self.runner_jar, self.python)
        submitted = time.time()
        proc = subprocess.run(command, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=self.timeout_s)
        output = proc.stdout + proc.stderr
        with open(d / "log", "a") as log:
            log.write(f"--- {datetime.now(timezone.utc).isoformat()} submitting to {self.master}: "
                      f"{' '.join(command)}\n{output}")
        found = re.search(r"Driver successfully submitted as (driver-\S+)", output)
        if proc.returncode != 0 or not found:
            tail = " | ".join(output.strip().splitlines()[-3:])
            raise RuntimeError(f"{name}: spark-submit to {self.master} failed (exit {proc.returncode}): {tail}")
        (d / "driver").write_text(f"{found.group(1)} {submitted}\n")

    def status(self, name: str) -> Instance:
        d = self._dir(name)
        try:
            driver_id, submitted = (d / "driver").read_text().split()
        except (FileNotFoundError, ValueError):
            return Instance(name, None, None, False, None, d / "log")
        started = datetime.fromtimestamp(float(submitted), timezone.utc)
        driver, _ = self._driver(driver_id)
        if driver is None:  # a master that restarted forgot it: gone, with no exit code to tell
            return Instance(name, None, started, False, None, d / "log", driver_id)
        alive = driver["state"] in ALIVE
        return Instance(name, None, started, alive, None if alive else self._exit_code(name, driver),
                        d / "log", driver_id)

    def _exit_code(self, name: str, driver: dict) -> int:
        """The master's state as an exit code; a failed driver whose log ends with the outage line ended
        for an outage (exit 75), which its supervisor waits out instead of counting."""
        code = EXIT_CODES.get(driver["state"], 1)
        if code == 1 and OUTAGE_LINE in self._driver_log(driver, lines=40):
            return EXIT_OUTAGE
        return code

    def stop(self, name: str, grace_s: float = 30.0) -> Instance:
        """Through the master: the worker ends the driver's process (the sink stops itself first
        when its desired state changes; this is for one that did not)."""
        self.kill(name, wait_s=grace_s)
        return self.status(name)

    def kill(self, name: str, wait_s: float = 30.0) -> None:
        current = self.status(name)
        if not current.alive:
            return
        subprocess.run([self.spark_class, "org.apache.spark.deploy.Client", "kill", self.master, current.driver],
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=self.timeout_s)
        deadline = time.monotonic() + wait_s
        while self.status(name).alive and time.monotonic() < deadline:
            time.sleep(0.5)

    def log_location(self, name: str) -> str:
        current = self.status(name)
        worker = self._worker_ui(current.driver) if current.driver else None
        if worker is None:
            return str(self._dir(name) / "log")
        query = urllib.parse.urlencode({"driverId": current.driver, "logType": "stderr"})
        return f"{worker}/logPage/?{query}"

    def log_tail(self, name: str, lines: int = 20) -> str:
        """The driver's own output (stdout, then stderr) from its worker; the submission log before
        the driver ran anywhere."""
        current = self.status(name)
        driver = self._driver(current.driver)[0] if current.driver else None
        return (self._driver_log(driver, lines) if driver is not None else "") or self._own_log_tail(name, lines)

    def _driver_log(self, driver: dict, lines: int) -> str:
        """The last ``lines`` of the driver's stdout then stderr, from its worker's web UI ("" when unreadable)."""
        worker = self._worker_ui(driver["id"])
        parts = []
        if worker is not None:
            for kind in ("stdout", "stderr"):
                query = urllib.parse.urlencode({"driverId": driver["id"], "logType": kind, "byteLength": 64 * 1024})
                try:
                    with urllib.request.urlopen(f"{worker}/log/?{query}", timeout=10) as response:
                        text = response.read().decode("utf-8", "replace")
                except OSError:
                    continue
                parts += [line for line in text.splitlines() if not line.startswith("==== Bytes ")]
        return "\n".join(parts[-lines:])

    def _worker_ui(self, driver_id: str) -> str | None:
        driver, state = self._driver(driver_id)
        if driver is None:
            return None
        for worker in state.get("workers", []):
            if worker.get("id") == driver.get("worker"):
                return worker.get("webuiaddress")
        return None

"""Launch long-running jobs outside Airflow's worker slots, and find them again later.

Every launcher is a ``Launcher`` (the supervisor knows no other): the base class keeps what all of
them share (a pipeline's directory, the refusal to start a second instance, forgetting one). ``LocalLauncher``
(here) runs a job on this machine; ``tidemark.streams.standalone.StandaloneLauncher`` submits it to a Spark
standalone master in cluster mode and asks the master for its driver's state.

``LocalLauncher`` runs a command detached: its own session and process group, its pid, start
time, log and exit code in files under ``<root>/<name>/``, so it outlives the Airflow task that
started it and the next supervisor run (another process) can tell whether it runs, how it ended,
and what its log last said. A thin ``sh`` wrapper waits for the command and writes its exit code;
a stop sends SIGTERM to the command (through the wrapper) and SIGKILL to the whole group after a
grace period. A pid is trusted only with the start time recorded for it (pids are reused).

The process group is the unit, as systemd's cgroup is: the instance runs while any process of its
group does. ``kill -9`` of the wrapper (what an operator, an OOM killer or a container runtime may
do) leaves the command and its JVM running, re-parented to init: they are still the instance, so no
second one starts beside them, and a stop signals and waits for the whole group.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from tidemark.protocol.spec import NAME_PATTERN

# "$0" is the exit-code file, "$@" the command. TERM to the wrapper is passed on to the command;
# `wait` returns early (128 + signal) when a trap runs, so it waits again for the real exit code.
WRAPPER = """
"$@" < /dev/null &
child=$!
trap 'interrupted=1; kill -TERM "$child" 2>/dev/null' TERM
trap 'interrupted=1; kill -INT "$child" 2>/dev/null' INT
while :; do
  interrupted=0
  wait "$child"; code=$?
  [ "$interrupted" = 1 ] || break
done
echo "$code" > "$0.tmp" && mv "$0.tmp" "$0"
"""


@dataclass(frozen=True)
class Instance:
    name: str
    pid: int | None  # the wrapper's pid, also the process group id (None: never launched here)
    started_at: datetime | None
    alive: bool
    exit_code: int | None  # set once it ended (137: killed)
    log: Path
    driver: str | None = None  # a cluster's driver id (the standalone launcher), instead of a pid

    @property
    def handle(self) -> str:
        """How a person finds it: ``pid 4242`` here, ``driver driver-2026...`` on a cluster."""
        return f"driver {self.driver}" if self.driver else f"pid {self.pid}"


class Launcher(ABC):
    """What the supervisor asks of a launcher, for one job per pipeline name. What a launcher keeps
    of each job lives under ``<root>/<name>/``: its log and the ``records`` that say it was launched."""

    records: tuple[str, ...] = ()  # what ``forget`` drops (the log stays)

    def __init__(self, root: Path):
        self.root = Path(root)

    def _dir(self, name: str) -> Path:
        if not NAME_PATTERN.fullmatch(name):
            raise ValueError(f"not a pipeline name: {name!r}")
        return self.root / name

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Instance:
        """Launch ``argv`` for ``name``; refuses while an instance of ``name`` still runs."""
        current = self.status(name)
        if current.alive:
            raise RuntimeError(f"{name}: already running as {current.handle} since {current.started_at}")
        d = self._dir(name)
        d.mkdir(parents=True, exist_ok=True)
        self._launch(name, d, argv, env)
        return self.status(name)

    def forget(self, name: str) -> None:
        """Drop the record of an instance that was stopped on purpose (its log stays), so the next
        look at the pipeline sees nothing launched: a start, not a restart against the budget."""
        if self.status(name).alive:
            raise RuntimeError(f"{name}: still running; stop it before forgetting it")
        for leftover in self.records:
            (self._dir(name) / leftover).unlink(missing_ok=True)

    def _own_log_tail(self, name: str, lines: int) -> str:
        """The last ``lines`` of the launcher's own log of ``name`` (its last 64 KiB)."""
        try:
            with open(self._dir(name) / "log", "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(f.tell() - 64 * 1024, 0))
                return b"\n".join(f.read().splitlines()[-lines:]).decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    @abstractmethod
    def _launch(self, name: str, directory: Path, argv: list[str], env: dict[str, str] | None) -> None: ...

    @abstractmethod
    def status(self, name: str) -> Instance: ...

    @abstractmethod
    def stop(self, name: str, grace_s: float = 30.0) -> Instance: ...

    @abstractmethod
    def kill(self, name: str) -> None: ...

    @abstractmethod
    def log_tail(self, name: str, lines: int = 20) -> str: ...

    @abstractmethod
    def log_location(self, name: str) -> str: ...


class LocalLauncher(Launcher):
    records = ("pid", "exit_code")

    def _launch(self, name: str, d: Path, argv: list[str], env: dict[str, str] | None) -> None:
        """Runs ``argv`` detached, behind the wrapper that records its exit code."""
        (d / "exit_code").unlink(missing_ok=True)
        with open(d / "log", "ab") as log:
            log.write(f"--- {datetime.now(timezone.utc).isoformat()} starting: {' '.join(argv)}\n".encode())
            log.flush()
            proc = subprocess.Popen(["/bin/sh", "-c", WRAPPER, str(d / "exit_code"), *argv],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, env=env, close_fds=True)
        (d / "pid").write_text(f"{proc.pid} {_start_ticks(proc.pid)} {time.time()}\n")

    def status(self, name: str) -> Instance:
        d = self._dir(name)
        exit_code = _read_int(d / "exit_code")
        try:
            pid_s, ticks_s, started_s = (d / "pid").read_text().split()
        except (FileNotFoundError, ValueError):
            return Instance(name, None, None, False, exit_code, d / "log")
        pid, started = int(pid_s), datetime.fromtimestamp(float(started_s), timezone.utc)
        wrapper = _start_ticks(pid) == ticks_s and not _zombie(pid)
        alive = exit_code is None and (wrapper or _group_alive(pid, ticks_s))
        if not alive and exit_code is None:
            exit_code = _read_int(d / "exit_code")  # it may have ended between the two reads
        return Instance(name, pid, started, alive, exit_code, d / "log")

    def stop(self, name: str, grace_s: float = 30.0) -> Instance:
        """SIGTERM to the command; SIGKILL to its whole process group if it has not ended after ``grace_s``."""
        current = self.status(name)
        if not current.alive:
            return current
        try:
            os.kill(current.pid, signal.SIGTERM)
        except ProcessLookupError:  # the wrapper was killed: its command runs on in the group
            _signal_group(current.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if not self.status(name).alive:
                break
            time.sleep(0.2)
        self.kill(name)
        return self.status(name)

    def kill(self, name: str) -> None:
        """SIGKILL to every process of the instance's group (what is left of it)."""
        current = self.status(name)
        if current.pid is None:
            return
        _signal_group(current.pid, signal.SIGKILL)
        d = self._dir(name)
        if _read_int(d / "exit_code") is None and not current.alive:
            return
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not (d / "exit_code").exists():
            if not self.status(name).alive:
                (d / "exit_code").write_text("137\n")  # the wrapper died with it
                break
            time.sleep(0.1)

    def log_location(self, name: str) -> str:
        return str(self._dir(name) / "log")

    def log_tail(self, name: str, lines: int = 20) -> str:
        return self._own_log_tail(name, lines)


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return raw[raw.rindex(")") + 2:].split()  # fields after the command name, which may hold spaces


def _start_ticks(pid: int) -> str | None:
    fields = _stat(pid)
    return fields[19] if fields else None  # field 22, starttime


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs on this host: it exists and is not a zombie (a killed process whose parent died
    lingers as one until init reaps it, and signal 0 still reaches it)."""
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    fields = _stat(pid)
    return fields is None or fields[0] in ("Z", "X")


def _group_alive(pgid: int, since_ticks: str) -> bool:
    """Whether a process of the instance's group still runs: same process group and session (the wrapper
    made both, ``start_new_session``), not a zombie, started no earlier than the wrapper (a reused id
    is someone else's group)."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = _stat(int(entry.name))
        if (fields and fields[2] == fields[3] == str(pgid) and fields[0] not in ("Z", "X")
                and int(fields[19]) >= int(since_ticks)):
            return True
    return False


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None

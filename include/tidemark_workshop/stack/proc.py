"""Small process helpers shared by the stack components: pid files, waiting, log tails."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path


class StackError(RuntimeError):
    """A stack step failed; the message says what and what to do next."""


def say(component: str, message: str) -> None:
    print(f"[tidemark stack] {component}: {message}", flush=True)


def run(cmd: Sequence[str], *, what: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    """Run a command to completion; on failure raise with its output so the cause is visible."""
    proc = subprocess.run(
        list(cmd), env=env, cwd=cwd, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    if proc.returncode != 0:
        raise StackError(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n{proc.stdout[-4000:]}")
    return proc.stdout


def tail(path: Path, lines: int = 30) -> str:
    if not path.exists():
        return f"(no log at {path})"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def read_pid(pid_file: Path) -> int | None:
    try:
        pid = int(pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    if _live(pid):
        return pid
    # the process is gone, but what it started may run on in its group (kill -9 of a keeper)
    return pid if group_process(pid, "") is not None else None


def _live(pid: int) -> bool:
    """Running: not gone, and not a zombie (a child of this process killed with -9 stays one until reaped:
    reaped here, as a long-lived caller such as a failover campaign never waits for what it spawned)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, owned by another user
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    if state not in ("Z", "X"):
        return True
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    return False


def group_process(pgid: int, program: str) -> int | None:
    """The pid of a live process of group ``pgid`` whose command starts with ``program`` (``java``, ``python``);
    None: none runs."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
            argv0 = Path(f"/proc/{entry.name}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[2] == str(pgid) and fields[0] not in ("Z", "X") and os.path.basename(argv0).startswith(program):
            return int(entry.name)
    return None


def spawn(cmd: Sequence[str], *, log: Path, pid_file: Path, env: dict[str, str] | None = None,
          cwd: Path | None = None, keep: str | None = None) -> int:
    """Start a long-running process in its own session, detached from our terminal; with ``keep`` (its
    name), under a keeper that starts it again when it dies (``tidemark_workshop.stack.keeper``)."""
    if keep is not None:
        cmd = [sys.executable, str(Path(__file__).with_name("keeper.py")), keep, "--", *cmd]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            list(cmd), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, cwd=cwd, start_new_session=True,
        )
    pid_file.write_text(str(proc.pid))
    return proc.pid


def stop_pid(pid_file: Path, *, grace_s: float = 30.0) -> bool:
    """SIGTERM the process group, then SIGKILL after the grace period. True if one was running."""
    pid = read_pid(pid_file)
    if pid is None:
        pid_file.unlink(missing_ok=True)
        return False
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and read_pid(pid_file) is not None:
        _reap(pid)
        time.sleep(0.3)
    if read_pid(pid_file) is not None:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _reap(pid)
    pid_file.unlink(missing_ok=True)
    return True


def _reap(pid: int) -> None:
    # When we started the process ourselves in this interpreter, collect it so it is not a zombie.
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def wait_until(check: Callable[[], bool], *, timeout_s: float, what: str, alive: Callable[[], bool], log: Path,
               busy_cap_s: float | None = None) -> None:
    """Wait for ``check``. Past ``timeout_s``, a process whose log still grows is busy, not stuck (a loaded
    machine: a JVM starting on two busy cores): the wait goes on, up to ``busy_cap_s`` (five times the
    timeout), saying so every 30 s. A failure names what did not answer and its last error lines, not its
    whole log (a worker's log starts with its configuration)."""
    started = time.monotonic()
    cap = started + (busy_cap_s if busy_cap_s is not None else 5 * timeout_s)
    size, grew_at, told = _size(log), started, started
    while True:
        if alive() and check():
            return
        if not alive():
            raise StackError(f"{what} exited during start-up; {error_lines(log)}")
        now = time.monotonic()
        if _size(log) != size:
            size, grew_at = _size(log), now
        if now - started > timeout_s and (now - grew_at > 30 or now > cap):
            raise StackError(f"{what} did not answer within {now - started:.0f} s (its log last grew "
                             f"{now - grew_at:.0f} s ago); {error_lines(log)}")
        if now - started > timeout_s and now - told >= 30:
            say(what, f"still starting after {now - started:.0f} s, its log growing (a busy machine): waiting on, up "
                      f"to {cap - started:.0f} s")
            told = now
        time.sleep(0.5)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


def error_lines(log: Path, lines: int = 5) -> str:
    """The last error lines of a log (its last lines when none looks like an error), and where it is."""
    if not log.exists():
        return f"no log at {log}"
    text = log.read_text(errors="replace").splitlines()
    errors = [line for line in text if any(m in line for m in (" ERROR ", "Exception", "Caused by", "FATAL"))]
    shown = "\n  ".join(line[:300] for line in (errors or text)[-lines:])
    return f"its last {'error ' if errors else ''}lines ({log}):\n  {shown}"

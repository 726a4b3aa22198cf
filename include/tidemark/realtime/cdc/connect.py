"""Kafka Connect's REST API, as the supervisor uses it: the calls and the errors, named.

A 409 (the worker is rebalancing) is retried a few times; any other refusal is a ``ConnectError``
carrying Connect's own message and the call that got it.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from tenacity import retry, retry_if_exception, stop_after_attempt, wait_exponential

from tidemark.protocol.errors import Transient


class ConnectError(Transient, RuntimeError):
    def __init__(self, call: str, status: int | None, message: str):
        super().__init__(f"Kafka Connect {call}: {f'HTTP {status}: ' if status else ''}{message}")
        self.status = status


@dataclass(frozen=True)
class TaskState:
    id: int
    state: str  # RUNNING, FAILED, PAUSED, UNASSIGNED, RESTARTING
    trace: str | None = None

    @property
    def error_line(self) -> str | None:
        """The task's own error: the trace's first line (the exception and its message)."""
        return self.trace.strip().splitlines()[0] if self.trace else None


@dataclass(frozen=True)
class ConnectorState:
    name: str
    state: str  # RUNNING, FAILED, PAUSED, STOPPED, UNASSIGNED, RESTARTING; MISSING: not created
    tasks: tuple[TaskState, ...] = ()
    trace: str | None = None

    @property
    def running(self) -> bool:
        return self.state == "RUNNING" and bool(self.tasks) and all(t.state == "RUNNING" for t in self.tasks)

    @property
    def failed_tasks(self) -> tuple[TaskState, ...]:
        return tuple(t for t in self.tasks if t.state == "FAILED")


def _rebalancing(exc: BaseException) -> bool:
    return isinstance(exc, ConnectError) and exc.status == 409


class ConnectClient:
    def __init__(self, url: str, *, timeout_s: float = 10.0):
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    @retry(retry=retry_if_exception(_rebalancing), stop=stop_after_attempt(5),
           wait=wait_exponential(multiplier=0.5, max=5), reraise=True)
    def _call(self, method: str, path: str, body: Any = None) -> Any:
        call = f"{method} {path}"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json", "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                message = json.loads(raw).get("message") or raw.decode(errors="replace")
            except ValueError:
                message = raw.decode(errors="replace")[:500]
            raise ConnectError(call, exc.code, message) from None
        except OSError as exc:  # refused, timed out: the worker is down or starting
            raise ConnectError(call, None, f"no answer from {self.url} ({exc})") from None
        return json.loads(raw) if raw else None

    @staticmethod
    def _path(name: str, suffix: str = "") -> str:
        return f"/connectors/{urllib.parse.quote(name, safe='')}{suffix}"

    def version(self) -> str:
        """The worker's version (``GET /``): that it answers at all (the health check)."""
        return str((self._call("GET", "/") or {}).get("version") or "unknown")

    def create_stopped(self, name: str, config: dict[str, str]) -> None:
        """Create the connector in Connect's STOPPED state: nothing runs until ``resume``."""
        self._call("POST", "/connectors", {"name": name, "config": config, "initial_state": "STOPPED"})

    def reset_offsets(self, name: str) -> None:
        """Forget the source offsets Connect keeps for the connector (its name's, in the offsets topic,
        which outlive a deleted connector). It must be STOPPED; Debezium then starts from its slot."""
        self._call("DELETE", self._path(name, "/offsets"))

    def put_config(self, name: str, config: dict[str, str]) -> None:
        """Create the connector, or update its configuration (Connect restarts it then)."""
        self._call("PUT", self._path(name, "/config"), config)

    def config(self, name: str) -> dict[str, str] | None:
        try:
            return self._call("GET", self._path(name, "/config"))
        except ConnectError as exc:
            if exc.status == 404:
                return None
            raise

    def state(self, name: str) -> ConnectorState:
        try:
            raw = self._call("GET", self._path(name, "/status"))
        except ConnectError as exc:
            if exc.status == 404:
                return ConnectorState(name, "MISSING")
            raise
        tasks = tuple(TaskState(t["id"], t["state"], t.get("trace")) for t in raw.get("tasks", []))
        connector = raw.get("connector", {})
        return ConnectorState(name, connector.get("state", "UNASSIGNED"), tasks, connector.get("trace"))

    def restart(self, name: str, *, only_failed: bool = True) -> None:
        self._call("POST", self._path(name, f"/restart?includeTasks=true&onlyFailed={str(only_failed).lower()}"))

    def pause(self, name: str) -> None:
        self._call("PUT", self._path(name, "/pause"))

    def resume(self, name: str) -> None:
        self._call("PUT", self._path(name, "/resume"))

    def stop(self, name: str) -> None:
        """Stop its tasks and keep its configuration and offsets (Connect's STOPPED state)."""
        self._call("PUT", self._path(name, "/stop"))

    def delete(self, name: str) -> None:
        self._call("DELETE", self._path(name))

    def plugins(self) -> list[str]:
        return [p["class"] for p in self._call("GET", "/connector-plugins")]

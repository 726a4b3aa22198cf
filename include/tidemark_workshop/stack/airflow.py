"""Airflow 3 for the local stack: home in the state directory, metadata in our PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import time
from urllib.parse import quote

from tidemark_workshop.settings import Settings
from tidemark_workshop.stack.proc import StackError, read_pid, run, say, spawn, stop_pid, wait_until


def _env(settings: Settings) -> dict[str, str]:
    return {**os.environ, **settings.runtime_env()}


def migrate(settings: Settings) -> None:
    from importlib.metadata import version

    airflow_version = version("apache-airflow")
    settings.airflow_home.mkdir(parents=True, exist_ok=True)
    # Migrating an up-to-date database costs seconds of imports: skip when this version did it.
    stamp = settings.airflow_home / ".migrated"
    marker = f"{airflow_version} {settings.pg_port}"
    if stamp.exists() and stamp.read_text() == marker:
        return
    say("airflow", f"migrating the metadata database (Airflow {airflow_version})")
    run(["airflow", "db", "migrate"], what="airflow db migrate", env=_env(settings))
    stamp.write_text(marker)


class AirflowUI:
    """`airflow standalone`-style services (api-server, scheduler, dag-processor, triggerer)."""

    components = ("api-server", "scheduler", "dag-processor", "triggerer")

    def __init__(self, settings: Settings):
        self.s = settings
        # Everything on 127.0.0.1. The log servers of scheduler and triggerer would listen on every
        # interface at fixed ports; with LocalExecutor the api-server reads the log files directly.
        self.arguments = {
            "api-server": ["--host", "127.0.0.1", "--port", str(settings.airflow_port)],
            "scheduler": ["--skip-serve-logs"],
            "dag-processor": [],
            "triggerer": ["--skip-serve-logs"],
        }

    def _pid(self, name: str):
        return self.s.airflow_home / f"{name}.pid"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.s.airflow_port}"

    def start(self, extra_env: dict[str, str] | None = None, only: tuple[str, ...] | None = None) -> None:
        """Start the services not running (``only``: just these of ``components``)."""
        env = {**_env(self.s), **(extra_env or {})}
        for name in self._chosen(only):
            if read_pid(self._pid(name)) is not None:
                if only:
                    say("airflow", f"{name} already running")
                continue
            cmd = ["airflow", name, *self.arguments[name]]
            # cwd: Spark jobs leave an artifacts/ directory wherever they run
            spawn(cmd, log=self.s.logs_dir / f"airflow-{name}.log", pid_file=self._pid(name), env=env,
                  cwd=self.s.state_dir)
            if only:
                say("airflow", f"{name} starting (log {self.s.logs_dir / f'airflow-{name}.log'})")
        if not only or "api-server" in only:
            say("airflow", f"UI starting at {self.url} (no login: all users are admins locally)")

    def wait_healthy(self, timeout_s: float = 180.0) -> None:
        """Until the api-server answers and reports scheduler, dag-processor and triggerer healthy."""
        import json
        import urllib.request

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"{self.url}/api/v2/monitor/health", timeout=5) as resp:
                    health = json.load(resp)
            except OSError:
                return False
            return all((health.get(c) or {}).get("status") == "healthy"
                       for c in ("metadatabase", "scheduler", "dag_processor", "triggerer"))

        log = self.s.logs_dir / "airflow-api-server.log"
        wait_until(healthy, timeout_s=timeout_s, what="the Airflow services",
                   alive=lambda: all(read_pid(self._pid(n)) is not None for n in self.components), log=log)

    def stop(self, only: tuple[str, ...] | None = None) -> None:
        from concurrent.futures import ThreadPoolExecutor

        names = self._chosen(only)
        with ThreadPoolExecutor(max_workers=len(names) or 1) as pool:  # at once: each may take its grace period
            stopped = list(pool.map(lambda name: stop_pid(self._pid(name)), names))
        for name, was_running in zip(names, stopped):
            if was_running:
                say("airflow", f"{name} stopped")
            elif only:
                say("airflow", f"{name} not running")

    def _chosen(self, only: tuple[str, ...] | None) -> tuple[str, ...]:
        unknown = sorted(set(only or ()) - set(self.components))
        if unknown:
            raise StackError(f"no Airflow service {', '.join(unknown)}; the services: {', '.join(self.components)}")
        return tuple(n for n in self.components if not only or n in only)

    def status(self) -> list[str]:
        lines = []
        for name in self.components:
            state = "running" if read_pid(self._pid(name)) is not None else "stopped"
            lines.append(f"airflow   {state:8} {name}  log={self.s.logs_dir / f'airflow-{name}.log'}")
        return lines


def exec_in_env(settings: Settings, argv: list[str]) -> int:
    return subprocess.call(argv, env=_env(settings))



class RestApi:
    """The REST API the Airflow UI uses (`/api/v2`): locally every request is an admin's."""

    def __init__(self, url: str, timeout_s: float = 600.0):
        self.url, self.timeout_s = url, timeout_s

    def call(self, method: str, path: str, body: dict | None = None):
        import json
        import urllib.error
        import urllib.request

        req = urllib.request.Request(
            f"{self.url}/api/v2{path}", method=method, data=json.dumps(body).encode() if body is not None else None,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return json.load(resp)
        except urllib.error.HTTPError as exc:
            raise StackError(f"{method} {path}: HTTP {exc.code}: {exc.read()[:2000]!r}") from None

    def exists(self, dag_id: str) -> bool:
        try:
            self.call("GET", f"/dags/{dag_id}")
            return True
        except StackError:
            return False

    def trigger(self, dag_id: str, conf: dict | None = None) -> str:
        """A manual run, as the UI's Trigger button makes it (``conf``: its params); returns its run id."""
        from datetime import datetime, timezone

        body = {"logical_date": datetime.now(timezone.utc).isoformat(), **({"conf": conf} if conf else {})}
        run = self.call("POST", f"/dags/{dag_id}/dagRuns", body)
        return run["dag_run_id"]

    def runs(self, dag_id: str, **query) -> list[dict]:
        from urllib.parse import urlencode

        return self.call("GET", f"/dags/{dag_id}/dagRuns?" + urlencode({"order_by": "logical_date", **query}))["dag_runs"]

    def run(self, dag_id: str, run_id: str) -> dict:
        return self.call("GET", f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}")

    def task_instances(self, dag_id: str, run_id: str) -> list[dict]:
        return self.call("GET", f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances")["task_instances"]

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        return {t["task_id"]: t["state"] for t in self.task_instances(dag_id, run_id)}

    def log_text(self, dag_id: str, run_id: str, task_id: str, try_number: int) -> str:
        body = self.call("GET", f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances/{task_id}/logs/"
                                f"{try_number}?full_content=true")
        content = body.get("content")
        if isinstance(content, list):
            return "\n".join(str(c.get("event", "")) if isinstance(c, dict) else str(c) for c in content)
        return str(content)

    def wait_for(self, what: str, check, timeout_s: float | None = None, every_s: float = 1.0):
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        while time.monotonic() < deadline:
            got = check()
            if got:
                return got
            time.sleep(every_s)
        raise StackError(f"timed out after {timeout_s or self.timeout_s:.0f}s waiting for {what}")

    def wait_finished(self, dag_id: str, run_id: str, timeout_s: float | None = None) -> dict:
        def done():
            run = self.run(dag_id, run_id)
            return run if run["state"] in ("success", "failed") else None

        return self.wait_for(f"{dag_id} run {run_id} to finish", done, timeout_s)

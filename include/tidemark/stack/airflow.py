"""Airflow 3 for the local stack: home in the state directory, metadata in our PostgreSQL."""

from __future__ import annotations

import os
import subprocess

from tidemark.settings import Settings
from tidemark.stack.proc import read_pid, run, say, spawn, stop_pid, wait_until


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

    def start(self, extra_env: dict[str, str] | None = None) -> None:
        env = {**_env(self.s), **(extra_env or {})}
        for name in self.components:
            if read_pid(self._pid(name)) is not None:
                continue
            cmd = ["airflow", name, *self.arguments[name]]
            # cwd: Spark jobs leave an artifacts/ directory wherever they run
            spawn(cmd, log=self.s.logs_dir / f"airflow-{name}.log", pid_file=self._pid(name), env=env,
                  cwd=self.s.state_dir)
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

    def stop(self) -> None:
        for name in self.components:
            if stop_pid(self._pid(name)):
                say("airflow", f"{name} stopped")

    def status(self) -> list[str]:
        lines = []
        for name in self.components:
            state = "running" if read_pid(self._pid(name)) is not None else "stopped"
            lines.append(f"airflow   {state:8} {name}  log={self.s.logs_dir / f'airflow-{name}.log'}")
        return lines


def exec_in_env(settings: Settings, argv: list[str]) -> int:
    return subprocess.call(argv, env=_env(settings))


"""Airflow 3 for the local stack: home in the state directory, metadata in our PostgreSQL."""

from __future__ import annotations

import os
import subprocess

from tidemark.settings import Settings
from tidemark.stack.proc import read_pid, run, say, spawn, stop_pid


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

    def _pid(self, name: str):
        return self.s.airflow_home / f"{name}.pid"

    def start(self) -> None:
        env = _env(self.s)
        for name in self.components:
            if read_pid(self._pid(name)) is not None:
                continue
            cmd = ["airflow", name] + (["--port", str(self.s.airflow_port)] if name == "api-server" else [])
            spawn(cmd, log=self.s.logs_dir / f"airflow-{name}.log", pid_file=self._pid(name), env=env)
        say("airflow", f"UI starting at http://127.0.0.1:{self.s.airflow_port} (no login: all users are admins locally)")

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


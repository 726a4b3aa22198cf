"""Health: whether the broker and each database answer, and since when one does not."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tidemark.protocol.kafka_io import probe_broker  # noqa: F401 (the page's broker check)
from tidemark.status.model import Health

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class Probe:
    """One check's raw outcome, before the health file says since when."""

    component: str
    kind: str
    conn_id: str
    address: str | None
    error: str | None  # None: reachable


def pg_address(conn) -> str | None:
    """host:port/database of a psycopg2 connection (its DSN parameters, never the password)."""
    try:
        p = conn.get_dsn_parameters()
    except Exception:
        return None
    return f"{p.get('host')}:{p.get('port')}/{p.get('dbname')}"


def _cannot_connect(error: str | None) -> bool:
    text = (error or "").lower()
    return any(t in text for t in ("connection refused", "could not connect", "timeout expired", "timed out",
                                   "no route to host", "is the server running", "server closed the connection",
                                   "name or service not known", "could not translate host name"))


def probe_spark_master(master: str, timeout_s: float = 2.0) -> str | None:
    """Whether a standalone master (``spark://host:port``, or with standbys ``spark://h1:7077,h2:7077``)
    accepts a connection: None when one of them does, else why none does."""
    import socket

    refused = []
    for address in master.removeprefix("spark://").split(","):
        host, _, port = address.strip().rpartition(":")
        try:
            socket.create_connection((host or address, int(port) if port.isdigit() else 7077), timeout=timeout_s).close()
            return None
        except (OSError, ValueError) as exc:
            refused.append(f"{address}: {getattr(exc, 'strerror', None) or exc}")
    return f"{master}: no master accepts a connection ({'; '.join(refused)})"


def next_step(kind: str, conn_id: str, error: str | None) -> str:
    """The next step for a component that does not answer. The commands are the local stack's
    (README, "Troubleshooting"); elsewhere, the same service is started the deployment's way."""
    if kind == "broker":
        if error and error.startswith(("no bootstrap servers", "connection ")):
            return f"set bootstrap.servers in the Airflow connection {conn_id}"
        return ("start the broker: `make start C=kafka` (or `python -m tidemark_workshop.stack start kafka`); "
                "why it stopped: `make logs C=kafka`")
    if kind == "connect":
        if error and error.startswith("connection "):
            return f"set the Airflow connection {conn_id} (Kafka Connect's REST address)"
        return ("the local stack's keeper starts a worker that died again within a minute (compose's restart "
                "policy likewise); if it stays down: `make start C=connect`, and why it stopped: `make logs C=connect`; "
                "the supervisor then restarts its connectors")
    if kind == "spark":
        return ("start the Spark master (the deployment's way; in compose: `docker compose up -d spark-master`); "
                f"standing sinks on the cluster are waited for meanwhile; its address: the Airflow connection {conn_id}")
    if error and "statement timeout" in error:
        return "it answers too slowly: see what it is busy with (pg_stat_activity, `make logs C=postgres`)"
    if error and not _cannot_connect(error):  # it answers, but refuses this login or database
        return f"fix the Airflow connection {conn_id} (the error says what)"
    return ("start PostgreSQL: `make start C=postgres` (or `python -m tidemark_workshop.stack start postgres`); "
            "why it stopped: `make logs C=postgres`")


def _parse_time(value: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(value) if value else None
    except (TypeError, ValueError):
        return None


def track_health(probes: Iterable[Probe], state: Mapping[str, Any], now: datetime) -> tuple[list[Health], dict]:
    """The checks with since when each component is down, and the health file's next content.

    ``state`` is the file's content (``{"components": {name: {"down_since", "last_ok"}}}``): a
    component down keeps the first failed check of its outage; one that answers clears it. The
    components not checked this time keep their entry (another caller checks other sources)."""
    known = dict((state or {}).get("components") or {})
    healths = []
    for probe in probes:
        was = known.get(probe.component) or {}
        last_ok = _parse_time(was.get("last_ok"))
        if probe.error is None:
            known[probe.component] = {"down_since": None, "last_ok": now.isoformat()}
            healths.append(Health(probe.component, probe.kind, probe.conn_id, probe.address, True, now,
                                  last_ok=now))
            continue
        since = _parse_time(was.get("down_since")) or now
        known[probe.component] = {"down_since": since.isoformat(), "last_ok": last_ok.isoformat() if last_ok else None}
        healths.append(Health(probe.component, probe.kind, probe.conn_id, probe.address, False, now, since, last_ok,
                              probe.error, next_step(probe.kind, probe.conn_id, probe.error)))
    return healths, {"components": known}


def health_file() -> Path:
    """Where the first failed check of each outage is kept: ``$TIDEMARK_STATUS_DIR/health.json`` (the local
    stack sets it for every process), else a folder in the system's temporary directory."""
    from tidemark.protocol.config import status_dir

    return status_dir() / "health.json"


def remember_health(probes: Iterable[Probe], path: Path | None, now: datetime | None = None) -> list[Health]:
    """``track_health`` against the file at ``path``: read, merged and replaced under an exclusive
    lock (the page's threads and `make status` may check at the same moment). A file that cannot be
    read or written costs only the "since": the outage then dates from this check."""
    import fcntl

    now = now or datetime.now(timezone.utc)
    probes = list(probes)
    if path is None:
        return track_health(probes, {}, now)[0]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                state = json.loads(path.read_text())
            except (FileNotFoundError, ValueError):
                state = {}
            healths, state = track_health(probes, state, now)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
            os.replace(tmp, path)
            return healths
    except OSError as exc:
        log.warning("health file %s not usable (%s): outages date from this check", path, exc)
        return track_health(probes, {}, now)[0]

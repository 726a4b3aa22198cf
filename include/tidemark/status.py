"""What the "Tidemark status" page shows, read from the warehouse's ledger and the source database.

Per pipeline spec: the last committed batch, the watermark and its lag behind the source clock,
unfinished attempts, recent failures and dead letters not yet in the dead-letter topic. Per source: the session whose open transaction holds
every window back (the planner's clamp) and any prepared transaction. In the warehouse: stage
tables nobody will apply or drop any more.

Health: whether the Kafka broker, the warehouse and each source answer, each check bounded by a
couple of seconds (``CHECK_TIMEOUT_S``), and since when one does not: the first failed check of an
outage is kept in a small JSON file (``health_file``, under the state directory), not in the
control schema, because the page never writes to a database and the warehouse is one of the
things that may be down. Per pipeline, what holds it (a component down, a crash-looping or silent
standing sink, a stream paused by a person, a source transaction holding the window) and the next
step that works (``Hold``).

Read-only by construction: every connection is switched to a read-only session in autocommit, so
each query is its own short transaction. The page therefore never holds a lock between queries
(the sink's DROP of a stage table never waits on it) and never keeps a transaction open on the
source (it would clamp the very windows it reports on). Plain DB-API cursors (psycopg2), no
Airflow import.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from tidemark import catalog, ledger
from tidemark.config import CONN_KAFKA, CONN_SOURCE, CONN_WAREHOUSE
from tidemark.stage import STAGE_SCHEMA, stage_table
from tidemark.spec import PipelineSpec, load_specs
from tidemark.window import SourceClock, read_source_clock

FAILURE_WINDOW = timedelta(days=7)
APPLICATION_NAME = "tidemark-status"  # how the page's own sessions show in pg_stat_activity
UNFINISHED = ("open", "sealed")
FAILED = ("refused", "aborted")
CHECK_TIMEOUT_S = 2.0  # each health check: a connect (libpq's minimum is 2 s) or a broker's metadata
log = logging.getLogger(__name__)


# --- pipeline specs ---------------------------------------------------------------------------

@dataclass(frozen=True)
class PipelineEntry:
    """One spec file: its spec, or why it does not load (shown as a row, like the broken DAG)."""

    path: Path
    spec: PipelineSpec | None
    error: str | None = None

    @property
    def name(self) -> str:
        return self.spec.name if self.spec else self.path.stem


def load_pipelines(directory: Path) -> list[PipelineEntry]:
    """Every spec file, valid or not, judged as the DAG factory judges it (``load_specs``)."""
    valid, errors = load_specs(directory)
    specs = dict(valid)
    entries = []
    for path in sorted(directory.glob("*.yaml")):
        if path in specs:
            entries.append(PipelineEntry(path, specs[path]))
        else:  # every SpecError message starts with its file
            messages = [str(e) for e in errors if str(e).startswith(f"{path}:")]
            entries.append(PipelineEntry(path, None, "; ".join(messages) or "not loaded"))
    return entries


# --- what the page shows ----------------------------------------------------------------------

@dataclass(frozen=True)
class CommittedBatch:
    batch_id: str
    window: str
    backfill: bool
    rows: int | None
    committed_at: datetime | None
    attempt: int | None
    reconciliation: str | None = None  # reconciled, reconciliation_failed, or None (not yet)


@dataclass(frozen=True)
class Watermark:
    bound: str
    cursor: datetime | int
    batch_id: str
    updated_at: datetime


@dataclass(frozen=True)
class Attempt:
    batch_id: str
    attempt: int
    state: str
    rows: int | None
    message: str | None
    begun_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True)
class PipelineLedger:
    last_committed: CommittedBatch | None = None
    watermark: Watermark | None = None
    unfinished: list[Attempt] = field(default_factory=list)  # open or sealed, oldest first
    recent_failures: list[Attempt] = field(default_factory=list)  # refused or aborted, newest first
    last_failure: Attempt | None = None  # the newest refused or aborted attempt, however old
    # Rejects committed but not yet in the dead-letter topic (the outbox sends them at the sink's next
    # flush): a count that stays up means the DLQ cannot be written.
    dead_letters_pending: int = 0
    oldest_pending_reject: datetime | None = None


@dataclass(frozen=True)
class SourceSession:
    pid: int
    application_name: str
    usename: str | None
    client_addr: str | None
    state: str
    xact_start: datetime
    age: timedelta


@dataclass(frozen=True)
class PreparedXact:
    gid: str
    prepared: datetime
    owner: str
    count: int  # prepared transactions of the source database in all (this is the oldest)


@dataclass(frozen=True)
class SourceStatus:
    conn_id: str
    now: datetime | None = None
    oldest_open_xact: SourceSession | None = None  # the clamp: windows end before its xact_start
    oldest_prepared: PreparedXact | None = None  # holds every window at its watermark until it ends
    error: str | None = None
    clock: SourceClock | None = field(default=None, metadata={"json": False})  # what the planner reads

@dataclass(frozen=True)
class Lag:
    """How far the watermark is behind the source: a duration, or a number of ids."""

    seconds: float | None = None
    ids: int | None = None
    held_back: bool = False  # an open or prepared source transaction, not the safe lag, sets the next window's end
    error: str | None = None


@dataclass(frozen=True)
class StageTable:
    table: str
    bytes: int | None  # None: the table vanished or was locked while measuring
    batch_id: str | None = None  # None: no attempt in the ledger has this stage name
    attempt: int | None = None
    pipeline: str | None = None
    state: str | None = None


@dataclass(frozen=True)
class Health:
    """One component's check: the Kafka broker, the warehouse, or a source database."""

    component: str  # "kafka", "warehouse" or "source <conn_id>": the key in the health file
    kind: str  # broker, warehouse, source
    conn_id: str
    address: str | None  # bootstrap servers, or host:port/database (never a password)
    reachable: bool
    checked_at: datetime
    since: datetime | None = None  # unreachable: the first failed check of this outage
    last_ok: datetime | None = None  # the last check that found it reachable
    error: str | None = None
    next_step: str | None = None  # unreachable: what to do


@dataclass(frozen=True)
class Hold:
    """Something that keeps a pipeline from moving, and the next step that works."""

    by: str  # warehouse, source, broker, sink, person, transaction
    what: str
    since: datetime | None
    next: str


@dataclass(frozen=True)
class PipelineStatus:
    name: str
    spec_path: str
    error: str | None = None  # the spec file does not load
    source_conn_id: str | None = None
    cursor_kind: str | None = None
    ledger: PipelineLedger = field(default_factory=PipelineLedger)
    lag: Lag | None = None
    held_by: list[Hold] = field(default_factory=list)  # what keeps it from moving, root causes first


@dataclass(frozen=True)
class StreamStatus:
    """A standing sink: what a person wants, what its instance last said, what the supervisor did."""

    pipeline: str
    desired: str
    changed_by: str | None = None  # None: never set (running by default)
    changed_at: datetime | None = None
    reason: str | None = None
    crash_looping_since: datetime | None = None
    fence: int | None = None
    holder: str | None = None
    heartbeat_at: datetime | None = None
    progress_at: datetime | None = None
    records: int | None = None  # read by the current instance since it started
    lag: dict[str, int] | None = None  # records behind per partition, at its last beat
    ended_at: datetime | None = None  # the instance stopped (or was seen dead)
    restarts: int = 0  # within the spec's budget window
    restart_budget: int = 0
    serving_view: str | None = None  # the spec's stream merges into it
    complete_up_to: datetime | None = None  # the serving view's freshness: the later of both watermarks


@dataclass(frozen=True)
class StatusReport:
    generated_at: datetime
    pipelines_dir: str
    control_schema: bool  # False: no batch has ever been planned in this warehouse
    pipelines: list[PipelineStatus]
    sources: list[SourceStatus]
    orphan_stage_tables: list[StageTable]
    streams: list[StreamStatus] = field(default_factory=list)
    health: list[Health] = field(default_factory=list)  # broker, warehouse, sources (what was checked)
    warehouse_error: str | None = None  # the warehouse did not answer: no ledger to show

    def broker_down(self) -> bool:
        return any(h.kind == "broker" and not h.reachable for h in self.health)

    def to_json(self) -> dict[str, Any]:
        return jsonable(self)


def jsonable(value: Any) -> Any:
    """Dataclasses to plain JSON: times as UTC ISO 8601, durations in seconds."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in fields(value) if f.metadata.get("json", True)}
    if isinstance(value, datetime):
        return utc_iso(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    return value


def utc_iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is None:  # timestamptz arrives aware; a naive value is UTC, as in tidemark.window
        value = value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc).isoformat()


def format_duration(value: timedelta | float | None) -> str:
    """A short human duration: 42s, 3m 05s, 2h 07m, 4d 03h (negative: the clock is behind)."""
    if value is None:
        return ""
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    sign, seconds = ("-", -seconds) if seconds < 0 else ("", seconds)
    s = int(seconds)
    if s < 60:
        text = f"{seconds:.1f}s" if seconds < 10 else f"{s}s"
    elif s < 3600:
        text = f"{s // 60}m {s % 60:02d}s"
    elif s < 86400:
        text = f"{s // 3600}h {s % 3600 // 60:02d}m"
    else:
        text = f"{s // 86400}d {s % 86400 // 3600:02d}h"
    return sign + text


def format_bytes(value: int | None) -> str:
    if value is None:
        return "?"
    size = float(value)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


# --- queries ----------------------------------------------------------------------------------

def read_only_session(conn) -> None:
    """Autocommit + read only: one short transaction per query, no lock or snapshot kept between
    them. Timeouts so that a page never hangs behind a sink holding a lock."""
    conn.set_session(readonly=True, autocommit=True)
    with conn.cursor() as cur:
        cur.execute("SET lock_timeout = '2s'")
        cur.execute("SET statement_timeout = '20s'")
        cur.execute("SET application_name = %s", (APPLICATION_NAME,))


def pipeline_ledger(cur, pipeline: str, failure_window: timedelta = FAILURE_WINDOW) -> PipelineLedger:
    committed = ledger.last_committed(cur, pipeline)
    if committed is not None:
        batch_id, window, rows, committed_at, attempt, verdict = committed
        committed = CommittedBatch(batch_id, str(window), window.backfill, rows, committed_at, attempt, verdict)
    mark = ledger.watermark_row(cur, pipeline)
    watermark = Watermark(str(mark[0]), mark[0].cursor, mark[1], mark[2]) if mark else None
    unfinished = [Attempt(*r) for r in ledger.attempts(cur, pipeline, UNFINISHED)]
    recent = [Attempt(*r) for r in ledger.attempts(cur, pipeline, FAILED, newest_first=True, since=failure_window)]
    last = recent[:1] or [Attempt(*r) for r in ledger.attempts(cur, pipeline, FAILED, newest_first=True, limit=1)]
    pending, oldest = ledger.pending_reject_summary(cur, ledger.consumer_for(pipeline))
    return PipelineLedger(committed, watermark, unfinished, recent, last[0] if last else None, pending, oldest)


def stream_status(cur, spec: PipelineSpec) -> StreamStatus:
    state = ledger.stream_state(cur, spec.name)
    beat = ledger.heartbeat(cur, spec.name) or {}
    restarts = ledger.restarts_since(cur, spec.name, spec.sink.budget_window)
    fresh = catalog.freshness(cur, spec) or {}
    return StreamStatus(
        spec.name, state.desired, state.changed_by, state.changed_at, state.reason, state.crash_looping_since,
        beat.get("fence"), beat.get("holder"), beat.get("heartbeat_at"), beat.get("progress_at"), beat.get("records"),
        beat.get("lag"), beat.get("ended_at"), len(restarts), spec.sink.restart_budget,
        spec.stream.serving_view if spec.stream else None, fresh.get("complete_up_to"))


def orphan_stage_tables(cur, *, control_schema: bool = True) -> list[StageTable]:
    """Stage tables whose attempt is finished (committed, refused, aborted, superseded) or unknown.

    Stage names are a hash of (batch id, attempt), which PostgreSQL cannot compute without
    pgcrypto, so the ledger's attempts are hashed here; only when stage tables exist at all."""
    cur.execute(
        """SELECT c.oid, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = %s AND c.relkind IN ('r', 'p') ORDER BY c.relname""",
        (STAGE_SCHEMA,),
    )
    present = {f"{STAGE_SCHEMA}.{name}": oid for oid, name in cur.fetchall()}
    if not present:
        return []
    owners: dict[str, tuple[str, int, str, str]] = {}
    if control_schema:
        for batch_id, attempt, pipeline, state in ledger.every_attempt(cur):
            name = stage_table(batch_id, attempt)
            if name in present:
                owners[name] = (batch_id, attempt, pipeline, state)
    orphans = []
    for table, oid in present.items():
        owner = owners.get(table)
        if owner and owner[3] in UNFINISHED:
            continue  # the sink is still filling it
        orphans.append(StageTable(table, _relation_size(cur, oid), *(owner or ())))
    return orphans


def _relation_size(cur, oid: int) -> int | None:
    """pg_total_relation_size takes a share lock: a table being dropped right now (lock timeout) or
    already gone (NULL) has no size rather than failing the page."""
    import psycopg2

    try:
        cur.execute("SELECT pg_total_relation_size(%s::oid)", (oid,))
        return cur.fetchone()[0]
    except psycopg2.errors.LockNotAvailable:
        return None


def source_status(cur, conn_id: str) -> SourceStatus:
    """The source as the planner sees it: one read of its clock, its oldest open transaction and
    its oldest prepared one (``window.read_source_clock``, the same query the plan runs)."""
    clock = read_source_clock(cur)
    h, p = clock.holder, clock.prepared
    session = (SourceSession(h["pid"], h["application_name"], h["usename"], h["client_addr"], h["state"],
                             clock.oldest_open_xact, clock.now - clock.oldest_open_xact) if h else None)
    prepared = PreparedXact(p["gid"], clock.prepared_at, p["owner"], p.get("count", 1)) if p else None
    return SourceStatus(conn_id, clock.now, session, prepared, clock=clock)


def watermark_lag(cur, spec: PipelineSpec, watermark: Watermark | None, source: SourceStatus) -> Lag | None:
    """Lag behind the source: its clock minus the watermark (timestamp cursors), or ids not yet
    loaded, max(id) minus the watermark (id cursors). None: no watermark yet."""
    clock = source.clock
    if watermark is None or clock is None:
        return None
    if spec.cursor.kind == "id":
        high = catalog.observe_id_high(cur, spec)[0]
        return Lag(ids=max(int(high or 0) - int(watermark.cursor), 0))
    return Lag(seconds=(clock.now - watermark.cursor).total_seconds(), held_back=clock.holds_back(spec.safe_lag))


# --- health: broker and databases, and since when one is down ----------------------------------

@dataclass(frozen=True)
class Probe:
    """One check's raw outcome, before the health file says since when."""

    component: str
    kind: str
    conn_id: str
    address: str | None
    error: str | None  # None: reachable


def probe_broker(bootstrap: str, timeout_s: float = CHECK_TIMEOUT_S) -> str | None:
    """None when a broker answers a metadata request, else why not. A TCP connect to the bootstrap
    servers first (a stopped broker refuses at once, and librdkafka would log every refusal), then
    the metadata request: at most about twice ``timeout_s`` in all, never longer."""
    import socket

    servers = [h.strip().split("://")[-1] for h in (bootstrap or "").split(",") if h.strip()]
    if not servers:
        return "no bootstrap servers configured"
    deadline = time.monotonic() + timeout_s
    refused = []
    for server in servers:
        host, _, port = server.rpartition(":")
        try:
            socket.create_connection((host.strip("[]") or "localhost", int(port)),
                                     timeout=max(0.2, deadline - time.monotonic())).close()
            break
        except (OSError, ValueError) as exc:
            refused.append(f"{server}: {getattr(exc, 'strerror', None) or exc}")
    else:
        return "no bootstrap server accepts a connection (" + "; ".join(refused) + ")"
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": int(timeout_s * 1000),
                         "socket.connection.setup.timeout.ms": int(timeout_s * 1000), "log_level": 0})
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except Exception as exc:  # KafkaException: the port is open but no broker answers (starting, stopping)
        return f"the broker accepts connections but does not answer: {error_text(exc)}"
    if not metadata.brokers:
        return "the cluster's metadata lists no broker"
    return None


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


def next_step(kind: str, conn_id: str, error: str | None) -> str:
    """The next step for a component that does not answer. The commands are the local stack's
    (README, "Troubleshooting"); elsewhere, the same service is started the deployment's way."""
    if kind == "broker":
        if error and error.startswith(("no bootstrap servers", "connection ")):
            return f"set bootstrap.servers in the Airflow connection {conn_id}"
        return ("start the broker: `make start C=kafka` (or `python -m tidemark_workshop.stack start kafka`); "
                "why it stopped: `make logs C=kafka`")
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
    """Where the first failed check of each outage is kept: ``$TIDEMARK_STATE_DIR/status/health.json``
    (the local stack sets it for every process), else a folder in the system's temporary directory."""
    import tempfile

    root = os.environ.get("TIDEMARK_STATE_DIR")
    return (Path(root) / "status" if root else Path(tempfile.gettempdir()) / "tidemark-status") / "health.json"


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


# --- what holds a pipeline --------------------------------------------------------------------

def pipeline_holds(p: PipelineStatus, *, health: Iterable[Health], source: SourceStatus | None,
                   stream: StreamStatus | None, now: datetime, lease: timedelta | None = None) -> list[Hold]:
    """What keeps the pipeline from moving, root causes first: the warehouse, its source or the
    broker down; its standing sink crash-looping, silent (no heartbeat within its lease) or not
    running; its stream paused or stopped by a person; a source transaction holding its window."""
    if p.error:
        return []
    holds = []
    for h in sorted(health, key=lambda h: ("warehouse", "source", "broker").index(h.kind)):
        if h.reachable or not (h.kind in ("warehouse", "broker")
                               or (h.kind == "source" and h.conn_id == p.source_conn_id)):
            continue
        name = {"warehouse": "warehouse", "broker": "Kafka broker"}.get(h.kind, f"source {h.conn_id}")
        holds.append(Hold(h.kind, f"{name} unreachable ({h.address or h.conn_id})", h.since, h.next_step or ""))
    control = f"trigger the DAG tidemark_stream_control with pipeline={p.name}"
    if stream is not None:
        if stream.crash_looping_since is not None:
            holds.append(Hold("sink", "standing sink crash-looping", stream.crash_looping_since,
                              "fix the cause (the tidemark_supervisor task log names the sink's last error), "
                              f"then {control} action=clear"))
        elif stream.desired != "running":
            who = f" by {stream.changed_by}" if stream.changed_by else ""
            why = f": {stream.reason}" if stream.reason else ""
            holds.append(Hold("person", f"stream {stream.desired}{who}{why}", stream.changed_at,
                              f"{control} action=resume"))
        elif stream.heartbeat_at is not None and stream.ended_at is not None:
            holds.append(Hold("sink", "standing sink not running", stream.ended_at,
                              "the supervisor starts it within a minute while tidemark_supervisor runs "
                              "(unpaused, scheduler up: `make ui`)"))
        elif stream.heartbeat_at is not None and lease is not None and now - stream.heartbeat_at > lease:
            holds.append(Hold("sink", f"standing sink silent: no heartbeat for {format_duration(now - stream.heartbeat_at)} "
                                      f"(lease {format_duration(lease)})", stream.heartbeat_at,
                              "the supervisor restarts a hung sink while tidemark_supervisor runs (unpaused, scheduler "
                              "up: `make ui`); its log is in the streams directory"))
    if p.lag is not None and p.lag.held_back and source is not None and source.error is None:
        x, t = source.oldest_open_xact, source.oldest_prepared
        if t is not None:
            holds.append(Hold("transaction", f"prepared transaction {t.gid!r} on {source.conn_id} (owner {t.owner})",
                              t.prepared, f"COMMIT PREPARED '{t.gid}' or ROLLBACK PREPARED '{t.gid}' on the source"))
        if x is not None:
            holds.append(Hold("transaction", f"open transaction on {source.conn_id}: pid {x.pid}, user {x.usename}, "
                                             f"application {x.application_name!r}, {x.state}", x.xact_start,
                              f"end it (commit or roll back in that session), or SELECT pg_terminate_backend({x.pid}) "
                              "on the source"))
    return holds


def hold_text(hold: Hold, now: datetime | None = None) -> str:
    """held by: <what> since <time> (<how long>), next: <step>"""
    since = ""
    if hold.since is not None:
        since = f" since {utc_iso(hold.since)}"
        if now is not None:
            since += f" ({format_duration(now - hold.since)})"
    return f"held by: {hold.what}{since}, next: {hold.next}"


# --- the whole page ---------------------------------------------------------------------------

def error_text(exc: BaseException) -> str:
    """What went wrong, for the page (connection errors name host, database and user, never the password)."""
    return f"{type(exc).__name__}: {str(exc).strip()}"


def collect(
    entries: Iterable[PipelineEntry],
    warehouse_conn,
    open_source: Callable[[str], Any],
    *,
    pipelines_directory: Path | None = None,
    failure_window: timedelta = FAILURE_WINDOW,
    open_warehouse: Callable[[], Any] | None = None,
    kafka_bootstrap: str | BaseException | None = None,
    kafka_conn_id: str = CONN_KAFKA,
    health_path: Path | None = None,
    broker_probe: Callable[[str], str | None] = probe_broker,
) -> StatusReport:
    """The status of every pipeline. ``warehouse_conn`` is the caller's, or None: then
    ``open_warehouse()`` opens one (closed here), and a warehouse that does not answer is shown as
    unreachable instead of failing the report. ``open_source(conn_id)`` opens a connection to a
    source, closed here; a source that fails shows its error. ``kafka_bootstrap``: the broker to
    check (an exception: its connection could not be resolved; None: no broker check). Each
    outage's first failed check is kept in ``health_path`` (None: the outage dates from this check)."""
    import psycopg2

    entries = list(entries)
    probes: list[Probe] = []
    own_warehouse = warehouse_conn is None
    warehouse_error = None
    has_control, orphans, streams = False, [], []
    ledgers = {e.name: PipelineLedger() for e in entries if e.spec}
    if own_warehouse:
        try:
            warehouse_conn = open_warehouse()
        except Exception as exc:
            warehouse_error = error_text(exc)
    try:
        if warehouse_conn is not None:
            try:
                read_only_session(warehouse_conn)
                with warehouse_conn.cursor() as wh:
                    has_control = ledger.control_schema_exists(wh)
                    ledgers = {e.name: pipeline_ledger(wh, e.name, failure_window) if has_control else PipelineLedger()
                               for e in entries if e.spec}
                    orphans = orphan_stage_tables(wh, control_schema=has_control)
                    streams = [stream_status(wh, e.spec) for e in entries if e.spec and e.spec.sink.mode == "standing"] \
                        if has_control and ledger.stream_tables_exist(wh) else []
            except psycopg2.OperationalError as exc:  # the connection broke or a query timed out
                if not own_warehouse or isinstance(exc, psycopg2.errors.LockNotAvailable):
                    raise
                warehouse_error = error_text(exc)
                has_control, orphans, streams = False, [], []
                ledgers = {e.name: PipelineLedger() for e in entries if e.spec}
        probes.append(Probe("warehouse", "warehouse", CONN_WAREHOUSE,
                            pg_address(warehouse_conn) if warehouse_conn is not None else None, warehouse_error))
    finally:
        if own_warehouse and warehouse_conn is not None:
            warehouse_conn.close()

    specs = [e.spec for e in entries if e.spec]
    conn_ids = sorted({CONN_SOURCE, *(s.source_conn_id for s in specs)})
    sources: dict[str, SourceStatus] = {}
    lags: dict[str, Lag | None] = {}
    for conn_id in conn_ids:
        try:
            conn = open_source(conn_id)
        except Exception as exc:
            sources[conn_id] = SourceStatus(conn_id, error=error_text(exc))
            probes.append(Probe(f"source {conn_id}", "source", conn_id, None, error_text(exc)))
            continue
        unreachable = None
        try:
            read_only_session(conn)
            with conn.cursor() as src:
                sources[conn_id] = source = source_status(src, conn_id)
                for spec in (s for s in specs if s.source_conn_id == conn_id):
                    try:
                        lags[spec.name] = watermark_lag(src, spec, ledgers[spec.name].watermark, source)
                    except Exception as exc:  # e.g. the source table is missing: this row only
                        lags[spec.name] = Lag(error=error_text(exc))
        except Exception as exc:
            sources[conn_id] = SourceStatus(conn_id, error=error_text(exc))
            if isinstance(exc, psycopg2.OperationalError):
                unreachable = error_text(exc)
        finally:
            probes.append(Probe(f"source {conn_id}", "source", conn_id, pg_address(conn), unreachable))
            conn.close()

    if isinstance(kafka_bootstrap, BaseException):
        probes.append(Probe("kafka", "broker", kafka_conn_id, None, f"connection {kafka_conn_id}: "
                                                                    f"{error_text(kafka_bootstrap)}"))
    elif kafka_bootstrap is not None:
        try:
            broken = broker_probe(kafka_bootstrap)
        except Exception as exc:  # the probe itself failed (e.g. no Kafka client here): say so, never fail the page
            broken = error_text(exc)
        probes.append(Probe("kafka", "broker", kafka_conn_id, kafka_bootstrap, broken))

    now = datetime.now(timezone.utc)
    health = remember_health(probes, health_path, now)
    stream_of = {t.pipeline: t for t in streams}
    pipelines = []
    for e in entries:
        if e.spec is None:
            pipelines.append(PipelineStatus(e.name, str(e.path), error=e.error))
            continue
        source = sources[e.spec.source_conn_id]
        lag = lags.get(e.name) if source.error is None else Lag(error=f"source {source.conn_id}: {source.error}")
        row = PipelineStatus(e.name, str(e.path), None, e.spec.source_conn_id, e.spec.cursor.kind, ledgers[e.name], lag)
        held = pipeline_holds(row, health=health, source=source, stream=stream_of.get(e.name), now=now,
                              lease=e.spec.sink.lease if e.spec.sink.mode == "standing" else None)
        pipelines.append(dataclasses.replace(row, held_by=held))
    return StatusReport(
        generated_at=now,
        pipelines_dir=str(pipelines_directory) if pipelines_directory else "",
        control_schema=has_control,
        pipelines=pipelines,
        sources=[sources[c] for c in conn_ids],
        orphan_stage_tables=orphans,
        streams=streams,
        health=health,
        warehouse_error=warehouse_error,
    )


# --- text, for `make status` and logs ---------------------------------------------------------

def health_lines(report: StatusReport) -> list[str]:
    """One line per component checked: reachable, or since when not and the next step."""
    lines = []
    for h in report.health:
        where = f" {h.address}" if h.address else ""
        if h.reachable:
            lines.append(f"{h.component}:{where} reachable")
            continue
        since = f" since {utc_iso(h.since)} ({format_duration(report.generated_at - h.since)})" if h.since else ""
        seen = f", last reachable {utc_iso(h.last_ok)}" if h.last_ok else ""
        lines.append(f"{h.component}:{where} UNREACHABLE{since}{seen}: {h.error}; next: {h.next_step}")
    return lines


def status_lines(report: StatusReport) -> list[str]:
    """One line per pipeline: last committed batch, watermark, how far behind the source it is,
    and for a standing sink its desired state, instance, lag and restarts; then one line per thing
    that holds it ("  held by: ..., next: ...")."""
    streams = {t.pipeline: t for t in report.streams}
    broker_down = report.broker_down()
    lines = []
    if report.warehouse_error:
        lines.append(f"warehouse unreachable, no ledger to show: {report.warehouse_error}")
    for p in report.pipelines:
        if p.error:
            lines.append(f"{p.name}: invalid spec: {p.error}")
            continue
        c, w = p.ledger.last_committed, p.ledger.watermark
        verdict = ("nothing to compare yet" if c and c.rows == 0 and c.reconciliation == "reconciled"
                   else c.reconciliation if c and c.reconciliation else "not reconciled yet")  # as the evidence page says
        batch = f"last batch {c.batch_id} ({c.rows} rows, {utc_iso(c.committed_at)}, {verdict})" if c else "no batch yet"
        lag = p.lag
        behind = ("-" if lag is None else lag.error if lag.error else f"{lag.ids} ids" if lag.ids is not None
                  else format_duration(lag.seconds) + (" (held back by a source transaction)" if lag.held_back else ""))
        line = f"{p.name}: {batch}; watermark {w.bound if w else '-'}; behind the source {behind}"
        if p.ledger.dead_letters_pending:
            line += (f"; {p.ledger.dead_letters_pending} dead letter(s) not yet in the DLQ, oldest from "
                     f"{utc_iso(p.ledger.oldest_pending_reject)}")
        t = streams.get(p.name)
        if t is not None:
            lag = f"{sum((t.lag or {}).values())} records"
            if broker_down:  # the sink's last beat still says what it saw before the broker went away
                lag = f"unknown (broker unreachable; {lag} at its last beat)"
            line += f"; stream desired={t.desired} {_instance(t, report.generated_at)} lag {lag}, " \
                    f"restarts {t.restarts}/{t.restart_budget}"
            if t.serving_view:
                line += f"; {t.serving_view} complete up to {utc_iso(t.complete_up_to) if t.complete_up_to else '-'}"
        lines.append(line)
        lines.extend(f"  {hold_text(h, report.generated_at)}" for h in p.held_by)
    return lines


def _instance(t: StreamStatus, now: datetime) -> str:
    if t.crash_looping_since:
        return f"CRASH-LOOPING since {utc_iso(t.crash_looping_since)}"
    if t.heartbeat_at is None:
        return "never started"
    if t.ended_at is not None:
        return f"stopped at {utc_iso(t.ended_at)}"
    return f"running (beat {format_duration(now - t.heartbeat_at)} ago)"

"""What the "Tidemark status" page shows, read from the warehouse's ledger and the source database.

Per pipeline spec: the last committed batch, the watermark and its lag behind the source clock,
unfinished attempts, recent failures and dead letters not yet in the dead-letter topic. Per source: the session whose open transaction holds
every window back (the planner's clamp) and any prepared transaction. In the warehouse: stage
tables nobody will apply or drop any more.

Read-only by construction: every connection is switched to a read-only session in autocommit, so
each query is its own short transaction. The page therefore never holds a lock between queries
(the sink's DROP of a stage table never waits on it) and never keeps a transaction open on the
source (it would clamp the very windows it reports on). Plain DB-API cursors (psycopg2), no
Airflow import.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields, is_dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from tidemark import ledger
from tidemark.config import CONN_SOURCE
from tidemark.sink import STAGE_SCHEMA, stage_table
from tidemark.spec import PipelineSpec, load_specs
from tidemark.window import SourceClock, read_source_clock

FAILURE_WINDOW = timedelta(days=7)
APPLICATION_NAME = "tidemark-status"  # how the page's own sessions show in pg_stat_activity
UNFINISHED = ("open", "sealed")
FAILED = ("refused", "aborted")


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
class PipelineStatus:
    name: str
    spec_path: str
    error: str | None = None  # the spec file does not load
    source_conn_id: str | None = None
    cursor_kind: str | None = None
    ledger: PipelineLedger = field(default_factory=PipelineLedger)
    lag: Lag | None = None


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
    fresh = ledger.freshness(cur, spec) or {}
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
        high = ledger.observe_id_high(cur, spec)[0]
        return Lag(ids=max(int(high or 0) - int(watermark.cursor), 0))
    return Lag(seconds=(clock.now - watermark.cursor).total_seconds(), held_back=clock.holds_back(spec.safe_lag))


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
) -> StatusReport:
    """The status of every pipeline. ``warehouse_conn`` is the caller's; ``open_source(conn_id)``
    opens a connection to a source, closed here. A source that fails shows its error."""
    entries = list(entries)
    read_only_session(warehouse_conn)
    with warehouse_conn.cursor() as wh:
        has_control = ledger.control_schema_exists(wh)
        ledgers = {e.name: pipeline_ledger(wh, e.name, failure_window) if has_control else PipelineLedger()
                   for e in entries if e.spec}
        orphans = orphan_stage_tables(wh, control_schema=has_control)
        streams = [stream_status(wh, e.spec) for e in entries if e.spec and e.spec.sink.mode == "standing"] \
            if has_control and ledger.stream_tables_exist(wh) else []

    specs = [e.spec for e in entries if e.spec]
    conn_ids = sorted({CONN_SOURCE, *(s.source_conn_id for s in specs)})
    sources: dict[str, SourceStatus] = {}
    lags: dict[str, Lag | None] = {}
    for conn_id in conn_ids:
        try:
            conn = open_source(conn_id)
        except Exception as exc:
            sources[conn_id] = SourceStatus(conn_id, error=error_text(exc))
            continue
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
        finally:
            conn.close()

    pipelines = []
    for e in entries:
        if e.spec is None:
            pipelines.append(PipelineStatus(e.name, str(e.path), error=e.error))
            continue
        source = sources[e.spec.source_conn_id]
        lag = lags.get(e.name) if source.error is None else Lag(error=f"source {source.conn_id}: {source.error}")
        pipelines.append(PipelineStatus(e.name, str(e.path), None, e.spec.source_conn_id, e.spec.cursor.kind,
                                        ledgers[e.name], lag))
    return StatusReport(
        generated_at=datetime.now(timezone.utc),
        pipelines_dir=str(pipelines_directory) if pipelines_directory else "",
        control_schema=has_control,
        pipelines=pipelines,
        sources=[sources[c] for c in conn_ids],
        orphan_stage_tables=orphans,
        streams=streams,
    )


# --- text, for `make status` and logs ---------------------------------------------------------

def status_lines(report: StatusReport) -> list[str]:
    """One line per pipeline: last committed batch, watermark, how far behind the source it is,
    and for a standing sink its desired state, instance, lag and restarts."""
    streams = {t.pipeline: t for t in report.streams}
    lines = []
    for p in report.pipelines:
        if p.error:
            lines.append(f"{p.name}: invalid spec: {p.error}")
            continue
        c, w = p.ledger.last_committed, p.ledger.watermark
        batch = (f"last batch {c.batch_id} ({c.rows} rows, {utc_iso(c.committed_at)}, "
                 f"{c.reconciliation or 'not reconciled yet'})" if c else "no batch yet")
        lag = p.lag
        behind = ("-" if lag is None else lag.error if lag.error else f"{lag.ids} ids" if lag.ids is not None
                  else format_duration(lag.seconds) + (" (held back by a source transaction)" if lag.held_back else ""))
        line = f"{p.name}: {batch}; watermark {w.bound if w else '-'}; behind the source {behind}"
        if p.ledger.dead_letters_pending:
            line += (f"; {p.ledger.dead_letters_pending} dead letter(s) not yet in the DLQ, oldest from "
                     f"{utc_iso(p.ledger.oldest_pending_reject)}")
        t = streams.get(p.name)
        if t is not None:
            line += f"; stream desired={t.desired} {_instance(t, report.generated_at)} lag " \
                    f"{sum((t.lag or {}).values())} records, restarts {t.restarts}/{t.restart_budget}"
            if t.serving_view:
                line += f"; {t.serving_view} complete up to {utc_iso(t.complete_up_to) if t.complete_up_to else '-'}"
        lines.append(line)
    return lines


def _instance(t: StreamStatus, now: datetime) -> str:
    if t.crash_looping_since:
        return f"CRASH-LOOPING since {utc_iso(t.crash_looping_since)}"
    if t.heartbeat_at is None:
        return "never started"
    if t.ended_at is not None:
        return f"stopped at {utc_iso(t.ended_at)}"
    return f"running (beat {format_duration(now - t.heartbeat_at)} ago)"

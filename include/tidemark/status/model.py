"""What the status page shows: one frozen record per thing, and how its values are written."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from tidemark.ledger import ResnapshotRequest
from tidemark.protocol.progress import byte_size
from tidemark.protocol.spec import PipelineSpec, load_specs
from tidemark.protocol.window import SourceClock

FAILURE_WINDOW = timedelta(days=7)
APPLICATION_NAME = "tidemark-status"  # how the page's own sessions show in pg_stat_activity
UNFINISHED = ("open", "sealed")
FAILED = ("refused", "aborted")
CHECK_TIMEOUT_S = 2.0  # each health check: a connect (libpq's minimum is 2 s) or a broker's metadata


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
    # What an unfinished attempt has staged so far (None: not counted): the sink's staged totals (records
    # with its headers, until END's check), or for transport: direct (``staged_directly``) PostgreSQL's
    # count of the rows its extract's tasks wrote into the stage.
    staged: int | None = None
    staged_directly: bool = False

    def staged_text(self) -> str | None:
        if self.staged is None:
            return None
        if self.staged_directly:  # an estimate: a range's COPY that rolled back counts too
            return f"about {self.staged:,} rows staged directly"
        return f"{self.staged:,} records staged"


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
    # pipeline -> seconds its extract has held one snapshot of the source (tidemark.batch.extract.snapshot)
    extract_snapshots: dict[str, float] = field(default_factory=dict)
    clock: SourceClock | None = field(default=None, metadata={"json": False})  # what the planner reads

@dataclass(frozen=True)
class Lag:
    """How far the watermark is behind the source: a duration, or a number of ids."""

    seconds: float | None = None
    ids: int | None = None
    held_back: bool = False  # an open or prepared source transaction, not the safe lag, sets the next window's end
    error: str | None = None
    snapshot_held_s: float | None = None  # an extract reading now has held its snapshot of the source this long
    snapshot_limit_s: float | None = None  # the spec's max_snapshot_hold

    def snapshot_text(self) -> str:
        """An extract's snapshot held now, as the page and ``make status`` say it (empty: none held)."""
        if self.snapshot_held_s is None:
            return ""
        return (f"extract reading in one snapshot of the source, held {format_duration(self.snapshot_held_s)} of "
                f"max_snapshot_hold {format_duration(self.snapshot_limit_s)} (vacuum waits for it)")


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
    """One component's check: the Kafka broker, Kafka Connect, the warehouse, or a source database."""

    component: str  # "kafka", "connect", "warehouse" or "source <conn_id>": the key in the health file
    kind: str  # broker, connect, warehouse, source
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

    by: str  # warehouse, source, broker, connect, sink, person, transaction
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
    capture: "CaptureStatus | None" = None  # a CDC pipeline's change capture


@dataclass(frozen=True)
class CaptureStatus:
    """A CDC pipeline's capture as the warehouse knows it (handoff, last position applied) and its
    slot as the source shows it (filled from the source, where the slot's WAL is kept)."""

    handoff_batch: str | None = None  # the committed handoff batch (None: none yet)
    handoff_point: str | None = None  # its slot's consistent point
    applied_lsn: str | None = None  # the commit position of the last source transaction applied
    applied_source_at: datetime | None = None  # when the source committed it
    slot: str | None = None
    slot_found: bool | None = None  # None: the source was not read
    slot_active: bool | None = None
    wal_status: str | None = None
    retained_bytes: int | None = None
    source_error: str | None = None
    connector: str | None = None  # the connector and its tasks as Kafka Connect reports them (None: not asked)
    connector_ok: bool | None = None  # False: failed, missing after the handoff, or Connect unreachable
    # a re-snapshot a person asked for that no committed handoff has answered yet (ledger.resnapshot_asked)
    resnapshot: ResnapshotRequest | None = None
    group: str | None = None  # the capture group the pipeline is captured with (tidemark.realtime.cdc.groups)
    members: tuple[str, ...] = ()  # the group's members as its lead's sink registered them
    group_shown: bool | None = None  # the group's serving views show rows (every member's handoff committed)

    def text(self) -> str:
        """The whole capture: a waiting re-snapshot first (it explains a stopped connector and an unread
        slot), then the capture's state."""
        waiting = self.resnapshot_text()
        return f"{waiting}; {self.state_text()}" if waiting else self.state_text()

    def resnapshot_text(self) -> str | None:
        """What a waiting re-snapshot means, worded as the supervisor acts on it (None: none waits)."""
        r = self.resnapshot
        if r is None:
            return None
        why = f" ({r.reason})" if r.reason else ""
        return (f"re-snapshot asked by {r.actor} at {utc_iso(r.at)}{why}: waiting for the pipeline's next batch run, "
                f"which will be a new handoff (slot {self.slot} made again with a snapshot of the table); the "
                "supervisor keeps the connector stopped until that handoff commits, then resumes it on the new slot; "
                "next: the batch DAG's scheduled run, or Trigger it")

    def is_bad(self) -> bool:
        """Something a person must look at: the slot missing or unread, the source unreadable, the connector
        failed, missing after the handoff or unknown. While a re-snapshot waits, the connector is stopped on
        purpose and so the slot goes unread: asked for, not bad."""
        unread = self.slot_active is False and self.resnapshot is None
        return bool(self.slot_found is False or unread or self.source_error or self.connector_ok is False)

    def state_text(self) -> str:
        handoff = (f"handoff {self.handoff_batch} at {self.handoff_point}" if self.handoff_batch
                   else "no handoff batch committed yet")
        applied = (f"applied up to {self.applied_lsn} (source commit {utc_iso(self.applied_source_at) or '-'})"
                   if self.applied_lsn else "no change applied yet")
        if self.source_error:
            slot = f"slot {self.slot}: source unreadable ({self.source_error})"
        elif self.slot_found is None:
            slot = f"slot {self.slot}: not read"
        elif not self.slot_found:
            slot = f"slot {self.slot} MISSING on the source"
        else:
            slot = (f"slot {self.slot} {'read' if self.slot_active else 'UNREAD'}, wal_status {self.wal_status}, "
                    f"retains {byte_size(self.retained_bytes or 0)}")
        connector = f"connector {self.connector}; " if self.connector else ""
        return f"{self.group_text()}{connector}{handoff}; {applied}; {slot}"

    def group_text(self) -> str:
        """The group's part of the line: its members, and whether its views show rows yet."""
        if self.group is None:
            return ""
        members = ", ".join(self.members) or "not registered yet (its lead's sink has not started)"
        shown = ("its serving views show rows (every member's handoff committed)" if self.group_shown else
                 "its serving views show NO row until every member's handoff has committed")
        return f"capture group {self.group} (members {members}; one transaction whole across them): {shown}; "



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
    if value.tzinfo is None:  # timestamptz arrives aware; a naive value is UTC, as in tidemark.protocol.window
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
    return "?" if value is None else byte_size(value)


def error_text(exc: BaseException) -> str:
    """What went wrong, for the page (connection errors name host, database and user, never the password)."""
    return f"{type(exc).__name__}: {str(exc).strip()}"

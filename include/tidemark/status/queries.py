"""The status page's queries: read-only sessions, one short transaction per query."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

from tidemark import ledger
from tidemark.batch.stage import STAGE_SCHEMA, rows_inserted, stage_table
from tidemark.ledger import catalog
from tidemark.protocol.spec import PipelineSpec
from tidemark.protocol.window import EXTRACT_APPLICATION, read_source_clock
from tidemark.realtime import speed_layer
from tidemark.realtime.cdc.changes import lsn_text
from tidemark.realtime.cdc.connect import ConnectError
from tidemark.realtime.cdc.groups import capture_consumer
from tidemark.realtime.cdc.source import Slot
from tidemark.realtime.cdc.tables import group_ready
from tidemark.status.model import (
    APPLICATION_NAME,
    FAILED,
    FAILURE_WINDOW,
    UNFINISHED,
    Attempt,
    CaptureStatus,
    CommittedBatch,
    Lag,
    PipelineLedger,
    PreparedXact,
    SourceSession,
    SourceStatus,
    StageTable,
    StreamStatus,
    Watermark,
)


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
    unfinished = [staging(cur, Attempt(*r)) for r in ledger.attempts(cur, pipeline, UNFINISHED)]
    recent = [Attempt(*r) for r in ledger.attempts(cur, pipeline, FAILED, newest_first=True, since=failure_window)]
    last = recent[:1] or [Attempt(*r) for r in ledger.attempts(cur, pipeline, FAILED, newest_first=True, limit=1)]
    pending, oldest = ledger.pending_reject_summary(cur, ledger.consumer_for(pipeline))
    return PipelineLedger(committed, watermark, unfinished, recent, last[0] if last else None, pending, oldest)


def staging(cur, a: Attempt) -> Attempt:
    """An unfinished attempt with what is staged of it so far. Through Kafka the sink's staged totals
    count its records (those another producer sent with its headers too, until END's check drops them);
    a direct attempt's loads join the ledger only once its extract's report is recorded, so the stage's
    statistics count its rows."""
    if ledger.batch_transport(cur, a.batch_id) == "direct":
        return replace(a, staged=rows_inserted(cur, a.batch_id, a.attempt), staged_directly=True)
    return replace(a, staged=sum(rows for rows, _ in ledger.staged(cur, a.batch_id, a.attempt).values()))


def stream_status(cur, spec: PipelineSpec) -> StreamStatus:
    state = ledger.stream_state(cur, spec.name)
    beat = ledger.heartbeat(cur, spec.name) or {}
    restarts = ledger.restarts_since(cur, spec.name, spec.sink.budget_window)
    speed = speed_layer(spec)
    fresh = (speed.freshness(cur) if speed is not None else None) or {}
    return StreamStatus(
        spec.name, state.desired, state.changed_by, state.changed_at, state.reason, state.crash_looping_since,
        beat.get("fence"), beat.get("holder"), beat.get("heartbeat_at"), beat.get("progress_at"), beat.get("records"),
        beat.get("lag"), beat.get("ended_at"), len(restarts), spec.sink.restart_budget,
        speed.serving_view if speed is not None else None, fresh.get("complete_up_to"),
        capture_status(cur, spec) if spec.cdc is not None else None)


def capture_status(cur, spec: PipelineSpec) -> CaptureStatus:
    """What the warehouse knows of a CDC pipeline's capture: its handoff, the last position applied and
    a re-snapshot still waiting for its handoff (nothing, from a control schema older than the handoff:
    this page never creates tables; its stream_events come before it in the schema)."""
    cur.execute("SELECT to_regclass('tidemark_control.cdc_handoffs') IS NULL")
    if cur.fetchone()[0]:
        return CaptureStatus(slot=spec.cdc_slot)
    handoff = ledger.committed_handoff(cur, spec.name)
    cur.execute("SELECT commit_lsn, source_ms FROM tidemark_control.cdc_positions WHERE consumer = %s",
                (capture_consumer(spec),))
    row = cur.fetchone()
    applied, source_ms = row if row else (None, None)
    return CaptureStatus(
        handoff.batch_id if handoff else None, handoff.consistent_point if handoff else None,
        lsn_text(applied) if applied is not None else None,
        datetime.fromtimestamp(source_ms / 1000, timezone.utc) if source_ms is not None else None, spec.cdc_slot,
        # the supervisor's and the plan's own test of a waiting request, so the page says what they do
        resnapshot=ledger.resnapshot_asked(cur, spec.name), **_group(cur, spec))


def _group(cur, spec: PipelineSpec) -> dict:
    """A capture group member's group: its members as registered, and whether its views show rows."""
    group = spec.cdc.group if spec.cdc is not None else None
    if group is None:
        return {}
    cur.execute("SELECT to_regclass('tidemark_control.capture_groups') IS NULL")
    if cur.fetchone()[0]:  # an older control schema: this page never creates tables
        return {"group": group}
    cur.execute("SELECT members FROM tidemark_control.capture_groups WHERE name = %s", (group,))
    row = cur.fetchone()
    cur.execute(f"SELECT {group_ready(group)}")
    return {"group": group, "members": tuple(row[0]) if row else (), "group_shown": cur.fetchone()[0]}


def with_connector(capture: CaptureStatus, connect, name: str) -> CaptureStatus:
    """The capture with its connector's state from Kafka Connect's REST API (``connect``: a
    ``ConnectClient``, or the exception that kept its connection from being resolved)."""
    if isinstance(connect, ConnectionError):  # the worker does not answer: the health table says since when
        return replace(capture, connector=f"state unknown: {connect}", connector_ok=False)
    if isinstance(connect, BaseException):
        return replace(capture, connector=f"state unknown (the Connect connection: {connect})", connector_ok=False)
    try:
        state = connect.state(name)
    except ConnectError as exc:
        return replace(capture, connector=f"state unknown ({exc})", connector_ok=False)
    # a waiting re-snapshot's handoff, like the first one, is what the supervisor creates or resumes it after
    waiting = capture.handoff_batch is None or capture.resnapshot is not None
    if state.state == "MISSING":  # the supervisor creates it once the handoff batch commits
        return replace(capture, connector=f"{name} not created{' yet (after the handoff)' if waiting else ''}",
                       connector_ok=waiting)
    tasks = ", ".join(f"task {t.id} {t.state}" + (f" ({t.error_line})" if t.error_line else "") for t in state.tasks)
    kept_stopped = capture.resnapshot is not None and state.state == "STOPPED"  # the supervisor's doing, asked for
    return replace(capture, connector=f"{name} {state.state}, {tasks or 'no task'}",
                   connector_ok=state.running or kept_stopped)


def with_slot(capture: CaptureStatus, held: Slot | None) -> CaptureStatus:
    """The capture with its slot as the source shows it (the WAL the slot keeps there; None: no slot)."""
    if held is None:
        return replace(capture, slot_found=False)
    return replace(capture, slot_found=True, slot_active=held.active, wal_status=held.wal_status,
                   retained_bytes=held.retained_bytes)


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
    return SourceStatus(conn_id, clock.now, session, prepared, clock=clock, extract_snapshots=extract_snapshots(cur))


def extract_snapshots(cur) -> dict[str, float]:
    """Pipeline -> seconds its extract has held its snapshot of the source: the oldest transaction of its
    sessions that holds back the xmin horizon (the exporting one; the parallel reads import it later)."""
    cur.execute("""SELECT substr(application_name, %(n)s), extract(epoch FROM max(clock_timestamp() - xact_start))
                     FROM pg_stat_activity
                    WHERE datname = current_database() AND application_name LIKE %(prefix)s
                      AND backend_xmin IS NOT NULL AND xact_start IS NOT NULL
                    GROUP BY 1""", {"n": len(EXTRACT_APPLICATION) + 1, "prefix": EXTRACT_APPLICATION + "%"})
    return {name: float(age) for name, age in cur.fetchall()}


def watermark_lag(cur, spec: PipelineSpec, watermark: Watermark | None, source: SourceStatus) -> Lag | None:
    """Lag behind the source: its clock minus the watermark (timestamp cursors), or ids not yet
    loaded, max(id) minus the watermark (id cursors). None: no watermark yet."""
    clock = source.clock
    held = {"snapshot_held_s": source.extract_snapshots.get(spec.name),
            "snapshot_limit_s": spec.max_snapshot_hold.total_seconds()}
    if watermark is None or clock is None:  # the first batch's extract may be reading already
        return Lag(**held) if held["snapshot_held_s"] is not None else None
    if spec.cursor.kind == "id":
        high = catalog.observe_id_high(cur, spec)[0]
        return Lag(ids=max(int(high or 0) - int(watermark.cursor), 0), **held)
    return Lag(seconds=(clock.now - watermark.cursor).total_seconds(), held_back=clock.holds_back(spec.safe_lag),
               **held)

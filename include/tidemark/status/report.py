"""The whole page (``collect``) and its text for `make status` and logs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from tidemark import ledger
from tidemark.protocol.config import CONN_CONNECT, CONN_KAFKA, CONN_SOURCE, CONN_SPARK, CONN_WAREHOUSE
from tidemark.realtime.cdc.groups import connector_name
from tidemark.realtime.cdc.source import Slot, slot_named
from tidemark.status.health import Probe, pg_address, probe_broker, probe_spark_master, remember_health
from tidemark.status.holds import hold_text, pipeline_holds
from tidemark.status.model import (
    FAILURE_WINDOW,
    Lag,
    PipelineEntry,
    PipelineLedger,
    PipelineStatus,
    SourceStatus,
    StatusReport,
    StreamStatus,
    error_text,
    format_duration,
    utc_iso,
)
from tidemark.status.queries import (
    orphan_stage_tables,
    pipeline_ledger,
    read_only_session,
    source_status,
    stream_status,
    watermark_lag,
    with_connector,
    with_slot,
)


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
    connect: Any = None,
    spark_master: str | BaseException | None = None,
) -> StatusReport:
    """The status of every pipeline. ``warehouse_conn`` is the caller's, or None: then
    ``open_warehouse()`` opens one (closed here), and a warehouse that does not answer is shown as
    unreachable instead of failing the report. ``open_source(conn_id)`` opens a connection to a
    source, closed here; a source that fails shows its error. ``kafka_bootstrap``: the broker to
    check (an exception: its connection could not be resolved; None: no broker check). Each
    outage's first failed check is kept in ``health_path`` (None: the outage dates from this check).
    ``connect``: Kafka Connect's client, for each CDC pipeline's connector state (an exception: its
    connection could not be resolved; None: not asked). ``spark_master``: the Spark master the jobs run on;
    a standalone one (``spark://``) is checked, a local one needs no check."""
    entries = list(entries)
    specs = [e.spec for e in entries if e.spec]
    wh = warehouse_view(specs, warehouse_conn, open_warehouse, failure_window)
    conn_ids = sorted({CONN_SOURCE, *(s.source_conn_id for s in specs)})
    sources, lags, probes, slots = source_views(conn_ids, specs, wh.ledgers, open_source)
    probes.insert(0, wh.probe)
    broker = broker_view(kafka_bootstrap, kafka_conn_id, broker_probe)
    if broker is not None:
        probes.append(broker)
    if connect is not None:
        probes.append(connect_view(connect))
        if probes[-1].error is not None:  # one line in the health table, not one timeout per connector
            connect = ConnectionError(f"Kafka Connect does not answer (see the health table): {probes[-1].error}")
    spark = spark_view(spark_master)
    if spark is not None:
        probes.append(spark)
    now = datetime.now(timezone.utc)
    health = remember_health(probes, health_path, now)
    stream_of = {t.pipeline: _with_capture(t, slots, sources, specs, connect) for t in wh.streams}
    pipelines = []
    for e in entries:
        if e.spec is None:
            pipelines.append(PipelineStatus(e.name, str(e.path), error=e.error))
            continue
        source = sources[e.spec.source_conn_id]
        lag = lags.get(e.name) if source.error is None else Lag(error=f"source {source.conn_id}: {source.error}")
        row = PipelineStatus(e.name, str(e.path), None, e.spec.source_conn_id, e.spec.cursor.kind, wh.ledgers[e.name], lag)
        held = pipeline_holds(row, health=health, source=source, stream=stream_of.get(e.name), now=now,
                              lease=e.spec.sink.lease if e.spec.sink.mode == "standing" else None)
        pipelines.append(dataclasses.replace(row, held_by=held))
    return StatusReport(
        generated_at=now,
        pipelines_dir=str(pipelines_directory) if pipelines_directory else "",
        control_schema=wh.has_control,
        pipelines=pipelines,
        sources=[sources[c] for c in conn_ids],
        orphan_stage_tables=wh.orphans,
        streams=list(stream_of.values()),
        health=health,
        warehouse_error=wh.error,
    )


@dataclasses.dataclass
class WarehouseView:
    """What the page reads from the warehouse, and the warehouse's own probe."""
    ledgers: dict[str, PipelineLedger]
    has_control: bool = False
    orphans: list = dataclasses.field(default_factory=list)
    streams: list[StreamStatus] = dataclasses.field(default_factory=list)
    error: str | None = None
    probe: Probe | None = None


def warehouse_view(specs, warehouse_conn, open_warehouse, failure_window: timedelta) -> WarehouseView:
    """Each pipeline's ledger, the orphan stages and the standing sinks. A connection the caller
    gave that breaks raises; one opened here that does not answer is an unreachable warehouse."""
    import psycopg2

    own_warehouse = warehouse_conn is None
    view = WarehouseView({s.name: PipelineLedger() for s in specs})
    if own_warehouse:
        try:
            warehouse_conn = open_warehouse()
        except Exception as exc:
            view.error = error_text(exc)
    try:
        if warehouse_conn is not None:
            try:
                read_only_session(warehouse_conn)
                with warehouse_conn.cursor() as wh:
                    view = read_warehouse(wh, specs, failure_window)
            except psycopg2.OperationalError as exc:  # the connection broke or a query timed out
                if not own_warehouse or isinstance(exc, psycopg2.errors.LockNotAvailable):
                    raise
                view = WarehouseView({s.name: PipelineLedger() for s in specs}, error=error_text(exc))
        view.probe = Probe("warehouse", "warehouse", CONN_WAREHOUSE,
                           pg_address(warehouse_conn) if warehouse_conn is not None else None, view.error)
    finally:
        if own_warehouse and warehouse_conn is not None:
            warehouse_conn.close()
    return view


def read_warehouse(wh, specs, failure_window: timedelta) -> WarehouseView:
    if not ledger.control_schema_exists(wh):
        return WarehouseView({s.name: PipelineLedger() for s in specs},
                             orphans=orphan_stage_tables(wh, control_schema=False))
    streams = ([stream_status(wh, s) for s in specs if s.sink.mode == "standing"]
               if ledger.stream_tables_exist(wh) else [])
    return WarehouseView({s.name: pipeline_ledger(wh, s.name, failure_window) for s in specs}, True,
                         orphan_stage_tables(wh, control_schema=True), streams)


def source_views(conn_ids: list[str], specs, ledgers: dict[str, PipelineLedger], open_source: Callable[[str], Any]):
    """Each source's status and probe, and the watermark lag of each pipeline it feeds; a source
    that fails shows its error (a failing table: that pipeline's row only)."""
    import psycopg2

    sources: dict[str, SourceStatus] = {}
    lags: dict[str, Lag | None] = {}
    probes: list[Probe] = []
    slots: dict[str, Slot | None | str] = {}  # a CDC pipeline's slot as its source shows it (str: why unread)
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
                    if spec.cdc is not None:
                        try:
                            slots[spec.name] = slot_named(src, spec.cdc_slot)
                        except Exception as exc:  # the slot is this row's news only
                            slots[spec.name] = error_text(exc)
        except Exception as exc:
            sources[conn_id] = SourceStatus(conn_id, error=error_text(exc))
            if isinstance(exc, psycopg2.OperationalError):
                unreachable = error_text(exc)
        finally:
            probes.append(Probe(f"source {conn_id}", "source", conn_id, pg_address(conn), unreachable))
            conn.close()
    return sources, lags, probes, slots


def _with_capture(t: StreamStatus, slots, sources, specs, connect) -> StreamStatus:
    """A CDC pipeline's stream line with its connector's state (when ``connect`` is given) and its
    slot read from its source (or why either could not be read)."""
    if t.capture is None:
        return t
    spec = next((s for s in specs if s.name == t.pipeline), None)
    if connect is not None and spec is not None:
        t = dataclasses.replace(t, capture=with_connector(t.capture, connect, connector_name(spec)))
    source = sources.get(spec.source_conn_id) if spec is not None else None
    if t.pipeline in slots:
        held = slots[t.pipeline]
        return dataclasses.replace(t, capture=dataclasses.replace(t.capture, source_error=held) if isinstance(held, str)
                                   else with_slot(t.capture, held))
    if source is not None and source.error:
        return dataclasses.replace(t, capture=dataclasses.replace(t.capture, source_error=source.error))
    return t


def broker_view(kafka_bootstrap, kafka_conn_id: str, broker_probe) -> Probe | None:
    """The broker's probe (``kafka_bootstrap`` an exception: its connection could not be resolved;
    None: no broker check)."""
    if isinstance(kafka_bootstrap, BaseException):
        return Probe("kafka", "broker", kafka_conn_id, None, f"connection {kafka_conn_id}: {error_text(kafka_bootstrap)}")
    if kafka_bootstrap is None:
        return None
    try:
        broken = broker_probe(kafka_bootstrap)
    except Exception as exc:  # the probe itself failed (e.g. no Kafka client here): say so, never fail the page
        broken = error_text(exc)
    return Probe("kafka", "broker", kafka_conn_id, kafka_bootstrap, broken)


def connect_view(connect) -> Probe:
    """Kafka Connect's probe (``connect``: its client, or why its connection could not be resolved)."""
    if isinstance(connect, BaseException):
        return Probe("connect", "connect", CONN_CONNECT, None, f"connection {CONN_CONNECT}: {error_text(connect)}")
    try:
        connect.version()
        broken = None
    except Exception as exc:  # ConnectError: refused, timed out, an error page
        broken = error_text(exc)
    return Probe("connect", "connect", CONN_CONNECT, connect.url, broken)


def spark_view(master: str | BaseException | None) -> Probe | None:
    """The Spark master's probe, when the jobs run on a standalone one (``spark://``; local mode: None)."""
    if isinstance(master, BaseException):
        return Probe("spark", "spark", CONN_SPARK, None, f"connection {CONN_SPARK}: {error_text(master)}")
    if master is None or not master.startswith("spark://"):
        return None
    return Probe("spark", "spark", CONN_SPARK, master, probe_spark_master(master))


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
        if lag is not None and lag.snapshot_text():
            line += f"; {lag.snapshot_text()}"
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
            if t.capture is not None:
                line += f"; capture: {t.capture.text()}"
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

"""The orchestration-side steps of a nightly batch: plan, BEGIN, END, and the commit check.

Each step takes plain psycopg2 connections and a Kafka bootstrap string, so Airflow tasks, tests
and the benchmark run exactly the same code. Every log line names the pipeline, batch id,
attempt, window and counts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tidemark import ledger
from tidemark.ledger import catalog
from tidemark.protocol import control
from tidemark.protocol.avro import SchemaError, SourceColumn, fit
from tidemark.protocol.control import PartitionTotals
from tidemark.protocol.errors import Terminal
from tidemark.protocol.kafka_io import ensure_topic
from tidemark.protocol.replication import Replication
from tidemark.protocol.spec import PipelineSpec
from tidemark.protocol.window import Bound, PlanError, Window, cap_rows, plan_window, read_source_clock
from tidemark.realtime import speed_layer

log = logging.getLogger("tidemark.batch")


@dataclass(frozen=True)
class Plan:
    batch_id: str
    window: Window
    reused: bool
    repair: bool = False  # a repair batch (tidemark.batch.repair): only the keys the ledger holds for it
    schema_version: int | None = None  # protocol version 2's record schema; None: version 1, JSON
    writer_schema: str | None = None  # its Avro schema, which the extract writes with
    handoff: bool = False  # a CDC pipeline's handoff batch (tidemark.realtime.cdc.handoff): its stream starts after it
    transport: str = "kafka"  # how the extract's records reach the stage (the ledger's, ``PipelineSpec.transport``)
    reads_above: bool = False  # the extract reads the snapshot's rows above the window too (the ledger's)

    @property
    def read_window(self) -> Window:
        """What the extract reads (``ledger.LedgerBatch.records_window``, the one rule)."""
        return ledger.records_window(self.window, handoff=self.handoff, reads_above=self.reads_above)

    def to_xcom(self) -> dict[str, Any]:
        return {"batch_id": self.batch_id, "window": self.window.to_json(), "reused": self.reused,
                "repair": self.repair, "schema_version": self.schema_version, "writer_schema": self.writer_schema,
                "handoff": self.handoff, "transport": self.transport, "reads_above": self.reads_above}

    @classmethod
    def from_xcom(cls, raw: dict[str, Any]) -> "Plan":
        return cls(raw["batch_id"], Window.from_json(raw["window"]), bool(raw.get("reused")),
                   bool(raw.get("repair")), raw.get("schema_version"), raw.get("writer_schema"),
                   bool(raw.get("handoff")), raw.get("transport", "kafka"), bool(raw.get("reads_above")))


def plan(
    spec: PipelineSpec, source_conn, warehouse_conn, *, run_id: str,
    interval: tuple[datetime, datetime] | None = None, bootstrap: str | None = None,
    replication: Replication = Replication(),
) -> Plan:
    """Decide the window on the source's clock and record it; a retried run re-uses its window.

    With ``bootstrap``, also create the pipeline's topic (for a sink started before BEGIN), ``replication``
    as the Kafka connection says."""
    with warehouse_conn, warehouse_conn.cursor() as wh:
        ledger.ensure_control_schema(wh)
    with source_conn, source_conn.cursor() as src, warehouse_conn, warehouse_conn.cursor() as wh:
        catalog.check_source_access(src, spec)
        catalog.ensure_target(src, wh, spec)
        # Id cursors: the largest id, then the clock, then the open transactions (in that order).
        observed = catalog.observe_id_high(src, spec) if spec.cursor.kind == "id" else None
        clock = read_source_clock(src)
        id_high = (ledger.safe_id_high(wh, spec.name, observed, clock.oldest_open_xact)
                   if observed is not None else None)
        committed = ledger.committed_watermark(wh, spec.name)
        try:
            window = plan_window(spec, clock, committed, interval=interval, id_high=id_high)
        except PlanError:
            wh.connection.commit()  # keep the id observation: it is what lets a later plan move on
            raise
        whole = window
        speed = speed_layer(spec)
        handoff = speed is not None and speed.handoff_due(src, wh)  # this batch starts the stream (again)
        if spec.max_batch_rows is not None and not handoff:
            types = {name: type_ for name, type_, _ in catalog.source_columns(src, spec.table)}
            window = cap_rows(src, spec, window, types)
        version, fills = _register_schema(src, wh, spec, committed) if spec.record_format == "avro" else (None, {})
        planned = ledger.record_plan(wh, spec, ledger.batch_id_for(spec.name, run_id), run_id, window, version,
                                     handoff=handoff, transport=spec.transport,
                                     reads_above=reads_above(spec, window, whole, handoff))
        if fills and not planned.reused:
            ledger.record_column_fills(wh, planned.batch_id, fills)
        writer = (ledger.record_schema(wh, spec.name, planned.schema_version)[1]
                  if planned.schema_version is not None else None)
    if bootstrap:
        ensure_topic(bootstrap, spec.topic, spec.partitions, replication=replication)
    held = _held(spec, clock, observed, id_high)
    log.log(
        logging.WARNING if held else logging.INFO,
        "pipeline=%s batch=%s window=%s %s (source clock %s, safe lag %s, committed watermark %s)%s",
        spec.name, planned.batch_id, planned.window, "re-used from an earlier try" if planned.reused else "planned",
        clock.now.isoformat(), spec.safe_lag, committed, f"; window held back by {held}" if held else "",
    )
    if planned.handoff:
        log.info("pipeline=%s batch=%s window=%s is the CDC handoff: its extract creates replication slot %s and "
                 "reads every row above %s in the slot's snapshot; the stream continues from the slot once it "
                 "commits", spec.name, planned.batch_id, planned.window, spec.cdc_slot, planned.window.lo)
    if window != whole and not planned.reused:
        log.info("pipeline=%s batch=%s window=%s capped at max_batch_rows=%s rows of %s; the next batch goes on "
                    "from %s", spec.name, planned.batch_id, window, spec.max_batch_rows, whole, window.hi)
    if planned.reads_above:
        log.info("pipeline=%s batch=%s window=%s reads every row above %s in its snapshot of the source: a row "
                 "updated after %s lands at its snapshot version now (and again with the next batch, an idempotent "
                 "upsert); the watermark moves to %s", spec.name, planned.batch_id, planned.window, planned.window.lo,
                 planned.window.hi, planned.window.hi)
    return Plan(planned.batch_id, planned.window, planned.reused, schema_version=planned.schema_version,
                writer_schema=writer, handoff=planned.handoff, transport=planned.transport,
                reads_above=planned.reads_above)


def reads_above(spec: PipelineSpec, window: Window, whole: Window, handoff: bool) -> bool:
    """Whether a batch reads its snapshot's rows above its window's end too (docs/control-protocol.md §16).

    Yes for a scheduled window of a pipeline whose rows are updated in place (``write_mode: upsert``,
    not ``append_only``): a row updated more often than the safe lag, or between the plan and the
    read, always lies past the safe bound and would never be inside any window. Its snapshot version
    lands now; the watermark still moves only to the window's end, so nothing committed later at or
    below it is missed, and the next batch's upsert of the same version changes nothing. No for a
    backfill (exactly its interval), a window capped by ``max_batch_rows`` (the next batch goes on
    from its end, and the last one of a backlog reads above), a handoff (it reads above anyway), and
    append pipelines (their rows never move past a window; a window replace must not reach above)."""
    return (spec.write_mode == "upsert" and not spec.append_only and not window.backfill and window == whole
            and not handoff)


def _register_schema(src, wh, spec: PipelineSpec, committed: Bound | None) -> tuple[int, dict[str, str | None]]:
    """Protocol version 2: the record schema version of the source's columns now (a new one when a
    column was added or widened), after checking the target holds every source column exactly; and for each
    column the target lacks, what its rows loaded before must hold to equal the source's."""
    columns = [SourceColumn(*c) for c in catalog.source_columns(src, spec.table)]
    target = [SourceColumn(*c) for c in catalog.source_columns(wh, spec.target_table)]
    try:
        added, widened = fit(columns, target, spec.target_table, ledger.latest_schema_columns(wh, spec.name))
        fills = {c.name: _fill(src, spec, c, committed) for c in added}
        version, _ = ledger.register_schema(wh, spec.name, columns, {*spec.primary_key, spec.cursor.column})
    except SchemaError as exc:
        # no "Next:" here: the plan task adds the one next step (fix, then clear the task)
        raise PlanError(f"pipeline {spec.name} (record_format avro): {exc}") from None
    if added:
        log.warning("pipeline=%s record schema version %s: source column(s) %s are new; the batch adds them to %s "
                    "when it commits", spec.name, version, ", ".join(f"{c.name} {c.sql_type}" for c in added),
                    spec.target_table)
    if widened:
        log.warning("pipeline=%s record schema version %s: source column(s) %s were widened; the batch widens them in "
                    "%s when it commits", spec.name, version, ", ".join(f"{c.name} to {c.sql_type}" for c in widened),
                    spec.target_table)
    return version, {name: fill for name, fill in fills.items() if fill is not None}


def _fill(src, spec: PipelineSpec, column: SourceColumn, committed: Bound | None) -> str | None:
    """What the target's rows loaded before get in a column the source gained since: the one value
    PostgreSQL keeps for the source's older rows (a constant default), or NULL when none of the
    rows loaded holds a value; anything else (a volatile default evaluated row by row, values set
    since) cannot be reproduced by adding a column: ``SchemaError``."""
    kept_once, value, default = catalog.added_column_fill(src, spec.table, column.name)
    if kept_once or committed is None:
        return value
    loaded = catalog.loaded_rows_with_values(src, spec, column.name, committed)
    if not loaded:
        return None
    raise SchemaError(
        f"source column {column.name} {column.sql_type} (default {default or 'none'}) is new to the target "
        f"{spec.target_table}, and {loaded} source row(s) the batches loaded (up to the watermark {committed}) hold "
        f"values in it that PostgreSQL wrote row by row (a volatile default, or values set since); adding the column "
        f"to the target would leave them NULL there: refused. The way on: add the column to {spec.target_table} "
        f"yourself (ALTER TABLE ... ADD COLUMN {column.name} {column.sql_type}), and once this batch is in, run "
        f"tidemark_reconcile_{spec.name} with scope full and repair true: it reloads every row that differs")


def _held(spec: PipelineSpec, clock, observed, id_high) -> str:
    """Who holds the window's end back, when a source transaction (not the safe lag) set it."""
    if clock.prepared is not None:
        return clock.holders() + " (a pending prepared transaction holds the window at the watermark)"
    if clock.oldest_open_xact is None:
        return ""
    if spec.cursor.kind == "id":
        return clock.holders() if observed and observed[0] is not None and id_high != observed[0] else ""
    return clock.holders() if clock.holds_back(spec.safe_lag) else ""


def _broadcast(kind: control.Kind, spec: PipelineSpec, bootstrap: str, batch: Plan, attempt: int, *,
               keyring: control.Keyring, **extra: Any) -> None:
    """One signed control message per partition, in one Kafka transaction of the pipeline's producer."""
    msgs = control.messages(
        kind, pipeline=spec.name, batch_id=batch.batch_id, attempt=attempt,
        window=batch.window.to_json(), partitions=spec.partitions, schema_version=batch.schema_version, **extra,
    )
    control.send(bootstrap, spec.topic, msgs, transactional_id=f"tidemark.control.{spec.name}", keyring=keyring)


def begin(spec: PipelineSpec, warehouse_conn, bootstrap: str, batch: Plan, *, keyring: control.Keyring,
          replication: Replication = Replication()) -> int:
    """Open the next attempt in the ledger and send BEGIN to every partition.

    The topic is made sure of first: a broker that is down fails this step before any attempt
    is opened (plan needs only the databases), and refused, before any attempt, if its replication is
    less than ``replication`` asks."""
    ensure_topic(bootstrap, spec.topic, spec.partitions, replication=replication)
    with warehouse_conn, warehouse_conn.cursor() as wh:
        attempt = ledger.open_attempt(wh, batch.batch_id)
    _broadcast("BEGIN", spec, bootstrap, batch, attempt, keyring=keyring)
    log.info("pipeline=%s batch=%s attempt=%s window=%s BEGIN sent to %s partitions of %s",
             spec.name, batch.batch_id, attempt, batch.window, spec.partitions, spec.topic)
    return attempt


def record_extract(spec: PipelineSpec, warehouse_conn, batch: Plan, attempt: int, report: dict[str, Any]) -> int:
    """Keep the extract's per-partition totals in the ledger for END; returns the row count."""
    totals = control.loads_totals(report["totals"])
    if sorted(totals) != list(range(spec.partitions)):
        raise control.ProtocolError(
            f"pipeline={spec.name} batch={batch.batch_id} attempt={attempt}: extract report covers partitions "
            f"{sorted(totals)}, topic has {spec.partitions}"
        )
    offsets = {int(p): (int(first), int(nxt)) for p, (first, nxt) in report["offsets"].items()} \
        if "offsets" in report else None
    handoff = report.get("handoff")
    if batch.handoff != (handoff is not None):
        raise control.ProtocolError(
            f"pipeline={spec.name} batch={batch.batch_id} attempt={attempt}: the ledger plans "
            f"{'a' if batch.handoff else 'no'} CDC handoff, the extract reported {'one' if handoff else 'none'}")
    with warehouse_conn, warehouse_conn.cursor() as wh:
        transport = ledger.planned_batch(wh, batch.batch_id).transport  # the ledger's, not the report's
        loads = direct_loads(spec, batch, attempt, transport, report, totals)
        ledger.record_extract(wh, batch.batch_id, attempt, totals, offsets)
        if loads:  # a direct extract's tasks staged these: only their rows count
            ledger.add_loads(wh, batch.batch_id, attempt, loads)
        if handoff is not None:
            ledger.record_handoff(wh, spec.name, batch.batch_id, attempt, handoff["slot"], handoff["consistent_point"],
                                  bool(handoff.get("made_slot", True)))
        elif (report.get("snapshot") or {}).get("wal"):  # a capture group member's: it commits after the stream
            ledger.record_snapshot_wal(wh, batch.batch_id, attempt, report["snapshot"]["wal"])
    return sum(t.rows for t in totals.values())


def direct_loads(spec: PipelineSpec, batch: Plan, attempt: int, transport: str, report: dict[str, Any],
                 totals: dict[int, PartitionTotals]) -> list[int]:
    """The loads a direct extract reports having staged (none for a Kafka extract), when they add up
    to its totals on every partition; else ProtocolError naming the difference."""
    tag = f"pipeline={spec.name} batch={batch.batch_id} attempt={attempt}"
    reported = report.get("loads")
    if (transport == "direct") != (reported is not None):
        raise control.ProtocolError(f"{tag}: the ledger plans transport {transport}, the extract reported "
                                    f"{'staged loads' if reported is not None else 'none'}")
    if reported is None:
        return []
    sums: dict[int, list[int]] = {}
    for _load, partition, rows, checksum in reported:
        got = sums.setdefault(int(partition), [0, 0])
        got[0] += int(rows)
        got[1] += int(checksum)
    wrong = [f"partition {p}: loads {sums.get(p, [0, 0])[0]} rows checksum {sums.get(p, [0, 0])[1]}, totals "
             f"{t.rows} rows checksum {t.checksum}" for p, t in sorted(totals.items())
             if tuple(sums.get(p, [0, 0])) != (t.rows, t.checksum)]
    if wrong or set(sums) - set(totals):
        raise control.ProtocolError(f"{tag}: the direct extract's staged loads do not add up to its totals: "
                                    + "; ".join(wrong or [f"loads on partitions {sorted(set(sums) - set(totals))}"]))
    return sorted({int(load) for load, *_ in reported})


def end(spec: PipelineSpec, warehouse_conn, bootstrap: str, batch: Plan, attempt: int, *,
        keyring: control.Keyring) -> int:
    """Seal the attempt with the extract's totals (from the ledger) and send END to every partition."""
    with warehouse_conn, warehouse_conn.cursor() as wh:
        totals = ledger.extract_totals(wh, batch.batch_id, attempt)
        ledger.seal_attempt(wh, batch.batch_id, attempt, totals)
    return send_end(spec, bootstrap, batch, attempt, totals, keyring=keyring)


def send_end(spec: PipelineSpec, bootstrap: str, batch: Plan, attempt: int, totals: dict[int, PartitionTotals], *,
             keyring: control.Keyring) -> int:
    """END on every partition (a second send of the same totals is a no-op at the sink)."""
    _broadcast("END", spec, bootstrap, batch, attempt, keyring=keyring, totals=totals)
    rows = sum(t.rows for t in totals.values())
    log.info("pipeline=%s batch=%s attempt=%s window=%s END sent: rows=%s per partition %s",
             spec.name, batch.batch_id, attempt, batch.window, rows, {p: t.rows for p, t in totals.items()})
    return rows


def abort(spec: PipelineSpec, bootstrap: str, batch: Plan, attempt: int, reason: str, *,
          keyring: control.Keyring) -> None:
    _broadcast("ABORT", spec, bootstrap, batch, attempt, keyring=keyring, reason=reason)
    log.warning("pipeline=%s batch=%s attempt=%s ABORT sent: %s", spec.name, batch.batch_id, attempt, reason)


def abort_in_ledger(spec: PipelineSpec, warehouse_conn, batch: Plan, reason: str) -> int | None:
    """Mark the batch's latest attempt aborted if it is still open or sealed; returns it, or None.

    From then on the sink discards the attempt's records whether or not an ABORT message ever
    reaches it; sending ABORT (``abort``) only lets a running sink drop the stage table at once."""
    with warehouse_conn, warehouse_conn.cursor() as wh:
        attempt = ledger.abort_unfinished(wh, batch.batch_id, reason)
    if attempt is not None:
        log.warning("pipeline=%s batch=%s attempt=%s window=%s ABORTED in the ledger: %s",
                    spec.name, batch.batch_id, attempt, batch.window, reason)
    return attempt


class BatchFailed(Terminal, RuntimeError):
    """The sink refused or discarded the attempt; the message says what to do next."""


def commit_state(spec: PipelineSpec, warehouse_conn, batch_id: str, attempt: int) -> bool:
    """True once committed; raises BatchFailed if the attempt can no longer commit."""
    with warehouse_conn, warehouse_conn.cursor() as wh:
        status = ledger.attempt_status(wh, batch_id, attempt)
    tag = f"pipeline={spec.name} batch={batch_id} attempt={attempt}"
    if status.state == "committed":
        return True
    if status.state in ("refused", "aborted", "superseded"):
        raise BatchFailed(f"{tag}: {status.state}: {status.message}")
    log.info("%s: %s, END received on %s of %s partitions; waiting for the sink",
             tag, status.state or "not yet seen by the sink", status.ends_received, status.partitions or spec.partitions)
    return False


def summary(warehouse_conn, batch_id: str) -> dict[str, Any]:
    with warehouse_conn, warehouse_conn.cursor() as wh:
        return ledger.batch_summary(wh, batch_id)


__all__ = ["Plan", "plan", "begin", "record_extract", "end", "abort", "abort_in_ledger", "commit_state", "summary", "BatchFailed", "PartitionTotals"]

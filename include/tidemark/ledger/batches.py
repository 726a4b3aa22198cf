"""Batches as planned: ids, plans, record schemas, repairs, column fills, the watermark and id observations."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

import psycopg2.extensions

from tidemark.protocol.avro import SourceColumn, columns_from_json, drift
from tidemark.protocol.avro import schema as avro_schema
from tidemark.protocol.spec import PipelineSpec
from tidemark.protocol.window import Bound, Window


def batch_id_for(pipeline: str, run_id: str) -> str:
    """One batch per pipeline and DAG run: re-running the run re-uses its window."""
    return f"{pipeline}:{run_id}"


def committed_watermark(cur, pipeline: str, *, lock: bool = False) -> Bound | None:
    cur.execute("SELECT bound FROM tidemark_control.watermarks WHERE pipeline = %s"
                + (" FOR UPDATE" if lock else ""), (pipeline,))
    row = cur.fetchone()
    return Bound.from_json(row[0]) if row else None


def _recordable(window: Window, batch_id: str) -> None:
    """The ledger records only windows it can read back (``Window.from_json``: lo <= hi, one kind)."""
    try:
        Window.from_json(window.to_json())
    except ValueError as exc:
        raise ValueError(f"batch {batch_id}: refusing to plan window {window}: {exc}") from None


@dataclass(frozen=True)
class LedgerBatch:
    """A batch as the orchestrator recorded it in tidemark_control.batches: the one record of what a
    batch is (window, attempts, record schema, and a repair batch's keys), whoever reads it."""
    batch_id: str
    pipeline: str
    window: Window
    state: str = "planned"
    latest_attempt: int = 0
    reused: bool = False  # read back by record_plan: the run was planned before (a retry, a cleared run)
    schema_version: int | None = None  # protocol version 2's record schema (None: version 1, JSON)
    repair_keys: list[list[str]] | None = None  # a repair batch: only these keys (text forms) are re-loaded
    repair_of: str | None = None  # the repaired batch; None: the whole table
    repair_run: str | None = None  # the reconciliation run that found the keys
    repair_deletes: dict[str, Any] | None = None  # what its apply may delete (``repair.deletes``); None: every key
    handoff: bool = False  # a CDC pipeline's handoff batch: read in its slot's snapshot, open above the window
    transport: str = "kafka"  # how its records reach the stage: "kafka" (the topic) or "direct" (the extract's tasks)
    reads_above: bool = False  # reads its snapshot's rows above the window's end too (``records_window``)

    @property
    def records_window(self) -> Window:
        """Where the batch's rows' cursors lie: the window, opened above for a handoff batch (it reads
        every row of its snapshot after the window's start) and for a batch that reads above (an
        upsert pipeline's scheduled batch: the snapshot's newer versions of hot rows land now, the
        watermark still moves only to the window's end). The one rule for the extract's read, the
        sink's record checks in either format, and the reconciliation's comparison."""
        return records_window(self.window, handoff=self.handoff, reads_above=self.reads_above)


def records_window(window: Window, *, handoff: bool, reads_above: bool) -> Window:
    """``LedgerBatch.records_window`` for a window and its two marks."""
    return window.opened_above() if handoff or reads_above else window


_BATCH_COLUMNS = ("pipeline, state, window_lo, window_hi, backfill, attempt, schema_version, repair_keys, repair_of, "
                  "repair_run::text, repair_deletes, handoff, transport, reads_above")


def planned_batch(cur, batch_id: str) -> LedgerBatch | None:
    """What the orchestrator planned for a batch (None: never planned)."""
    cur.execute(f"SELECT {_BATCH_COLUMNS} FROM tidemark_control.batches WHERE batch_id = %s", (batch_id,))
    row = cur.fetchone()
    if row is None:
        return None
    pipeline, state, lo, hi, backfill, latest, version, keys, repair_of, run, deletes, handoff, transport, above = row
    return LedgerBatch(batch_id, pipeline, Window(Bound.from_json(lo), Bound.from_json(hi), backfill), state, latest,
                       False, version, keys, repair_of, run, deletes, handoff, transport, above)


def record_plan(cur, spec: PipelineSpec, batch_id: str, run_id: str, window: Window,
                schema_version: int | None = None, *, handoff: bool = False, transport: str = "kafka",
                reads_above: bool = False) -> LedgerBatch:
    """Store the batch's window and record schema, or return those an earlier try of the same run
    stored."""
    _recordable(window, batch_id)
    cur.execute(
        """INSERT INTO tidemark_control.batches
               (batch_id, pipeline, run_id, window_lo, window_hi, backfill, partitions, state, schema_version,
                handoff, transport, reads_above)
           VALUES (%s, %s, %s, %s, %s, %s, %s, 'planned', %s, %s, %s, %s)
           ON CONFLICT (batch_id) DO NOTHING""",
        (batch_id, spec.name, run_id, json.dumps(window.lo.to_json()), json.dumps(window.hi.to_json()),
         window.backfill, spec.partitions, schema_version, handoff, transport, reads_above),
    )
    if cur.rowcount == 1:
        return LedgerBatch(batch_id, spec.name, window, schema_version=schema_version, handoff=handoff,
                           transport=transport, reads_above=reads_above)
    return replace(planned_batch(cur, batch_id), reused=True)


def register_schema(cur, pipeline: str, columns: list[SourceColumn], required: set[str]) -> tuple[int, str]:
    """The pipeline's record schema version for these source columns, and its Avro writer schema:
    the latest if the columns are the same, a new one if they only grew (``avro.drift``), else
    ``avro.SchemaError`` with both schemas."""
    cur.execute("SELECT pg_advisory_xact_lock(hashtext('tidemark.record_schemas'), hashtext(%s))", (pipeline,))
    row = _latest_schema(cur, pipeline)
    if row is not None and columns_from_json(row[1]) == columns:
        return row[0], row[2]
    if row is not None:
        drift(columns_from_json(row[1]), columns)
    version, writer = (row[0] + 1 if row else 1), avro_schema(columns, required)
    cur.execute("INSERT INTO tidemark_control.record_schemas (pipeline, version, columns, writer_schema) "
                "VALUES (%s, %s, %s, %s)", (pipeline, version, json.dumps([c.to_json() for c in columns]), writer))
    return version, writer


def _latest_schema(cur, pipeline: str) -> tuple[int, Any, str] | None:
    cur.execute("SELECT version, columns, writer_schema FROM tidemark_control.record_schemas WHERE pipeline = %s "
                "ORDER BY version DESC LIMIT 1", (pipeline,))
    return cur.fetchone()


def latest_schema_columns(cur, pipeline: str) -> list[SourceColumn]:
    """The source columns of the pipeline's latest record schema version (none registered: none)."""
    row = _latest_schema(cur, pipeline)
    return columns_from_json(row[1]) if row is not None else []


def record_schema(cur, pipeline: str, version: int) -> tuple[list[SourceColumn], str]:
    """A registered schema version's source columns and Avro writer schema."""
    cur.execute("SELECT columns, writer_schema FROM tidemark_control.record_schemas WHERE pipeline = %s "
                "AND version = %s", (pipeline, version))
    row = cur.fetchone()
    if row is None:
        raise LookupError(f"pipeline {pipeline}: no record schema version {version} in tidemark_control.record_schemas")
    return columns_from_json(row[0]), row[1]


def record_repair_plan(cur, spec: PipelineSpec, batch_id: str, window: Window, keys: list[list[str]],
                       repair_of: str | None, repair_run: str, deletes: dict[str, Any] | None = None) -> LedgerBatch:
    """Store a repair batch: ``keys`` (text forms of the key columns) re-loaded from the source
    within ``window`` (a backfill window: the watermark never moves). ``deletes`` (``repair.deletes``):
    which of them its apply may delete where nothing is staged for them (None: every one)."""
    if not window.backfill:
        raise ValueError("a repair batch's window is a backfill window: it must never move the watermark")
    _recordable(window, batch_id)
    cur.execute(
        """INSERT INTO tidemark_control.batches
               (batch_id, pipeline, run_id, window_lo, window_hi, backfill, partitions, state, repair_keys, repair_of,
                repair_run, repair_deletes)
           VALUES (%s, %s, NULL, %s, %s, true, %s, 'planned', %s, %s, %s, %s)""",
        (batch_id, spec.name, json.dumps(window.lo.to_json()), json.dumps(window.hi.to_json()), spec.partitions,
         json.dumps(keys), repair_of, repair_run, json.dumps(deletes) if deletes is not None else None),
    )
    return LedgerBatch(batch_id, spec.name, window, repair_keys=keys, repair_of=repair_of, repair_run=repair_run,
                       repair_deletes=deletes)


def repair(cur, batch_id: str) -> LedgerBatch | None:
    """The repair batch ``batch_id`` (None: no such batch, or not a repair)."""
    found = planned_batch(cur, batch_id)
    return found if found is not None and found.repair_keys is not None else None


def repair_deletes(cur, batch_id: str) -> dict[str, Any] | None:
    """What a repair batch's apply may delete where nothing is staged for a key:
    ``{"apply_source_deletes": bool, "extra": [[key text]], "deleted_at_source": [[key text]]}``
    (None: planned before deletions were told apart, every repair key)."""
    cur.execute("SELECT repair_deletes FROM tidemark_control.batches WHERE batch_id = %s", (batch_id,))
    row = cur.fetchone()
    return row[0] if row else None


@dataclass(frozen=True)
class RepairDeletion:
    kind: str  # "deleted_at_source", "extra" or "unclassified" (a plan recorded before kinds were kept)
    key: list[str]  # the key columns' text
    old_values: dict[str, Any]  # the target row before the repair deleted it


def recording_repair_deletions(cur, batch_id: str, pipeline: str, target_table: str, *, deleted: str, kind: str,
                                key: str, unreplaced: str, order: str) -> str:
    """The CTE ``kept`` for the caller's statement, in whose transaction a repair deletes: every row its CTE
    ``deleted`` took that matches ``unreplaced`` (no staged replacement), with its old values, ``kind``
    (an SQL expression), and ``key`` (the key columns' text, comma-separated SQL), in ``order``, into
    tidemark_control.repair_deletions; it returns each one's kind. One statement with the delete, so
    the evidence is exactly what it took."""
    evidence = cur.mogrify("%s, %s, %s", (batch_id, pipeline, target_table)).decode(
        psycopg2.extensions.encodings[cur.connection.encoding])
    return f"""kept AS (INSERT INTO tidemark_control.repair_deletions
                               (batch_id, pipeline, target_table, kind, key, old_values)
                        SELECT {evidence}, {kind}, jsonb_build_array({key}), to_jsonb({deleted})
                          FROM {deleted} WHERE {unreplaced} ORDER BY {order}
                        RETURNING kind)"""


def repair_deletions(cur, batch_id: str) -> list[RepairDeletion]:
    """The target rows the repair batch ``batch_id`` deleted without a staged replacement, with
    their old values (tidemark_control.repair_deletions: the sink writes them with the delete)."""
    cur.execute("SELECT kind, key, old_values FROM tidemark_control.repair_deletions WHERE batch_id = %s ORDER BY id",
                (batch_id,))
    return [RepairDeletion(kind, key, old) for kind, key, old in cur.fetchall()]


class AlreadyCommitted(RuntimeError):
    """The batch is committed: nothing may reopen it (a cleared run, a replay)."""


def consumer_for(pipeline: str) -> str:
    """The sink's identity in this warehouse database: its fence, offsets and rejects are keyed by it."""
    return f"batch-sink.{pipeline}"


def record_column_fills(cur, batch_id: str, fills: dict[str, str | None]) -> None:
    """What the target's rows loaded before get in each column this batch adds (the source's value
    for its rows older than the column, as text; None: NULL)."""
    cur.execute("UPDATE tidemark_control.batches SET column_fills = %s WHERE batch_id = %s",
                (json.dumps(fills) if fills else None, batch_id))


def column_fills(cur, batch_id: str) -> dict[str, str | None]:
    cur.execute("SELECT column_fills FROM tidemark_control.batches WHERE batch_id = %s", (batch_id,))
    row = cur.fetchone()
    return dict(row[0]) if row and row[0] else {}


def safe_id_high(cur, pipeline: str, observed: tuple[int | None, Any], horizon: Any) -> int | None:
    """Record this plan's id observation and return the largest id that is final: seen at a time
    before the oldest transaction open now started (``horizon``; None: none open). A transaction
    open when an id was read may commit a lower id; once all of them have ended, none can.
    (Ids must come from a sequence or identity without a per-session cache.)"""
    high, at = observed
    if high is not None:
        cur.execute("INSERT INTO tidemark_control.id_observations (pipeline, observed_at, max_id) "
                    "VALUES (%s, %s, %s) ON CONFLICT DO NOTHING", (pipeline, at, high))
    cur.execute(
        "SELECT max(max_id), max(observed_at) FROM tidemark_control.id_observations "
        "WHERE pipeline = %s AND (%s::timestamptz IS NULL OR observed_at < %s::timestamptz)",
        (pipeline, horizon, horizon),
    )
    final, newest = cur.fetchone()
    if newest is not None:  # older observations can never be needed again
        cur.execute("DELETE FROM tidemark_control.id_observations WHERE pipeline = %s AND observed_at < %s",
                    (pipeline, newest))
    return final

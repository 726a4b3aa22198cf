"""The sink's side: fences, offsets, ENDs, staged totals, rejects, the watermark's advance."""

from __future__ import annotations

import json
from typing import Any

from tidemark.ledger.batches import committed_watermark, consumer_for, records_window
from tidemark.ledger.streams import heartbeat
from tidemark.protocol.avro import Format, columns_from_json
from tidemark.protocol.control import PartitionTotals
from tidemark.protocol.window import Bound, Window


class LeaseHeld(RuntimeError):
    """A live instance of the pipeline's sink holds the lease: this one must not start."""


def acquire_fence(cur, pipeline: str, holder: str, lease: Any = None) -> int:
    """Take the next fencing token of the pipeline's sink; any older holder fails on its next commit.

    With ``lease`` (a duration), refuse with ``LeaseHeld`` while the current token's instance still
    beats (a heartbeat younger than ``lease`` and not ended): a second copy never steals from a live one."""
    cur.execute(
        """INSERT INTO tidemark_control.sink_fences AS f (consumer, fence, holder) VALUES (%(c)s, 1, %(holder)s)
           ON CONFLICT (consumer) DO UPDATE
              SET fence = f.fence + 1, holder = EXCLUDED.holder, acquired_at = clock_timestamp()
            WHERE %(lease)s::interval IS NULL OR NOT EXISTS (
                  SELECT 1 FROM tidemark_control.stream_heartbeats h
                   WHERE h.pipeline = %(p)s AND h.fence = f.fence AND h.ended_at IS NULL
                     AND h.heartbeat_at > clock_timestamp() - %(lease)s::interval)
           RETURNING fence""",
        {"c": consumer_for(pipeline), "holder": holder, "p": pipeline, "lease": lease},
    )
    row = cur.fetchone()
    if row is None:
        live = heartbeat(cur, pipeline) or {}
        raise LeaseHeld(
            f"pipeline {pipeline}: the sink's lease is held by {live.get('holder')} (fence {live.get('fence')}, "
            f"last heartbeat {live.get('heartbeat_at')}); a second copy does not start. Next: stop that instance "
            "(desired state 'stopped'), or wait for its lease to expire if it is dead")
    return row[0]


def end_lease(cur, pipeline: str, fence: int) -> bool:
    """The instance holding ``fence`` has ended (it stopped, or the supervisor saw its process gone):
    its lease is free at once instead of after its expiry."""
    cur.execute("""UPDATE tidemark_control.stream_heartbeats SET ended_at = clock_timestamp()
                    WHERE pipeline = %s AND fence = %s AND ended_at IS NULL""", (pipeline, fence))
    return cur.rowcount == 1


def current_fence(cur, consumer: str) -> int | None:
    """The latest token, locked until the transaction ends (so no takeover lands mid-commit)."""
    cur.execute("SELECT fence FROM tidemark_control.sink_fences WHERE consumer = %s FOR UPDATE", (consumer,))
    row = cur.fetchone()
    return row[0] if row else None


def stored_offsets(cur, consumer: str, topic: str) -> dict[int, int]:
    cur.execute("SELECT partition, next_offset FROM tidemark_control.sink_offsets WHERE consumer = %s AND topic = %s",
                (consumer, topic))
    return dict(cur.fetchall())


def store_offset(cur, consumer: str, topic: str, partition: int, next_offset: int, fence: int | None) -> None:
    cur.execute(
        """INSERT INTO tidemark_control.sink_offsets (consumer, topic, partition, next_offset, fence)
           VALUES (%s, %s, %s, %s, %s)
           ON CONFLICT (consumer, topic, partition) DO UPDATE
              SET next_offset = EXCLUDED.next_offset, fence = EXCLUDED.fence, updated_at = clock_timestamp()""",
        (consumer, topic, partition, next_offset, fence),
    )


def open_windows(cur, pipeline: str) -> dict[tuple[str, int], Window]:
    """The planned window of each open or sealed attempt of the pipeline whose records travel through the
    topic, by (batch id, attempt): the windows records are checked against (a direct attempt has none there)."""
    cur.execute(
        """SELECT a.batch_id, a.attempt, b.window_lo, b.window_hi, b.backfill, b.handoff, b.reads_above
             FROM tidemark_control.batch_attempts a
             JOIN tidemark_control.batches b USING (batch_id)
            WHERE b.pipeline = %s AND a.state IN ('open', 'sealed') AND b.transport = 'kafka'""",
        (pipeline,),
    )
    return {(b, a): _records_window(lo, hi, bf, handoff, above) for b, a, lo, hi, bf, handoff, above in cur.fetchall()}


def _records_window(lo, hi, backfill: bool, handoff: bool, reads_above: bool) -> Window:
    """Where an attempt's records' cursors must lie (``LedgerBatch.records_window``)."""
    window = Window(Bound.from_json(lo), Bound.from_json(hi), backfill)
    return records_window(window, handoff=handoff, reads_above=reads_above)


def open_formats(cur, pipeline: str) -> dict[tuple[str, int], Format]:
    """The record format of each open or sealed protocol-version-2 attempt whose records travel through
    the topic, by (batch id, attempt): a direct attempt's tasks stage its records themselves."""
    cur.execute(
        """SELECT a.batch_id, a.attempt, b.window_lo, b.window_hi, b.backfill, b.handoff, b.reads_above, s.version, s.columns,
                  s.writer_schema
             FROM tidemark_control.batch_attempts a
             JOIN tidemark_control.batches b USING (batch_id)
             JOIN tidemark_control.record_schemas s ON s.pipeline = b.pipeline AND s.version = b.schema_version
            WHERE b.pipeline = %s AND a.state IN ('open', 'sealed') AND b.transport = 'kafka'""",
        (pipeline,),
    )
    return {(b, a): Format(v, columns_from_json(cols), writer, _records_window(lo, hi, bf, handoff, above))
            for b, a, lo, hi, bf, handoff, above, v, cols, writer in cur.fetchall()}


def add_staged(cur, batch_id: str, attempt: int, partition: int, rows: int, checksum: int) -> None:
    cur.execute(
        """INSERT INTO tidemark_control.staged_totals (batch_id, attempt, partition, rows, checksum)
           VALUES (%s, %s, %s, %s, %s)
           ON CONFLICT (batch_id, attempt, partition) DO UPDATE
              SET rows = staged_totals.rows + EXCLUDED.rows, checksum = staged_totals.checksum + EXCLUDED.checksum""",
        (batch_id, attempt, partition, rows, checksum),
    )


def staged(cur, batch_id: str, attempt: int) -> dict[int, tuple[int, int]]:
    cur.execute("SELECT partition, rows, checksum FROM tidemark_control.staged_totals WHERE batch_id = %s "
                "AND attempt = %s", (batch_id, attempt))
    return {p: (rows, int(checksum)) for p, rows, checksum in cur.fetchall()}


def forget_staged(cur, batch_id: str, attempt: int) -> None:
    cur.execute("DELETE FROM tidemark_control.staged_totals WHERE batch_id = %s AND attempt = %s", (batch_id, attempt))
    cur.execute("DELETE FROM tidemark_control.staged_loads WHERE batch_id = %s AND attempt = %s", (batch_id, attempt))


def add_loads(cur, batch_id: str, attempt: int, loads: list[int]) -> None:
    """Accept loads the executors staged (``tidemark.batch.stage``): only their rows are applied."""
    cur.execute("INSERT INTO tidemark_control.staged_loads (batch_id, attempt, load) "
                "SELECT %s, %s, unnest(%s::bigint[])", (batch_id, attempt, loads))


def record_end(cur, batch_id: str, attempt: int, partition: int, totals: PartitionTotals, batch_rows: int | None,
               kafka_offset: int) -> tuple[int, int] | None:
    """Store an END's totals; if this partition's END was stored before, return its (rows, checksum)."""
    cur.execute(
        """INSERT INTO tidemark_control.batch_ends
               (batch_id, attempt, partition, rows, checksum, kafka_offset, batch_rows)
           VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING""",
        (batch_id, attempt, partition, totals.rows, totals.checksum, kafka_offset, batch_rows),
    )
    if cur.rowcount == 1:
        return None
    cur.execute("SELECT rows, checksum FROM tidemark_control.batch_ends WHERE batch_id = %s AND attempt = %s "
                "AND partition = %s", (batch_id, attempt, partition))
    rows, checksum = cur.fetchone()
    return rows, int(checksum)


def ends(cur, batch_id: str, attempt: int) -> tuple[dict[int, tuple[int, int]], set[int]]:
    """The ENDs received: (rows, checksum) per partition, and the batch_rows they claim."""
    cur.execute("SELECT partition, rows, checksum, batch_rows FROM tidemark_control.batch_ends "
                "WHERE batch_id = %s AND attempt = %s", (batch_id, attempt))
    found = cur.fetchall()
    return {p: (rows, int(checksum)) for p, rows, checksum, _ in found}, {b for *_, b in found if b is not None}


def micro_batch_committed(cur, consumer: str, fence: int, micro_batch: int) -> bool:
    cur.execute("SELECT 1 FROM tidemark_control.sink_micro_batches WHERE consumer = %s AND fence = %s "
                "AND micro_batch = %s", (consumer, fence, micro_batch))
    return cur.fetchone() is not None


MICRO_BATCHES_KEPT = 1000  # Spark replays only its last micro-batch; a few more rows show recent history


def record_micro_batch(cur, consumer: str, fence: int, micro_batch: int, records: int, events: int,
                       duplicates: int, rejected: int) -> None:
    cur.execute(
        """INSERT INTO tidemark_control.sink_micro_batches
               (consumer, fence, micro_batch, records, events, duplicates, rejected)
           VALUES (%s, %s, %s, %s, %s, %s, %s)""", (consumer, fence, micro_batch, records, events, duplicates, rejected))
    cur.execute("DELETE FROM tidemark_control.sink_micro_batches WHERE consumer = %s AND (fence < %s OR "
                "(fence = %s AND micro_batch < %s))", (consumer, fence, fence, micro_batch - MICRO_BATCHES_KEPT))


def record_rejects(cur, consumer: str, topic: str, rejects: list[dict[str, Any]]) -> None:
    """Rejects of the consumer's micro-batch (each on its own ``topic`` if it names one, else
    ``topic``), pending for the dead-letter topic with their original bytes (``raw``, ``raw_key``).
    Set-based: a flood of bad records costs one statement per thousand, not one per record."""
    from psycopg2.extras import execute_values

    execute_values(
        cur,
        """INSERT INTO tidemark_control.sink_rejects (consumer, topic, partition, kafka_offset, batch_id, attempt,
                                                      reason, payload, control, raw, raw_key, in_dlq) VALUES %s""",
        [(consumer, r.get("topic") or topic, r["partition"], r["offset"], r["batch_id"], r["attempt"], r["reason"],
          r["payload"], r.get("control"), _bytes(r.get("raw")), _bytes(r.get("raw_key")), False) for r in rejects],
        page_size=1000,
    )


def _bytes(value: Any) -> bytes | None:
    import psycopg2

    if value is None:
        return None
    return psycopg2.Binary(value.encode() if isinstance(value, str) else bytes(value))


def pending_rejects(cur, consumer: str, *, limit: int) -> list[dict[str, Any]]:
    """The consumer's oldest ``limit`` rejects not yet in the dead-letter topic."""
    cur.execute(
        """SELECT id, topic, partition, kafka_offset, batch_id, attempt, reason, raw, raw_key, rejected_at
             FROM tidemark_control.sink_rejects WHERE consumer = %s AND NOT in_dlq ORDER BY id LIMIT %s""",
        (consumer, limit))
    names = ("id", "topic", "partition", "kafka_offset", "batch_id", "attempt", "reason", "raw", "raw_key", "rejected_at")
    return [{**dict(zip(names, row)), "raw": _plain(row[7]), "raw_key": _plain(row[8])} for row in cur.fetchall()]


def _plain(value: Any) -> bytes | None:
    return bytes(value) if value is not None else None


def mark_published(cur, offsets: dict[int, int]) -> None:
    """Rejects now in the dead-letter topic, at these offsets: their bytes are there, not kept here."""
    from psycopg2.extras import execute_values

    execute_values(
        cur,
        """UPDATE tidemark_control.sink_rejects s SET in_dlq = true, dlq_offset = v.dlq_offset, raw = NULL,
                  raw_key = NULL
             FROM (VALUES %s) AS v(id, dlq_offset) WHERE s.id = v.id""",
        sorted(offsets.items()), template="(%s::bigint, %s::bigint)", page_size=1000,
    )


def pending_reject_summary(cur, consumer: str) -> tuple[int, Any]:
    """How many of the consumer's rejects are not yet in the dead-letter topic, and when the oldest
    of them was recorded (None: none)."""
    cur.execute("SELECT count(*), min(rejected_at) FROM tidemark_control.sink_rejects "
                "WHERE consumer = %s AND NOT in_dlq", (consumer,))
    count, oldest = cur.fetchone()
    return count, oldest


def data_rejects(cur, consumer: str, batch_id: str, attempt: int, first: int,
                 written: dict[int, tuple[int, int]] | None = None) -> tuple[int, list[str]]:
    """How many data records of the attempt were rejected, and the first reasons (offset order), each
    naming its record: partition, offset and key (its first 60 bytes, non-printable ones escaped).
    ``written``: the offsets the extract wrote ([first, next) per partition); a rejected record
    outside them was not the extract's (a dead letter still, but no reason to refuse the batch)."""
    inside = " OR ".join(f"(partition = {int(p)} AND kafka_offset >= {int(lo)} AND kafka_offset < {int(hi)})"
                         for p, (lo, hi) in written.items()) or "false" if written is not None else "true"
    cur.execute(
        f"""SELECT count(*), (array_agg(format('partition %%s offset %%s key %%s: %%s', partition, kafka_offset,
                                                coalesce(encode(substring(raw_key FROM 1 FOR 60), 'escape'), '(none)'),
                                                reason) ORDER BY partition, kafka_offset))[1:%s]
             FROM tidemark_control.sink_rejects
            WHERE consumer = %s AND batch_id = %s AND attempt = %s AND control IS NULL AND ({inside})""",
        (first, consumer, batch_id, attempt),
    )
    count, reasons = cur.fetchone()
    return count, reasons or []


def advance_watermark(cur, pipeline: str, batch_id: str, window: Window) -> bool:
    """Move the pipeline's watermark to a committed window's end: never for a backfill, never
    backwards (the window is the ledger's planned one, never a message's). Within one cursor value
    (windows capped at a key) it moves only along the chain: from the bound the window started at."""
    if window.backfill:
        return False
    hi = window.hi
    current = committed_watermark(cur, pipeline, lock=True)  # the row stays locked until the commit
    if current is not None:
        if current.kind != hi.kind or hi.cursor < current.cursor:
            return False
        if hi.cursor == current.cursor and (current.pk is None or (hi.pk is not None and window.lo != current)):
            return False
    values = (json.dumps(hi.to_json()), hi.cursor if hi.kind == "timestamp" else None,
              hi.cursor if hi.kind == "id" else None, batch_id, pipeline)
    if current is None:
        cur.execute(
            """INSERT INTO tidemark_control.watermarks (bound, cursor_ts, cursor_id, batch_id, pipeline)
               VALUES (%s, %s, %s, %s, %s) ON CONFLICT (pipeline) DO NOTHING""", values)
    else:
        cur.execute(
            """UPDATE tidemark_control.watermarks SET bound = %s, cursor_ts = %s, cursor_id = %s, batch_id = %s,
                      updated_at = clock_timestamp() WHERE pipeline = %s""", values)
    return cur.rowcount == 1


def forget_pipeline(cur, pipeline: str) -> None:
    """Remove everything the ledger holds for a pipeline (its batches by their ``<pipeline>:`` ids,
    record schemas, watermark, id observations, stream state) and its sink's offsets, fences, rejects and
    change-capture position (the audited deletions and drift stay): for a demo
    that starts afresh, never for a production pipeline (the ledger is its audit trail)."""
    prefix = f"{pipeline}:"
    for table in ("batch_ends", "staged_totals", "staged_loads", "cdc_handoffs", "batch_attempts", "batches"):
        cur.execute(f"DELETE FROM tidemark_control.{table} WHERE starts_with(batch_id, %s)", (prefix,))
    cur.execute("DELETE FROM tidemark_control.record_schemas WHERE pipeline = %s", (pipeline,))
    cur.execute("DELETE FROM tidemark_control.watermarks WHERE pipeline = %s", (pipeline,))
    cur.execute("DELETE FROM tidemark_control.id_observations WHERE pipeline = %s", (pipeline,))
    for table in ("streams", "stream_events", "stream_heartbeats", "cdc_slot_watch"):
        cur.execute(f"DELETE FROM tidemark_control.{table} WHERE pipeline = %s", (pipeline,))
    for table in ("sink_offsets", "sink_fences", "sink_rejects", "sink_micro_batches", "stream_event_times",
                  "cdc_pending", "cdc_transactions", "cdc_positions"):
        cur.execute(f"DELETE FROM tidemark_control.{table} WHERE consumer = %s", (consumer_for(pipeline),))


def forget_capture(cur, consumer: str, group: str | None = None) -> None:
    """Remove a capture's stream position, waiting changes and transactions (and its group's members):
    for a demo that starts afresh, as ``forget_pipeline``."""
    for table in ("cdc_pending", "cdc_transactions", "cdc_positions"):
        cur.execute(f"DELETE FROM tidemark_control.{table} WHERE consumer = %s", (consumer,))
    if group is not None:
        cur.execute("DELETE FROM tidemark_control.capture_groups WHERE name = %s", (group,))


def advance_event_times(cur, consumer: str, topic: str, newest: dict[int, Any]) -> None:
    """Per partition, the newest event time applied so far (never moves back)."""
    for partition, event_time in newest.items():
        cur.execute(
            """INSERT INTO tidemark_control.stream_event_times AS t (consumer, topic, partition, event_time)
               VALUES (%s, %s, %s, %s)
               ON CONFLICT (consumer, topic, partition) DO UPDATE
                  SET event_time = greatest(t.event_time, EXCLUDED.event_time), updated_at = clock_timestamp()""",
            (consumer, topic, partition, event_time))

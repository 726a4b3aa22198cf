"""Change events applied with exactly-once effect, one source transaction at a time.

The standing sink hands each micro-batch's records of the CDC topics to ``ChangeWriter.apply``,
inside the warehouse transaction that also stores their Kafka offsets. A source transaction applies
whole, in commit order: per key its last version (a DELETE as a tombstone with the row it deleted,
audited in ``cdc_deletions``), and the commit position recorded in ``cdc_positions``. A reader of
the serving view never sees part of a source transaction.

The two topics interleave freely, and a micro-batch may end inside a transaction: what has come of
a transaction that is not complete waits, its events in ``tidemark_control.cdc_pending`` and its
END in ``cdc_transactions``. Each micro-batch applies the complete transactions in commit order up
to the first that is not, from its own records plus what waited; the rest wait.

Only the Connect worker's records count: a record whose signature (``tidemark.realtime.cdc.signing``) does
not hold is a dead letter by itself, before it is read.

Exactly once: the offsets commit with the rows; a transaction Debezium delivers again (after a
crash of the worker, at new offsets) ends at or before the position applied and is a no-op. What
cannot be applied exactly goes to the dead-letter topic whole, with the reason, and the next
transaction still applies: a transaction with an event that cannot be read or that the real-time
table refuses, and one whose events did not all arrive while a later one did.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg2.errors
from psycopg2.extras import Json

from tidemark import ledger
from tidemark.protocol.records import payload_text
from tidemark.protocol.spec import PipelineSpec, quote
from tidemark.protocol.window import literal
from tidemark.realtime.cdc.changes import Change, Shape, boundary, change, lsn_text
from tidemark.realtime.cdc.groups import Capture
from tidemark.realtime.cdc.schemas import Schemas
from tidemark.realtime.cdc.signing import Verifier
from tidemark.realtime.cdc.tables import add_columns, realtime_shapes, widen_columns

log = logging.getLogger(__name__)
Reject = Callable[[dict[str, Any], str], None]
HEARTBEAT_SHAPES: dict[str, Shape | None] = {"capture": None, "beat_at": None}  # a group's heartbeat row
TABLE_REFUSED = (psycopg2.DataError, psycopg2.IntegrityError, psycopg2.errors.ProgramLimitExceeded)


class ChangeWriter:
    """The change events of one capture (a pipeline's table, or a capture group's tables: every member's
    change topic, one transaction topic) applied to its members' real-time tables."""

    def __init__(self, capture: Capture, consumer: str, verifier: Verifier):
        self.capture, self.consumer = capture, consumer
        self.spec = capture.lead  # the pipeline whose sink applies them: its name leads each log line
        self.verifier = verifier  # a record the Connect worker did not sign changes nothing
        self.tx_topic = capture.transaction_topic
        self.members = {m.cdc_topic: m for m in capture.members}
        self._shapes: dict[str, dict[str, Shape | None]] = {}  # per change topic
        self.schemas = Schemas()  # each change record's 4 KB schema parsed once per table version

    def rules(self, cur) -> None:
        """At start: every member's real-time table exists (else ``LookupError``). Change events are
        checked here, at the driver, not on the executors: there are no executor rules."""
        for member in self.capture.members:
            self.shapes(cur, member)
        return None

    def shapes(self, cur, spec: PipelineSpec) -> dict[str, Shape | None]:
        if spec.cdc_topic not in self._shapes:
            shapes = realtime_shapes(cur, spec)
            if not shapes:
                raise LookupError(f"pipeline {spec.name}: the real-time table {spec.cdc.target_table} does not exist")
            self._shapes[spec.cdc_topic] = shapes
        return self._shapes[spec.cdc_topic]

    def _add_columns(self, cur, spec: PipelineSpec, added: dict[str, Shape], txid: int) -> None:
        """The source gained columns: the real-time table gets them before the change that carries them.
        ``ValueError`` (the event refused, its transaction a dead letter) where it cannot: a pipeline
        whose batch target never gains columns (protocol version 1, JSON: the serving view would
        lose the value at the next nightly commit), or a column PostgreSQL refuses."""
        if spec.record_format != "avro":
            raise ValueError(f"new column(s) {', '.join(added)} at the source: a pipeline with record_format: json "
                             "never adds columns to its batch target, so they are not added to the real-time table "
                             f"either. Next: add them to {spec.target_table} and {spec.cdc.target_table} by hand "
                             "(or move the pipeline to record_format: avro)")
        _ddl(cur, lambda: add_columns(cur, spec, added),
             f"new column(s) {', '.join(f'{c} {t}' for c, t in added.items())}")
        log.warning("pipeline=%s the source's table %s gained column(s) %s (first carried by source transaction %s): "
                    "added to the real-time table %s and shown by %s before that change applies; the batch target "
                    "gains them with its next batch", spec.name, spec.table,
                    ", ".join(f"{c} {t}" for c, t in added.items()), txid, spec.cdc.target_table, spec.cdc.serving_view)
        self._shapes.pop(spec.cdc_topic, None)

    def _widen_columns(self, cur, spec: PipelineSpec, widened: dict[str, Shape], txid: int) -> None:
        """The source widened columns (``changes.widens``): the real-time table takes the wider types
        before the change that carries them, the serving view made again around it. ``ValueError`` (the
        event refused, its transaction a dead letter) where the warehouse refuses, naming why (another
        view on the table, say)."""
        types = {c: t.ddl() for c, t in widened.items()}
        _ddl(cur, lambda: widen_columns(cur, spec, spec.cdc.target_table, types),
             f"column(s) {', '.join(f'{c} {t}' for c, t in widened.items())} widened at the source,")
        log.warning("pipeline=%s the source's table %s widened column(s) %s (first carried by source transaction %s): "
                    "widened in the real-time table %s before that change applies (%s made again, its grants kept); "
                    "the batch target takes them with its next batch", spec.name, spec.table,
                    ", ".join(f"{c} to {t}" for c, t in widened.items()), txid, spec.cdc.target_table,
                    spec.cdc.serving_view)
        self._shapes.pop(spec.cdc_topic, None)

    # --- one micro-batch ---------------------------------------------------------------------
    def apply(self, cur, records, fence: int, micro_batch: int | None, report, reject: Reject) -> None:
        ends: dict[int, tuple] = {}  # txid -> (consumer, txid, commit lsn, event count)
        arrived: dict[int, dict[int, tuple[dict, Change]]] = {}  # txid -> total_order -> (record, change)
        pending: list[tuple] = []
        for rec in records.to_pylist():
            where = {k: rec.get(k) for k in ("topic", "partition", "offset", "key", "value")}
            forged = self.verifier.why_not(rec["topic"], rec["value"], rec.get("signature"))
            if forged is not None:  # a dead letter alone: the genuine record of its place may still come
                reject(where, f"change record rejected: {forged}")
                continue
            if rec["topic"] == self.tx_topic:
                try:
                    edge = boundary(rec["value"])
                except ValueError as exc:
                    reject(where, f"transaction boundary rejected: {exc}")
                    continue
                if edge.status == "END":
                    ends.setdefault(edge.txid, (self.consumer, edge.txid, edge.commit_lsn, edge.event_count,
                                                Json(edge.collections) if edge.collections is not None else None))
                continue
            member = self.members.get(rec["topic"])
            beat = rec["topic"] == self.capture.heartbeat_topic  # counted in its transaction, written nowhere
            if member is None and not beat:
                reject(where, f"change record rejected: topic {rec['topic']} is not a change topic of "
                              f"{self.capture.describe()}")
                continue
            try:
                shapes = HEARTBEAT_SHAPES if beat else self.shapes(cur, member)
                event = change(rec["value"], shapes, self.schemas.read(rec["value"]))
                if event.added and not beat:  # a column of the heartbeat's own is nothing to add anywhere
                    self._add_columns(cur, member, dict(event.added), event.txid)
                if event.widened and not beat:
                    self._widen_columns(cur, member, dict(event.widened), event.txid)
            except ValueError as exc:
                place = _place(rec["value"])
                if place is None:  # belongs to no transaction we can name: a dead letter now
                    reject(where, f"change event rejected: {exc}")
                else:  # its transaction is dead-lettered whole once complete: never applied in part
                    pending.append((self.consumer, *place, "x", Json({"reason": str(exc)}), None, *_origin(rec),
                                    None))
                continue
            events = arrived.setdefault(event.txid, {})
            if event.order in events:
                report.duplicates += 1  # the same event twice in one micro-batch: a redelivery
            else:
                events[event.order] = (rec, event)
        applied = self._position(cur)
        for txid in self._apply_direct(cur, ends, arrived, {row[1] for row in pending}, applied, fence, micro_batch,
                                       report):
            ends.pop(txid, None)
            arrived.pop(txid, None)
        pending += [(self.consumer, e.txid, e.order, e.lsn, e.op, Json(e.row), e.source_ms, *_origin(rec),
                     e.after_commit) for events in arrived.values() for rec, e in events.values()]
        if pending:  # the same event again, still waiting: a redelivery
            report.duplicates += len(pending) - ledger.park_events(cur, pending)
        if ends:
            ledger.record_transaction_ends(cur, list(ends.values()))
        self._resolve(cur, fence, micro_batch, report, reject)

    def _position(self, cur) -> int:
        """The commit position applied (-1: none yet), locked for this micro-batch."""
        cur.execute("SELECT commit_lsn FROM tidemark_control.cdc_positions WHERE consumer = %s FOR UPDATE",
                    (self.consumer,))
        row = cur.fetchone()
        return row[0] if row else -1

    def _waiting(self, cur, txids: list[int]) -> dict[int, tuple[set[int], bool, int | None, Counter]]:
        """What waits in ``cdc_pending`` of ``txids``: per transaction its events' orders, whether one is
        unreadable, the latest source commit time, and its events per change topic."""
        cur.execute("""SELECT txid, topic, array_agg(total_order), bool_or(op = 'x'), max(source_ms)
                         FROM tidemark_control.cdc_pending WHERE consumer = %s AND txid = ANY(%s)
                        GROUP BY txid, topic""", (self.consumer, txids))
        waiting: dict[int, tuple[set[int], bool, int | None, Counter]] = {}
        for txid, topic, orders, bad, ms in cur.fetchall():
            seen, was_bad, latest, topics = waiting.get(txid, (set(), False, None, Counter()))
            topics[topic] += len(orders)
            waiting[txid] = (seen | set(orders), was_bad or bad, max(filter(None, (latest, ms)), default=None), topics)
        return waiting

    def _overtaken(self, cur, txs: list[tuple], i: int, collections: dict[str, int] | None, topics: Counter) -> bool:
        """Whether the missing events of ``txs[i]`` (incomplete) can no longer come: a later transaction's
        event has arrived on a topic it misses events on (each change topic is in commit order). One topic
        (a pipeline captured alone, or END without per-table counts): a later transaction is complete."""
        _, lsn, count, got, *_ = txs[i]
        if collections is None or not self.capture.grouped:
            return any(tx[3] >= tx[2] for tx in txs[i + 1:])
        captured = self.capture.tables
        missing = [captured[t] for t, n in collections.items() if t in captured and topics[captured[t]] < n]
        cur.execute("""SELECT EXISTS (SELECT 1 FROM tidemark_control.cdc_pending
                                       WHERE consumer = %s AND topic = ANY(%s) AND after_commit >= %s)""",
                    (self.consumer, missing, lsn))
        return cur.fetchone()[0]

    def _uneven(self, collections: dict[str, int] | None, topics: Counter) -> str | None:
        """Why a transaction's events per table differ from its END's count of them (None: they agree, or
        END gave no counts): the capture applies a transaction whole across its tables or not at all."""
        if collections is None:
            return None
        captured = self.capture.tables
        for table, expected in sorted(collections.items()):
            if table not in captured:
                return (f"END counts {expected} change event(s) of {table}, a table {self.capture.describe()} does "
                        "not capture")
            if topics[captured[table]] != expected:
                return f"{topics[captured[table]]} change event(s) of {table} arrived, END counts {expected}"
        return None

    def _apply_direct(self, cur, ends: dict[int, tuple], arrived: dict[int, dict[int, tuple[dict, Change]]],
                      spoiled: set[int], applied: int, fence: int, micro_batch: int | None, report) -> list[int]:
        """The transactions whose END has come (in this micro-batch or waiting from one before) and whose
        events have all come (in this one, or the rest of them in this one), all readable: in commit
        order up to the first that is not complete, applied without this micro-batch's events waiting
        in ``cdc_pending``. Their txids (redelivered ones too); or none, and then they wait like the
        rest (where the table refuses them: the waiting path finds which one and dead-letters only it)."""
        cur.execute("SELECT consumer, txid, commit_lsn, event_count, collections "
                    "FROM tidemark_control.cdc_transactions WHERE consumer = %s", (self.consumer,))
        stored = {row[1]: row for row in cur.fetchall()}  # ENDs that came before all their events did
        candidates = {**ends, **stored}
        if not candidates:
            return []
        waiting = self._waiting(cur, list(candidates))
        whole, again, changes, duplicates, times = [], [], [], 0, []
        for _, txid, lsn, count, collections in sorted(candidates.values(), key=lambda end: end[2]):
            events = arrived.get(txid, {})
            earlier, bad, ms, topics = waiting.get(txid, (set(), False, None, Counter()))
            fresh = {order: (rec, e) for order, (rec, e) in events.items() if order not in earlier}
            if txid in spoiled or bad or len(earlier) + len(fresh) != count:
                break
            if lsn <= applied:  # delivered again after the position moved past it
                again.append(txid)
                duplicates += len(events) + len(earlier)
                continue
            if self._uneven(_plain(collections), topics + Counter(rec["topic"] for rec, _ in fresh.values())):
                break  # the waiting path dead-letters it whole, with the reason
            whole.append((txid, lsn, count))
            duplicates += len(events) - len(fresh)  # an event again while its first copy waits
            changes += [(txid, lsn, e.order, e.op, e.row, rec["topic"]) for rec, e in fresh.values()]
            times += [ms, *(e.source_ms for _, e in fresh.values())]
        if whole and self._apply_transactions(cur, whole, fence, micro_batch, changes) is not None:
            return []  # refused: they wait, and the waiting path applies them one at a time
        if again:
            log.info("pipeline=%s %s redelivered change(s) of source transactions already applied (position %s) "
                     "skipped", self.spec.name, sum(len(arrived.get(t, {})) for t in again), lsn_text(applied))
        done = [txid for txid, *_ in whole] + again
        if done:
            self._resolved(cur, done)
            report.duplicates += duplicates
            report.events += sum(count for *_, count in whole)
            for table, kept in (("cdc_pending", waiting), ("cdc_transactions", stored)):
                ledger.forget_waiting(cur, self.consumer, [t for t in done if t in kept], (table,))
        if whole:
            last_txid, last_lsn, _ = whole[-1]
            self._move_position(cur, last_lsn, last_txid, max((t for t in times if t is not None), default=None))
        return done

    def _move_position(self, cur, lsn: int, txid: int, source_ms: int | None) -> None:
        ledger.move_position(cur, self.consumer, lsn, txid, source_ms)

    def _resolve(self, cur, fence: int, micro_batch: int | None, report, reject: Reject) -> None:
        """Apply every waiting transaction that is complete, in commit order, up to the first that is not."""
        applied = self._position(cur)
        self._drop_passed(cur, applied, report, reject)
        cur.execute("""SELECT t.txid, t.commit_lsn, t.event_count, count(p.txid), count(p.txid) FILTER (WHERE p.op = 'x'),
                              t.collections
                         FROM tidemark_control.cdc_transactions t
                         LEFT JOIN tidemark_control.cdc_pending p ON p.consumer = t.consumer AND p.txid = t.txid
                        WHERE t.consumer = %s GROUP BY 1, 2, 3, 6 ORDER BY t.commit_lsn""", (self.consumer,))
        txs = cur.fetchall()
        waiting = self._waiting(cur, [tx[0] for tx in txs]) if any(tx[5] for tx in txs) else {}  # per topic
        ready: list[tuple[int, int, int]] = []  # (txid, commit lsn, changes): to apply, in commit order
        resolved: list[int] = []  # applied, dead-lettered or redelivered: they wait no longer
        again = 0
        for i, (txid, lsn, count, got, bad, collections) in enumerate(txs):
            uneven = None
            if lsn <= applied:  # delivered again after the position moved past it
                again += got
            elif got < count and not self._overtaken(cur, txs, i, _plain(collections),
                                                     waiting.get(txid, (0, 0, 0, Counter()))[3]):
                break  # the rest may still come; transactions apply in commit order
            elif got != count or bad or (uneven := self._uneven(_plain(collections),
                                                                 waiting.get(txid, (0, 0, 0, Counter()))[3])):
                why = (f"only {got} of its {count} change events arrived before a later transaction's did"
                       if got < count else f"{bad} of its change events cannot be applied" if bad else
                       f"{got} change events arrived for an END that counts {count}" if got != count else uneven)
                self._dead_letter(cur, txid, f"{self._tag(txid, lsn, count)} not applied: {why}", reject)
            else:
                ready.append((txid, lsn, got))
            resolved.append(txid)
        if again:
            report.duplicates += again
            log.info("pipeline=%s %s redelivered change(s) of source transactions already applied (position %s) "
                     "skipped", self.spec.name, again, lsn_text(applied))
        self._apply_ready(cur, ready, fence, micro_batch, report, reject)
        last_txid, last_lsn, *_ = txs[len(resolved) - 1] if resolved else (None, applied)
        if last_lsn > applied:  # past every resolved transaction, applied or dead-lettered: never twice
            cur.execute("SELECT max(source_ms) FROM tidemark_control.cdc_pending WHERE consumer = %s AND txid = ANY(%s)",
                        (self.consumer, resolved))
            self._move_position(cur, last_lsn, last_txid, cur.fetchone()[0])
        if resolved:
            self._resolved(cur, resolved)
            ledger.forget_waiting(cur, self.consumer, resolved)
        self._bound_pending(cur, reject)

    def _bound_pending(self, cur, reject: Reject) -> None:
        """``cdc_pending`` never grows without bound: past the lead's ``cdc.max_pending_events``, the oldest
        waiting transactions (in the log's order) go to the dead-letter topic whole, each event with the
        reason, until what waits is within the bound; the transactions after them go on."""
        limit = self.spec.cdc.max_pending_events
        cur.execute("SELECT txid, count(*) FROM tidemark_control.cdc_pending WHERE consumer = %s GROUP BY txid "
                    "ORDER BY min(lsn), txid", (self.consumer,))
        waiting = cur.fetchall()
        over = sum(n for _, n in waiting) - limit
        if over <= 0:
            return
        total, dropped = over + limit, []
        for txid, n in waiting:
            if over <= 0:
                break
            dropped.append(txid)
            over -= n
        for txid in dropped:
            self._dead_letter(cur, txid, f"pipeline={self.spec.name} source transaction {txid} not applied: {total} "
                              f"change events waited in tidemark_control.cdc_pending, past cdc.max_pending_events "
                              f"{limit} (its END or the rest of its events did not come); the oldest waiting "
                              "transactions go to the dead-letter topic whole so that the stream goes on", reject)
        ledger.forget_waiting(cur, self.consumer, dropped)
        self._resolved(cur, dropped)
        log.error("pipeline=%s %s change events waited, past cdc.max_pending_events %s: %s oldest waiting source "
                  "transaction(s) %s dead-lettered whole. Next: find why their END or events did not come (the "
                  "transaction topic %s behind or lost?)", self.spec.name, total, limit, len(dropped),
                  _span(dropped), self.tx_topic)

    def _resolved(self, cur, txids: list[int]) -> None:
        """Remember for an hour the transactions that wait no longer (``_drop_passed`` tells a redelivery by them)."""
        ledger.mark_resolved(cur, self.consumer, txids)

    def _drop_passed(self, cur, applied: int, report, reject: Reject) -> None:
        """Changes waiting with no END whose place the stream has passed (the applied position is past the
        commit streamed before them, ``changes.after_commit``): never waiting for ever. Of a transaction
        resolved within the hour, a genuine record produced again: dropped, counted as duplicates. Of any
        other, its END never came (lost, or refused as forged) while later transactions applied: dead
        letters, with the reason, never counted as duplicates."""
        cur.execute("""SELECT DISTINCT p.txid, EXISTS (SELECT 1 FROM tidemark_control.cdc_resolved r
                                                         WHERE r.consumer = p.consumer AND r.txid = p.txid)
                         FROM tidemark_control.cdc_pending p
                        WHERE p.consumer = %(c)s AND p.after_commit < %(applied)s
                          AND NOT EXISTS (SELECT 1 FROM tidemark_control.cdc_transactions t
                                           WHERE t.consumer = p.consumer AND t.txid = p.txid)""",
                    {"c": self.consumer, "applied": applied})
        passed = cur.fetchall()
        for txid in sorted(t for t, known in passed if not known):
            self._dead_letter(cur, txid, f"pipeline={self.spec.name} source transaction {txid} not applied: the stream "
                              f"applied later transactions (up to {lsn_text(applied)}) and its END never arrived (lost, "
                              "or refused as a dead letter itself): its change events cannot be known to be all of it",
                              reject)
        if passed:
            again = ledger.drop_passed_events(cur, self.consumer, [t for t, _ in passed])
            report.duplicates += again
            if again:
                log.info("pipeline=%s %s change(s) of source transaction(s) %s arrived again alone, after the position "
                         "applied (%s) had passed them: redeliveries, dropped and counted as duplicates",
                         self.spec.name, again, _span(sorted(t for t, known in passed if known)), lsn_text(applied))
            self._resolved(cur, [t for t, _ in passed])

    def _tag(self, txid: int, lsn: int, count: int) -> str:
        return f"pipeline={self.spec.name} source transaction {txid} (commit {lsn_text(lsn)}, {count} change(s))"

    def _apply_ready(self, cur, ready: list[tuple[int, int, int]], fence: int, micro_batch: int | None, report,
                     reject: Reject) -> None:
        """All complete transactions in one statement (per key the last version across them); where
        the real-time table refuses that, one transaction at a time, so only the refused one is a
        dead letter. Either way they commit together with the offsets: never part of one."""
        if not ready:
            return
        refused = self._apply_transactions(cur, ready, fence, micro_batch)
        if refused is None:
            report.events += sum(got for *_, got in ready)
            return
        log.warning("pipeline=%s %s source transaction(s) refused together (%s): applied one at a time to find which",
                    self.spec.name, len(ready), refused)
        for tx in ready:
            refused = self._apply_transactions(cur, [tx], fence, micro_batch)
            if refused is None:
                report.events += tx[2]
            else:
                tables = ", ".join(m.cdc.target_table for m in self.capture.members)
                self._dead_letter(cur, tx[0], f"{self._tag(*tx)} not applied: the real-time table"
                                  f"{'s' if len(self.capture.members) > 1 else ''} {tables} refused it: {refused}",
                                  reject)

    def _apply_transactions(self, cur, txs: list[tuple[int, int, int]], fence: int, micro_batch: int | None,
                            changes: list[tuple] | None = None) -> str | None:
        """Write complete transactions ``(txid, commit lsn, changes)`` to every member's real-time table in
        one savepoint: per key its last version. Their changes as they wait in ``cdc_pending``, and
        ``changes`` ``(txid, commit lsn, total_order, op, row, topic)`` besides. None, or PostgreSQL's
        refusal (then nothing of them is written, in any table)."""
        params = {"txids": [t for t, *_ in txs], "lsns": [lsn for _, lsn, _ in txs], "fence": fence,
                  "mb": micro_batch, "consumer": self.consumer}
        source = """SELECT p.txid, x.commit_lsn, p.total_order, p.op, p.row_values, p.topic
                      FROM tidemark_control.cdc_pending p
                      JOIN unnest(%(txids)s::bigint[], %(lsns)s::bigint[]) AS x(txid, commit_lsn) ON x.txid = p.txid
                     WHERE p.consumer = %(consumer)s"""
        if changes is not None:  # one parameter, however many: a JSON array of [txid, commit lsn, order, op, row, topic]
            params["changes"] = Json(changes)
            source += """ UNION ALL
                    SELECT (c ->> 0)::bigint, (c ->> 1)::bigint, (c ->> 2)::integer, c ->> 3, c -> 4, c ->> 5
                      FROM jsonb_array_elements(%(changes)s::jsonb) c"""
        cur.execute("SAVEPOINT cdc_transaction")
        try:
            for member in self.capture.members:
                self._write_member(cur, member, source, params, txs)
        except TABLE_REFUSED as exc:
            cur.execute("ROLLBACK TO SAVEPOINT cdc_transaction")
            return " ".join(str(exc).split())
        cur.execute("RELEASE SAVEPOINT cdc_transaction")
        return None

    def _write_member(self, cur, spec: PipelineSpec, source: str, params: dict[str, Any],
                      txs: list[tuple[int, int, int]]) -> None:
        """One member's part of the transactions: its changes upserted, its deletions audited."""
        table, names, pk = quote(spec.cdc.target_table), list(self.shapes(cur, spec)), [quote(c) for c in spec.primary_key]
        cols = ", ".join(quote(c) for c in names)
        sets = ", ".join(f"{c} = EXCLUDED.{c}" for c in (*map(quote, names), "_tm_txid", "_tm_lsn", "_tm_deleted",
                                                          "_tm_fence", "_tm_micro_batch"))
        params = {**params, "topic": spec.cdc_topic, "pipeline": spec.name}
        mine = f"SELECT * FROM ({source}) s WHERE s.topic = %(topic)s"
        cur.execute(
            f"""INSERT INTO {table} ({cols}, _tm_txid, _tm_lsn, _tm_deleted, _tm_fence, _tm_micro_batch)
                SELECT DISTINCT ON ({', '.join(f'r.{c}' for c in pk)})
                       {', '.join(f'r.{quote(c)}' for c in names)}, p.txid, p.commit_lsn, p.op = 'd',
                       %(fence)s, %(mb)s
                  FROM ({mine}) p
                 CROSS JOIN LATERAL jsonb_populate_record(NULL::{table}, p.row_values) r
                 ORDER BY {', '.join(f'r.{c}' for c in pk)}, p.commit_lsn DESC, p.total_order DESC
                ON CONFLICT ({', '.join(pk)}) DO UPDATE SET {sets}, _tm_applied_at = clock_timestamp()
                 WHERE {table}._tm_lsn < EXCLUDED._tm_lsn""", params)
        key = ", ".join(f"p.row_values ->> {literal(c)}" for c in spec.primary_key)
        if deleted := ledger.record_change_deletions(cur, spec.name, key, mine, params):
            log.warning("pipeline=%s source transaction(s) %s (commits %s..%s) deleted %s key(s) at the source: "
                        "hidden from %s, each kept with its old values in tidemark_control.cdc_deletions",
                        spec.name, _span(params["txids"]), lsn_text(txs[0][1]), lsn_text(txs[-1][1]),
                        deleted, spec.cdc.serving_view)

    def _dead_letter(self, cur, txid: int, reason: str, reject: Reject) -> None:
        cur.execute("""SELECT topic, partition, "offset", record_key, raw, op, row_values ->> 'reason'
                         FROM tidemark_control.cdc_pending WHERE consumer = %s AND txid = %s ORDER BY total_order""",
                    (self.consumer, txid))
        for topic, partition, offset, key, raw, op, why in cur.fetchall():
            reject({"topic": topic, "partition": partition, "offset": offset, "key": key, "value": raw},
                   f"{reason}{f' (this event: {why})' if op == 'x' else ''}")


def _ddl(cur, change: Callable[[], None], what: str) -> None:
    """``change`` to the real-time table in a savepoint of the micro-batch's transaction; ``ValueError``
    (the event refused, its transaction a dead letter) naming ``what`` when the warehouse refuses it."""
    cur.execute("SAVEPOINT cdc_ddl")
    try:
        change()
    except psycopg2.Error as exc:
        cur.execute("ROLLBACK TO SAVEPOINT cdc_ddl")
        raise ValueError(f"{what} refused by the warehouse: {' '.join(str(exc).split())}") from None
    cur.execute("RELEASE SAVEPOINT cdc_ddl")


def _plain(collections: Any) -> dict[str, int] | None:
    """END's per-table counts, as stored (``Json``) or read back (a dict)."""
    return getattr(collections, "adapted", collections)


def _span(txids: list[int]) -> str:
    return str(txids[0]) if len(txids) == 1 else f"{txids[0]}..{txids[-1]} ({len(txids)})"


def _origin(rec: dict[str, Any]) -> tuple:
    """Where a waiting change came from, and the record itself, for a dead letter."""
    return (rec["topic"], rec["partition"], rec["offset"], payload_text(rec.get("key"), None),
            payload_text(rec["value"], None))


def _place(value: Any) -> tuple[int, int, int] | None:
    """(txid, total_order, lsn) of an event otherwise unreadable, when those at least can be read."""
    try:
        payload = json.loads(value)["payload"]
        txid, order = int(payload["source"]["txId"]), int(payload["transaction"]["total_order"])
        return txid, order, int(payload["source"].get("lsn") or 0)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None

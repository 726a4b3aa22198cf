"""``BatchSink``: one micro-batch in one PostgreSQL transaction (the steps: ``tidemark.sink``), from
the fence check to the stored offsets. What it delegates: the stage tables (``stages``), what the
ledger says of a control message (``controls``), the totals check (``tidemark.totals``), and the
SQL that writes a verified batch (``merge``)."""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any

import psycopg2
import psycopg2.errors

from tidemark import faults, ledger
from tidemark.avro import Format, row_column, sql_type
from tidemark.control import ControlMessage, Keyring, ProtocolError, decode
from tidemark.dead_letters import DeadLetterOutbox
from tidemark.cdc.apply import ChangeWriter
from tidemark.events import EventWriter
from tidemark.progress import Steps
from tidemark.records import Checker, RecordRules, checked_upstream, target_columns
from tidemark.repair import RepairError
from tidemark.sink import controls, merge
from tidemark.sink.report import (
    FIRST_REASONS, FencedError, MicroBatchReport, SinkError, extents, loaded, payload_text, positions,
)
from tidemark.sink.stages import StageArea
from tidemark.spec import PipelineSpec, quote
from tidemark.stage import HASH, OFFSET, PARTITION, StageWriter, Target
from tidemark.totals import staged_mismatch

log = logging.getLogger("tidemark.sink")


class BatchSink:
    def __init__(self, conn, spec: PipelineSpec, *, keyring: Keyring,
                 dead_letters: DeadLetterOutbox | None = None):
        self.conn = conn  # psycopg2 connection owned by the caller
        self.spec = spec
        self.keyring = keyring  # a control message counts only when one of its keys signed it
        self.topic = spec.topic
        self.topics = [spec.topic, *spec.realtime_topics]
        # One consumer per pipeline per warehouse database: a second sink of the pipeline in this
        # database is the same consumer, takes the fence, and the first can no longer commit.
        self.consumer = ledger.consumer_for(spec.name)
        self.dead_letters = dead_letters  # publishes the committed rejects, after each commit and at start
        self.fence: int | None = None
        self._rules: RecordRules | None = None
        self.stages = StageArea(spec)
        # the real-time input: an application's events, or the source table's own changes
        self.events = (EventWriter(spec, self.consumer) if spec.stream else
                       ChangeWriter(spec, self.consumer) if spec.cdc else None)

    # --- start-up --------------------------------------------------------------------------
    def acquire_fence(self, lease: Any = None) -> int:
        """Take the next fencing token; any older instance fails on its next commit. With ``lease``,
        ``ledger.LeaseHeld`` while a live standing sink of the pipeline holds it."""
        holder = f"{socket.gethostname()}:{os.getpid()}"
        with self.conn, self.conn.cursor() as cur:
            self.fence = ledger.acquire_fence(cur, self.spec.name, holder, lease)
        log.info("sink %s: took fencing token %s for topic %s", self.consumer, self.fence, self.topic)
        return self.fence

    def sweep_stages(self) -> list[str]:
        """Drop the stage tables of this pipeline's attempts that can no longer be applied (``StageArea.sweep``)."""
        with self.conn, self.conn.cursor() as cur:
            return self.stages.sweep(cur)

    def starting_offsets(self) -> dict[str, dict[int, int]]:
        """Per topic read (the pipeline's, and its stream's), the next offset per partition as
        committed with the data (-2 = earliest: never read)."""
        counts = {self.spec.topic: self.spec.partitions, **self.spec.realtime_topics}
        with self.conn, self.conn.cursor() as cur:
            stored = {t: ledger.stored_offsets(cur, self.consumer, t) for t in counts}
        return {t: {p: stored[t].get(p, -2) for p in range(n)} for t, n in counts.items()}

    def committed_offsets(self) -> dict[int | str, int]:
        """The next offsets committed: by partition on the pipeline's topic, ``<topic>/<partition>``
        on its stream's (the keys the lag uses too)."""
        return {(p if t == self.topic else f"{t}/{p}"): o
                for t, parts in self.starting_offsets().items() for p, o in parts.items()}

    # --- one micro-batch ---------------------------------------------------------------------
    def apply(self, table, micro_batch: int | None = None, steps: Steps | None = None,
              loads=None, started: float | None = None) -> MicroBatchReport:
        """Apply one micro-batch (a pyarrow table with topic, partition, offset, key, value, control,
        batch_id, attempt, row_hash; without topic: all from the pipeline's topic) in one
        transaction. ``micro_batch``: Spark's id for it, recorded under the fencing token.
        ``steps``: the caller's timings so far (the Spark read), continued in the log line.
        ``loads``: what the executors staged of it (``stager``), one row per load and partition.
        ``started``: when the caller began the micro-batch (``time.monotonic()``), for the log line."""
        import pyarrow as pa

        report = MicroBatchReport(steps=steps or Steps())
        staged_upstream = loaded(loads)
        if table.num_rows == 0 and not staged_upstream:
            return report
        started = time.monotonic() if started is None else started
        if "topic" not in table.column_names:
            table = table.append_column("topic", pa.array([self.topic] * table.num_rows, pa.string()))
        with report.steps.step("sort"):
            table = table.sort_by([("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")])
        try:
            with self.conn:
                with self.conn.cursor() as cur:
                    control_count = self._apply(cur, table, report, micro_batch, loads)
                committing = time.perf_counter()
            report.steps.seconds["commit"] = time.perf_counter() - committing
            faults.point("committed")
        except (FencedError, SinkError):
            raise
        except Exception as exc:  # name where it happened: the next start resumes at the same offsets
            raise SinkError(
                f"pipeline={self.spec.name} micro-batch {positions(table, loads)} failed and was rolled back "
                f"({type(exc).__name__}: {' '.join(str(exc).split())[:2000]}); the sink resumes from the same offsets "
                "when restarted. Next: if this repeats at the same offsets, see the error above"
            ) from exc
        try:
            if report.rejects and self.dead_letters is not None:
                self.dead_letters.flush(self.conn)
        except Exception as exc:  # committed: the rejects stay pending in sink_rejects, none is lost
            raise SinkError(f"pipeline={self.spec.name} micro-batch {positions(table, loads)} committed, but its dead "
                            f"letters were not published ({type(exc).__name__}: {' '.join(str(exc).split())[:500]}). "
                            "Next: when the broker is back, restarting the sink publishes them") from exc
        events = (f"events applied {report.events}, duplicate {report.duplicates}, superseded {report.superseded}, "
                  if self.events is not None else "")
        log.info("pipeline=%s micro-batch %s of %s records (%s control, %s replayed): %sstaged %s, discarded %s, "
                 "rejected %s, committed %s, refused %s in %.1f s (%s)", self.spec.name,
                 micro_batch if micro_batch is not None else "-", table.num_rows + staged_upstream, control_count,
                 report.replayed, events,
                 report.staged, report.discarded, report.rejected, report.committed or "-", report.refused or "-",
                 time.monotonic() - started, report.steps)
        return report

    def _apply(self, cur, table, report: MicroBatchReport, micro_batch: int | None, loads) -> int:
        import pyarrow.compute as pc

        self._check_fence(cur)
        if micro_batch is not None and ledger.micro_batch_committed(cur, self.consumer, self.fence, micro_batch):
            report.replayed = table.num_rows + loaded(loads)  # the executors' loads stay unaccepted
            log.warning("pipeline=%s micro-batch %s under fence %s was already committed: replay skipped",
                        self.spec.name, micro_batch, self.fence)
            return 0
        fresh = self._unapplied(cur, table)
        report.replayed = table.num_rows - fresh.num_rows
        ours = pc.equal(fresh["topic"], self.topic)
        events = fresh.filter(pc.invert(ours))
        table = fresh.filter(ours)
        is_control = pc.is_valid(table["control"])
        control_records = table.filter(is_control).to_pylist()
        data = table.filter(pc.invert(is_control))
        ends: list[tuple[dict[str, Any], ControlMessage]] = []
        for rec in control_records:
            msg = self._decode(cur, rec, report)
            if msg is None:
                continue
            if msg.kind == "BEGIN":
                self._begin(cur, rec, msg, report)
            elif msg.kind == "ABORT":
                why = controls.unplanned(cur, self.spec, msg)
                if why is None:
                    self._abort(cur, msg)
                else:
                    self._reject(report, rec, f"{why}: ABORT rejected", msg)
            else:
                ends.append((rec, msg))
        if data.num_rows:
            self._stage(cur, data, report)
        if loaded(loads):
            self._accept_loads(cur, loads, report)
        if data.num_rows or loaded(loads):
            faults.point("staged")
        if events.num_rows:  # before any batch commits: its compaction covers these too
            with report.steps.step("events"):
                self.events.apply(cur, events, self.fence, micro_batch, report,
                                  lambda rec, reason: self._reject(report, rec, reason))
        self._record_rejects(cur, report)  # before verifying: an attempt with dead letters is refused
        complete: list[tuple[str, int]] = []
        for rec, msg in ends:
            if self._end(cur, rec, msg, report) and (msg.batch_id, msg.attempt) not in complete:
                complete.append((msg.batch_id, msg.attempt))
        for batch_id, attempt in complete:
            with report.steps.step("apply"):
                self._verify_and_apply(cur, batch_id, attempt, report)
        self._record_rejects(cur, report)
        self._store_offsets(cur, fresh, loads)
        if micro_batch is not None:
            ledger.record_micro_batch(cur, self.consumer, self.fence, micro_batch, fresh.num_rows + loaded(loads),
                                      report.events,
                                      report.duplicates, report.rejected)
        faults.point("before_commit")
        return len(control_records)

    def _unapplied(self, cur, table):
        """The records at or after the offsets stored for their topic and partition."""
        import pyarrow.compute as pc

        seen = None
        for topic in self.topics:
            for p, next_offset in ledger.stored_offsets(cur, self.consumer, topic).items():
                old = pc.and_(pc.and_(pc.equal(table["topic"], topic), pc.equal(table["partition"], p)),
                              pc.less(table["offset"], next_offset))
                seen = old if seen is None else pc.or_(seen, old)
        return table if seen is None else table.filter(pc.invert(seen))

    def check_stream(self) -> None:
        """At start: the stream's real-time table can take its events (else ``LookupError``)."""
        if self.events is not None:
            with self.conn, self.conn.cursor() as cur:
                self.events.rules(cur)

    def _check_fence(self, cur) -> None:
        now = ledger.current_fence(cur, self.consumer)
        if self.fence is None or now != self.fence:
            raise FencedError(
                f"sink {self.consumer}: fencing token {self.fence} is no longer current "
                f"(now {now}); another instance took over, stopping without commit"
            )

    def _reject(self, report: MicroBatchReport, rec: dict[str, Any], reason: str,
                msg: ControlMessage | None = None) -> None:
        report.rejected += 1
        batch_id = msg.batch_id if msg else rec.get("batch_id")
        attempt = msg.attempt if msg else _int_or_none(rec.get("attempt"))
        report.rejects.append({
            "topic": rec.get("topic") or self.topic,
            "partition": rec["partition"], "offset": rec["offset"], "batch_id": batch_id, "attempt": attempt,
            "reason": reason, "payload": rec.get("value"), "key": rec.get("key"), "control": rec.get("control"),
        })
        if report.rejected <= 20 or report.rejected % 1000 == 0:  # a flood of bad records: a sample and counts
            log.error("pipeline=%s batch=%s attempt=%s %s/%s@%s DEAD LETTER (%s so far in this micro-batch): %s",
                      self.spec.name, batch_id, attempt, rec.get("topic") or self.topic, rec["partition"],
                      rec["offset"], report.rejected, reason)

    def _decode(self, cur, rec: dict[str, Any], report: MicroBatchReport) -> ControlMessage | None:
        try:
            msg = decode(rec["value"])
        except ProtocolError as exc:
            self._reject(report, rec, f"{rec['control']} message rejected: {exc}")
            return None
        unsigned = self.keyring.verify(msg)
        if unsigned is not None:
            self._reject(report, rec, f"{msg.describe()} rejected: {unsigned}", msg)
            return None
        if msg.kind != rec["control"] or msg.partition != rec["partition"] or msg.pipeline != self.spec.name:
            self._reject(
                report, rec,
                f"{msg.kind} for batch {msg.batch_id} rejected: header {rec['control']}, pipeline {msg.pipeline}, "
                f"partition field {msg.partition} do not match this topic's pipeline {self.spec.name} / partition",
            )
            return None
        if msg.partitions != self.spec.partitions:
            self._reject(report, rec, f"{msg.describe()} rejected: {msg.partitions} partitions, topic has {self.spec.partitions}")
            return None
        if msg.parsed_window.lo.kind != self.spec.cursor.kind:
            self._reject(report, rec, f"{msg.describe()} rejected: its window {msg.parsed_window} has {msg.parsed_window.lo.kind} "
                         f"cursors, pipeline {self.spec.name} has a {self.spec.cursor.kind} cursor", msg)
            return None
        return msg


    def _begin(self, cur, rec: dict[str, Any], msg: ControlMessage, report: MicroBatchReport) -> None:
        """A BEGIN changes nothing in the ledger: the orchestrator opened the attempt (and superseded
        older ones) before sending it. It is checked against the plan, and frees older stages."""
        why = controls.unplanned(cur, self.spec, msg)
        if why is not None:
            self._reject(report, rec, f"{why}: BEGIN rejected, nothing of it is staged", msg)
            return
        state = ledger.attempt_state(cur, msg.batch_id, msg.attempt)
        if state == "committed":
            self._reject(report, rec, controls.replayed(cur, msg), msg)
            return
        if state not in ("open", "sealed"):
            log.info("pipeline=%s batch=%s attempt=%s p%s BEGIN of a%s attempt (late or replayed): no-op",
                     msg.pipeline, msg.batch_id, msg.attempt, msg.partition, f" {state}" if state else "n unrecorded")
            return
        for older in range(1, msg.attempt):
            self.stages.drop(cur, msg.batch_id, older)

    def _abort(self, cur, msg: ControlMessage) -> None:
        ledger.lock_batch(cur, msg.batch_id)
        aborted_now = ledger.transition(cur, msg.batch_id, msg.attempt, "aborted",
                                        message=f"aborted by producer: {msg.reason or 'no reason given'}")
        self.stages.drop(cur, msg.batch_id, msg.attempt)  # also when the orchestrator marked it aborted first
        if aborted_now:
            log.warning("pipeline=%s batch=%s attempt=%s ABORT received (%s): staged records discarded",
                        msg.pipeline, msg.batch_id, msg.attempt, msg.reason)

    def _stage(self, cur, data, report: MicroBatchReport) -> None:
        """Validate and COPY the records of open attempts into their stage tables, adding to their
        running totals; discard those of superseded, aborted or refused attempts; dead-letter the
        bad ones, those of unknown batches and late ones of committed batches."""
        import pyarrow.compute as pc

        attempts = data.group_by(["batch_id", "attempt"]).aggregate([]).to_pylist()
        columns = ["partition", "offset", "batch_id", "attempt", "key", "value"]
        for a in attempts:
            batch_id, attempt = a["batch_id"], a["attempt"]
            if batch_id is None or attempt is None:
                mine = data.filter(pc.or_(pc.is_null(data["batch_id"]), pc.is_null(data["attempt"])))
                state, why = None, "record without valid batch headers (tidemark.batch, tidemark.attempt)"
            else:
                mine = data.filter(pc.and_(pc.equal(data["batch_id"], batch_id), pc.equal(data["attempt"], attempt)))
                planned = ledger.planned_batch(cur, batch_id)
                state = (ledger.attempt_state(cur, batch_id, attempt)
                         if planned and planned.pipeline == self.spec.name else None)
                why = (f"record for batch {batch_id} attempt {attempt}, which the orchestrator never opened for "
                       f"pipeline {self.spec.name} (no ledger row)")
                if state == "committed":
                    state, why = None, (f"late record of batch {batch_id} attempt {attempt}, committed at "
                                        f"{ledger.attempt_finished_at(cur, batch_id, attempt):%Y-%m-%dT%H:%M:%S%z}: "
                                        "not applied")
            if state in ("open", "sealed") and planned.schema_version is not None:
                self._typed_at_driver(cur, batch_id, attempt, planned.schema_version, mine, columns, report)
            elif state in ("open", "sealed"):
                window = planned.window
                rules = self._record_rules(cur)
                with report.steps.step("checks"):
                    kept = self._checked(mine, columns, lambda rec: rules.check(rec["key"], rec["value"], window),
                                         lambda rec, reason: self._reject(report, rec, reason))
                if kept.num_rows:
                    with report.steps.step("stage"):
                        self.stages.copy_in(cur, batch_id, attempt, kept)
                report.staged += kept.num_rows
            elif state is None:
                for rec in mine.select(columns).to_pylist():
                    self._reject(report, rec, why)
            else:
                report.discarded += mine.num_rows
                log.warning("pipeline=%s batch=%s attempt=%s: %s record(s) of a %s attempt discarded (its "
                            "attempt can never be applied)", self.spec.name, batch_id, attempt, mine.num_rows, state)

    def _typed_at_driver(self, cur, batch_id: str, attempt: int, version: int, records, columns: list[str],
                     report: MicroBatchReport) -> None:
        """Protocol version 2: Spark decoded and checked every record (``tidemark.avro.decode``) and
        the executors staged the good ones (``tidemark.stage``); what reaches the driver is rejected."""
        name = row_column(version)
        if name not in records.column_names or not checked_upstream(records):
            raise SinkError(f"pipeline={self.spec.name} batch={batch_id} attempt={attempt}: records of this "
                            f"protocol-version-2 attempt (schema version {version}) reached the sink undecoded (the "
                            "attempt was not open when the micro-batch was read); rolled back. Next: restart the "
                            "sink: it reads them again from the same offsets")
        kept = self._checked(records, columns, None, lambda rec, reason: self._reject(report, rec, reason))
        if kept.num_rows:  # the executors stage every good record of an open attempt: a bug, not bad input
            raise SinkError(f"pipeline={self.spec.name} batch={batch_id} attempt={attempt}: {kept.num_rows} good "
                            f"record(s) of this protocol-version-2 attempt reached the sink's driver unstaged "
                            f"({positions(kept)}); rolled back. Next: restart the sink: it reads them again from "
                            "the same offsets; if this repeats, report it with this log")

    def _accept_loads(self, cur, loads, report: MicroBatchReport) -> None:
        """Accept what the executors staged for attempts still open: their loads and totals. A load of
        an attempt aborted or superseded meanwhile is discarded (its stage is dropped or will be)."""
        by_attempt: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for r in loads.select(["batch_id", "attempt", "partition", "load", "load_rows", "load_checksum"]).to_pylist():
            by_attempt.setdefault((r["batch_id"], r["attempt"]), []).append(r)
        for (batch_id, attempt), mine in by_attempt.items():
            rows = sum(r["load_rows"] for r in mine)
            state = ledger.attempt_state(cur, batch_id, attempt)
            if state in ("aborted", "superseded", "refused"):
                report.discarded += rows
                log.warning("pipeline=%s batch=%s attempt=%s: %s record(s) the executors staged for a now %s "
                            "attempt discarded (its attempt can never be applied)", self.spec.name, batch_id,
                            attempt, rows, state)
                continue
            if state not in ("open", "sealed"):  # only this sink commits, between micro-batches
                raise SinkError(f"pipeline={self.spec.name} batch={batch_id} attempt={attempt}: the executors "
                                f"staged {rows} record(s) of an attempt now {state or 'unknown'}; rolled back. Next: "
                                "restart the sink: it reads them again from the same offsets")
            ledger.add_loads(cur, batch_id, attempt, sorted({r["load"] for r in mine}))
            for r in mine:
                ledger.add_staged(cur, batch_id, attempt, r["partition"], r["load_rows"], int(r["load_checksum"]))
            report.staged += rows

    def stager(self, typed: dict[tuple[str, int], Format], connect: dict[str, Any]) -> StageWriter:
        """The executors' staging of the next micro-batch (``tidemark.stage``, run by ``mapInArrow``):
        the stage table of every open protocol-version-2 attempt of ``typed`` (``formats()``) made
        ready, and the stored offsets below which records are replays. ``connect``: psycopg2
        keywords for the warehouse, as the executors will connect."""
        with self.conn, self.conn.cursor() as cur:
            self._check_fence(cur)
            targets = {key: Target(self.stages.ensure(cur, *key), row_column(fmt.version),
                                   tuple(quote(c.name) for c in fmt.columns), tuple(c.sql_type for c in fmt.columns))
                       for key, fmt in typed.items()}
            offsets = ledger.stored_offsets(cur, self.consumer, self.topic)
        return StageWriter(connect, self.topic, targets, offsets)


    def formats(self) -> dict[tuple[str, int], Format]:
        """The record format of every open protocol-version-2 attempt, for ``tidemark.avro.decode``."""
        with self.conn, self.conn.cursor() as cur:
            return ledger.open_formats(cur, self.spec.name)

    @staticmethod
    def _checked(records, columns: list[str], check, reject):
        """The records that pass their checks; every other one is rejected with its reason (batch and
        attempt travel in their own fields). Where the executors checked every record (``Checker``),
        their reasons stand; otherwise each record is checked here."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if checked_upstream(records):
            bad = pc.is_valid(records["reason"])
            if not pc.any(bad).as_py():
                return records
            for rec in records.filter(bad).select([*columns, "reason"]).to_pylist():
                reject(rec, rec["reason"])
            return records.filter(pc.invert(bad))
        good = []
        for rec in records.select(columns).to_pylist():
            reason = check(rec)
            if reason is not None:
                reject(rec, reason)
            good.append(reason is None)
        return records if all(good) else records.filter(pa.array(good, pa.bool_()))

    def checker(self, typed: dict[tuple[str, int], Format]) -> Checker:
        """The record checks of the next micro-batch, to run where its records are (``Checker``):
        with the rules and the planned window of every attempt open now, except the protocol-version-2
        attempts of ``typed`` (``formats()``: Spark checks those)."""
        with self.conn, self.conn.cursor() as cur:
            windows = {k: w for k, w in ledger.open_windows(cur, self.spec.name).items() if k not in typed}
            try:
                rules = self._record_rules(cur) if windows else None
            except LookupError:  # no target table (yet): the micro-batch's own checks say so
                rules = None
            return Checker(self.topic, rules, windows,
                           self.spec.stream.topic if self.spec.stream else None,
                           self.events.rules(cur) if self.spec.stream else None)

    def _record_rules(self, cur) -> RecordRules:
        if self._rules is None:
            self._rules = RecordRules(self.spec, target_columns(cur, self.spec.target_table))
        return self._rules


    def _end(self, cur, rec: dict[str, Any], msg: ControlMessage, report: MicroBatchReport) -> bool:
        """Record an END; True when the attempt now has END on every partition and is open."""
        state = ledger.attempt_state(cur, msg.batch_id, msg.attempt)
        if state is None:
            self._reject(report, rec, f"END for unknown batch {msg.batch_id} attempt {msg.attempt}: no BEGIN was seen; ignored", msg)
            return False
        if state == "committed":
            self._reject(report, rec, controls.replayed(cur, msg), msg)
            return False
        if state not in ("open", "sealed"):
            log.info("pipeline=%s batch=%s attempt=%s p%s END for a %s attempt: ignored", msg.pipeline, msg.batch_id,
                     msg.attempt, msg.partition, state)
            return False
        assert msg.totals is not None
        why = controls.unplanned(cur, self.spec, msg) or controls.unsealed(cur, msg, state)
        if why is not None:
            self._reject(report, rec, f"{why}: END rejected, the attempt waits for the orchestrator's END", msg)
            return False
        earlier = ledger.record_end(cur, msg.batch_id, msg.attempt, msg.partition, msg.totals, msg.batch_rows,
                                    rec["offset"])
        if earlier is not None:
            if earlier != (msg.totals.rows, msg.totals.checksum):
                self._refuse(cur, msg.batch_id, msg.attempt, report,
                             f"conflicting END on partition {msg.partition}: first said rows={earlier[0]} "
                             f"checksum={earlier[1]}, now rows={msg.totals.rows} checksum={msg.totals.checksum}")
                return False
            log.info("pipeline=%s batch=%s attempt=%s p%s duplicate END (same totals): no-op",
                     msg.pipeline, msg.batch_id, msg.attempt, msg.partition)
        return len(ledger.ends(cur, msg.batch_id, msg.attempt)[0]) == msg.partitions


    def _refuse(self, cur, batch_id: str, attempt: int, report: MicroBatchReport, why: str,
                next_step: str = "act on the cause named here") -> None:
        message = (f"batch {batch_id} attempt {attempt} REFUSED: {why}. Nothing was applied. Next: {next_step}, "
                   "then clear the DAG run from its 'begin' task to load a new attempt.")
        ledger.transition(cur, batch_id, attempt, "refused", message=message)
        self.stages.drop(cur, batch_id, attempt)
        report.refused.append(f"{batch_id}#{attempt}")
        log.error("pipeline=%s %s", self.spec.name, message)

    def _verify_and_apply(self, cur, batch_id: str, attempt: int, report: MicroBatchReport) -> None:
        # Lock the batch, then the attempt (the teardown's order): the orchestrator may abort the
        # attempt concurrently, and a state read under the lock is the one that counts.
        state = ledger.attempt_state(cur, batch_id, attempt, lock=True)
        if state not in ("open", "sealed"):
            log.warning("pipeline=%s batch=%s attempt=%s is %s: not applied", self.spec.name, batch_id, attempt, state)
            self.stages.drop(cur, batch_id, attempt)
            return
        if state != "sealed":  # ENDs recorded before the orchestrator sealed it (an earlier version's sink)
            log.warning("pipeline=%s batch=%s attempt=%s has END on every partition but the ledger shows it %s: "
                        "it waits for the orchestrator to seal it", self.spec.name, batch_id, attempt, state)
            return
        written = ledger.extract_offsets(cur, batch_id, attempt)
        bad, reasons = ledger.data_rejects(cur, self.consumer, batch_id, attempt, FIRST_REASONS, written)
        if bad:
            self._refuse(
                cur, batch_id, attempt, report,
                f"{bad} record(s) of this attempt were refused and sent to the dead-letter topic; first: "
                + " | ".join(r if len(r) <= 200 else r[:197] + "..." for r in reasons),
                "read every reason in tidemark_control.sink_rejects (or the dead-letter topic: header "
                f"tidemark.source gives topic/partition@offset); where the target cannot hold a value, change the "
                f"target table {self.spec.target_table} (or the spec); where a record is malformed, fix the source "
                "rows they name")
            return
        # The ledger, written by the orchestrator alone, says what the batch is: the extract's totals
        # sealed there, which every END accepted equals, and the offsets it wrote.
        expected = {p: (t.rows, t.checksum) for p, t in ledger.extract_totals(cur, batch_id, attempt).items()}
        kept = self._keep_written(cur, batch_id, attempt, written, report) if written is not None else None
        wrong = staged_mismatch(expected, kept if kept is not None else ledger.staged(cur, batch_id, attempt))
        if wrong:
            self._refuse(cur, batch_id, attempt, report,
                         "what the sink staged differs from the extract's totals sealed in the ledger: "
                         + "; ".join(wrong.findings), wrong.next_step.format(topic=self.spec.topic))
            return
        planned = ledger.planned_batch(cur, batch_id)
        window, repair_keys = planned.window, planned.repair_keys
        rows = sum(r for r, _ in expected.values())
        checksum = sum(c for _, c in expected.values())
        records = self.stages.records(cur, batch_id, attempt)
        if planned.schema_version is not None:  # the rows the apply will read are the rows the totals count
            cur.execute(f"SELECT count(*) FROM ({records}) batch")
            (readable,) = cur.fetchone()
            if readable != rows:
                self._refuse(cur, batch_id, attempt, report,
                             f"the stage holds {readable} accepted record(s), the staged totals and the ledger say "
                             f"{rows}" + self._restart_since(cur, batch_id, attempt),
                             "nothing of this attempt was applied and a new attempt stages its records afresh")
                return
        cur.execute("SAVEPOINT merge")
        merge_started = time.monotonic()
        try:
            if repair_keys is not None:
                outside, applied = merge.apply_repair(cur, self.spec, batch_id, attempt, repair_keys, window,
                                                              self._batch_columns(cur, batch_id), records)
                if outside:  # a staged record outside the repair's keys: nothing of it applies
                    cur.execute("ROLLBACK TO SAVEPOINT merge")
                    self._refuse(cur, batch_id, attempt, report,
                                 f"repair batch: {outside} of {rows} staged record(s) carry keys that are not "
                                 f"among its {len(repair_keys)} repair keys",
                                 "plan the repair again from a new reconciliation (tidemark_reconcile_"
                                 f"{self.spec.name} with repair=true)")
                    return
            else:
                applied = merge.apply_batch(cur, self.spec, window, self._batch_columns(cur, batch_id), records)
        except (psycopg2.DataError, psycopg2.IntegrityError, psycopg2.errors.ProgramLimitExceeded, RepairError) as exc:
            # the target cannot take it: refuse, no crash-loop
            cur.execute("ROLLBACK TO SAVEPOINT merge")
            self._refuse(cur, batch_id, attempt, report,
                         f"the target {self.spec.target_table} rejected a record: {' '.join(str(exc).split())}",
                         f"change the target table {self.spec.target_table} so it can hold the value (the error "
                         "names the type or constraint; e.g. ALTER TABLE ... ALTER COLUMN ... TYPE a wider type)")
            return
        if not ledger.transition(cur, batch_id, attempt, "committed", rows=rows, checksum=checksum):
            raise SinkError(f"pipeline={self.spec.name} batch={batch_id} attempt={attempt}: the ledger refused the move "
                            "to committed (state changed under the lock?); rolled back")
        moved = ledger.advance_watermark(cur, self.spec.name, batch_id, window)
        compacted = merge.compact(cur, self.spec, window) if repair_keys is None else None  # a repair covers its keys only
        self.stages.drop(cur, batch_id, attempt)
        report.committed.append(f"{batch_id}#{attempt}")
        log.info(
            "pipeline=%s batch=%s attempt=%s window=%s COMMITTED rows=%s (target rows written=%s in %.1f s) "
            "checksum=%s watermark %s%s", self.spec.name, batch_id, attempt, window, rows, applied,
            time.monotonic() - merge_started, checksum,
            f"-> {window.hi}" if moved else "unchanged (backfill, repair or older window)",
            f"; {compacted} real-time row(s) it covers compacted away" if compacted is not None else "",
        )

    def _keep_written(self, cur, batch_id: str, attempt: int, written: dict[int, tuple[int, int]],
                      report: MicroBatchReport) -> dict[int, tuple[int, int]] | None:
        """Keep in the stage only the records the extract wrote (its offsets [first, next) per
        partition hold exactly its records): any other record of the attempt, sent again or by
        another producer with its headers, is a dead letter naming partition, offset and key, and
        the genuine batch still applies. Returns the kept rows' totals per partition (None: the
        stage has rows an earlier version staged without their offsets; the running totals count)."""
        stage = self.stages.ensure(cur, batch_id, attempt)
        accepted, fmt = self.stages.accepted(cur, batch_id, attempt), self.stages.format(cur, batch_id)
        inside = " OR ".join(f"({PARTITION} = {int(p)} AND {OFFSET} >= {int(lo)} AND {OFFSET} < {int(hi)})"
                             for p, (lo, hi) in written.items()) or "false"
        cur.execute(f"SELECT count(*) FILTER (WHERE {OFFSET} IS NULL), count(*) FILTER (WHERE NOT ({inside})) "
                    f"FROM {stage} WHERE {accepted}")
        unknown, strays = cur.fetchone()
        if unknown:
            return None
        if strays:
            pk = self.spec.primary_key
            key = (", ".join(f"{quote(c)}::text" for c in pk) if fmt is not None
                   else ", ".join(cur.mogrify("value::json->>%s", (c,)).decode() for c in pk))
            payload = "NULL::bytea" if fmt is not None else "convert_to(value, 'UTF8')"
            cur.execute(f"SELECT {PARTITION}, {OFFSET}, concat_ws(', ', {key}), {payload} FROM {stage} "
                        f"WHERE ({accepted}) AND NOT ({inside}) ORDER BY 1, 2")
            for p, offset, key_text, value in cur.fetchall():
                lo, hi = written.get(p, (0, 0))
                self._reject(report, {"topic": self.topic, "partition": p, "offset": offset, "key": None,
                                      "value": bytes(value) if value is not None else None,
                                      "batch_id": batch_id, "attempt": attempt},
                             f"record of batch {batch_id} attempt {attempt} at {self.topic}/{p}@{offset}, key "
                             f"({', '.join(pk)})=({key_text}), is not one the extract wrote (its offsets on partition "
                             f"{p}: {lo}..{hi - 1}): sent again or by another producer; not applied")
            cur.execute(f"DELETE FROM {stage} WHERE ({accepted}) AND NOT ({inside})")
        cur.execute(f"SELECT {PARTITION}, count(*), coalesce(sum({HASH}::numeric), 0) FROM {stage} "
                    f"WHERE {accepted} GROUP BY 1")
        return {p: (rows, int(checksum)) for p, rows, checksum in cur.fetchall()}


    @staticmethod
    def _restart_since(cur, batch_id: str, attempt: int) -> str:
        """The cause when the warehouse restarted after the attempt began: crash recovery empties
        UNLOGGED tables, the stages among them, while the logged staged totals stay."""
        cur.execute("SELECT pg_postmaster_start_time() > begun_at, pg_postmaster_start_time() FROM "
                    "tidemark_control.batch_attempts WHERE batch_id = %s AND attempt = %s", (batch_id, attempt))
        row = cur.fetchone()
        if not row or not row[0]:
            return ""
        return (f" (the warehouse restarted at {row[1]:%Y-%m-%dT%H:%M:%S%z}, after the attempt began: crash recovery "
                "empties its UNLOGGED stage tables)")


    def target_columns(self, cur) -> list[str]:
        return list(self._record_rules(cur).columns)

    def _batch_columns(self, cur, batch_id: str) -> list[str]:
        """The columns a batch writes: the target's (version 1), or its record schema's (version 2;
        source columns the target lacks are added first, in this transaction)."""
        fmt = self.stages.format(cur, batch_id)
        if fmt is None:
            return self.target_columns(cur)
        have = set(self.target_columns(cur))
        fills = ledger.column_fills(cur, batch_id)  # the plan found what the source's older rows hold
        for c in fmt[1]:
            if c.name not in have:
                fill = fills.get(c.name)
                default = cur.mogrify(f" DEFAULT %s::{sql_type(c.sql_type)}", (fill,)).decode() if fill is not None else ""
                cur.execute(f"ALTER TABLE {quote(self.spec.target_table)} ADD COLUMN {quote(c.name)} "
                            f"{sql_type(c.sql_type)}{default}")
                log.warning("pipeline=%s batch=%s: target %s gained column %s %s%s (record schema version %s)",
                            self.spec.name, batch_id, self.spec.target_table, c.name, c.sql_type,
                            f", its rows loaded before hold {fill!r} as the source's do" if fill is not None else "",
                            fmt[0])
                self._rules = None  # the target's columns changed
        return [c.name for c in fmt[1]]


    def _record_rejects(self, cur, report: MicroBatchReport) -> None:
        fresh = report.rejects[report.recorded:]
        ledger.record_rejects(cur, self.consumer, self.topic,
                              [{**r, "payload": payload_text(r["payload"]), "raw": r["payload"], "raw_key": r.get("key")}
                               for r in fresh])
        report.recorded = len(report.rejects)

    def _store_offsets(self, cur, table, loads) -> None:
        """The next offset of every partition read: past its last record, whoever staged it."""
        for r in extents(table, loads):
            ledger.store_offset(cur, self.consumer, r["topic"], r["partition"], r["offset_max"] + 1, self.fence)


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


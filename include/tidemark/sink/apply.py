"""``BatchSink``: one micro-batch in one PostgreSQL transaction (the steps: ``tidemark.sink``), from
the fence check to the stored offsets. It sequences three parts, each an object of its own over the
same stage tables (``stages``) and target (``target``): what comes in (``intake.Intake``: control
messages, records), END and the checks before an apply (``verify.Verification``), and the apply
(``commit.Commit``: the merge SQL is ``merge``'s); every dead letter goes through one
``report.Rejects``; the real-time input is the speed layer's (``tidemark.realtime``)."""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any

from tidemark import ledger
from tidemark.batch.stage import StageWriter
from tidemark.protocol import faults
from tidemark.protocol.avro import Format
from tidemark.protocol.control import ControlMessage, Keyring
from tidemark.protocol.progress import Steps
from tidemark.protocol.records import Checker, payload_text
from tidemark.protocol.spec import PipelineSpec
from tidemark.realtime import speed_layer
from tidemark.realtime.cdc.signing import Verifier
from tidemark.realtime.interface import SpeedLayer
from tidemark.sink.commit import Commit
from tidemark.sink.dead_letters import DeadLetterOutbox
from tidemark.sink.intake import Intake
from tidemark.sink.report import FencedError, MicroBatchReport, Rejects, SinkError, extents, loaded, positions
from tidemark.sink.stages import StageArea
from tidemark.sink.target import TargetColumns
from tidemark.sink.verify import Verification

log = logging.getLogger("tidemark.sink")


class BatchSink:
    """The sink of one pipeline: ``apply`` one micro-batch at a time, under the pipeline's fence."""

    def __init__(self, conn, spec: PipelineSpec, *, keyring: Keyring,
                 dead_letters: DeadLetterOutbox | None = None, speed: SpeedLayer | None = None):
        self.conn = conn  # psycopg2 connection owned by the caller
        self.spec = spec
        self.topic = spec.topic
        # the real-time input (``tidemark.realtime``): an application's events, or the source table's own changes
        self.speed = speed if speed is not None else speed_layer(spec, verifier=Verifier(keyring))
        self.realtime_topics = self.speed.topics if self.speed is not None else {}
        self.topics = [spec.topic, *self.realtime_topics]
        # One consumer per pipeline per warehouse database: a second sink of the pipeline in this
        # database is the same consumer, takes the fence, and the first can no longer commit.
        self.consumer = ledger.consumer_for(spec.name)
        self.dead_letters = dead_letters  # publishes the committed rejects, after each commit and at start
        self.fence: int | None = None
        self.stages = StageArea(spec)
        self.reject = Rejects(spec.name, spec.topic)
        target = TargetColumns(spec, self.speed)
        self.intake = Intake(spec, keyring, self.consumer, self.stages, target, self.speed, self.reject)
        self.verification = Verification(spec, self.consumer, self.stages, self.reject)
        self.commit = Commit(spec, self.stages, target, self.speed, self.verification)

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
        counts = {self.spec.topic: self.spec.partitions, **self.realtime_topics}
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
                  if self.realtime_topics else "")
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
            msg = self.intake.decode(cur, rec, report)
            if msg is None:
                continue
            if msg.kind == "BEGIN":
                self.intake.begin(cur, rec, msg, report)
            elif msg.kind == "ABORT":
                self.intake.abort(cur, rec, msg, report)
            else:
                ends.append((rec, msg))
        if data.num_rows:
            self.intake.stage(cur, data, report)
        if loaded(loads):
            self.intake.accept_loads(cur, loads, report)
        if data.num_rows or loaded(loads):
            faults.point("staged")
        if events.num_rows:  # before any batch commits: its compaction covers these too
            with report.steps.step("events"):
                self.speed.apply(cur, events, self.fence, micro_batch, report,
                                 lambda rec, reason: self.reject(report, rec, reason))
        self._record_rejects(cur, report)  # before verifying: an attempt with dead letters is refused
        complete: list[tuple[str, int]] = []
        for rec, msg in ends:
            if self.verification.end(cur, rec, msg, report) and (msg.batch_id, msg.attempt) not in complete:
                complete.append((msg.batch_id, msg.attempt))
        if self.speed is not None:  # attempts that waited for the stream
            complete += [a for a in self.speed.released(cur) if a not in complete]
        for batch_id, attempt in complete:
            with report.steps.step("apply"):
                self.commit.verify_and_apply(cur, batch_id, attempt, report)
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

    def stager(self, typed: dict[tuple[str, int], Format], connect: dict[str, Any]) -> StageWriter:
        """The executors' staging of the next micro-batch (``Intake.stager``), under the fence."""
        with self.conn, self.conn.cursor() as cur:
            self._check_fence(cur)
            return self.intake.stager(cur, typed, connect)

    def formats(self) -> dict[tuple[str, int], Format]:
        """The record format of every open protocol-version-2 attempt (``Intake.formats``)."""
        with self.conn, self.conn.cursor() as cur:
            return self.intake.formats(cur)

    def checker(self, typed: dict[tuple[str, int], Format], cur=None) -> Checker:
        """The record checks of the next micro-batch (``Intake.checker``). ``cur``: read over the caller's
        cursor (the overlapped read's own connection, while the apply holds the sink's)."""
        if cur is None:
            with self.conn, self.conn.cursor() as cur:
                return self.intake.checker(cur, typed)
        return self.intake.checker(cur, typed)

    def check_stream(self) -> None:
        """At start: the real-time table can take its records (else ``LookupError``)."""
        if self.speed is not None:
            with self.conn, self.conn.cursor() as cur:
                self.speed.rules(cur)

    def _check_fence(self, cur) -> None:
        now = ledger.current_fence(cur, self.consumer)
        if self.fence is None or now != self.fence:
            raise FencedError(
                f"sink {self.consumer}: fencing token {self.fence} is no longer current "
                f"(now {now}); another instance took over, stopping without commit"
            )


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

"""What the sink takes in: control messages decoded and checked against the ledger, records checked
and staged (at the driver, or accepted from the executors' loads), dead letters with their reason."""

from __future__ import annotations

import logging
from typing import Any

from tidemark import ledger
from tidemark.batch.stage import StageWriter, Target
from tidemark.protocol.avro import Format, row_column
from tidemark.protocol.control import ControlMessage, Keyring, ProtocolError, decode
from tidemark.protocol.records import Checker, checked_upstream
from tidemark.protocol.spec import PipelineSpec
from tidemark.realtime.interface import SpeedLayer
from tidemark.sink import controls
from tidemark.sink.report import MicroBatchReport, Rejects, SinkError, positions
from tidemark.sink.stages import StageArea
from tidemark.sink.target import TargetColumns

log = logging.getLogger("tidemark.sink")


class Intake:
    """Control messages and records of one micro-batch, before any END is looked at."""

    def __init__(self, spec: PipelineSpec, keyring: Keyring, consumer: str, stages: StageArea, target: TargetColumns,
                 speed: SpeedLayer | None, reject: Rejects):
        self.spec, self.consumer, self.stages, self.target, self.speed = spec, consumer, stages, target, speed
        self.keyring = keyring  # a control message counts only when one of its keys signed it
        self.reject = reject

    def decode(self, cur, rec: dict[str, Any], report: MicroBatchReport) -> ControlMessage | None:
        try:
            msg = decode(rec["value"])
        except ProtocolError as exc:
            self.reject(report, rec, f"{rec['control']} message rejected: {exc}")
            return None
        unsigned = self.keyring.verify(msg)
        if unsigned is not None:
            self.reject(report, rec, f"{msg.describe()} rejected: {unsigned}", msg)
            return None
        if msg.kind != rec["control"] or msg.partition != rec["partition"] or msg.pipeline != self.spec.name:
            self.reject(
                report, rec,
                f"{msg.kind} for batch {msg.batch_id} rejected: header {rec['control']}, pipeline {msg.pipeline}, "
                f"partition field {msg.partition} do not match this topic's pipeline {self.spec.name} / partition",
            )
            return None
        if msg.partitions != self.spec.partitions:
            self.reject(report, rec, f"{msg.describe()} rejected: {msg.partitions} partitions, topic has {self.spec.partitions}")
            return None
        if msg.parsed_window.lo.kind != self.spec.cursor.kind:
            self.reject(report, rec, f"{msg.describe()} rejected: its window {msg.parsed_window} has {msg.parsed_window.lo.kind} "
                         f"cursors, pipeline {self.spec.name} has a {self.spec.cursor.kind} cursor", msg)
            return None
        return msg

    def begin(self, cur, rec: dict[str, Any], msg: ControlMessage, report: MicroBatchReport) -> None:
        """A BEGIN changes nothing in the ledger: the orchestrator opened the attempt (and superseded
        older ones) before sending it. It is checked against the plan, and frees older stages."""
        why = controls.unplanned(cur, self.spec, msg)
        if why is not None:
            self.reject(report, rec, f"{why}: BEGIN rejected, nothing of it is staged", msg)
            return
        state = ledger.attempt_state(cur, msg.batch_id, msg.attempt)
        if state == "committed":
            self.reject(report, rec, controls.replayed(cur, msg), msg)
            return
        if state not in ("open", "sealed"):
            log.info("pipeline=%s batch=%s attempt=%s p%s BEGIN of a%s attempt (late or replayed): no-op",
                     msg.pipeline, msg.batch_id, msg.attempt, msg.partition, f" {state}" if state else "n unrecorded")
            return
        for older in range(1, msg.attempt):
            self.stages.drop(cur, msg.batch_id, older)

    def abort(self, cur, rec: dict[str, Any], msg: ControlMessage, report: MicroBatchReport) -> None:
        """An ABORT of an attempt the orchestrator planned: aborted in the ledger, its stage dropped."""
        why = controls.unplanned(cur, self.spec, msg)
        if why is not None:
            self.reject(report, rec, f"{why}: ABORT rejected", msg)
            return
        ledger.lock_batch(cur, msg.batch_id)
        aborted_now = ledger.transition(cur, msg.batch_id, msg.attempt, "aborted",
                                        message=f"aborted by producer: {msg.reason or 'no reason given'}")
        self.stages.drop(cur, msg.batch_id, msg.attempt)  # also when the orchestrator marked it aborted first
        if aborted_now:
            log.warning("pipeline=%s batch=%s attempt=%s ABORT received (%s): staged records discarded",
                        msg.pipeline, msg.batch_id, msg.attempt, msg.reason)

    def stage(self, cur, data, report: MicroBatchReport) -> None:
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
            if state in ("open", "sealed") and planned.transport == "direct":  # its tasks staged it: not these
                state, why = None, (f"record for batch {batch_id} attempt {attempt}, whose records the extract "
                                    "staged directly (transport: direct): none travels through the topic; sent by "
                                    "another producer, not applied")
            if state in ("open", "sealed") and planned.schema_version is not None:
                self._typed_at_driver(cur, batch_id, attempt, planned.schema_version, mine, columns, report)
            elif state in ("open", "sealed"):
                window = planned.records_window  # the one rule, as for Avro records (ledger.open_formats)
                rules = self.target.rules(cur)
                with report.steps.step("checks"):
                    kept = self._checked(mine, columns, lambda rec: rules.check(rec["key"], rec["value"], window),
                                         lambda rec, reason: self.reject(report, rec, reason))
                if kept.num_rows:
                    with report.steps.step("stage"):
                        self.stages.copy_in(cur, batch_id, attempt, kept)
                report.staged += kept.num_rows
            elif state is None:
                for rec in mine.select(columns).to_pylist():
                    self.reject(report, rec, why)
            else:
                report.discarded += mine.num_rows
                log.warning("pipeline=%s batch=%s attempt=%s: %s record(s) of a %s attempt discarded (its "
                            "attempt can never be applied)", self.spec.name, batch_id, attempt, mine.num_rows, state)

    def _typed_at_driver(self, cur, batch_id: str, attempt: int, version: int, records, columns: list[str],
                     report: MicroBatchReport) -> None:
        """Protocol version 2: Spark decoded and checked every record (``tidemark.protocol.avro.decode``) and
        the executors staged the good ones (``tidemark.batch.stage``); what reaches the driver is rejected."""
        name = row_column(version)
        if name not in records.column_names or not checked_upstream(records):
            raise SinkError(f"pipeline={self.spec.name} batch={batch_id} attempt={attempt}: records of this "
                            f"protocol-version-2 attempt (schema version {version}) reached the sink undecoded (the "
                            "attempt was not open when the micro-batch was read); rolled back. Next: restart the "
                            "sink: it reads them again from the same offsets")
        kept = self._checked(records, columns, None, lambda rec, reason: self.reject(report, rec, reason))
        if kept.num_rows:  # the executors stage every good record of an open attempt: a bug, not bad input
            raise SinkError(f"pipeline={self.spec.name} batch={batch_id} attempt={attempt}: {kept.num_rows} good "
                            f"record(s) of this protocol-version-2 attempt reached the sink's driver unstaged "
                            f"({positions(kept)}); rolled back. Next: restart the sink: it reads them again from "
                            "the same offsets; if this repeats, report it with this log")

    def accept_loads(self, cur, loads, report: MicroBatchReport) -> None:
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

    def stager(self, cur, typed: dict[tuple[str, int], Format], connect: dict[str, Any]) -> StageWriter:
        """The executors' staging of the next micro-batch (``tidemark.batch.stage``, run by ``mapInArrow``):
        the stage table of every open protocol-version-2 attempt of ``typed`` (``formats()``) made
        ready, and the stored offsets below which records are replays. ``connect``: psycopg2
        keywords for the warehouse, as the executors will connect."""
        targets = {key: Target.of(self.stages.ensure(cur, *key), fmt.version, fmt.columns)
                   for key, fmt in typed.items()}
        offsets = ledger.stored_offsets(cur, self.consumer, self.spec.topic)
        return StageWriter(connect, self.spec.topic, targets, offsets)

    def formats(self, cur) -> dict[tuple[str, int], Format]:
        """The record format of every open protocol-version-2 attempt, for ``tidemark.protocol.avro.decode``."""
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

    def checker(self, cur, typed: dict[tuple[str, int], Format]) -> Checker:
        """The record checks of the next micro-batch, to run where its records are (``Checker``):
        with the rules and the planned window of every attempt open now, except the protocol-version-2
        attempts of ``typed`` (``formats()``: Spark checks those)."""
        windows = {k: w for k, w in ledger.open_windows(cur, self.spec.name).items() if k not in typed}
        try:
            rules = self.target.rules(cur) if windows else None
        except LookupError:  # no target table (yet): the micro-batch's own checks say so
            rules = None
        read_checks = self.speed.read_checks(cur) if self.speed is not None else None
        return Checker(self.spec.topic, rules, windows, *(read_checks or (None, None)))

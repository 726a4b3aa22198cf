"""A verified batch applied: merged into the target in the micro-batch's transaction, the ledger's
move to committed, the watermark, and the speed layer's compaction; refused when the target or a
repair's keys cannot take it."""

from __future__ import annotations

import logging
import time

import psycopg2
import psycopg2.errors

from tidemark import ledger
from tidemark.batch.repair import RepairError
from tidemark.protocol.spec import PipelineSpec
from tidemark.realtime.interface import SpeedLayer, StreamBehind
from tidemark.sink import merge
from tidemark.sink.report import MicroBatchReport, SinkError
from tidemark.sink.stages import StageArea
from tidemark.sink.target import TargetColumns
from tidemark.sink.verify import Verification

log = logging.getLogger("tidemark.sink")


class Commit:
    """A verified batch into the target, or refused (``Verification.refuse``) when the target cannot take it."""

    def __init__(self, spec: PipelineSpec, stages: StageArea, target: TargetColumns, speed: SpeedLayer | None,
                 verification: Verification):
        self.spec, self.stages, self.target, self.speed = spec, stages, target, speed
        self.verification = verification
        self._told_waiting: set[tuple[str, int]] = set()  # attempts the log said wait for the stream

    def verify_and_apply(self, cur, batch_id: str, attempt: int, report: MicroBatchReport) -> None:
        if not self.verification.sealed(cur, batch_id, attempt) or self._held(cur, batch_id, attempt):
            return
        verified = self.verification.verify(cur, batch_id, attempt, report)
        if verified is None:
            return
        planned, rows, checksum, records = verified
        merge_started = time.monotonic()
        applied = self._merge(cur, batch_id, attempt, report, planned, rows, records)
        if applied is None:
            return
        if not ledger.transition(cur, batch_id, attempt, "committed", rows=rows, checksum=checksum):
            raise SinkError(f"pipeline={self.spec.name} batch={batch_id} attempt={attempt}: the ledger refused the move "
                            "to committed (state changed under the lock?); rolled back")
        window = planned.window
        moved = ledger.advance_watermark(cur, self.spec.name, batch_id, window)
        # a repair covers its keys only: nothing real-time to compact
        compacted = (self.speed.compact(cur, batch_id, window)
                     if self.speed is not None and planned.repair_keys is None else None)
        self.stages.drop(cur, batch_id, attempt)
        report.committed.append(f"{batch_id}#{attempt}")
        log.info(
            "pipeline=%s batch=%s attempt=%s window=%s COMMITTED rows=%s (target rows written=%s in %.1f s) "
            "checksum=%s watermark %s%s", self.spec.name, batch_id, attempt, window, rows, applied,
            time.monotonic() - merge_started, checksum,
            f"-> {window.hi}" if moved else "unchanged (backfill, repair or older window)",
            f"; {compacted}" if compacted is not None else "",
        )

    def _held(self, cur, batch_id: str, attempt: int) -> bool:
        """Whether the attempt waits for the stream (``SpeedLayer.holds``: a capture group's member)."""
        if self.speed is None:
            return False
        try:
            return self.speed.holds(cur, batch_id, attempt, self._told_waiting)
        except StreamBehind as exc:
            raise SinkError(str(exc)) from None

    def _merge(self, cur, batch_id: str, attempt: int, report: MicroBatchReport, planned, rows: int,
               records: str) -> int | None:
        """Writes the verified batch into the target (``tidemark.sink.merge``): the target rows
        written, or None when the target or the repair's keys refused it (rolled back to before)."""
        window, repair_keys = planned.window, planned.repair_keys
        cur.execute("SAVEPOINT merge")
        try:
            if repair_keys is None:
                # may widen the target: kept by a fallback below
                columns = self.target.for_batch(cur, batch_id, self.stages.format(cur, batch_id))
                typed = planned.schema_version is not None  # (a JSON stage would be parsed once more to probe)
                if typed:
                    cur.execute("SAVEPOINT apply")
                return merge.apply_batch(cur, self.spec, window, columns, records, savepoint="apply" if typed else None)
            outside, applied = merge.apply_repair(cur, self.spec, batch_id, attempt, repair_keys, window,
                                                  self.target.for_batch(cur, batch_id, self.stages.format(cur, batch_id)), records)
        except (psycopg2.DataError, psycopg2.IntegrityError, psycopg2.errors.ProgramLimitExceeded, RepairError) as exc:
            # the target cannot take it: refuse, no crash-loop
            cur.execute("ROLLBACK TO SAVEPOINT merge")
            self.verification.refuse(cur, batch_id, attempt, report,
                                     f"the target {self.spec.target_table} rejected a record: {' '.join(str(exc).split())}",
                                     f"change the target table {self.spec.target_table} so it can hold the value (the error "
                                     "names the type or constraint; e.g. ALTER TABLE ... ALTER COLUMN ... TYPE a wider type)")
            return None
        if outside:  # a staged record outside the repair's keys: nothing of it applies
            cur.execute("ROLLBACK TO SAVEPOINT merge")
            self.verification.refuse(cur, batch_id, attempt, report,
                                     f"repair batch: {outside} of {rows} staged record(s) carry keys that are not "
                                     f"among its {len(repair_keys)} repair keys",
                                     "plan the repair again from a new reconciliation (tidemark_reconcile_"
                                     f"{self.spec.name} with repair=true)")
            return None
        return applied

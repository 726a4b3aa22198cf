"""END and what follows: an attempt complete on every partition is verified against its staged totals
and the ledger's, then applied in the micro-batch's transaction, or refused with the figures."""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg2
import psycopg2.errors

from tidemark import ledger
from tidemark.batch.repair import RepairError
from tidemark.batch.stage import HASH, OFFSET, PARTITION, STAGE_SCHEMA
from tidemark.ledger import catalog
from tidemark.protocol.avro import sql_type, widens
from tidemark.protocol.control import ControlMessage
from tidemark.protocol.spec import quote
from tidemark.protocol.totals import staged_mismatch
from tidemark.realtime.interface import StreamBehind
from tidemark.sink import controls, merge
from tidemark.sink.report import (
    FIRST_REASONS,
    MicroBatchReport,
    SinkError,
)

log = logging.getLogger("tidemark.sink")



class Commit:
    """``BatchSink``'s verify-and-apply (its attributes: ``tidemark.sink.apply``)."""

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
        if not self._sealed(cur, batch_id, attempt) or self._ahead_of_stream(cur, batch_id, attempt):
            return
        verified = self._verify(cur, batch_id, attempt, report)
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

    def _ahead_of_stream(self, cur, batch_id: str, attempt: int) -> bool:
        """Whether the attempt waits for the stream (``SpeedLayer.holds``: a capture group's member)."""
        if self.speed is None:
            return False
        try:
            return self.speed.holds(cur, batch_id, attempt, self._told_waiting)
        except StreamBehind as exc:
            raise SinkError(str(exc)) from None

    def _sealed(self, cur, batch_id: str, attempt: int) -> bool:
        """Whether the attempt is sealed, read under its lock; one no longer open loses its stage."""
        # Lock the batch, then the attempt (the teardown's order): the orchestrator may abort the
        # attempt concurrently, and a state read under the lock is the one that counts.
        state = ledger.attempt_state(cur, batch_id, attempt, lock=True)
        if state not in ("open", "sealed"):
            log.warning("pipeline=%s batch=%s attempt=%s is %s: not applied", self.spec.name, batch_id, attempt, state)
            self.stages.drop(cur, batch_id, attempt)
            return False
        if state != "sealed":  # ENDs recorded before the orchestrator sealed it (an earlier version's sink)
            log.warning("pipeline=%s batch=%s attempt=%s has END on every partition but the ledger shows it %s: "
                        "it waits for the orchestrator to seal it", self.spec.name, batch_id, attempt, state)
            return False
        return True

    def _verify(self, cur, batch_id: str, attempt: int, report: MicroBatchReport):
        """The planned batch, its rows, checksum and the query of its accepted records, when what
        was staged is exactly what the ledger says the batch is; else the attempt is refused (None)."""
        planned = ledger.planned_batch(cur, batch_id)
        direct = planned.transport == "direct"  # staged by the extract's tasks: no record of the topic is its
        written = {} if direct else ledger.extract_offsets(cur, batch_id, attempt)
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
            return None
        # The ledger, written by the orchestrator alone, says what the batch is: the extract's totals
        # sealed there, which every END accepted equals, and the offsets it wrote.
        expected = {p: (t.rows, t.checksum) for p, t in ledger.extract_totals(cur, batch_id, attempt).items()}
        if direct:
            kept = self._stage_totals(cur, self.stages.ensure(cur, batch_id, attempt),
                                      self.stages.accepted(cur, batch_id, attempt))
        else:
            kept = self._keep_written(cur, batch_id, attempt, written, report) if written is not None else None
        wrong = staged_mismatch(expected, kept if kept is not None else ledger.staged(cur, batch_id, attempt))
        if wrong and direct:  # no topic between them: the stage itself changed, or a crash emptied it
            self._refuse(cur, batch_id, attempt, report,
                         "what the extract's tasks staged differs from its totals sealed in the ledger: "
                         + "; ".join(wrong.findings) + self._restart_since(cur, batch_id, attempt),
                         "a new attempt stages the batch afresh; unless a warehouse crash emptied the stage, find "
                         f"who else writes to {STAGE_SCHEMA} and revoke it")
            return None
        if wrong:
            self._refuse(cur, batch_id, attempt, report,
                         "what the sink staged differs from the extract's totals sealed in the ledger: "
                         + "; ".join(wrong.findings), wrong.next_step.format(topic=self.spec.topic))
            return None
        rows = sum(r for r, _ in expected.values())
        checksum = sum(c for _, c in expected.values())
        records = self.stages.records(cur, batch_id, attempt)
        # the rows the apply will read are the rows the totals count (direct: counted in the stage just now)
        if planned.schema_version is not None and not direct:
            cur.execute(f"SELECT count(*) FROM ({records}) batch")
            (readable,) = cur.fetchone()
            if readable != rows:
                self._refuse(cur, batch_id, attempt, report,
                             f"the stage holds {readable} accepted record(s), the staged totals and the ledger say "
                             f"{rows}" + self._restart_since(cur, batch_id, attempt),
                             "nothing of this attempt was applied and a new attempt stages its records afresh")
                return None
        return planned, rows, checksum, records

    def _merge(self, cur, batch_id: str, attempt: int, report: MicroBatchReport, planned, rows: int,
               records: str) -> int | None:
        """Writes the verified batch into the target (``tidemark.sink.merge``): the target rows
        written, or None when the target or the repair's keys refused it (rolled back to before)."""
        window, repair_keys = planned.window, planned.repair_keys
        cur.execute("SAVEPOINT merge")
        try:
            if repair_keys is None:
                columns = self._batch_columns(cur, batch_id)  # may widen the target: kept by a fallback below
                typed = planned.schema_version is not None  # (a JSON stage would be parsed once more to probe)
                if typed:
                    cur.execute("SAVEPOINT apply")
                return merge.apply_batch(cur, self.spec, window, columns, records, savepoint="apply" if typed else None)
            outside, applied = merge.apply_repair(cur, self.spec, batch_id, attempt, repair_keys, window,
                                                  self._batch_columns(cur, batch_id), records)
        except (psycopg2.DataError, psycopg2.IntegrityError, psycopg2.errors.ProgramLimitExceeded, RepairError) as exc:
            # the target cannot take it: refuse, no crash-loop
            cur.execute("ROLLBACK TO SAVEPOINT merge")
            self._refuse(cur, batch_id, attempt, report,
                         f"the target {self.spec.target_table} rejected a record: {' '.join(str(exc).split())}",
                         f"change the target table {self.spec.target_table} so it can hold the value (the error "
                         "names the type or constraint; e.g. ALTER TABLE ... ALTER COLUMN ... TYPE a wider type)")
            return None
        if outside:  # a staged record outside the repair's keys: nothing of it applies
            cur.execute("ROLLBACK TO SAVEPOINT merge")
            self._refuse(cur, batch_id, attempt, report,
                         f"repair batch: {outside} of {rows} staged record(s) carry keys that are not "
                         f"among its {len(repair_keys)} repair keys",
                         "plan the repair again from a new reconciliation (tidemark_reconcile_"
                         f"{self.spec.name} with repair=true)")
            return None
        return applied

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
        return self._stage_totals(cur, stage, accepted)

    @staticmethod
    def _stage_totals(cur, stage: str, accepted: str) -> dict[int, tuple[int, int]]:
        """Rows and checksum per partition of the ``accepted`` rows of ``stage``, counted in the stage."""
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

    def _widen_target(self, cur, batch_id: str, fmt) -> None:
        """Target columns the source widened since (``avro.widens``): widened to the record schema's
        types in this transaction, the pipeline's serving view made again around them with its grants."""
        target = {name: kind for name, kind, _ in catalog.source_columns(cur, self.spec.target_table)}
        wider = {c.name: sql_type(c.sql_type) for c in fmt[1] if c.name in target and widens(target[c.name], c.sql_type)}
        if not wider:
            return
        if self.speed is not None:  # with what of the speed layer reads them
            self.speed.widen_target(cur, wider)
        else:
            catalog.widen_columns(cur, [self.spec.target_table], wider)
        log.warning("pipeline=%s batch=%s: target %s widened column(s) %s (record schema version %s)", self.spec.name,
                    batch_id, self.spec.target_table, ", ".join(f"{c} from {target[c]} to {t}" for c, t in wider.items()),
                    fmt[0])
        self._rules = None  # the target's columns changed

    def _batch_columns(self, cur, batch_id: str) -> list[str]:
        """The columns a batch writes: the target's (version 1), or its record schema's (version 2;
        source columns the target lacks are added first, in this transaction)."""
        fmt = self.stages.format(cur, batch_id)
        if fmt is None:
            return self.target_columns(cur)
        have = set(self.target_columns(cur))
        self._widen_target(cur, batch_id, fmt)
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
                if self.speed is not None:  # the serving view shows the batch's side of it from now on
                    self.speed.views(cur, again=True)
        return [c.name for c in fmt[1]]

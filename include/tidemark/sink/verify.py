"""END and the checks before a batch applies: an attempt complete on every partition, sealed by the
orchestrator, whose staged records are exactly what the ledger says the batch is; else refused,
with the figures."""

from __future__ import annotations

import logging
from typing import Any

from tidemark import ledger
from tidemark.batch.stage import HASH, OFFSET, PARTITION, STAGE_SCHEMA
from tidemark.protocol.control import ControlMessage
from tidemark.protocol.spec import PipelineSpec, quote
from tidemark.protocol.totals import staged_mismatch
from tidemark.sink import controls
from tidemark.sink.report import FIRST_REASONS, MicroBatchReport, Rejects
from tidemark.sink.stages import StageArea

log = logging.getLogger("tidemark.sink")


class Verification:
    """END recorded per partition, and an attempt's stage checked against the ledger before it applies."""

    def __init__(self, spec: PipelineSpec, consumer: str, stages: StageArea, reject: Rejects):
        self.spec, self.consumer, self.stages, self.reject = spec, consumer, stages, reject

    def end(self, cur, rec: dict[str, Any], msg: ControlMessage, report: MicroBatchReport) -> bool:
        """Record an END; True when the attempt now has END on every partition and is open."""
        state = ledger.attempt_state(cur, msg.batch_id, msg.attempt)
        if state is None:
            self.reject(report, rec, f"END for unknown batch {msg.batch_id} attempt {msg.attempt}: no BEGIN was seen; ignored", msg)
            return False
        if state == "committed":
            self.reject(report, rec, controls.replayed(cur, msg), msg)
            return False
        if state not in ("open", "sealed"):
            log.info("pipeline=%s batch=%s attempt=%s p%s END for a %s attempt: ignored", msg.pipeline, msg.batch_id,
                     msg.attempt, msg.partition, state)
            return False
        assert msg.totals is not None
        why = controls.unplanned(cur, self.spec, msg) or controls.unsealed(cur, msg, state)
        if why is not None:
            self.reject(report, rec, f"{why}: END rejected, the attempt waits for the orchestrator's END", msg)
            return False
        earlier = ledger.record_end(cur, msg.batch_id, msg.attempt, msg.partition, msg.totals, msg.batch_rows,
                                    rec["offset"])
        if earlier is not None:
            if earlier != (msg.totals.rows, msg.totals.checksum):
                self.refuse(cur, msg.batch_id, msg.attempt, report,
                            f"conflicting END on partition {msg.partition}: first said rows={earlier[0]} "
                            f"checksum={earlier[1]}, now rows={msg.totals.rows} checksum={msg.totals.checksum}")
                return False
            log.info("pipeline=%s batch=%s attempt=%s p%s duplicate END (same totals): no-op",
                     msg.pipeline, msg.batch_id, msg.attempt, msg.partition)
        return len(ledger.ends(cur, msg.batch_id, msg.attempt)[0]) == msg.partitions

    def refuse(self, cur, batch_id: str, attempt: int, report: MicroBatchReport, why: str,
                next_step: str = "act on the cause named here") -> None:
        message = (f"batch {batch_id} attempt {attempt} REFUSED: {why}. Nothing was applied. Next: {next_step}, "
                   "then clear the DAG run from its 'begin' task to load a new attempt.")
        ledger.transition(cur, batch_id, attempt, "refused", message=message)
        self.stages.drop(cur, batch_id, attempt)
        report.refused.append(f"{batch_id}#{attempt}")
        log.error("pipeline=%s %s", self.spec.name, message)

    def sealed(self, cur, batch_id: str, attempt: int) -> bool:
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

    def verify(self, cur, batch_id: str, attempt: int, report: MicroBatchReport):
        """The planned batch, its rows, checksum and the query of its accepted records, when what
        was staged is exactly what the ledger says the batch is; else the attempt is refused (None)."""
        planned = ledger.planned_batch(cur, batch_id)
        direct = planned.transport == "direct"  # staged by the extract's tasks: no record of the topic is its
        written = {} if direct else ledger.extract_offsets(cur, batch_id, attempt)
        bad, reasons = ledger.data_rejects(cur, self.consumer, batch_id, attempt, FIRST_REASONS, written)
        if bad:
            self.refuse(
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
            self.refuse(cur, batch_id, attempt, report,
                        "what the extract's tasks staged differs from its totals sealed in the ledger: "
                        + "; ".join(wrong.findings) + self._restart_since(cur, batch_id, attempt),
                        "a new attempt stages the batch afresh; unless a warehouse crash emptied the stage, find "
                        f"who else writes to {STAGE_SCHEMA} and revoke it")
            return None
        if wrong:
            self.refuse(cur, batch_id, attempt, report,
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
                self.refuse(cur, batch_id, attempt, report,
                            f"the stage holds {readable} accepted record(s), the staged totals and the ledger say "
                            f"{rows}" + self._restart_since(cur, batch_id, attempt),
                            "nothing of this attempt was applied and a new attempt stages its records afresh")
                return None
        return planned, rows, checksum, records

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
                self.reject(report, {"topic": self.spec.topic, "partition": p, "offset": offset, "key": None,
                                      "value": bytes(value) if value is not None else None,
                                      "batch_id": batch_id, "attempt": attempt},
                             f"record of batch {batch_id} attempt {attempt} at {self.spec.topic}/{p}@{offset}, key "
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

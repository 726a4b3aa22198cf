"""The nightly batch corrects a CDC pipeline's speed layer, in the transaction that commits it.

After the batch's rows are merged into the target:
1. **Drift**: a real-time version the batch target now holds at the same cursor with other values
   is a finding, both versions kept in ``tidemark_control.cdc_drift`` (reconciliation reports it).
2. **Deletions**: a key the change stream saw deleted leaves the batch target where the target's
   version is the deleted one or older (a nightly read cannot see a row that is gone); each row it
   deletes is kept in ``tidemark_control.cdc_batch_deletions``. Then every tombstone goes: its key
   has left the target, or the target holds a version newer than the deletion.
3. **Compaction**: a real-time version the batch target holds, or a newer one, goes (the batch is
   the truth for it now). A real-time row the batch does not hold stays: the serving view still
   needs it (a change the nightly window has not reached, or one it missed).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from tidemark import ledger
from tidemark.protocol.columns import target_columns
from tidemark.protocol.spec import PipelineSpec, quote

log = logging.getLogger("tidemark.sink")


@dataclass(frozen=True)
class Correction:
    drift: int  # keys whose real-time version disagreed with the batch at the same cursor
    deleted: int  # batch target rows deleted by a deletion the stream learned
    compacted: int  # real-time rows (versions and tombstones) removed

    def __str__(self) -> str:
        return (f"{self.compacted} real-time row(s) compacted away, {self.deleted} deletion(s) from the change stream "
                f"applied to the batch target (kept in tidemark_control.cdc_batch_deletions), {self.drift} drifted "
                "key(s) (kept in tidemark_control.cdc_drift)")


def correct(cur, spec: PipelineSpec, batch_id: str) -> Correction:
    cdc = spec.cdc
    assert cdc is not None
    target, live, cursor = quote(spec.target_table), quote(cdc.target_table), quote(spec.cursor.column)
    cur.execute("SELECT to_regclass(%s) IS NULL", (live,))
    if cur.fetchone()[0]:  # no real-time table yet (the supervisor makes it before the sink's first start)
        return Correction(0, 0, 0)
    in_live = {c.name for c in target_columns(cur, cdc.target_table)}
    names = [c.name for c in target_columns(cur, spec.target_table) if c.name in in_live]  # a column new to one: later
    same_key = " AND ".join(f"b.{quote(c)} = r.{quote(c)}" for c in spec.primary_key)
    key = "jsonb_build_array(" + ", ".join(f"b.{quote(c)}::text" for c in spec.primary_key) + ")"

    def row(alias: str) -> str:
        return "jsonb_build_object(" + ", ".join(f"'{n}', {alias}.{quote(n)}::text" for n in names) + ")"

    drift = ledger.record_drift(cur, spec.name, batch_id, f"""
        SELECT {key} AS key, {row('r')} AS realtime, {row('b')} AS batch
          FROM {live} r JOIN {target} b ON {same_key}
         WHERE NOT r._tm_deleted AND r.{cursor} = b.{cursor} AND {row('r')} <> {row('b')}""")
    deleted = ledger.keep_batch_deletions(cur, spec.name, batch_id, f"""
        DELETE FROM {target} b USING {live} r
         WHERE {same_key} AND r._tm_deleted AND b.{cursor} <= r.{cursor}
        RETURNING {key} AS key, {row('b')} AS old_values, r._tm_lsn AS lsn""")
    # every tombstone has done its work now: its key left the target, or the target holds a newer version
    cur.execute(f"""DELETE FROM {live} r
                     WHERE r._tm_deleted OR EXISTS (SELECT 1 FROM {target} b WHERE {same_key} AND b.{cursor} >= r.{cursor})""")
    done = Correction(drift, deleted, cur.rowcount)
    if drift or deleted:
        log.warning("pipeline=%s batch=%s corrected its speed layer: %s", spec.name, batch_id, done)
    return done

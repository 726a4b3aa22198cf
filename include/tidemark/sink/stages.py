"""The attempts' stage tables in the warehouse (schema ``tidemark_stage``): one per attempt, made
when its first record arrives, typed like the source and UNLOGGED under protocol version 2 (the
executors COPY into it, ``tidemark.batch.stage``), one text column under version 1 (the driver COPYs the
checked values); every row with its provenance (partition, offset, row hash). A stage lives until
its attempt commits, is refused or aborted, or a sweep finds its attempt finished."""

from __future__ import annotations

import logging

import psycopg2
import psycopg2.extensions

from tidemark import ledger
from tidemark.batch.stage import LOAD, OFFSET, PROVENANCE, STAGE_SCHEMA, copy_csv, create_typed, provenance, stage_table
from tidemark.protocol.avro import SourceColumn, sql_type
from tidemark.protocol.spec import PipelineSpec, quote
from tidemark.protocol.totals import arrow_totals

log = logging.getLogger("tidemark.sink")


class StageArea:
    """One pipeline's stage tables; the record schemas of its protocol-version-2 batches cached."""

    def __init__(self, spec: PipelineSpec):
        self.spec = spec
        self._schemas: dict[int, list[SourceColumn]] = {}  # protocol version 2: record schemas by version

    def format(self, cur, batch_id: str) -> tuple[int, list[SourceColumn]] | None:
        """A protocol-version-2 batch's schema version and source columns (None: version 1)."""
        planned = ledger.planned_batch(cur, batch_id)
        if planned is None or planned.schema_version is None:
            return None
        version = planned.schema_version
        if version not in self._schemas:
            self._schemas[version] = ledger.record_schema(cur, self.spec.name, version)[0]
        return version, self._schemas[version]

    def ensure(self, cur, batch_id: str, attempt: int) -> str:
        """The attempt's stage table, made if it is not there yet (its quoted name)."""
        fmt = self.format(cur, batch_id)
        if fmt is not None:  # typed like the source
            return create_typed(cur, batch_id, attempt, [(c.name, sql_type(c.sql_type)) for c in fmt[1]])
        stage = quote(stage_table(batch_id, attempt))
        cur.execute(f"CREATE TABLE IF NOT EXISTS {stage} (value text, "
                    + ", ".join(f"{c} {t}" for c, t in PROVENANCE) + ")")
        return stage

    def drop(self, cur, batch_id: str, attempt: int) -> None:
        cur.execute(f"DROP TABLE IF EXISTS {quote(stage_table(batch_id, attempt))}")
        ledger.forget_staged(cur, batch_id, attempt)

    def accepted(self, cur, batch_id: str, attempt: int) -> str:
        """SQL condition on the attempt's stage rows that count: under version 2 those of accepted
        loads only (``tidemark.batch.stage``), under version 1 all."""
        if self.format(cur, batch_id) is None:
            return "true"
        loads = cur.mogrify("SELECT load FROM tidemark_control.staged_loads WHERE batch_id = %s AND attempt = %s",
                            (batch_id, attempt)).decode(psycopg2.extensions.encodings[cur.connection.encoding])
        return f"({LOAD} IS NULL OR {LOAD} IN ({loads}))"

    def records(self, cur, batch_id: str, attempt: int) -> str:
        """SQL reading the attempt's staged records as rows of the target's type."""
        # An empty window sends no records, so its stage table may not exist yet.
        stage = self.ensure(cur, batch_id, attempt)
        fmt = self.format(cur, batch_id)
        if fmt is not None:  # typed already: nothing to parse. Only accepted loads count (tidemark.batch.stage)
            cols = ", ".join(quote(c.name) for c in fmt[1])
            return f"SELECT {cols} FROM {stage} WHERE {self.accepted(cur, batch_id, attempt)}"
        # json, not jsonb: parsing straight into the record is about twice as fast.
        return (f"SELECT r.* FROM {stage} s, "
                f"LATERAL json_populate_record(NULL::{quote(self.spec.target_table)}, s.value::json) r")

    def copy_in(self, cur, batch_id: str, attempt: int, records) -> None:
        """Protocol version 1: COPY checked records' values (and provenance) into the attempt's stage,
        adding them to its running per-partition counts and checksums."""
        import pyarrow as pa

        stage = self.ensure(cur, batch_id, attempt)
        # checked UTF-8 already: Arrow's cast, not a Python loop
        columns = {"value": records["value"].cast(pa.string()),
                   **{c: a for (c, _), a in zip(PROVENANCE, provenance(records))}}
        copy_csv(cur, stage, pa.table(list(columns.values()), names=list(columns)), ["value", *(c for c, _ in PROVENANCE)])
        for p, t in arrow_totals(records).items():
            ledger.add_staged(cur, batch_id, attempt, p, t["rows"], t["checksum"])

    def sweep(self, cur) -> list[str]:
        """Drop the stage tables of this pipeline's attempts that can no longer be applied (aborted,
        refused, superseded or committed while their stage outlived them, e.g. after a killed run).
        A protocol-version-2 stage an earlier version made (its driver staged in its own committed
        transactions, without load ids) gets the load column: its rows, with none, all count."""
        cur.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", (STAGE_SCHEMA,))
        present = {f"{STAGE_SCHEMA}.{name}" for (name,) in cur.fetchall()}
        if not present:
            return []
        for batch_id, attempt in ledger.open_formats(cur, self.spec.name):
            stage = stage_table(batch_id, attempt)
            if stage not in present:
                continue
            cur.execute("SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attname = %s",
                        (stage, LOAD.strip('"')))
            if cur.fetchone() is None:
                cur.execute(f"ALTER TABLE {quote(stage)} ADD COLUMN {LOAD} bigint")
                log.warning("pipeline=%s batch=%s attempt=%s: stage %s, from an earlier version, gained the "
                            "load column", self.spec.name, batch_id, attempt, stage)
        for batch_id, attempt in ledger.open_windows(cur, self.spec.name):
            stage = stage_table(batch_id, attempt)
            cur.execute("SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attname = %s",
                        (stage, OFFSET.strip('"')))
            if stage in present and cur.fetchone() is None:  # rows without: the apply keeps them all
                cur.execute(f"ALTER TABLE {quote(stage)} "
                            + ", ".join(f"ADD COLUMN {c} {t}" for c, t in PROVENANCE))
        dead = [(b, a, st) for b, a, st in ledger.finished_attempts(cur, self.spec.name)
                if stage_table(b, a) in present]
        for batch_id, attempt, state in dead:
            cur.execute("SELECT pg_total_relation_size(to_regclass(%s))", (stage_table(batch_id, attempt),))
            size = cur.fetchone()[0] or 0  # dropped meanwhile: nothing to free
            self.drop(cur, batch_id, attempt)
            log.warning("pipeline=%s batch=%s attempt=%s is %s: dropped its leftover stage table %s (%.1f MB)",
                        self.spec.name, batch_id, attempt, state, stage_table(batch_id, attempt), size / 1e6)
        return [stage_table(b, a) for b, a, _ in dead]

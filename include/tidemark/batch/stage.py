"""Staging on the executors (protocol version 2): each Spark task COPYs the good records it read
into their attempt's stage table, in its own transaction, and hands the sink's driver only totals.

Every row a task stages for an attempt carries that task's *load* id for the attempt (column
``LOAD``), a number from the warehouse's sequence ``tidemark_control.stage_loads``. The driver's one micro-batch transaction records the
loads it accepts (``ledger.add_loads``) together with their per-partition totals, and the apply
reads only recorded loads. So the rows of a load whose micro-batch never committed (the sink
killed before its commit, a Spark task retried after its COPY committed, a fenced zombie) are
never applied: they go when the stage table is dropped.

Whatever a task does not stage passes through to the driver unchanged: control messages,
rejected records (``reason`` set), records of other attempts or of protocol version 1, events,
and records below the stored offsets (a replay). A COPY the stage's types refuse is not a crash:
the task splits the records in halves until each refused one stands alone (at most ``MAX_COPIES``
refused COPYs), stages the others, and hands the refused ones back with the refusal as their reason (dead
letters): a foreign record never takes the genuine records of its task down with it.

This module runs on the executors: it needs pyarrow and psycopg2 there, and nothing of Spark.
"""

from __future__ import annotations

import hashlib
import io
import time
from dataclasses import dataclass
from typing import Any, Iterator

from tidemark.protocol.pgbinary import Unencodable, copy_binary
from tidemark.protocol.totals import arrow_totals

STAGE_SCHEMA = "tidemark_stage"


def stage_table(batch_id: str, attempt: int) -> str:
    """The table holding one attempt's records until it is applied: a name fit for any batch id."""
    return f"{STAGE_SCHEMA}.s_{hashlib.sha1(f'{batch_id}#{attempt}'.encode()).hexdigest()[:24]}"


def rows_inserted(cur, batch_id: str, attempt: int) -> int:
    """Rows written into the attempt's stage so far, from PostgreSQL's statistics (no scan of a
    growing stage; a COPY that rolled back counts too, so an estimate): 0 when it has none."""
    cur.execute("SELECT coalesce((SELECT n_tup_ins FROM pg_stat_user_tables WHERE relid = to_regclass(%s)), 0)",
                (stage_table(batch_id, attempt),))
    return cur.fetchone()[0]


# The stage tables' column naming the load each row came with (quoted): a dot, so no source column
# (a valid Avro field name under protocol version 2) can ever have its name.
LOAD = '"tidemark.load"'
# Where each staged row came from (partition, offset) and its row hash: the apply keeps only the rows
# inside the offsets the extract wrote, dead-letters the others, and totals what it keeps.
PARTITION, OFFSET, HASH = '"tidemark.partition"', '"tidemark.offset"', '"tidemark.hash"'
PROVENANCE = ((PARTITION, "integer"), (OFFSET, "bigint"), (HASH, "bigint"))
# How many refused COPYs a task spends isolating the records its stage refuses (each refused COPY
# tries its two halves: at most 2 * MAX_COPIES + 1 COPYs in all); past it, what is left unisolated
# goes back whole, with the refusal as its reason.
MAX_COPIES = 64


def load_schema():
    """What a task reports per (attempt, partition) it staged, appended to the records' own columns:
    the load's id, its rows, their checksum (decimal text: a sum of 64-bit hashes), the first
    offset staged (the row's ``offset`` is the last) and the seconds the COPY took."""
    import pyarrow as pa

    return pa.schema([("load", pa.int64()), ("load_rows", pa.int64()), ("load_checksum", pa.string()),
                      ("load_first", pa.int64()), ("load_seconds", pa.float64())])


@dataclass(frozen=True)
class Target:
    """Where an open attempt's records go: its stage table and the decoded row's column."""
    stage: str  # quoted, qualified table name
    row: str  # the column holding the decoded row (``tidemark.protocol.avro.row_column``)
    columns: tuple[str, ...]  # the row's fields as quoted column names, in the row's order
    types: tuple[str, ...]  # their SQL types (PostgreSQL's format_type), as the stage declares them

    @classmethod
    def of(cls, stage: str, version: int, columns) -> "Target":
        """The target of a typed stage: ``columns`` are the record schema's (``name``, ``sql_type``)."""
        from tidemark.protocol.avro import row_column
        from tidemark.protocol.spec import quote

        return cls(stage, row_column(version), tuple(quote(c.name) for c in columns),
                   tuple(c.sql_type for c in columns))

    def copy_columns(self) -> tuple[list[str], list[str]]:
        """Every column a COPY into the stage fills and its SQL type, in ``create_typed``'s order:
        the row's fields, the load, then PROVENANCE's."""
        return ([*self.columns, LOAD, *(c for c, _ in PROVENANCE)],
                [*self.types, "bigint", *(t for _, t in PROVENANCE)])


class StageWriter:
    """The ``mapInArrow`` function: stages the good records of ``targets`` ((batch id, attempt) ->
    ``Target``) from ``topic`` at or after ``next_offsets`` (partition -> next offset the sink
    stored); yields everything else, then one row per staged (attempt, partition) with its totals."""

    def __init__(self, connect: dict[str, Any], topic: str, targets: dict[tuple[str, int], Target],
                 next_offsets: dict[int, int]):
        self._connect = connect  # psycopg2.connect keywords, password included: never printed
        self.topic = topic
        self.targets = targets
        self.next_offsets = next_offsets

    def __repr__(self) -> str:
        return f"StageWriter(topic={self.topic!r}, attempts={sorted(self.targets)})"

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow.compute as pc

        held: dict[tuple[str, int], list[Any]] = {}
        schema = None
        for batch in batches:
            schema = batch.schema
            mine = self._stageable(batch)
            if mine is None:
                yield _with_load(batch, None)
                continue
            rest = batch.filter(pc.invert(mine))
            if rest.num_rows:
                yield _with_load(rest, None)
            for key in self.targets:
                part = batch.filter(pc.and_(mine, _of(batch, key)))
                if part.num_rows:
                    held.setdefault(key, []).append(part)
        if held:
            yield from self._stage(held, schema)

    def _stageable(self, batch):
        """Which records of ``batch`` this task stages (None: none)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if not self.targets or "checked" not in batch.schema.names:
            return None
        ours = pc.and_(pc.equal(batch["topic"], self.topic), pc.is_null(batch["control"]))
        good = pc.and_(pc.fill_null(batch["checked"], False), pc.is_null(batch["reason"]))
        attempt = None
        for key in self.targets:
            this = _of(batch, key)
            attempt = this if attempt is None else pc.or_(attempt, this)
        partitions = batch["partition"]
        top = pc.max(partitions).as_py()
        if top is None:
            return None
        floor = pa.array([self.next_offsets.get(p, 0) for p in range(top + 1)], pa.int64())
        fresh = pc.greater_equal(batch["offset"], pc.take(floor, partitions))
        mine = pc.fill_null(pc.and_(pc.and_(ours, good), pc.and_(attempt, fresh)), False)
        return mine if pc.any(mine).as_py() else None

    def _stage(self, held: dict[tuple[str, int], list[Any]], schema) -> Iterator[Any]:
        import psycopg2
        import pyarrow as pa

        conn = psycopg2.connect(**self._connect)
        try:
            with conn, conn.cursor() as cur:
                for key, parts in held.items():
                    records = pa.Table.from_batches(parts, schema=schema)
                    target = self.targets[key]
                    started = time.perf_counter()
                    cur.execute("SELECT nextval('tidemark_control.stage_loads')")
                    (load,) = cur.fetchone()
                    staged, refused = _copy_isolating(cur, target, records, load, [MAX_COPIES])
                    for part, (what, refusal) in refused:  # dead letters, never a crash loop
                        why = f"the typed stage refused {what} of batch {key[0]} attempt {key[1]}: {refusal}"
                        for batch in part.to_batches():
                            at = batch.schema.get_field_index("reason")
                            yield _with_load(batch.set_column(at, batch.schema.field(at),
                                                              pa.array([why] * batch.num_rows, batch.schema.field(at).type)),
                                             None)
                    if staged:
                        yield _load_rows(pa.concat_tables(staged), key, load, time.perf_counter() - started)
        finally:
            conn.close()


def create_typed(cur, batch_id: str, attempt: int, columns: list[tuple[str, str]]) -> str:
    """The attempt's typed stage table (protocol version 2), made if it is not there yet: ``columns``
    are the record schema's (name, SQL type); UNLOGGED, it lives only until its batch commits or is
    refused. Returns its quoted name."""
    from tidemark.protocol.spec import quote

    stage = quote(stage_table(batch_id, attempt))
    cols = ", ".join(f"{quote(name)} {kind}" for name, kind in columns)
    where = ", ".join(f"{c} {t}" for c, t in PROVENANCE)
    cur.execute(f"CREATE UNLOGGED TABLE IF NOT EXISTS {stage} ({cols}, {LOAD} bigint, {where})")
    return stage


# How a direct extract's task says a COPY of its rows was refused: it fails with this Java exception
# (stack/java/udf/src/main/java/tidemark/StageRefused.java, whose JUnit test reads this line), whose name
# the extract finds in the Spark error and turns into its exit 3, quoting the message after it.
STAGE_REFUSED_CLASS = "tidemark.StageRefused"


def _copy_isolating(cur, target: Target, records, load: int, budget: list[int]):
    """COPY ``records`` into the stage; where the stage's types refuse them, halve and retry until
    each refused record stands alone or ``budget`` (refused COPYs left, shared) runs out. Returns (the
    tables staged, [(a refused table, (what it is, the refusal))])."""
    import psycopg2

    cur.execute("SAVEPOINT stage")
    try:
        _copy_rows(cur, target, records[target.row].combine_chunks(), load, provenance(records))
    except (psycopg2.DataError, psycopg2.IntegrityError, Unencodable) as exc:
        cur.execute("ROLLBACK TO SAVEPOINT stage")
        budget[0] -= 1
        refusal = " ".join(str(exc).split())[:500]
        if records.num_rows == 1:
            return [], [(records, ("this record", refusal))]
        if budget[0] <= 0:
            return [], [(records, (f"these {records.num_rows} records (not isolated further: more than {MAX_COPIES} "
                                   "refused COPYs in this task)", refusal))]
        half = records.num_rows // 2
        first, second = (_copy_isolating(cur, target, part, load, budget)
                         for part in (records.slice(0, half), records.slice(half)))
        return first[0] + second[0], first[1] + second[1]
    cur.execute("RELEASE SAVEPOINT stage")
    return [records], []


def _copy_rows(cur, target: Target, rows, load: int, provenance: list[Any]) -> None:
    """COPY ``rows`` (the decoded row's struct array) into the stage under ``load``, with their
    ``provenance`` arrays (PROVENANCE's order). Binary: the server stores each value as sent."""
    import pyarrow as pa

    columns, types = target.copy_columns()
    copy_binary(cur, target.stage, [*rows.flatten(), pa.array([load] * len(rows), pa.int64()), *provenance],
                types, columns)


def provenance(records) -> list[Any]:
    """The records' partition, offset and row hash, typed as PROVENANCE declares them."""
    import pyarrow as pa

    return [records[c].combine_chunks().cast(t) for c, t in
            (("partition", pa.int32()), ("offset", pa.int64()), ("row_hash", pa.int64()))]


def _of(batch, key: tuple[str, int]):
    import pyarrow.compute as pc

    return pc.fill_null(pc.and_(pc.equal(batch["batch_id"], key[0]), pc.equal(batch["attempt"], key[1])), False)


def _with_load(batch, values: dict[str, Any] | None):
    """``batch`` with the load columns appended (nulls for records passed through)."""
    import pyarrow as pa

    n = batch.num_rows
    values = values or {}
    fields = load_schema()
    arrays = [*batch.columns, *(pa.array(values.get(f.name, [None] * n), f.type) for f in fields)]
    return pa.RecordBatch.from_arrays(arrays, names=[*batch.schema.names, *fields.names])


def _load_rows(records, key: tuple[str, int], load: int, seconds: float):
    """One row per partition of a staged load: the records' columns null but topic, partition,
    offset (the last staged), batch id and attempt; the load's id, rows, checksum, first offset."""
    import pyarrow as pa

    totals = arrow_totals(records)
    first = {g["partition"]: (g["offset_min"], g["offset_max"]) for g in
             pa.table({"partition": records["partition"], "offset": records["offset"]})
             .group_by("partition").aggregate([("offset", "min"), ("offset", "max")]).to_pylist()}
    parts = sorted(totals)
    n = len(parts)
    given = {"topic": pa.array([records["topic"][0].as_py()] * n, records.schema.field("topic").type),
             "partition": pa.array(parts, records.schema.field("partition").type),
             "offset": pa.array([first[p][1] for p in parts], records.schema.field("offset").type),
             "batch_id": pa.array([key[0]] * n, records.schema.field("batch_id").type),
             "attempt": pa.array([key[1]] * n, records.schema.field("attempt").type)}
    columns = [given.get(f.name, pa.nulls(n, f.type)) for f in records.schema]
    batch = pa.RecordBatch.from_arrays(columns, schema=records.schema)
    return _with_load(batch, {"load": [load] * n, "load_rows": [totals[p]["rows"] for p in parts],
                              "load_checksum": [str(totals[p]["checksum"]) for p in parts],
                              "load_first": [first[p][0] for p in parts], "load_seconds": [seconds] * n})


def copy_csv(cur, table_name: str, table, columns: list[str]) -> None:
    """COPY an Arrow table into ``columns`` (quoted names, in the table's order) of a table (CSV:
    NULL unquoted and empty, an empty string quoted)."""
    import pyarrow.csv as pacsv

    buf = io.BytesIO()
    pacsv.write_csv(table, buf, pacsv.WriteOptions(include_header=False, quoting_style="needed"))
    buf.seek(0)
    cur.copy_expert(f"COPY {table_name} ({', '.join(columns)}) FROM STDIN WITH (FORMAT csv)", buf)


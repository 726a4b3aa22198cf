"""Protocol version 2's record format: each data record's value is its source row in Avro binary.

The writer schema comes from the source table's columns (``schema``), decimals as Avro decimals
with the column's precision and scale, timestamps as UTC microseconds, and is kept in the
warehouse's control schema under a version per pipeline (``tidemark.ledger.register_schema``);
BEGIN names that version. Between two batches the columns may only grow (``drift``): an added
column gets a new schema version and is added to the target in the apply transaction; any other
change is refused with both schemas in the message. The target must hold every source column
without loss (``fit``), checked once per batch instead of once per value.

``encode`` (the extract) and ``decode`` (the sink) are the Spark side: both run in the JVM, and
the sink's checks of a version-2 record are column expressions (decoded, key equals the row's
primary key, cursor inside the window, text PostgreSQL can hold), not Python per record.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from tidemark.protocol.errors import Terminal
from tidemark.protocol.window import Window

RECORD_NAME = "row"
NAMESPACE = "tidemark"
_INTS = {"smallint": "int", "integer": "int", "bigint": "long"}
_TEXT = re.compile(r"^(text|character varying(\(\d+\))?|character(\(\d+\))?|uuid|json|jsonb)$")
_NUMERIC = re.compile(r"^numeric\((\d+),(\d+)\)$")
_VARCHAR = re.compile(r"^character varying\((\d+)\)$")


class SchemaError(Terminal, ValueError):
    """Columns that protocol version 2 cannot carry exactly, or a change it cannot follow."""


@dataclass(frozen=True)
class SourceColumn:
    name: str
    sql_type: str  # PostgreSQL's format_type, e.g. "numeric(18,2)", "timestamp with time zone"
    not_null: bool

    def to_json(self) -> list[Any]:
        return [self.name, self.sql_type, self.not_null]


def columns_from_json(raw: list[list[Any]]) -> list[SourceColumn]:
    return [SourceColumn(str(n), str(t), bool(nn)) for n, t, nn in raw]


def _avro_type(column: SourceColumn) -> Any:
    t = column.sql_type
    if t in _INTS:
        return _INTS[t]
    if t == "boolean":
        return "boolean"
    if t == "double precision":
        return "double"
    if t == "real":
        return "float"
    if (m := _NUMERIC.match(t)) is not None:
        return {"type": "bytes", "logicalType": "decimal", "precision": int(m[1]), "scale": int(m[2])}
    if t == "timestamp with time zone":
        return {"type": "long", "logicalType": "timestamp-micros"}
    if t == "date":
        return {"type": "int", "logicalType": "date"}
    if _TEXT.match(t):
        return "string"
    why = {"numeric": "a numeric without precision and scale has no exact Avro decimal; declare numeric(p,s)",
           "timestamp without time zone": "a timestamp without time zone has no instant to carry; use "
                                          "timestamp with time zone"}.get(t, "no exact Avro type for it here")
    raise SchemaError(f"column {column.name!r} ({t}): {why}")


def sql_type(text: str) -> str:
    """A registered column's SQL type, for DDL: only the types this format carries pass."""
    _avro_type(SourceColumn("?", text, False))
    return text


def schema(columns: list[SourceColumn], required: set[str]) -> str:
    """The Avro writer schema (JSON) of a row of ``columns``. ``required``: columns never null in a
    record (the primary key and cursor), whatever the source declares."""
    problems, fields = [], []
    for c in columns:
        try:
            avro = _avro_type(c)
        except SchemaError as exc:
            problems.append(str(exc))
            continue
        if c.not_null or c.name in required:
            fields.append({"name": c.name, "type": avro})
        else:
            fields.append({"name": c.name, "type": ["null", avro], "default": None})
    if problems:
        raise SchemaError("; ".join(problems))
    for f in fields:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", f["name"]):
            raise SchemaError(f"column {f['name']!r}: not a valid Avro field name (letters, digits, _)")
    return json.dumps({"type": "record", "name": RECORD_NAME, "namespace": NAMESPACE, "fields": fields},
                      separators=(",", ":"))


def describe(columns: list[SourceColumn]) -> str:
    return "(" + ", ".join(f"{c.name} {c.sql_type}{' NOT NULL' if c.not_null else ''}" for c in columns) + ")"


def drift(old: list[SourceColumn], new: list[SourceColumn]) -> list[SourceColumn]:
    """The columns ``new`` adds to ``old`` (a new schema version, as is one that widened a column), or
    ``SchemaError`` naming both schemas when a column was dropped, renamed, changed its nullability or
    its type other than by widening it."""
    before = {c.name: c for c in old}
    changed = [f"{c.name}: {before[c.name].sql_type}{' NOT NULL' if before[c.name].not_null else ''} -> "
               f"{c.sql_type}{' NOT NULL' if c.not_null else ''}"
               for c in new if c.name in before and before[c.name] != c and not widened(before[c.name], c)]
    dropped = [n for n in before if n not in {c.name for c in new}]
    if changed or dropped:
        raise SchemaError(
            "the source's columns changed in a way a load cannot follow ("
            + "; ".join([*(f"changed {x}" for x in changed), *(f"dropped {n}" for n in dropped)])
            + f"). Registered schema: {describe(old)}; source now: {describe(new)}")
    return [c for c in new if c.name not in before]


def widens(narrow: str, wide: str) -> bool:
    """Whether type ``wide`` holds every value of type ``narrow`` exactly and more (varchar(20) ->
    varchar(50), integer -> bigint, numeric(10,2) -> numeric(12,2)): a column can be widened to it."""
    return not _holds(narrow, wide) and _holds(wide, narrow)


def widened(old: SourceColumn, new: SourceColumn) -> bool:
    """Whether ``new`` is ``old`` widened (``widens``), its nullability kept."""
    return old.not_null == new.not_null and widens(old.sql_type, new.sql_type)


def _holds(target: str, source: str) -> bool:
    """Whether a target column of type ``target`` holds every value of ``source`` exactly."""
    if target == source:
        return True
    widen = {"smallint": ("integer", "bigint", "numeric"), "integer": ("bigint", "numeric"), "bigint": ("numeric",),
             "real": ("double precision",)}
    if target in widen.get(source, ()):
        return True
    if (s := _NUMERIC.match(source)) and (t := _NUMERIC.match(target)):
        return int(t[2]) >= int(s[2]) and int(t[1]) - int(t[2]) >= int(s[1]) - int(s[2])
    if (s := _NUMERIC.match(source)) and target == "numeric":
        return True
    if source.startswith("character varying") or source == "text":
        if target == "text" or (target == "character varying" and source.startswith("character varying")):
            return True
        return bool((t := _VARCHAR.match(target)) and (s := _VARCHAR.match(source)) and int(t[1]) >= int(s[1]))
    return False


def fit(columns: list[SourceColumn], target: list[SourceColumn], table: str,
        registered: list[SourceColumn] = ()) -> tuple[list[SourceColumn], list[SourceColumn]]:
    """The source columns the target lacks, and those the source widened (``widens``) since the
    ``registered`` schema where the target still has the registered type (it followed the source:
    both changed in the apply transaction); else ``SchemaError`` naming each column the target
    cannot hold exactly, with both types. A target made narrower than the source is never widened."""
    have, before = {c.name: c for c in target}, {c.name: c.sql_type for c in registered}
    short = [c for c in columns if c.name in have and not _holds(have[c.name].sql_type, c.sql_type)]
    followed = [c for c in short if before.get(c.name) == have[c.name].sql_type and widens(before[c.name], c.sql_type)]
    narrow = [f"{c.name}: source {c.sql_type}, target {have[c.name].sql_type}" for c in short if c not in followed]
    if narrow:
        raise SchemaError(f"target {table} cannot hold every source value exactly ({'; '.join(narrow)}). "
                          f"Source: {describe(columns)}; target: {describe(target)}")
    return [c for c in columns if c.name not in have], followed


# --- Spark ----------------------------------------------------------------------------------------

# Spark's to_json of a row: microsecond timestamps with their offset, null fields left out
JSON_OPTIONS = {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX", "ignoreNullFields": "true"}

def record_key(pk_columns: list[Any]):
    """The Kafka key of a row: its one key column as text, or the JSON object of its key columns.
    ``pk_columns``: Spark columns, in the spec's order. The extract and the sink's check share it."""
    from pyspark.sql import functions as F

    return pk_columns[0].cast("string") if len(pk_columns) == 1 else F.to_json(F.struct(*pk_columns), JSON_OPTIONS)


def encode(writer_schema: str):
    """Spark column: the Avro value of a row read from the source, in the schema's field order
    (columns the schema does not name, e.g. added since the plan, are not written)."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import to_avro

    names = [f["name"] for f in json.loads(writer_schema)["fields"]]
    return to_avro(F.struct(*[F.col(n) for n in names]), writer_schema)


@dataclass(frozen=True)
class Format:
    """How the records of one open attempt travel: its schema version, columns and window."""

    version: int
    columns: list[SourceColumn]
    writer_schema: str
    window: Window


def row_column(version: int) -> str:
    return f"row_v{version}"


def decode(df, formats: dict[tuple[str, int], Format], topic: str, primary_key: list[str], cursor_column: str,
           max_bytes: int):
    """``df`` (the sink's records) with a ``row_v<N>`` column per schema version of ``formats``
    (the decoded row, set on that version's data records) and ``reason`` (why a record cannot be
    staged, or null) and ``checked`` (true on every record decoded here)."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    is_data = (F.col("topic") == F.lit(topic)) & F.col("control").isNull()
    reason = F.lit(None).cast("string")
    checked = F.lit(False)
    by_version: dict[int, list[tuple[tuple[str, int], Format]]] = {}
    for attempt, fmt in formats.items():
        by_version.setdefault(fmt.version, []).append((attempt, fmt))
    for version, attempts in sorted(by_version.items()):
        fmt = attempts[0][1]
        mine = F.lit(False)
        for (batch_id, attempt), _ in attempts:
            mine = mine | ((F.col("batch_id") == F.lit(batch_id)) & (F.col("attempt") == F.lit(attempt)))
        mine = is_data & mine
        name = row_column(version)
        df = df.withColumn(name, F.when(mine & F.col("value").isNotNull(),
                                        from_avro(F.col("value"), fmt.writer_schema, {"mode": "PERMISSIVE"})))
        row = F.col(name)
        required = [c.name for c in fmt.columns if c.not_null or c.name in (*primary_key, cursor_column)]
        undecoded = F.lit(False)
        for c in required:
            undecoded = undecoded | row[c].isNull()
        key = record_key([row[c] for c in primary_key])
        window_reason = F.lit(None).cast("string")
        for (batch_id, attempt), f in reversed(attempts):
            this = (F.col("batch_id") == F.lit(batch_id)) & (F.col("attempt") == F.lit(attempt))
            outside = ~inside(row, f.window, primary_key, cursor_column)
            window_reason = F.when(this & outside, F.format_string(
                f"cursor {cursor_column}=%s (key %s) lies outside the batch's window {f.window}",
                row[cursor_column].cast("string"), key)).otherwise(window_reason)
        texts = [c.name for c in fmt.columns if _TEXT.match(c.sql_type)]
        bad_text = F.lit(None).cast("string")
        for c in reversed(texts):
            bad_text = (F.when(~F.call_function("is_valid_utf8", row[c]), F.lit(f"field {c!r}: not valid UTF-8"))
                        .when(F.instr(row[c], "\u0000") > 0,
                              F.lit(f"field {c!r}: contains a NUL character, which PostgreSQL text cannot hold"))
                        .otherwise(bad_text))
        why = (F.when(F.col("value").isNull(), F.lit("record without a value"))
               .when(F.length(F.col("value")) > max_bytes,
                     F.format_string(f"value of %d bytes exceeds max_record_bytes {max_bytes}", F.length("value")))
               .when(undecoded, F.lit(f"value is not an Avro record of schema version {version} "
                                      f"(or lacks a required field: {', '.join(required)})"))
               .when(F.col("key").isNull(), F.lit("record without a key"))
               .when(F.col("key").cast("string") != key,
                     F.format_string("key %s does not match the primary key in the value %s",
                                     F.col("key").cast("string"), key))
               .otherwise(F.coalesce(bad_text, window_reason)))
        reason = F.when(mine, why).otherwise(reason)
        checked = checked | mine
    # The bytes stay: the executors stage the good records (tidemark.batch.stage), and a record the stage
    # refuses goes to the dead-letter topic whole.
    return df.withColumn("reason", reason).withColumn("checked", checked)


def inside(row, window: Window, primary_key: list[str], cursor_column: str):
    """Spark condition: the decoded row lies in ``window`` (``lo < (cursor, key) <= hi``). Where a
    bound carries a key that is not all integers, the row at the bound's cursor is taken as
    inside: text orders by the source's collation, and the extract's predicate already chose."""
    from pyspark.sql import functions as F

    cursor = row[cursor_column]
    lo, hi = window.lo, window.hi
    after_lo = cursor > F.lit(lo.cursor)
    if lo.pk is not None:
        after_lo = after_lo | ((cursor == F.lit(lo.cursor)) & _key_after(row, primary_key, lo.pk, undecided=True))
    upto_hi = cursor < F.lit(hi.cursor)
    if hi.pk is None:
        upto_hi = cursor <= F.lit(hi.cursor)
    else:
        upto_hi = upto_hi | ((cursor == F.lit(hi.cursor)) & ~_key_after(row, primary_key, hi.pk, undecided=False))
    return after_lo & upto_hi


def _key_after(row, primary_key: list[str], bound: tuple[Any, ...], *, undecided: bool):
    """Spark condition: the row's key sorts strictly after ``bound`` (``undecided`` where only the
    source can tell)."""
    from pyspark.sql import functions as F

    if not all(isinstance(v, int) and not isinstance(v, bool) for v in bound):
        return F.lit(undecided)
    after = F.lit(False)
    for name, value in reversed(list(zip(primary_key, bound))):
        after = (row[name] > F.lit(value)) | ((row[name] == F.lit(value)) & after)
    return after

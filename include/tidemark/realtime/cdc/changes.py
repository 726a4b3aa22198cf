"""Debezium's records, read without trusting them: change events and transaction boundaries.

Both arrive as Kafka Connect JSON with their schema (``{"schema": ..., "payload": ...}``). A change
event becomes a ``Change``: its source transaction (``source.txId``) and place in it
(``transaction.total_order``), its WAL position, the operation and the row (after an insert or
update, before a delete) as PostgreSQL text input, each value converted by its field's Debezium
type (days, microseconds and base64 become dates, timestamps and bytea), and the source's schema
compared with the real-time table's: a column added or widened (``widens``: varchar(20) to
varchar(50), integer to bigint) comes with the change, to be added or widened before it applies; a
column dropped, renamed, narrowed or otherwise retyped is refused with both schemas. A boundary becomes a
``Boundary``: BEGIN, or END with the transaction's commit position and event count. Anything else
raises ``ValueError`` naming what is wrong; the sink makes it a dead letter.

Debezium's PostgreSQL transaction id is ``<txId>:<lsn>`` with each event's own LSN, so events are
grouped by ``source.txId``; an END's LSN is the transaction's commit position.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Any

OPS = {"c": "insert", "u": "update", "d": "delete", "r": "snapshot read"}
IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,62}")  # a column name the sink adds (quoted all the same; not _tm_*)
_EPOCH = datetime(1970, 1, 1)


def lsn_text(lsn: int) -> str:
    """PostgreSQL's own spelling of a WAL position (as pg_replication_slots shows it)."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


@dataclass(frozen=True)
class Shape:
    """A column's type as the source declares it (Debezium's ``column.propagate.source.type``
    parameters: ``INT8``, ``NUMERIC`` 18 2, ``VARCHAR`` 20), or as the real-time table has it."""

    type: str
    length: int | None = None  # NUMERIC's precision, VARCHAR's and BPCHAR's length; None: unconstrained
    scale: int | None = None  # NUMERIC only

    def ddl(self) -> str:
        base = DDL_TYPES[self.type]
        if self.type == "NUMERIC" and self.length is not None:
            return f"numeric({self.length},{self.scale or 0})"
        return f"{base}({self.length})" if self.type in ("VARCHAR", "BPCHAR") and self.length is not None else base

    def __str__(self) -> str:
        return self.ddl() if self.type in DDL_TYPES else self.type.lower()


# The source types whose columns the sink adds by itself, as PostgreSQL's DDL spells them, and as
# information_schema.columns names them (the real-time table's side of the comparison).
DDL_TYPES = {"INT2": "smallint", "INT4": "integer", "INT8": "bigint", "TEXT": "text", "BOOL": "boolean",
             "DATE": "date", "TIMESTAMP": "timestamp", "TIMESTAMPTZ": "timestamptz", "FLOAT4": "real",
             "FLOAT8": "double precision", "JSON": "json", "JSONB": "jsonb", "UUID": "uuid", "BYTEA": "bytea",
             "TIME": "time", "NUMERIC": "numeric", "VARCHAR": "varchar", "BPCHAR": "char"}
INFORMATION_SCHEMA_TYPES = {
    "smallint": "INT2", "integer": "INT4", "bigint": "INT8", "text": "TEXT", "boolean": "BOOL", "date": "DATE",
    "timestamp without time zone": "TIMESTAMP", "timestamp with time zone": "TIMESTAMPTZ", "real": "FLOAT4",
    "double precision": "FLOAT8", "json": "JSON", "jsonb": "JSONB", "uuid": "UUID", "bytea": "BYTEA",
    "time without time zone": "TIME", "numeric": "NUMERIC", "character varying": "VARCHAR", "character": "BPCHAR"}
_SIZED = ("NUMERIC", "VARCHAR", "BPCHAR")


def shape_of_column(data_type: str, precision: int | None, scale: int | None, max_length: int | None) -> Shape | None:
    """A real-time table column's shape (None: a type compared by name only is not one Tidemark knows)."""
    name = INFORMATION_SCHEMA_TYPES.get(data_type)
    if name is None:
        return None
    if name == "NUMERIC":
        return Shape(name, precision, scale if precision is not None else None)
    return Shape(name, max_length) if name in _SIZED else Shape(name)


def shape_of_field(field: dict[str, Any]) -> Shape | None:
    """The source's declared type of a field (None: the record carries no such parameters)."""
    params = field.get("parameters") if isinstance(field.get("parameters"), dict) else {}
    name = params.get("__debezium.source.column.type")
    if not isinstance(name, str) or not name:
        return None
    name = name.upper()
    if name not in _SIZED:
        return Shape(name)
    try:
        length = int(params.get("__debezium.source.column.length"))
        scale = int(params.get("__debezium.source.column.scale", 0))
    except (TypeError, ValueError, OverflowError):
        return Shape(name)
    if name == "NUMERIC":  # unconstrained: PostgreSQL reports a precision of 0 or its internal maximum
        return Shape(name, length, scale) if 0 < length <= 1000 and 0 <= scale <= length else Shape(name)
    return Shape(name, length) if 0 < length <= 10_485_760 else Shape(name)


# the lossless widenings: every value of the first type is a value of the second, unchanged
_WIDER = {"INT2": ("INT4", "INT8"), "INT4": ("INT8",), "VARCHAR": ("TEXT",)}


def widens(table: Shape | None, source: Shape | None) -> bool:
    """Whether the source's type holds every value of the real-time table's, unchanged: the table can
    take it by ``ALTER COLUMN ... TYPE`` and lose nothing (varchar(20) -> varchar(50) or text, integer ->
    bigint, numeric(10,2) -> numeric(12,3) or numeric). char(n) is not widened: its padding is part of
    its values."""
    if table is None or source is None or table == source:
        return False
    if source.type in _WIDER.get(table.type, ()):
        return True
    if table.type != source.type or table.type not in ("VARCHAR", "NUMERIC") or table.length is None:
        return False
    if source.length is None:
        return True
    if table.type == "VARCHAR":
        return source.length > table.length
    t_scale, s_scale = table.scale or 0, source.scale or 0
    return s_scale >= t_scale and source.length - s_scale >= table.length - t_scale


def same_type(table: Shape | None, source: Shape | None) -> bool:
    """Whether the source's column still has the real-time table's type (unknown on either side: yes)."""
    if table is None or source is None:
        return True
    return table == source if table.type in _SIZED else table.type == source.type


@dataclass(frozen=True)
class Change:
    txid: int
    order: int  # 1..n within the transaction
    lsn: int
    op: str  # c, u, d, r
    row: dict[str, str | None]  # column -> PostgreSQL text input (None: NULL)
    source_ms: int | None  # when the source committed it
    added: tuple[tuple[str, Shape], ...] = ()  # columns the source gained that the real-time table lacks
    widened: tuple[tuple[str, Shape], ...] = ()  # columns the source widened (``widens``), with their new type
    # the commit position of the transaction Debezium streamed before this one (``source.sequence``'s first
    # LSN): once the applied position is past it, this event's transaction is done (``after_commit``)
    after_commit: int | None = None


@dataclass(frozen=True)
class Boundary:
    status: str  # BEGIN or END
    txid: int
    commit_lsn: int
    event_count: int | None  # END only
    collections: dict[str, int] | None = None  # END only: events per table (``schema.table``), when Debezium says


def _payload(value: bytes | str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    if value is None:
        raise ValueError("no value (a tombstone or an empty record)")
    try:
        doc = json.loads(value)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("payload"), dict):
        raise ValueError("not a Kafka Connect JSON record with its schema ({\"schema\": ..., \"payload\": {...}})")
    return doc["payload"], doc.get("schema") if isinstance(doc.get("schema"), dict) else {}


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{what} is {value!r}, not an integer")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{what} is {value!r}, not an integer") from None


def boundary(value: bytes | str | None) -> Boundary:
    payload, _ = _payload(value)
    status = payload.get("status")
    if status not in ("BEGIN", "END"):
        raise ValueError(f"transaction status is {status!r}, not BEGIN or END")
    txid, _, lsn = str(payload.get("id", "")).partition(":")
    count = collections = None
    if status == "END":
        count = _int(payload.get("event_count"), "END's event_count")
        if count < 0:
            raise ValueError(f"END's event_count is {count}")
        collections = _collections(payload.get("data_collections"), count)
    return Boundary(status, _int(txid, "the transaction id's txId"), _int(lsn, "the transaction id's LSN"), count,
                    collections)


def _collections(value: Any, count: int) -> dict[str, int] | None:
    """END's ``data_collections`` (``[{"data_collection": "public.t", "event_count": 2}, ...]``) as table ->
    events; None when END has none. Counts that do not add up to END's own are refused."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise ValueError(f"END's data_collections is {value!r}, not a list")
    found: dict[str, int] = {}
    for item in value:
        name = item.get("data_collection") if isinstance(item, dict) else None
        if not isinstance(name, str) or name in found:
            raise ValueError(f"END's data_collections holds {item!r}: not one table's event count")
        found[name] = _int(item.get("event_count"), f"END's event_count of {name}")
    if sum(found.values()) != count:
        raise ValueError(f"END's data_collections count {sum(found.values())} events, its event_count {count}")
    return found


def change(value: bytes | str | None, table: dict[str, Shape | None],
           parts: tuple[dict[str, Any], dict[str, Any]] | None = None) -> Change:
    """One change event of the captured table; ``table``: the real-time table's columns and their
    shapes; ``parts``: the record's payload and schema, parsed already (tidemark.realtime.cdc.schemas). A
    column the source gained comes back in ``added`` (its type one the sink can add), one it widened
    in ``widened``; a column the source lost or renamed, or whose type changed any other way, raises
    ``ValueError`` with both schemas."""
    payload, schema = parts or _payload(value)
    op = payload.get("op")
    if op not in OPS:
        what = "a TRUNCATE at the source (every row deleted)" if op == "t" else f"operation {op!r}"
        raise ValueError(f"{what}: not applied; a change event is one of {', '.join(OPS)}")
    source, tx = payload.get("source"), payload.get("transaction")
    if not isinstance(source, dict) or not isinstance(tx, dict):
        raise ValueError("no source or transaction block (provide.transaction.metadata must be on)")
    side = "before" if op == "d" else "after"
    row = payload.get(side)
    if not isinstance(row, dict):
        raise ValueError(f"{OPS[op]} without its row '{side}'")
    types, (added, widened) = _checked_schema(schema, side, row, table)
    order = _int(tx.get("total_order"), "transaction.total_order")
    if order < 1:
        raise ValueError(f"transaction.total_order is {order}")
    ms = source.get("ts_ms")
    return Change(_int(source.get("txId"), "source.txId"), order, _int(source.get("lsn"), "source.lsn"), op,
                  {name: text(v, types.get(name, {})) for name, v in row.items()},
                  ms if isinstance(ms, int) and not isinstance(ms, bool) else None, added, widened,
                  after_commit(source))


def after_commit(source: dict[str, Any]) -> int | None:
    """The commit position before this event's transaction, from Debezium's ``source.sequence``
    (``["<last commit LSN>", "<this event's LSN>"]``, as JSON text); None when it is missing or unreadable.

    The PostgreSQL connector streams whole transactions in commit order (pgoutput sends a transaction at
    its commit), so the transaction of an event is the first to commit after that position: once the
    sink's applied position is past it, the transaction was applied, dead-lettered or skipped, and the
    event is a redelivery (a genuine record produced again), never one to wait for."""
    try:
        first = json.loads(source["sequence"])[0]
        return int(first) if first is not None else None
    except (KeyError, TypeError, ValueError, IndexError):
        return None


# (schema, side, columns, real-time table) -> their field types and the columns to add and widen: most
# records of a table version share one schema object (tidemark.realtime.cdc.schemas), so it is checked once, not
# per record. An entry holds its schema, so no other object can take that schema's id while the entry lives.
Altered = tuple[tuple[tuple[str, Shape], ...], tuple[tuple[str, Shape], ...]]  # (added, widened)
_CHECKED: dict[tuple, tuple[dict[str, Any], dict[str, dict[str, Any]], Altered]] = {}


def _checked_schema(schema: dict[str, Any], side: str, row: dict[str, Any],
                    table: dict[str, Shape | None]) -> tuple[dict[str, dict[str, Any]], Altered]:
    key = (id(schema), side, tuple(row), tuple(table.items()))
    hit = _CHECKED.get(key)
    if hit is not None and hit[0] is schema:
        return hit[1], hit[2]
    types = _field_types(schema, side)
    altered = _schema_change(row, types, table)  # ValueError: not remembered, raised again for the next record
    if len(_CHECKED) >= 256:
        _CHECKED.clear()
    _CHECKED[key] = (schema, types, altered)
    return types, altered


def _schema_change(row: dict[str, Any], types: dict[str, dict[str, Any]],
                   table: dict[str, Shape | None]) -> Altered:
    """The columns to add and to widen before this row applies; ``ValueError`` for any other change."""
    source = {name: shape_of_field(types.get(name, {})) for name in row}
    lost = [c for c in table if c not in row]
    retyped = [c for c in table if c in row and not same_type(table[c], source[c])]
    widened = [c for c in retyped if widens(table[c], source[c])]
    changed = [c for c in retyped if c not in widened]
    new = [c for c in row if c not in table]
    unaddable = [c for c in new if source[c] is None or source[c].type not in DDL_TYPES
                 or not IDENTIFIER.fullmatch(c) or c.startswith("_tm_")]
    if lost or changed or unaddable:
        why = "; ".join(part for part in (
            f"column(s) {', '.join(lost)} gone from the source (dropped or renamed)" if lost else "",
            ", ".join(f"column {c} is {source[c]} at the source, {table[c]} in the real-time table" for c in changed),
            f"new column(s) {', '.join(unaddable)} of a type the sink does not add by itself" if unaddable else "",
        ) if part)

        def schema(cols: dict[str, Shape | None]) -> str:
            return ", ".join(f"{c} {t or '?'}" for c, t in cols.items())

        raise ValueError(f"the source's schema changed in a way not applied by itself: {why}. Real-time table: "
                         f"({schema(table)}); source: ({schema(source)})")
    return tuple((c, source[c]) for c in new), tuple((c, source[c]) for c in widened)


def _field_types(schema: dict[str, Any], side: str) -> dict[str, dict[str, Any]]:
    for field in schema.get("fields", []) if isinstance(schema, dict) else []:
        if isinstance(field, dict) and field.get("field") == side:
            return {f["field"]: f for f in field.get("fields", []) if isinstance(f, dict) and "field" in f}
    return {}


def text(value: Any, field: dict[str, Any]) -> str | None:
    """A Debezium value as PostgreSQL reads it as text, by the field's Connect type and semantic name."""
    if value is None:
        return None
    name, kind = field.get("name"), field.get("type")
    if name == "io.debezium.time.Date":
        return (date(1970, 1, 1) + timedelta(days=_int(value, "a date"))).isoformat()
    if name in ("io.debezium.time.Timestamp", "org.apache.kafka.connect.data.Timestamp"):
        return (_EPOCH + timedelta(milliseconds=_int(value, "a timestamp"))).isoformat(sep=" ")
    if name == "io.debezium.time.MicroTimestamp":
        return (_EPOCH + timedelta(microseconds=_int(value, "a timestamp"))).isoformat(sep=" ")
    if name == "io.debezium.time.NanoTimestamp":
        nanos = _int(value, "a timestamp")
        return (_EPOCH + timedelta(microseconds=nanos // 1000)).isoformat(sep=" ")
    if name in ("io.debezium.time.MicroTime", "io.debezium.time.Time"):
        micros = _int(value, "a time") * (1000 if name == "io.debezium.time.Time" else 1)
        return (datetime.combine(date(1970, 1, 1), time()) + timedelta(microseconds=micros)).time().isoformat()
    if kind == "bytes" and isinstance(value, str):
        return "\\x" + base64.b64decode(value, validate=True).hex()
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    if isinstance(value, float):
        return repr(value)
    return str(value)

"""Debezium's records, read without trusting them: change events and transaction boundaries.

Both arrive as Kafka Connect JSON with their schema (``{"schema": ..., "payload": ...}``). A change
event becomes a ``Change``: its source transaction (``source.txId``) and place in it
(``transaction.total_order``), its WAL position, the operation and the row (after an insert or
update, before a delete) as PostgreSQL text input, each value converted by its field's Debezium
type (days, microseconds and base64 become dates, timestamps and bytea). A boundary becomes a
``Boundary``: BEGIN, or END with the transaction's commit position and event count. Anything else
raises ``ValueError`` naming what is wrong; the sink makes it a dead letter.

Debezium's PostgreSQL transaction id is ``<txId>:<lsn>`` with each event's own LSN, so events are
grouped by ``source.txId``; an END's LSN is the transaction's commit position.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Any

OPS = {"c": "insert", "u": "update", "d": "delete", "r": "snapshot read"}
_EPOCH = datetime(1970, 1, 1)


@dataclass(frozen=True)
class Change:
    txid: int
    order: int  # 1..n within the transaction
    lsn: int
    op: str  # c, u, d, r
    row: dict[str, str | None]  # column -> PostgreSQL text input (None: NULL)
    source_ms: int | None  # when the source committed it


@dataclass(frozen=True)
class Boundary:
    status: str  # BEGIN or END
    txid: int
    commit_lsn: int
    event_count: int | None  # END only


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
    count = None
    if status == "END":
        count = _int(payload.get("event_count"), "END's event_count")
        if count < 0:
            raise ValueError(f"END's event_count is {count}")
    return Boundary(status, _int(txid, "the transaction id's txId"), _int(lsn, "the transaction id's LSN"), count)


def change(value: bytes | str | None, columns: set[str]) -> Change:
    """One change event of the captured table, whose columns (the real-time table's) are ``columns``."""
    payload, schema = _payload(value)
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
    unknown = sorted(set(row) - columns)
    if unknown:
        raise ValueError(f"column(s) {', '.join(unknown)} not in the real-time table: the source's schema changed "
                         "(an added column is added before its rows only by a batch plan today)")
    types = _field_types(schema, side)
    order = _int(tx.get("total_order"), "transaction.total_order")
    if order < 1:
        raise ValueError(f"transaction.total_order is {order}")
    ms = source.get("ts_ms")
    return Change(_int(source.get("txId"), "source.txId"), order, _int(source.get("lsn"), "source.lsn"), op,
                  {name: text(v, types.get(name, {})) for name, v in row.items()},
                  ms if isinstance(ms, int) and not isinstance(ms, bool) else None)


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

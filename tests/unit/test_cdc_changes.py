"""Debezium's records read without trusting them: values as PostgreSQL text, what is wrong named."""

from __future__ import annotations

import json

import pytest

from tidemark.cdc.changes import boundary, change, text

FIELDS = [{"type": "int64", "field": "id"}, {"type": "string", "field": "amount"},
          {"type": "int32", "name": "io.debezium.time.Date", "field": "day"},
          {"type": "int64", "name": "io.debezium.time.MicroTimestamp", "field": "at"},
          {"type": "string", "name": "io.debezium.time.ZonedTimestamp", "field": "updated_at"},
          {"type": "bytes", "field": "blob"}, {"type": "boolean", "field": "ok"}]
SCHEMA = {"type": "struct", "fields": [{"type": "struct", "field": "before", "fields": FIELDS},
                                       {"type": "struct", "field": "after", "fields": FIELDS}]}
ROW = {"id": 7, "amount": "99999999999999.99", "day": 20_000, "at": 1_700_000_000_123_456,
       "updated_at": "2026-11-26T01:02:03.456789Z", "blob": "3q2+7w==", "ok": False}
COLUMNS = set(ROW)


def _event(op="c", **payload) -> str:
    body = {"op": op, "before": ROW if op == "d" else None, "after": None if op == "d" else ROW,
            "source": {"txId": 38139, "lsn": 732317904, "ts_ms": 1795658635089},
            "transaction": {"id": "38139:732317904", "total_order": 2, "data_collection_order": 2}, **payload}
    return json.dumps({"schema": SCHEMA, "payload": body})


def test_an_insert_becomes_its_transaction_place_and_row_as_postgresql_reads_it():
    c = change(_event(), COLUMNS)
    assert (c.txid, c.order, c.lsn, c.op, c.source_ms) == (38139, 2, 732317904, "c", 1795658635089)
    assert c.row == {"id": "7", "amount": "99999999999999.99", "day": "2024-10-04", "at": "2023-11-14 22:13:20.123456",
                     "updated_at": "2026-11-26T01:02:03.456789Z", "blob": "\\xdeadbeef", "ok": "false"}


def test_a_delete_carries_the_row_before_it():
    c = change(_event("d"), COLUMNS)
    assert c.op == "d" and c.row["id"] == "7" and c.row["amount"] == "99999999999999.99"


@pytest.mark.parametrize("value, reason", [
    (None, "no value"),
    (b"\xff{", "not JSON"),
    ('{"payload": 3}', "not a Kafka Connect JSON record"),
    (_event("t"), "a TRUNCATE at the source (every row deleted): not applied"),
    (_event("x"), "operation 'x'"),
    (_event(after=None), "insert without its row 'after'"),
    (_event(transaction=None), "no source or transaction block"),
    (_event(source={"txId": "abc", "lsn": 1}), "source.txId is 'abc', not an integer"),
    (_event(transaction={"total_order": 0}), "transaction.total_order is 0"),
    (_event(after={**ROW, "note": "x"}), "column(s) note not in the real-time table"),
])
def test_what_cannot_be_applied_is_named(value, reason):
    with pytest.raises(ValueError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        change(value, COLUMNS)


def test_boundaries_give_the_transaction_its_commit_position_and_event_count():
    end = boundary(json.dumps({"payload": {"status": "END", "id": "38139:732318256", "event_count": 3}}))
    assert (end.status, end.txid, end.commit_lsn, end.event_count) == ("END", 38139, 732318256, 3)
    assert boundary(json.dumps({"payload": {"status": "BEGIN", "id": "5:9"}})).event_count is None
    for bad, reason in (({"status": "END", "id": "5:9"}, "event_count is None"),
                        ({"status": "MIDDLE", "id": "5:9"}, "not BEGIN or END"),
                        ({"status": "END", "id": "5", "event_count": 1}, "LSN is ''")):
        with pytest.raises(ValueError, match=reason):
            boundary(json.dumps({"payload": bad}))


def test_values_by_type():
    assert text(None, {}) is None and text(1.5, {}) == "1.5" and text({"a": 1}, {}) == '{"a":1}'
    assert text(86_399_999_999, {"name": "io.debezium.time.MicroTime"}) == "23:59:59.999999"
    assert text(1000, {"name": "io.debezium.time.Timestamp"}) == "1970-01-01 00:00:01"
    with pytest.raises(ValueError):
        text("not base64!", {"type": "bytes"})

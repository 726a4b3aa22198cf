"""Debezium's records read without trusting them: values as PostgreSQL text, what is wrong named."""

from __future__ import annotations

import json

import pytest

from tidemark.realtime.cdc.changes import boundary, change, text

FIELDS = [{"type": "int64", "field": "id"}, {"type": "string", "field": "amount"},
          {"type": "int32", "name": "io.debezium.time.Date", "field": "day"},
          {"type": "int64", "name": "io.debezium.time.MicroTimestamp", "field": "at"},
          {"type": "string", "name": "io.debezium.time.ZonedTimestamp", "field": "updated_at"},
          {"type": "bytes", "field": "blob"}, {"type": "boolean", "field": "ok"}]
SCHEMA = {"type": "struct", "fields": [{"type": "struct", "field": "before", "fields": FIELDS},
                                       {"type": "struct", "field": "after", "fields": FIELDS}]}
ROW = {"id": 7, "amount": "99999999999999.99", "day": 20_000, "at": 1_700_000_000_123_456,
       "updated_at": "2026-11-26T01:02:03.456789Z", "blob": "3q2+7w==", "ok": False}
COLUMNS = {name: None for name in ROW}  # the real-time table's columns; their shapes unknown


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
    (_event(after={**ROW, "note": "x"}), "new column(s) note of a type the sink does not add by itself"),
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


def _typed(fields: list[dict], row: dict) -> str:
    schema = {"type": "struct", "fields": [{"type": "struct", "field": "after", "fields": fields}]}
    body = {"op": "c", "before": None, "after": row, "source": {"txId": 5, "lsn": 9, "ts_ms": 1},
            "transaction": {"id": "5:9", "total_order": 1}}
    return json.dumps({"schema": schema, "payload": body})


def _field(name: str, kind: str, length: int = 0, scale: int = 0) -> dict:
    return {"type": "string", "field": name, "parameters": {"__debezium.source.column.type": kind,
                                                          "__debezium.source.column.length": str(length),
                                                          "__debezium.source.column.scale": str(scale)}}


def test_a_column_added_at_the_source_comes_with_its_type_and_any_other_schema_change_is_refused_with_both():
    """Issue 31, item 6: Debezium's column.propagate.source.type parameters give each column's source type."""
    from tidemark.realtime.cdc.changes import Shape, shape_of_column

    table = {"id": shape_of_column("bigint", 64, 0, None), "amount": shape_of_column("numeric", 18, 2, None),
             "note": shape_of_column("character varying", None, None, 20)}
    fields = [_field("id", "INT8", 19), _field("amount", "NUMERIC", 18, 2), _field("note", "VARCHAR", 20)]
    row = {"id": 1, "amount": "1.00", "note": "x"}
    assert change(_typed(fields, row), table).added == ()
    grown = change(_typed([*fields, _field("fee", "NUMERIC", 9, 3), _field("seen", "TIMESTAMPTZ", 35, 6)],
                          {**row, "fee": "1.234", "seen": None}), table)
    assert grown.added == (("fee", Shape("NUMERIC", 9, 3)), ("seen", Shape("TIMESTAMPTZ")))
    assert [s.ddl() for _, s in grown.added] == ["numeric(9,3)", "timestamptz"]
    for bad_fields, bad_row, reason in (
            (fields[:2], {"id": 1, "amount": "1.00"}, "column(s) note gone from the source (dropped or renamed)"),
            ([*fields[:2], _field("note", "VARCHAR", 10)], row,
             "column note is varchar(10) at the source, varchar(20) in the real-time table"),
            ([fields[0], _field("amount", "NUMERIC", 18, 4), fields[2]], row, "column amount is numeric(18,4)"),
            ([*fields, _field("Bad-Name", "INT4")], {**row, "Bad-Name": 1}, "new column(s) Bad-Name of a type"),
            ([*fields, _field("geo", "GEOMETRY")], {**row, "geo": "x"}, "new column(s) geo of a type"),
            ([*fields, _field("_tm_lsn", "INT8")], {**row, "_tm_lsn": 1}, "new column(s) _tm_lsn of a type")):
        with pytest.raises(ValueError, match=reason.replace("(", r"\(").replace(")", r"\)")) as refused:
            change(_typed(bad_fields, bad_row), table)
        assert "Real-time table: (id bigint, amount numeric(18,2), note varchar(20)); source: (" in str(refused.value)


def test_a_column_widened_at_the_source_comes_with_its_new_type_and_a_narrowed_or_padded_one_is_refused():
    from tidemark.realtime.cdc.changes import Shape, shape_of_column

    table = {"id": shape_of_column("integer", 32, 0, None), "amount": shape_of_column("numeric", 18, 2, None),
             "note": shape_of_column("character varying", None, None, 20),
             "code": shape_of_column("character", None, None, 3)}
    fields = [_field("id", "INT4", 10), _field("amount", "NUMERIC", 18, 2), _field("note", "VARCHAR", 20),
              _field("code", "BPCHAR", 3)]
    row = {"id": 1, "amount": "1.00", "note": "x", "code": "EUR"}
    assert change(_typed(fields, row), table).widened == ()
    wide = change(_typed([_field("id", "INT8", 19), _field("amount", "NUMERIC", 20, 3), _field("note", "TEXT"),
                          fields[3]], row), table)
    assert wide.widened == (("id", Shape("INT8")), ("amount", Shape("NUMERIC", 20, 3)), ("note", Shape("TEXT")))
    assert wide.added == () and [s.ddl() for _, s in wide.widened] == ["bigint", "numeric(20,3)", "text"]
    assert change(_typed([*fields[:2], _field("note", "VARCHAR", 50), fields[3]], row), table).widened == (
        ("note", Shape("VARCHAR", 50)),)
    for bad, reason in ((_field("amount", "NUMERIC", 19, 4), "column amount is numeric(19,4)"),  # fewer integer digits
                        (_field("code", "BPCHAR", 5), "column code is char(5)"),  # padded: its values change
                        (_field("id", "INT2", 5), "column id is smallint")):
        changed = [bad if f["field"] == bad["field"] else f for f in fields]
        with pytest.raises(ValueError, match=reason.replace("(", r"\(").replace(")", r"\)")):
            change(_typed(changed, row), table)


def test_a_record_s_type_parameters_are_not_trusted():
    """A forged length or scale never reaches the warehouse's DDL: the shape is then the bare type."""
    from tidemark.realtime.cdc.changes import Shape, shape_of_field

    huge = {"parameters": {"__debezium.source.column.type": "NUMERIC", "__debezium.source.column.length": "1e400"}}
    assert shape_of_field(huge) == Shape("NUMERIC")
    assert shape_of_field(_field("x", "NUMERIC", 18, 5000)) == Shape("NUMERIC")  # a scale past the precision
    assert shape_of_field(_field("x", "NUMERIC", 18, -3)) == Shape("NUMERIC")
    assert shape_of_field(_field("x", "VARCHAR", 1 << 40)) == Shape("VARCHAR")
    assert shape_of_field({"parameters": "not a dict"}) is None


def test_a_wal_position_is_spelled_as_postgresql_spells_it():
    from tidemark.realtime.cdc.changes import lsn_text

    assert lsn_text(0x16B3748) == "0/16B3748" and lsn_text((1 << 32) + 0xA0) == "1/A0"



def test_a_record_read_in_two_halves_reads_as_the_whole_and_any_other_form_is_read_whole():
    """tidemark.realtime.cdc.schemas: the schema parsed once per table version, the payload per record."""
    import json

    from tidemark.realtime.cdc.schemas import Schemas

    schema = {"type": "struct", "fields": [{"field": "after", "type": "struct", "fields": [
        {"field": "name", "type": "string", "default": 'caf\u00e9 ,"payload": {'}]}]}  # escaped: never the cut
    cut_inside = {"type": "struct", "parameters": {"a": "b", "payload": "x"}}  # ,"payload": inside the schema

    def record(payload, sch=schema) -> bytes:
        return json.dumps({"schema": sch, "payload": payload}, separators=(",", ":"), ensure_ascii=False).encode()

    schemas = Schemas(most=2)
    first, second = record({"op": "c", "after": {"name": ',"payload":'}}), record({"op": "u"})
    assert schemas.read(first) == ({"op": "c", "after": {"name": ',"payload":'}}, schema)
    payload, again = schemas.read(second)
    assert payload == {"op": "u"} and again is schemas.read(first)[1], "one parse per schema"
    for other in (b"\xff\xfe", b'{"payload":{"op":"c"},"schema":{}}', first + b"\n", b"",
                  record([1, 2]), record({"op": "c"}, [1]), None, "text",
                  b'{"schema":{"a":1},"payload":{"op":"c"},"payload":{"op":"d"}}',  # duplicate key
                  b'{"schema":{"a":1},"payload":\xef\xbb\xbf{"op":"c"}}',  # a BOM: not JSON read whole either
                  b'{"schema":{"a":1},"payload":' + '{"op":"c"}'.encode("utf-16-le") + b'}',  # UTF-16
                  record({"op": "c"}, cut_inside)):  # the first cut falls inside the schema
        assert schemas.read(other) is None, other
    for n in range(3):  # a bounded memory: past two schemas every one is parsed again
        schemas.read(record({"op": "c"}, {"n": n}))
    assert len(schemas._parsed) <= 2


@pytest.mark.parametrize("sequence, expected", [
    ('["732300000","732317904"]', 732300000),  # as Debezium's PostgreSQL connector writes it
    ('[null,"732317904"]', None),  # the first transaction a connector streams
    ("not json", None),
    (None, None),
])
def test_the_commit_streamed_before_an_events_transaction_is_read_from_its_sequence(sequence, expected):
    """Issue 52: a genuine change produced again without its END is known as done once the applied
    position is past this commit (tidemark.realtime.cdc.apply drops it as a duplicate instead of keeping it waiting)."""
    source = {"txId": 38139, "lsn": 732317904, "ts_ms": 1, **({"sequence": sequence} if sequence else {})}
    assert change(_event(source=source), COLUMNS).after_commit == expected

"""Protocol version 2's record schemas: derivation, drift and fit (pure logic; the Spark side is
proven by tests/stack/test_protocol_v2.py)."""

from __future__ import annotations

import json

import pytest

from tidemark.protocol.avro import SchemaError, SourceColumn, drift, fit, schema, sql_type

C = SourceColumn
PAYMENTS = [C("id", "bigint", True), C("amount", "numeric(18,2)", True), C("currency", "character(3)", True),
            C("note", "text", False), C("updated_at", "timestamp with time zone", False)]


def test_the_writer_schema_keeps_decimals_exact_and_timestamps_in_utc_microseconds():
    fields = {f["name"]: f["type"] for f in json.loads(schema(PAYMENTS, {"id", "updated_at"}))["fields"]}
    assert fields == {
        "id": "long",
        "amount": {"type": "bytes", "logicalType": "decimal", "precision": 18, "scale": 2},
        "currency": "string",
        "note": ["null", "string"],
        "updated_at": {"type": "long", "logicalType": "timestamp-micros"},  # the cursor: never null in a record
    }


def test_columns_without_an_exact_avro_type_are_named():
    with pytest.raises(SchemaError) as info:
        schema([C("id", "bigint", True), C("total", "numeric", False), C("at", "timestamp without time zone", False),
                C("shape", "point", False)], {"id"})
    text = str(info.value)
    assert "column 'total' (numeric): a numeric without precision and scale" in text
    assert "column 'at' (timestamp without time zone)" in text and "column 'shape' (point)" in text


def test_drift_allows_added_and_widened_columns_and_refuses_any_other_change_with_both_schemas():
    assert drift(PAYMENTS, [*PAYMENTS, C("fee", "numeric(10,4)", False)]) == [C("fee", "numeric(10,4)", False)]
    assert drift(PAYMENTS, PAYMENTS) == []
    widened = [C("id", "bigint", True), C("amount", "numeric(20,2)", True), *PAYMENTS[2:]]
    assert drift(PAYMENTS, widened) == []  # a new version, nothing added
    narrowed = [C("id", "bigint", True), C("amount", "numeric(10,2)", True), *PAYMENTS[2:]]
    with pytest.raises(SchemaError) as info:
        drift(PAYMENTS, narrowed)
    assert "changed amount: numeric(18,2) NOT NULL -> numeric(10,2) NOT NULL" in str(info.value)
    assert "Registered schema: (id bigint NOT NULL, amount numeric(18,2) NOT NULL" in str(info.value)
    assert "source now: (id bigint NOT NULL, amount numeric(10,2) NOT NULL" in str(info.value)
    with pytest.raises(SchemaError, match=r"changed amount: numeric\(18,2\) NOT NULL -> numeric\(20,2\)\)"):
        drift(PAYMENTS, [C("id", "bigint", True), C("amount", "numeric(20,2)", False), *PAYMENTS[2:]])  # nullable now
    with pytest.raises(SchemaError, match="dropped note"):
        drift(PAYMENTS, [c for c in PAYMENTS if c.name != "note"])


@pytest.mark.parametrize(("source", "target", "outcome"), [
    ("numeric(18,2)", "numeric(18,2)", "holds"), ("numeric(18,2)", "numeric(20,4)", "holds"),
    ("numeric(18,2)", "numeric", "holds"), ("numeric(18,2)", "numeric(18,4)", "refused"),
    ("numeric(18,2)", "numeric(18,1)", "refused"), ("numeric(20,2)", "numeric(18,2)", "widens"),
    ("integer", "bigint", "holds"), ("bigint", "integer", "widens"),
    ("character varying(10)", "text", "holds"), ("character varying(10)", "character varying(5)", "widens"),
    ("text", "character varying(100)", "widens"), ("real", "double precision", "holds"),
    ("double precision", "real", "widens"), ("integer", "character varying(20)", "refused"),
    ("character(5)", "character(3)", "refused"),
])
def test_the_target_must_hold_every_source_value_exactly_or_widen_with_the_source(source, target, outcome):
    """``registered``: the schema before, when the target had the source's type; "widens": the source
    widened since, and the target follows. Without that history the same target was made narrower than
    the source by someone, and it is refused as before."""
    src, tgt = [C("id", "bigint", True), C("v", source, False)], [C("id", "bigint", True), C("v", target, False)]
    refused = f"v: source {source.replace('(', '.').replace(')', '.')}, target"
    if outcome == "refused":
        with pytest.raises(SchemaError, match=refused):
            fit(src, tgt, "t.x", registered=tgt)
    else:
        assert fit(src, tgt, "t.x", registered=tgt) == ([], [src[1]] if outcome == "widens" else [])
    if outcome == "widens":
        with pytest.raises(SchemaError, match=refused):
            fit(src, tgt, "t.x")  # no schema registered before: the target was made narrower, never widened
        with pytest.raises(SchemaError, match=refused):  # registered with another type than the target's
            fit(src, tgt, "t.x", registered=[C("id", "bigint", True), C("v", "text", False)])


def test_a_column_the_target_lacks_is_added_and_only_known_types_reach_ddl():
    assert fit([*PAYMENTS, C("fee", "numeric(10,4)", False)], PAYMENTS, "t.x") == ([C("fee", "numeric(10,4)", False)], [])
    assert sql_type("numeric(10,4)") == "numeric(10,4)"
    with pytest.raises(SchemaError):
        sql_type("text); DROP TABLE batch.ledger_entries; --")

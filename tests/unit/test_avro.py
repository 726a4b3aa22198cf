"""Protocol version 2's record schemas: derivation, drift and fit (pure logic; the Spark side is
proven by tests/stack/test_protocol_v2.py)."""

from __future__ import annotations

import json

import pytest

from tidemark.avro import SchemaError, SourceColumn, drift, fit, schema, sql_type

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


def test_drift_allows_added_columns_and_refuses_any_other_change_with_both_schemas():
    assert drift(PAYMENTS, [*PAYMENTS, C("fee", "numeric(10,4)", False)]) == [C("fee", "numeric(10,4)", False)]
    assert drift(PAYMENTS, PAYMENTS) == []
    narrowed = [C("id", "bigint", True), C("amount", "numeric(10,2)", True), *PAYMENTS[2:]]
    with pytest.raises(SchemaError) as info:
        drift(PAYMENTS, narrowed)
    assert "changed amount: numeric(18,2) NOT NULL -> numeric(10,2) NOT NULL" in str(info.value)
    assert "Registered schema: (id bigint NOT NULL, amount numeric(18,2) NOT NULL" in str(info.value)
    assert "source now: (id bigint NOT NULL, amount numeric(10,2) NOT NULL" in str(info.value)
    with pytest.raises(SchemaError, match="dropped note"):
        drift(PAYMENTS, [c for c in PAYMENTS if c.name != "note"])


@pytest.mark.parametrize(("source", "target", "holds"), [
    ("numeric(18,2)", "numeric(18,2)", True), ("numeric(18,2)", "numeric(20,4)", True),
    ("numeric(18,2)", "numeric", True), ("numeric(18,2)", "numeric(18,4)", False),
    ("numeric(18,2)", "numeric(18,1)", False), ("integer", "bigint", True), ("bigint", "integer", False),
    ("character varying(10)", "text", True), ("character varying(10)", "character varying(5)", False),
    ("text", "character varying(100)", False), ("real", "double precision", True), ("double precision", "real", False),
])
def test_the_target_must_hold_every_source_value_exactly(source, target, holds):
    src, tgt = [C("id", "bigint", True), C("v", source, False)], [C("id", "bigint", True), C("v", target, False)]
    if holds:
        assert fit(src, tgt, "t.x") == []
    else:
        with pytest.raises(SchemaError, match=f"v: source {source.replace('(', '.').replace(')', '.')}, target"):
            fit(src, tgt, "t.x")


def test_a_column_the_target_lacks_is_added_and_only_known_types_reach_ddl():
    assert fit([*PAYMENTS, C("fee", "numeric(10,4)", False)], PAYMENTS, "t.x") == [C("fee", "numeric(10,4)", False)]
    assert sql_type("numeric(10,4)") == "numeric(10,4)"
    with pytest.raises(SchemaError):
        sql_type("text); DROP TABLE batch.ledger_entries; --")

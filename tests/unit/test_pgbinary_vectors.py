"""tidemark.protocol.pgbinary against the shared vectors (tests/vectors/pgbinary.tsv): PostgreSQL's own bytes for
each value, which the JVM's encoder (tidemark.DirectCopy, stack/java/udf) is held to by its JUnit test too."""

from __future__ import annotations

import decimal
import re
import struct
from pathlib import Path

import pyarrow as pa
import pytest

from tidemark.protocol.pgbinary import HEADER, TRAILER, Unencodable, encode

VECTORS = Path(__file__).parents[1] / "vectors" / "pgbinary.tsv"


def _vectors() -> list[tuple[str, str, str]]:
    lines = [line.split("\t") for line in VECTORS.read_text(encoding="utf-8").splitlines()
             if line and not line.startswith("#")]
    return [(sql_type, value, expected) for sql_type, value, expected, *_ in lines]


def _array(sql_type: str, value: str) -> pa.Array:
    """The value as the decoder hands it to pgbinary (Arrow, as Spark holds it)."""
    none = value == "\\N"
    if (m := re.match(r"numeric\((\d+),(\d+)\)$", sql_type)) is not None:
        with decimal.localcontext() as ctx:
            ctx.prec = 80
            return pa.array([None if none else decimal.Decimal(value)], pa.decimal128(int(m[1]), int(m[2])))
    kinds = {"smallint": pa.int32(), "integer": pa.int32(), "bigint": pa.int64(), "real": pa.float32(),
             "double precision": pa.float64()}
    if sql_type in kinds:
        return pa.array([None if none else float(value) if sql_type in ("real", "double precision") else int(value)],
                        kinds[sql_type])
    if sql_type == "boolean":
        return pa.array([None if none else value == "true"])
    if sql_type == "date":
        return pa.array([None if none else int(value)], pa.int32()).cast(pa.date32())
    if sql_type == "timestamp with time zone":
        return pa.array([None if none else int(value)], pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    return pa.array([None if none else value], pa.string())


def _canonical_numeric(raw: bytes) -> bytes:
    """A numeric's binary form without leading and trailing zero digits, as the server stores and sends it."""
    ndigits, weight, sign, dscale = struct.unpack_from(">hhHh", raw)
    digits = list(struct.unpack_from(f">{ndigits}H", raw, 8))
    while digits and digits[0] == 0:
        digits.pop(0)
        weight -= 1
    while digits and digits[-1] == 0:
        digits.pop()
    return struct.pack(f">hhHh{len(digits)}H", len(digits), weight if digits else 0, sign, dscale, *digits)


@pytest.mark.parametrize("sql_type, value, expected", _vectors())
def test_pgbinary_writes_postgresqls_own_bytes(sql_type, value, expected):
    if expected.startswith("refused: "):
        with pytest.raises(Unencodable, match=re.escape(expected.removeprefix("refused: "))):
            encode([_array(sql_type, value)], [sql_type])
        return
    stream = encode([_array(sql_type, value)], [sql_type])
    assert stream.startswith(HEADER + b"\x00\x01") and stream.endswith(TRAILER)
    field = stream[len(HEADER) + 2:-len(TRAILER)]
    if sql_type.startswith("numeric") and field[:4] != b"\xff\xff\xff\xff":
        field = _canonical_numeric(field[4:])
        field = len(field).to_bytes(4, "big") + field
    assert field.hex() == expected


def test_the_vectors_keep_every_kind_of_refusal():
    vectors = _vectors()
    kinds = {sql_type.split("(")[0] for sql_type, _, _ in vectors}
    assert {"smallint", "numeric", "date", "timestamp with time zone", "uuid"} <= kinds
    assert {expected for _, _, expected in vectors if expected.startswith("refused")} == {
        "refused: value 32768 out of range", "refused: value -32769 out of range",
        "refused: outside PostgreSQL's range", "refused: not a uuid in canonical form"}

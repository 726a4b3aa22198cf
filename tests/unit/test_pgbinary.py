"""tidemark.protocol.pgbinary against a plain-Python reading of PostgreSQL's binary COPY format: random
values of every width decode to themselves (the stack test proves the server agrees)."""

from __future__ import annotations

import datetime as dt
import decimal
import random
import struct

import pyarrow as pa
import pytest

from tidemark.protocol.pgbinary import HEADER, TRAILER, Unencodable, encode


def _tuples(stream: bytes) -> list[list[bytes | None]]:
    assert stream.startswith(HEADER) and stream.endswith(TRAILER)
    at, rows = len(HEADER), []
    while at < len(stream) - len(TRAILER):
        (count,), at = struct.unpack_from(">h", stream, at), at + 2
        fields = []
        for _ in range(count):
            (length,), at = struct.unpack_from(">i", stream, at), at + 4
            fields.append(None if length == -1 else stream[at:at + length])
            at += max(length, 0)
        rows.append(fields)
    assert at == len(stream) - len(TRAILER)
    return rows


def _numeric(raw: bytes) -> decimal.Decimal:
    ndigits, weight, sign, dscale = struct.unpack_from(">hhHh", raw)
    digits = struct.unpack_from(f">{ndigits}H", raw, 8)
    assert len(raw) == 8 + 2 * ndigits and all(d < 10_000 for d in digits)
    value = sum(decimal.Decimal(d).scaleb(4 * (weight - i)) for i, d in enumerate(digits))
    return (-value if sign == 0x4000 else value).quantize(decimal.Decimal(1).scaleb(-dscale))


@pytest.mark.parametrize("precision, scale", [(18, 2), (38, 10), (38, 0), (38, 38), (5, 5), (7, 0), (20, 3), (1, 0)])
def test_random_decimals_of_every_width_decode_to_themselves(precision, scale):
    rng = random.Random(precision * 100 + scale)
    with decimal.localcontext() as ctx:
        ctx.prec = 80  # the default 28 digits would round the widest values
        values = [decimal.Decimal(rng.choice([-1, 1]) * rng.randrange(10 ** rng.randint(0, precision))).scaleb(-scale)
                  for _ in range(2_000)]
        values += [decimal.Decimal(10 ** precision - 1).scaleb(-scale),
                   decimal.Decimal(1 - 10 ** precision).scaleb(-scale), decimal.Decimal(0).scaleb(-scale), None]
        # a low 64-bit word of zero: negating carries into the high word
        values += [decimal.Decimal(-(2 ** k) * 10 ** j).scaleb(-scale) for k in (64, 96) for j in (0, 3)
                   if 2 ** k * 10 ** j < 10 ** precision]
        decoded = [None if f[0] is None else _numeric(f[0])
                   for f in _tuples(encode([pa.array(values, pa.decimal128(precision, scale))], [f"numeric({precision},{scale})"]))]
    assert decoded == values


def test_fixed_width_types_and_text_decode_to_themselves():
    at = [dt.datetime(1999, 12, 31, 23, 59, 59, 999_999, dt.timezone.utc), None, dt.datetime(2026, 11, 25, tzinfo=dt.timezone.utc)]
    rows = _tuples(encode([pa.array([-(2 ** 15), None, 2 ** 15 - 1], pa.int32()), pa.array([-1, 2 ** 63 - 1, None], pa.int64()),
                           pa.array(at, pa.timestamp("us", tz="UTC")), pa.array([dt.date(2000, 1, 1), dt.date(1999, 12, 31), None]),
                           pa.array(["€", None, ""]), pa.array(['{"a":1}', "[]", None]), pa.array([True, None, False])],
                          ["smallint", "bigint", "timestamp with time zone", "date", "text", "jsonb", "boolean"]))
    epoch = dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)
    assert [struct.unpack(">h", r[0])[0] if r[0] else None for r in rows] == [-(2 ** 15), None, 2 ** 15 - 1]
    assert [struct.unpack(">q", r[1])[0] if r[1] else None for r in rows] == [-1, 2 ** 63 - 1, None]
    assert [epoch + dt.timedelta(microseconds=struct.unpack(">q", r[2])[0]) if r[2] else None for r in rows] == at
    assert [struct.unpack(">i", r[3])[0] if r[3] else None for r in rows] == [0, -1, None]
    assert [r[4] for r in rows] == ["€".encode(), None, b""]
    assert [r[5] for r in rows] == [b'\x01{"a":1}', b"\x01[]", None]
    assert [r[6] for r in rows] == [b"\x01", None, b"\x00"]


def test_uuids_travel_as_their_sixteen_bytes_and_other_forms_are_refused():
    rows = _tuples(encode([pa.array(["a0eebc99-9c0b-4ef8-BB6D-6bb9bd380a11", None])], ["uuid"]))
    assert rows == [[bytes.fromhex("a0eebc999c0b4ef8bb6d6bb9bd380a11")], [None]]
    for form in ("a0eebc999c0b4ef8bb6d6bb9bd380a11", "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}",
                 "a0eebc99-9c0b-4ef8-bb6d+6bb9bd380a11", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1z"):
        with pytest.raises(Unencodable, match="not a uuid in canonical form"):
            encode([pa.array([form])], ["uuid"])


def test_a_smallint_out_of_range_is_refused_naming_the_value():
    with pytest.raises(Unencodable, match="value 32768 out of range"):
        encode([pa.array([1, 32768, None], pa.int32())], ["smallint"])
    assert len(_tuples(encode([pa.array([1, None], pa.int32())], ["smallint"]))) == 2  # a NULL is never out of range


def test_no_rows_is_an_empty_stream():
    assert encode([pa.array([], pa.int64())], ["bigint"]) == HEADER + TRAILER


def test_bytes_under_a_null_decimal_are_never_read():
    junk = (2 ** 127 - 1).to_bytes(16, "little", signed=True)
    values = (5).to_bytes(16, "little", signed=True) + junk
    array = pa.Array.from_buffers(pa.decimal128(18, 2), 2, [pa.py_buffer(bytes([0b01])), pa.py_buffer(values)])
    rows = _tuples(encode([array], ["numeric(18,2)"]))  # the junk has 39 digits: read, it would be refused
    assert rows[1] == [None] and _numeric(rows[0][0]) == decimal.Decimal("0.05")


@pytest.mark.parametrize("array, sql_type", [
    (pa.array([-(2 ** 31) + 10_957], pa.int32()).cast(pa.date32()), "date"),  # would wrap onto -infinity
    (pa.array([-(2 ** 31) + 10_956], pa.int32()).cast(pa.date32()), "date"),  # ... onto infinity
    (pa.array([-(2 ** 63) + 1], pa.int64()).cast(pa.timestamp("us", tz="UTC")), "timestamp with time zone"),
])
def test_dates_and_times_outside_postgresqls_range_are_refused(array, sql_type):
    with pytest.raises(Unencodable, match="outside PostgreSQL's range"):
        encode([array], [sql_type])


@pytest.mark.parametrize("array, sql_type", [
    (pa.array([1e300]), "real"), (pa.array([1.7]), "integer"), (pa.array([2 ** 64 - 1], pa.uint64()), "bigint"),
    (pa.array([256]), "boolean"), (pa.array([1]), "text"), (pa.array([1.5]), "numeric(4,1)"),
])
def test_an_arrow_type_that_does_not_hold_the_column_exactly_is_a_bug_not_a_conversion(array, sql_type):
    with pytest.raises(TypeError, match="no exact binary COPY form"):
        encode([array], [sql_type])


def test_every_type_protocol_version_2_carries_has_a_binary_form():
    from tidemark.protocol.avro import sql_type

    samples = {"smallint": pa.array([1], pa.int32()), "integer": pa.array([1], pa.int32()), "bigint": pa.array([1]),
               "boolean": pa.array([True]), "real": pa.array([1.0], pa.float32()), "double precision": pa.array([1.0]),
               "numeric(12,4)": pa.array([decimal.Decimal("1.5")], pa.decimal128(12, 4)),
               "timestamp with time zone": pa.array([0], pa.timestamp("us", tz="UTC")),
               "date": pa.array([0], pa.int32()).cast(pa.date32()), "text": pa.array(["x"]),
               "character varying": pa.array(["x"]), "character varying(5)": pa.array(["x"]),
               "character(3)": pa.array(["x"]), "uuid": pa.array([str(__import__("uuid").UUID(int=7))]),
               "json": pa.array(["{}"]), "jsonb": pa.array(["{}"])}
    for name, array in samples.items():
        assert sql_type(name) == name  # protocol version 2 carries it
        assert len(_tuples(encode([array], [name]))) == 1, name

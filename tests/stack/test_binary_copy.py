"""The stage's binary COPY (tidemark.pgbinary) against the real PostgreSQL: every type protocol
version 2 carries lands exactly as the same values sent as CSV text do, extremes and NULLs
included; what PostgreSQL would refuse is refused."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid

import psycopg2
import pyarrow as pa
import pytest

from tidemark.pgbinary import Unencodable, copy_binary
from tidemark.stage import copy_csv

pytestmark = pytest.mark.stack

D = decimal.Decimal
UTC = dt.timezone.utc
COLUMNS = [  # name, SQL type, Arrow type as Spark hands it over, values
    ("id", "bigint", pa.int64(), [1, 2, 3, 4, 5, 6]),
    ("small", "smallint", pa.int32(), [-32768, 32767, 0, None, -1, 7]),
    ("int", "integer", pa.int32(), [-(2 ** 31), 2 ** 31 - 1, 0, -5, None, 42]),
    ("big", "bigint", pa.int64(), [-(2 ** 63), 2 ** 63 - 1, 0, None, -1, 10 ** 15]),
    ("flag", "boolean", pa.bool_(), [True, False, None, True, False, True]),
    ("r", "real", pa.float32(), [1.5, -0.0, float("inf"), None, 3.4e38, 1e-45]),
    ("d", "double precision", pa.float64(), [0.1, -1e308, float("-inf"), 5e-324, None, 2.0 / 3]),
    ("amount", "numeric(18,2)", pa.decimal128(18, 2),
     [D("9999999999999999.99"), D("-9999999999999999.99"), D("0.00"), D("-0.01"), None, D("1234.50")]),
    ("wide", "numeric(38,10)", pa.decimal128(38, 10),
     [D("9999999999999999999999999999.9999999999"), D("-9999999999999999999999999999.9999999999"),
      D("-0.0000000001"), D("1E+27"), D("0E-10"), None]),
    ("frac", "numeric(5,5)", pa.decimal128(5, 5), [D("0.12345"), D("-0.99999"), None, D("0.00001"), D("0"), D("0.5")]),
    ("whole", "numeric(7,0)", pa.decimal128(7, 0), [D("9999999"), D("-1"), D("0"), None, D("10000"), D("-1000000")]),
    ("odd", "numeric(20,3)", pa.decimal128(20, 3),
     [D("99999999999999999.999"), D("-0.001"), D("10000.1"), D("1"), None, D("-12345678901234567.891")]),
    ("at", "timestamp with time zone", pa.timestamp("us", tz="UTC"),
     [dt.datetime(2026, 11, 24, 23, 59, 59, 999999, UTC), dt.datetime(1999, 12, 31, 23, 59, 59, 1, UTC),
      dt.datetime(1970, 1, 1, tzinfo=UTC), None, dt.datetime(2000, 1, 1, tzinfo=UTC),
      dt.datetime(1900, 2, 28, 0, 0, 0, 123456, UTC)]),
    ("day", "date", pa.date32(),
     [dt.date(2026, 11, 24), dt.date(1999, 12, 31), dt.date(2000, 1, 1), None, dt.date(1, 1, 1), dt.date(9999, 12, 31)]),
    ("memo", "text", pa.string(), ["plain", "", None, "ümlaut € 😀", "tab\tnew\nline \"q\" ,", "\\N"]),
    ("currency", "character(3)", pa.string(), ["EUR", "US", None, "CHF", "€€€", "a"]),
    ("label", "character varying(10)", pa.string(), ["0123456789", "", None, "x", "ü", "y"]),
    ("txn", "uuid", pa.string(),
     ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "00000000-0000-0000-0000-000000000000", None,
      "FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF", str(uuid.UUID(int=1)), "0123abcd-4567-89ef-ABCD-0123456789aB"]),
    ("doc", "json", pa.string(), ['{"a": [1, 2.50]}', "null", None, '"x"', "  {}  ", '{"b":1,"b":2}']),
    ("docb", "jsonb", pa.string(), ['{"a": [1, 2.50]}', "null", None, '"ü"', "[]", '{"b":1,"b":2}']),
]


def _table(conn, name: str, columns=COLUMNS) -> str:
    with conn.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {name}")
        cur.execute(f"CREATE TABLE {name} ({', '.join(f'{c} {t}' for c, t, _, _ in columns)})")
    return name


def _arrays(columns=COLUMNS):
    return [pa.array(values, arrow) for _, _, arrow, values in columns]


def _rows(conn, name: str) -> list[str]:
    with conn.cursor() as cur:
        cur.execute(f"SELECT t::text FROM {name} t ORDER BY id")
        return [r for (r,) in cur.fetchall()]


def test_every_type_lands_as_its_csv_text_does(warehouse_conn):
    arrays = _arrays()
    names = [c for c, _, _, _ in COLUMNS]
    with warehouse_conn.cursor() as cur:
        copy_binary(cur, _table(warehouse_conn, "pgbinary_binary"), arrays, [t for _, t, _, _ in COLUMNS], names)
        copy_csv(cur, _table(warehouse_conn, "pgbinary_csv"), pa.table(arrays, names=names), names)
        cur.execute("SELECT amount, wide, frac, odd, at, day, txn FROM pgbinary_binary WHERE id = 2")
        assert cur.fetchone() == (
            D("-9999999999999999.99"), D("-9999999999999999999999999999.9999999999"), D("-0.99999"),
            D("-0.001"), dt.datetime(1999, 12, 31, 23, 59, 59, 1, UTC), dt.date(1999, 12, 31),
            "00000000-0000-0000-0000-000000000000")
    binary, text = _rows(warehouse_conn, "pgbinary_binary"), _rows(warehouse_conn, "pgbinary_csv")
    assert len(binary) == 6
    assert binary == text
    warehouse_conn.rollback()


def test_slices_and_chunks_are_encoded_from_their_own_offsets(warehouse_conn):
    columns = [COLUMNS[0], COLUMNS[7], COLUMNS[14], COLUMNS[17]]  # id, amount, memo, txn
    arrays = [pa.chunked_array([a.slice(0, 2), a.slice(2)]).slice(1, 4) for a in _arrays(columns)]
    names = [c for c, _, _, _ in columns]
    with warehouse_conn.cursor() as cur:
        copy_binary(cur, _table(warehouse_conn, "pgbinary_sliced", columns), arrays, [t for _, t, _, _ in columns], names)
        copy_csv(cur, _table(warehouse_conn, "pgbinary_sliced_csv", columns),
                 pa.table([a.combine_chunks() for a in arrays], names=names), names)
    assert _rows(warehouse_conn, "pgbinary_sliced") == _rows(warehouse_conn, "pgbinary_sliced_csv")
    assert len(_rows(warehouse_conn, "pgbinary_sliced")) == 4
    warehouse_conn.rollback()


@pytest.mark.parametrize("sql_type, arrow, value, error", [
    ("smallint", pa.int32(), 32768, Unencodable),  # would not fit the column's two bytes
    ("uuid", pa.string(), "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}", Unencodable),  # not the extract's form
    ("uuid", pa.string(), "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1g", Unencodable),
    ("numeric(4,2)", pa.decimal128(6, 2), D("1000.00"), psycopg2.DataError),  # the server checks precision
    ("text", pa.string(), "nul \x00 inside", psycopg2.DataError),
    ("character(3)", pa.string(), "EURO", psycopg2.DataError),
    ("character varying(2)", pa.string(), "abc", psycopg2.DataError),
    ("jsonb", pa.string(), "{not json", psycopg2.DataError),
])
def test_what_postgresql_would_refuse_is_refused(warehouse_conn, sql_type, arrow, value, error):
    table = _table(warehouse_conn, "pgbinary_refused", [("id", "bigint", None, None), ("v", sql_type, None, None)])
    arrays = [pa.array([1, 2], pa.int64()), pa.array([None, value], arrow)]
    with warehouse_conn.cursor() as cur, pytest.raises(error):
        copy_binary(cur, table, arrays, ["bigint", sql_type], ["id", "v"])
    warehouse_conn.rollback()

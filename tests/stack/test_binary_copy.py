"""The stage's binary COPY (tidemark.protocol.pgbinary) against the real PostgreSQL: every type protocol
version 2 carries lands exactly as the same values sent as CSV text do, extremes and NULLs
included; what PostgreSQL would refuse is refused."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import typing
import uuid

import psycopg2
import pyarrow as pa
import pytest

from tidemark.batch.stage import copy_csv
from tidemark.protocol.pgbinary import Unencodable, copy_binary

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


# The same values through the direct extract's encoder (tidemark.DirectCopy, in the JVM), in a Python of
# its own with a local Spark: one COPY stream per case, or the encoder's refusal.
JVM_JOB = """
import base64, json, pickle, sys
from pyspark.sql import SparkSession

cases = pickle.load(open(sys.argv[1], "rb"))  # [(Spark DDL, SQL types, rows)]
spark = SparkSession.builder.config("spark.ui.enabled", "false").config("spark.sql.session.timeZone", "UTC").getOrCreate()
out = []
for ddl, types, rows in cases:
    df = spark.createDataFrame(rows, ddl)
    try:
        out.append({"stream": base64.b64encode(bytes(spark._jvm.tidemark.DirectCopy.copyStream(df._jdf, "\\n".join(types)))).decode()})
    except Exception as exc:
        out.append({"error": " ".join(str(exc).split())[:2000]})
json.dump(out, open(sys.argv[2], "w"))
spark.stop()
"""
SPARK_TYPES = {pa.int64(): "bigint", pa.int32(): "int", pa.bool_(): "boolean", pa.float32(): "float",
               pa.float64(): "double", pa.string(): "string", pa.date32(): "date"}


def _spark_type(arrow) -> str:
    if pa.types.is_decimal(arrow):
        return f"decimal({arrow.precision},{arrow.scale})"
    return "timestamp" if pa.types.is_timestamp(arrow) else SPARK_TYPES[arrow]


def _jvm_streams(settings, tmp_path, cases) -> list[dict]:
    import base64
    import json
    import os
    import pickle
    import subprocess

    from tidemark_workshop.settings import REPO_ROOT
    from tidemark_workshop.stack.spark import UDF_JAR

    (tmp_path / "cases.pickle").write_bytes(pickle.dumps([
        (", ".join(f"{name} {_spark_type(arrow)}" for name, _, arrow, _ in columns), [t for _, t, _, _ in columns],
         [tuple(row) for row in zip(*(values for _, _, _, values in columns))]) for columns in cases]))
    env = {**os.environ, **settings.runtime_env(), "PYTHONPATH": str(REPO_ROOT / "include")}
    (tmp_path / "job.py").write_text(JVM_JOB)
    proc = subprocess.run([str(settings.venv / "bin" / "spark-submit"), "--master", "local[1]",
                           "--jars", str(settings.spark_jars_dir / UDF_JAR), str(tmp_path / "job.py"),
                           str(tmp_path / "cases.pickle"), str(tmp_path / "out.json")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-5000:]
    return [{**r, **({"stream": base64.b64decode(r["stream"])} if "stream" in r else {})}
            for r in json.loads((tmp_path / "out.json").read_text())]


class Server(typing.NamedTuple):
    sqlstate: str  # the server's refusal of what the encoder sent


def test_the_direct_extracts_jvm_encoder_writes_what_the_python_one_does_and_refuses_alike(warehouse_conn, settings,
                                                                                           tmp_path):
    refusals = [  # (SQL type, Arrow type, value, what refuses it: the encoder's words, or the server's SQLSTATE)
        ("smallint", pa.int32(), 32768, "out of range [-32768, 32767]"),
        ("uuid", pa.string(), "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}", "is not a uuid in canonical form"),
        ("uuid", pa.string(), "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1g", "is not a uuid in canonical form"),
        ("uuid", pa.string(), "a0eebc99+9c0b-4ef8-bb6d-6bb9bd380a11", "is not a uuid in canonical form"),
        # a Spark type other than the one the record's Avro schema decodes to: refused, never converted
        ("bigint", pa.int32(), 5, "no exact binary COPY form here from Spark type int"),
        ("double precision", pa.float32(), 1.5, "no exact binary COPY form here from Spark type float"),
        # the server's own refusals, by SQLSTATE (a malformed stream would be 22P03 or 22P04)
        ("numeric(4,2)", pa.decimal128(6, 2), D("1000.00"), Server("22003")),  # the server checks precision
        ("text", pa.string(), "nul \x00 inside", Server("22021")),
        ("character(3)", pa.string(), "EURO", Server("22001")),
        ("character varying(2)", pa.string(), "abc", Server("22001")),
        ("jsonb", pa.string(), "{not json", Server("22P02")),
    ]
    fine = ("fine", "numeric(38,20)", pa.decimal128(38, 20),  # more than 14 decimals: the encoder's text path
            [D("0.05"), D("1E-20"), D("-123456789012345678.12345678901234567890"), None, D("0"), D("-0.00000000000000000001")])
    cases = [[*COLUMNS, fine], *([("id", "bigint", pa.int64(), [1, 2]), ("v", t, arrow, [None, value])]
                                 for t, arrow, value, _ in refusals)]
    everything, *refused = _jvm_streams(settings, tmp_path, cases)
    assert len(refused) == len(refusals)
    columns = [*COLUMNS, fine]
    names = [c for c, _, _, _ in columns]
    with warehouse_conn.cursor() as cur:
        cur.copy_expert(f"COPY {_table(warehouse_conn, 'jvm_binary', columns)} FROM STDIN WITH (FORMAT binary)",
                        io.BytesIO(everything["stream"]))
        copy_csv(cur, _table(warehouse_conn, "jvm_csv", columns), pa.table(_arrays(columns), names=names), names)
        cur.execute("SELECT fine FROM jvm_binary ORDER BY id")
        assert [v for (v,) in cur.fetchall()] == fine[3]
    jvm = _rows(warehouse_conn, "jvm_binary")
    assert len(jvm) == 6 and jvm == _rows(warehouse_conn, "jvm_csv")
    warehouse_conn.rollback()

    for (sql_type, _, value, refusal), result in zip(refusals, refused):
        if not isinstance(refusal, Server):
            assert "stream" not in result and refusal in result["error"], (sql_type, value, result)
            continue
        table = _table(warehouse_conn, "jvm_refused", [("id", "bigint", None, None), ("v", sql_type, None, None)])
        with warehouse_conn.cursor() as cur, pytest.raises(psycopg2.DataError) as raised:
            cur.copy_expert(f"COPY {table} FROM STDIN WITH (FORMAT binary)", io.BytesIO(result["stream"]))
        assert raised.value.pgcode == refusal.sqlstate, (sql_type, value, raised.value.pgcode, str(raised.value))
        warehouse_conn.rollback()

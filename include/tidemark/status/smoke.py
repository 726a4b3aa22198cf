"""The stack smoke check: seed a source table, and verify what came back through Kafka.

Used by the ``tidemark_smoke`` DAG and the stack tests. Pure psycopg2 and JSON: no Airflow.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from decimal import Decimal

TABLE = "smoke_accounts"
TOPIC = "tidemark.smoke.accounts"
PARTITIONS = 3


@dataclass(frozen=True)
class Totals:
    rows: int
    balance_sum: str  # exact decimal, as text so it survives JSON/XCom unchanged
    max_id: int

    def to_dict(self) -> dict:
        return asdict(self)


def seed_source(conn, rows: int = 1000) -> Totals:
    """(Re)create the smoke table with deterministic rows; return its control totals."""
    with conn.cursor() as cur:
        # one statement per execute: psycopg 3 binds parameters server-side, per statement
        cur.execute(f"DROP TABLE IF EXISTS {TABLE}")
        cur.execute(f"""
            CREATE TABLE {TABLE} (
                id          bigint PRIMARY KEY,
                owner       text NOT NULL,
                currency    char(3) NOT NULL,
                balance     numeric(18, 2) NOT NULL,
                updated_at  timestamptz NOT NULL
            )""")
        cur.execute(f"""
            INSERT INTO {TABLE}
            SELECT g, 'customer-' || g, (ARRAY['EUR', 'USD', 'GBP'])[1 + mod(g, 3)],
                   round(mod(g * 37.13, 100000), 2),
                   timestamptz '2026-01-01 00:00:00+00' + g * interval '1 minute'
            FROM generate_series(1, %s) AS g""", (rows,))
    conn.commit()
    return source_totals(conn)


def source_totals(conn) -> Totals:
    with conn.cursor() as cur:
        cur.execute(f"SELECT count(*), coalesce(sum(balance), 0), coalesce(max(id), 0) FROM {TABLE}")
        count, total, max_id = cur.fetchone()
    return Totals(rows=count, balance_sum=str(total), max_id=max_id)


def totals_of(values: Iterable[bytes]) -> Totals:
    """Control totals of JSON records as written by spark_jobs/table_to_topic.py."""
    rows, total, max_id, seen = 0, Decimal(0), 0, set()
    for raw in values:
        record = json.loads(raw, parse_float=Decimal)  # exact amounts, never via float
        if record["id"] in seen:
            raise ValueError(f"duplicate key id={record['id']} in {TOPIC}")
        seen.add(record["id"])
        rows += 1
        total += record["balance"]
        max_id = max(max_id, int(record["id"]))
    return Totals(rows=rows, balance_sum=str(total.quantize(Decimal("0.01"))), max_id=max_id)


def compare(expected: Totals, actual: Totals) -> list[str]:
    """Human-readable differences; empty when the round trip is exact."""
    return [
        f"{name}: source {getattr(expected, name)} != kafka {getattr(actual, name)}"
        for name in ("rows", "balance_sum", "max_id")
        if getattr(expected, name) != getattr(actual, name)
    ]

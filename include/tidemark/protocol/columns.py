"""A target table's columns as the warehouse's catalog describes them: what the record checks
(``tidemark.protocol.records``) and the events' screen (``tidemark.protocol.screen``) are made from. Pure, but for the
one catalog query of ``target_columns``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Column:
    """A target column as ``information_schema.columns`` describes it."""

    name: str
    data_type: str  # e.g. "numeric", "bigint", "timestamp with time zone", "character varying"
    not_null: bool = False
    precision: int | None = None  # numeric only
    scale: int | None = None
    max_length: int | None = None  # character types

    def describe(self) -> str:
        if self.data_type == "numeric" and self.precision is not None:
            return f"numeric({self.precision},{self.scale or 0})"
        if self.max_length is not None:
            return f"{self.data_type}({self.max_length})"
        return self.data_type


TARGET_COLUMNS_SQL = """
SELECT column_name, data_type, is_nullable = 'NO', numeric_precision, numeric_scale, character_maximum_length
  FROM information_schema.columns WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position"""


def target_columns(cur, table: str) -> list[Column]:
    schema, _, name = table.rpartition(".")
    cur.execute(TARGET_COLUMNS_SQL, (schema or "public", name))
    return [Column(n, t, bool(nn), p if t == "numeric" else None, s if t == "numeric" else None, ml)
            for n, t, nn, p, s, ml in cur.fetchall()]

"""The source's and the target's catalog and DDL: what a table has, whether the source role may
read it, the target, real-time table and serving views made from it, and the source-side reads
the planner needs (the largest id, added columns' fills).

Not the ledger: nothing here is a record of what a batch is; ``tidemark.ledger`` is."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tidemark.ledger.schema import CONTROL_SCHEMA_LOCK
from tidemark.protocol.columns import target_columns
from tidemark.protocol.spec import PipelineSpec, quote
from tidemark.protocol.window import Bound, PlanError


def source_columns(cur, table: str) -> list[tuple[str, str, bool]]:
    """(name, SQL type, not null) of a source table, in column order."""
    cur.execute(
        """SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull
             FROM pg_attribute a
            WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped
            ORDER BY a.attnum""",
        (quote(table),),
    )
    return cur.fetchall()


def added_column_fill(cur, table: str, column: str) -> tuple[bool, str | None, str | None]:
    """How a source column added to a table with rows filled them: (whether PostgreSQL keeps one
    value for every row older than the column, that value as text, the column's default now).
    A constant default is kept once (``atthasmissing``); a volatile one, or a table rewritten
    since, wrote each row its own value."""
    cur.execute(
        """SELECT a.atthasmissing, CASE WHEN a.atthasmissing THEN (a.attmissingval::text::text[])[1] END,
                  pg_get_expr(d.adbin, d.adrelid)
             FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
            WHERE a.attrelid = %s::regclass AND a.attname = %s""",
        (quote(table), column),
    )
    row = cur.fetchone()
    return (bool(row[0]), row[1], row[2]) if row else (False, None, None)


def loaded_rows_with_values(cur, spec: PipelineSpec, column: str, watermark: Bound) -> int:
    """Source rows the batches loaded (cursor up to the committed watermark) that hold a value in
    ``column``: values the target, which lacks the column, never received."""
    cur.execute(f"SELECT count(*) FROM {quote(spec.table)} WHERE {quote(column)} IS NOT NULL "
                f"AND {quote(spec.cursor.column)} <= %s", (watermark.cursor,))
    return cur.fetchone()[0]


def check_source_access(cur, spec: PipelineSpec) -> None:
    """The source connection's role can read the pipeline's table: if not, say which grant is missing."""
    schema = spec.table.split(".")[0] if "." in spec.table else "public"
    cur.execute("SELECT current_user, has_schema_privilege(%s, 'USAGE')", (schema,))
    user, usage = cur.fetchone()
    if not usage:
        raise PlanError(f"pipeline {spec.name}: the source role {user} may not use schema {schema}: "
                        f"GRANT USAGE ON SCHEMA {quote(schema)} TO {user}")
    cur.execute("SELECT to_regclass(%s)", (quote(spec.table),))
    if cur.fetchone()[0] is None:
        raise PlanError(f"pipeline {spec.name}: source table {spec.table} does not exist (field 'table' of its spec)")
    cur.execute("SELECT has_table_privilege(%s, 'SELECT')", (quote(spec.table),))
    if not cur.fetchone()[0]:
        raise PlanError(f"pipeline {spec.name}: the source role {user} may not read {spec.table}: "
                        f"GRANT SELECT ON {quote(spec.table)} TO {user}")


def ensure_target(source_cur, warehouse_cur, spec: PipelineSpec) -> bool:
    """Create the target table from the source table's columns if it does not exist yet (its
    schema only if the spec says ``create_target_schema: true``)."""
    warehouse_cur.execute("SELECT to_regclass(%s)", (quote(spec.target_table),))
    if warehouse_cur.fetchone()[0] is not None:
        return False
    schema = spec.target_table.split(".")[0] if "." in spec.target_table else "public"
    warehouse_cur.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,))
    if warehouse_cur.fetchone() is None and not spec.create_target_schema:
        raise PlanError(f"pipeline {spec.name}: the warehouse has no schema {schema} for target_table "
                        f"{spec.target_table}: create it, or set create_target_schema: true in the spec")
    columns = source_columns(source_cur, spec.table)
    names = {c[0] for c in columns}
    missing = [c for c in (*spec.primary_key, spec.cursor.column) if c not in names]
    if missing:
        raise LookupError(f"pipeline {spec.name}: source table {spec.table} has no column(s) {missing}")
    ddl = ",\n  ".join(
        f"{quote(name)} {sql_type}{' NOT NULL' if not_null else ''}" for name, sql_type, not_null in columns
    )
    pk = ", ".join(quote(c) for c in spec.primary_key)
    _take_ddl_turn(warehouse_cur)  # the nightly plan and the stream supervisor both create it on a first run
    if "." in spec.target_table:
        warehouse_cur.execute(f"CREATE SCHEMA IF NOT EXISTS {quote(spec.target_table.split('.')[0])}")
    warehouse_cur.execute(f"CREATE TABLE IF NOT EXISTS {quote(spec.target_table)} (\n  {ddl},\n  PRIMARY KEY ({pk}))")
    return True


def _take_ddl_turn(cur) -> None:
    """Concurrent first runs creating one schema or table: IF NOT EXISTS alone still races on the
    catalog's unique indexes (``pg_namespace_nspname_index``, seen in the demo), so they take turns
    until the transaction ends; the second then finds what the first made."""
    cur.execute("SELECT pg_advisory_xact_lock(%s)", (CONTROL_SCHEMA_LOCK,))


def ensure_realtime_table(cur, spec: PipelineSpec, table: str, field: str, columns: str) -> bool:
    """A real-time table made like the batch target (its columns, defaults and primary key) plus
    ``columns``, if it does not exist; whether it was made. ``LookupError`` while the target does not exist."""
    cur.execute("SELECT to_regclass(%s), to_regclass(%s)", (quote(table), quote(spec.target_table)))
    existing, target = cur.fetchone()
    if target is None:
        raise LookupError(f"pipeline {spec.name}: {field} {table} is made like the target "
                          f"{spec.target_table}, which does not exist yet: the supervisor creates it from the source "
                          f"table {spec.table} (or run the nightly DAG tidemark_batch_{spec.name} once)")
    if existing is not None:
        return False
    ensure_schema(cur, spec, table, field)
    pk = ", ".join(quote(c) for c in spec.primary_key)
    cur.execute(f"""CREATE TABLE IF NOT EXISTS {quote(table)} (
        LIKE {quote(spec.target_table)} INCLUDING DEFAULTS, {columns.strip()}, PRIMARY KEY ({pk}))""")
    return True


def ensure_schema(cur, spec: PipelineSpec, table: str, field: str) -> None:
    schema = table.split(".")[0] if "." in table else "public"
    cur.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,))
    if cur.fetchone() is None:
        if not spec.create_target_schema:
            raise LookupError(f"pipeline {spec.name}: the warehouse has no schema {schema} for {field} {table}: "
                              "create it, or set create_target_schema: true in the spec")
        _take_ddl_turn(cur)
        cur.execute(f"CREATE SCHEMA IF NOT EXISTS {quote(schema)}")


def widen_columns(cur, tables: list[str], types: dict[str, str], *, view: str | None = None,
                  remake: Callable[[], None] | None = None) -> None:
    """Columns of ``tables`` widened to ``types`` (column -> DDL type), in the caller's transaction.
    PostgreSQL retypes no column a view reads: the pipeline's own serving ``view`` is dropped first and
    made again by ``remake`` (if it existed), with the grants it had (``remake_view``); another view on
    the table, or on the serving view, makes PostgreSQL refuse (``psycopg2.Error`` naming it) and nothing
    changes. A table not made yet, or a column a table lacks, is left out."""
    def widen() -> None:
        for table in tables:
            have = {c.name for c in target_columns(cur, table)}  # none: not made yet
            if wide := {c: t for c, t in types.items() if c in have}:  # a column the table lacks stays out
                cur.execute(f"ALTER TABLE {quote(table)} "
                            + ", ".join(f"ALTER COLUMN {quote(c)} TYPE {t}" for c, t in wide.items()))

    def widen_and_remake() -> None:
        widen()
        if remake is not None:
            remake()

    if view is None:
        widen()
        return
    cur.execute("SELECT to_regclass(%s) IS NOT NULL", (quote(view),))
    if cur.fetchone()[0]:
        remake_view(cur, view, widen_and_remake)
    else:
        widen()


def remake_view(cur, view: str, remake: Callable[[], None]) -> None:
    """An existing view dropped and made again by ``remake``, in the caller's transaction, with the
    grants it had (a view's grants go with it)."""
    grants = view_grants(cur, view)
    cur.execute(f"DROP VIEW {quote(view)}")
    remake()
    for grant in grants:
        cur.execute(grant)


def view_grants(cur, view: str) -> list[str]:
    """The GRANT statements that give a view's privileges back after it is dropped and made again
    (a view's grants go with it): its owner's own are implied."""
    cur.execute("""SELECT a.privilege_type, CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                                                 ELSE quote_ident(pg_get_userbyid(a.grantee)) END, a.is_grantable
                     FROM pg_class c, aclexplode(c.relacl) a
                    WHERE c.oid = to_regclass(%s) AND a.grantee <> c.relowner""", (quote(view),))
    return [f"GRANT {privilege} ON {quote(view)} TO {grantee}{' WITH GRANT OPTION' if grantable else ''}"
            for privilege, grantee, grantable in cur.fetchall()]


def serving_views_exist(cur, view: str) -> bool:
    """Whether a serving view and its ``<view>_freshness`` both exist (then they are left as they are)."""
    cur.execute("SELECT to_regclass(%s), to_regclass(%s)", (quote(view), quote(f"{view}_freshness")))
    return None not in cur.fetchone()


def observe_id_high(cur, spec: PipelineSpec) -> tuple[int | None, Any]:
    """The largest visible id, then the source's clock: two statements, so every transaction
    the first one's snapshot could not see started before the time returned."""
    cur.execute(f"SELECT max({quote(spec.cursor.column)}) FROM {quote(spec.table)}")
    high = cur.fetchone()[0]
    cur.execute("SELECT clock_timestamp()")
    return high, cur.fetchone()[0]

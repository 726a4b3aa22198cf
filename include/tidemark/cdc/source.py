"""The source side of change data capture, with least privilege.

Tidemark never holds the source's owner rights: a DBA runs ``grant_sql`` once per pipeline (the
publication of the one table, SELECT on it for the replication role) and once per source
(the role itself). ``check_capture`` says what is missing, with the statements to run, before a
connector is created; ``slot`` reads how much WAL the pipeline's slot holds on the source.
"""

from __future__ import annotations

from dataclasses import dataclass

from tidemark.spec import PipelineSpec, quote


class CaptureNotReady(RuntimeError):
    """The source is not set up for a pipeline's capture; the message says what to run, and where."""


def _table(spec: PipelineSpec) -> tuple[str, str]:
    return tuple(spec.table.split(".")) if "." in spec.table else ("public", spec.table)  # type: ignore[return-value]


def role_sql(role: str) -> str:
    """Once per source, by a superuser: the replication role (its password set apart, never in a file)."""
    return f"CREATE ROLE {quote(role)} LOGIN REPLICATION;  -- then: \\password {role}"


def grant_sql(spec: PipelineSpec, role: str) -> list[str]:
    """Once per pipeline, by the table's owner: deletes that carry their whole row, the publication,
    and the role's right to read the table (Debezium reads its schema, and a re-snapshot its rows)."""
    schema, _ = _table(spec)
    return [
        # a DELETE then carries the row it deleted: kept, audited, in tidemark_control.cdc_deletions
        f"ALTER TABLE {quote(spec.table)} REPLICA IDENTITY FULL",
        f"CREATE PUBLICATION {quote(spec.cdc_slot)} FOR TABLE {quote(spec.table)}",
        f"GRANT USAGE ON SCHEMA {quote(schema)} TO {quote(role)}",
        f"GRANT SELECT ON {quote(spec.table)} TO {quote(role)}",
    ]


def check_capture(cur, spec: PipelineSpec, role: str) -> None:
    """Raise ``CaptureNotReady`` naming each missing piece and the statements that supply it."""
    schema, table = _table(spec)
    missing: list[str] = []
    cur.execute("SELECT current_setting('wal_level')")
    if cur.fetchone()[0] != "logical":
        missing.append("wal_level is not 'logical' (set it in postgresql.conf and restart the server)")
    cur.execute("SELECT rolreplication FROM pg_roles WHERE rolname = %s", (role,))
    row = cur.fetchone()
    if row is None:
        missing.append(f"role {role} does not exist: {role_sql(role)}")
    elif not row[0]:
        missing.append(f"role {role} lacks REPLICATION: ALTER ROLE {quote(role)} REPLICATION")
    cur.execute("SELECT 1 FROM pg_publication_tables WHERE pubname = %s AND schemaname = %s AND tablename = %s",
                (spec.cdc_slot, schema, table))
    identity, publish, *grants = grant_sql(spec, role)
    if cur.fetchone() is None:
        cur.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (spec.cdc_slot,))
        missing.append(f"publication {spec.cdc_slot} " + (
            f"does not hold {spec.table}: ALTER PUBLICATION {quote(spec.cdc_slot)} ADD TABLE {quote(spec.table)}"
            if cur.fetchone() else f"does not exist: {publish}"))
    cur.execute("SELECT relreplident FROM pg_class WHERE oid = to_regclass(%s)", (quote(spec.table),))
    found = cur.fetchone()
    if found is None:
        missing.append(f"table {spec.table} does not exist")
    elif found[0] != "f":
        missing.append(f"a DELETE on {spec.table} would carry only its key, not the row it deleted: {identity}")
    if row is not None and found is not None:
        cur.execute("SELECT has_table_privilege(%s, %s, 'SELECT')", (role, f"{quote(spec.table)}"))
        if not cur.fetchone()[0]:
            missing.append(f"role {role} may not read {spec.table}: {'; '.join(grants)}")
    if missing:
        raise CaptureNotReady(f"pipeline {spec.name}: the source is not set up for capture: " + "; ".join(missing)
                              + ". Next: have the table's owner run those statements on the source, then run the "
                              "supervisor again")


@dataclass(frozen=True)
class Slot:
    name: str
    active: bool  # a connector is reading it now
    wal_status: str  # reserved, extended, unreserved, lost (lost: the WAL it needed is gone: re-snapshot)
    retained_bytes: int  # WAL the source keeps for it
    confirmed_flush_lsn: str | None


def slot(cur, spec: PipelineSpec) -> Slot | None:
    return slot_named(cur, spec.cdc_slot)


def slot_named(cur, name: str) -> Slot | None:
    """The replication slot ``name`` (None: no such slot)."""
    cur.execute(
        """SELECT active, coalesce(wal_status, 'unknown'),
                  coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn), 0)::bigint,
                  confirmed_flush_lsn::text
           FROM pg_replication_slots WHERE slot_name = %s""",
        (name,),
    )
    row = cur.fetchone()
    return Slot(name, *row) if row else None


"""The source side of change data capture, with least privilege.

Tidemark never holds the source's owner rights: a DBA runs ``grant_sql`` once per capture, and again when
a member joins a capture group (``python -m tidemark.realtime.cdc.grants <pipeline>`` prints it; the
publication of its tables: one pipeline's, or a capture group's; SELECT on them for the replication
role) and once per source (the role itself). ``check_capture`` says what is missing, with the statements to run, before a
connector is created; ``slot`` reads how much WAL the pipeline's slot holds on the source.
"""

from __future__ import annotations

from dataclasses import dataclass

from tidemark.protocol.spec import PipelineSpec, quote
from tidemark.realtime.cdc.groups import Capture


class CaptureNotReady(RuntimeError):
    """The source is not set up for a pipeline's capture; the message says what to run, and where."""

    def __init__(self, what: str, missing: list[str]):
        self.what, self.missing = what, missing
        super().__init__(f"{what}: the source is not set up for capture: {'; '.join(missing)}. Next: have the "
                         "tables' owner run those statements on the source (`python -m tidemark.realtime.cdc.grants "
                         "<pipeline>` prints them all), then run the supervisor again")


def _table(spec: PipelineSpec) -> tuple[str, str]:
    return tuple(spec.table.split(".")) if "." in spec.table else ("public", spec.table)  # type: ignore[return-value]


def role_sql(role: str) -> str:
    """Once per source, by a superuser: the replication role (its password set apart, never in a file)."""
    return f"CREATE ROLE {quote(role)} LOGIN REPLICATION;  -- then: \\password {role}"


def grant_sql(capture: Capture, role: str) -> list[str]:
    """Once per capture, by the tables' owner: deletes that carry their whole row, the publication of
    every table it captures, and the role's right to read them (Debezium reads their schema)."""
    tables = [m.table for m in capture.members]
    beat = capture.heartbeat_table
    heartbeat = [] if beat is None else [  # Debezium writes the group's row at each heartbeat (tidemark.realtime.cdc.groups)
        f"CREATE TABLE IF NOT EXISTS {quote(beat)} (capture text PRIMARY KEY, beat_at timestamptz NOT NULL)",
        f"GRANT SELECT, INSERT, UPDATE ON {quote(beat)} TO {quote(role)}"]
    return [
        *heartbeat,
        # a DELETE then carries the row it deleted: kept, audited, in tidemark_control.cdc_deletions
        *(f"ALTER TABLE {quote(t)} REPLICA IDENTITY FULL" for t in tables),
        publication_sql(capture),
        *(f"GRANT USAGE ON SCHEMA {quote(s)} TO {quote(role)}" for s in dict.fromkeys(_table(m)[0]
                                                                                     for m in capture.members)),
        *(f"GRANT SELECT ON {quote(t)} TO {quote(role)}" for t in tables),
    ]


def publication_sql(capture: Capture) -> str:
    """The capture's publication holding exactly its tables: made, or set to them when it exists (a member
    added to a capture group: the same statements run again)."""
    tables = ", ".join(quote(t) for t in [*(m.table for m in capture.members),
                                           *([capture.heartbeat_table] if capture.heartbeat_table else [])])
    name = quote(capture.slot)
    return (f"DO $$ BEGIN IF EXISTS (SELECT 1 FROM pg_publication WHERE pubname = '{capture.slot}') THEN ALTER "
            f"PUBLICATION {name} SET TABLE {tables}; ELSE CREATE PUBLICATION {name} FOR TABLE {tables}; END IF; END $$")


def check_capture(cur, capture: Capture, role: str) -> None:
    """Raise ``CaptureNotReady`` naming each missing piece and the statements that supply it."""
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
    publication = capture.slot
    cur.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,))
    if cur.fetchone() is None:
        missing.append(f"publication {publication} does not exist: "
                       + publication_sql(capture))
        published = True  # the statement given covers every table
    else:
        published = False
    for spec in capture.members:
        missing += _table_missing(cur, spec.table, publication, role, check_published=not published)
    if capture.heartbeat_table is not None:
        missing += _table_missing(cur, capture.heartbeat_table, publication, role, check_published=not published,
                                  heartbeat=True)
    if missing:
        raise CaptureNotReady(capture.describe(), missing)


def _table_missing(cur, name: str, publication: str, role: str, *, check_published: bool,
                   heartbeat: bool = False) -> list[str]:
    """What one captured table lacks: its place in the publication, its full replica identity (a group's
    heartbeat: never deleted from), the role's SELECT (the heartbeat's: INSERT and UPDATE too)."""
    schema, table = name.split(".") if "." in name else ("public", name)
    missing: list[str] = []
    if check_published:
        cur.execute("SELECT 1 FROM pg_publication_tables WHERE pubname = %s AND schemaname = %s AND tablename = %s",
                    (publication, schema, table))
        if cur.fetchone() is None:
            missing.append(f"publication {publication} does not hold {name}: ALTER PUBLICATION "
                           f"{quote(publication)} ADD TABLE {quote(name)}")
    cur.execute("SELECT relreplident FROM pg_class WHERE oid = to_regclass(%s)", (quote(name),))
    found = cur.fetchone()
    if found is None:
        return [*missing, f"table {name} does not exist" + (
            f": CREATE TABLE {quote(name)} (capture text PRIMARY KEY, beat_at timestamptz NOT NULL)" if heartbeat else "")]
    if found[0] != "f" and not heartbeat:
        missing.append(f"a DELETE on {name} would carry only its key, not the row it deleted: "
                       f"ALTER TABLE {quote(name)} REPLICA IDENTITY FULL")
    cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,))
    if cur.fetchone() is not None:
        rights = "SELECT, INSERT, UPDATE" if heartbeat else "SELECT"
        cur.execute("SELECT bool_and(has_table_privilege(%s, %s, r)) FROM unnest(%s::text[]) r",
                    (role, quote(name), rights.split(", ")))
        if not cur.fetchone()[0]:
            missing.append(f"role {role} may not {'write' if heartbeat else 'read'} {name}: GRANT USAGE ON SCHEMA "
                           f"{quote(schema)} TO {quote(role)}; GRANT {rights} ON {quote(name)} TO {quote(role)}")
    return missing


@dataclass(frozen=True)
class Slot:
    name: str
    active: bool  # a connector is reading it now
    wal_status: str  # reserved, extended, unreserved, lost (lost: the WAL it needed is gone: re-snapshot)
    retained_bytes: int  # WAL the source keeps for it
    confirmed_flush_lsn: str | None


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


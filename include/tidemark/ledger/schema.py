"""The control schema in the warehouse: created once, from control_schema.sql beside it."""

from __future__ import annotations

import hashlib
from pathlib import Path

CONTROL_SCHEMA_LOCK = 7_411_000  # advisory lock: concurrent first runs create the schema once


def ensure_control_schema(cur) -> None:
    """Create or upgrade the control schema, only when it is not at this code's version.

    The script's ``ALTER TABLE ... ADD COLUMN IF NOT EXISTS`` takes an ACCESS EXCLUSIVE lock even
    when the column exists: run at every plan and sink start, it deadlocked with a sink committing.
    The schema's comment records the script's hash; when it matches, nothing is locked."""
    script = (Path(__file__).parent / "control_schema.sql").read_text()
    version = f"tidemark control schema {hashlib.sha256(script.encode()).hexdigest()[:16]}"
    current = "SELECT obj_description(to_regnamespace('tidemark_control'), 'pg_namespace')"
    cur.execute(current)
    if cur.fetchone()[0] == version:
        return
    cur.execute("SELECT pg_advisory_xact_lock(%s)", (CONTROL_SCHEMA_LOCK,))
    cur.execute(current)  # another process may have upgraded it while this one waited
    if cur.fetchone()[0] == version:
        return
    cur.execute(script)
    cur.execute("COMMENT ON SCHEMA tidemark_control IS %s", (version,))

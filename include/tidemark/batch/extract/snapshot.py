"""One consistent read of the source per extract: an exported snapshot every session of the read imports.

The extract's driver opens a read-only REPEATABLE READ transaction on the source, exports its
snapshot (``pg_export_snapshot``) and holds that transaction, idle, for the whole extract; every
parallel read (Spark JDBC's ``sessionInitStatement``) and the driver's own queries import it first.
So a batch is the source as of one moment, on every partition and either transport (the seed's
consistent extraction; ``pg_dump -j`` reads the same way), and a row its writers update between the
plan and the read is read at its version in that snapshot instead of being missed.

What it costs the source: while the snapshot is held, vacuum cannot remove rows that died after it
(the xmin horizon). ``Watchdog`` bounds that to the spec's ``max_snapshot_hold``. The holding
session is named ``tidemark-extract-<pipeline>`` and never writes (no transaction id), so the plans
of other pipelines do not take it for an open transaction (``tidemark.protocol.window.SOURCE_CLOCK_SQL``).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from tidemark.protocol.errors import Terminal

SNAPSHOT_NAME = re.compile(r"[0-9A-F]{8}-[0-9A-F]{8}-[0-9]+")  # as pg_export_snapshot and the walsender spell it
SAVEPOINT = "tidemark_snapshot"


class SnapshotError(Terminal):
    """Not a snapshot this package exported, or one held past its limit: the message names the next step."""


@dataclass(frozen=True)
class Snapshot:
    name: str  # for ``SET TRANSACTION SNAPSHOT``
    seen: str  # which transactions it sees, as ``pg_current_snapshot()`` prints it (xmin:xmax:xip), for the log
    taken_at: str  # the source's clock when it was taken (ISO)
    # the source's WAL insert position just after it was taken (asked for): every commit it sees lies before
    wal: str | None = None


def snapshot_init(snapshot: str) -> str:
    """The statements that make a new session read in ``snapshot`` (Spark JDBC's
    ``sessionInitStatement``). The closing SAVEPOINT fails a session that is not in a transaction
    block: there the import would last one statement and the read would see the present, silently
    (Spark's JDBC read opens a block only with a lower-case ``fetchsize`` above 0)."""
    if not SNAPSHOT_NAME.fullmatch(snapshot):
        raise SnapshotError(f"not an exported snapshot's name: {snapshot!r}")
    return (f"SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY; SET TRANSACTION SNAPSHOT '{snapshot}'; "
            f"SAVEPOINT {SAVEPOINT}")


def import_snapshot(cur, snapshot: str) -> None:
    """Make ``cur``'s transaction (not yet begun: no query run in it) read in ``snapshot``."""
    for statement in snapshot_init(snapshot).split("; "):
        cur.execute(statement)


@contextmanager
def exported(params: dict[str, Any], *, wal: bool = False) -> Iterator[Snapshot]:
    """A snapshot of the source, held for the ``with`` block by a read-only transaction of its own
    (``params``: psycopg2 connection parameters). Idle in that transaction while the read runs: no
    server timeout may end it (the watchdog bounds it instead). ``wal``: with the WAL position (a
    primary's only)."""
    import psycopg2

    conn = psycopg2.connect(**params)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SET idle_in_transaction_session_timeout = 0")
        conn.autocommit = False
        conn.set_session(isolation_level="REPEATABLE READ", readonly=True)
        with conn.cursor() as cur:
            cur.execute("SELECT pg_export_snapshot(), pg_current_snapshot()::text, clock_timestamp()"
                        + (", pg_current_wal_insert_lsn()::text" if wal else ""))
            name, seen, at, *lsn = cur.fetchone()
        yield Snapshot(name, seen, at.isoformat(), *lsn)
    finally:
        conn.close()  # read only: nothing to commit


class Watchdog:
    """Calls ``stop`` once the snapshot has been held for ``limit``; ``fired`` tells afterwards.

    A held snapshot holds back the source's vacuum: an extract that runs too long must end rather
    than bloat the source's busiest tables. ``stop`` cancels the read (Spark's jobs)."""

    def __init__(self, limit: timedelta, stop: Callable[[], None]) -> None:
        self.limit, self.fired = limit, False

        def fire() -> None:
            self.fired = True
            stop()

        self._timer = threading.Timer(limit.total_seconds(), fire)
        self._timer.daemon = True

    def __enter__(self) -> "Watchdog":
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()

    def error(self, tag: str, pipeline: str) -> SnapshotError:
        return SnapshotError(
            f"{tag}: the extract held its snapshot of the source for max_snapshot_hold {self.limit} and was stopped "
            "(a held snapshot keeps the source's vacuum from removing dead rows); nothing of this attempt is applied. "
            f"Next: give the extract more time (max_snapshot_hold in {pipeline}'s spec) or less to read per batch "
            "(max_batch_rows, or more read partitions), then clear this task")

"""One attempt's extract (``Extract``: what every step of the driver needs) and its own queries on
the source, in the attempt's snapshot. Shared by the Kafka extract (``job``) and the direct one (``direct``)."""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from tidemark.batch.extract import decisions as extract
from tidemark.batch.extract import snapshot
from tidemark.protocol.spec import PipelineSpec
from tidemark.protocol.window import EXTRACT_APPLICATION, Window
from tidemark.realtime.cdc import handoff as cdc_handoff
from tidemark.spark.entry import connect, side_queries


@dataclass
class Extract:
    """One attempt's extract: what every step needs, and the log tag that names it."""
    args: Namespace
    spec: PipelineSpec
    window: Window
    secret: str
    relation: str  # the source table, or a repair batch's subquery over it
    tag: str
    handoff: cdc_handoff.Handoff | None = None  # a handoff batch: its slot, whose snapshot every read imports
    snapshot: str | None = None  # the exported snapshot every read of the attempt imports (``reading_in_snapshot``)
    taken: snapshot.Snapshot | None = None  # a plain batch's snapshot: when, and which transactions it sees

    @property
    def application(self) -> str:
        """The extract's sessions on the source, as pg_stat_activity names them (its Spark app's name)."""
        return f"{EXTRACT_APPLICATION}{self.spec.name}"


def source_session(x: Extract):
    """The extract's own queries on the source: one read-only transaction in the attempt's snapshot."""
    if x.snapshot is None:
        return side_queries(x.args.database, x.args.user, x.secret, application=x.application)
    return _in_snapshot(x)


@contextmanager
def _in_snapshot(x: Extract) -> Iterator:
    conn = connect(x.args.database, x.args.user, x.secret, application=x.application)
    try:
        with conn.cursor() as cur:
            snapshot.import_snapshot(cur, x.snapshot)
        yield conn
    finally:
        conn.close()  # its transaction read only: nothing to commit


def non_finite(x: Extract, numerics: list[str]) -> list[str]:
    """After a failed read: the window's NaN and infinite numerics (none if the source cannot say)."""
    try:
        with source_session(x) as source, source.cursor() as cur:
            return extract.unrepresentable(cur, x.spec, x.window, x.relation, numerics, extract.NAN_OR_INFINITE)
    except Exception:  # the diagnosis must never hide the read's own error
        return []

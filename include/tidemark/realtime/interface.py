"""The speed layer's one door: what the sink, the supervisor and the status page ask of a pipeline's
real-time input, whatever its kind (``events.EventWriter``: an application's events, a spec's
``stream``; ``cdc.layer.Changes``: the source table's own changes captured by Debezium, a spec's
``cdc``). ``tidemark.realtime.speed_layer`` is the one place that tells the kinds apart.

Both keep a real-time table beside the batch target and serve the two through one serving view and
its ``<view>_freshness`` (``serving_views``, the one builder of both)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

from tidemark.ledger import catalog
from tidemark.protocol.columns import target_columns
from tidemark.protocol.records import RecordRules
from tidemark.protocol.spec import PipelineSpec, quote
from tidemark.protocol.window import Window

Reject = Callable[[dict[str, Any], str], None]  # (the record, the reason): a dead letter
FRESHNESS = ("batch_watermark", "stream_watermark", "complete_up_to")


class StreamBehind(RuntimeError):
    """A batch attempt waited for the stream as long as it may (``SpeedLayer.holds``): nothing of it applied."""


class SpeedLayer(ABC):
    """A pipeline's real-time input: its table and views, its micro-batches' apply, and what a
    committed batch makes of it."""

    section: ClassVar[str]  # the spec's section that declares it, named in errors
    signed: ClassVar[bool] = False  # its records carry the Connect worker's signature (a header the sink reads)

    def __init__(self, spec: PipelineSpec, target_table: str, serving_view: str):
        self.spec, self.target_table, self.serving_view = spec, target_table, serving_view

    @property
    @abstractmethod
    def topics(self) -> dict[str, int]:
        """The topics this pipeline's sink reads for it, with their partitions (none: another sink applies them)."""

    @abstractmethod
    def ensure(self, cur) -> bool:
        """The real-time table, if it does not exist, and the serving views; whether the table was made.
        ``LookupError`` while the batch target does not exist (it is made from the source first)."""

    def handoff_due(self, src, wh) -> bool:
        """At plan (``src``, ``wh``: cursors on the source and the warehouse): whether this batch must be the
        one the stream starts after (again)."""
        return False

    def open(self, cur) -> None:
        """At the sink's start, before it reads: every table it applies to and their views in place."""
        self.ensure(cur)

    @abstractmethod
    def views(self, cur, *, again: bool = False) -> None:
        """The serving view and ``<view>_freshness`` (``serving_views``); ``again``: made anew around
        columns that changed."""

    @abstractmethod
    def widen_target(self, cur, wider: dict[str, str]) -> None:
        """The batch target's columns widened (column -> DDL type) in the caller's transaction, with
        whatever of the speed layer reads them."""

    @abstractmethod
    def rules(self, cur) -> RecordRules | None:
        """At start and at each apply: what its records are checked by (``LookupError`` when its table
        cannot take them)."""

    def read_checks(self, cur) -> tuple[str, RecordRules] | None:
        """The topic whose records Spark may check where it reads them, and their rules; None: checked
        at the apply only."""
        return None

    @abstractmethod
    def apply(self, cur, records, fence: int, micro_batch: int | None, report, reject: Reject) -> None:
        """One micro-batch's records of ``topics`` (a pyarrow table), in the sink's transaction."""

    @abstractmethod
    def compact(self, cur, batch_id: str, window: Window) -> str:
        """In a batch's commit: the real-time rows it makes redundant; what was done, for the commit's line."""

    def released(self, cur) -> list[tuple[str, int]]:
        """Batch attempts that waited for this stream and may commit now (by the sink that applies it)."""
        return []

    def holds(self, cur, batch_id: str, attempt: int, told: set[tuple[str, int]]) -> bool:
        """Whether the attempt must wait for this stream before it commits (``told``: the attempts already
        logged as waiting, kept by the sink)."""
        return False

    def fenced(self, cur, fence: int) -> None:
        """After the sink took ``fence``: what the supervisor compares with what it should read."""

    def freshness(self, cur) -> dict[str, Any] | None:
        """The serving view's freshness row (None: the view is not made yet)."""
        view = f"{self.serving_view}_freshness"
        cur.execute("SELECT to_regclass(%s)", (quote(view),))
        if cur.fetchone()[0] is None:
            return None
        cur.execute(f"SELECT {', '.join(FRESHNESS)} FROM {quote(view)}")
        return dict(zip(FRESHNESS, cur.fetchone()))


def serving_views(cur, spec: PipelineSpec, *, view: str, live: str, field: str, own: tuple[str, ...], comment: str,
                  stream_watermark: str, params: dict[str, Any], deleted: str | None = None,
                  ready: str = "", again: bool = False) -> None:
    """The serving ``view`` over the batch target and the real-time table ``live`` (one row per key: the
    newest version by cursor, the batch's on a tie; with ``deleted``, the SQL condition of a row that
    records a deletion, the key is hidden and a deletion wins a tie, for it deleted that very version)
    and ``<view>_freshness``: the batch watermark, ``stream_watermark`` (a scalar query with
    ``params``), and the later of the two: up to when the view is complete. ``ready``: a condition
    both sides of the view add (no row until it holds). Its columns are the batch target's, then those
    only ``live`` has (not its ``own`` bookkeeping columns); each side gives NULL for one it lacks.
    Left as they are when both exist, unless ``again``."""
    freshness = f"{view}_freshness"
    if catalog.serving_views_exist(cur, view) and not again:
        return
    catalog.ensure_schema(cur, spec, view, field)
    batch_cols = {c.name: c for c in target_columns(cur, spec.target_table)}
    live_cols = {c.name: c for c in target_columns(cur, live) if c.name not in own}
    names = [*batch_cols, *(c for c in live_cols if c not in batch_cols)]

    def side(alias: str, have: dict) -> str:
        other = live_cols if have is batch_cols else batch_cols
        return ", ".join(f"{alias}.{quote(c)}" if c in have else f"NULL::{other[c].describe()} AS {quote(c)}"
                         for c in names)

    batch, cursor = quote(spec.target_table), quote(spec.cursor.column)
    same_key = " AND ".join(f"b.{quote(c)} = r.{quote(c)}" for c in spec.primary_key)
    newer = f"r.{cursor} > b.{cursor}"
    if deleted is not None:
        newer = f"({newer} OR ({deleted} AND r.{cursor} >= b.{cursor}))"
    shown = "" if deleted is None else f"NOT {deleted} AND "
    ready = f" AND {ready}" if ready else ""

    def make() -> None:
        cur.execute(f"""CREATE OR REPLACE VIEW {quote(view)} AS
            SELECT {side("b", batch_cols)} FROM {batch} b
             WHERE NOT EXISTS (SELECT 1 FROM {quote(live)} r WHERE {same_key} AND {newer}){ready}
            UNION ALL
            SELECT {side("r", live_cols)} FROM {quote(live)} r
             WHERE {shown}NOT EXISTS (SELECT 1 FROM {batch} b WHERE {same_key} AND b.{cursor} >= r.{cursor}){ready}""")

    if again and names[:len(before := [c.name for c in target_columns(cur, view)])] != before:
        # a column in a new place: a view cannot be replaced with its columns moved; its grants are given back
        catalog.remake_view(cur, view, make)
    else:
        make()
    cur.execute(f"COMMENT ON VIEW {quote(view)} IS %s", (f"{comment}; complete up to {freshness}.complete_up_to",))
    cur.execute(f"""CREATE OR REPLACE VIEW {quote(freshness)} AS
        SELECT w.batch_watermark, s.stream_watermark, greatest(w.batch_watermark, s.stream_watermark) AS complete_up_to
          FROM (SELECT (SELECT cursor_ts FROM tidemark_control.watermarks WHERE pipeline = %(pipeline)s)
                       AS batch_watermark) w,
               (SELECT ({stream_watermark}) AS stream_watermark) s""", {"pipeline": spec.name, **params})

"""A CDC pipeline's real-time table and serving view in the warehouse.

The real-time table holds, per key, the newest version the change stream applied: the batch
target's columns, plus the source transaction that wrote it (``_tm_txid``, ``_tm_lsn`` its commit
position) and ``_tm_deleted`` (a DELETE at the source: the row as the DELETE saw it, kept so that
the serving view hides the key and the batch's older version of it). The serving view merges it
with the batch target: per key, the version with the newest cursor, the batch's on a tie, except
that a deletion wins a tie (it deleted that very version); deleted keys are not shown.
"""

from __future__ import annotations

from tidemark.ledger import catalog
from tidemark.protocol.columns import target_columns
from tidemark.protocol.spec import PipelineSpec, quote
from tidemark.protocol.window import literal
from tidemark.realtime.cdc.changes import Shape, shape_of_column
from tidemark.realtime.cdc.groups import capture_consumer

CDC_COLUMNS = ("_tm_txid", "_tm_lsn", "_tm_deleted", "_tm_fence", "_tm_micro_batch", "_tm_applied_at")


def ensure_cdc_target(cur, spec: PipelineSpec) -> bool:
    """Create the real-time table (``cdc.target_table``) like the batch target, and the serving
    views; ``LookupError`` while the batch target does not exist. Whether the table was created."""
    assert spec.cdc is not None
    created = catalog.ensure_realtime_table(cur, spec, spec.cdc.target_table, "cdc.target_table", """
        _tm_txid bigint NOT NULL, _tm_lsn bigint NOT NULL, _tm_deleted boolean NOT NULL DEFAULT false,
        _tm_fence bigint NOT NULL, _tm_micro_batch bigint,
        _tm_applied_at timestamptz NOT NULL DEFAULT clock_timestamp()""")
    ensure_cdc_serving_view(cur, spec)
    return created


def realtime_shapes(cur, spec: PipelineSpec) -> dict[str, Shape | None]:
    """The real-time table's columns (without Tidemark's own) and their shapes, in order."""
    assert spec.cdc is not None
    return {c.name: shape_of_column(c.data_type, c.precision, c.scale, c.max_length)
            for c in target_columns(cur, spec.cdc.target_table) if c.name not in CDC_COLUMNS}


def add_columns(cur, spec: PipelineSpec, added: dict[str, Shape]) -> None:
    """Columns the source gained, added to the real-time table (nullable: its older versions are from
    before them) ahead of the first change that carries them, in the caller's transaction; the
    serving view is made again to show them. The batch target gains them from its own next batch."""
    assert spec.cdc is not None
    live = quote(spec.cdc.target_table)
    cur.execute(f"ALTER TABLE {live} " + ", ".join(f"ADD COLUMN IF NOT EXISTS {quote(c)} {shape.ddl()}"
                                                   for c, shape in added.items()))
    ensure_cdc_serving_view(cur, spec, again=True)


def widen_columns(cur, spec: PipelineSpec, table: str, widened: dict[str, str]) -> None:
    """Columns the source widened (column -> DDL type), widened in ``table`` (the real-time table, or the
    batch target at its next batch) in the caller's transaction; the serving view, which reads both, is
    made again around it with its grants (``catalog.widen_columns``)."""
    assert spec.cdc is not None
    catalog.widen_columns(cur, [table], widened, view=spec.cdc.serving_view,
                          remake=lambda: ensure_cdc_serving_view(cur, spec, again=True))


def ensure_cdc_serving_view(cur, spec: PipelineSpec, *, again: bool = False) -> None:
    """The serving view, and ``<view>_freshness``: the batch watermark, the source commit time of
    the last transaction applied, and the later of the two (up to when the view is complete).
    ``again``: made anew (a column was added to one of its tables). Its columns are the batch
    target's, then those only the real-time table has yet; each side gives NULL for one it lacks."""
    cdc = spec.cdc
    assert cdc is not None
    view, freshness = cdc.serving_view, f"{cdc.serving_view}_freshness"
    if catalog.serving_views_exist(cur, view) and not again:
        return
    catalog.ensure_schema(cur, spec, view, "cdc.serving_view")
    batch_cols = {c.name: c for c in target_columns(cur, spec.target_table)}
    live_cols = {c.name: c for c in target_columns(cur, cdc.target_table) if c.name not in CDC_COLUMNS}
    names = [*batch_cols, *(c for c in live_cols if c not in batch_cols)]

    def side(alias: str, have: dict) -> str:
        other = live_cols if have is batch_cols else batch_cols
        return ", ".join(f"{alias}.{quote(c)}" if c in have else f"NULL::{other[c].describe()} AS {quote(c)}"
                         for c in names)

    batch, live, cursor = quote(spec.target_table), quote(cdc.target_table), quote(spec.cursor.column)
    same_key = " AND ".join(f"b.{quote(c)} = r.{quote(c)}" for c in spec.primary_key)
    ready = f" AND {group_ready(cdc.group)}" if cdc.group else ""

    def make() -> None:
        cur.execute(f"""CREATE OR REPLACE VIEW {quote(view)} AS
            SELECT {side("b", batch_cols)} FROM {batch} b
             WHERE NOT EXISTS (SELECT 1 FROM {live} r WHERE {same_key}
                                 AND (r.{cursor} > b.{cursor} OR (r._tm_deleted AND r.{cursor} >= b.{cursor}))){ready}
            UNION ALL
            SELECT {side("r", live_cols)} FROM {live} r
             WHERE NOT r._tm_deleted
               AND NOT EXISTS (SELECT 1 FROM {batch} b WHERE {same_key} AND b.{cursor} >= r.{cursor}){ready}""")

    if again and names[:len(shown := _view_columns(cur, view))] != shown:
        # a column in a new place: a view cannot be replaced with its columns moved; its grants are given back
        catalog.remake_view(cur, view, make)
    else:
        make()
    cur.execute(f"COMMENT ON VIEW {quote(view)} IS %s",
                (f"Tidemark pipeline {spec.name}: {spec.target_table} merged with the source's changes in "
                 f"{cdc.target_table}, one row per key, newest {spec.cursor.column} wins, deleted keys hidden; "
                 f"complete up to {freshness}.complete_up_to",))
    cur.execute(f"""CREATE OR REPLACE VIEW {quote(freshness)} AS
        SELECT w.batch_watermark, s.stream_watermark, greatest(w.batch_watermark, s.stream_watermark) AS complete_up_to
          FROM (SELECT (SELECT cursor_ts FROM tidemark_control.watermarks WHERE pipeline = %(pipeline)s)
                       AS batch_watermark) w,
               (SELECT (SELECT to_timestamp(source_ms / 1000.0) FROM tidemark_control.cdc_positions
                         WHERE consumer = %(consumer)s) AS stream_watermark) s""",
                {"pipeline": spec.name, "consumer": capture_consumer(spec)})


def group_ready(group: str) -> str:
    """The condition under which a capture group's serving views show rows: every member (as its lead's
    sink registered them, ``ledger.register_group``) has a committed handoff. Until then each shows none:
    one member's rows beside another's missing ones would be a state the source never had. Read in the
    reader's own snapshot, with the rows: the views appear together, at one moment of the group's stream
    (a member's batch commits only once the stream has passed its snapshot)."""
    return f"""EXISTS (SELECT 1 FROM tidemark_control.capture_groups g WHERE g.name = {literal(group)}
                  AND cardinality(g.members) > 0 AND NOT EXISTS (SELECT 1 FROM unnest(g.members) m(pipeline) WHERE NOT EXISTS (
                      SELECT 1 FROM tidemark_control.cdc_handoffs h
                        JOIN tidemark_control.batches hb ON hb.batch_id = h.batch_id
                                                        AND hb.committed_attempt = h.attempt
                       WHERE h.pipeline = m.pipeline AND hb.state = 'committed')))"""


def _view_columns(cur, view: str) -> list[str]:
    """The view's columns in order (none: no such view)."""
    return [c.name for c in target_columns(cur, view)]

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
from tidemark.realtime.interface import serving_views

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
    """The serving views (``serving_views``): a deleted key hidden, a capture group's shown once all its
    members' handoffs committed; the stream's watermark: the source commit time of the last transaction
    applied. ``again``: made anew (a column was added to one of its tables)."""
    cdc = spec.cdc
    assert cdc is not None
    serving_views(cur, spec, view=cdc.serving_view, live=cdc.target_table, field="cdc.serving_view",
                  own=CDC_COLUMNS, deleted="r._tm_deleted", ready=group_ready(cdc.group) if cdc.group else "",
                  again=again,
                  comment=f"Tidemark pipeline {spec.name}: {spec.target_table} merged with the source's changes in "
                          f"{cdc.target_table}, one row per key, newest {spec.cursor.column} wins, deleted keys hidden",
                  stream_watermark="SELECT to_timestamp(source_ms / 1000.0) FROM tidemark_control.cdc_positions "
                                   "WHERE consumer = %(consumer)s",
                  params={"consumer": capture_consumer(spec)})


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

"""The batch target's columns, and the record rules made from them: read once, read again after a
batch widened the target or added columns to it (protocol version 2: the source's own schema)."""

from __future__ import annotations

import logging

from tidemark import ledger
from tidemark.ledger import catalog
from tidemark.protocol.avro import sql_type, widens
from tidemark.protocol.columns import target_columns
from tidemark.protocol.records import RecordRules
from tidemark.protocol.spec import PipelineSpec, quote
from tidemark.realtime.interface import SpeedLayer

log = logging.getLogger("tidemark.sink")


class TargetColumns:
    """The target's columns and record rules, shared by the intake's checks and the commit's columns."""

    def __init__(self, spec: PipelineSpec, speed: SpeedLayer | None):
        self.spec, self.speed = spec, speed  # the speed layer reads the target too: its views follow it
        self._rules: RecordRules | None = None

    def rules(self, cur) -> RecordRules:
        """The checks of a record against the target's columns (read once, again after a batch changed them)."""
        if self._rules is None:
            self._rules = RecordRules(self.spec, target_columns(cur, self.spec.target_table))
        return self._rules

    def names(self, cur) -> list[str]:
        return list(self.rules(cur).columns)

    def _widen(self, cur, batch_id: str, fmt) -> None:
        """Target columns the source widened since (``avro.widens``): widened to the record schema's
        types in this transaction, the pipeline's serving view made again around them with its grants."""
        target = {name: kind for name, kind, _ in catalog.source_columns(cur, self.spec.target_table)}
        wider = {c.name: sql_type(c.sql_type) for c in fmt[1] if c.name in target and widens(target[c.name], c.sql_type)}
        if not wider:
            return
        if self.speed is not None:  # with what of the speed layer reads them
            self.speed.widen_target(cur, wider)
        else:
            catalog.widen_columns(cur, [self.spec.target_table], wider)
        log.warning("pipeline=%s batch=%s: target %s widened column(s) %s (record schema version %s)", self.spec.name,
                    batch_id, self.spec.target_table, ", ".join(f"{c} from {target[c]} to {t}" for c, t in wider.items()),
                    fmt[0])
        self._rules = None  # the target's columns changed

    def for_batch(self, cur, batch_id: str, fmt) -> list[str]:
        """The columns a batch writes: the target's (version 1, no ``fmt``), or its record schema's (version 2:
        ``fmt``, its stage's format; source columns the target lacks are added first, in this transaction)."""
        if fmt is None:
            return self.names(cur)
        have = set(self.names(cur))
        self._widen(cur, batch_id, fmt)
        fills = ledger.column_fills(cur, batch_id)  # the plan found what the source's older rows hold
        for c in fmt[1]:
            if c.name not in have:
                fill = fills.get(c.name)
                default = cur.mogrify(f" DEFAULT %s::{sql_type(c.sql_type)}", (fill,)).decode() if fill is not None else ""
                cur.execute(f"ALTER TABLE {quote(self.spec.target_table)} ADD COLUMN {quote(c.name)} "
                            f"{sql_type(c.sql_type)}{default}")
                log.warning("pipeline=%s batch=%s: target %s gained column %s %s%s (record schema version %s)",
                            self.spec.name, batch_id, self.spec.target_table, c.name, c.sql_type,
                            f", its rows loaded before hold {fill!r} as the source's do" if fill is not None else "",
                            fmt[0])
                self._rules = None  # the target's columns changed
                if self.speed is not None:  # the serving view shows the batch's side of it from now on
                    self.speed.views(cur, again=True)
        return [c.name for c in fmt[1]]

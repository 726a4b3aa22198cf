"""What one micro-batch did (``MicroBatchReport``), its dead letters (``Rejects``), the sink's two
errors, and the small helpers its modules share to describe a micro-batch's records."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from tidemark.protocol.control import ControlMessage
from tidemark.protocol.progress import Steps

log = logging.getLogger("tidemark.sink")


class FencedError(RuntimeError):
    """Another sink instance took over this consumer; this one must stop without committing."""


class SinkError(RuntimeError):
    """An error the sink cannot classify as bad input: the job fails, naming where it was."""


FIRST_REASONS = 3  # how many dead-letter reasons a refusal message quotes


@dataclass
class MicroBatchReport:
    replayed: int = 0  # records already applied (below the stored offsets, or a recorded micro-batch)
    events: int = 0  # events applied to the real-time table
    duplicates: int = 0  # events already there, unchanged (a redelivery)
    superseded: int = 0  # events older than the version already there (upserted entities)
    staged: int = 0
    discarded: int = 0  # records of superseded, aborted or already committed attempts
    rejected: int = 0  # unusable records and control messages (also in sink_rejects)
    committed: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    rejects: list[dict[str, Any]] = field(default_factory=list)
    recorded: int = 0  # how many of ``rejects`` are already in sink_rejects
    steps: Steps = field(default_factory=Steps)  # where the micro-batch's time went, for its log line

    COUNTS = ("replayed", "events", "duplicates", "superseded", "staged", "discarded", "rejected")

    def add(self, other: MicroBatchReport) -> None:
        """Adds ``other``'s counts and batches to these (a sink run's totals)."""
        for name in self.COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.committed += other.committed
        self.refused += other.refused

    def totals(self) -> dict[str, Any]:
        """The counts and batches, as the sink's summary line gives them."""
        return {**{name: getattr(self, name) for name in self.COUNTS},
                "committed": list(self.committed), "refused": list(self.refused)}


class Rejects:
    """The micro-batch's dead letters: each record or control message that cannot be used, with its
    reason, added to the report (the sink writes ``report.rejects`` to sink_rejects) and logged (a
    sample and counts, in a flood)."""

    def __init__(self, pipeline: str, topic: str):
        self.pipeline, self.topic = pipeline, topic

    def __call__(self, report: MicroBatchReport, rec: dict[str, Any], reason: str,
                 msg: ControlMessage | None = None) -> None:
        report.rejected += 1
        batch_id = msg.batch_id if msg else rec.get("batch_id")
        attempt = msg.attempt if msg else _int_or_none(rec.get("attempt"))
        report.rejects.append({
            "topic": rec.get("topic") or self.topic,
            "partition": rec["partition"], "offset": rec["offset"], "batch_id": batch_id, "attempt": attempt,
            "reason": reason, "payload": rec.get("value"), "key": rec.get("key"), "control": rec.get("control"),
        })
        if report.rejected <= 20 or report.rejected % 1000 == 0:  # a flood of bad records: a sample and counts
            log.error("pipeline=%s batch=%s attempt=%s %s/%s@%s DEAD LETTER (%s so far in this micro-batch): %s",
                      self.pipeline, batch_id, attempt, rec.get("topic") or self.topic, rec["partition"],
                      rec["offset"], report.rejected, reason)


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def loaded(loads) -> int:
    """How many records the executors staged (``tidemark.batch.stage`` load rows; None: none)."""
    import pyarrow.compute as pc

    return 0 if loads is None or not loads.num_rows else pc.sum(loads["load_rows"]).as_py()


def extents(table, loads=None) -> list[dict[str, Any]]:
    """The first and last offset (``offset_min``, ``offset_max``) per topic and partition of a
    micro-batch: the records the driver holds and the loads the executors staged."""
    import pyarrow as pa

    parts = [table.select(["topic", "partition", "offset"])]
    if loaded(loads):
        for first in ("load_first", "offset"):  # a load row's offset is its last record's
            parts.append(pa.table({"topic": loads["topic"], "partition": loads["partition"],
                                   "offset": loads[first]}).cast(parts[0].schema))
    both = pa.concat_tables(parts)
    return both.group_by(["topic", "partition"]).aggregate([("offset", "min"), ("offset", "max")]).to_pylist()


def positions(table, loads=None) -> str:
    """Partitions and offset ranges of a micro-batch, for error messages."""
    ranges = extents(table, loads)
    return ", ".join(f"{r['topic']}/{r['partition']}@{r['offset_min']}..{r['offset_max']}" for r in
                     sorted(ranges, key=lambda r: (r["topic"], r["partition"]))) or "(empty)"

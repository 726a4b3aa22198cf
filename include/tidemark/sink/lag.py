"""How far a pipeline's sink is behind its topics, and the nightly batch's backpressure from it."""

from __future__ import annotations

import logging

from tidemark import ledger
from tidemark.protocol.kafka_io import end_offsets
from tidemark.protocol.spec import PipelineSpec

log = logging.getLogger(__name__)


def records_behind(ends: dict[int, int], stored: dict[int, int], *, transactional: bool = True) -> dict[int, int]:
    """Per partition, how far the offsets committed in the warehouse are behind the topic's end.

    On a ``transactional`` topic (the pipeline's own), one offset at the end of a partition is not
    counted: a control message travels in a Kafka transaction, whose commit marker takes an offset
    that no consumer ever reads, so a sink that has read everything still sits one offset short
    (a healthy idle sink must show no lag). Events are published without transactions."""
    marker = 1 if transactional else 0
    return {p: max(end - stored.get(p, 0) - marker, 0) for p, end in ends.items()}


def sink_lag(spec: PipelineSpec, wh, bootstrap: str, *, timeout_s: float = 3.0,
             realtime: dict[str, int] | None = None) -> dict[int | str, int] | None:
    """Records per partition beyond the offsets the pipeline's sink committed in the warehouse: on
    its topic (keys: partitions), and on its real-time topics (keys: ``<topic>/<partition>``): its
    stream's, its own CDC topics, or ``realtime`` (a capture group's lead reads the group's). None
    when the broker cannot tell now (no topic yet, or it is away)."""
    topics = [(spec.topic, True), *((t, False) for t in (spec.realtime_topics if realtime is None else realtime))]
    lag: dict[int | str, int] = {}
    for topic, transactional in topics:
        try:
            ends = end_offsets(bootstrap, topic, timeout_s=timeout_s)
        except Exception as exc:
            log.warning("pipeline=%s lag unknown: cannot read end offsets of %s (%s)", spec.name, topic, exc)
            return None
        with wh, wh.cursor() as cur:
            stored = ledger.stored_offsets(cur, ledger.consumer_for(spec.name), topic)
        behind = records_behind(ends, stored, transactional=transactional)
        lag.update(behind if topic == spec.topic else {f"{topic}/{p}": n for p, n in behind.items()})
    return lag


def backpressure(spec: PipelineSpec, wh, bootstrap: str) -> tuple[bool, str]:
    """Whether a nightly batch may go on now (its sink is within ``sink.max_lag``), and why."""
    if spec.sink.max_lag is None:
        return True, f"pipeline={spec.name} has no sink.max_lag: no backpressure"
    parts = sink_lag(spec, wh, bootstrap)
    if parts is None:
        return True, f"pipeline={spec.name} sink lag unknown (no topic yet, or the broker is away): going on"
    lag = sum(parts.values())
    verdict = "within" if lag <= spec.sink.max_lag else "beyond"
    return lag <= spec.sink.max_lag, (f"pipeline={spec.name} sink lags {lag} records {parts} on {spec.topic}, "
                                      f"{verdict} sink.max_lag {spec.sink.max_lag}")

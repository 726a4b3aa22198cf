"""The speed layer: payment events (``events``) and the source database's own changes captured by
Debezium (``cdc/``), applied to real-time tables and served beside the batch tables, both behind one
interface (``interface.SpeedLayer``); ``speed_layer`` gives a pipeline's."""

from __future__ import annotations

from pathlib import Path

from tidemark.ledger import consumer_for
from tidemark.protocol.spec import PipelineSpec
from tidemark.realtime.cdc.groups import capture_of, load_capture
from tidemark.realtime.cdc.layer import Changes
from tidemark.realtime.cdc.signing import Verifier
from tidemark.realtime.events import EventWriter
from tidemark.realtime.interface import SpeedLayer


def speed_layer(spec: PipelineSpec, *, specs_dir: Path | None = None,
                verifier: Verifier | None = None) -> SpeedLayer | None:
    """The pipeline's speed layer, None when it has no real-time input. ``specs_dir``: where its capture
    group's other specs are, for the sink that applies or waits for the group's stream (without it, a
    group's member is taken as its group's only one: enough for its own tables, views and handoff, what
    the plan, the supervisor's table-making and the status page ask); ``verifier``: to apply change
    records (the Connect worker's signatures)."""
    if spec.stream is not None:
        return EventWriter(spec, consumer_for(spec.name))
    if spec.cdc is not None:
        capture = load_capture(spec, specs_dir) if specs_dir is not None else capture_of(spec, [spec])
        return Changes(spec, capture, verifier)
    return None

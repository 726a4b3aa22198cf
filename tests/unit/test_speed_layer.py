"""The speed layer's one door (``tidemark.realtime``): each kind of real-time input behind the one
interface, picked in one place, and nothing above it telling the kinds apart."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tidemark.protocol.spec import PipelineSpec
from tidemark.realtime import speed_layer
from tidemark.realtime.cdc.layer import Changes
from tidemark.realtime.cdc.signing import Verifier
from tidemark.realtime.events import EventWriter
from tidemark.realtime.interface import SpeedLayer

CORE = Path(__file__).resolve().parents[2] / "include" / "tidemark"
BASE = {"name": "ledger", "table": "core.ledger_entries", "primary_key": ["entry_id"],
        "cursor": {"kind": "timestamp", "column": "updated_at"}, "safe_lag": "PT5M", "target_table": "dw.ledger",
        "sink": {"mode": "standing"}}
STREAM = {"topic": "core.payment_events", "key": "entry_id", "event_time": "updated_at", "partitions": 3,
          "target_table": "rt.ledger", "serving_view": "serving.ledger"}
CDC = {"target_table": "rt.ledger", "serving_view": "serving.ledger"}


def _spec(**extra) -> PipelineSpec:
    return PipelineSpec.model_validate({**BASE, **extra})


def test_each_kind_is_one_speed_layer_picked_in_one_place():
    assert speed_layer(_spec()) is None
    events = speed_layer(_spec(stream=STREAM))
    assert isinstance(events, EventWriter) and isinstance(events, SpeedLayer)
    assert events.topics == {"core.payment_events": 3} and events.serving_view == "serving.ledger"
    assert events.section == "stream" and not events.signed
    changes = speed_layer(_spec(cdc=CDC), verifier=Verifier.__new__(Verifier))
    assert isinstance(changes, Changes) and changes.section == "cdc" and changes.signed
    assert changes.topics == {"tidemark.cdc.ledger.core.ledger_entries": 1, "tidemark.cdc.ledger.transaction": 1}
    assert changes.writer is not None  # it reads its own changes: it applies them
    assert speed_layer(_spec(cdc=CDC)).writer is None  # no verifier: it can report, not apply


def test_a_capture_groups_member_reads_nothing_its_lead_applies_everything(tmp_path):
    for name in ("accounts", "balances"):
        spec = {**BASE, "name": name, "table": f"core.{name}", "target_table": f"dw.{name}",
                "cdc": {"target_table": f"rt.{name}", "serving_view": f"serving.{name}", "group": "bank"}}
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(spec))
    verifier = Verifier.__new__(Verifier)
    lead = speed_layer(PipelineSpec.model_validate(yaml.safe_load((tmp_path / "accounts.yaml").read_text())),
                       specs_dir=tmp_path, verifier=verifier)
    member = speed_layer(PipelineSpec.model_validate(yaml.safe_load((tmp_path / "balances.yaml").read_text())),
                         specs_dir=tmp_path, verifier=verifier)
    # both change topics, the heartbeat table's and the one transaction topic
    assert lead.lead and len(lead.topics) == 4 and lead.writer is not None
    assert not member.lead and member.topics == {} and member.writer is None


def test_nothing_above_the_speed_layer_tells_its_kinds_apart():
    """The sink and the batch's steps (plan, begin, end) reach the speed layer through the interface: no
    test of ``spec.stream`` or ``spec.cdc`` is left in them. (The extract's handoff read, the capture's
    supervision and the status page's capture line are CDC's own by nature, and test ``spec.cdc``.)"""
    asks = re.compile(r"\bspec\.(stream|cdc)\b(?!_)")
    found = {str(p.relative_to(CORE)): n for folder in ("sink", "batch")
             for p in (CORE / folder).glob("*.py") if (n := len(asks.findall(p.read_text())))}
    assert found == {}

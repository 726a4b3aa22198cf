"""The sink as composition (``tidemark.sink``): its parts are objects with their own state, sharing one
stage area and one way to dead-letter a record; what needs no warehouse is tested here (the stack
tests run them together against PostgreSQL)."""

from __future__ import annotations

import logging
from datetime import datetime, timezone

from tidemark.protocol.control import Keyring, messages
from tidemark.protocol.spec import PipelineSpec
from tidemark.protocol.window import Bound, Window
from tidemark.sink import BatchSink
from tidemark.sink.commit import Commit
from tidemark.sink.intake import Intake
from tidemark.sink.report import MicroBatchReport, Rejects
from tidemark.sink.stages import StageArea
from tidemark.sink.target import TargetColumns
from tidemark.sink.verify import Verification

UTC = timezone.utc
SPEC = PipelineSpec.model_validate({
    "name": "ledger", "table": "core.ledger_entries", "primary_key": ["entry_id"],
    "cursor": {"kind": "timestamp", "column": "updated_at"}, "safe_lag": "PT5M", "target_table": "dw.ledger",
    "partitions": 3})
KEYS = Keyring.parse("k1:" + "a" * 32, source="test")
WINDOW = Window(Bound(datetime(2026, 1, 1, tzinfo=UTC)), Bound(datetime(2026, 1, 2, tzinfo=UTC))).to_json()


def _intake(keyring: Keyring = KEYS) -> tuple[Intake, Rejects]:
    reject = Rejects(SPEC.name, SPEC.topic)
    return Intake(SPEC, keyring, "tidemark:ledger", StageArea(SPEC), TargetColumns(SPEC, None), None, reject), reject


def _record(msg, **changes) -> dict:
    return {"topic": SPEC.topic, "partition": msg.partition, "offset": 7, "key": None, "value": msg.encode(),
            "control": msg.kind, "batch_id": msg.batch_id, "attempt": str(msg.attempt), **changes}


def _begin(partition: int = 0, **fields):
    sent = messages("BEGIN", pipeline=SPEC.name, batch_id="ledger:run-1", attempt=2, window=WINDOW,
                    partitions=SPEC.partitions, **fields)
    return KEYS.sign(sent[partition])


def test_the_sink_is_composed_of_its_parts_not_mixed_from_them():
    assert BatchSink.__mro__ == (BatchSink, object)
    for part in (Intake, Verification, Commit, TargetColumns, Rejects):
        assert part.__mro__ == (part, object)


def test_a_dead_letter_carries_its_place_reason_and_attempt_and_the_log_samples_a_flood(caplog):
    reject, report = Rejects("ledger", "tidemark.ledger"), MicroBatchReport()
    with caplog.at_level(logging.ERROR, logger="tidemark.sink"):
        for offset in range(1500):
            reject(report, {"partition": 1, "offset": offset, "value": b"{}", "key": b"k", "attempt": "x"}, "bad")
    first = report.rejects[0]
    assert report.rejected == 1500 and len(report.rejects) == 1500
    assert (first["topic"], first["partition"], first["offset"], first["attempt"], first["reason"]) == \
        ("tidemark.ledger", 1, 0, None, "bad")  # an attempt header that is no number is None, not a crash
    assert len(caplog.records) == 21  # the first twenty, then one per thousand
    assert "pipeline=ledger" in caplog.records[0].message and "DEAD LETTER" in caplog.records[0].message


def test_intake_takes_a_signed_control_message_for_its_pipeline_and_partition():
    intake, _ = _intake()
    report = MicroBatchReport()
    msg = _begin()
    assert intake.decode(None, _record(msg), report) == msg and report.rejected == 0


def test_intake_dead_letters_forged_misrouted_and_misshapen_control_messages():
    intake, _ = _intake()
    forged = Keyring.parse("k1:" + "b" * 32, source="test").sign(_begin())
    cases = {
        "does not match its content": _record(forged),
        "do not match this topic's pipeline": _record(_begin(1), partition=0),
        "unsigned": _record(_begin().model_copy(update={"signature": None, "key_id": None})),
        "BEGIN message rejected": _record(_begin(), value=b"not json"),
    }
    for why, rec in cases.items():
        report = MicroBatchReport()
        assert intake.decode(None, rec, report) is None, why
        assert report.rejected == 1 and why in report.rejects[0]["reason"], (why, report.rejects)

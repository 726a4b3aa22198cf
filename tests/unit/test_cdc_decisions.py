"""What the supervisor does about a CDC connector: pure decisions, as for standing sinks."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from tidemark.realtime.cdc.connect import ConnectorState, TaskState
from tidemark.streams.capture import decide
from tidemark.streams.policy import Policy

NOW = datetime(2026, 11, 26, 3, 0, tzinfo=timezone.utc)
POLICY = Policy(trigger_interval=timedelta(seconds=2), restart_budget=2)  # stall window: 2 minutes
RUNNING = ConnectorState("c", "RUNNING", (TaskState(0, "RUNNING"),))
FAILED = ConnectorState("c", "RUNNING", (TaskState(0, "FAILED", "ConnectException: boom\n at x"),))


def test_desired_states_are_followed_and_a_person_stop_is_never_undone():
    assert decide("running", ConnectorState("c", "MISSING"), False, [], NOW, POLICY).action == "create"
    assert decide("running", RUNNING, True, [], NOW, POLICY).action == "update"
    assert decide("running", ConnectorState("c", "PAUSED", (TaskState(0, "PAUSED"),)), False, [], NOW,
                  POLICY).action == "resume"
    assert decide("paused", RUNNING, False, [], NOW, POLICY).action == "pause"
    assert decide("stopped", RUNNING, False, [], NOW, POLICY).action == "stop"
    assert decide("stopped", ConnectorState("c", "STOPPED"), False, [], NOW, POLICY).action == "none"
    assert decide("stopped", FAILED, False, [], NOW, POLICY).action == "stop"  # never restarted when stopped
    assert decide("running", RUNNING, False, [], NOW, POLICY).action == "none"


def test_no_connector_before_its_handoff_batch_committed():
    waiting = decide("running", ConnectorState("c", "MISSING"), False, [], NOW, POLICY, handed_off=False)
    assert waiting.action == "wait" and "no handoff batch committed yet" in waiting.reason
    # a connector that exists (its handoff committed before) is supervised as ever
    assert decide("running", FAILED, False, [], NOW, POLICY, handed_off=False).action == "restart"


def test_failures_are_restarted_with_backoff_within_the_budget_then_a_crash_loop():
    assert decide("running", FAILED, False, [], NOW, POLICY).action == "restart"
    just = [NOW - timedelta(seconds=5)]
    assert decide("running", FAILED, False, just, NOW, POLICY).action == "wait"  # backoff 15 s after one restart
    assert decide("running", FAILED, False, [NOW - timedelta(minutes=1)], NOW, POLICY).action == "restart"
    two = [NOW - timedelta(minutes=3), NOW - timedelta(minutes=1)]
    assert decide("running", FAILED, False, two, NOW, POLICY).action == "crash_loop"


def test_a_running_task_whose_slot_has_no_reader_past_the_stall_window_is_a_failure():
    assert decide("running", RUNNING, False, [], NOW, POLICY, timedelta(seconds=90)).action == "none"
    stalled = decide("running", RUNNING, False, [], NOW, POLICY, timedelta(minutes=3))
    assert stalled.action == "restart" and "its slot has had no reader for 180 s" in stalled.reason
    two = [NOW - timedelta(minutes=3), NOW - timedelta(minutes=1)]
    assert decide("running", RUNNING, False, two, NOW, POLICY, timedelta(minutes=3)).action == "crash_loop"


def test_a_connector_failed_during_a_broker_outage_is_waited_for_not_restarted_against_its_budget():
    failed = ConnectorState("c", "RUNNING", (TaskState(0, "FAILED", "org.apache.kafka.common.errors.TimeoutException"),))
    spent = [NOW - timedelta(minutes=m) for m in (3, 2, 1)]
    waiting = decide("running", failed, False, spent, NOW, POLICY, outage="Kafka (b:9092): connection refused")
    assert waiting.action == "wait" and "waiting for Kafka (b:9092)" in waiting.reason, waiting
    assert decide("running", failed, False, spent, NOW, POLICY).action == "crash_loop"  # its own failure counts

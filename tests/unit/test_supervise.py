"""The stream supervisor's decisions (tidemark.streams.policy): pure logic, every rule with its reason."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tidemark.sink.lag import records_behind
from tidemark.streams.policy import Actual, History, Policy, decide

NOW = datetime(2026, 11, 23, 9, 0, tzinfo=timezone.utc)
S = timedelta(seconds=1)
POLICY = Policy(trigger_interval=2 * S)  # stall window max(20 s, 2 min) = 2 min; heartbeat timeout 2 min
HEALTHY = Actual(alive=True, started_at=NOW - 3600 * S, heartbeat_at=NOW - 5 * S, progress_at=NOW - 3 * S, lag=10,
                 previous_lag=40)


def test_a_healthy_job_is_left_alone():
    assert decide(NOW, "running", HEALTHY, History(), POLICY).action == "none"


def test_a_missing_job_is_started_and_a_killed_one_restarted_within_the_cycle():
    assert decide(NOW, "running", Actual(alive=False), History(), POLICY).action == "start"
    killed = Actual(alive=False, started_at=NOW - 600 * S, exit_code=137)
    decision = decide(NOW, "running", killed, History(), POLICY)
    assert decision.action == "restart" and "exited with code 137" in decision.reason


@pytest.mark.parametrize("desired", ["paused", "stopped"])
def test_a_job_stopped_or_paused_on_purpose_is_never_restarted_and_a_running_one_is_stopped(desired):
    ended = Actual(alive=False, started_at=NOW - 60 * S, exit_code=0)
    assert decide(NOW, desired, ended, History(), POLICY).action == "none"
    assert decide(NOW, desired, HEALTHY, History(), POLICY).action == "stop"
    # not even a crash-looping one is touched when a person wants it stopped
    assert decide(NOW, desired, ended, History(crash_looping_since=NOW - 60 * S), POLICY).action == "none"


def test_restarts_back_off_exponentially_and_past_the_budget_the_job_is_crash_looping():
    dead = Actual(alive=False, started_at=NOW - 10 * S, exit_code=1)
    one = History(restarts=(NOW - 10 * S,))
    waiting = decide(NOW, "running", dead, one, POLICY)  # backoff after 1 restart: 15 s
    assert waiting.action == "wait" and waiting.not_before == NOW + 5 * S
    assert decide(NOW + 6 * S, "running", dead, one, POLICY).action == "restart"
    two = History(restarts=(NOW - 100 * S, NOW - 20 * S))  # backoff after 2: 30 s
    assert decide(NOW, "running", dead, two, POLICY).action == "wait"
    three = History(restarts=(NOW - 300 * S, NOW - 200 * S, NOW - 100 * S))
    looping = decide(NOW, "running", dead, three, POLICY)
    assert looping.action == "crash_loop" and "3 restarts within 0:30:00" in looping.reason
    # restarts older than the budget window no longer count
    old = History(restarts=tuple(NOW - (1900 + i) * S for i in range(5)))
    assert decide(NOW, "running", dead, old, POLICY).action == "restart"


def test_a_crash_looping_job_waits_for_a_person_whatever_its_state():
    flagged = History(crash_looping_since=NOW - 60 * S)
    assert decide(NOW, "running", Actual(alive=False, started_at=NOW, exit_code=1), flagged, POLICY).action == "crash_loop"


def test_a_stall_needs_lag_that_does_not_shrink_and_no_progress_for_longer_than_the_stall_window():
    stalled = Actual(alive=True, started_at=NOW - 3600 * S, heartbeat_at=NOW - 2 * S, progress_at=NOW - 150 * S,
                     lag=500, previous_lag=400)
    decision = decide(NOW, "running", stalled, History(), POLICY)
    assert decision.action == "restart" and "stalled: lag 500" in decision.reason
    shrinking = Actual(**{**stalled.__dict__, "previous_lag": 900})
    assert decide(NOW, "running", shrinking, History(), POLICY).action == "none"
    recent = Actual(**{**stalled.__dict__, "progress_at": NOW - 100 * S})  # inside the 2 min window
    assert decide(NOW, "running", recent, History(), POLICY).action == "none"


def test_a_healthy_idle_job_is_no_stall_however_old_its_last_progress():
    idle = Actual(alive=True, started_at=NOW - 86400 * S, heartbeat_at=NOW - 2 * S, progress_at=NOW - 80000 * S,
                  lag=0, previous_lag=0)
    assert decide(NOW, "running", idle, History(), POLICY).action == "none"


def test_a_live_process_without_a_heartbeat_is_hung_and_restarted():
    hung = Actual(alive=True, started_at=NOW - 3600 * S, heartbeat_at=NOW - 200 * S, lag=0)
    decision = decide(NOW, "running", hung, History(), POLICY)
    assert decision.action == "restart" and "no heartbeat for 200 s" in decision.reason


def test_the_stall_window_follows_the_trigger_interval_and_never_undercuts_it():
    assert Policy(trigger_interval=2 * S).stall_after == 120 * S
    assert Policy(trigger_interval=60 * S, heartbeat_timeout=300 * S).stall_after == 600 * S
    with pytest.raises(ValueError, match="must exceed the trigger interval"):
        Policy(trigger_interval=300 * S, stall_factor=1, min_stall=60 * S, heartbeat_timeout=600 * S)
    with pytest.raises(ValueError, match="heartbeat timeout"):
        Policy(trigger_interval=300 * S)  # a 2 min heartbeat timeout under a 5 min trigger
    assert Policy(trigger_interval=2 * S).backoff_for(10) == 300 * S


def test_lag_ignores_the_one_commit_marker_a_control_message_leaves_at_a_partition_end():
    # partition 0: read to the END whose marker sits at 41; 1: 10 records unread; 2: never read
    assert records_behind({0: 42, 1: 60, 2: 5}, {0: 41, 1: 49}) == {0: 0, 1: 10, 2: 4}
    # events travel without transactions: no commit marker, every offset is a record
    assert records_behind({0: 42, 1: 60, 2: 5}, {0: 41, 1: 49}, transactional=False) == {0: 1, 1: 11, 2: 5}


def test_a_resumed_job_is_started_not_restarted_and_costs_no_budget():
    stopped = Actual(alive=False, started_at=NOW - 600 * S, exit_code=0)  # it stopped itself when paused
    resumed = History(restarts=(NOW - 300 * S, NOW - 200 * S, NOW - 100 * S), desired_since=NOW - 30 * S)
    decision = decide(NOW, "running", stopped, resumed, POLICY)
    assert decision.action == "start" and "resumed at" in decision.reason
    later = Actual(alive=False, started_at=NOW - 20 * S, exit_code=1)  # started after the resume, then died
    assert decide(NOW, "running", later, resumed, POLICY).action == "crash_loop"


def test_a_sink_that_has_not_committed_yet_is_slow_not_stalled_and_half_seconds_are_printed():
    """Issue 53 item 3: on a loaded host standing sinks were restarted as stalled before they had committed
    once (the window counted from their start), and a 0.5 s trigger was printed as "0 s"."""
    from datetime import timedelta

    policy = Policy(trigger_interval=timedelta(milliseconds=500))  # stall window max(5 s, 2 min) = 2 min
    starting = Actual(alive=True, started_at=NOW - 200 * S, heartbeat_at=NOW - 1 * S, progress_at=None, lag=500)
    assert decide(NOW, "running", starting, History(), policy).action == "none"  # 200 s up, never committed: slow
    stuck = Actual(**{**starting.__dict__, "started_at": NOW - 500 * S})  # past the start-up grace: stalled
    decision = decide(NOW, "running", stuck, History(), policy)
    assert decision.action == "restart" and "trigger 0.5 s" in decision.reason, decision.reason
    committed = Actual(**{**starting.__dict__, "progress_at": NOW - 130 * S})  # committed once, then nothing
    assert decide(NOW, "running", committed, History(), policy).action == "restart"


def test_an_outage_is_waited_out_and_its_end_starts_the_job_without_spending_the_budget():
    spent = History(restarts=(NOW - 300 * S, NOW - 200 * S, NOW - 100 * S))  # the whole budget of 3
    broker = "Kafka (127.0.0.1:29092): no bootstrap server accepts a connection"
    ended = Actual(alive=False, started_at=NOW - 600 * S, exit_code=75, outage=broker)
    waiting = decide(NOW, "running", ended, spent, POLICY)
    assert waiting.action == "wait" and f"waiting for {broker}" in waiting.reason, waiting
    assert "not counted against the restart budget" in waiting.reason
    hung = Actual(alive=True, started_at=NOW - 3600 * S, heartbeat_at=NOW - 600 * S, outage=broker)
    assert decide(NOW, "running", hung, History(), POLICY).action == "wait"  # killing it would not help
    over = decide(NOW, "running", Actual(alive=False, started_at=NOW - 600 * S, exit_code=75), spent, POLICY)
    assert over.action == "start" and "ended for an outage (exit 75" in over.reason, over
    # an 'outage' that keeps coming while every component answers counts, past its own budget (4 per restart)
    often = History(restarts=(), outage_starts=tuple(NOW - (60 * i + 30) * S for i in range(12)))
    counted = decide(NOW, "running", Actual(alive=False, started_at=NOW - 20 * S, exit_code=75), often, POLICY)
    assert counted.action == "restart" and "12 times within 0:30:00 while every component answers" in counted.reason
    recent = History(outage_starts=(NOW - 5 * S,))  # backed off as restarts are
    assert decide(NOW, "running", Actual(alive=False, started_at=NOW - 5 * S, exit_code=75), recent,
                  POLICY).action == "wait"
    # a job's own failure still counts, outage or not in the past
    assert decide(NOW, "running", Actual(alive=False, started_at=NOW - 600 * S, exit_code=1), spent,
                  POLICY).action == "crash_loop"
    assert decide(NOW, "running", HEALTHY, History(), POLICY).action == "none"  # alive and well: nothing to wait for


def test_a_sink_error_that_is_a_lost_connection_is_an_outage_and_a_records_own_error_is_not():
    """What a standing sink's last error says decides its exit: a connection the warehouse or the broker took
    away (the component may be back by the time it looks) is an outage (exit 75), a query's own failure is not."""
    import psycopg2

    from tidemark.sink.job import _lost_broker, _lost_warehouse

    restart = psycopg2.OperationalError("terminating connection due to administrator command\nSSL SYSCALL error")
    assert _lost_warehouse(RuntimeError("micro-batch failed")) is None
    wrapped = RuntimeError("foreachBatch failed")
    wrapped.__cause__ = restart
    assert _lost_warehouse(wrapped).startswith("the warehouse connection was lost: terminating connection")
    spark = RuntimeError("An exception was raised by the Python Proxy. Return Message: Traceback ... "
                         "psycopg2.OperationalError: server closed the connection unexpectedly")
    assert "server closed the connection" in _lost_warehouse(spark)
    assert _lost_warehouse(psycopg2.errors.DeadlockDetected("deadlock detected")) is None  # the job's own
    assert _lost_warehouse(RuntimeError("psycopg2.errors.NumericValueOutOfRange: numeric field overflow")) is None
    kafka = RuntimeError("StreamingQueryException: org.apache.kafka.common.errors.TimeoutException: Timeout of "
                         "60000ms expired before the position for partition tidemark.x-0 could be determined")
    assert _lost_broker(kafka).startswith("the broker connection was lost: org.apache.kafka.common.errors.Timeout")
    assert _lost_broker(RuntimeError("record 7 of partition 0: not valid Avro")) is None


def test_a_sink_idle_for_hours_that_receives_a_large_batch_is_busy_not_stalled():
    """Issue 53, item 3: the stall's clock starts when the records came (the supervisor saw lag appear), not
    at the last micro-batch hours before; a sink that then makes no progress for the stall window is stalled."""
    busy = Actual(alive=True, started_at=NOW - 36000 * S, heartbeat_at=NOW - 1 * S, progress_at=NOW - 7200 * S,
                  lag=400_000, previous_lag=0, lagging_since=NOW - 60 * S)
    assert decide(NOW, "running", busy, History(), POLICY).action == "none"
    stuck = Actual(alive=True, started_at=NOW - 36000 * S, heartbeat_at=NOW - 1 * S, progress_at=NOW - 7200 * S,
                   lag=400_000, previous_lag=400_000, lagging_since=NOW - 150 * S)
    decision = decide(NOW, "running", stuck, History(), POLICY)
    assert decision.action == "restart" and "no progress for 150 s" in decision.reason, decision


def test_no_second_instance_starts_while_an_instance_the_launcher_does_not_know_still_beats():
    """Liveness from the job itself: a copy started elsewhere (or escaped from its process group) keeps
    the pipeline; it is waited for, never joined by a second one; when its heartbeat stops, a start."""
    ended = Actual(alive=False, started_at=NOW, exit_code=137, other_instance="host:42 jvm 43, fence 7")
    d = decide(NOW + timedelta(seconds=5), "running", ended, History(), POLICY)
    assert d.action == "wait" and "host:42 jvm 43" in d.reason and "no second one starts" in d.reason
    gone = Actual(alive=False, started_at=NOW, exit_code=137)
    assert decide(NOW + timedelta(seconds=5), "running", gone, History(), POLICY).action == "restart"


def test_a_heartbeat_is_a_live_instance_only_while_fresh_unended_and_its_process_on_this_host_lives():
    import os
    import socket

    from tidemark.streams.cycle import other_instance

    beat = {"holder": f"{socket.gethostname()}:{os.getpid()} jvm 1", "fence": 3, "heartbeat_at": NOW, "ended_at": None}
    minute = timedelta(minutes=1)
    assert other_instance(beat, NOW + timedelta(seconds=30), minute).startswith(beat["holder"])
    assert other_instance(beat, NOW + 2 * minute, minute) is None  # its beat is stale
    assert other_instance({**beat, "ended_at": NOW}, NOW, minute) is None  # it ended its lease
    dead = {**beat, "holder": f"{socket.gethostname()}:{2 ** 22 + 1}"}  # above pid_max: no such process
    assert other_instance(dead, NOW, minute) is None
    elsewhere = {**beat, "holder": "another-host:4242"}  # its processes cannot be seen: its beat is the sign
    assert other_instance(elsewhere, NOW, minute) is not None


def test_a_killed_holder_left_as_a_zombie_is_no_live_instance():
    """A killed driver whose parent died lingers as a zombie until init reaps it; signal 0 still reaches it
    (the fresh-clone CI's supervisor waited on such a one): it is no live instance."""
    import os
    import signal
    import socket
    import subprocess
    import sys

    from tidemark.streams.cycle import other_instance

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        child.send_signal(signal.SIGKILL)
        import time

        deadline = time.monotonic() + 10
        while open(f"/proc/{child.pid}/stat").read().split(") ")[1][0] != "Z":  # not reaped: a zombie
            assert time.monotonic() < deadline
            time.sleep(0.02)
        os.kill(child.pid, 0)  # signal 0 still reaches it
        beat = {"holder": f"{socket.gethostname()}:{child.pid} jvm 1", "fence": 1, "heartbeat_at": NOW,
                "ended_at": None}
        assert other_instance(beat, NOW, timedelta(minutes=1)) is None
    finally:
        child.wait()

"""The supervisor's memory in the control schema (real PostgreSQL): desired state with who and when,
its events and restart budget, crash loops only a person clears, heartbeats only the lease holder writes."""

from __future__ import annotations

import uuid
from datetime import timedelta

import psycopg2
import pytest

from tidemark import ledger
from tidemark_workshop.settings import WAREHOUSE_DB


@pytest.fixture()
def cur(settings):
    conn = psycopg2.connect(settings.dsn(WAREHOUSE_DB))
    conn.autocommit = True  # each call is its own transaction, as the supervisor's are
    with conn.cursor() as c:
        ledger.ensure_control_schema(c)
        yield c
    conn.close()


def _name() -> str:
    return f"it_{uuid.uuid4().hex[:10]}"


def test_desired_state_is_recorded_with_who_when_and_why_and_defaults_to_running(cur):
    p = _name()
    assert ledger.stream_state(cur, p).desired == "running" and ledger.stream_state(cur, p).changed_by is None
    assert ledger.set_desired(cur, p, "paused", "alice", "broker maintenance") == "running"
    state = ledger.stream_state(cur, p)
    assert (state.desired, state.changed_by, state.reason) == ("paused", "alice", "broker maintenance")
    assert ledger.set_desired(cur, p, "running", "bob") == "paused"
    cur.execute("SELECT kind, actor, detail FROM tidemark_control.stream_events WHERE pipeline = %s ORDER BY id", (p,))
    assert cur.fetchall() == [("desired", "alice", "running -> paused: broker maintenance"),
                              ("desired", "bob", "paused -> running")]
    with pytest.raises(ValueError, match="desired state is one of"):
        ledger.set_desired(cur, p, "sleeping", "eve")


def test_restarts_count_within_the_budget_window_and_a_crash_loop_waits_for_a_person(cur):
    p = _name()
    for _ in range(2):
        ledger.record_stream_event(cur, p, "restart", "supervisor", "exited with code 1")
    cur.execute("INSERT INTO tidemark_control.stream_events (pipeline, at, kind, actor) "
                "VALUES (%s, clock_timestamp() - interval '2 hours', 'restart', 'supervisor')", (p,))
    assert len(ledger.restarts_since(cur, p, timedelta(minutes=30))) == 2
    ledger.mark_crash_looping(cur, p, "3 restarts within 30 min")
    since = ledger.stream_state(cur, p).crash_looping_since
    ledger.mark_crash_looping(cur, p, "still")  # keeps the first time
    assert since is not None and ledger.stream_state(cur, p).crash_looping_since == since
    assert ledger.clear_crash_loop(cur, p, "carol") is True
    assert ledger.stream_state(cur, p).crash_looping_since is None
    assert ledger.clear_crash_loop(cur, p, "carol") is False  # nothing to clear


def test_only_the_holder_of_the_current_fence_can_beat(cur):
    p = _name()
    old = ledger.acquire_fence(cur, p, "host:1")
    started = "2026-11-23T09:00:00Z"
    assert ledger.beat(cur, p, old, "host:1", started, records=10, lag={0: 5}, offsets={0: 10}, batch_seconds=0.5)
    assert ledger.beat(cur, p, old, "host:1", started)  # an idle beat keeps the progress time
    hb = ledger.heartbeat(cur, p)
    assert (hb["fence"], hb["micro_batches"], hb["records"], hb["lag"]) == (old, 1, 10, {"0": 5})
    assert hb["progress_at"] is not None and hb["heartbeat_at"] >= hb["progress_at"]

    new = ledger.acquire_fence(cur, p, "host:2")  # a second instance takes over (no lease asked)
    assert not ledger.beat(cur, p, old, "host:1", started, records=3)  # the first must stop itself
    assert ledger.beat(cur, p, new, "host:2", "2026-11-23T09:05:00Z", records=4, batch_seconds=0.2)
    hb = ledger.heartbeat(cur, p)
    assert (hb["fence"], hb["holder"], hb["micro_batches"], hb["records"]) == (new, "host:2", 1, 4)


def test_a_live_lease_refuses_a_second_copy_until_it_ends_or_expires(cur):
    p = _name()
    first = ledger.acquire_fence(cur, p, "host:1", timedelta(seconds=30))
    assert ledger.beat(cur, p, first, "host:1", "2026-11-23T09:00:00Z")
    with pytest.raises(ledger.LeaseHeld, match="held by host:1"):
        ledger.acquire_fence(cur, p, "host:2", timedelta(seconds=30))
    assert ledger.beat(cur, p, first, "host:1", "2026-11-23T09:00:00Z")  # the first keeps running
    cur.execute("UPDATE tidemark_control.stream_heartbeats SET heartbeat_at = clock_timestamp() - interval '31 s' "
                "WHERE pipeline = %s", (p,))
    second = ledger.acquire_fence(cur, p, "host:2", timedelta(seconds=30))  # expired: taken over
    assert second == first + 1 and not ledger.beat(cur, p, first, "host:1", "2026-11-23T09:00:00Z")
    assert ledger.beat(cur, p, second, "host:2", "2026-11-23T09:01:00Z")
    assert ledger.end_lease(cur, p, second)  # ended (stopped, or seen dead): free at once
    assert not ledger.beat(cur, p, second, "host:2", "2026-11-23T09:01:00Z")  # an ended instance cannot revive it
    assert ledger.acquire_fence(cur, p, "host:3", timedelta(seconds=30)) == second + 1

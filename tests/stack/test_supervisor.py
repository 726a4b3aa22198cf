"""The stream supervisor's cycle against real processes (real PostgreSQL, Kafka, Spark).

A standing sink is started by the supervisor, applies batches as they come, beats, is restarted
within one cycle after kill -9, and stops itself when paused (and stays stopped). A job that dies
at start-up is restarted, then reported as crash-looping with its own error line, and left alone
until a person clears it.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from tidemark import ledger
from tidemark.protocol.kafka_io import ensure_topic
from tidemark.sink.lag import backpressure
from tidemark.spark import jobs
from tidemark.streams.cycle import run_cycle
from tidemark.streams.launch import LocalLauncher
from tidemark_workshop.stack.batchrun import PAYMENTS_DDL, insert_payments, make_pipeline, until
from tidemark_workshop.stack.proc import group_process
from tidemark_workshop.stack.spark import submit_command

STANDING = {"mode": "standing", "trigger": "PT1S", "heartbeat": "PT1S"}


def _batch(pipe, run_id: str, first: int, last: int):
    insert_payments(pipe, first, last)
    plan = pipe.plan(run_id)
    attempt = pipe.begin(plan)
    pipe.end(plan, attempt, pipe.extract(plan, attempt))
    return plan, attempt


def test_a_standing_sink_is_started_restarted_after_kill_9_and_stays_stopped_when_paused(settings, tmp_path):
    pipe = make_pipeline(settings, tmp_path, PAYMENTS_DDL, sink={**STANDING, "max_lag": 10})
    name = pipe.spec.name
    launcher = LocalLauncher(tmp_path / "streams")

    def command(spec):
        return submit_command(settings, jobs.SINK_JOB, pipe.sink_args(available_now=False), secret=settings.pg_password)

    wh = pipe.wh()
    try:
        def cycle():
            return run_cycle([pipe.spec], wh, launcher, settings.kafka_bootstrap, command).decisions[name]

        plan, attempt = _batch(pipe, "run-1", 1, 50)  # waits on the topic for a sink
        go, why = backpressure(pipe.spec, wh, settings.kafka_bootstrap)  # the next nightly batch would wait
        assert not go and "beyond sink.max_lag 10" in why, why
        # a copy the supervisor's launcher does not know (started by hand, or by another launcher): its own
        # heartbeat keeps the pipeline, no second instance starts beside it until it ends
        by_hand = LocalLauncher(tmp_path / "by-hand")
        copy = by_hand.start(name, *command(pipe.spec))
        holder = until("the copy's heartbeat naming its JVM", lambda: next((h for (h,) in pipe.query_wh(
            "SELECT holder FROM tidemark_control.stream_heartbeats WHERE pipeline = %s AND ended_at IS NULL",
            (name,)) if " jvm " in h), None), timeout=120)
        decision = cycle()
        assert decision.action == "wait" and "no second one starts" in decision.reason, decision
        assert not launcher.status(name).alive and by_hand.status(name).alive
        assert holder in decision.reason, decision  # host:<driver pid> jvm <java pid>: both processes of the copy
        driver, jvm = int(holder.split(" ")[0].rpartition(":")[2]), int(holder.split(" jvm ")[1])
        assert os.getpgid(driver) == os.getpgid(jvm) == copy.pid, (holder, copy.pid)
        by_hand.stop(name)  # SIGTERM, as a person ends it: its heartbeat is recent, but its process is gone
        assert not by_hand.status(name).alive
        assert cycle().action == "start"
        until("the standing sink to commit batch 1", lambda: pipe.state(plan.batch_id, attempt) == "committed")
        go, why = backpressure(pipe.spec, wh, settings.kafka_bootstrap)  # caught up: it goes on
        assert go and "sink lags 0 records" in why, why
        until("a heartbeat with progress", lambda: (pipe.query_wh(
            "SELECT micro_batches FROM tidemark_control.stream_heartbeats WHERE pipeline = %s", (name,)) or [(0,)])[0][0])
        assert cycle().action == "none"  # healthy, and idle now: no stall

        first = launcher.status(name)
        os.kill(first.pid, signal.SIGKILL)  # kill -9 of the sh wrapper alone: the JVM and the driver run on
        java, driver = group_process(first.pid, "java"), group_process(first.pid, "python")
        assert java and driver, "the instance's JVM and Python driver"
        assert launcher.status(name).alive and cycle().action == "none"  # still the instance: no second one
        os.killpg(first.pid, signal.SIGKILL)  # kill -9 the whole job: JVM, Python driver
        until("the job to be seen dead", lambda: not launcher.status(name).alive, timeout=30)
        assert cycle().action == "restart"  # within one cycle
        plan2, attempt2 = _batch(pipe, "run-2", 51, 80)
        until("the restarted sink to commit batch 2", lambda: pipe.state(plan2.batch_id, attempt2) == "committed")
        second = launcher.status(name)
        assert second.alive and second.pid != first.pid
        # kill -9 of the JVM alone, then of the Python driver alone: the rest of the tree ends with it, the
        # supervisor restarts once (after its backoff), never beside a live instance, and the next batch commits
        for n, part in enumerate(("java", "python"), start=3):
            current = launcher.status(name)
            os.kill(group_process(current.pid, part), signal.SIGKILL)
            until(f"the job to end after kill -9 of its {part}", lambda: not launcher.status(name).alive, timeout=120)
            until("the supervisor's restart (after its backoff)", lambda: cycle().action == "restart", timeout=90)
            assert launcher.status(name).pid != current.pid and not group_process(current.pid, "java")
            plan_n, attempt_n = _batch(pipe, f"run-{n}", 51 + 30 * (n - 2), 80 + 30 * (n - 2))
            until(f"the restarted sink to commit batch {n}", lambda: pipe.state(plan_n.batch_id, attempt_n) == "committed")

        with wh, wh.cursor() as cur:
            ledger.set_desired(cur, name, "paused", "test", "maintenance")
        ended = until("the job to stop itself", lambda: launcher.status(name).exit_code is not None, timeout=90)
        assert launcher.status(name).exit_code == 0, launcher.log_tail(name, 40)  # graceful
        decision = cycle()
        assert decision.action == "none" and "never restarted" in decision.reason, decision
        assert not launcher.status(name).alive and ended
        source = pipe.rows("source", "amount, updated_at")
        assert len(source) == 140 and pipe.rows("target", "amount, updated_at") == source
        events = pipe.query_wh("SELECT kind, actor FROM tidemark_control.stream_events WHERE pipeline = %s ORDER BY id",
                               (name,))
        assert events == [("start", "supervisor"), *[("restart", "supervisor")] * 3, ("desired", "test")]
    finally:
        launcher.kill(name)
        LocalLauncher(tmp_path / "by-hand").kill(name)
        wh.close()


def test_a_job_dying_at_start_up_is_crash_looping_after_its_budget_and_left_alone_until_cleared(settings, tmp_path):
    pipe = make_pipeline(settings, tmp_path, PAYMENTS_DDL, sink={**STANDING, "restart_budget": 1})
    name = pipe.spec.name
    launcher = LocalLauncher(tmp_path / "streams")
    failing = "import sys; print('batch_sink: FAILED: cannot read the spec', flush=True); sys.exit(3)"

    def command(spec):
        return [sys.executable, "-c", failing], dict(os.environ)

    ensure_topic(settings.kafka_bootstrap, pipe.spec.topic, pipe.spec.partitions)  # the lag is known: 0
    wh = pipe.wh()
    with wh, wh.cursor() as cur:
        ledger.ensure_control_schema(cur)
    try:
        def cycle():
            return run_cycle([pipe.spec], wh, launcher, settings.kafka_bootstrap, command)

        def ended():
            return until("the job to exit", lambda: launcher.status(name).exit_code is not None, timeout=30)

        assert cycle().decisions[name].action == "start"
        ended()
        assert cycle().decisions[name].action == "restart"
        ended()
        pid = launcher.status(name).pid
        report = cycle()
        assert report.decisions[name].action == "crash_loop"
        assert report.crash_looping == [report.crash_looping[0]] and "batch_sink: FAILED: cannot read the spec" in \
            report.crash_looping[0] and "action=clear" in report.crash_looping[0]
        assert cycle().decisions[name].action == "crash_loop" and launcher.status(name).pid == pid  # left alone

        with wh, wh.cursor() as cur:
            assert ledger.clear_crash_loop(cur, name, "test")
        assert cycle().decisions[name].action == "restart"  # cleared: the budget starts afresh
        ended()
        with wh, wh.cursor() as cur:
            ledger.set_desired(cur, name, "paused", "test")
        assert cycle().decisions[name].action == "none"  # paused: not restarted
        with wh, wh.cursor() as cur:
            ledger.set_desired(cur, name, "running", "test")
        assert cycle().decisions[name].action == "start"  # resumed: a start, not a restart
    finally:
        launcher.kill(name)
        wh.close()


@pytest.mark.serial("stops PostgreSQL")
def test_a_warehouse_outage_is_waited_out_and_costs_the_sink_no_restart_budget(settings, tmp_path):
    """Issue 53, item 2: PostgreSQL stopped for 20 s under an idle standing sink, then started again. The sink
    rides it out (its heartbeat retries), or, when its next micro-batch meets the connection the restart took,
    ends with exit 75 saying so, and the supervisor starts it again outside the restart budget (spent here
    already on purpose): the next batch commits without a person, and nothing is crash-looping."""
    from tidemark_workshop.stack.postgres import Postgres

    pipe = make_pipeline(settings, tmp_path, PAYMENTS_DDL, sink={**STANDING, "restart_budget": 1})
    name = pipe.spec.name
    launcher = LocalLauncher(tmp_path / "streams")

    def command(spec):
        return submit_command(settings, jobs.SINK_JOB, pipe.sink_args(available_now=False), secret=settings.pg_password)

    def cycle():
        wh = pipe.wh()
        try:
            return run_cycle([pipe.spec], wh, launcher, settings.kafka_bootstrap, command).decisions[name]
        finally:
            wh.close()

    postgres = Postgres(settings)
    try:
        plan, attempt = _batch(pipe, "run-1", 1, 20)
        assert cycle().action == "start"
        until("the standing sink to commit batch 1", lambda: pipe.state(plan.batch_id, attempt) == "committed")
        wh = pipe.wh()
        try:
            with wh, wh.cursor() as cur:  # the budget of one restart spent, on a failure of its own
                ledger.record_stream_event(cur, name, "restart", "supervisor", "test: an earlier failure")
        finally:
            wh.close()
        postgres.stop()  # an idle sink rides it out (its heartbeat retries); its connection is gone with it
        try:
            time.sleep(20)
        finally:
            postgres.start()
        plan2, attempt2 = _batch(pipe, "run-2", 21, 40)
        until("the sink to commit batch 2 or to end for the outage", lambda: (
            pipe.state(plan2.batch_id, attempt2) == "committed" or not launcher.status(name).alive), timeout=180)
        if not launcher.status(name).alive:
            tail = launcher.log_tail(name, 40)
            assert launcher.status(name).exit_code == 75, tail
            assert "standing sink stopped: the warehouse" in tail and "not counted against" in tail, tail
            decision = cycle()
            assert decision.action == "start" and "ended for an outage (exit 75" in decision.reason, decision
        until("batch 2 committed", lambda: pipe.state(plan2.batch_id, attempt2) == "committed")
        assert pipe.rows("target", "amount, updated_at") == pipe.rows("source", "amount, updated_at")
        assert cycle().action == "none"  # not crash-looping: the outage cost nothing
    finally:
        launcher.kill(name)

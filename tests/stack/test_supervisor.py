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

from tidemark import ledger
from tidemark.spark import jobs
from tidemark.kafka_io import ensure_topic
from tidemark.streams.launch import LocalLauncher
from tidemark.streams.cycle import run_cycle
from tidemark.streams.lag import backpressure
from tidemark_workshop.stack.batchrun import PAYMENTS_DDL, insert_payments, make_pipeline, until
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
        assert cycle().action == "start"
        until("the standing sink to commit batch 1", lambda: pipe.state(plan.batch_id, attempt) == "committed")
        go, why = backpressure(pipe.spec, wh, settings.kafka_bootstrap)  # caught up: it goes on
        assert go and "sink lags 0 records" in why, why
        until("a heartbeat with progress", lambda: (pipe.query_wh(
            "SELECT micro_batches FROM tidemark_control.stream_heartbeats WHERE pipeline = %s", (name,)) or [(0,)])[0][0])
        assert cycle().action == "none"  # healthy, and idle now: no stall

        first = launcher.status(name)
        os.killpg(first.pid, signal.SIGKILL)  # kill -9 the whole job: wrapper, JVM, Python driver
        until("the job to be seen dead", lambda: not launcher.status(name).alive, timeout=30)
        assert cycle().action == "restart"  # within one cycle
        plan2, attempt2 = _batch(pipe, "run-2", 51, 80)
        until("the restarted sink to commit batch 2", lambda: pipe.state(plan2.batch_id, attempt2) == "committed")
        second = launcher.status(name)
        assert second.alive and second.pid != first.pid

        with wh, wh.cursor() as cur:
            ledger.set_desired(cur, name, "paused", "test", "maintenance")
        ended = until("the job to stop itself", lambda: launcher.status(name).exit_code is not None, timeout=90)
        assert launcher.status(name).exit_code == 0, launcher.log_tail(name, 40)  # graceful
        decision = cycle()
        assert decision.action == "none" and "never restarted" in decision.reason, decision
        assert not launcher.status(name).alive and ended
        source = pipe.rows("source", "amount, updated_at")
        assert len(source) == 80 and pipe.rows("target", "amount, updated_at") == source
        events = pipe.query_wh("SELECT kind, actor FROM tidemark_control.stream_events WHERE pipeline = %s ORDER BY id",
                               (name,))
        assert events == [("start", "supervisor"), ("restart", "supervisor"), ("desired", "test")]
    finally:
        launcher.kill(name)
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

"""One cycle of the stream supervisor: gather the facts, decide (``tidemark.streams.policy``), act, log.

For every pipeline whose spec says ``sink: {mode: standing}``: the desired state and crash-loop
flag (control schema), the instance the launcher knows (alive, exit code), the instance's own
heartbeat and progress, and the lag (broker end offsets against the offsets committed in the
warehouse). One log line per pipeline says what it saw and did. No Airflow import: the DAG
passes the command that launches a pipeline's sink (built from its connections).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from tidemark import ledger
from tidemark.ledger import catalog
from tidemark.protocol.kafka_io import probe_broker
from tidemark.protocol.spec import PipelineSpec
from tidemark.realtime import speed_layer
from tidemark.realtime.cdc.groups import captures
from tidemark.sink.lag import sink_lag
from tidemark.streams.launch import Launcher, process_alive
from tidemark.streams.policy import OUTAGE_START, Actual, Decision, History, Policy, decide

log = logging.getLogger(__name__)

Command = Callable[[PipelineSpec], tuple[list[str], dict[str, str]]]  # argv and environment


def policy_for(spec: PipelineSpec) -> Policy:
    sink = spec.sink
    return Policy(trigger_interval=spec.trigger, heartbeat_timeout=max(sink.lease, timedelta(minutes=2)),
                  restart_budget=sink.restart_budget, budget_window=sink.budget_window)


def graceful_stop_grace(spec: PipelineSpec) -> timedelta:
    """How long a job gets to stop itself after its desired state changed, before SIGTERM/SIGKILL."""
    return spec.sink.heartbeat * 2 + spec.trigger + timedelta(seconds=60)


@dataclass
class CycleReport:
    lines: list[str] = field(default_factory=list)
    crash_looping: list[str] = field(default_factory=list)  # one line per pipeline: name, error, what to do
    decisions: dict[str, Decision] = field(default_factory=dict)


def run_cycle(specs: list[PipelineSpec], warehouse_conn, launcher: Launcher, bootstrap: str,
              command: Command, *, now: datetime | None = None) -> CycleReport:
    report = CycleReport()
    # a capture group's lead reads the group's change topics, its other members none (tidemark.realtime.cdc.groups)
    broken = probe_broker(bootstrap)  # once a cycle: a sink is not restarted into an outage
    outage = None if broken is None else f"Kafka ({bootstrap}): {broken}"
    groups = captures(specs)
    realtime = {m.name: c.realtime_topics(m) for c in groups for m in c.members}
    signatures = {m.name: c.signature for c in groups if c.grouped for m in c.members}
    for spec in (s for s in specs if s.sink.mode == "standing"):
        line, decision = _supervise(spec, warehouse_conn, launcher, bootstrap, command,
                                    now or datetime.now(timezone.utc), report, realtime.get(spec.name),
                                    signatures.get(spec.name), outage)
        report.decisions[spec.name] = decision
        report.lines.append(line)
        log.log(logging.ERROR if decision.action == "crash_loop" else logging.INFO, "%s", line)
    return report


def _supervise(spec: PipelineSpec, wh, launcher: Launcher, bootstrap: str, command: Command,
               now: datetime, report: CycleReport, realtime: dict[str, int] | None,
               signature: str | None = None, outage: str | None = None) -> tuple[str, Decision]:
    name, policy = spec.name, policy_for(spec)
    instance = launcher.status(name)
    parts = sink_lag(spec, wh, bootstrap, realtime=realtime)
    lag = sum(parts.values()) if parts is not None else None
    with wh, wh.cursor() as cur:
        state = ledger.stream_state(cur, name)
        beat = ledger.heartbeat(cur, name)
        restarts = ledger.restarts_since(cur, name, policy.budget_window)
        outage_starts = ledger.restarts_since(cur, name, policy.budget_window, kind="start", detail_prefix=OUTAGE_START)
        previous, lagging_since = ledger.observe_stream(cur, name, lag)
        started_for = ledger.sink_capture(cur, name, beat["fence"]) if signature and beat else None
    mine = (beat is not None and instance.started_at is not None and beat["ended_at"] is None
            and beat["started_at"] >= instance.started_at - timedelta(seconds=1))
    actual = Actual(alive=instance.alive, started_at=instance.started_at, exit_code=instance.exit_code,
                    heartbeat_at=beat["heartbeat_at"] if mine else None,
                    progress_at=beat["progress_at"] if mine else None, lag=lag, previous_lag=previous, outage=outage,
                    lagging_since=lagging_since,
                    other_instance=None if mine or instance.alive else other_instance(beat, now, policy.heartbeat_timeout))
    person = state.changed_by not in (None, "supervisor")  # the row may exist only for the supervisor's looks
    history = History(tuple(restarts), state.crash_looping_since, state.changed_at if person else None,
                      tuple(outage_starts))
    decision = decide(now, state.desired, actual, history, policy)
    if decision.action == "none" and mine and instance.alive and started_for not in (None, signature):
        # a member added to (or gone from) its capture group: the running sink reads the old group's topics
        decision = Decision("reconfigure", f"its capture group changed: started for [{started_for}], the specs "
                                           f"now say [{signature}]: restarted to read the group's topics (not "
                                           "counted against the restart budget)", decision.recent_restarts)
    did = _act(spec, decision, state, instance, beat, launcher, command, wh, now, report)
    seen = (f"running {instance.handle}" if instance.alive else
            "not started" if instance.started_at is None else f"ended (exit {instance.exit_code})")
    progress = actual.progress_at.isoformat() if actual.progress_at else "-"
    line = (f"pipeline={name} desired={state.desired} actual={seen} lag={lag if lag is not None else 'unknown'} "
            f"per partition {parts} last_progress={progress} restarts={len(restarts)}/{policy.restart_budget} in "
            f"{policy.budget_window} action={decision.action}{did}: {decision.reason}")
    return line, decision


def other_instance(beat: dict[str, Any] | None, now: datetime, timeout: timedelta) -> str | None:
    """Who still beats for the pipeline when the launcher runs nothing: a heartbeat not ended, younger than
    ``timeout``, whose process (``host:pid``, the sink's driver) lives on this host, or on another host
    (whose processes cannot be seen from here: its heartbeat is the only sign). None: no live copy."""
    if beat is None or beat["ended_at"] is not None or beat["heartbeat_at"] is None:
        return None
    if now - beat["heartbeat_at"] > timeout:
        return None
    holder = str(beat["holder"] or "")
    host, _, pid = holder.split(" ")[0].rpartition(":")
    if host == socket.gethostname() and pid.isdigit() and not process_alive(int(pid)):
        return None  # it died without ending its lease: its heartbeat is merely recent
    return f"{holder}, fence {beat['fence']}, last heartbeat {beat['heartbeat_at']:%H:%M:%S}"


def _act(spec: PipelineSpec, decision: Decision, state: ledger.StreamState, instance, beat: dict[str, Any] | None,
         launcher: Launcher, command: Command, wh, now: datetime, report: CycleReport) -> str:
    name = spec.name
    if decision.action in ("start", "restart", "reconfigure"):
        if instance.alive:  # hung or stalled: it goes first, and its lease with it
            launcher.kill(name)
        if beat is not None:  # the last instance is gone: its successor need not wait for the lease to expire
            with wh, wh.cursor() as cur:
                ledger.end_lease(cur, name, beat["fence"])
        argv, env = command(spec)
        started = launcher.start(name, argv, env)
        with wh, wh.cursor() as cur:
            # a reconfiguration is a start: the restart budget counts the job's failures only
            ledger.record_stream_event(cur, name, "start" if decision.action == "reconfigure" else decision.action,
                                       "supervisor", decision.reason)
        return f" ({started.handle}, log {launcher.log_location(name)})"
    if decision.action == "stop":
        asked = state.changed_at
        grace = graceful_stop_grace(spec)
        if asked is not None and now - asked < grace:
            return f" (waiting: the job stops itself between micro-batches; SIGTERM after {asked + grace:%H:%M:%S})"
        stopped = launcher.stop(name, grace_s=10)
        with wh, wh.cursor() as cur:
            if beat is not None:
                ledger.end_lease(cur, name, beat["fence"])
            ledger.record_stream_event(cur, name, "stop", "supervisor",
                                       f"did not stop itself within {grace}: signalled, exit {stopped.exit_code}")
        return f" (signalled after {grace}: exit {stopped.exit_code})"
    if decision.action == "crash_loop":
        error = last_error(launcher.log_tail(name, lines=200))
        if state.crash_looping_since is None:
            with wh, wh.cursor() as cur:
                ledger.mark_crash_looping(cur, name, f"{decision.reason}; last error: {error}")
        report.crash_looping.append(
            f"pipeline {name} is crash-looping: last error: {error}; log: {launcher.log_location(name)}. Next: fix "
            f"the cause, then run the DAG tidemark_stream_control with pipeline={name} action=clear")
    return ""


def prepare_stream_tables(spec: PipelineSpec, wh, source_connect: Callable[[], Any]) -> None:
    """A real-time table (a stream's, or change data capture's) is made like the batch target, which
    is made from the source table: create both before the sink's first start (which may come before
    the first nightly run). A failure is logged, not raised: the sink's start then fails naming it,
    other pipelines go on."""
    speed = speed_layer(spec)
    assert speed is not None, f"pipeline {spec.name} has no real-time input"
    realtime = speed.target_table
    try:
        with wh, wh.cursor() as cur:
            if speed.ensure(cur):
                log.info("pipeline=%s created the real-time table %s", spec.name, realtime)
            return
    except LookupError:
        pass  # the batch target is missing too: it comes from the source
    try:
        source = source_connect()
        try:
            with source, source.cursor() as src, wh, wh.cursor() as cur:
                catalog.ensure_target(src, cur, spec)
                speed.ensure(cur)
        finally:
            source.close()
        log.info("pipeline=%s created the target %s from the source table %s, and the real-time table %s",
                 spec.name, spec.target_table, spec.table, realtime)
    except Exception as exc:
        log.error("pipeline=%s cannot create its tables before its stream starts: %s. Next: check the connection %s "
                  "and the spec's table and target_table fields", spec.name, " ".join(str(exc).split()),
                  spec.source_conn_id)


def last_error(log_text: str) -> str:
    """The job's own failure line (``<job>: FAILED: ...``), else its last error-looking line."""
    lines = [line.strip() for line in log_text.splitlines() if line.strip() and not line.startswith("--- ")]
    for marker in (": FAILED: ", "Error", "Exception"):
        found = [line for line in lines if marker in line]
        if found:
            return found[-1][:500]
    return lines[-1][:500] if lines else "the job printed nothing"

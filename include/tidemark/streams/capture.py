"""What the supervisor does about a CDC pipeline's connector, each cycle, beside its standing sink.

The same rules as for sinks (``tidemark.streams.policy``): the desired state a person set from
``tidemark_stream_control`` (running, paused, stopped) is the one both follow; a failed connector
or task is restarted with backoff within the spec's restart budget, and past it the cycle fails
naming the task's own error line until a person clears the pipeline. The source is checked first
(grants, publication, ``wal_level``) and the slot watched: the WAL it keeps on the source warns past
``cdc.retained_wal_warning`` and fails the cycle past ``cdc.retained_wal_limit``; a lost slot fails
it with the re-snapshot as the next step. A re-snapshot a person asked for (``tidemark_stream_control``)
keeps the connector stopped until the new handoff batch commits.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from tidemark import ledger
from tidemark.protocol.progress import byte_size
from tidemark.protocol.replication import Replication
from tidemark.protocol.spec import PipelineSpec
from tidemark.realtime.cdc.connect import ConnectClient, ConnectorState
from tidemark.realtime.cdc.connector import SourceEndpoint, connector_config
from tidemark.realtime.cdc.groups import Capture, connector_name
from tidemark.realtime.cdc.source import CaptureNotReady, Slot, check_capture, slot_named
from tidemark.streams.policy import Policy

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConnectorDecision:
    action: str  # none, create, update, resume, pause, stop, restart, wait, crash_loop
    reason: str


def decide(desired: str, state: ConnectorState, config_differs: bool, restarts: list[datetime], now: datetime,
           policy: Policy, unread_for: timedelta | None = None, handed_off: bool = True,
           outage: str | None = None) -> ConnectorDecision:
    """Pure: what to do about the connector now. ``unread_for``: how long its slot has had no reader
    (a task Connect keeps retrying looks RUNNING: an unread slot past the stall window is a failure).
    ``handed_off``: the ledger has the pipeline's committed handoff batch, whose slot the connector
    streams from (before it, there is nothing to stream from)."""
    if desired == "stopped":
        done = state.state in ("STOPPED", "MISSING")
        return ConnectorDecision("none" if done else "stop", "stopped on purpose: its slot keeps the position")
    if desired == "paused":
        done = state.state in ("PAUSED", "STOPPED", "MISSING")
        return ConnectorDecision("none" if done else "pause", "paused on purpose")
    if state.state == "MISSING":
        if not handed_off:
            return ConnectorDecision("wait", "no handoff batch committed yet: the connector streams from the slot "
                                             "that batch creates (the pipeline's next batch run)")
        return ConnectorDecision("create", "the spec has a cdc section and Connect has no connector for it")
    if config_differs:
        return ConnectorDecision("update", "its configuration differs from the spec's")
    if state.state in ("PAUSED", "STOPPED"):
        return ConnectorDecision("resume", f"{state.state.lower()}, but desired running")
    stalled = state.running and unread_for is not None and unread_for > policy.stall_after
    if state.state == "FAILED" or state.failed_tasks or stalled:
        if outage is not None:  # a restart now would fail again: waited out, not counted (as for the sinks)
            return ConnectorDecision("wait", f"{'failed' if not stalled else 'its slot unread'}; waiting for {outage}: "
                                             "restarted once it answers (an outage is not counted against the "
                                             "restart budget)")
        if len(restarts) >= policy.restart_budget:
            how = "failed" if not stalled else f"its slot unread for {_duration(unread_for)}"
            return ConnectorDecision("crash_loop", f"{how} again after {len(restarts)} restart(s) within "
                                                   f"{policy.budget_window}")
        wait = policy.backoff_for(len(restarts))
        if restarts and now - restarts[-1] < wait:
            return ConnectorDecision("wait", f"failed; next restart after {restarts[-1] + wait:%H:%M:%S} (backoff)")
        why = (f"running, but its slot has had no reader for {_duration(unread_for)}" if stalled and not
               (state.state == "FAILED" or state.failed_tasks) else "failed")
        return ConnectorDecision("restart", f"{why} ({len(restarts)} restart(s) within {policy.budget_window})")
    if not state.running:
        return ConnectorDecision("wait", f"{state.state.lower()}: Connect is assigning its task")
    return ConnectorDecision("none", "running")


def supervise_capture(capture: Capture, wh, source, client: ConnectClient, endpoint: SourceEndpoint,
                      policy: Policy, now: datetime, outage: str | None = None,
                      replication: Replication | None = None) -> tuple[str, str | None]:
    """One look at a capture (a pipeline's, or a capture group's, whose lead pipeline's stream state
    stands for the group): act, and return its log line and, when a person must act, the failure line
    (the supervisor's task fails with it). ``outage``: the broker does not answer now, and why; ``replication``:
    the change topics' replicas settled for the cluster (None while it does not answer: the connector's
    configuration is then neither compared nor written)."""
    spec = capture.lead
    name, connector = spec.name, connector_name(spec)
    with source, source.cursor() as cur:
        try:
            check_capture(cur, capture, endpoint.user)
        except CaptureNotReady as exc:
            return f"{_who(capture)} capture: not set up", str(exc)
        held = slot_named(cur, capture.slot)
    with wh, wh.cursor() as cur:
        desired = ledger.stream_state(cur, name).desired
        restarts = ledger.restarts_since(cur, name, policy.budget_window, kind="connector_restart")
        inactive_since = ledger.watch_slot(cur, name, held is not None and not held.active, now)
        # a group streams once any member's handoff made its slot; the other members' handoffs read their
        # tables in a snapshot taken after the slot (tidemark.realtime.cdc.handoff), never making it again
        handoff = next(filter(None, (ledger.committed_handoff(cur, m.name) for m in capture.members)), None)
        asked = None if capture.grouped else ledger.resnapshot_asked(cur, name)
    state = client.state(connector)
    if asked is not None:  # the slot still holds WAL while it waits: its warning and limit stand
        slot_text, slot_failure = _slot(capture, held, state)
        return f"{_resnapshot(spec, asked, state, client, wh)}; {slot_text}", slot_failure
    wanted = connector_config(capture, endpoint, replication=replication) if replication is not None else None
    stored = client.config(connector) if state.state != "MISSING" and wanted is not None else None
    differs = stored is not None and any(stored.get(k) != v for k, v in wanted.items())
    # unread since it was last restarted, if that is later: a restarted task gets the whole window
    unread_since = max([inactive_since, *restarts[-1:]]) if inactive_since is not None else None
    # a group's stream starts once its slot exists and the handoff that made it has let go of it (Debezium
    # cannot read a slot another session holds): its members' handoffs commit only after the stream has passed
    # their snapshots (tidemark.realtime.cdc.layer.Changes.holds), the first one's included
    streams = handoff is not None or (capture.grouped and held is not None and not held.active)
    decision = decide(desired, state, differs, restarts, now, policy,
                      now - unread_since if unread_since is not None else None, handed_off=streams, outage=outage)
    if wanted is None and decision.action == "create":  # its topics' replication is not known: later
        decision = ConnectorDecision("wait", f"waiting for {outage or 'Kafka'}: created once it answers")
    if held is None and handoff is not None and desired == "running":
        # never let Debezium make a new slot of its own: it would start at the present, past every change since
        if state.state not in ("MISSING", "STOPPED"):
            client.stop(connector)
            with wh, wh.cursor() as cur:
                ledger.record_stream_event(cur, name, "connector_stop", "supervisor", "its slot is gone")
        return (f"{_who(capture)} connector={connector} state={state.state} capture: its slot {capture.slot} is gone",
                f"{capture.describe()}: the replication slot {capture.slot} that its handoff batch {handoff.batch_id} "
                f"created at {handoff.consistent_point} is gone from the source, and with it every change since: "
                "nothing is streamed (its connector is kept stopped). Next: "
                + ("run the batch DAG of each of its pipelines: with no slot, each one's next batch is a new handoff "
                   "(the first makes the slot again)" if capture.grouped else
                   "run the pipeline's batch DAG: with no slot, its next batch is a new handoff (a snapshot of the "
                   "table and a new slot)")
                + "; this cycle then starts the connector on it")
    failure = _act(capture, decision, state, client, wanted, wh, lambda: _slot_read(source, capture.slot))
    if capture.grouped and decision.action == "none" and state.running and not differs:
        _streams(capture, wh, only_if_unknown=True)  # a group that has streamed since before the record was kept
    slot_text, slot_failure = _slot(capture, held, state)
    tasks = ",".join(f"{t.id}:{t.state}" for t in state.tasks) or "-"
    line = (f"{_who(capture)} connector={connector} state={state.state} tasks={tasks} desired={desired} "
            f"action={decision.action}: {decision.reason}; {slot_text}")
    return line, failure or slot_failure


STOP_WAIT_S = 60.0  # how long one cycle waits for a group's connector to stop before it is reconfigured


def _stopped(client: ConnectClient, connector: str) -> bool:
    """Stop the connector and wait (at most ``STOP_WAIT_S``) until Connect shows it STOPPED with no task."""
    deadline = time.monotonic() + STOP_WAIT_S
    while (state := client.state(connector)).state != "STOPPED" or state.tasks:
        if state.state != "STOPPED":
            client.stop(connector)
        if time.monotonic() > deadline:
            log.warning("connector %s: not stopped within %.0f s (%s): reconfigured on a later cycle", connector,
                        STOP_WAIT_S, state.state)
            return False
        time.sleep(2.0)
    return True


def _streams(capture: Capture, wh, *, only_if_unknown: bool = False) -> None:
    """Record the members a group's connector captures from now on (a later member hands off after this)."""
    if capture.grouped:
        members = [m.name for m in capture.members]
        with wh, wh.cursor() as cur:
            if not only_if_unknown or ledger.group_streamed(cur, capture.name) != members:
                ledger.record_group_streamed(cur, capture.name, members)


def _slot_read(source, slot: str) -> bool:
    """Whether a session still reads the slot (a task Connect shows gone may not have let go of it yet)."""
    with source, source.cursor() as cur:
        held = slot_named(cur, slot)
    return held is not None and held.active


def _who(capture: Capture) -> str:
    """How a capture's log line starts: its pipeline, or its group and the pipeline whose state it follows."""
    return (f"group={capture.name} pipeline={capture.lead.name} members={','.join(m.name for m in capture.members)}"
            if capture.grouped else f"pipeline={capture.name}")


def _resnapshot(spec: PipelineSpec, asked: ledger.ResnapshotRequest, state: ConnectorState, client: ConnectClient,
                wh) -> str:
    """A re-snapshot waits: the connector is kept stopped (its task would hold the slot, which the new
    handoff's extract drops and creates again) until the handoff batch commits; the line says so."""
    name, connector = spec.name, connector_name(spec)
    action = "none"
    if state.state not in ("MISSING", "STOPPED"):
        client.stop(connector)
        action = "stop"
        with wh, wh.cursor() as cur:
            ledger.record_stream_event(cur, name, "connector_stop", "supervisor",
                                       f"a re-snapshot asked for by {asked.actor}")
    return (f"pipeline={name} connector={connector} state={state.state} action={action}: a re-snapshot asked for by "
            f"{asked.actor} at {asked.at:%Y-%m-%d %H:%M:%S%z}" + (f" ({asked.reason})" if asked.reason else "")
            + f"; the connector stays stopped until it commits. Next: run the pipeline's batch DAG (Trigger): its "
            f"next batch is the new handoff (slot {spec.cdc_slot} made again, every row of {spec.table} above the "
            "watermark read in its snapshot); this cycle then resumes the connector on it")


def _act(capture: Capture, decision: ConnectorDecision, state: ConnectorState, client: ConnectClient,
         wanted: dict[str, str], wh, slot_read: Callable[[], bool] = lambda: False) -> str | None:
    name, connector = capture.lead.name, capture.connector
    if decision.action == "create":
        # The slot says where the stream goes on, never offsets Connect kept from an earlier connector of
        # this name (a pipeline stopped for good and made again, a new handoff after a lost slot): those
        # point before the slot's start, and Debezium refuses them. Start without any.
        client.create_stopped(connector, wanted)
        client.reset_offsets(connector)
        _streams(capture, wh)
        client.resume(connector)
    elif decision.action == "update" and capture.grouped:
        # a member added to a running group: a change to its table read by a task started with the old table
        # list is dropped (Debezium filters by it), so that task ends before the new list is in force; then
        # the new member's handoff may take its snapshot (tidemark.batch waits for ledger.group_streamed)
        if not _stopped(client, connector) or slot_read():
            return None  # the old task or its slot session lingers: the next cycle goes on
        client.put_config(connector, wanted)
        _streams(capture, wh)
        client.resume(connector)
    elif decision.action == "update":
        client.put_config(connector, wanted)
    elif decision.action == "resume" and state.state == "STOPPED":
        client.reset_offsets(connector)  # as at creation: after a stop, a new handoff may have made a new slot
        client.resume(connector)
    elif decision.action == "resume":
        client.resume(connector)
    elif decision.action == "pause":
        client.pause(connector)
    elif decision.action == "stop":
        client.stop(connector)
    elif decision.action == "restart":
        client.restart(connector)
    elif decision.action == "crash_loop":
        errors = ([t.error_line for t in state.failed_tasks if t.error_line]
                  or ([state.trace.splitlines()[0]] if state.trace else [])
                  or ["its task looks RUNNING while Connect retries it (no trace in Connect's status); the task's "
                      "errors are in the Connect worker's log"])
        return (f"{capture.describe()}: its connector {connector} is crash-looping ({decision.reason}): last error: "
                f"{errors[0][:500]}. Next: fix the cause, then run the DAG tidemark_stream_control with "
                f"pipeline={name} action=clear")
    if decision.action not in ("none", "wait"):
        with wh, wh.cursor() as cur:
            ledger.record_stream_event(cur, name, f"connector_{decision.action}", "supervisor", decision.reason)
    return None


def _slot(capture: Capture, held: Slot | None, state: ConnectorState) -> tuple[str, str | None]:
    """The slot's part of the line, and a failure when the WAL it keeps is past the limit or lost."""
    spec, who = capture.lead, capture.describe()
    cdc = spec.cdc
    assert cdc is not None
    if held is None:
        created = "its handoff batch creates it" if state.state in ("MISSING", "UNASSIGNED") else "missing"
        return f"slot={capture.slot} ({created})", None
    text = (f"slot={held.name} active={held.active} wal_status={held.wal_status} "
            f"retained_wal={byte_size(held.retained_bytes)} confirmed_flush={held.confirmed_flush_lsn}")
    if held.wal_status == "lost":
        return text, (f"{who}: its replication slot {held.name} is lost (the source removed WAL it "
                      "still needed, past max_slot_wal_keep_size): changes since its last position are gone from the "
                      "stream. Next: run the pipeline's batch DAG: with its slot lost, its next batch is a new handoff "
                      "(the slot made again with a snapshot), and this cycle resumes the connector on it")
    if held.retained_bytes > cdc.retained_wal_limit:
        return text, (f"{who}: slot {held.name} keeps {byte_size(held.retained_bytes)} of WAL on the "
                      f"source, past cdc.retained_wal_limit {byte_size(cdc.retained_wal_limit)}: the source's disk fills "
                      f"while it is not read. Next: resume the pipeline (tidemark_stream_control pipeline={spec.name} action=resume) or "
                      "fix its connector; to stop capturing for good, drop the slot")
    if held.retained_bytes > cdc.retained_wal_warning:
        log.warning("%s: slot %s keeps %s of WAL on the source, past cdc.retained_wal_warning %s%s",
                    who, held.name, byte_size(held.retained_bytes), byte_size(cdc.retained_wal_warning),
                    "" if held.active else " (nobody reads it)")
        text += " WARNING past retained_wal_warning"
    return text, None


def _duration(d: timedelta | None) -> str:
    return f"{int(d.total_seconds())} s" if d is not None else "-"

"""The speed layer of a spec's ``cdc`` (``tidemark.realtime.interface``): the source table's own changes,
applied by ``apply.ChangeWriter`` to the real-time table (``tables``), corrected by each committed
batch (``compact``), and, in a capture group (``groups``), applied by the group's lead for all its
members, whose batches wait for the group's stream to pass their snapshots."""

from __future__ import annotations

import logging
import time

from tidemark import ledger
from tidemark.protocol.errors import Transient
from tidemark.protocol.spec import PipelineSpec
from tidemark.protocol.window import Window
from tidemark.realtime.cdc import compact, tables
from tidemark.realtime.cdc.apply import ChangeWriter
from tidemark.realtime.cdc.changes import lsn_text
from tidemark.realtime.cdc.groups import Capture
from tidemark.realtime.cdc.signing import Verifier
from tidemark.realtime.cdc.source import slot_named
from tidemark.realtime.interface import Reject, SpeedLayer, StreamBehind

log = logging.getLogger("tidemark.sink")
GROUP_WAIT_S = 300.0  # how long a capture group member's batch waits for the group's stream to pass its snapshot


class GroupNotStreaming(Transient):
    """A member added to a running capture group, whose table its connector does not capture yet."""


class Changes(SpeedLayer):
    section = "cdc"
    signed = True

    def __init__(self, spec: PipelineSpec, capture: Capture, verifier: Verifier | None = None):
        assert spec.cdc is not None
        super().__init__(spec, spec.cdc.target_table, spec.cdc.serving_view)
        self.capture = capture  # its own, or its group's, whose lead alone applies the change events
        self.writer = (ChangeWriter(capture, capture.consumer, verifier)
                       if verifier is not None and self.topics else None)

    @property
    def topics(self) -> dict[str, int]:
        return self.capture.realtime_topics(self.spec)

    @property
    def lead(self) -> bool:
        return self.capture.lead.name == self.spec.name

    def ensure(self, cur) -> bool:
        return tables.ensure_cdc_target(cur, self.spec)

    def handoff_due(self, src, wh) -> bool:
        """A CDC pipeline with no committed handoff, whose slot is gone or lost, or asked to re-snapshot by a
        person since its last handoff, or whose capture group's slot was made again since (by another
        member): this batch is its (new) handoff. ``GroupNotStreaming`` while a member added to a running
        group cannot hand off yet."""
        spec = self.spec
        due = (ledger.committed_handoff(wh, spec.name) is None
               or (held := slot_named(src, spec.cdc_slot)) is None
               or held.wal_status == "lost"
               or ledger.resnapshot_asked(wh, spec.name) is not None
               or (spec.cdc.group is not None and ledger.slot_made_after_handoff(wh, spec.name, spec.cdc_slot)))
        if due and spec.cdc.group is not None:
            _check_group_streams(src, wh, spec)
        return due

    def open(self, cur) -> None:
        """The lead makes every member's real-time table; in a group, the views show rows once every
        member's handoff has committed."""
        if not self.lead:
            self.ensure(cur)
            return
        for member in self.capture.members:
            tables.ensure_cdc_target(cur, member)
        if self.capture.grouped:
            ledger.register_group(cur, self.capture.name, [m.name for m in self.capture.members])
            for member in self.capture.members:
                tables.ensure_cdc_serving_view(cur, member, again=True)

    def views(self, cur, *, again: bool = False) -> None:
        tables.ensure_cdc_serving_view(cur, self.spec, again=again)

    def widen_target(self, cur, wider: dict[str, str]) -> None:
        """The real-time table is widened by the changes that carry the wider type; the view is made again."""
        tables.widen_columns(cur, self.spec, self.spec.target_table, wider)

    def rules(self, cur) -> None:
        if self.writer is not None:
            self.writer.rules(cur)

    def apply(self, cur, records, fence: int, micro_batch: int | None, report, reject: Reject) -> None:
        assert self.writer is not None, "a member's sink reads no change topic: its group's lead applies them"
        self.writer.apply(cur, records, fence, micro_batch, report, reject)

    def compact(self, cur, batch_id: str, window: Window) -> str:
        return str(compact.correct(cur, self.spec, batch_id))

    def released(self, cur) -> list[tuple[str, int]]:
        """A capture group's lead: its own batches that waited for the stream may commit now."""
        if self.writer is None or not self.capture.grouped:
            return []
        return ledger.sealed_with_every_end(cur, self.spec.name, self.spec.partitions)

    def holds(self, cur, batch_id: str, attempt: int, told: set[tuple[str, int]]) -> bool:
        """A capture group member's attempt commits once the group's stream has applied every source
        transaction its snapshot saw, so that its rows never show its table ahead of the group's others
        (``tidemark.realtime.cdc.groups``). The lead, whose own micro-batches move the stream, tries again
        with the next one; another member waits here, and past ``GROUP_WAIT_S`` raises ``StreamBehind``
        (nothing committed: the END is read again when the sink starts again)."""
        capture = self.capture
        if not capture.grouped:
            return False
        wal = ledger.snapshot_wal(cur, batch_id, attempt)
        if wal is None:
            return False  # no snapshot position (a repair's keys, or planned before the pipeline joined the group)
        deadline = time.monotonic() + (0 if self.lead else GROUP_WAIT_S)
        # the group's running lead must read this member's change topic (a member added to a running group:
        # the supervisor restarts the lead for it), else the stream passes the snapshot without its changes;
        # once past it, the position's row is held (FOR SHARE) to the commit: the lead, which takes it FOR UPDATE
        # before it writes a member's real-time table, waits while this commit compacts that table
        while True:
            read = self.lead or self.spec.name in (ledger.group_members(cur, capture.name) or ())
            position = ledger.stream_position(cur, capture.consumer)
            if read and position >= wal and ledger.stream_position(cur, capture.consumer, hold=True) >= wal:
                return False
            where = (f"pipeline={self.spec.name} batch={batch_id} attempt={attempt}: capture group "
                     f"{capture.name}'s stream has applied up to {lsn_text(position) if position >= 0 else 'nothing'}"
                     f", short of this attempt's snapshot at {lsn_text(wal)}" if read else
                     f"pipeline={self.spec.name} batch={batch_id} attempt={attempt}: capture group {capture.name}'s "
                     f"running lead {capture.lead.name} does not read this member's changes yet (the supervisor "
                     "restarts it for the group's new members)")
            if self.lead:
                if (batch_id, attempt) not in told:  # once, not at every micro-batch
                    told.add((batch_id, attempt))
                    log.info("%s: it waits (committed with a micro-batch once the stream has passed it)", where)
                return True
            if time.monotonic() > deadline:
                raise StreamBehind(
                    f"{where} after {GROUP_WAIT_S:.0f} s: nothing of it applied. Next: see why the group's "
                    f"stream is behind (its lead pipeline {capture.lead.name}'s line in the tidemark_supervisor "
                    "task's log, the status page); this sink reads the END again when it starts again")
            time.sleep(1.0)

    def fenced(self, cur, fence: int) -> None:
        """A group's sink records the capture it reads: the supervisor compares it with the group's."""
        if self.capture.grouped:
            ledger.record_sink_capture(cur, self.spec.name, fence, self.capture.signature)


def _check_group_streams(src, wh, spec: PipelineSpec) -> None:
    """A member's handoff reads in a snapshot after which every change to its table is in the group's stream:
    a connector reading the slot with the group's older table list drops them (Debezium filters by its table
    list), so a member added to a running group hands off once the supervisor has restarted the connector
    with its table (``ledger.group_streamed``). A handoff that makes the slot, or one before the connector
    ever ran, needs no wait: the connector starts with every member's table."""
    streamed = ledger.group_streamed(wh, spec.cdc.group)
    held = slot_named(src, spec.cdc_slot)
    if (held is None or held.wal_status == "lost" or spec.name in (streamed or ())
            or (streamed is None and not held.active)):
        return
    raise GroupNotStreaming(
        f"pipeline={spec.name}: its handoff waits for capture group {spec.cdc.group}'s connector to capture "
        f"{spec.table}: it captures {', '.join(streamed) if streamed else 'the members it was started with'} (a "
        "member added to a running group; a snapshot taken now would lose the table's changes until then). The "
        "tidemark_supervisor DAG's next cycle stops the connector, adds the table and resumes it, once the source is "
        "set up for it (its line for the group names what is missing). Next: run this batch after that cycle")

"""What one Debezium connector captures: one CDC pipeline's table, or a capture group's tables.

Pipelines whose specs name the same ``cdc.group`` are captured together. A bank's transaction
touches several tables (an entry and its balance, a transfer's two accounts and their branch), and
the log keeps its changes to all of them in one source transaction; captured apart, each table's
stream applies its part at its own moment, and a reader of the serving views sees half of it. A
group has one publication and replication slot (``tidemark_group_<group>``), one connector (its
events on ``tidemark.cdcgroup.<group>.<schema>.<table>``, its BEGIN and END on one transaction
topic), and one standing sink applies the change events: the group's lead, its first pipeline by
name. It applies each source transaction across every member's real-time table in one warehouse
transaction, checked against END's per-table event counts. The other members' sinks apply their
own batches only. Tables in no common group share no moment: each is whole per source transaction,
and nothing more.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tidemark.ledger import consumer_for
from tidemark.protocol.spec import PipelineSpec, load_specs

HEARTBEAT_TABLE = "tidemark_heartbeat"


def connector_name(spec: PipelineSpec) -> str:
    """The connector of ``spec``'s capture (its group's, when it is in one)."""
    group = spec.cdc.group if spec.cdc is not None else None
    return f"tidemark-cdc-group-{group}" if group else f"tidemark-cdc-{spec.name}"


def _qualified(table: str) -> str:
    """A table's name as Debezium names it (``schema.table``)."""
    return table if "." in table else f"public.{table}"


@dataclass(frozen=True)
class Capture:
    name: str  # the group's name, or the pipeline's when it is captured alone
    members: tuple[PipelineSpec, ...]  # by name: the first is the lead, whose sink applies the changes

    @property
    def grouped(self) -> bool:
        return self.lead.cdc.group is not None

    @property
    def lead(self) -> PipelineSpec:
        return self.members[0]

    @property
    def slot(self) -> str:
        """The replication slot and the publication (one name for both)."""
        return self.lead.cdc_slot

    @property
    def connector(self) -> str:
        return connector_name(self.lead)

    @property
    def consumer(self) -> str:
        return capture_consumer(self.lead)

    @property
    def transaction_topic(self) -> str:
        return self.lead.cdc_transaction_topic

    @property
    def heartbeat_table(self) -> str | None:
        """A group's heartbeat on the source (``schema.tidemark_heartbeat``, in its lead's schema): Debezium
        writes the group's row at every heartbeat (``heartbeat.action.query``), a source transaction in the
        group's stream, so the group's applied position passes every member batch's snapshot even while
        its tables are quiet (``tidemark.realtime.cdc.layer.Changes.holds``). None for a pipeline captured alone."""
        if not self.grouped:
            return None
        return f"{_qualified(self.lead.table).split('.')[0]}.{HEARTBEAT_TABLE}"

    @property
    def heartbeat_topic(self) -> str | None:
        return f"{self.lead.cdc_topic_prefix}.{self.heartbeat_table}" if self.heartbeat_table else None

    @property
    def topics(self) -> dict[str, int]:
        """Every topic the lead's sink reads for the capture (one partition each: the log's order)."""
        heartbeat = {self.heartbeat_topic: 1} if self.heartbeat_topic else {}
        return {**{m.cdc_topic: 1 for m in self.members}, **heartbeat, self.transaction_topic: 1}

    @property
    def tables(self) -> dict[str, str]:
        """Each captured table (``schema.table``, as END's counts name it) and its change topic."""
        found = {_qualified(m.table): m.cdc_topic for m in self.members}
        return {**found, self.heartbeat_table: self.heartbeat_topic} if self.heartbeat_table else found

    def member_for(self, topic: str) -> PipelineSpec | None:
        return next((m for m in self.members if m.cdc_topic == topic), None)

    def realtime_topics(self, spec: PipelineSpec) -> dict[str, int]:
        """The topics ``spec``'s own sink reads besides its batch topic: the capture's for its lead, none
        for another member of a group (the lead applies its changes)."""
        return self.topics if spec.name == self.lead.name else {}

    @property
    def signature(self) -> str:
        """What a member's sink was started for: the group, its lead and members. A running sink whose
        signature differs (a member added or removed) reads the wrong topics: the supervisor restarts it."""
        return f"{self.name} lead={self.lead.name} members={','.join(m.name for m in self.members)}"

    def describe(self) -> str:
        if not self.grouped:
            return f"pipeline {self.name}"
        return f"capture group {self.name} ({', '.join(m.name for m in self.members)}; lead {self.lead.name})"


def capture_consumer(spec: PipelineSpec) -> str:
    """Whose stream position, waiting changes and transactions the control schema keeps for ``spec``'s
    capture: its sink's for a pipeline captured alone, its group's otherwise."""
    group = spec.cdc.group if spec.cdc is not None else None
    return f"capture-group.{group}" if group else consumer_for(spec.name)


def captures(specs: Iterable[PipelineSpec]) -> list[Capture]:
    """The captures of ``specs``' CDC pipelines: one per group, one per pipeline in none."""
    found: dict[tuple[bool, str], list[PipelineSpec]] = {}
    for spec in specs:
        if spec.cdc is not None:
            key = (True, spec.cdc.group) if spec.cdc.group else (False, spec.name)
            found.setdefault(key, []).append(spec)
    return [Capture(name, tuple(sorted(members, key=lambda m: m.name))) for (_, name), members in sorted(found.items(), key=lambda kv: kv[0][1])]


def capture_of(spec: PipelineSpec, specs: Iterable[PipelineSpec]) -> Capture:
    """``spec``'s capture among ``specs`` (``spec`` itself stands for its own name)."""
    if spec.cdc is None:
        raise ValueError(f"pipeline {spec.name} has no cdc section")
    others = [s for s in specs if s.name != spec.name]
    return next(c for c in captures([spec, *others]) if any(m.name == spec.name for m in c.members))


def load_capture(spec: PipelineSpec, directory: Path) -> Capture:
    """``spec``'s capture, its group's other members read from the specs in ``directory`` (a job reads
    its spec from there). A group member whose file does not load is missing from the capture, which
    ``load_specs`` names at parse time."""
    if spec.cdc is None or spec.cdc.group is None:
        return Capture(spec.name, (spec,))
    loaded, _ = load_specs(directory)
    return capture_of(spec, [s for _, s in loaded])

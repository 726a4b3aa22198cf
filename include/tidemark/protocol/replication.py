"""How many copies of each topic Tidemark keeps, and how many must hold a write before it counts.

The Kafka connection's extra may say ``replication.factor`` and ``min.insync.replicas`` (Tidemark's
keys: no client is given them). Unsaid, they follow the cluster: a factor of min(3, brokers), and
one replica fewer than the factor in sync when the factor is 3 or more (one broker may be lost
without a write being refused or a record lost). Every topic is made with unclean leader election
off: an out-of-sync replica never becomes leader and drops what the others acknowledged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

FACTOR_KEY, MIN_INSYNC_KEY = "replication.factor", "min.insync.replicas"
UNCLEAN = "unclean.leader.election.enable"


class TopicRefused(ValueError):
    """A topic Tidemark cannot trust with a batch: too few replicas, a weaker setting, too few brokers."""


@dataclass(frozen=True)
class Replication:
    factor: int | None = None  # None: min(3, brokers)
    min_insync: int | None = None  # None: factor - 1 from a factor of 3, else 1

    def __post_init__(self):
        for name, value in ((FACTOR_KEY, self.factor), (MIN_INSYNC_KEY, self.min_insync)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a whole number of at least 1, not {value!r}")

    @classmethod
    def from_extra(cls, extra: Mapping[str, object], *, source: str) -> Replication:
        """The settings in a connection's extra; a malformed one names ``source`` and the key."""
        values = {}
        for key in (FACTOR_KEY, MIN_INSYNC_KEY):
            value = extra.get(key)
            if isinstance(value, str) and value.strip().isdigit():
                value = int(value)
            values[key] = value
        try:
            said = cls(values[FACTOR_KEY], values[MIN_INSYNC_KEY])
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from None
        if said.factor is not None and said.min_insync is not None and said.min_insync > said.factor:
            raise ValueError(f"{source}: {MIN_INSYNC_KEY} {said.min_insync} exceeds {FACTOR_KEY} {said.factor}: "
                             "no write could ever be acknowledged")
        return said

    def settle(self, brokers: int) -> Replication:
        """The numbers for a cluster of ``brokers``: what was said, the defaults for the rest."""
        factor = self.factor if self.factor is not None else max(1, min(3, brokers))
        min_insync = self.min_insync if self.min_insync is not None else (factor - 1 if factor >= 3 else 1)
        return Replication(factor, min_insync)

    def topic_config(self) -> dict[str, str]:
        """The settings a settled replication gives a topic Tidemark creates."""
        return {MIN_INSYNC_KEY: str(self.min_insync), UNCLEAN: "false"}

    def args(self) -> list[str]:
        """A job's command-line arguments for what was said (nothing for a default)."""
        return [*(["--replication-factor", str(self.factor)] if self.factor is not None else []),
                *(["--min-insync-replicas", str(self.min_insync)] if self.min_insync is not None else [])]

    def refusals(self, topic: str, brokers: int, *, replicas: int | None, min_insync: int | None,
                 unclean: bool | None) -> list[str]:
        """Why ``topic`` (``replicas`` None: not made yet) cannot hold a batch under these settled
        numbers, each with the next step; empty when it can."""
        found = []
        if self.min_insync > self.factor:
            return [f"topic {topic!r}: {MIN_INSYNC_KEY} {self.min_insync} exceeds the replication factor "
                    f"{self.factor} (of a cluster of {brokers} broker(s)): no write could be acknowledged; lower "
                    f"{MIN_INSYNC_KEY} in the Kafka connection's extra, or say {FACTOR_KEY}"]
        if replicas is None:
            if self.factor > brokers:
                found.append(f"topic {topic!r} needs {self.factor} replicas but the cluster has {brokers} broker(s): "
                             f"start more brokers, or lower {FACTOR_KEY} in the Kafka connection's extra")
            return found
        if replicas < self.factor:
            found.append(f"topic {topic!r} has {replicas} replica(s) per partition and the Kafka connection asks for "
                         f"{self.factor}: add replicas with kafka-reassign-partitions.sh (or, when it holds nothing "
                         f"to keep, delete the topic and let Tidemark make it again), or lower {FACTOR_KEY} in the "
                         "connection's extra")
        if min_insync is not None and min_insync < self.min_insync:
            found.append(f"topic {topic!r} has {MIN_INSYNC_KEY}={min_insync} and the Kafka connection asks for "
                         f"{self.min_insync}: kafka-configs.sh --alter --entity-type topics --entity-name {topic} "
                         f"--add-config {MIN_INSYNC_KEY}={self.min_insync}")
        if unclean:
            found.append(f"topic {topic!r} allows unclean leader election (a lagging replica may become leader "
                         f"and drop acknowledged records): kafka-configs.sh --alter --entity-type topics "
                         f"--entity-name {topic} --add-config {UNCLEAN}=false")
        return found


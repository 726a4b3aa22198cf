"""The Debezium PostgreSQL connector of a CDC pipeline, as Kafka Connect configuration.

The configuration never holds a secret: the replication role's password and the key the worker signs
change records with (``tidemark.realtime.cdc.signing``) are references that the worker resolves from its
secrets directory (Kafka's DirectoryConfigProvider), so neither Connect's config topic nor its REST
API nor a log line shows them.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tidemark.protocol.replication import Replication
from tidemark.protocol.spec import quote
from tidemark.realtime.cdc.groups import Capture
from tidemark.realtime.cdc.signing import CONVERTER, SigningKey

CONNECTOR_CLASS = "io.debezium.connector.postgresql.PostgresConnector"
SECRETS_PROVIDER = "dir"  # the worker's config.providers name for its secrets directory


@dataclass(frozen=True)
class SourceEndpoint:
    """Where the connector logs in (the source database as the replication role) and the key it signs
    its records with. ``secret_file`` and ``signing.secret_file`` name files in the worker's secrets
    directory: the role's password and the derived signing key."""

    host: str
    port: int
    dbname: str
    user: str
    secret_file: str
    secrets_dir: str
    signing: SigningKey




def connector_config(capture: Capture, source: SourceEndpoint, *, replication: Replication) -> dict[str, str]:
    """Every setting Tidemark relies on, spelled out (Debezium's defaults may move between versions);
    ``replication`` settled for the cluster (``kafka_io.settled_replication``)."""
    if replication.factor is None or replication.min_insync is None:
        raise ValueError(f"connector {capture.connector}: replication {replication} is not settled for the cluster")
    spec = capture.lead
    for name in (source.secret_file, source.signing.secret_file):
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise ValueError(f"secret file name {name!r}: letters, digits, '.', '_', '-' only")
    tables = ",".join(re.escape(t) for t in capture.tables)
    heartbeat = {} if capture.heartbeat_table is None else {
        # a source transaction at every heartbeat, in the group's stream: its position moves on while its tables
        # are quiet (a member's batch commits once the stream has passed its snapshot)
        "heartbeat.action.query": f"INSERT INTO {quote(capture.heartbeat_table)} (capture, beat_at) VALUES "
                                  f"('{capture.name}', now()) ON CONFLICT (capture) DO UPDATE SET beat_at = "
                                  "EXCLUDED.beat_at"}
    return {**heartbeat,
        "connector.class": CONNECTOR_CLASS,
        "tasks.max": "1",  # one slot is read by one task: the log's order is the apply order
        "plugin.name": "pgoutput",  # PostgreSQL's own logical decoding output, no server extension
        "database.hostname": source.host,
        "database.port": str(source.port),
        "database.dbname": source.dbname,
        "database.user": source.user,
        "database.password": _reference(source, source.secret_file),
        # every record signed (the header tidemark.signature): the sink applies no change the worker did not write
        "value.converter": CONVERTER,
        "value.converter.schemas.enable": "true",
        "value.converter.signing.key.id": source.signing.key_id,
        # (a name ending in "secret": Debezium masks it where it logs the task's configuration)
        "value.converter.signing.secret": _reference(source, source.signing.secret_file),
        "topic.prefix": spec.cdc_topic_prefix,
        "slot.name": spec.cdc_slot,
        "publication.name": spec.cdc_slot,
        "publication.autocreate.mode": "disabled",  # the DBA's publication (tidemark.realtime.cdc.source), never ours
        "table.include.list": tables,  # regular expressions to Debezium: exactly the capture's tables
        "snapshot.mode": "no_data",  # Tidemark's own batch loads the existing rows (the handoff)
        # BEGIN/END of each source transaction, with its event count per table: the sink applies it whole
        "provide.transaction.metadata": "true",
        "decimal.handling.mode": "string",  # exact: a NUMERIC never passes through a double
        # each field names its source type (NUMERIC 18 2, VARCHAR 20): a column added at the source is added
        # to the real-time table with it, and a retyped one is refused
        "column.propagate.source.type": ".*",
        "time.precision.mode": "adaptive_time_microseconds",
        "interval.handling.mode": "string",
        "tombstones.on.delete": "false",  # a delete is one event (op d, with the row before it)
        "heartbeat.interval.ms": str(int(min(m.cdc.heartbeat for m in capture.members).total_seconds() * 1000)),
        # throughput and latency: larger batches from the slot to Kafka (Debezium's 2,048 kept the capture
        # under 4,000 changes/s here), and a 100 ms wait when the queue is empty (its 500 ms: latency)
        "max.batch.size": "8192",
        "max.queue.size": "32768",
        "poll.interval.ms": "100",
        "slot.drop.on.stop": "false",  # dropping the slot loses the position: only when stopped for good, asked
        # the change topics as durable as Tidemark's own (the lead's sink refuses them otherwise)
        "topic.creation.default.replication.factor": str(replication.factor),
        "topic.creation.default.min.insync.replicas": str(replication.min_insync),
        "topic.creation.default.unclean.leader.election.enable": "false",
        "topic.creation.default.partitions": "1",  # one partition: the events of a transaction stay in order
        "topic.creation.default.cleanup.policy": "delete",
        "errors.tolerance": "none",  # a change Debezium cannot read stops the task loudly, never skipped
        # a lost connection is retried twice by Debezium, then the task fails: the supervisor's restart
        # budget counts it (Debezium's default retries forever while the task looks RUNNING)
        "errors.max.retries": "2",
        "retriable.restart.connector.wait.ms": "5000",
    }


def _reference(source: SourceEndpoint, secret_file: str) -> str:
    return f"${{{SECRETS_PROVIDER}:{source.secrets_dir}:{secret_file}}}"


def write_secret(secrets_dir: str | Path, name: str, value: str) -> str:
    """Write ``value`` where the worker resolves ``${dir:<secrets_dir>:<name>}``: the directory 0700, the
    file 0600, replaced whole each time (a task starting meanwhile reads the old file or the new one,
    never an empty one). Returns ``name`` (the connector config's reference to it)."""
    directory = Path(secrets_dir)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, staging = tempfile.mkstemp(dir=directory, prefix=f".{name}.")  # 0600
    with os.fdopen(fd, "w") as out:
        out.write(value)
    os.replace(staging, directory / name)
    return name

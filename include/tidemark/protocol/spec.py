"""Pipeline specs: one YAML file per pipeline, validated with pydantic.

A bad file raises ``SpecError`` naming the file and each offending field, so the DAG factory can
surface it as that file's import error and leave every other pipeline alone. Every SQL
identifier is checked against a strict pattern here and quoted where SQL is built (``quote``).
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ByteSize,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from tidemark.protocol.errors import Terminal

_IDENT = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"
_PRESETS = {"@once", "@hourly", "@daily", "@weekly", "@monthly", "@yearly", "@continuous"}

Identifier = Annotated[str, Field(pattern=_IDENT)]


def _qualified(value: str) -> str:
    parts = value.split(".")
    if not 1 <= len(parts) <= 2 or not all(_is_ident(p) for p in parts):
        raise ValueError(f"{value!r} is not a table name (schema.table or table, letters, digits, _)")
    return value


def _is_ident(part: str) -> bool:
    return re.fullmatch(_IDENT, part) is not None


def _schedule(value: str) -> str:
    if value in _PRESETS:
        return value
    from croniter import croniter  # only when a cron string is given

    if not croniter.is_valid(value):
        raise ValueError(f"{value!r} is neither a cron expression nor one of {sorted(_PRESETS)}")
    return value


def _aware(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError("needs an explicit time zone, e.g. 2026-01-01T00:00:00Z")
    return value


TableName = Annotated[str, AfterValidator(_qualified)]
Bytes = Annotated[ByteSize, WithJsonSchema({"type": "string", "format": "byte-size"})]  # 512MB, 1GiB, 1073741824


DEAD_LETTER_TOPIC = "tidemark.dlq"
CDC_RECORDS_PER_TRIGGER = 20_000
CDC_TRIGGER = timedelta(milliseconds=500)
CDC_RECORDS_PER_TASK = 5_000
CDC_TOPICS = "tidemark.cdc."  # every CDC pipeline's change events (tidemark.cdc.<name>.<schema>.<table>)
CDC_GROUP_TOPICS = "tidemark.cdcgroup."  # a capture group's (tidemark.cdcgroup.<group>.<schema>.<table>)
NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]{0,62}")  # a pipeline's name: in topics, tables, paths


class Cursor(BaseModel):
    """How increments are found: a timestamp (primary key breaks ties) or a strictly increasing id."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["timestamp", "id"]
    column: Identifier


class SinkSpec(BaseModel):
    """How the pipeline's sink runs: inside each nightly run (``per_batch``), or as a standing
    stream supervised by the ``tidemark_supervisor`` DAG (``standing``), which the nightly run's
    sink step then leaves the batch to."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    mode: Literal["per_batch", "standing"] = "per_batch"
    trigger: Annotated[timedelta, Field(ge=timedelta(milliseconds=100), le=timedelta(minutes=10))] = timedelta(seconds=2)
    max_offsets_per_trigger: Annotated[int, Field(ge=1, le=10_000_000)] = 200_000  # bounds a micro-batch's memory
    # A Spark task reads at most this many of a micro-batch's records (Kafka's maxRecordsPerPartition):
    # a big micro-batch spreads over every core however few partitions the topic has (a CDC pipeline
    # that does not set it: PipelineSpec.records_per_task).
    max_records_per_task: Annotated[int, Field(ge=1_000, le=10_000_000)] = 50_000
    heartbeat: Annotated[timedelta, Field(ge=timedelta(seconds=1), le=timedelta(minutes=5))] = timedelta(seconds=5)
    driver_memory: Annotated[str, Field(pattern=r"^[1-9][0-9]{0,5}[mg]$")] = "1g"
    # Backpressure: a nightly batch waits while the sink is more than max_lag records behind its topic
    # (None: never waits), for at most max_lag_wait, then fails saying how far behind.
    max_lag: Annotated[int, Field(ge=0)] | None = None
    max_lag_wait: Annotated[timedelta, Field(ge=timedelta(minutes=1), le=timedelta(days=1))] = timedelta(hours=2)
    restart_budget: Annotated[int, Field(ge=1, le=100)] = 3  # restarts within budget_window before crash-looping
    budget_window: Annotated[timedelta, Field(ge=timedelta(minutes=1), le=timedelta(days=1))] = timedelta(minutes=30)

    @property
    def lease(self) -> timedelta:
        """How long a silent instance keeps its lease: six missed heartbeats."""
        return self.heartbeat * 6


class RetrySpec(BaseModel):
    """How the nightly DAG's tasks retry a transient failure (broker, connections): ``count``
    retries, the first after ``delay``, each later one twice as long, at most ``max_delay``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    count: Annotated[int, Field(ge=0, le=20)] = 2
    delay: Annotated[timedelta, Field(ge=timedelta(seconds=1), le=timedelta(hours=1))] = timedelta(seconds=30)
    max_delay: Annotated[timedelta, Field(ge=timedelta(seconds=1), le=timedelta(hours=6))] = timedelta(minutes=10)


class StreamSpec(BaseModel):
    """Events outside batches: JSON objects that applications publish to ``topic`` (keyed by the
    field ``key``, their event time in the field ``event_time``). The standing sink applies them as
    they arrive to ``target_table``, a real-time table made like the pipeline's target (one row per
    primary key: a redelivered event is a no-op), with each event's source position.
    ``serving_view`` merges the batch target and the real-time table: one row per key, the newest
    version by cursor (the batch's on a tie); ``<serving_view>_freshness`` says up to when."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    topic: Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]{1,249}$")]
    key: Identifier
    event_time: Identifier
    target_table: TableName
    serving_view: TableName
    partitions: Annotated[int, Field(ge=1, le=64)] = 3


class CdcSpec(BaseModel):
    """Change data capture: the source table's own changes (inserts, updates, deletes), read by
    Debezium's PostgreSQL connector through the pipeline's logical replication slot and publication
    (both named ``tidemark_<name>``) on a Kafka Connect worker that the ``tidemark_supervisor`` DAG
    keeps running. Its events land on ``tidemark.cdc.<name>.<schema>.<table>``; the standing sink
    applies them to ``target_table``, a real-time table like the stream's, and ``serving_view``
    merges it with the batch target. The pipeline's first batch is its handoff: it creates the slot
    with an exported snapshot and loads the table in it, and the connector streams from that slot
    once the batch commits (a CDC pipeline loads with ``write_mode: upsert``). A slot keeps WAL on the
    source while nobody reads it: past ``retained_wal_warning`` bytes the supervisor warns, past
    ``retained_wal_limit`` it fails.

    ``group``: pipelines naming the same capture group are captured together (``tidemark.realtime.cdc.groups``):
    one publication, slot and connector for all their tables (``tidemark_group_<group>``), and one
    standing sink, the group's first pipeline by name, applies each source transaction across all
    their real-time tables in one warehouse transaction: a reader of the group's serving views never
    sees part of a source transaction. Tables not in one group share no such moment."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    target_table: TableName
    serving_view: TableName
    group: Annotated[str | None, Field(pattern=r"^[a-z][a-z0-9_]{0,47}$")] = None
    retained_wal_warning: Bytes = Field(default="1GiB", validate_default=True)
    retained_wal_limit: Bytes = Field(default="3GiB", validate_default=True)
    # Debezium's heartbeat: a quiet table's slot still moves on, so it holds no WAL of other tables
    heartbeat: Annotated[timedelta, Field(ge=timedelta(seconds=1), le=timedelta(minutes=10))] = timedelta(seconds=10)
    # what may wait in tidemark_control.cdc_pending (events of transactions not yet complete): past it, the oldest
    # waiting transactions go to the dead-letter topic whole, with the reason, and the stream goes on
    max_pending_events: Annotated[int, Field(ge=1)] = 1_000_000

    @model_validator(mode="after")
    def _limits(self) -> "CdcSpec":
        if self.retained_wal_warning >= self.retained_wal_limit:
            raise ValueError(f"retained_wal_warning ({self.retained_wal_warning.human_readable()}) must be below "
                             f"retained_wal_limit ({self.retained_wal_limit.human_readable()})")
        return self


class ControlTotal(BaseModel):
    """Exact decimal sums of ``columns``, per group of ``group_by`` (none: one sum for the window)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    columns: Annotated[list[Identifier], Field(min_length=1)]
    group_by: list[Identifier] = []


class DoubleEntry(BaseModel):
    """Every journal (``journal``) sums to zero per currency: signed ``amount``s, debits negative."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    journal: Identifier
    amount: Identifier
    currency: Identifier


class BalanceContinuity(BaseModel):
    """Daily balances that must chain: ``opening + movements = closing`` on every row, and each
    row's ``opening`` equals the ``closing`` of the same account's previous row (by ``date``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    account: Identifier
    date: Identifier
    opening: Identifier
    movements: Identifier
    closing: Identifier


class MovementsMatchLedger(BaseModel):
    """Balances agree with the ledger: each row's ``movements`` equals the sum of the ledger's
    ``amount`` for the same ``account`` and ``date``, read from the ledger pipeline's target
    (``ledger_table``) for the rows its watermark (pipeline ``ledger``) already covers."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    ledger: Annotated[str, Field(pattern=f"^{NAME_PATTERN.pattern}$")]
    ledger_table: TableName
    account: Identifier
    date: Identifier
    movements: Identifier
    amount: Identifier


class ReconcileSpec(BaseModel):
    """What reconciliation proves after each load, besides row counts and hash totals (always):
    control totals, required fields, accepted values, double entry, balance continuity, balances
    against the ledger's movements, the watermark's freshness, rows no window holds. Zero tolerance unless
    ``tolerance`` is set, and then only with ``tolerance_reason`` (kept with every result)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    control_totals: list[ControlTotal] = []
    required: list[Identifier] = []
    accepted_values: dict[Identifier, Annotated[list[str | int], Field(min_length=1)]] = {}
    double_entry: DoubleEntry | None = None
    balance_continuity: BalanceContinuity | None = None
    movements_match_ledger: MovementsMatchLedger | None = None
    # The committed watermark may lag the source's clock by at most this much (None: not checked).
    max_staleness: Annotated[timedelta, Field(gt=timedelta(0))] | None = None
    # Source rows whose timestamp cursor is NULL or infinite lie in no window: counted and named unless
    # the source means such rows to wait (e.g. a cursor set only when an entry is posted).
    unreachable_rows: bool = True
    # A key that the reconciliations of this many consecutive batches left out, and that none of them
    # carried (the target's version older than each window), is a finding naming it: a starved key.
    starved_after: Annotated[int, Field(ge=2, le=100)] = 3
    # Re-prove the whole table up to the watermark on this schedule (e.g. "@weekly"): a batch proven
    # once can drift later (a column added with a default, a row changed in the warehouse).
    full_schedule: Annotated[str, AfterValidator(_schedule)] | None = None
    tolerance: Annotated[Decimal, Field(ge=0)] = Decimal(0)
    tolerance_reason: Annotated[str, Field(min_length=10, max_length=500)] | None = None

    @model_validator(mode="after")
    def _reasoned(self) -> "ReconcileSpec":
        if self.tolerance and not self.tolerance_reason:
            raise ValueError(f"tolerance {self.tolerance}: a non-zero tolerance needs tolerance_reason (why the "
                             "books may differ by that much); it is recorded with every result")
        return self


class PipelineSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(pattern=f"^{NAME_PATTERN.pattern}$")]
    source_conn_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,250}$")] = "tidemark_source"
    table: TableName
    primary_key: Annotated[list[Identifier], Field(min_length=1)]
    cursor: Cursor
    safe_lag: Annotated[timedelta, Field(ge=timedelta(0), le=timedelta(days=7))]
    schedule: Annotated[str, AfterValidator(_schedule)] = "@daily"
    # Where the first batch starts: a timestamp with a zone, or an id (id cursors); everything
    # after it is loaded. Default: 1970-01-01T00:00:00Z, or for ids the smallest bigint.
    initial_watermark: datetime | int | None = None
    target_table: TableName
    create_target_schema: bool = False  # a missing target schema is an error unless this says to create it
    write_mode: Literal["upsert", "append_window_replace"] = "upsert"
    partitions: Annotated[int, Field(ge=1, le=64)] = 3
    # How data records travel (docs/control-protocol.md): "avro" is protocol version 2 (typed rows,
    # checked in Spark, staged typed, applied without parsing); "json" is version 1.
    record_format: Literal["json", "avro"] = "avro"
    # How a batch's records reach the warehouse: through the pipeline's topic ("kafka", which other
    # consumers may read too), or "direct": the extract's Spark tasks COPY them into the attempt's stage
    # (protocol version 2 only); BEGIN, END, the ledger's totals and the sink's verification are the same.
    transport: Literal["kafka", "direct"] = "kafka"
    append_only: bool = False  # the source table is never updated (required with an id cursor)
    # What the sink refuses (each refused record goes to the dead-letter topic with its reason).
    # unknown_fields and allow_non_finite_numbers: JSON records only (version 1 batches, stream events).
    unknown_fields: Literal["reject", "ignore"] = "reject"
    allow_non_finite_numbers: bool = False  # NaN and infinity in numeric columns
    max_record_bytes: Annotated[int, Field(ge=1024, le=16 * 1024 * 1024)] = 1024 * 1024
    # The longest a source transaction may hold the window back before the plan fails loudly.
    max_hold: Annotated[timedelta, Field(gt=timedelta(0), le=timedelta(days=7))] = timedelta(hours=6)
    # The longest an extract may hold its read snapshot of the source (every partition reads in it, and
    # while it is held the source's vacuum cannot remove rows dead since): past it the extract fails loudly.
    max_snapshot_hold: Annotated[timedelta, Field(gt=timedelta(0), le=timedelta(days=1))] = timedelta(hours=1)
    # The most rows one scheduled batch carries: a longer window ends at the (cursor, key) of its
    # last row, even inside a run of rows sharing one cursor value; the next batch goes on from there.
    max_batch_rows: Annotated[int, Field(ge=1)] | None = None
    sink: SinkSpec = SinkSpec()
    retries: RetrySpec = RetrySpec()
    stream: StreamSpec | None = None  # real-time events of the same facts, applied by the standing sink
    cdc: CdcSpec | None = None  # or the source table's own changes, captured from its WAL
    reconcile: ReconcileSpec = ReconcileSpec()  # what every load must prove (tidemark.reconcile)

    @field_validator("initial_watermark", mode="before")
    @classmethod
    def _start(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                value = datetime.fromisoformat(value)
            except ValueError:
                raise ValueError(f"{value!r} is not an ISO timestamp (e.g. 2026-01-01T00:00:00Z)") from None
        if isinstance(value, datetime):
            return _aware(value)
        if isinstance(value, bool) or not isinstance(value, (int, type(None))):
            raise ValueError(f"{value!r} is neither a timestamp with a zone nor an integer id")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "PipelineSpec":
        if len(set(self.primary_key)) != len(self.primary_key):
            raise ValueError(f"primary_key lists a column twice: {self.primary_key}")
        if self.cursor.kind == "id" and self.cursor.column not in self.primary_key:
            raise ValueError(
                f"cursor.column {self.cursor.column!r}: an id cursor must be a primary-key column "
                f"({self.primary_key}), or its values are not unique"
            )
        if self.cursor.kind == "id" and not self.append_only:
            raise ValueError(
                "cursor.kind 'id' sees only new rows, never updated ones: declare append_only: true if the "
                "source table is never updated, or use a timestamp cursor that every update sets"
            )
        if self.cursor.kind == "id" and isinstance(self.initial_watermark, datetime):
            raise ValueError("initial_watermark: an id cursor starts after an integer id, not a timestamp")
        if self.cursor.kind == "timestamp" and isinstance(self.initial_watermark, int):
            raise ValueError("initial_watermark: a timestamp cursor starts after a timestamp with a zone, not an id")
        lax = [o for o, on in (("unknown_fields: ignore", self.unknown_fields == "ignore"),
                               ("allow_non_finite_numbers: true", self.allow_non_finite_numbers)) if on]
        if lax and self.record_format == "avro" and self.stream is None:
            # it would change nothing, silently: version 2 checks types once, at plan, not per value
            raise ValueError(f"{' and '.join(lax)} applies only to JSON records, checked value by value (batch records "
                             "with record_format: json, or a stream's events); this spec has neither. Set "
                             "record_format: json, or remove the option")
        if self.transport == "direct" and self.record_format != "avro":
            raise ValueError("transport: direct stages typed rows (protocol version 2): set record_format: avro, or "
                             "transport: kafka")
        if self.stream is not None and self.cdc is not None:
            raise ValueError("stream and cdc: one real-time input per pipeline (events an application publishes, or "
                             "the source table's own changes); keep one")
        if self.stream is not None:
            if self.stream.topic in (self.topic, DEAD_LETTER_TOPIC) or self.stream.topic.startswith((CDC_TOPICS, CDC_GROUP_TOPICS)):
                raise ValueError(f"stream.topic: {self.stream.topic} is Tidemark's own topic, not an events topic")
            self._realtime("stream", self.stream.target_table, self.stream.serving_view)
        if self.cdc is not None:
            if len(self.cdc_slot) > 63:
                raise ValueError(f"cdc: the replication slot {self.cdc_slot} would be longer than PostgreSQL's 63 "
                                 "characters; shorten the pipeline's name")

            if self.write_mode != "upsert":
                # the handoff batch reads every row of its snapshot, also those above its window, which the
                # next batch reads again: only an upsert makes that second read change nothing
                raise ValueError(f"cdc: a CDC pipeline loads with write_mode: upsert (its handoff batch also reads "
                                 f"the rows above its window, which the next batch reads again), not {self.write_mode}")
            self._realtime("cdc", self.cdc.target_table, self.cdc.serving_view)
        return self

    def _realtime(self, section: str, table: str, view: str) -> None:
        """A real-time table and its serving view: applied by a standing sink, apart from the batch's."""
        if self.sink.mode != "standing":
            raise ValueError(f"{section}: changes are applied as they arrive, by a standing sink: set sink.mode: "
                             "standing")
        if table == self.target_table:
            raise ValueError(f"{section}.target_table: {self.target_table} is the batch target; the real-time rows "
                             "need a table of their own (e.g. realtime.<table>)")
        if len(view.split(".")[-1]) > 63 - len("_freshness"):
            raise ValueError(f"{section}.serving_view: {view} leaves no room for its companion view "
                             "<name>_freshness (63 characters at most)")
        if view in (self.target_table, table):
            raise ValueError(f"{section}.serving_view: {view} is one of the tables it merges; give the view its "
                             "own name (e.g. serving.<table>)")

    @property
    def start(self) -> datetime | int:
        """The cursor value the first batch starts after."""
        if self.initial_watermark is not None:
            return self.initial_watermark
        return -(1 << 63) if self.cursor.kind == "id" else datetime(1970, 1, 1, tzinfo=timezone.utc)

    @property
    def topic(self) -> str:
        return f"tidemark.{self.name}"

    @property
    def trigger(self) -> timedelta:
        """A standing sink's trigger: the spec's ``sink.trigger``, or for a CDC pipeline that does not set
        it, ``CDC_TRIGGER``: a change waits half as long for its micro-batch (paired runs of ``make
        bench-cdc`` at 5,000 changes/s: p50 1.1-1.2 s against 1.6-2.0 s with 2 s's half, 1 s)."""
        if self.cdc is not None and "trigger" not in self.sink.model_fields_set:
            return CDC_TRIGGER
        return self.sink.trigger

    @property
    def records_per_trigger(self) -> int:
        """A standing sink's micro-batch size: the spec's ``sink.max_offsets_per_trigger``, or for a CDC
        pipeline that does not set it, ``CDC_RECORDS_PER_TRIGGER`` (Debezium's JSON records carry their
        schema, a few KB each, and the driver holds a micro-batch's change events: 200,000 of them
        exhausted a 1 GiB driver in ``make bench-cdc``)."""
        if self.cdc is not None and "max_offsets_per_trigger" not in self.sink.model_fields_set:
            return CDC_RECORDS_PER_TRIGGER
        return self.sink.max_offsets_per_trigger

    @property
    def records_per_task(self) -> int:
        """The most records one Spark task reads: the spec's ``sink.max_records_per_task``, or for a CDC
        pipeline that does not set it, ``CDC_RECORDS_PER_TASK``: its change events come on one
        partition, a few KB each, and read by one task they kept one core busy while the other idled."""
        if self.cdc is not None and "max_records_per_task" not in self.sink.model_fields_set:
            return CDC_RECORDS_PER_TASK
        return self.sink.max_records_per_task

    @property
    def cdc_slot(self) -> str:
        """The logical replication slot and the publication of a CDC pipeline (one name for both), shared
        by its capture group's pipelines."""
        group = self.cdc.group if self.cdc is not None else None
        return f"tidemark_group_{group}" if group else f"tidemark_{self.name}"

    @property
    def cdc_topic_prefix(self) -> str:
        """Debezium's topic.prefix: its change events go to ``<prefix>.<schema>.<table>``."""
        group = self.cdc.group if self.cdc is not None else None
        return f"{CDC_GROUP_TOPICS}{group}" if group else f"{CDC_TOPICS}{self.name}"

    @property
    def cdc_topic(self) -> str:
        schema, table = self.table.split(".") if "." in self.table else ("public", self.table)
        return f"{self.cdc_topic_prefix}.{schema}.{table}"

    @property
    def cdc_transaction_topic(self) -> str:
        """Debezium's BEGIN and END of each source transaction (with its event count), one topic for a
        capture group."""
        return f"{self.cdc_topic_prefix}.transaction"

    @property
    def realtime_topics(self) -> dict[str, int]:
        """The real-time input's topics and partition counts: the stream's events topic, or Debezium's
        change events and transaction boundaries (one partition each: their order is the log's). None
        for a capture group's member: the group's lead reads them all (``tidemark.realtime.cdc.groups``)."""
        if self.stream is not None:
            return {self.stream.topic: self.stream.partitions}
        if self.cdc is not None and self.cdc.group is None:
            return {self.cdc_topic: 1, self.cdc_transaction_topic: 1}
        return {}


class SpecError(Terminal, ValueError):
    """An invalid pipeline spec file; the message names the file and every bad field."""


def quote(identifier: str) -> str:
    """Quote a (possibly schema-qualified) identifier that already passed validation."""
    parts = identifier.split(".")
    if not all(_is_ident(p) for p in parts):
        raise SpecError(f"refusing to quote unvalidated identifier {identifier!r}")
    return ".".join(f'"{p}"' for p in parts)


def key_text(values) -> str:
    """A row's primary key for a message: ``7``, or ``(7, 'EUR')`` for a key of several columns."""
    shown = [repr(v) if isinstance(v, str) else str(v) for v in values]
    return shown[0] if len(shown) == 1 else f"({', '.join(shown)})"


def load_spec(path: Path) -> PipelineSpec:
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: expected a mapping of fields, got {type(raw).__name__}")
    try:
        spec = PipelineSpec.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"field '{'.'.join(str(p) for p in err['loc']) or '(spec)'}': {err['msg']}" for err in exc.errors()
        )
        raise SpecError(f"{path}: {problems}") from None
    if spec.name != path.stem:
        raise SpecError(f"{path}: field 'name': {spec.name!r} must equal the file name {path.stem!r}")
    return spec


def load_specs(directory: Path) -> tuple[list[tuple[Path, PipelineSpec]], list[SpecError]]:
    """Every ``*.yaml`` spec in ``directory``: the valid ones, and an error per invalid file.

    Two specs that write one target table are both refused: their batches would replace each
    other's rows."""
    specs: list[tuple[Path, PipelineSpec]] = []
    errors: list[SpecError] = []
    for path in sorted(directory.glob("*.yaml")):
        try:
            specs.append((path, load_spec(path)))
        except SpecError as exc:
            errors.append(exc)
    writers: dict[str, list[Path]] = {}
    for path, spec in specs:
        realtime = spec.stream or spec.cdc
        for table in (spec.target_table, *([realtime.target_table, realtime.serving_view] if realtime else [])):
            writers.setdefault(table, []).append(path)
    clashing = {p for paths in writers.values() if len(paths) > 1 for p in paths}
    for target, paths in writers.items():
        for path in paths if len(paths) > 1 else ():
            others = ", ".join(str(o) for o in paths if o != path)
            errors.append(SpecError(f"{path}: field 'target_table': {target} is also written by {others}; "
                                    "one pipeline per target table"))
    refused = _group_errors(specs)
    errors += [e for _, e in refused]
    clashing |= {p for p, _ in refused}
    return [(p, s) for p, s in specs if p not in clashing], errors


def _group_errors(specs: list[tuple[Path, PipelineSpec]]) -> list[tuple[Path, SpecError]]:
    """What makes a capture group impossible (``cdc.group``), per refused file: a member reading another
    source database than the group's first (one slot reads one database), a second member capturing
    one table (Debezium writes one topic per table), and every member of a group whose slot is
    another pipeline's."""
    errors: list[tuple[Path, SpecError]] = []
    own_slots = {s.cdc_slot: p for p, s in specs if s.cdc is not None and s.cdc.group is None}
    by_group: dict[str, list[tuple[Path, PipelineSpec]]] = {}
    for path, spec in specs:
        if spec.cdc is not None and spec.cdc.group is not None:
            by_group.setdefault(spec.cdc.group, []).append((path, spec))
    for group, members in by_group.items():
        first_path, first = members[0]
        names = ", ".join(s.name for _, s in members)
        for path, spec in members[1:]:
            if spec.source_conn_id != first.source_conn_id:
                errors.append((path, SpecError(
                    f"{path}: field 'cdc.group': group {group} ({names}) reads one source database through one slot, "
                    f"but this pipeline reads {spec.source_conn_id} and {first.name} ({first_path}) reads "
                    f"{first.source_conn_id}")))
        tables: dict[str, Path] = {}
        for path, spec in members:
            table = spec.table if "." in spec.table else f"public.{spec.table}"
            if table in tables:
                errors.append((path, SpecError(f"{path}: field 'table': {table} is captured twice in group {group} "
                                               f"(also by {tables[table]}); one pipeline per table in a group")))
            tables.setdefault(table, path)
        if first.cdc_slot in own_slots:
            errors += [(path, SpecError(f"{path}: field 'cdc.group': group {group}'s slot {first.cdc_slot} is the slot "
                                        f"of the pipeline in {own_slots[first.cdc_slot]}; name the group otherwise"))
                       for path, _ in members]
    return errors

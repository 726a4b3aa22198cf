"""The batch control protocol (see docs/control-protocol.md): BEGIN, END and ABORT envelopes.

Control messages travel on the pipeline's own topic, one per partition, so on every partition
they are ordered with the data records they bracket. They are produced in one Kafka transaction
per step; readers use read_committed. Data records carry the batch id and attempt in headers.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_serializer, field_validator, model_validator

PROTOCOL_VERSION = 1  # JSON records; version 2: Avro records of a registered schema (tidemark.avro)
PROTOCOL_VERSIONS = (1, 2)
HEADER_CONTROL = "tidemark.control"  # header on control messages: BEGIN | END | ABORT
HEADER_BATCH = "tidemark.batch"  # headers on data records
HEADER_ATTEMPT = "tidemark.attempt"

Kind = Literal["BEGIN", "END", "ABORT"]


class PartitionTotals(BaseModel):
    """What one partition carries for one attempt: rows and the sum of their 64-bit row hashes."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    rows: Annotated[int, Field(ge=0)]
    checksum: int  # exact sum of xxhash64(key, value) over the partition's records

    @field_validator("checksum", mode="before")
    @classmethod
    def _checksum_from_text(cls, value: Any) -> Any:
        # Written as a decimal string (see below); an integer is read too (older producers).
        if isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,40}", value):
            return int(value)
        return value

    @field_serializer("checksum")
    def _checksum_text(self, value: int) -> str:
        # Sums of 64-bit hashes pass 2**63 on any real batch: as a decimal string they survive
        # every JSON layer between here and the sink (Airflow's XCom serializer refuses them).
        return str(value)



class ControlMessage(BaseModel):
    # strict: no lax coercion ("5" is not 5, 1.0 is not 1); the window is checked in _shape
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    version: Literal[PROTOCOL_VERSIONS] = PROTOCOL_VERSION  # type: ignore[valid-type]
    kind: Kind
    pipeline: str
    batch_id: Annotated[str, Field(min_length=1, max_length=200)]
    attempt: Annotated[int, Field(ge=1)]
    window: dict[str, Any]  # tidemark.window.Window.to_json()
    # version 1: always 1 (JSON); version 2: the pipeline's registered record schema the batch uses
    schema_version: Annotated[int, Field(ge=1)] = 1
    partitions: Annotated[int, Field(ge=1, le=64)]
    partition: Annotated[int, Field(ge=0)]  # the partition this copy was written to
    totals: PartitionTotals | None = None  # END only: this partition's rows and checksum
    batch_rows: Annotated[int, Field(ge=0)] | None = None  # END only: all partitions
    reason: str | None = None  # ABORT only
    sent_at: datetime

    @model_validator(mode="after")
    def _shape(self) -> "ControlMessage":
        if self.version == 1 and self.schema_version != 1:
            raise ValueError(f"protocol version 1 has only schema_version 1, not {self.schema_version}")
        if self.partition >= self.partitions:
            raise ValueError(f"partition {self.partition} outside 0..{self.partitions - 1}")
        if self.kind == "END" and (self.totals is None or self.batch_rows is None):
            raise ValueError("END needs totals and batch_rows")
        if self.kind != "END" and self.totals is not None:
            raise ValueError(f"{self.kind} carries no totals")
        from tidemark.window import Window

        if self.kind != "END" and self.batch_rows is not None:
            raise ValueError(f"{self.kind} carries no batch_rows")
        if self.kind != "ABORT" and self.reason is not None:
            raise ValueError(f"{self.kind} carries no reason")
        try:
            Window.from_json(self.window)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"window is not a window: {exc}") from None
        return self

    @property
    def parsed_window(self):
        from tidemark.window import Window

        return Window.from_json(self.window)

    def encode(self) -> bytes:
        return self.model_dump_json().encode()

    def describe(self) -> str:
        extra = f" rows={self.totals.rows}" if self.totals else ""
        return f"{self.kind} {self.pipeline} batch={self.batch_id} attempt={self.attempt} p{self.partition}{extra}"


class ProtocolError(ValueError):
    """A control message that cannot be parsed or does not fit the protocol."""


def decode(raw: bytes | str | None) -> ControlMessage:
    if raw is None:
        raise ProtocolError("control message without a value")
    try:
        return ControlMessage.model_validate_json(raw)
    except ValidationError as exc:
        fields = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(message)'}: {e['msg']}" for e in exc.errors())
        raise ProtocolError(f"malformed control message: {fields}") from None


def messages(
    kind: Kind,
    *,
    pipeline: str,
    batch_id: str,
    attempt: int,
    window: dict[str, Any],
    partitions: int,
    totals: dict[int, PartitionTotals] | None = None,
    reason: str | None = None,
    schema_version: int | None = None,
) -> list[ControlMessage]:
    """One copy per partition; END copies carry that partition's totals. ``schema_version``: the
    batch's registered record schema (protocol version 2); None: version 1, JSON records."""
    now = datetime.now(timezone.utc)
    batch_rows = sum(t.rows for t in totals.values()) if totals is not None else None
    if kind == "END" and (totals is None or sorted(totals) != list(range(partitions))):
        raise ProtocolError(f"END for {batch_id} needs totals for partitions 0..{partitions - 1}")
    return [
        ControlMessage(
            kind=kind, pipeline=pipeline, batch_id=batch_id, attempt=attempt, window=window,
            partitions=partitions, partition=p, totals=totals[p] if totals else None,
            batch_rows=batch_rows, reason=reason, sent_at=now,
            **({"version": 2, "schema_version": schema_version} if schema_version is not None else {}),
        )
        for p in range(partitions)
    ]


def send(bootstrap: str, topic: str, batch: list[ControlMessage], *, transactional_id: str,
         timeout_s: float | None = None) -> None:
    """Write the messages to their partitions in one Kafka transaction.

    The transactional id is stable per pipeline, so a new producer fences any zombie that is
    still holding an older transaction open for the same pipeline.
    """
    from confluent_kafka import Producer

    from tidemark.config import kafka_timeout_s
    from tidemark.kafka_io import producer_config

    timeout_s = kafka_timeout_s() if timeout_s is None else timeout_s
    producer = Producer(producer_config(bootstrap, **{"transactional.id": transactional_id}))
    producer.init_transactions(timeout_s)
    producer.begin_transaction()
    try:
        for msg in batch:
            producer.produce(
                topic, value=msg.encode(), partition=msg.partition,
                headers=[(HEADER_CONTROL, msg.kind.encode())],
            )
        producer.commit_transaction(timeout_s)
    except BaseException:
        producer.abort_transaction(timeout_s)
        raise


def header_value(headers: list[tuple[str, bytes]] | None, name: str) -> str | None:
    for key, value in headers or ():
        if key == name and value is not None:
            return value.decode() if isinstance(value, bytes) else str(value)
    return None


def dumps_totals(totals: dict[int, PartitionTotals]) -> str:
    return json.dumps({str(p): t.model_dump() for p, t in sorted(totals.items())})


def loads_totals(raw: str | dict) -> dict[int, PartitionTotals]:
    data = json.loads(raw) if isinstance(raw, str) else raw
    return {int(p): PartitionTotals.model_validate(t) for p, t in data.items()}

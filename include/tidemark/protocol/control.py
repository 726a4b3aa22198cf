"""The batch control protocol (see docs/control-protocol.md): BEGIN, END and ABORT envelopes.

Control messages travel on the pipeline's own topic, one per partition, so on every partition
they are ordered with the data records they bracket. They are produced in one Kafka transaction
per step; readers use read_committed. Data records carry the batch id and attempt in headers.
Every control message is signed (HMAC-SHA256 with a key id, ``Keyring``): anyone may produce to
the topic, only the orchestrator holds the key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_serializer, field_validator, model_validator

from tidemark.protocol.errors import Terminal

PROTOCOL_VERSION = 1  # JSON records; version 2: Avro records of a registered schema (tidemark.protocol.avro)
PROTOCOL_VERSIONS = (1, 2)
HEADER_CONTROL = "tidemark.control"  # header on control messages: BEGIN | END | ABORT
HEADER_BATCH = "tidemark.batch"  # headers on data records
HEADER_ATTEMPT = "tidemark.attempt"
CONTROL_KEYS_ENV = "TIDEMARK_CONTROL_KEYS"  # the keyring reaches a Spark job only through this variable
_KEY_ID = r"[A-Za-z0-9._-]{1,64}"
MIN_SECRET_CHARS = 32

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
    window: dict[str, Any]  # tidemark.protocol.window.Window.to_json()
    # version 1: always 1 (JSON); version 2: the pipeline's registered record schema the batch uses
    schema_version: Annotated[int, Field(ge=1)] = 1
    partitions: Annotated[int, Field(ge=1, le=64)]
    partition: Annotated[int, Field(ge=0)]  # the partition this copy was written to
    totals: PartitionTotals | None = None  # END only: this partition's rows and checksum
    batch_rows: Annotated[int, Field(ge=0)] | None = None  # END only: all partitions
    reason: str | None = None  # ABORT only
    sent_at: datetime
    # HMAC-SHA256 over every other field (key_id included), by the keyring's signing key
    key_id: Annotated[str, Field(pattern=f"^{_KEY_ID}$")] | None = None
    signature: Annotated[str, Field(pattern="^[0-9a-f]{64}$")] | None = None

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
        from tidemark.protocol.window import Window

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
        from tidemark.protocol.window import Window

        return Window.from_json(self.window)

    def encode(self) -> bytes:
        return self.model_dump_json().encode()

    def describe(self) -> str:
        extra = f" rows={self.totals.rows}" if self.totals else ""
        return f"{self.kind} {self.pipeline} batch={self.batch_id} attempt={self.attempt} p{self.partition}{extra}"


class ProtocolError(Terminal, ValueError):
    """A control message that cannot be parsed or does not fit the protocol."""


class KeyringError(Terminal, ValueError):
    """No usable control keyring: messages can be neither signed nor verified. Says where it looked."""


def _mac(secret: bytes, msg: ControlMessage) -> str:
    # canonical JSON of every field but the signature: the same bytes on both sides whatever
    # order or spacing the wire used
    body = json.dumps(msg.model_dump(mode="json", exclude={"signature"}), sort_keys=True, separators=(",", ":"))
    return hmac.new(secret, body.encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True, repr=False)
class Keyring:
    """The control messages' HMAC keys, ``key_id:secret`` pairs: the first signs, every one verifies.

    Rotation without downtime: add the new key second (sinks accept both, the orchestrator still
    signs with the old), then move it first (the orchestrator signs with it), then drop the old key
    once no attempt signed with it is open. Secrets never appear in a message or a log line."""

    keys: tuple[tuple[str, bytes], ...]

    @classmethod
    def parse(cls, text: str | None, *, source: str) -> "Keyring":
        entries = [e.strip() for e in (text or "").split(",") if e.strip()]
        if not entries:
            raise KeyringError(f"{source} holds no control key: expected key_id:secret[,key_id:secret...]")
        keys: list[tuple[str, bytes]] = []
        for n, entry in enumerate(entries, 1):
            key_id, sep, secret = entry.partition(":")
            if not sep or not re.fullmatch(_KEY_ID, key_id):
                raise KeyringError(f"{source}: entry {n} is not key_id:secret (a key id is 1-64 of A-Z a-z 0-9 . _ -)")
            if len(secret) < MIN_SECRET_CHARS:
                raise KeyringError(f"{source}: the secret of key {key_id} has {len(secret)} characters, "
                                   f"at least {MIN_SECRET_CHARS} are needed (for example 64 hex digits)")
            if key_id in dict(keys):
                raise KeyringError(f"{source}: key id {key_id} appears twice")
            keys.append((key_id, secret.encode()))
        return cls(tuple(keys))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> "Keyring":
        if not environ.get(CONTROL_KEYS_ENV, "").strip():
            raise KeyringError(f"environment variable {CONTROL_KEYS_ENV} is not set: control messages can be neither "
                               "signed nor verified. Next: set it to key_id:secret (the Airflow connection "
                               "tidemark_control's password; the local stack generates one at make up)")
        return cls.parse(environ[CONTROL_KEYS_ENV], source=f"environment variable {CONTROL_KEYS_ENV}")

    @property
    def key_ids(self) -> list[str]:
        return [key_id for key_id, _ in self.keys]

    def text(self) -> str:
        """The keyring as ``parse`` reads it: for a child process's environment, never for a log."""
        return ",".join(f"{key_id}:{secret.decode()}" for key_id, secret in self.keys)

    def __repr__(self) -> str:
        return f"Keyring(key ids {self.key_ids}, signing with {self.keys[0][0]})"

    def sign(self, msg: ControlMessage) -> ControlMessage:
        key_id, secret = self.keys[0]
        unsigned = msg.model_copy(update={"key_id": key_id, "signature": None})
        return unsigned.model_copy(update={"signature": _mac(secret, unsigned)})

    def verify(self, msg: ControlMessage) -> str | None:
        """Why ``msg`` is not the orchestrator's (None: its signature holds under one of our keys)."""
        if msg.key_id is None or msg.signature is None:
            return "unsigned (no key_id and signature): not sent by the orchestrator"
        secret = dict(self.keys).get(msg.key_id)
        if secret is None:
            return (f"signed with key id {msg.key_id}, which this sink's keyring ({', '.join(self.key_ids)}) does not "
                    "hold: forged, or a key retired too early (add it back to the keyring's end to accept it)")
        if not hmac.compare_digest(msg.signature, _mac(secret, msg)):
            return f"its signature under key {msg.key_id} does not match its content: forged or altered"
        return None


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


def send(bootstrap: str, topic: str, batch: list[ControlMessage], *, transactional_id: str, keyring: Keyring,
         timeout_s: float | None = None) -> None:
    """Sign the messages with the keyring's signing key and write them to their partitions in one
    Kafka transaction.

    The transactional id is stable per pipeline, so a new producer fences any zombie that is
    still holding an older transaction open for the same pipeline.
    """
    from confluent_kafka import Producer

    from tidemark.protocol.config import kafka_timeout_s
    from tidemark.protocol.kafka_io import producer_config

    timeout_s = kafka_timeout_s() if timeout_s is None else timeout_s
    producer = Producer(producer_config(bootstrap, **{"transactional.id": transactional_id}))
    producer.init_transactions(timeout_s)
    producer.begin_transaction()
    try:
        for msg in map(keyring.sign, batch):
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

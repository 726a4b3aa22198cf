"""Change records signed by the Connect worker, so that only Debezium's records change the warehouse.

Anyone with produce rights on a CDC topic could otherwise write a change the sink would apply. The
worker's value converter (``tidemark.connect.SigningJsonConverter``, stack/java/signing) adds the
header ``tidemark.signature`` = ``<key id>:<hex HMAC-SHA256 of topic, NUL, value>`` to every record
it writes. Its key is derived from a key of the control keyring, so the worker can sign change
records but never a control message, and the sink, which holds the keyring, verifies both.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from tidemark.protocol.control import Keyring

HEADER = "tidemark.signature"
CONVERTER = "tidemark.connect.SigningJsonConverter"
_LABEL = b"tidemark cdc change records v1"


def record_key(secret: bytes) -> str:
    """The key the worker signs change records with, derived from a control key (one way: the
    worker cannot recover the control key from it)."""
    return hmac.new(secret, _LABEL, hashlib.sha256).hexdigest()


def sign(key: str, topic: str, value: bytes) -> str:
    """The hex signature after ``<key id>:`` in the header: what the sink checks a record against, and
    what tests and tools sign with (the worker signs in Java)."""
    return hmac.new(key.encode(), topic.encode() + b"\0" + value, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class SigningKey:
    """The key the connector signs with: its key id, and the name of the file in the worker's secrets
    directory that holds the derived key."""

    key_id: str
    secret_file: str


def signing_key(keyring: Keyring) -> tuple[SigningKey, str]:
    """The keyring's signing key as the worker gets it: the connector's reference, and the derived
    key to write into the worker's secrets directory."""
    key_id, secret = keyring.keys[0]
    return SigningKey(key_id, f"tidemark-cdc-signing-{key_id}"), record_key(secret)


class Verifier:
    """Why a record of a CDC topic is not the worker's (None: it is), under any key of the keyring."""

    def __init__(self, keyring: Keyring):
        self._keys = {key_id.encode(): record_key(secret) for key_id, secret in keyring.keys}
        self.key_ids = ", ".join(key_id for key_id, _ in keyring.keys)

    def why_not(self, topic: str, value: bytes | None, header: bytes | str | None) -> str | None:
        """``header`` as Kafka hands it over (bytes, whatever a producer put there)."""
        if header is None:
            return f"no {HEADER} header: not written by Tidemark's Connect worker"
        raw = header.encode("utf-8", "replace") if isinstance(header, str) else bytes(header)
        key_id, _, signature = raw.partition(b":")
        key = self._keys.get(key_id)
        if key is None:
            return (f"signed with key id {key_id.decode('ascii', 'replace')[:64]!r}, which this sink's keyring "
                    f"({self.key_ids}) does not hold: forged, or a key retired while the connector still signs with it")
        if not hmac.compare_digest(signature, sign(key, topic, value or b"").encode()):
            return f"its signature under key {key_id.decode()} does not match its topic and value: forged or altered"
        return None

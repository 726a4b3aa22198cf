"""Change records signed by the Connect worker (tidemark.realtime.cdc.signing): the sink's check, and the key
the worker gets."""

from __future__ import annotations

import pytest

from tidemark.protocol.control import Keyring
from tidemark.realtime.cdc.signing import Verifier, record_key, sign, signing_key

OLD, NEW = "k1:" + "a" * 40, "k2:" + "b" * 40
TOPIC, VALUE = "tidemark.cdc.payments.public.payments", b'{"payload": {"op": "u"}}'


def header(key_id: str, secret: str, topic: str = TOPIC, value: bytes = VALUE) -> str:
    return f"{key_id}:{sign(record_key(secret.encode()), topic, value)}"


def test_a_record_signed_with_any_key_of_the_keyring_passes():
    verifier = Verifier(Keyring.parse(f"{NEW},{OLD}", source="test"))
    assert verifier.why_not(TOPIC, VALUE, header("k1", "a" * 40)) is None
    assert verifier.why_not(TOPIC, VALUE, header("k2", "b" * 40).encode()) is None  # as Kafka hands headers over


@pytest.mark.parametrize("signature, why", [
    (None, "no tidemark.signature header"),
    (header("k1", "a" * 40, value=b'{"payload": {"op": "d"}}'), "does not match its topic and value"),
    (header("k1", "a" * 40, topic="tidemark.cdc.other.public.payments"), "does not match its topic and value"),
    (header("k1", "c" * 40), "does not match"),  # a key id of ours, another secret
    (header("k9", "a" * 40), "key id 'k9', which this sink's keyring (k1) does not hold"),
    ("k1", "does not match"),
    (b"\xff\xfe", "does not hold"),
    ("k1:é", "does not match"),  # not ASCII: compared as bytes, never an exception that stops the sink
    (b"k1:\xff" + b"0" * 63, "does not match"),
    (b"", "key id '', which this sink's keyring (k1) does not hold"),
])
def test_a_record_the_worker_did_not_sign_says_why(signature, why):
    verifier = Verifier(Keyring.parse(OLD, source="test"))
    reason = verifier.why_not(TOPIC, VALUE, signature)
    assert reason is not None and why in reason, reason


def test_the_worker_gets_a_derived_key_never_the_control_key():
    ring = Keyring.parse(f"{NEW},{OLD}", source="test")
    key, derived = signing_key(ring)
    assert (key.key_id, key.secret_file) == ("k2", "tidemark-cdc-signing-k2")  # the signing key: the first
    assert derived == record_key(b"b" * 40) and "b" * 40 not in derived and len(derived) == 64
    assert record_key(b"a" * 40) != derived

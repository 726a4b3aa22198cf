"""The batch control envelope (tidemark.protocol.control): building, encoding and decoding BEGIN/END/ABORT.

Pure logic: no Kafka. ``send`` is not exercised here (it needs a broker).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from pydantic import ValidationError

from tidemark.protocol.control import (
    CONTROL_KEYS_ENV,
    HEADER_ATTEMPT,
    HEADER_BATCH,
    HEADER_CONTROL,
    PROTOCOL_VERSION,
    ControlMessage,
    Keyring,
    KeyringError,
    PartitionTotals,
    ProtocolError,
    decode,
    dumps_totals,
    header_value,
    loads_totals,
    messages,
)
from tidemark.protocol.window import Bound, Window

UTC = timezone.utc
WINDOW = Window(Bound(datetime(2026, 1, 1, tzinfo=UTC)), Bound(datetime(2026, 1, 2, tzinfo=UTC))).to_json()
COMMON = {"pipeline": "ledger_entries", "batch_id": "ledger_entries:scheduled__2026-01-02", "attempt": 2, "window": WINDOW}
TOTALS = {
    0: PartitionTotals(rows=3, checksum=-9_000_000_000_000_000_000),
    1: PartitionTotals(rows=0, checksum=0),
    2: PartitionTotals(rows=5, checksum=2**70),  # sums of 64-bit hashes exceed 64 bits: kept exact
}
SENT = "2026-01-02T00:10:00.123456Z"


def _envelope(**changes) -> dict:
    raw = {
        "version": 1, "kind": "BEGIN", **COMMON, "schema_version": 1, "partitions": 3, "partition": 0,
        "sent_at": SENT,
    }
    raw.update(changes)
    return {k: v for k, v in raw.items() if v is not ...}


def _decode_error(raw) -> str:
    with pytest.raises(ProtocolError) as info:
        decode(raw if isinstance(raw, (bytes, str)) or raw is None else json.dumps(raw))
    return str(info.value)


def test_names_on_the_wire():
    assert PROTOCOL_VERSION == 1
    assert (HEADER_CONTROL, HEADER_BATCH, HEADER_ATTEMPT) == ("tidemark.control", "tidemark.batch", "tidemark.attempt")


# --- messages() --------------------------------------------------------------------------------

def test_begin_is_one_copy_per_partition():
    msgs = messages("BEGIN", partitions=3, **COMMON)
    assert [m.partition for m in msgs] == [0, 1, 2]
    assert {(m.kind, m.version, m.pipeline, m.batch_id, m.attempt, m.partitions, m.schema_version) for m in msgs} == {
        ("BEGIN", 1, "ledger_entries", "ledger_entries:scheduled__2026-01-02", 2, 3, 1)
    }
    assert all(m.window == WINDOW for m in msgs)
    assert [(m.totals, m.batch_rows, m.reason) for m in msgs] == [(None, None, None)] * 3
    assert len({m.sent_at for m in msgs}) == 1 and msgs[0].sent_at.tzinfo is not None


def test_end_copies_carry_their_own_partition_totals_and_the_batch_total():
    msgs = messages("END", partitions=3, totals=TOTALS, **COMMON)
    assert [(m.partition, m.totals) for m in msgs] == [(0, TOTALS[0]), (1, TOTALS[1]), (2, TOTALS[2])]
    assert [m.batch_rows for m in msgs] == [8, 8, 8]
    assert [m.describe() for m in msgs][2] == (
        "END ledger_entries batch=ledger_entries:scheduled__2026-01-02 attempt=2 p2 rows=5"
    )


def test_abort_copies_carry_the_reason():
    msgs = messages("ABORT", partitions=2, reason="extract failed", **COMMON)
    assert [(m.kind, m.partition, m.reason, m.totals) for m in msgs] == [
        ("ABORT", 0, "extract failed", None), ("ABORT", 1, "extract failed", None),
    ]


@pytest.mark.parametrize("totals", [
    None,
    {},
    {0: TOTALS[0], 1: TOTALS[1]},  # partition 2 missing
    {0: TOTALS[0], 2: TOTALS[2], 3: TOTALS[1]},  # 1 missing, 3 does not exist
    {**TOTALS, 3: TOTALS[1]},  # one too many
])
def test_end_needs_totals_for_exactly_every_partition(totals):
    with pytest.raises(ProtocolError, match=r"^END for ledger_entries:scheduled__2026-01-02 needs totals for partitions 0\.\.2$"):
        messages("END", partitions=3, totals=totals, **COMMON)


def test_begin_must_not_carry_totals():
    with pytest.raises(ValidationError, match="BEGIN carries no totals"):
        messages("BEGIN", partitions=1, totals={0: TOTALS[0]}, **COMMON)


# --- encode / decode ---------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["BEGIN", "END", "ABORT"])
def test_encode_decode_round_trip(kind):
    extra = {"totals": TOTALS} if kind == "END" else {"reason": "operator stopped it"} if kind == "ABORT" else {}
    for msg in messages(kind, partitions=3, **COMMON, **extra):
        raw = msg.encode()
        assert isinstance(raw, bytes)
        assert decode(raw) == msg
        assert decode(raw.decode()) == msg


def test_encoded_end_carries_checksums_as_exact_decimal_strings():
    msg = messages("END", partitions=3, totals=TOTALS, **COMMON)[2]
    body = json.loads(msg.encode())
    assert body["version"] == 1 and body["kind"] == "END" and body["partition"] == 2
    # a string: no JSON layer (Airflow's XCom serializer, a float-minded reader) can round or refuse it
    assert body["totals"] == {"rows": 5, "checksum": "1180591620717411303424"}
    assert body["batch_rows"] == 8
    assert body["window"] == WINDOW
    assert decode(msg.encode()).totals == TOTALS[2]


def test_an_end_with_an_integer_checksum_is_still_read():  # what older producers wrote
    body = _envelope(kind="END", partition=1, totals={"rows": 3, "checksum": 2**70}, batch_rows=3)
    assert decode(json.dumps(body)).totals == PartitionTotals(rows=3, checksum=2**70)


def test_decode_a_hand_written_envelope():
    msg = decode(json.dumps(_envelope(kind="END", partition=1, totals={"rows": 3, "checksum": -5}, batch_rows=3)))
    assert (msg.kind, msg.partition, msg.totals, msg.batch_rows) == ("END", 1, PartitionTotals(rows=3, checksum=-5), 3)
    assert msg.sent_at == datetime(2026, 1, 2, 0, 10, 0, 123456, tzinfo=UTC)


@pytest.mark.parametrize(("raw", "expected"), [
    (None, "control message without a value"),
    (b"", "malformed control message: (message): Invalid JSON"),
    (b"not json", "malformed control message: (message): Invalid JSON"),
    ("{", "malformed control message: (message): Invalid JSON"),
    (b"[]", "malformed control message: (message): Input should be an object"),
    (b"null", "malformed control message: (message): Input should be an object"),
])
def test_decode_rejects_malformed_json(raw, expected):
    assert _decode_error(raw).startswith(expected)


@pytest.mark.parametrize(("changes", "expected"), [
    ({"version": 3}, "version: Input should be 1 or 2"),
    ({"version": 0}, "version: Input should be 1 or 2"),
    ({"version": "1"}, "version: Input should be 1 or 2"),
    ({"schema_version": 2}, "(message): Value error, protocol version 1 has only schema_version 1, not 2"),
    ({"version": 2, "schema_version": 0}, "schema_version: Input should be greater than or equal to 1"),
    ({"kind": "COMMIT"}, "kind: Input should be 'BEGIN', 'END' or 'ABORT'"),
    ({"partition": 3}, "(message): Value error, partition 3 outside 0..2"),
    ({"partition": 7, "partitions": 4}, "(message): Value error, partition 7 outside 0..3"),
    ({"partition": -1}, "partition: Input should be greater than or equal to 0"),
    ({"partitions": 0}, "partitions: Input should be greater than or equal to 1"),
    ({"partitions": 65}, "partitions: Input should be less than or equal to 64"),
    ({"attempt": 0}, "attempt: Input should be greater than or equal to 1"),
    ({"batch_id": ""}, "batch_id: String should have at least 1 character"),
    ({"kind": "END"}, "(message): Value error, END needs totals and batch_rows"),
    ({"kind": "END", "totals": {"rows": 1, "checksum": 2}}, "(message): Value error, END needs totals and batch_rows"),
    ({"kind": "END", "batch_rows": 1}, "(message): Value error, END needs totals and batch_rows"),
    ({"kind": "END", "totals": {"rows": -1, "checksum": 2}, "batch_rows": 1}, "totals.rows: Input should be greater than or equal to 0"),
    ({"kind": "ABORT", "totals": {"rows": 1, "checksum": 2}}, "(message): Value error, ABORT carries no totals"),
    ({"sent_at": ...}, "sent_at: Field required"),
    ({"pipeline": ...}, "pipeline: Field required"),
    ({"surprise": 1}, "surprise: Extra inputs are not permitted"),
])
def test_decode_names_the_offending_field(changes, expected):
    message = _decode_error(_envelope(**changes))
    assert message.startswith("malformed control message: ")
    assert expected in message


def test_protocol_error_is_a_value_error():
    assert issubclass(ProtocolError, ValueError)


def test_decode_rejects_a_window_that_is_not_a_window():
    with pytest.raises(ProtocolError, match="window"):
        decode(json.dumps(_envelope(window={})))


def test_version_2_messages_name_their_record_schema_version():
    msgs = messages("BEGIN", partitions=2, schema_version=4, **COMMON)
    assert {(m.version, m.schema_version) for m in msgs} == {(2, 4)}
    assert decode(msgs[1].encode()) == msgs[1]
    assert {(m.version, m.schema_version) for m in messages("ABORT", partitions=1, reason="x", **COMMON)} == {(1, 1)}


def test_control_messages_are_immutable():
    msg = messages("BEGIN", partitions=1, **COMMON)[0]
    with pytest.raises(ValidationError):
        msg.attempt = 3  # type: ignore[misc]


# --- totals -------------------------------------------------------------------------------------

def test_dumps_totals_exact_text():
    assert dumps_totals({2: TOTALS[2], 0: TOTALS[0]}) == (
        '{"0": {"rows": 3, "checksum": "-9000000000000000000"}, "2": {"rows": 5, "checksum": "1180591620717411303424"}}'
    )


def test_totals_round_trip_through_text_and_through_a_parsed_report():
    text = dumps_totals(TOTALS)
    assert loads_totals(text) == TOTALS
    assert loads_totals(json.loads(text)) == TOTALS
    # the extract job's report: string partition keys, JSON integers
    report = {"0": {"rows": 3, "checksum": -9000000000000000000}, "1": {"rows": 0, "checksum": 0},
              "2": {"rows": 5, "checksum": 1180591620717411303424}}
    assert loads_totals(report) == TOTALS
    assert list(loads_totals(report)) == [0, 1, 2]


@pytest.mark.parametrize("bad", [
    {"0": {"rows": -1, "checksum": 0}},
    {"0": {"rows": 1}},
    {"0": {"rows": 1, "checksum": 0, "extra": 1}},
])
def test_loads_totals_validates(bad):
    with pytest.raises(ValidationError):
        loads_totals(bad)


# --- headers ------------------------------------------------------------------------------------

def test_header_value():
    headers = [("other", b"x"), (HEADER_BATCH, None), (HEADER_BATCH, b"b-1"), (HEADER_ATTEMPT, "3")]
    assert header_value(headers, HEADER_BATCH) == "b-1"
    assert header_value(headers, HEADER_ATTEMPT) == "3"
    assert header_value(headers, HEADER_CONTROL) is None
    assert header_value(None, HEADER_CONTROL) is None


# --- signatures ---------------------------------------------------------------------------------

OLD, NEW = "k-2026a:" + "a" * 64, "k-2026b:" + "b" * 64


def _wire(msg: ControlMessage, **changes) -> bytes:
    """What a reader gets from the topic: the encoded message, optionally edited in transit."""
    data = json.loads(msg.encode())
    data.update(changes)
    return json.dumps(data, indent=1, sort_keys=False).encode()  # other spacing and order than the signer's


def test_a_signed_message_verifies_after_the_wire_and_names_its_key():
    ring = Keyring.parse(OLD, source="test")
    for msg in [*messages("END", partitions=3, totals=TOTALS, **COMMON), *messages("BEGIN", partitions=1, **COMMON)]:
        signed = ring.sign(msg)
        assert signed.key_id == "k-2026a" and len(signed.signature) == 64
        assert ring.verify(decode(_wire(signed))) is None
        assert decode(signed.encode()).model_copy(update={"key_id": None, "signature": None}) == msg


@pytest.mark.parametrize("change, why", [
    ({"attempt": 3}, "does not match its content"),
    ({"batch_id": "ledger_entries:scheduled__2026-01-03"}, "does not match its content"),  # replayed into another batch
    ({"partition": 1}, "does not match its content"),
    ({"totals": {"rows": 0, "checksum": "0"}}, "does not match its content"),
    ({"signature": None}, "unsigned"),
    ({"key_id": None, "signature": None}, "unsigned"),
    ({"key_id": "k-2026b"}, "does not match its content"),  # the right signature, claimed for the other key
    ({"key_id": "forger"}, "key id forger, which this sink's keyring (k-2026a, k-2026b) does not hold"),
])
def test_an_altered_unsigned_or_foreign_message_is_refused_with_its_reason(change, why):
    ring = Keyring.parse(f"{OLD},{NEW}", source="test")
    signed = ring.sign(messages("END", partitions=3, totals=TOTALS, **COMMON)[0])
    assert why in ring.verify(decode(_wire(signed, **change)))


def test_a_message_signed_with_another_secret_under_our_key_id_is_forged():
    forger = Keyring.parse("k-2026a:" + "f" * 64, source="test")
    msg = forger.sign(messages("ABORT", partitions=1, reason="forged", **COMMON)[0])
    assert "does not match its content: forged or altered" in Keyring.parse(OLD, source="test").verify(msg)


def test_rotation_without_downtime_signs_with_the_first_key_and_accepts_every_listed_one():
    before, during, after = (Keyring.parse(t, source="test") for t in (OLD, f"{NEW},{OLD}", NEW))
    msg = messages("BEGIN", partitions=1, **COMMON)[0]
    assert during.verify(before.sign(msg)) is None  # sinks on the new ring accept what the old orchestrator signed
    assert Keyring.parse(f"{OLD},{NEW}", source="test").verify(during.sign(msg)) is None  # and the reverse
    assert after.verify(during.sign(msg)) is None
    assert "does not hold" in after.verify(before.sign(msg))  # the old key, once retired


@pytest.mark.parametrize("text, why", [
    ("", "holds no control key"),
    (" , ", "holds no control key"),
    ("nokey", "entry 1 is not key_id:secret"),
    ("bad id:" + "x" * 40, "entry 1 is not key_id:secret"),
    ("k1:short-secret", "the secret of key k1 has 12 characters, at least 32"),
    (f"{OLD},{OLD}", "key id k-2026a appears twice"),
])
def test_a_bad_keyring_is_refused_without_showing_a_secret(text, why):
    with pytest.raises(KeyringError) as info:
        Keyring.parse(text, source="Airflow connection tidemark_control (its password)")
    assert why in str(info.value) and "Airflow connection tidemark_control" in str(info.value)
    assert "short-secret" not in str(info.value) and "a" * 32 not in str(info.value)


def test_the_keyring_from_the_environment_and_its_repr_show_key_ids_only():
    ring = Keyring.from_env({CONTROL_KEYS_ENV: f"{NEW},{OLD}"})
    assert ring.key_ids == ["k-2026b", "k-2026a"] and Keyring.parse(ring.text(), source="x") == ring
    assert repr(ring) == "Keyring(key ids ['k-2026b', 'k-2026a'], signing with k-2026b)" and "b" * 32 not in repr(ring)
    with pytest.raises(KeyringError, match=f"{CONTROL_KEYS_ENV} is not set"):
        Keyring.from_env({})

"""Per-record validation at the sink (tidemark.protocol.records): what may be staged, and why not."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from tidemark.protocol.columns import Column
from tidemark.protocol.records import RecordRules
from tidemark.protocol.spec import PipelineSpec
from tidemark.protocol.window import Bound, Window

UTC = timezone.utc
COLUMNS = [
    Column("id", "bigint", True),
    Column("amount", "numeric", True, 18, 2),
    Column("currency", "character", True, max_length=3),
    Column("memo", "text"),
    Column("booked_on", "date"),
    Column("updated_at", "timestamp with time zone", True),
]
WINDOW = Window(Bound(datetime(2026, 1, 1, tzinfo=UTC)), Bound(datetime(2026, 1, 2, tzinfo=UTC)))
GOOD = {"id": 42, "amount": 125.5, "currency": "EUR", "updated_at": "2026-01-01T12:00:00.000001Z"}


def _spec(**extra) -> PipelineSpec:
    return PipelineSpec(name="payments", table="core.payments", primary_key=["id"],
                        cursor={"kind": "timestamp", "column": "updated_at"}, safe_lag="PT0S",
                        target_table="dw.payments", **extra)


RULES = RecordRules(_spec(), COLUMNS)


def _raw(row: dict | str) -> bytes:
    return (row if isinstance(row, str) else json.dumps(row)).encode()


def check(row: dict | str | bytes, key: bytes | None = b"42", rules: RecordRules = RULES, window: Window = WINDOW):
    return rules.check(key, row if isinstance(row, bytes) else _raw(row), window)


def test_a_good_record_passes_and_exact_trailing_zeros_are_not_rounding():
    assert check(GOOD) is None
    assert check('{"id": 42, "amount": 125.5000, "currency": "EUR", "updated_at": "2026-01-01T12:00:00Z"}') is None
    assert check({**GOOD, "memo": None, "booked_on": "2026-01-01"}) is None  # a null optional column


@pytest.mark.parametrize(("row", "key", "reason"), [
    (b'{"id": 42, "memo": "\xff\xfe"}', b"42", "value is not valid UTF-8"),
    (GOOD, b"\xff", "key is not valid UTF-8"),
    ("[1, 2]", b"42", "value is a JSON list, not an object"),
    ("{not json", b"42", "value is not JSON"),
    ('{"id": 42, "id": 43}', b"42", "field 'id' appears twice in one object"),
    ({**GOOD, "amount": "NaN"}, b"42", "field 'amount': 'NaN' is not a number a financial column may hold"),
    ({**GOOD, "amount": "-Infinity"}, b"42", "'-Infinity' is not a number a financial column may hold"),
    ({**GOOD, "amount": "12.5"}, b"42", "field 'amount': \"12.5\" is not a JSON number"),
    ('{"id": 42, "amount": NaN, "currency": "EUR", "updated_at": "2026-01-01T12:00:00Z"}', b"42",
     "the literal NaN is not a JSON number"),
    ('{"id": 42, "amount": Infinity, "currency": "EUR", "updated_at": "2026-01-01T12:00:00Z"}', b"42",
     "the literal Infinity is not a JSON number"),
    ('{"id": 42, "amount": 1.123456789012345678901234567890, "currency": "EUR", '
     '"updated_at": "2026-01-01T12:00:00Z"}', b"42", "has more than 2 decimal place(s) and would be rounded"),
    ({**GOOD, "amount": 12345678901234567890}, b"42", "does not fit target numeric(18,2) (numeric field overflow)"),
    ({**GOOD, "updated_at": "10000-01-01T00:00:00Z"}, b"42", "is not an ISO-8601 timestamp"),
    ({**GOOD, "updated_at": "2026-01-01T12:00:00"}, b"42", "has no time zone"),
    ({**GOOD, "updated_at": "2026-01-01T12:00:00.1234567Z"}, b"42", "at most 6 fractional digits"),
    ({**GOOD, "updated_at": "2026-02-30T12:00:00Z"}, b"42", "is not a valid timestamp"),
    ({**GOOD, "currency": "EURO"}, b"42", "4 characters do not fit target character(3)"),
    ({**GOOD, "memo": "a\u0000b"}, b"42", "contains a NUL character"),
    ('{"id": 42, "amount": 1, "currency": "EUR", "memo": "\\ud800", "updated_at": "2026-01-01T12:00:00Z"}', b"42",
     "unpaired UTF-16 surrogate"),
    ({**GOOD, "id": "42"}, b"42", "field 'id': \"42\" is not a JSON integer"),
    ({**GOOD, "id": True}, b"42", "is not a JSON integer"),
    ({**GOOD, "id": 1 << 63}, b"42", "out of range for target bigint"),
    ({**GOOD, "booked_on": "2026-13-01"}, b"42", "is not a valid date"),
    ({**GOOD, "extra": 1}, b"42", "field 'extra' is not a column of target dw.payments"),
    ({k: v for k, v in GOOD.items() if k != "currency"}, b"42", "field 'currency' is missing or null"),
    (GOOD, b"43", "key '43' does not match the primary key in the value"),
    (GOOD, None, "record without a key"),
    ({**GOOD, "updated_at": "2026-01-02T00:00:00.000001Z"}, b"42", "outside the batch's window"),
    ({**GOOD, "updated_at": "2026-01-01T00:00:00Z"}, b"42", "outside the batch's window"),  # lo is exclusive
])
def test_a_bad_record_is_refused_with_a_reason_naming_the_field(row, key, reason):
    got = check(row if isinstance(row, (bytes, str)) else _raw(row), key)
    assert got is not None and reason in got, got


@pytest.mark.parametrize(("amount", "fits"), [
    ("9999999999999999.99", True), ("10000000000000000.00", False), ("10000000000000000", False),
    ("-9999999999999999.99", True), ("-10000000000000000", False), ("1E+15", True), ("1E+16", False),
    ("0.000", True), ("0E-30", True), ("12.340", True), ("12.345", False), ("1.99999999999999999999999999999", False),
])
def test_numeric_scale_and_range_are_decided_at_the_column_boundary(amount, fits):
    got = check(f'{{"id": 42, "amount": {amount}, "currency": "EUR", "updated_at": "2026-01-01T12:00:00Z"}}')
    assert (got is None) == fits, got


@pytest.mark.parametrize("key", [b"042", b"+42", b" 42"])
def test_a_key_spelled_otherwise_is_compared_as_its_typed_value(key):
    assert (check(GOOD, key) is None) == (key == b"042"), check(GOOD, key)


def test_deep_nesting_is_refused_without_crashing():
    deep = '{"id": 42, "memo": ' + "[" * 100_000 + "]" * 100_000 + "}"
    assert "nested deeper than 32 levels" in check(deep)
    assert "nested deeper than 32 levels" in check('{"id": 42, "memo": ' + "[" * 40 + "]" * 40 + "}")


def test_an_oversized_value_is_refused_before_parsing():
    rules = RecordRules(_spec(max_record_bytes=2048), COLUMNS)
    assert "exceeds max_record_bytes 2048" in check({**GOOD, "memo": "x" * 3000}, rules=rules)


def test_spec_policies_loosen_only_what_they_name():
    lax = RecordRules(_spec(unknown_fields="ignore", allow_non_finite_numbers=True, record_format="json"), COLUMNS)
    assert check({**GOOD, "extra": 1}, rules=lax) is None
    assert check({**GOOD, "amount": "NaN"}, rules=lax) is None  # PostgreSQL's numeric NaN, as a JSON string
    assert "is not a JSON number" in check({**GOOD, "amount": "12.5"}, rules=lax)  # other strings stay refused
    assert "literal NaN" in check('{"id": 42, "amount": NaN, "currency": "EUR", "updated_at": "2026-01-01T12:00:00Z"}',
                                  rules=lax)  # not JSON at all


def test_the_lower_bound_key_admits_greater_keys_at_the_same_cursor():
    at = datetime(2026, 1, 1, 12, tzinfo=UTC)
    window = Window(Bound(at, (41,)), Bound(datetime(2026, 1, 2, tzinfo=UTC)))
    row = {**GOOD, "updated_at": "2026-01-01T12:00:00Z"}
    assert check(row, window=window) is None
    assert "outside the batch's window" in check({**row, "id": 41}, key=b"41", window=window)


def test_a_window_capped_at_a_key_admits_keys_up_to_it_and_trusts_the_source_order_for_text_keys():
    at = datetime(2026, 1, 1, 12, tzinfo=UTC)
    window = Window(Bound(at, (10,)), Bound(at, (42,)))
    row = {**GOOD, "updated_at": "2026-01-01T12:00:00Z"}
    assert check(row, window=window) is None  # id 42: the last row of the capped window
    assert "outside the batch's window" in check({**row, "id": 43}, key=b"43", window=window)
    assert "outside the batch's window" in check({**row, "id": 10}, key=b"10", window=window)
    # text keys order by the column's collation, which Python cannot reproduce: the extract's
    # predicate (PostgreSQL's own comparison) decided, so the cursor alone is checked
    assert check(row, window=Window(Bound(at, ("b",)), Bound(at, ("c",)))) is None


def test_composite_and_timestamp_keys_compare_as_typed_values():
    columns = [Column("account_id", "bigint", True), Column("business_date", "date", True),
               Column("updated_at", "timestamp with time zone", True)]
    spec = PipelineSpec(name="balances", table="core.b", primary_key=["account_id", "business_date"],
                        cursor={"kind": "timestamp", "column": "updated_at"}, safe_lag="PT0S", target_table="dw.b")
    rules = RecordRules(spec, columns)
    row = {"account_id": 7, "business_date": "2026-01-01", "updated_at": "2026-01-01T12:00:00Z"}
    assert check(row, key=b'{"account_id":7,"business_date":"2026-01-01"}', rules=rules) is None
    assert "does not match" in check(row, key=b'{"account_id":8,"business_date":"2026-01-01"}', rules=rules)
    assert "is not the JSON object" in check(row, key=b'{"account_id":7}', rules=rules)

    ts_key = [Column("at", "timestamp with time zone", True), Column("updated_at", "timestamp with time zone", True)]
    spec = PipelineSpec(name="ticks", table="core.t", primary_key=["at"],
                        cursor={"kind": "timestamp", "column": "updated_at"}, safe_lag="PT0S", target_table="dw.t")
    row = {"at": "2026-01-01T10:00:00.500000Z", "updated_at": "2026-01-01T12:00:00Z"}
    assert check(row, key=b"2026-01-01 10:00:00.5", rules=RecordRules(spec, ts_key)) is None  # Spark's cast


def test_an_id_cursor_window_is_checked_on_ids():
    spec = PipelineSpec(name="ids", table="core.i", primary_key=["id"], cursor={"kind": "id", "column": "id"},
                        append_only=True, safe_lag="PT0S", target_table="dw.i")
    rules = RecordRules(spec, [Column("id", "bigint", True)])
    window = Window(Bound(10), Bound(20))
    assert check({"id": 11}, key=b"11", rules=rules, window=window) is None
    assert "outside the batch's window" in check({"id": 10}, key=b"10", rules=rules, window=window)
    assert "outside the batch's window" in check({"id": 21}, key=b"21", rules=rules, window=window)


def test_a_target_without_the_key_or_cursor_columns_is_a_lookup_error():
    with pytest.raises(LookupError, match="target table dw.payments does not exist"):
        RecordRules(_spec(), [])
    with pytest.raises(LookupError, match=r"has no column\(s\) \['updated_at'\]"):
        RecordRules(_spec(), COLUMNS[:2])


def test_an_event_is_keyed_by_its_key_field_and_needs_its_event_time_but_no_window():
    spec = _spec(sink={"mode": "standing"}, stream={"topic": "core.payment_events", "key": "currency",
                                                    "event_time": "updated_at", "target_table": "rt.payments",
                                                    "serving_view": "serving.payments"})
    events = RecordRules(spec, COLUMNS, events=True)
    late = {**GOOD, "updated_at": "2031-05-05T00:00:00Z"}  # far outside any batch window: events have none
    assert events.check(b"EUR", _raw(late), None) is None
    assert "does not match the key field currency" in events.check(b"USD", _raw(late), None)
    assert events.check(None, _raw(late), None) == "record without a key"
    no_time = {k: v for k, v in GOOD.items() if k != "updated_at"}
    assert "updated_at" in events.check(b"EUR", _raw(no_time), None)
    assert "not a column of target rt.payments" in events.check(b"EUR", _raw({**GOOD, "extra": 1}), None)
    assert "field 'id' is missing" in events.check(b"EUR", _raw({k: v for k, v in GOOD.items() if k != "id"}), None)


def test_an_event_whose_nullable_key_field_is_left_out_or_null_is_refused_whatever_its_kafka_key():
    """The Kafka key "None" once matched a missing key field's str(None) (a review helper found it)."""
    spec = _spec(sink={"mode": "standing"}, stream={"topic": "core.payment_events", "key": "memo",
                                                    "event_time": "updated_at", "target_table": "rt.payments",
                                                    "serving_view": "serving.payments"})
    events = RecordRules(spec, COLUMNS, events=True)
    for key in (b"None", b"null", b""):
        for value in (GOOD, {**GOOD, "memo": None}):
            assert events.check(key, _raw(value), None) == "the value has no key field memo (memo missing or null)"
    assert events.check(b"None", _raw({**GOOD, "memo": "None"}), None) is None


def test_event_rules_need_the_key_field_in_the_real_time_table():
    spec = _spec(sink={"mode": "standing"}, stream={"topic": "core.payment_events", "key": "account_id",
                                                    "event_time": "updated_at", "target_table": "rt.payments",
                                                    "serving_view": "serving.payments"})
    with pytest.raises(LookupError, match=r"rt.payments has no column\(s\) \['account_id'\]"):
        RecordRules(spec, COLUMNS, events=True)


def _micro_batch(rows: list[dict]):
    import pyarrow as pa

    names = ["topic", "partition", "offset", "key", "value", "control", "batch_id", "attempt"]
    types = [pa.string(), pa.int32(), pa.int64(), pa.binary(), pa.binary(), pa.string(), pa.string(), pa.int32()]
    return pa.RecordBatch.from_arrays([pa.array([r.get(n) for r in rows], t) for n, t in zip(names, types)],
                                      names=names)


def _mixed_micro_batch():
    data = {"topic": "t", "partition": 0, "control": None, "batch_id": "b", "attempt": 1}
    return _micro_batch([
        {**data, "offset": 0, "key": b"42", "value": _raw(GOOD)},
        {**data, "offset": 1, "key": b"42", "value": _raw({**GOOD, "amount": 1.005})},  # would round
        {**data, "offset": 2, "key": b"42", "value": b"{not json"},
        {**data, "offset": 3, "control": "END", "key": None, "value": b"{}"},  # control: the sink decodes it
        {**data, "offset": 4, "attempt": 2, "key": b"42", "value": _raw(GOOD)},  # attempt not open when made
        {**data, "offset": 5, "topic": "events", "batch_id": None, "attempt": None, "key": b"42",
         "value": _raw({**GOOD, "currency": "EURO"})},
    ])


def test_the_checker_finds_what_the_rules_find_and_leaves_what_it_cannot_check_to_the_sink():
    from tidemark.protocol.records import Checker

    checker = Checker("t", RULES, {("b", 1): WINDOW}, "events", RULES)
    out = next(checker([_mixed_micro_batch()])).to_pydict()
    assert out["checked"] == [True, True, True, False, False, True]
    assert out["reason"][0] is None and out["reason"][3] is None and out["reason"][4] is None
    assert out["reason"][1] == check({**GOOD, "amount": 1.005}) and "decimal place" in out["reason"][1]
    assert out["reason"][2] == check("{not json") and out["reason"][2].startswith("value is not JSON")
    assert out["reason"][5] == RULES.check(b"42", _raw({**GOOD, "currency": "EURO"}), None)
    assert "do not fit" in out["reason"][5]
    assert out["offset"] == [0, 1, 2, 3, 4, 5]  # the micro-batch passes through whole, in order


def test_the_checker_keeps_the_reasons_of_records_spark_checked_already():
    """Protocol version 2's records arrive checked (``tidemark.protocol.avro.decode``): the checker leaves them."""
    import pyarrow as pa

    from tidemark.protocol.records import Checker

    batch = _mixed_micro_batch()
    spark_checked = [False, True, False, False, False, False]
    batch = pa.RecordBatch.from_arrays(
        [*batch.columns, pa.array([None, "decoded elsewhere", None, None, None, None], pa.string()),
         pa.array(spark_checked)], names=[*batch.schema.names, "reason", "checked"])
    out = next(Checker("t", RULES, {("b", 1): WINDOW}, "events", RULES)([batch])).to_pydict()
    assert out["checked"] == [True, True, True, False, False, True]
    assert out["reason"][1] == "decoded elsewhere" and out["reason"][2].startswith("value is not JSON")
    assert list(out) == [*_mixed_micro_batch().schema.names, "reason", "checked"]


def test_the_checker_travels_to_a_python_without_tidemark_and_gives_the_same_reasons(tmp_path):
    """Spark's executors run it: the sink ships the module by value, as the extract ships its totals."""
    import importlib
    import subprocess
    import sys

    from pyspark import cloudpickle

    from tidemark.protocol.records import Checker
    from tidemark.sink.job import EXECUTOR_MODULES

    shipped = [importlib.import_module(name) for name in EXECUTOR_MODULES]  # as the sink's job ships them
    for module in shipped:
        cloudpickle.register_pickle_by_value(module)
    try:
        (tmp_path / "checker.pickle").write_bytes(cloudpickle.dumps(Checker("t", RULES, {("b", 1): WINDOW})))
    finally:
        for module in shipped:
            cloudpickle.unregister_pickle_by_value(module)
    import pyarrow as pa

    with pa.ipc.new_file(tmp_path / "in.arrow", _mixed_micro_batch().schema) as sink:
        sink.write_batch(_mixed_micro_batch())
    script = (
        "import pickle, sys, pyarrow as pa\n"
        "assert 'tidemark' not in sys.modules\n"
        "checker = pickle.load(open('checker.pickle', 'rb'))\n"
        "batch = pa.ipc.open_file('in.arrow').get_batch(0)\n"
        "print(next(checker([batch])).column('reason').to_pylist())\n"
        "import importlib.util; assert importlib.util.find_spec('tidemark') is None\n"
    )
    env = {"PATH": "/usr/bin:/bin"}  # no PYTHONPATH: Tidemark cannot be imported there
    done = subprocess.run([sys.executable, "-I", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    local = next(Checker("t", RULES, {("b", 1): WINDOW})([_mixed_micro_batch()])).column("reason").to_pylist()
    assert done.stdout.strip() == repr(local)


def test_payload_text_escapes_what_postgresql_text_cannot_hold_and_caps_only_when_asked():
    from tidemark.protocol.records import PAYLOAD_LIMIT, payload_text

    assert payload_text(None) is None
    assert payload_text(b"ok \xff\x00") == "ok \\xff\\x00"  # invalid UTF-8 escaped, NUL shown
    long = "x" * (PAYLOAD_LIMIT + 5)
    assert payload_text(long) == f"{'x' * PAYLOAD_LIMIT}... ({PAYLOAD_LIMIT + 5} characters in all)"
    assert payload_text(long, None) == long  # the only copy kept (a pending change event): whole

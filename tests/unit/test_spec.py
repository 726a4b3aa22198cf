"""Pipeline spec validation: good files load, each kind of bad file names its file and field."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from tidemark.protocol.spec import SpecError, load_spec, quote

GOOD = {
    "name": "ledger_entries",
    "table": "core.ledger_entries",
    "primary_key": ["entry_id"],
    "cursor": {"kind": "timestamp", "column": "updated_at"},
    "safe_lag": "PT5M",
    "target_table": "dw.ledger_entries",
    "write_mode": "upsert",
    "partitions": 3,
}


def _write(tmp_path: Path, fields: dict | str, name: str = "ledger_entries") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(fields if isinstance(fields, str) else yaml.safe_dump(fields))
    return path


def test_a_good_spec_loads_with_defaults(tmp_path):
    spec = load_spec(_write(tmp_path, GOOD))
    assert spec.safe_lag == timedelta(minutes=5)
    assert spec.schedule == "@daily" and spec.source_conn_id == "tidemark_source"
    assert spec.initial_watermark is None and spec.start.tzinfo is not None
    assert spec.unknown_fields == "reject" and spec.allow_non_finite_numbers is False and not spec.create_target_schema
    assert spec.topic == "tidemark.ledger_entries"
    assert (spec.retries.count, spec.retries.delay, spec.retries.max_delay) == (2, timedelta(seconds=30),
                                                                                timedelta(minutes=10))


STREAM = {"topic": "core.payment_events", "key": "account_id", "event_time": "updated_at",
          "target_table": "rt.ledger_entries", "serving_view": "serving.ledger_entries"}


def test_a_stream_is_declared_beside_the_table(tmp_path):
    spec = load_spec(_write(tmp_path, {**GOOD, "sink": {"mode": "standing"}, "stream": STREAM}))
    assert spec.stream.topic == "core.payment_events" and spec.stream.partitions == 3
    assert spec.stream.key == "account_id" and spec.stream.target_table == "rt.ledger_entries"


CDC = {"target_table": "rt.ledger_entries", "serving_view": "serving.ledger_entries"}


def test_change_data_capture_is_declared_beside_the_table_and_names_its_slot_and_topic(tmp_path):
    spec = load_spec(_write(tmp_path, {**GOOD, "sink": {"mode": "standing"},
                                       "cdc": {**CDC, "retained_wal_warning": "512MB", "heartbeat": "PT5S"}}))
    assert (spec.cdc.retained_wal_warning, spec.cdc.retained_wal_limit) == (512_000_000, 3 << 30)
    assert spec.cdc.heartbeat == timedelta(seconds=5)
    assert spec.cdc_slot == "tidemark_ledger_entries"
    assert spec.records_per_trigger == 20_000  # Debezium's records are big: a smaller micro-batch unless set
    assert load_spec(_write(tmp_path, {**GOOD, "sink": {"mode": "standing", "max_offsets_per_trigger": 50_000},
                                       "cdc": CDC})).records_per_trigger == 50_000
    assert spec.trigger == timedelta(milliseconds=500)  # a change waits for its micro-batch half a second at most
    assert load_spec(_write(tmp_path, {**GOOD, "sink": {"mode": "standing", "trigger": "PT3S"},
                                       "cdc": CDC})).trigger == timedelta(seconds=3)
    assert load_spec(_write(tmp_path, {**GOOD, "sink": {"mode": "standing"}})).trigger == timedelta(seconds=2)
    assert spec.cdc_topic == "tidemark.cdc.ledger_entries.core.ledger_entries"
    unqualified = load_spec(_write(tmp_path, {**GOOD, "table": "ledger", "sink": {"mode": "standing"}, "cdc": CDC}))
    assert unqualified.cdc_topic == "tidemark.cdc.ledger_entries.public.ledger"


def test_reconciliation_is_declared_in_the_spec(tmp_path):
    spec = load_spec(_write(tmp_path, _with(reconcile={
        "control_totals": [{"columns": ["amount"], "group_by": ["currency", "business_date"]}],
        "required": ["amount"], "accepted_values": {"currency": ["EUR", "USD"]},
        "double_entry": {"journal": "txn_id", "amount": "amount", "currency": "currency"},
        "tolerance": "0.01", "tolerance_reason": "the core system rounds interest per entry"})))
    assert spec.reconcile.control_totals[0].group_by == ["currency", "business_date"]
    assert str(spec.reconcile.tolerance) == "0.01" and spec.reconcile.double_entry.journal == "txn_id"
    assert load_spec(_write(tmp_path, GOOD)).reconcile.tolerance == 0  # zero tolerance unless a reason is given


def test_the_json_only_options_stand_where_json_records_are_checked(tmp_path):
    lax = {"unknown_fields": "ignore", "allow_non_finite_numbers": True}
    assert load_spec(_write(tmp_path, {**GOOD, **lax, "record_format": "json"})).unknown_fields == "ignore"
    streamed = load_spec(_write(tmp_path, {**GOOD, **lax, "sink": {"mode": "standing"}, "stream": STREAM}))
    assert streamed.record_format == "avro" and streamed.allow_non_finite_numbers  # for the stream's events


def test_two_pipelines_never_write_one_real_time_table(tmp_path):
    from tidemark.protocol.spec import load_specs

    _write(tmp_path, {**GOOD, "sink": {"mode": "standing"}, "stream": STREAM})
    _write(tmp_path, {**GOOD, "name": "other", "target_table": "dw.other", "sink": {"mode": "standing"},
                      "stream": {**STREAM, "serving_view": "serving.other"}}, name="other")
    valid, errors = load_specs(tmp_path)
    assert valid == [] and len(errors) == 2 and all("rt.ledger_entries is also written by" in str(e) for e in errors)


def _with(**changes) -> dict:
    fields = {**GOOD, **changes}
    return {k: v for k, v in fields.items() if v is not None}


INVALID = [
    ("missing table", _with(table=None), "field 'table'"),
    ("sql injection in table", _with(table="core.x; DROP TABLE y"), "field 'table'"),
    ("three-part table name", _with(table="a.b.c"), "field 'table'"),
    ("quote in key column", _with(primary_key=['id" OR 1=1 --']), "field 'primary_key.0'"),
    ("empty primary key", _with(primary_key=[]), "field 'primary_key'"),
    ("unknown cursor kind", _with(cursor={"kind": "lsn", "column": "x"}), "field 'cursor.kind'"),
    ("negative safe lag", _with(safe_lag="-PT5M"), "field 'safe_lag'"),
    ("bad schedule", _with(schedule="every night"), "field 'schedule'"),
    ("naive initial watermark", _with(initial_watermark="2026-01-01T00:00:00"), "field 'initial_watermark'"),
    ("unknown write mode", _with(write_mode="overwrite"), "field 'write_mode'"),
    ("zero partitions", _with(partitions=0), "field 'partitions'"),
    ("misspelt field", _with(partitons=3), "field 'partitons'"),
    ("id cursor outside key", _with(cursor={"kind": "id", "column": "seq"}), "an id cursor must be a primary-key column"),
    ("name not the file name", _with(name="other"), "must equal the file name"),
    ("upper-case name", _with(name="Ledger"), "field 'name'"),
    ("id cursor without append_only", _with(cursor={"kind": "id", "column": "entry_id"}),
     "declare append_only: true if the source table is never updated"),
    ("id cursor with a timestamp start", _with(cursor={"kind": "id", "column": "entry_id"}, append_only=True,
                                               initial_watermark="2026-01-01T00:00:00Z"), "not a timestamp"),
    ("timestamp cursor with an id start", _with(initial_watermark=5), "not an id"),
    ("unknown-field policy", _with(unknown_fields="keep"), "field 'unknown_fields'"),
    ("unknown fields ignored under version 2", _with(unknown_fields="ignore"), "applies only to JSON records"),
    ("NaN allowed under version 2", _with(allow_non_finite_numbers=True), "Set record_format: json"),
    ("direct transport under version 1", _with(transport="direct", record_format="json"), "set record_format: avro"),
    ("unknown transport", _with(transport="s3"), "field 'transport'"),
    ("tiny record limit", _with(max_record_bytes=10), "field 'max_record_bytes'"),
    ("zero max_hold", _with(max_hold="PT0S"), "field 'max_hold'"),
    ("negative retries", _with(retries={"count": -1}), "field 'retries.count'"),
    ("sub-second retry delay", _with(retries={"delay": "PT0.1S"}), "field 'retries.delay'"),
    ("stream without a standing sink", _with(stream=STREAM), "set sink.mode: standing"),
    ("stream on the pipeline's own topic", _with(stream={**STREAM, "topic": "tidemark.ledger_entries"},
                                                 sink={"mode": "standing"}), "Tidemark's own topic"),
    ("stream on the dead-letter topic", _with(stream={**STREAM, "topic": "tidemark.dlq"}, sink={"mode": "standing"}),
     "Tidemark's own topic"),
    ("stream into the batch target", _with(stream={**STREAM, "target_table": "dw.ledger_entries"},
                                           sink={"mode": "standing"}), "need a table of their own"),
    ("stream key not an identifier", _with(stream={**STREAM, "key": "a-b"}, sink={"mode": "standing"}),
     "field 'stream.key'"),
    ("serving view over its own table", _with(stream={**STREAM, "serving_view": "rt.ledger_entries"},
                                              sink={"mode": "standing"}), "one of the tables it merges"),
    ("stream without event time", _with(stream={k: v for k, v in STREAM.items() if k != "event_time"},
                                        sink={"mode": "standing"}), "field 'stream.event_time'"),
    ("cdc without a standing sink", _with(cdc=CDC), "cdc: changes are applied as they arrive, by a standing sink"),
    ("cdc and a stream", _with(cdc=CDC, stream=STREAM, sink={"mode": "standing"}), "one real-time input per pipeline"),
    ("cdc into the batch target", _with(cdc={**CDC, "target_table": "dw.ledger_entries"}, sink={"mode": "standing"}),
     "cdc.target_table: dw.ledger_entries is the batch target"),
    ("cdc view over its own table", _with(cdc={**CDC, "serving_view": "rt.ledger_entries"}, sink={"mode": "standing"}),
     "cdc.serving_view: rt.ledger_entries is one of the tables it merges"),
    ("cdc warning above its limit", _with(cdc={**CDC, "retained_wal_warning": "4GiB"}, sink={"mode": "standing"}),
     "retained_wal_warning (4.0GiB) must be below retained_wal_limit (3.0GiB)"),
    ("cdc size not a size", _with(cdc={**CDC, "retained_wal_limit": "lots"}, sink={"mode": "standing"}),
     "field 'cdc.retained_wal_limit'"),
    ("cdc slot name too long", _with(name="l" * 60, cdc=CDC, sink={"mode": "standing"}), "longer than PostgreSQL's 63"),
    ("cdc field unknown", _with(cdc={**CDC, "slot": "mine"}, sink={"mode": "standing"}), "field 'cdc.slot'"),
    ("cdc replacing windows", _with(cdc=CDC, sink={"mode": "standing"}, write_mode="append_window_replace"),
     "a CDC pipeline loads with write_mode: upsert"),
    ("stream on a cdc topic", _with(stream={**STREAM, "topic": "tidemark.cdc.x.public.t"}, sink={"mode": "standing"}),
     "is Tidemark's own topic"),
    ("tasks too small to repay their start", _with(sink={"max_records_per_task": 10}),
     "field 'sink.max_records_per_task'"),
    ("tolerance without a reason", _with(reconcile={"tolerance": "0.01"}), "needs tolerance_reason"),
    ("negative tolerance", _with(reconcile={"tolerance": "-1", "tolerance_reason": "rounding in the core system"}),
     "field 'reconcile.tolerance'"),
    ("control total without columns", _with(reconcile={"control_totals": [{"group_by": ["currency"]}]}),
     "field 'reconcile.control_totals.0.columns'"),
    ("injection in a reconciled column", _with(reconcile={"required": ["memo; DROP TABLE x"]}),
     "field 'reconcile.required.0'"),
]


@pytest.mark.parametrize("fields, expected", [(f, e) for _, f, e in INVALID], ids=[i[0] for i in INVALID])
def test_invalid_specs_name_the_file_and_field(tmp_path, fields, expected):
    path = _write(tmp_path, fields)
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert str(path) in str(err.value)
    assert expected in str(err.value)


@pytest.mark.parametrize("text, expected", [("name: [unclosed", "not valid YAML"), ("- a\n- b\n", "expected a mapping")])
def test_unreadable_files_are_reported(tmp_path, text, expected):
    with pytest.raises(SpecError, match=expected):
        load_spec(_write(tmp_path, text))


def test_quote_only_accepts_validated_identifiers():
    assert quote("core.ledger_entries") == '"core"."ledger_entries"'
    assert quote("Order") == '"Order"'
    with pytest.raises(SpecError):
        quote('x"; DROP TABLE y; --')


def test_a_key_in_a_message_is_its_value_or_a_tuple_of_its_columns():
    from tidemark.protocol.spec import key_text

    assert key_text((7,)) == "7" and key_text(("EUR",)) == "'EUR'"
    assert key_text((7, "a b")) == "(7, 'a b')"

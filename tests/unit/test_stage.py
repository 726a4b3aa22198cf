"""The executors' staging (``tidemark.batch.stage``), its pure parts: which records a task stages and which
it hands on, and the totals it reports. The COPY itself runs against the real warehouse in the
stack tests (test_protocol_v2, test_batch_faults, test_kill_trials)."""

import pyarrow as pa
import pytest

from tidemark.batch.stage import StageWriter, Target, _load_rows, _with_load, load_schema
from tidemark.protocol.totals import arrow_totals

ROW = pa.struct([("id", pa.int64()), ("amount", pa.decimal128(18, 2))])


def _micro_batch(rows: list[dict]) -> pa.RecordBatch:
    columns = {"topic": pa.string(), "partition": pa.int32(), "offset": pa.int64(), "key": pa.binary(),
               "value": pa.binary(), "control": pa.string(), "batch_id": pa.string(), "attempt": pa.int32(),
               "row_hash": pa.int64(), "row_v1": ROW, "reason": pa.string(), "checked": pa.bool_()}
    defaults = {"topic": "t", "key": b"1", "value": b"\x02", "control": None, "batch_id": "b", "attempt": 1,
                "row_hash": 7, "row_v1": {"id": 1, "amount": None}, "reason": None, "checked": True}
    full = [{**defaults, **r} for r in rows]
    return pa.RecordBatch.from_arrays([pa.array([r[c] for r in full], t) for c, t in columns.items()],
                                      names=list(columns))


def _writer(next_offsets=None) -> StageWriter:
    return StageWriter({"host": "127.0.0.1", "password": "s3cret"}, "t",
                       {("b", 1): Target('"tidemark_stage"."s_x"', "row_v1", ('"id"', '"amount"'), ("bigint", "numeric(18,2)"))},
                       next_offsets or {})


def test_a_task_stages_only_good_fresh_data_records_of_the_open_attempts_it_was_given():
    batch = _micro_batch([
        {"partition": 0, "offset": 10},  # staged
        {"partition": 0, "offset": 11, "reason": "key does not match"},  # rejected: to the driver
        {"partition": 0, "offset": 12, "control": "END", "checked": False},  # control message
        {"partition": 1, "offset": 3, "attempt": 2},  # an attempt the task was not given
        {"partition": 1, "offset": 4, "topic": "events"},  # another topic
        {"partition": 1, "offset": 5, "checked": False},  # not decoded (version 1)
        {"partition": 2, "offset": 1},  # below the stored offset: a replay, the driver skips it
        {"partition": 2, "offset": 2},  # staged
        {"partition": 3, "offset": 0, "batch_id": None, "attempt": None},  # no headers
    ])
    mine = _writer({2: 2})._stageable(batch)
    assert mine.to_pylist() == [True, False, False, False, False, False, False, True, False]


def test_nothing_is_staged_without_open_attempts_or_decoded_records():
    batch = _micro_batch([{"partition": 0, "offset": 0}])
    assert StageWriter({}, "t", {}, {})._stageable(batch) is None
    assert _writer()._stageable(batch.drop_columns(["reason", "checked"])) is None


def test_a_load_reports_per_partition_its_rows_checksum_and_first_and_last_offset():
    records = pa.Table.from_batches([_micro_batch([
        {"partition": 0, "offset": 10, "row_hash": -5}, {"partition": 0, "offset": 12, "row_hash": 2**62},
        {"partition": 1, "offset": 3, "row_hash": 9},
    ])])
    out = _load_rows(records, ("b", 1), 41, 0.25).to_pydict()
    totals = arrow_totals(records)
    assert out["partition"] == [0, 1] and out["offset"] == [12, 3] and out["load_first"] == [10, 3]
    assert out["load"] == [41, 41] and out["load_rows"] == [2, 1] and out["load_seconds"] == [0.25, 0.25]
    assert out["load_checksum"] == [str(totals[0]["checksum"]), str(totals[1]["checksum"])]
    assert int(out["load_checksum"][0]) == 2**62 - 5  # exact: a sum of 64-bit hashes, as text
    assert out["batch_id"] == ["b", "b"] and out["attempt"] == [1, 1] and out["topic"] == ["t", "t"]
    assert out["value"] == [None, None] and out["row_v1"] == [None, None]  # no record travels back


def test_records_handed_on_keep_their_columns_and_gain_null_load_fields():
    batch = _micro_batch([{"partition": 0, "offset": 1, "reason": "bad"}])
    out = _with_load(batch, None)
    assert out.schema.names == [*batch.schema.names, *load_schema().names]
    assert out.to_pydict()["value"] == [b"\x02"] and out.to_pydict()["load"] == [None]


@pytest.mark.parametrize("shown", [repr, str])
def test_the_writer_never_shows_the_password_it_carries(shown):
    assert "s3cret" not in shown(_writer())


def test_the_writer_travels_to_a_python_without_tidemark_and_chooses_the_same_records(tmp_path):
    """Spark's executors run it: the sink ships the module, ``tidemark.protocol.totals`` and ``tidemark.protocol.pgbinary`` by value."""
    import subprocess
    import sys

    from pyspark import cloudpickle

    import tidemark.batch.stage
    import tidemark.protocol.pgbinary
    import tidemark.protocol.totals

    for module in (tidemark.batch.stage, tidemark.protocol.totals, tidemark.protocol.pgbinary):
        cloudpickle.register_pickle_by_value(module)
    try:
        (tmp_path / "writer.pickle").write_bytes(cloudpickle.dumps(_writer({0: 1})))
    finally:
        for module in (tidemark.batch.stage, tidemark.protocol.totals, tidemark.protocol.pgbinary):
            cloudpickle.unregister_pickle_by_value(module)
    batch = _micro_batch([{"partition": 0, "offset": 0}, {"partition": 0, "offset": 1}])
    with pa.ipc.new_file(tmp_path / "in.arrow", batch.schema) as sink:
        sink.write_batch(batch)
    script = (
        "import pickle, sys, pyarrow as pa\n"
        "writer = pickle.load(open('writer.pickle', 'rb'))\n"
        "batch = pa.ipc.open_file('in.arrow').get_batch(0)\n"
        "print(writer._stageable(batch).to_pylist())\n"
        "import importlib.util; assert importlib.util.find_spec('tidemark') is None\n"
        "assert not any(m.startswith('tidemark') for m in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-I", "-c", script], cwd=tmp_path, env={"PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[False, True]"


def test_every_record_a_task_reads_is_either_handed_on_or_held_for_its_attempts_copy():
    """The split that nothing may fall through: what ``__call__`` yields (with the COPY replaced by
    a record of what it was given) accounts for every input record exactly once."""
    given: dict = {}

    class Recording(StageWriter):
        def _stage(self, held, schema):
            given.update({k: pa.Table.from_batches(v, schema=schema) for k, v in held.items()})
            yield from ()

    writer = Recording({}, "t", {("b", 1): Target("s", "row_v1", ('"id"', '"amount"'), ("bigint", "numeric(18,2)")),
                                 ("b", 2): Target("s2", "row_v1", ('"id"', '"amount"'), ("bigint", "numeric(18,2)"))}, {0: 1})
    batches = [_micro_batch([{"partition": 0, "offset": 0}, {"partition": 0, "offset": 1},
                             {"partition": 0, "offset": 2, "attempt": 2}, {"partition": 0, "offset": 3, "reason": "x"}]),
               _micro_batch([{"partition": 1, "offset": 7, "control": "END"}, {"partition": 1, "offset": 8}])]
    out = pa.Table.from_batches(list(writer(iter(batches))))
    assert out.column_names == [*batches[0].schema.names, *load_schema().names]
    handed = sorted(zip(out["partition"].to_pylist(), out["offset"].to_pylist()))
    assert handed == [(0, 0), (0, 3), (1, 7)]  # a replay, a rejected record, a control message
    assert {k: sorted(t["offset"].to_pylist()) for k, t in given.items()} == {("b", 1): [1, 8], ("b", 2): [2]}


class _Savepoints:
    """A cursor that only takes the savepoint statements the isolation issues, in order."""

    def __init__(self):
        self.statements: list[str] = []

    def execute(self, sql: str) -> None:
        self.statements.append(sql)


def _isolate(monkeypatch, n: int, bad: set[int], budget: int):
    """``_copy_isolating`` over ``n`` records with ids 0..n-1, where a COPY holding any id in ``bad``
    is refused as the stage's types would: (ids staged, [(ids refused, what)], COPYs tried)."""
    import tidemark.batch.stage as stage
    from tidemark.protocol.pgbinary import Unencodable

    copies = []

    def copy_binary(cur, table, arrays, types, columns):
        ids = arrays[0].to_pylist()
        copies.append(ids)
        if bad & set(ids):
            raise Unencodable(f'"currency": value too long for type character(3) ({sorted(bad & set(ids))})')

    monkeypatch.setattr(stage, "copy_binary", copy_binary)
    records = pa.Table.from_batches([_micro_batch([{"partition": 0, "offset": i, "row_v1": {"id": i, "amount": None}}
                                                   for i in range(n)])])
    target = Target('"tidemark_stage"."s_x"', "row_v1", ('"id"', '"amount"'), ("bigint", "numeric(18,2)"))
    staged, refused = stage._copy_isolating(_Savepoints(), target, records, 5, [budget])
    ids = lambda t: [r["id"] for r in t.column("row_v1").to_pylist()]  # noqa: E731
    return sorted(i for t in staged for i in ids(t)), [(ids(t), what) for t, (what, _) in refused], len(copies)


def test_a_refused_copy_is_halved_until_each_refused_record_stands_alone_and_the_rest_is_staged(monkeypatch):
    staged, refused, copies = _isolate(monkeypatch, 100, {17, 64}, budget=64)
    assert staged == [i for i in range(100) if i not in (17, 64)]
    assert refused == [([17], "this record"), ([64], "this record")]
    assert copies <= 2 * 2 * 7 + 1  # about two COPYs per halving per refused record


def test_a_copy_the_stage_takes_is_one_copy_and_refuses_nothing(monkeypatch):
    assert _isolate(monkeypatch, 50, set(), budget=64) == (list(range(50)), [], 1)


def test_past_its_budget_a_task_hands_back_what_is_left_whole_with_the_reason(monkeypatch):
    staged, refused, copies = _isolate(monkeypatch, 64, set(range(0, 64, 2)), budget=4)
    assert copies <= 2 * 4 + 1 and not set(staged) & set(range(0, 64, 2))  # each refused COPY tries two halves
    assert sorted(i for ids, _ in refused for i in ids) == sorted(set(range(64)) - set(staged))
    assert any(what.startswith("these ") and "not isolated further" in what for _, what in refused)

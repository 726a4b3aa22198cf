"""Change data capture's writer against the real warehouse, fed Debezium's records as the standing sink
hands them over, micro-batch by micro-batch, in the orders the two topics can deliver them in.

A transaction whole in one micro-batch applies straight from the records; one cut by a micro-batch's
end applies with the next, its first events from ``cdc_pending``, in commit order before those after it,
and so does one whose END comes before its events; a
transaction delivered again, whole or an event twice, changes nothing and is counted; a transaction
with an unreadable event is a dead letter whole; a record the Connect worker did not sign (unsigned,
altered, signed for another topic or with a key not ours) is a dead letter alone. (`test_cdc_apply`
runs the same writer inside the Spark sink with Debezium itself.)
"""

from __future__ import annotations

import json
import uuid
from itertools import count

import psycopg2
import pyarrow as pa
import pytest

from tidemark import ledger
from tidemark.realtime.cdc.apply import ChangeWriter
from tidemark.realtime.cdc.signing import Verifier
from tidemark.realtime.cdc.tables import widen_columns
from tidemark.sink.report import MicroBatchReport
from tidemark.streams.cycle import prepare_stream_tables
from tidemark_workshop.settings import Settings
from tidemark_workshop.stack.cdcrun import captured, make_cdc_pipeline, signature

FIELDS = [{"type": "int64", "field": "id"}, {"type": "string", "field": "amount"},
          {"type": "string", "field": "currency"},
          {"type": "string", "name": "io.debezium.time.ZonedTimestamp", "field": "updated_at"}]
SCHEMA = {"type": "struct", "fields": [{"type": "struct", "field": side, "fields": FIELDS} for side in ("before", "after")]}
OFFSETS = count()


class Source:
    """Debezium's records of source transactions, numbered as PostgreSQL numbers them."""

    def __init__(self, spec):
        self.data, self.tx = spec.cdc_topic, spec.cdc_transaction_topic
        self.txid, self.lsn = 5000, 1 << 32
        self.last_end = None  # the commit before the next transaction (Debezium's source.sequence)

    def transaction(self, *changes: tuple[str, int, str]) -> tuple[list[dict], dict]:
        """(op, id, amount) each: the change events, and the END."""
        self.txid += 1
        events = []
        for order, (op, key, amount) in enumerate(changes, start=1):
            self.lsn += 100
            row = {"id": key, "amount": amount, "currency": "EUR", "updated_at": "2026-11-26T01:02:03Z"}
            payload = {"op": op, "before": row if op == "d" else None, "after": None if op == "d" else row,
                       "source": {"txId": self.txid, "lsn": self.lsn, "ts_ms": 1795658635089,
                                  "sequence": json.dumps([self.last_end and str(self.last_end), str(self.lsn)])},
                       "transaction": {"id": f"{self.txid}:{self.lsn}", "total_order": order}}
            events.append(_record(self.data, {"schema": SCHEMA, "payload": payload}))
        self.lsn += 100
        end = {"status": "END", "id": f"{self.txid}:{self.lsn}", "event_count": len(changes)}
        self.last_end = self.lsn
        return events, _record(self.tx, {"schema": {}, "payload": end})


def _record(topic: str, doc: dict) -> dict:
    """As the Connect worker writes it: signed (tidemark.realtime.cdc.signing) with the stack keyring's key."""
    value = json.dumps(doc).encode()
    return {"topic": topic, "partition": 0, "offset": next(OFFSETS), "key": None, "value": value,
            "signature": signature(Settings.from_env(), topic, value)}


@pytest.fixture
def writer(settings, tmp_path):
    pipe = make_cdc_pipeline(settings, tmp_path)
    wh = pipe.wh()
    with wh, wh.cursor() as cur:
        ledger.ensure_control_schema(cur)
    prepare_stream_tables(pipe.spec, wh, pipe.src)
    consumer = f"it-writer-{uuid.uuid4().hex[:8]}"
    try:
        yield pipe, ChangeWriter(captured(pipe.spec), consumer, Verifier(settings.control_keyring())), wh, consumer
    finally:
        with wh, wh.cursor() as cur:
            for table in ("cdc_pending", "cdc_transactions", "cdc_positions", "cdc_resolved"):
                cur.execute(f"DELETE FROM tidemark_control.{table} WHERE consumer = %s", (consumer,))
        wh.close()


def _micro_batch(writer_, wh, records: list[dict], number: int) -> tuple[MicroBatchReport, list[str]]:
    report, rejected = MicroBatchReport(), []
    with wh, wh.cursor() as cur:
        writer_.apply(cur, pa.Table.from_pylist(records), 1, number, report,
                      lambda rec, reason: rejected.append(reason))
    return report, rejected


def test_transactions_apply_in_commit_order_whole_once_however_the_topics_deliver_them(writer):
    pipe, changes, wh, consumer = writer
    spec, source = pipe.spec, Source(pipe.spec)
    live = spec.cdc.target_table

    def state() -> tuple:
        rows = pipe.query_wh(f"SELECT id, amount::text, _tm_deleted FROM {live} ORDER BY id")
        waiting = pipe.query_wh("SELECT (SELECT count(*) FROM tidemark_control.cdc_pending WHERE consumer = %(c)s), "
                                "(SELECT count(*) FROM tidemark_control.cdc_transactions WHERE consumer = %(c)s)",
                                {"c": consumer})[0]
        position = pipe.query_wh("SELECT txid FROM tidemark_control.cdc_positions WHERE consumer = %s", (consumer,))
        return rows, waiting, position[0][0] if position else None

    # two transactions whole in one micro-batch: applied from the records, nothing waits
    t1, end1 = source.transaction(("c", 1, "1.00"), ("c", 2, "2.00"))
    t2, end2 = source.transaction(("u", 1, "1.50"), ("d", 2, "2.00"))
    report, rejected = _micro_batch(changes, wh, [*t1, *t2, end1, end2], 1)
    assert (report.events, report.duplicates, rejected) == (4, 0, [])
    assert state() == ([(1, "1.50", False), (2, "2.00", True)], (0, 0), source.txid)
    assert pipe.query_wh("SELECT key, txid FROM tidemark_control.cdc_deletions WHERE pipeline = %s",
                         (spec.name,)) == [(["2"], source.txid)]

    # a transaction cut by the micro-batch's end (the topics interleave): its first event waits; the next
    # micro-batch brings the rest (and that first one again) with its END: it applies whole, first, then
    # the one after it
    t3, end3 = source.transaction(("c", 3, "3.00"), ("c", 4, "4.00"))
    report, _ = _micro_batch(changes, wh, t3[:1], 2)
    assert report.events == 0 and state()[1:] == ((1, 0), source.txid - 1)
    t4, end4 = source.transaction(("u", 3, "3.30"))
    report, rejected = _micro_batch(changes, wh, [*t3, end3, *t4, end4], 3)
    assert (report.events, report.duplicates, rejected) == (3, 1, [])
    assert state() == ([(1, "1.50", False), (2, "2.00", True), (3, "3.30", False), (4, "4.00", False)], (0, 0),
                       source.txid)

    # delivered again (a crash of Debezium's worker before it stored its offsets), whole and an event twice
    t5, end5 = source.transaction(("c", 5, "5.00"))
    report, rejected = _micro_batch(changes, wh, [*t1, *t2, end1, end2, *t3, end3, *t5, *t5, end5], 4)
    assert (report.events, report.duplicates, rejected) == (1, 4 + 2 + 1, [])
    assert state()[0][-1] == (5, "5.00", False) and state()[1:] == ((0, 0), source.txid)

    # an event that cannot be read: its transaction a dead letter whole (its good event too); the next applies
    t6, end6 = source.transaction(("c", 6, "6.00"), ("c", 7, "not a number"))
    bad = json.loads(t6[1]["value"])
    del bad["payload"]["after"]
    t6[1] = {**_record(source.data, bad), "offset": t6[1]["offset"]}  # as the worker wrote it: signed
    t7, end7 = source.transaction(("c", 8, "8.00"))
    report, rejected = _micro_batch(changes, wh, [*t6, end6, *t7, end7], 5)
    assert report.events == 1 and len(rejected) == 2 and all("cannot be applied" in r for r in rejected), rejected
    rows, waiting, position = state()
    assert [r[0] for r in rows] == [1, 2, 3, 4, 5, 8] and waiting == (0, 0) and position == source.txid

    # an END before its events (the transaction topic ahead of the changes): it waits; its events apply it
    t8, end8 = source.transaction(("c", 9, "9.00"))
    report, _ = _micro_batch(changes, wh, [end8], 6)
    assert report.events == 0 and state()[1:] == ((0, 1), source.txid - 1)
    report, rejected = _micro_batch(changes, wh, t8, 7)
    assert (report.events, rejected) == (1, []) and state()[1:] == ((0, 0), source.txid)
    assert state()[0][-1] == (9, "9.00", False)

    # records the Connect worker did not sign (anyone with produce rights may write to the topic): each a dead
    # letter alone, before it is read; the genuine transaction of the same place still applies
    t9, end9 = source.transaction(("u", 9, "9.90"))
    genuine = t9[0]
    key_id = genuine["signature"].partition(":")[0]
    forged = [{**genuine, "signature": None},
              {**genuine, "value": genuine["value"].replace(b'"9.90"', b'"9999.99"')},  # altered, signature kept
              {**genuine, "signature": _record("tidemark.cdc.another", json.loads(genuine["value"]))["signature"]},
              {**genuine, "signature": "not-ours:" + genuine["signature"].partition(":")[2]}]
    report, rejected = _micro_batch(changes, wh, [*forged, *t9, end9], 8)
    assert report.events == 1 and len(rejected) == 4, rejected
    assert all(r.startswith("change record rejected: ") for r in rejected), rejected
    assert ["no tidemark.signature header" in rejected[0], "does not match" in rejected[1],
            "does not match" in rejected[2], "not-ours" in rejected[3] and key_id in rejected[3]] == [True] * 4
    assert state()[0][-1] == (9, "9.90", False) and state()[1:] == ((0, 0), source.txid)

    # a genuine event produced again alone, after its transaction applied: a duplicate, waiting for nothing
    report, rejected = _micro_batch(changes, wh, t8[:1], 9)
    assert (report.events, report.duplicates, rejected) == (0, 1, []) and state()[1:] == ((0, 0), source.txid)
    # a transaction whose END never comes (lost, or refused as forged) while a later one applies: its events
    # are dead letters with the reason, never counted as duplicates
    lost, _ = source.transaction(("c", 10, "10.00"))
    later, end_later = source.transaction(("c", 11, "11.00"))
    report, rejected = _micro_batch(changes, wh, [*lost, *later, end_later], 10)
    assert (report.events, report.duplicates) == (1, 0) and len(rejected) == 1, rejected
    assert "its END never arrived" in rejected[0], rejected
    rows, waiting, position = state()
    assert 10 not in [r[0] for r in rows] and 11 in [r[0] for r in rows] and waiting == (0, 0)


def test_a_widened_column_keeps_the_serving_view_and_its_grants_and_another_view_on_the_table_refuses_it(writer):
    """What the next batch does to its target, and the writer to the real-time table, when the source
    widened a column (``tables.widen_columns``): the serving view, which reads both, is made again with
    its grants; a view of someone else's on the target makes PostgreSQL refuse, and nothing changes."""
    pipe, _, wh, _ = writer
    spec = pipe.spec
    view, live, batch = spec.cdc.serving_view, spec.cdc.target_table, spec.target_table
    pipe.query_wh(f"INSERT INTO {batch} (id, amount, currency, updated_at) VALUES (1, 1.50, 'EUR', now())")
    pipe.query_wh(f"GRANT SELECT ON {view} TO PUBLIC")

    def amount_types() -> list[tuple]:
        return pipe.query_wh("SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attname = 'amount' "
                             "AND attrelid IN (%s::regclass, %s::regclass) ORDER BY attrelid", (batch, live))

    with wh, wh.cursor() as cur:
        widen_columns(cur, spec, batch, {"amount": "numeric(22,2)"})
        widen_columns(cur, spec, live, {"amount": "numeric(22,2)"})
    assert amount_types() == [("numeric(22,2)",), ("numeric(22,2)",)]
    assert pipe.query_wh(f"SELECT id, amount::text FROM {view}") == [(1, "1.50")]
    assert pipe.query_wh("SELECT has_table_privilege('public', %s, 'SELECT')", (view,)) == [(True,)]

    theirs = f"{batch}_theirs"
    pipe.query_wh(f"CREATE VIEW {theirs} AS SELECT id, amount FROM {batch}")
    try:
        with pytest.raises(psycopg2.Error, match="_theirs"):
            with wh, wh.cursor() as cur:
                widen_columns(cur, spec, batch, {"amount": "numeric(30,2)"})
        assert amount_types() == [("numeric(22,2)",), ("numeric(22,2)",)]
        assert pipe.query_wh(f"SELECT id FROM {view}") == [(1,)]  # the transaction rolled back whole
    finally:
        pipe.query_wh(f"DROP VIEW {theirs}")


def test_what_waits_in_cdc_pending_is_bounded_and_the_oldest_waiting_transaction_is_a_dead_letter(writer, settings):
    """A transaction whose END (or the rest of its events) never comes must not make ``cdc_pending`` grow
    without bound: past ``cdc.max_pending_events`` the oldest waiting transaction goes to the dead-letter
    topic whole, with the reason, and the ones after it still apply."""
    pipe, _, wh, consumer = writer
    limited = pipe.with_fields(cdc={**json.loads(pipe.path.read_text())["cdc"], "max_pending_events": 3})
    changes = ChangeWriter(captured(limited.spec), consumer, Verifier(settings.control_keyring()))
    source = Source(limited.spec)
    stuck, _ = source.transaction(("c", 1, "1.00"), ("c", 2, "2.00"))  # its END never comes
    report, rejected = _micro_batch(changes, wh, stuck, 1)
    assert rejected == [] and report.events == 0
    after, end_after = source.transaction(("c", 3, "3.00"), ("c", 4, "4.00"))
    report, rejected = _micro_batch(changes, wh, after, 2)  # 4 would wait: the oldest transaction goes
    assert len(rejected) == 2 and all("past cdc.max_pending_events 3" in r for r in rejected), rejected
    assert pipe.query_wh("SELECT count(*) FROM tidemark_control.cdc_pending WHERE consumer = %s", (consumer,)) == [(2,)]
    report, rejected = _micro_batch(changes, wh, [end_after], 3)
    assert (report.events, rejected) == (2, [])
    assert [r[0] for r in pipe.query_wh(f"SELECT id FROM {limited.spec.cdc.target_table} ORDER BY id")] == [3, 4]

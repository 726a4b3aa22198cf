"""Issue 52: which batches read their snapshot's rows above the window's end, one rule for every
reader of it (the extract, the sink's checks in either format, the reconciliation), and the snapshot
every partition imports."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest

from tidemark.batch import steps
from tidemark.batch.extract import snapshot
from tidemark.ledger import LedgerBatch
from tidemark.protocol.spec import PipelineSpec
from tidemark.protocol.window import TOP, Bound, Window

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
WINDOW = Window(Bound(T0), Bound(T0 + timedelta(hours=1)))


def _spec(**extra) -> PipelineSpec:
    return PipelineSpec.model_validate({"name": "p", "table": "public.t", "primary_key": ["id"], "partitions": 1,
                                        "cursor": {"kind": "timestamp", "column": "updated_at"},
                                        "target_table": "public.t_tgt", "safe_lag": "PT2S", **extra})


def test_a_scheduled_window_of_an_upsert_pipeline_reads_above_its_end():
    assert steps.reads_above(_spec(), WINDOW, WINDOW, handoff=False)


@pytest.mark.parametrize("why, spec, window, whole, handoff", [
    ("append rows never move", _spec(write_mode="append_window_replace"), WINDOW, WINDOW, False),
    ("append only", _spec(append_only=True), WINDOW, WINDOW, False),
    ("a backfill loads exactly its interval", _spec(), Window(WINDOW.lo, WINDOW.hi, backfill=True),
     Window(WINDOW.lo, WINDOW.hi, backfill=True), False),
    ("capped: the next batch goes on from its end", _spec(), Window(WINDOW.lo, Bound(T0, (7,))), WINDOW, False),
    ("a handoff reads above anyway", _spec(), WINDOW, WINDOW, True),
])
def test_batches_that_do_not_read_above(why, spec, window, whole, handoff):
    assert not steps.reads_above(spec, window, whole, handoff), why


def test_the_records_window_is_one_rule_for_the_extract_and_the_sink():
    plain = LedgerBatch("b", "p", WINDOW)
    assert plain.records_window == WINDOW
    for marked in (LedgerBatch("b", "p", WINDOW, reads_above=True), LedgerBatch("b", "p", WINDOW, handoff=True)):
        assert marked.records_window == Window(WINDOW.lo, Bound(TOP["timestamp"]))
        assert marked.records_window.holds_cursors(T0 + timedelta(days=3), T0 + timedelta(days=300))
        assert not marked.records_window.holds_cursors(T0 - timedelta(seconds=1), T0)  # never below lo
    plan = steps.Plan("b", WINDOW, False, reads_above=True)
    assert plan.read_window == Window(WINDOW.lo, Bound(TOP["timestamp"])) and plan.window == WINDOW
    assert steps.Plan.from_xcom(plan.to_xcom()) == plan
    assert steps.Plan.from_xcom({**plan.to_xcom(), "reads_above": None}).read_window == WINDOW


def test_every_read_imports_the_snapshot_inside_a_transaction_block():
    init = snapshot.snapshot_init("00000003-0000001B-1")
    assert init.startswith("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY; SET TRANSACTION SNAPSHOT")
    assert init.endswith("SAVEPOINT tidemark_snapshot")
    with pytest.raises(snapshot.SnapshotError, match="not an exported snapshot's name"):
        snapshot.snapshot_init("x'; DROP TABLE t; --")


def test_the_watchdog_stops_the_read_past_the_limit_and_says_what_to_change():
    stopped = []
    with snapshot.Watchdog(timedelta(milliseconds=50), lambda: stopped.append(True)) as dog:
        time.sleep(0.3)
    assert dog.fired and stopped == [True]
    text = str(dog.error("pipeline=p batch=b attempt=1", "p"))
    assert "max_snapshot_hold 0:00:00.050000" in text and "Next: give the extract more time (max_snapshot_hold" in text
    with snapshot.Watchdog(timedelta(seconds=5), lambda: stopped.append(True)) as quiet:
        pass
    assert not quiet.fired and stopped == [True]

"""The ledger's one state machine, on the real warehouse: every move guarded, nothing leaves a final state."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

import psycopg2
import pytest

from tidemark import ledger
from tidemark.protocol.control import PartitionTotals
from tidemark.protocol.spec import PipelineSpec
from tidemark.protocol.window import Bound, Window
from tidemark_workshop.settings import WAREHOUSE_DB

UTC = timezone.utc
WINDOW = Window(Bound(datetime(2026, 1, 1, tzinfo=UTC)), Bound(datetime(2026, 1, 2, tzinfo=UTC)))


@pytest.fixture()
def wh(settings):
    conn = psycopg2.connect(settings.dsn(WAREHOUSE_DB))
    with conn, conn.cursor() as cur:
        ledger.ensure_control_schema(cur)
    yield conn
    conn.close()


def _planned(cur) -> str:
    name = f"it_{uuid.uuid4().hex[:10]}"
    spec = PipelineSpec(name=name, table="public.x", primary_key=["id"], safe_lag="PT0S", target_table="public.y",
                        cursor={"kind": "timestamp", "column": "updated_at"}, partitions=1)
    return ledger.record_plan(cur, spec, f"{name}:run", "run", WINDOW).batch_id


def _states(cur, batch_id: str) -> tuple[str, dict[int, str]]:
    cur.execute("SELECT state FROM tidemark_control.batches WHERE batch_id = %s", (batch_id,))
    batch_state = cur.fetchone()[0]
    cur.execute("SELECT attempt, state FROM tidemark_control.batch_attempts WHERE batch_id = %s", (batch_id,))
    return batch_state, dict(cur.fetchall())


def test_a_new_attempt_supersedes_older_ones_and_seal_commit_follow_the_arrows(wh):
    with wh, wh.cursor() as cur:
        batch_id = _planned(cur)
        assert _states(cur, batch_id) == ("planned", {})
        first = ledger.open_attempt(cur, batch_id)
        second = ledger.open_attempt(cur, batch_id)
        assert _states(cur, batch_id) == ("open", {first: "superseded", second: "open"})
        assert not ledger.transition(cur, batch_id, first, "committed")  # a superseded attempt never commits
        ledger.seal_attempt(cur, batch_id, second, {0: PartitionTotals(rows=3, checksum=-(1 << 70))})
        assert _states(cur, batch_id) == ("sealed", {first: "superseded", second: "sealed"})
        assert ledger.transition(cur, batch_id, second, "committed", rows=3, checksum=-(1 << 70))
        assert _states(cur, batch_id) == ("committed", {first: "superseded", second: "committed"})
        assert ledger.batch_summary(cur, batch_id)["checksum"] == str(-(1 << 70))


@pytest.mark.parametrize("to", sorted(ledger.MOVES))
def test_nothing_leaves_committed(wh, to):
    with wh, wh.cursor() as cur:
        batch_id = _planned(cur)
        attempt = ledger.open_attempt(cur, batch_id)
        assert not ledger.transition(cur, batch_id, attempt, "committed", rows=0, checksum=0)  # open: not sealed
        ledger.seal_attempt(cur, batch_id, attempt, {0: PartitionTotals(rows=0, checksum=0)})
        assert ledger.transition(cur, batch_id, attempt, "committed", rows=0, checksum=0)
        assert not ledger.transition(cur, batch_id, attempt, to)
        with pytest.raises(ledger.AlreadyCommitted, match="never reopened"):
            ledger.open_attempt(cur, batch_id)
        assert ledger.abort_unfinished(cur, batch_id, "teardown") is None
        assert _states(cur, batch_id) == ("committed", {attempt: "committed"})


def test_a_refused_or_aborted_attempt_stays_so_and_a_new_attempt_reopens_the_batch(wh):
    with wh, wh.cursor() as cur:
        batch_id = _planned(cur)
        first = ledger.open_attempt(cur, batch_id)
        assert ledger.transition(cur, batch_id, first, "refused", message="count mismatch")
        assert not ledger.transition(cur, batch_id, first, "committed")
        assert _states(cur, batch_id) == ("refused", {first: "refused"})
        second = ledger.open_attempt(cur, batch_id)
        assert ledger.abort_unfinished(cur, batch_id, "worker killed") == second
        assert not ledger.transition(cur, batch_id, second, "sealed")
        assert _states(cur, batch_id) == ("aborted", {first: "refused", second: "aborted"})
        with pytest.raises(ValueError, match="no transition to 'open'"):
            ledger.transition(cur, batch_id, second, "open")


def test_a_current_control_schema_is_left_unlocked(wh):
    """Every plan and sink start ensures the schema: when it is current that must lock no control
    table (its ALTERs took ACCESS EXCLUSIVE locks and deadlocked with a committing sink)."""
    with wh, wh.cursor() as cur:
        ledger.ensure_control_schema(cur)
        cur.execute("""SELECT relation::regclass::text, mode FROM pg_locks
                        WHERE pid = pg_backend_pid() AND locktype = 'relation'
                          AND relation::regclass::text LIKE 'tidemark_control.%'""")
        assert cur.fetchall() == []


def test_a_refusals_first_reasons_name_each_records_partition_offset_and_key(wh):
    """Issue 53, item 6: the refused batch's line names the first refused records, not only their reasons."""
    with wh, wh.cursor() as cur:
        batch_id = _planned(cur)
        ledger.record_rejects(cur, "it-consumer", "tidemark.it", [
            {"partition": 1, "offset": 7, "batch_id": batch_id, "attempt": 1, "payload": "{}", "raw": b"{}",
             "raw_key": b"acct-42", "reason": "updated_at 2026-01-03 lies outside the batch's window"},
            {"partition": 0, "offset": 12, "batch_id": batch_id, "attempt": 1, "payload": "{}", "raw": b"{}",
             "raw_key": None, "reason": "field amount: not a number"},
            {"partition": 0, "offset": 3, "batch_id": batch_id, "attempt": 1, "payload": "{}", "raw": b"{}",
             "raw_key": b"\x00\xff", "reason": "field id: null"}])
        count, first = ledger.data_rejects(cur, "it-consumer", batch_id, 1, 2)
    assert count == 3
    assert first == ["partition 0 offset 3 key \\000\\377: field id: null",
                     "partition 0 offset 12 key (none): field amount: not a number"], first

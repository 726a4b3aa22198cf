"""Reconciliation of a committed batch (real PostgreSQL; the batch itself loaded by real Spark and Kafka).

Each fault is injected into the target of an otherwise clean committed batch, inside a transaction
that the test rolls back: the reconciliation must fail exactly the checks the fault breaks and
localise it to exactly the rows involved. The evidence table takes the results and refuses to
change them.
"""

from __future__ import annotations

import datetime
import json
import uuid
from decimal import Decimal

import psycopg2
import pytest

from tidemark import ledger, reconcile
from tidemark.protocol.spec import load_spec
from tidemark.protocol.window import Window
from tidemark_workshop.stack.batchrun import make_pipeline

LEDGER_DDL = """
CREATE TABLE {table} (
    entry_id    bigint PRIMARY KEY,
    txn_id      uuid NOT NULL,
    amount      numeric(18,2) NOT NULL,
    currency    char(3) NOT NULL,
    memo        text,
    created_at  timestamptz NOT NULL DEFAULT now()
)"""
ROWS = 3000
RECONCILE = {"control_totals": [{"columns": ["amount"], "group_by": ["currency"]}], "required": ["memo"],
             "accepted_values": {"currency": ["EUR", "USD"]},
             "double_entry": {"journal": "txn_id", "amount": "amount", "currency": "currency"}}


@pytest.fixture(scope="module")
def loaded(settings, tmp_path_factory):
    """A committed batch of ROWS journal entries: pairs (2k-1, 2k) of one journal, +x and -x."""
    pipe = make_pipeline(settings, tmp_path_factory.mktemp("reconcile"), LEDGER_DDL,
                         primary_key=["entry_id"], cursor={"kind": "timestamp", "column": "created_at"},
                         write_mode="append_window_replace",
                         reconcile=RECONCILE)
    src = pipe.src()
    with src, src.cursor() as cur:
        cur.execute(f"""INSERT INTO {pipe.source_table} (entry_id, txn_id, amount, currency, memo)
                        SELECT g, md5(((g + 1) / 2)::text)::uuid,
                               CASE WHEN g %% 2 = 1 THEN 1 ELSE -1 END * (((g + 1) / 2) %% 97 + 0.37),
                               CASE WHEN ((g + 1) / 2) %% 3 = 0 THEN 'USD' ELSE 'EUR' END, 'entry ' || g
                          FROM generate_series(1, %s) g""", (ROWS,))
    src.close()
    plan, attempt = pipe.run("run-1")
    return pipe, plan, attempt


def _reconcile(pipe, window: Window, fault: list[str] | None = None, **kwargs) -> reconcile.Verdict:
    """Reconcile with ``fault`` applied to the target in a transaction that is rolled back after."""
    src, wh = pipe.src(), pipe.wh()
    try:
        with src.cursor() as s, wh.cursor() as t:
            for statement in fault or []:
                t.execute(statement.format(target=pipe.spec.target_table))
            return reconcile.reconcile(pipe.spec, window, s, t, **kwargs)
    finally:
        src.rollback()
        wh.rollback()
        src.close()
        wh.close()


def _failed(verdict: reconcile.Verdict) -> set[str]:
    return {c.check.split(" ")[0] for c in verdict.checks if not c.passed}


def _diffs(verdict: reconcile.Verdict) -> list[tuple]:
    return [(d.key[0], d.kind, tuple(d.columns)) for d in verdict.differences]


def test_a_clean_batch_passes_every_check(loaded):
    pipe, plan, _ = loaded
    verdict = _reconcile(pipe, plan.window)
    assert verdict.passed, [c for c in verdict.checks if not c.passed]
    assert verdict.rows_source == verdict.rows_target == ROWS and verdict.differences == []
    checks = {c.check for c in verdict.checks}
    assert {"unique_keys", "row_count", "hash_total", "control_total amount by currency", "double_entry"} <= checks


@pytest.mark.parametrize("fault, failing, expected", [
    (["DELETE FROM {target} WHERE entry_id = 101"],
     {"row_count", "hash_total", "control_total", "double_entry"}, [(101, "missing", ())]),
    (["INSERT INTO {target} SELECT 900001, txn_id, amount, currency, memo, created_at FROM {target} "
      "WHERE entry_id = 7"], {"row_count", "hash_total", "control_total", "double_entry"}, [(900001, "extra", ())]),
    (["UPDATE {target} SET amount = amount + 0.01 WHERE entry_id = 2500"],
     {"hash_total", "control_total", "double_entry"}, [(2500, "changed", ("amount",))]),
    (["UPDATE {target} SET currency = 'USD' WHERE entry_id = 1201 AND currency = 'EUR'"],
     {"hash_total", "control_total", "double_entry"}, [(1201, "changed", ("currency",))]),
    (["UPDATE {target} SET memo = 'entry 1999 (edited)' WHERE entry_id = 1999"],
     {"hash_total"}, [(1999, "changed", ("memo",))]),  # the sums agree: only the hash total sees it
    (["UPDATE {target} SET amount = amount + 5, memo = NULL WHERE entry_id = 3"],
     {"hash_total", "control_total", "double_entry"}, [(3, "changed", ("amount", "memo"))]),
    (["UPDATE {target} SET currency = 'XXX' WHERE entry_id IN (11, 12)"],  # a whole journal: every sum agrees
     {"hash_total"}, [(11, "changed", ("currency",)), (12, "changed", ("currency",))]),
])
def test_each_fault_is_detected_and_localised_to_exactly_its_rows(loaded, fault, failing, expected):
    pipe, plan, _ = loaded
    verdict = _reconcile(pipe, plan.window, fault)
    assert not verdict.passed
    assert _failed(verdict) == failing, verdict.checks
    assert _diffs(verdict) == expected
    assert verdict.rows_read_localising <= 0.2 * (verdict.rows_source + verdict.rows_target)


def test_rows_deleted_at_the_source_after_the_load_are_told_from_rows_no_batch_wrote(loaded):
    """Loaded rows the source has deleted since are deleted_at_source (the transaction that committed
    the batch wrote them), each a failing result with the target's old values; a row inserted in the
    warehouse by hand is extra, and so is a loaded row edited by hand that the source then deleted
    (that version is no batch's)."""
    pipe, plan, _ = loaded
    src, wh = pipe.src(), pipe.wh()
    try:
        with src.cursor() as s, wh.cursor() as t:  # both rolled back after
            s.execute(f"DELETE FROM {pipe.spec.table} WHERE entry_id IN (1, 2, 3)")
            t.execute(f"INSERT INTO {pipe.spec.target_table} SELECT 900001, txn_id, amount, currency, memo, created_at "
                      f"FROM {pipe.spec.target_table} WHERE entry_id = 7")
            t.execute(f"UPDATE {pipe.spec.target_table} SET memo = 'entry 3 (edited)' WHERE entry_id = 3")
            verdict = reconcile.reconcile(pipe.spec, plan.window, s, t)
    finally:
        for conn in (src, wh):
            conn.rollback()
            conn.close()
    assert [(d.key[0], d.kind, d.loaded_by) for d in verdict.differences] == [
        (1, "deleted_at_source", plan.batch_id), (2, "deleted_at_source", plan.batch_id), (3, "extra", None),
        (900001, "extra", None)]
    found = [(c.subject, json.loads(c.actual)["memo"], c.difference, c.passed) for c in verdict.checks
             if c.check == "deleted_at_source"]
    assert found == [(f"key 1, loaded by batch {plan.batch_id}", "entry 1", "deleted at the source after it was loaded",
                      False),
                     (f"key 2, loaded by batch {plan.batch_id}", "entry 2", "deleted at the source after it was loaded",
                      False)]
    line = verdict.summary(pipe.spec, plan.batch_id)
    assert "4 rows differ: 2 deleted at the source after loading, 2 extra;" in line and "deleted_at_source" in line


def test_invariants_beside_the_passes_give_the_same_verdict_on_the_same_snapshot(loaded):
    """As the DAG runs them: the double entry on a second warehouse connection, at the same time as
    the passes, on the target's exported snapshot (a committed fault, then undone)."""
    pipe, plan, _ = loaded
    table = pipe.spec.target_table
    wh = pipe.wh()
    with wh, wh.cursor() as cur:
        cur.execute(f"UPDATE {table} SET amount = amount + 0.01 WHERE entry_id = 2500")
    src, target, beside = pipe.src(), pipe.wh(), pipe.wh()
    try:
        with src.cursor() as s, target.cursor() as t, beside.cursor() as i:
            t.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            together = reconcile.reconcile(pipe.spec, plan.window, s, t, invariants_cur=i)
            with wh, wh.cursor() as cur:  # committed after the export: neither target cursor sees it
                cur.execute(f"UPDATE {table} SET amount = amount - 0.01 WHERE entry_id = 2500")
            i.execute(f"SELECT amount FROM {table} WHERE entry_id = 2499")
            t.execute(f"SELECT amount FROM {table} WHERE entry_id = 2500")
            assert i.fetchone()[0] + t.fetchone()[0] == Decimal("0.01"), "both target cursors read one snapshot"
        apart = _reconcile(pipe, plan.window, ["UPDATE {target} SET amount = amount + 0.01 WHERE entry_id = 2500"])
    finally:
        for conn in (src, target, beside, wh):
            conn.rollback()
            conn.close()
    assert _failed(together) == _failed(apart) == {"hash_total", "control_total", "double_entry"}
    assert together.checks == apart.checks and _diffs(together) == _diffs(apart) == [(2500, "changed", ("amount",))]
    assert "invariants (beside the passes), waited for" in together.timings and "double entry" in together.timings


def test_a_duplicated_key_is_found_when_no_unique_index_enforces_the_key(loaded):
    pipe, plan, _ = loaded
    table = pipe.spec.target_table
    name = table.rpartition(".")[2]
    verdict = _reconcile(pipe, plan.window, [f"ALTER TABLE {{target}} DROP CONSTRAINT {name}_pkey",
                                             "INSERT INTO {target} SELECT * FROM {target} WHERE entry_id = 42"])
    duplicates = next(c for c in verdict.checks if c.check == "unique_keys")
    assert not duplicates.passed and duplicates.actual == "1 keys more than once"
    clean = next(c for c in _reconcile(pipe, plan.window).checks if c.check == "unique_keys")
    assert clean.passed and "enforced by" in clean.actual


def test_splitting_large_ranges_still_localises_exactly(loaded):
    pipe, plan, _ = loaded
    verdict = _reconcile(pipe, plan.window, ["UPDATE {target} SET amount = amount - 0.01 WHERE entry_id IN (5, 2999)"],
                         buckets=2, leaf_rows=100)
    assert _diffs(verdict) == [(5, "changed", ("amount",)), (2999, "changed", ("amount",))]
    # the ranges are split inside the database (digests), so few rows travel to be compared
    assert 0 < verdict.rows_fetched <= 4 * 2 * 100, verdict.rows_fetched


def test_a_run_records_evidence_renders_data_docs_and_reports_the_rows(loaded, settings, tmp_path):
    """reconcile.run as the DAG runs it: Great Expectations' declarative checks beside the SQL
    ones, every result in the append-only evidence table, the verdict on the ledger, a report."""
    from tidemark.reconcile.expectations import sqlalchemy_url
    from tidemark_workshop.settings import WAREHOUSE_DB

    pipe, plan, attempt = loaded
    url = sqlalchemy_url(settings.pg_host, settings.pg_port, WAREHOUSE_DB, settings.pg_user, settings.pg_password)
    table = pipe.spec.target_table
    fault, undo = (f"UPDATE {table} SET memo = NULL, currency = 'XXX' WHERE entry_id IN (1, 2)",
                   f"UPDATE {table} SET memo = 'entry ' || entry_id, currency = 'EUR' WHERE entry_id IN (1, 2)")
    src, wh, beside = pipe.src(), pipe.wh(), pipe.wh()
    try:
        clean = reconcile.run(pipe.spec, src, wh, tmp_path, batch_id=plan.batch_id, warehouse_url=url,
                              code_version="test", invariants_conn=beside)
        assert clean.verdict.passed and clean.report is None and clean.data_docs.exists(), clean.line
        assert {"gx:expect_column_values_to_not_be_null", "gx:expect_column_values_to_be_in_set",
                "gx:expect_table_row_count_to_equal"} <= {c.check for c in clean.verdict.checks}
        with wh, wh.cursor() as cur:
            cur.execute(fault)
        try:
            dirty = reconcile.run(pipe.spec, src, wh, tmp_path, batch_id=plan.batch_id, warehouse_url=url,
                                  code_version="test")
        finally:
            with wh, wh.cursor() as cur:
                cur.execute(undo)
        failed = {(c.check, c.subject) for c in dirty.verdict.checks if not c.passed}
        assert {("gx:expect_column_values_to_not_be_null", "memo"), ("gx:expect_column_values_to_be_in_set", "currency"),
                ("hash_total", "")} <= failed, failed
        assert "2 rows differ: 2 currency, memo changed" in dirty.line and f"report: {dirty.report}" in dirty.line
        assert "entry 1" in dirty.report.read_text() and (dirty.report.parent / "differences.csv").exists()
        config = (tmp_path / "gx" / "great_expectations.yml").read_text()  # one asset per pipeline, not per run
        assert config.count(f"tidemark_{pipe.spec.name}") == 1 and clean.run_id not in config, config[-2000:]
        assert pipe.query_wh("SELECT reconciliation FROM tidemark_control.batches WHERE batch_id = %s",
                             (plan.batch_id,)) == [("reconciliation_failed",)]
        verdicts = pipe.query_wh("SELECT run_id::text, bool_and(verdict = 'pass'), count(*) FROM "
                                 "tidemark_control.reconciliation_results WHERE batch_id = %s GROUP BY run_id",
                                 (plan.batch_id,))
        assert sorted(v[1:] for v in verdicts) == sorted([(True, len(clean.verdict.checks)),
                                                          (False, len(dirty.verdict.checks))])
        for change in ("UPDATE tidemark_control.reconciliation_results SET verdict = 'pass' WHERE run_id = %s",
                       "DELETE FROM tidemark_control.reconciliation_results WHERE run_id = %s"):
            with pytest.raises(psycopg2.errors.InsufficientPrivilege, match="append-only evidence"):
                with wh, wh.cursor() as cur:
                    cur.execute(change, (dirty.run_id,))
        # an amount changed in the target: every GX check passes (no null, every value in its set, the row
        # count), Tidemark's totals do not; its Data Docs show the run failed, naming the failed checks
        with wh, wh.cursor() as cur:
            cur.execute(f"UPDATE {table} SET amount = amount + 1 WHERE entry_id = 3")
        try:
            quiet = reconcile.run(pipe.spec, src, wh, tmp_path, batch_id=plan.batch_id, warehouse_url=url,
                                  code_version="test")
        finally:
            with wh, wh.cursor() as cur:
                cur.execute(f"UPDATE {table} SET amount = amount - 1 WHERE entry_id = 3")
        assert not quiet.verdict.passed and all(c.passed for c in quiet.verdict.checks if c.check.startswith("gx:"))
        [stored] = [json.loads(f.read_text()) for f in (tmp_path / "gx" / "uncommitted" / "validations").rglob("*.json")
                    if quiet.run_id in str(f)]
        assert stored["success"] is False, stored["statistics"]
        [carried] = [r for r in stored["results"] if r["expectation_config"]["type"] == "unexpected_rows_expectation"]
        assert carried["success"] is False and carried["result"]["observed_value"] >= 1, carried["result"]
        said = carried["expectation_config"]["description"]
        assert "check(s) failed: " in said and "hash_total: expected" in said, said
    finally:
        for conn in (src, wh, beside):
            conn.close()


def test_a_full_reconciliation_finds_a_source_change_no_incremental_pull_can_see(loaded, tmp_path):
    """A source row updated without moving its cursor (older than the version loaded): no batch will
    ever carry it; the full-table reconciliation (up to the watermark) finds it."""
    pipe, _, _ = loaded
    table = pipe.spec.table
    src, wh = pipe.src(), pipe.wh()
    try:
        with src, src.cursor() as cur:
            cur.execute(f"UPDATE {table} SET amount = amount + 100 WHERE entry_id = 1500")
        outcome = reconcile.run(pipe.spec, src, wh, tmp_path, code_version="test")  # no batch: the full table
        assert outcome.batch_id is None and str(outcome.window.lo.cursor).startswith("1970-01-01")
        assert [(d.key[0], d.kind, d.columns) for d in outcome.verdict.differences] == [(1500, "changed", ["amount"])]
        assert "up to the watermark" in outcome.report.read_text()
        assert pipe.query_wh("SELECT DISTINCT scope FROM tidemark_control.reconciliation_results WHERE run_id = %s",
                             (outcome.run_id,)) == [("full",)]
    finally:
        with src, src.cursor() as cur:
            cur.execute(f"UPDATE {table} SET amount = amount - 100 WHERE entry_id = 1500")
        src.close()
        wh.close()


BALANCES_DDL = """
CREATE TABLE {table} (
    account_id bigint NOT NULL, business_date date NOT NULL, opening numeric(18,2) NOT NULL,
    movements numeric(18,2) NOT NULL, closing numeric(18,2) NOT NULL, updated_at timestamptz NOT NULL,
    PRIMARY KEY (account_id, business_date))"""


def test_broken_balance_continuity_is_found_on_the_rows_involved(settings, tmp_path):
    """Balances loaded as they are (no Spark needed for the check): a closing changed on one day breaks
    that day's sum and the next day's opening; each is named."""
    pipe = make_pipeline(settings, tmp_path, BALANCES_DDL, primary_key=["account_id", "business_date"],
                         reconcile={"balance_continuity": {"account": "account_id", "date": "business_date",
                                                           "opening": "opening", "movements": "movements",
                                                           "closing": "closing"}})
    rows = """INSERT INTO {table} SELECT a, date '2026-11-01' + d, 100 * a + 10 * d, 10, 100 * a + 10 * (d + 1),
                  timestamptz '2026-11-20 00:00+00' FROM generate_series(1, 3) a, generate_series(0, 9) d"""
    for conn, table in ((pipe.src(), pipe.spec.table), (pipe.wh(), pipe.spec.target_table)):
        with conn, conn.cursor() as cur:
            if table == pipe.spec.target_table:
                cur.execute(BALANCES_DDL.format(table=table))
            cur.execute(rows.format(table=table))
        conn.close()
    window = Window.from_json({"lo": {"cursor": "2026-11-01T00:00:00+00:00", "pk": None},
                               "hi": {"cursor": "2026-11-30T00:00:00+00:00", "pk": None}})
    clean = _reconcile(pipe, window)
    assert clean.passed, [c for c in clean.checks if not c.passed]
    broken = _reconcile(pipe, window, ["UPDATE {target} SET closing = closing + 1 "
                                       "WHERE account_id = 2 AND business_date = '2026-11-05'"])
    failed = {(c.check, c.subject): c.actual for c in broken.checks if not c.passed}
    assert failed[("balance_continuity", "opening + movements = closing")] == "1 rows: 2 2026-11-05"
    assert failed[("balance_continuity", "opening = previous closing per account_id")] == (
        "1 rows: 2 2026-11-06: opening 250.00, previous closing 251.00")
    assert [(d.key, d.kind, d.columns) for d in broken.differences] == [
        ((2, datetime.date(2026, 11, 5)), "changed", ["closing"])]


def test_balances_are_checked_against_the_ledgers_movements_where_its_watermark_covers_them(settings, tmp_path):
    """Each balance row's movements equal its account's ledger entries that day (the ledger
    pipeline's target), for the rows the ledger's watermark covers; an entry changed is named."""
    ledger_name = f"it_ledger_{uuid.uuid4().hex[:8]}"
    rule = {"ledger": ledger_name, "ledger_table": f"public.{ledger_name}_tgt", "account": "account_id",
            "date": "business_date", "movements": "movements", "amount": "amount"}
    pipe = make_pipeline(settings, tmp_path, BALANCES_DDL, primary_key=["account_id", "business_date"],
                         reconcile={"movements_match_ledger": rule})
    rows = """INSERT INTO {table} SELECT a, date '2026-11-01' + d, 100 * a + 10 * d, 10, 100 * a + 10 * (d + 1),
                  timestamptz '2026-11-20 00:00+00' FROM generate_series(1, 3) a, generate_series(0, 9) d"""
    for conn, table in ((pipe.src(), pipe.spec.table), (pipe.wh(), pipe.spec.target_table)):
        with conn, conn.cursor() as cur:
            if table == pipe.spec.target_table:
                ledger.ensure_control_schema(cur)
                cur.execute(BALANCES_DDL.format(table=table))
                cur.execute(f"CREATE TABLE {rule['ledger_table']} (entry_id bigserial PRIMARY KEY, account_id bigint, "
                            "business_date date, amount numeric(18,2), created_at timestamptz)")
                cur.execute(f"INSERT INTO {rule['ledger_table']} (account_id, business_date, amount, created_at) "
                            "SELECT a, date '2026-11-01' + d, part, timestamptz '2026-11-19 00:00+00' "
                            "FROM generate_series(1, 3) a, generate_series(0, 9) d, unnest(array[4, 6]) part")
            cur.execute(rows.format(table=table))
        conn.close()
    window = Window.from_json({"lo": {"cursor": "2026-11-01T00:00:00+00:00", "pk": None},
                               "hi": {"cursor": "2026-11-30T00:00:00+00:00", "pk": None}})

    def watermark(at: str) -> tuple[str, tuple]:
        return ("INSERT INTO tidemark_control.watermarks (pipeline, bound, cursor_ts, batch_id) VALUES (%s, %s, %s, 'b')",
                (ledger_name, json.dumps({"cursor": at, "pk": None}), at))

    covered = watermark("2026-11-21T00:00:00+00:00")

    def check(statements):  # in a transaction rolled back after
        src, wh = pipe.src(), pipe.wh()
        try:
            with src.cursor() as s, wh.cursor() as t:
                for sql, params in statements:
                    t.execute(sql, params)
                verdict = reconcile.reconcile(pipe.spec, window, s, t)
        finally:
            src.rollback()
            wh.rollback()
            src.close()
            wh.close()
        (found,) = [c for c in verdict.checks if c.check == "movements_match_ledger"]
        return found

    clean = check([covered])
    assert clean.passed and clean.actual == "0 of 30 rows differ", clean
    changed = check([covered, (f"UPDATE {rule['ledger_table']} SET amount = 5 WHERE account_id = 2 AND "
                               "business_date = '2026-11-05' AND amount = 4", ())])
    assert not changed.passed and changed.actual == "1 of 30 rows differ: 2 2026-11-05: 10.00, ledger 11.00", changed
    early = check([watermark("2026-11-19T12:00:00+00:00")])  # balances newer than the ledger's load
    assert early.passed and early.actual.startswith("0 of 0 rows differ, 30 newer than"), early
    unloaded = check([])
    assert not unloaded.passed and "has no committed batch (yet, or no such pipeline)" in unloaded.actual, unloaded


def test_a_stale_watermark_fails_the_freshness_check(loaded, tmp_path):
    pipe, plan, _ = loaded
    strict = tmp_path / pipe.path.name  # the same pipeline, with a freshness limit its watermark cannot meet
    strict.write_text(json.dumps({**json.loads(pipe.path.read_text()),
                                  "reconcile": {**RECONCILE, "max_staleness": "PT0.001S"}}))
    src, wh = pipe.src(), pipe.wh()
    try:
        outcome = reconcile.run(load_spec(strict), src, wh, tmp_path, batch_id=plan.batch_id, code_version="test")
    finally:
        src.close()
        wh.close()
    failed = [c for c in outcome.verdict.checks if not c.passed]
    assert [c.check for c in failed] == ["freshness"] and failed[0].expected == "at most 0:00:00.001000 old"
    assert outcome.verdict.differences == [] and "1 of" in outcome.line


def test_source_rows_no_window_can_hold_fail_the_reconciliation_by_key(loaded):
    """A NULL or infinite cursor puts a row outside every window: every windowed check passes without
    it, so only the unreachable-rows count can say the target lacks it."""
    pipe, plan, _ = loaded
    assert [c for c in _reconcile(pipe, plan.window).checks if c.check == "unreachable_rows"][0].passed
    src, wh = pipe.src(), pipe.wh()
    try:
        with src.cursor() as s, wh.cursor() as t:  # both rolled back below: the fixture stays clean
            s.execute(f"ALTER TABLE {pipe.source_table} ALTER COLUMN created_at DROP NOT NULL")
            s.execute(f"""INSERT INTO {pipe.source_table} (entry_id, txn_id, amount, currency, memo, created_at)
                          VALUES (900001, md5('x')::uuid, 1, 'EUR', 'no time', NULL),
                                 (900002, md5('x')::uuid, -1, 'EUR', 'forever', 'infinity')""")
            verdict = reconcile.reconcile(pipe.spec, plan.window, s, t)
            waiting = pipe.spec.model_copy(update={"reconcile": pipe.spec.reconcile.model_copy(
                update={"unreachable_rows": False})})  # a source whose rows are meant to wait: not counted
            assert reconcile.reconcile(waiting, plan.window, s, t).passed
    finally:
        src.rollback()
        wh.rollback()
        src.close()
        wh.close()
    assert _failed(verdict) == {"unreachable_rows"} and verdict.differences == []
    stranded = [c for c in verdict.checks if c.check == "unreachable_rows"][0]
    assert (stranded.expected, stranded.actual) == ("0", "2")
    assert "key 900001 NULL, key 900002 infinity; no batch loads them" in stranded.subject, stranded.subject
    assert "1 of" in verdict.summary(pipe.spec, plan.batch_id) and "unreachable_rows" in verdict.summary(pipe.spec, "b")

"""Benchmark: reconcile one large ledger batch, against plain scans of the same rows.

1. ``--rows`` double-entry ledger rows (pairs of one journal, amounts per currency and business
   date) are written with the same SQL into a source table and a target table (source and
   warehouse databases), then vacuumed and analysed.
2. Baseline: one ``SELECT count(*), sum(amount)`` scan of the window on each database.
3. Tidemark's reconciliation of the window (``tidemark.reconcile.reconcile``): unique keys, row
   counts, control totals per currency and business date, hash totals over every row, double
   entry (on a second warehouse connection, beside the two passes, as the DAG runs it); it must pass.
4. ``--changed`` target rows get one cent more; the reconciliation must localise exactly them.
   ``rows_compared_fraction`` is the rows read while localising over the rows of the batch on
   both sides.

Great Expectations' declarative checks (Data Docs) are not in the timing: they are the same
queries whatever the batch, and the DAG runs them after these.

The last line printed is one JSON object with the figures; the tables are dropped at the end.

  make bench-reconcile                                # 2,000,000 rows, 10 changed
  python bench/reconcile_batch.py --rows 50000        # a quick look
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import psycopg2

from tidemark import reconcile
from tidemark.protocol.spec import load_spec
from tidemark.protocol.window import Bound, Window
from tidemark_workshop.settings import WAREHOUSE_DB, Settings

DDL = """CREATE UNLOGGED TABLE {table} (
    entry_id bigint PRIMARY KEY, txn_id uuid NOT NULL, account_id bigint NOT NULL, business_date date NOT NULL,
    amount numeric(18,2) NOT NULL, currency char(3) NOT NULL, side text NOT NULL, created_at timestamptz NOT NULL)"""
ROWS = """INSERT INTO {table}
    SELECT g, md5(((g + 1) / 2)::text)::uuid, (g * 7919) %% 5000, date '2026-11-01' + (((g + 1) / 2) %% 20)::int,
           CASE WHEN g %% 2 = 1 THEN -1 ELSE 1 END * (((((g + 1) / 2) * 7919) %% 1000000) / 100.0 + 0.01),
           (ARRAY['EUR', 'USD', 'GBP'])[((g + 1) / 2) %% 3 + 1], CASE WHEN g %% 2 = 1 THEN 'debit' ELSE 'credit' END,
           timestamptz '2026-11-01 00:00:00+00' + g * interval '1 millisecond'
      FROM generate_series(1::bigint, %s) g"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--changed", type=int, default=10)
    args = p.parse_args()
    settings = Settings.from_env()
    name = f"bench_rc_{uuid.uuid4().hex[:8]}"
    source_table, target_table = f"public.{name}_src", f"public.{name}_tgt"
    folder = Path(tempfile.mkdtemp(prefix="tidemark-bench-reconcile-"))
    (folder / f"{name}.yaml").write_text(json.dumps({
        "name": name, "table": source_table, "primary_key": ["entry_id"],
        "cursor": {"kind": "timestamp", "column": "created_at"}, "safe_lag": "PT0S", "target_table": target_table,
        "write_mode": "append_window_replace",
        "reconcile": {"control_totals": [{"columns": ["amount"], "group_by": ["currency", "business_date"]}],
                      "double_entry": {"journal": "txn_id", "amount": "amount", "currency": "currency"}}}))
    spec = load_spec(folder / f"{name}.yaml")
    window = Window(Bound(datetime(2026, 10, 1, tzinfo=timezone.utc)), Bound(datetime(2026, 12, 1, tzinfo=timezone.utc)))
    src, wh = psycopg2.connect(settings.dsn(settings.source_db)), psycopg2.connect(settings.dsn(WAREHOUSE_DB))
    beside = psycopg2.connect(settings.dsn(WAREHOUSE_DB))  # invariants beside the passes, as the DAG runs them
    for conn in (src, wh):
        conn.autocommit = True
    result: dict[str, object] = {"rows": args.rows}
    try:
        t0 = time.perf_counter()
        for conn, table in ((src, source_table), (wh, target_table)):
            with conn.cursor() as cur:
                cur.execute(DDL.format(table=table))
                cur.execute(ROWS.format(table=table), (args.rows,))
                cur.execute(f"VACUUM ANALYZE {table}")
        print(f"wrote {args.rows} rows to each side in {time.perf_counter() - t0:.1f} s", flush=True)
        for conn in (src, wh):
            conn.autocommit = False

        def scans() -> float:
            started = time.perf_counter()
            for conn, table in ((src, source_table), (wh, target_table)):
                with conn, conn.cursor() as cur:
                    cur.execute(f"SELECT count(*), sum(amount) FROM {table} WHERE created_at > %s AND created_at <= %s",
                                (window.lo.cursor, window.hi.cursor))
                    cur.fetchone()
            return time.perf_counter() - started

        scans()  # warm the caches alike for both contenders
        scan_s = scans()  # the ratio from the unrounded time: a small --rows scans in under 5 ms
        result["scan_s"] = round(scan_s, 3)
        with src, src.cursor() as s, wh, wh.cursor() as t, beside, beside.cursor() as i:
            clean = reconcile.reconcile(spec, window, s, t, invariants_cur=i)
        if not clean.passed or clean.rows_target != args.rows:
            raise RuntimeError(f"the clean batch did not reconcile: {[c for c in clean.checks if not c.passed]}")
        result["reconcile_s"] = round(clean.seconds, 2)
        result["ratio_vs_scan"] = round(clean.seconds / scan_s, 2)
        result["reconcile_steps_s"] = clean.timings
        print(f"reconciled {clean.rows_target} rows ({len(clean.checks)} checks) in {clean.seconds:.2f} s "
              f"({', '.join(f'{k} {v:.2f} s' for k, v in clean.timings.items())}); count+sum scans of both sides "
              f"{result['scan_s']} s", flush=True)

        step = max(args.rows // args.changed, 1)
        changed = [1 + i * step for i in range(args.changed)]
        with wh, wh.cursor() as cur:
            cur.execute(f"UPDATE {target_table} SET amount = amount + 0.01 WHERE entry_id = ANY (%s)", (changed,))
        with src, src.cursor() as s, wh, wh.cursor() as t, beside, beside.cursor() as i:
            dirty = reconcile.reconcile(spec, window, s, t, invariants_cur=i)
        found = sorted(d.key[0] for d in dirty.differences)
        if found != changed or any(d.columns != ["amount"] for d in dirty.differences):
            raise RuntimeError(f"localised {found}, changed {changed}")
        result["localise_s"] = round(dirty.seconds_localising, 2)
        result["rows_compared_fraction"] = round(dirty.read_fraction, 4)
        result["changed_found"] = len(found)
        print(f"localised the {len(found)} changed rows in {dirty.seconds_localising:.2f} s, reading "
              f"{dirty.rows_read_localising} rows ({100 * dirty.read_fraction:.2f}% of both sides)", flush=True)
    finally:
        for conn, table in ((src, source_table), (wh, target_table)):
            conn.rollback()
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(f"DROP TABLE IF EXISTS {table}")
            conn.close()
        beside.close()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

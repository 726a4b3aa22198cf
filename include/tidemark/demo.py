"""`make demo`: the nightly batch of the core-banking demo, run through Airflow.

Seeds the source (tidemark.bank), starts concurrent writers and a transaction held open longer
than the safe lag, runs every nightly pipeline DAG with `airflow dags test` while they write,
and prints per pipeline the window, batch id, rows, ledger state and watermark, then proves the
target holds exactly the source rows up to the watermark. Each step prints one summary line
(tidemark.summary); the full Airflow output is in the state directory's logs/demo-<dag_id>.log.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

from tidemark.settings import Settings
from tidemark.summary import parse_summaries

PIPELINES = ("bank_customers", "bank_accounts", "bank_ledger_entries", "bank_daily_balances")


def run_dag(dag_id: str, settings: Settings) -> tuple[str, float, list[dict]]:
    log = settings.logs_dir / f"demo-{dag_id}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with open(log, "w") as out:
        # cwd: Spark leaves an artifacts/ directory wherever it runs
        proc = subprocess.run(
            ["airflow", "dags", "test", dag_id], stdout=out, stderr=subprocess.STDOUT, cwd=settings.state_dir
        )
    text = log.read_text(errors="replace")
    found = re.findall(rf"DagRun Finished: dag_id={re.escape(dag_id)},.*?state=(\w+)", text)
    state = found[-1] if found else "no run"
    if proc.returncode != 0:
        state = f"{state} (airflow exited {proc.returncode})"
    return state, time.monotonic() - t0, parse_summaries(text)


def _prove(settings: Settings) -> list[str]:
    """Per pipeline, with the writers stopped: the target holds exactly what the watermark promises.

    Every source row at or below the watermark is in the target with the same cursor value;
    every target row exists in the source with that cursor value or a newer one (an upsert table
    has older versions of rows changed after the watermark); append-only targets hold exactly
    the source rows up to the watermark.
    """
    import psycopg2

    from tidemark.settings import REPO_ROOT, SOURCE_DB, WAREHOUSE_DB
    from tidemark.spec import load_spec, quote

    def keyed(conn, spec, table):
        cols = ", ".join(quote(c) for c in (*spec.primary_key, spec.cursor.column))
        with conn, conn.cursor() as cur:
            cur.execute(f"SELECT {cols} FROM {quote(table)}")
            return {tuple(r[:-1]): r[-1] for r in cur.fetchall()}

    lines = []
    src, wh = psycopg2.connect(settings.dsn(SOURCE_DB)), psycopg2.connect(settings.dsn(WAREHOUSE_DB))
    try:
        for name in PIPELINES:
            spec = load_spec(REPO_ROOT / "include" / "pipelines" / f"{name}.yaml")
            with wh, wh.cursor() as cur:
                cur.execute("SELECT cursor_ts FROM tidemark_control.watermarks WHERE pipeline = %s", (name,))
                row = cur.fetchone()
            if row is None:
                lines.append(f"{name}: no watermark: MISMATCH")
                continue
            mark = row[0]
            source, target = keyed(src, spec, spec.table), keyed(wh, spec, spec.target_table)
            due = {k: v for k, v in source.items() if v <= mark}
            missing = [k for k, v in due.items() if target.get(k) != v]
            stray = [k for k, v in target.items() if k not in source or source[k] < v]
            wrong = missing or stray or (spec.write_mode == "append_window_replace" and len(target) != len(due))
            lines.append(
                f"{name}: watermark {mark.isoformat()}: {len(due)} source rows due, {len(target)} target rows, "
                f"{len(missing)} missing, {len(stray)} stray: {'MISMATCH' if wrong else 'OK'}"
            )
    finally:
        src.close()
        wh.close()
    return lines


def _start_afresh(settings: Settings) -> None:
    """Every demo tells the same story from the first night: an empty core-banking source, and no
    target, ledger, offsets or topic of the demo pipelines (the benchmark also reuses the source)."""
    import psycopg2

    from tidemark import bank
    from tidemark.kafka_io import delete_topic
    from tidemark.ledger import ensure_control_schema
    from tidemark.settings import REPO_ROOT, SOURCE_DB, WAREHOUSE_DB
    from tidemark.spec import load_spec, quote

    src = psycopg2.connect(settings.dsn(SOURCE_DB))
    wh = psycopg2.connect(settings.dsn(WAREHOUSE_DB))
    try:
        bank.reset(src)
        with wh, wh.cursor() as cur:
            ensure_control_schema(cur)
            for name in PIPELINES:
                spec = load_spec(REPO_ROOT / "include" / "pipelines" / f"{name}.yaml")
                cur.execute(f"DROP TABLE IF EXISTS {quote(spec.target_table)}")
                prefix = f"{name}:"
                for table in ("batch_ends", "staged_totals", "batch_attempts", "batches"):
                    cur.execute(f"DELETE FROM tidemark_control.{table} WHERE starts_with(batch_id, %s)", (prefix,))
                cur.execute("DELETE FROM tidemark_control.watermarks WHERE pipeline = %s", (name,))
                for table in ("sink_offsets", "sink_fences"):
                    cur.execute(f"DELETE FROM tidemark_control.{table} WHERE consumer = %s", (f"batch-sink.{name}",))
                delete_topic(settings.kafka_bootstrap, spec.topic)
    finally:
        src.close()
        wh.close()


def main() -> int:
    import psycopg2

    from tidemark import bank
    from tidemark.settings import SOURCE_DB

    settings = Settings.from_env()
    dsn = settings.dsn(SOURCE_DB)
    _start_afresh(settings)
    conn = psycopg2.connect(dsn)
    seeded = bank.seed(conn)
    bank.post_transfers(conn, 200, rng=__import__("random").Random(1))
    conn.close()
    print(f"source: core-banking schema seeded ({seeded}); 3 concurrent writers start now, and one "
          "transaction stays open for 20 s (longer than the 2 s safe lag)", flush=True)
    ok = True
    with bank.Simulator(dsn, writers=3, pause=0.2) as sim:
        held = bank.hold_open(dsn, 20, rows=10)
        for name in PIPELINES:
            dag_id = f"tidemark_batch_{name}"
            print(f"running {dag_id} through Airflow (airflow dags test) ...", flush=True)
            state, seconds, steps = run_dag(dag_id, settings)
            ok &= state == "success"
            print(f"  {state} in {seconds:.1f}s")
            for step in steps:
                if step.get("step") == "batch":
                    print(f"  window {step['window']}\n  batch {step['batch_id']} attempt {step['attempt']}: "
                          f"{step['state']}, rows={step['rows']}, watermark {step['watermark']}")
        held.wait()
    print(f"\nwriters: {sim.stats}")
    for line in _prove(settings):
        ok &= line.endswith(": OK")
        print(line)
    print(f"\nfull logs: {settings.logs_dir}/demo-<dag_id>.log")
    print(f"Airflow UI: `make ui`, then http://127.0.0.1:{settings.airflow_port}")
    if not ok:
        print("demo FAILED: read the log above for the failing task and its message", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

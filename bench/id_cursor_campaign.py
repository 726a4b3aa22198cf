"""Id-cursor campaign: slow writers hold transactions open 20-60 s while batches run back to back.

Each slow writer takes ids from the sequence, keeps its transaction open for a random 20-60 s and
commits; fast writers commit a row every half second. Batches (plan, BEGIN, extract, END, sink:
the same code the DAG runs) follow each other for ``--minutes``. After the writers stop, one last
batch runs; then every source row must be in the target with the same amount. Before the id clamp
(tidemark.ledger.safe_id_high) such a run lost rows: 50 of 63,153 in the adversarial report.

  make campaign                     # or: python bench/id_cursor_campaign.py --minutes 5 --seed 7
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
from decimal import Decimal
from pathlib import Path

import psycopg2

from tidemark_workshop.settings import Settings
from tidemark_workshop.stack.batchrun import make_pipeline

DDL = "CREATE TABLE {table} (id bigserial PRIMARY KEY, amount numeric(18,2) NOT NULL)"


def slow_writer(settings: Settings, table: str, seed: int, stop: threading.Event, held: list[float]) -> None:
    rng = random.Random(seed)
    while not stop.is_set():
        conn = psycopg2.connect(settings.dsn(settings.source_db), application_name=f"campaign-slow-{seed}")
        try:
            with conn, conn.cursor() as cur:
                cur.execute(f"INSERT INTO {table} (amount) SELECT round((random() * 1000)::numeric, 2) "
                            f"FROM generate_series(1, %s)", (rng.randint(1, 50),))
                hold = rng.uniform(20, 60)
                held.append(hold)
                time.sleep(hold)  # the ids are taken; the rows commit only now
        finally:
            conn.close()


def fast_writer(settings: Settings, table: str, stop: threading.Event) -> None:
    conn = psycopg2.connect(settings.dsn(settings.source_db), application_name="campaign-fast")
    try:
        while not stop.is_set():
            with conn, conn.cursor() as cur:
                cur.execute(f"INSERT INTO {table} (amount) SELECT round((random() * 1000)::numeric, 2) "
                            "FROM generate_series(1, 20)")
            time.sleep(0.5)
    finally:
        conn.close()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=5.0, help="how long batches run back to back")
    p.add_argument("--slow-writers", type=int, default=3)
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args(argv)
    settings = Settings.from_env()
    with tempfile.TemporaryDirectory(prefix="tidemark-campaign-") as tmp:
        pipe = make_pipeline(settings, Path(tmp), DDL, cursor={"kind": "id", "column": "id"}, append_only=True)
        stop, held = threading.Event(), []
        writers = [threading.Thread(target=slow_writer, args=(settings, pipe.source_table, args.seed + i, stop, held))
                   for i in range(args.slow_writers)] + [
                   threading.Thread(target=fast_writer, args=(settings, pipe.source_table, stop))]
        for w in writers:
            w.start()
        started, batches = time.monotonic(), 0
        try:
            while time.monotonic() - started < args.minutes * 60:
                plan, _ = pipe.run(f"campaign-{batches}")
                batches += 1
                print(f"batch {batches}: window {plan.window}, {time.monotonic() - started:.0f} s", flush=True)
        finally:
            stop.set()
            for w in writers:
                w.join()
        pipe.run("campaign-final")  # every writer has committed: the clamp lets the window reach max(id)
        source, target = pipe.rows("source", "amount"), pipe.rows("target", "amount")
        lost = sorted(set(source) - set(target))
        changed = [k for k in source if k in target and target[k] != source[k]]
        amount_lost = sum((source[k][0] for k in lost), Decimal(0))
        print(f"id-cursor campaign: {len(source)} source rows, {len(target)} loaded, {len(lost)} lost "
              f"({amount_lost} of amount), {len(changed)} changed; {batches + 1} batches; "
              f"{len(held)} slow transactions held {min(held, default=0):.0f}-{max(held, default=0):.0f} s")
        return 0 if not lost and not changed and len(target) == len(source) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

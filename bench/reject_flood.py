"""Benchmark: a flood of records the sink cannot use, against a good batch of the same size.

1. Baseline: ``--records`` ledger rows loaded as one good batch (plan, BEGIN, extract, END, the
   sink with an available-now trigger); the sink's work is timed (JVM start-up apart).
2. Flood: as many records without batch headers published to a fresh pipeline's topic (random
   bytes, as a misconfigured producer would send), then the same sink. Every one must end in
   ``tidemark_control.sink_rejects`` and in the dead-letter topic (the outbox marks each with its
   DLQ offset); the sink must exit 0.

The last line is one JSON object: ``good_s`` and ``flood_s`` (the sink's work), ``ratio_flood_vs_good``,
``rejects_per_s``, and the sink's peak memory (JVM and Python) for each.

  make bench-flood                                   # 1,000,000 records
  make bench-flood BENCH_ARGS="--records 100000 --max-offsets-per-trigger 1000000"
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import psycopg2
from confluent_kafka import Producer

sys.path.insert(0, str(Path(__file__).resolve().parent))
import batch_load as bench  # noqa: E402  (the batch benchmark's pipelines, source and checks)
from tidemark.ledger import consumer_for  # noqa: E402
from tidemark.protocol.kafka_io import ensure_topic, produce_waiting, producer_config  # noqa: E402
from tidemark.protocol.window import predicate  # noqa: E402
from tidemark_workshop import bank  # noqa: E402
from tidemark_workshop.settings import WAREHOUSE_DB, Settings  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=1_000_000, help="records in the good batch and in the flood (even)")
    p.add_argument("--max-offsets-per-trigger", type=int, help="records per sink micro-batch at most (default: the spec's)")
    args = p.parse_args(argv)
    sink = {"max_offsets_per_trigger": args.max_offsets_per_trigger} if args.max_offsets_per_trigger else {}
    settings = Settings.from_env()
    src, wh = psycopg2.connect(settings.dsn(settings.source_db)), psycopg2.connect(settings.dsn(WAREHOUSE_DB))
    good = bench._pipeline(settings, 3, "tidemark", "avro", sink)
    flood = bench._pipeline(settings, 3, "standing", "avro", sink)
    try:
        bench._reset(src, wh)
        bank.seed(src)
        bench._load_source(src, args.records)
        plan, _ = good.run("bench-flood-baseline")  # plan to commit, as the nightly DAG; asserts it committed
        good_s, good_mb = _sink_work(good, time.time())
        bench._check(src, wh, "tidemark", predicate(good.spec, plan.window), args.records)
        bench.say(f"good batch: {args.records} records applied by the sink in {good_s:.1f} s, peak {good_mb} MB")

        _publish_garbage(settings, flood.spec.topic, args.records)
        flood.sink()
        flood_s, flood_mb = _sink_work(flood, time.time())
        with wh, wh.cursor() as cur:
            cur.execute("""SELECT count(*), count(*) FILTER (WHERE in_dlq AND dlq_offset IS NOT NULL)
                             FROM tidemark_control.sink_rejects WHERE consumer = %s""", (consumer_for(flood.spec.name),))
            rejects, in_dlq = cur.fetchone()
        if rejects != args.records or in_dlq != args.records:
            raise bench.BenchError(f"flood: {rejects} rejects recorded, {in_dlq} in the DLQ, {args.records} published")
        bench.say(f"flood: {args.records} records rejected, each in the DLQ once, in {flood_s:.1f} s, peak {flood_mb} MB")
        result = {"records": args.records, **({"sink": sink} if sink else {}), "good_s": round(good_s, 2),
                  "flood_s": round(flood_s, 2), "ratio_flood_vs_good": round(flood_s / good_s, 2),
                  "rejects_per_s": round(args.records / flood_s), "good_peak_mb": good_mb, "flood_peak_mb": flood_mb}
        print(json.dumps(result, sort_keys=True), flush=True)
    finally:
        with wh, wh.cursor() as cur:  # the flood's rejects are the benchmark's, not evidence
            cur.execute("DELETE FROM tidemark_control.sink_rejects WHERE consumer = %s", (consumer_for(flood.spec.name),))
        bench._clean(settings, src, wh, good, flood)
        src.close()
        wh.close()
    return 0


def _sink_work(pipe, done: float) -> tuple[float, int]:
    """The pipeline's last sink job, ended at ``done``: its work in seconds (start-up apart) and peak MB."""
    job = pipe.jobs[-1]
    return done - bench._ready_at(job), round(job.peak_rss_bytes / bench.MB)


def _publish_garbage(settings: Settings, topic: str, n: int) -> None:
    ensure_topic(settings.kafka_bootstrap, topic, 3)
    producer = Producer(producer_config(settings.kafka_bootstrap, **{"linger.ms": 50, "batch.size": 1 << 20}))
    for i in range(n):
        produce_waiting(producer, topic, key=str(i).encode(), value=os.urandom(120))
    if producer.flush(120) != 0:
        raise bench.BenchError(f"could not deliver every flood record to {topic}")


if __name__ == "__main__":
    sys.exit(main())

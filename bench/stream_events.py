"""Benchmark: payment events through the exactly-once standing sink, on this machine.

One pipeline with a stream (the tests' payments table; events keyed by id over 3 partitions);
its standing sink is the real Spark job, launched as the supervisor launches it.

1. Throughput: ``--backlog`` events are published while the sink is stopped; then it starts and
   drains them. ``events_per_s`` is the drain rate from the first committed micro-batch to the
   last (at least 60 s of work with the default backlog on this machine): the highest rate the
   sink keeps up with, since a backlog is always there to read.
2. Latency: events are published at ``--rate`` per second for ``--seconds``; each carries its
   publish time, and a poller reads the serving view every 50 ms: ``p50_ms``/``p99_ms`` are
   publish-to-visible in the serving view (both clocks are this host's).
3. Restart: kill -9 of the whole job, then a start as the supervisor makes it (the dead lease
   ended, the same command); ``restart_s`` runs from the kill to the new instance's first
   committed micro-batch, with events still arriving.
4. With ``--peers`` (``make bench-peers``): Tidemark's sink stopped, the peer, Debezium's JDBC sink
   on the stack's Kafka Connect worker, drains a backlog of the same size and events (in Connect's
   JSON with its schema, which it needs) into a table of the same columns (``bench/peers.py``):
   ``ratio_vs_debezium_jdbc_sink`` is Tidemark's drain rate over the peer's (exactly once against
   at least once).

Every event is checked in the end: the real-time table holds each published event once.
The last line printed is one JSON object with the figures; the benchmark's tables and topics
are dropped at the end.

  make bench-stream                                       # defaults: 3,000,000 backlog, 5,000/s for 60 s
  python bench/stream_events.py --backlog 50000 --seconds 5   # a quick look
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from tidemark import ledger
from tidemark.protocol.kafka_io import delete_topic, ensure_topic, produce_waiting, producer_config
from tidemark.protocol.spec import quote
from tidemark.spark import jobs
from tidemark.streams.cycle import prepare_stream_tables
from tidemark.streams.launch import LocalLauncher
from tidemark_workshop.settings import Settings
from tidemark_workshop.stack.batchrun import PAYMENTS_DDL, Pipeline, make_pipeline
from tidemark_workshop.stack.spark import submit_command

PARTITIONS = 3
APPLY_LINE = re.compile(r"micro-batch \d+ of \d+ records .*, refused .*? in [0-9.]+ s \((.*)\)$", re.M)
STEP = re.compile(r"(?:^|, )(.+?) ([0-9.]+) s(?=, |$)")  # "spark read and checks 1.2 s, events 0.8 s, ..."


def _event(i: int, at: float) -> bytes:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at % 1 * 1e6):06d}Z"
    return b'{"id":%d,"amount":%d.%02d,"currency":"EUR","updated_at":"%s"}' % (i, i % 100000, i % 100, stamp.encode())


def _publish(settings: Settings, topic: str, first: int, n: int, *, rate: float | None = None,
             sent: dict[int, float] | None = None) -> None:
    """Events first..first+n-1, as fast as possible or at ``rate`` per second (their publish times in ``sent``)."""
    from confluent_kafka import Producer

    producer = Producer(producer_config(settings.kafka_bootstrap, **{"linger.ms": 5, "batch.size": 1_000_000,
                                                                     "queue.buffering.max.messages": 2_000_000}))
    started = time.time()
    for k in range(n):
        i = first + k
        if rate is not None:
            due = started + k / rate
            while (now := time.time()) < due:
                time.sleep(min(due - now, 0.002))
        now = time.time()
        if sent is not None:
            sent[i] = now
        produce_waiting(producer, topic, value=_event(i, now), key=str(i).encode())
        if k % 10_000 == 0:
            producer.poll(0)
    if producer.flush(120) != 0:
        raise RuntimeError(f"could not deliver every event to {topic}")


def _count(pipe: Pipeline) -> int:
    return pipe.query_wh(f"SELECT count(*) FROM {quote(pipe.spec.stream.target_table)}")[0][0]


def _first_commit_after(pipe: Pipeline, fence_above: int, timeout: float) -> float:
    """Wall time of the first micro-batch with events committed under a fence above ``fence_above``."""
    consumer = ledger.consumer_for(pipe.spec.name)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = pipe.query_wh("SELECT extract(epoch FROM min(committed_at)) FROM tidemark_control.sink_micro_batches "
                             "WHERE consumer = %s AND fence > %s AND events > 0", (consumer, fence_above))
        if rows[0][0] is not None:
            return float(rows[0][0])
        time.sleep(0.05)
    raise TimeoutError(f"no micro-batch committed under a new fence within {timeout} s")


def _fence(pipe: Pipeline) -> int:
    rows = pipe.query_wh("SELECT fence FROM tidemark_control.sink_fences WHERE consumer = %s",
                         (ledger.consumer_for(pipe.spec.name),))
    return rows[0][0] if rows else 0


def _start(launcher: LocalLauncher, pipe: Pipeline, argv, env) -> None:
    wh = pipe.wh()
    try:
        with wh, wh.cursor() as cur:  # what the supervisor does for a dead instance's successor
            beat = ledger.heartbeat(cur, pipe.spec.name)
            if beat is not None:
                ledger.end_lease(cur, pipe.spec.name, beat["fence"])
    finally:
        wh.close()
    launcher.start(pipe.spec.name, argv, env)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backlog", type=int, default=3_000_000, help="events drained for the throughput figure")
    p.add_argument("--rate", type=float, default=5000.0, help="events per second for the latency figure")
    p.add_argument("--seconds", type=float, default=60.0, help="how long the latency phase publishes")
    p.add_argument("--max-per-trigger", type=int, default=100_000, help="the sink's max_offsets_per_trigger")
    p.add_argument("--peers", action="store_true",
                   help="also drain the same backlog with Debezium's JDBC sink (bench/peers.py; make bench-peers)")
    args = p.parse_args(argv)
    settings = Settings.from_env()
    with tempfile.TemporaryDirectory(prefix="tidemark-bench-stream-") as workdir:
        return _run(settings, Path(workdir), args)


def _run(settings: Settings, workdir: Path, args) -> int:
    unique = f"{int(time.time())}"
    stream = {"topic": f"bench_events_{unique}", "key": "id", "event_time": "updated_at", "partitions": PARTITIONS,
              "target_table": f"public.bench_{unique}_rt", "serving_view": f"public.bench_{unique}_serving"}
    pipe = make_pipeline(settings, workdir, PAYMENTS_DDL, stream=stream,
                         sink={"mode": "standing", "trigger": "PT0.2S", "heartbeat": "PT1S",
                               "max_offsets_per_trigger": args.max_per_trigger, "driver_memory": "2g"})
    wh = pipe.wh()
    with wh, wh.cursor() as cur:
        ledger.ensure_control_schema(cur)
    prepare_stream_tables(pipe.spec, wh, pipe.src)
    wh.close()
    ensure_topic(settings.kafka_bootstrap, stream["topic"], PARTITIONS)
    launcher = LocalLauncher(workdir / "streams")
    argv, env = submit_command(settings, jobs.SINK_JOB, pipe.sink_args(available_now=False),
                               secret=settings.pg_password)
    result: dict[str, object] = {}
    try:
        _drain(settings, pipe, launcher, argv, env, args, result)
        _latency(settings, pipe, args, result)
        _restart(settings, pipe, launcher, argv, env, args, result)
        if args.peers:
            launcher.kill(pipe.spec.name)  # the peer drains alone, as Tidemark's sink did
            result.update(_peer(settings, unique, args, result["events_per_s"]))
    finally:
        launcher.kill(pipe.spec.name)
        wh = pipe.wh()
        with wh, wh.cursor() as cur:
            cur.execute(f"DROP VIEW IF EXISTS {quote(stream['serving_view'] + '_freshness')}, "
                        f"{quote(stream['serving_view'])}")
            cur.execute(f"DROP TABLE IF EXISTS {quote(stream['target_table'])}, {quote(pipe.spec.target_table)}")
            ledger.forget_pipeline(cur, pipe.spec.name)
        wh.close()
        delete_topic(settings.kafka_bootstrap, stream["topic"])
    print(json.dumps(result))
    return 0


def _peer(settings: Settings, unique: str, args, events_per_s: int) -> dict:
    """4. The peer: Debezium's JDBC sink draining a backlog of the same size and events."""
    import peers

    drained = peers.jdbc_sink_drain(settings, f"public.bench_{unique}_peer", args.backlog, PARTITIONS)
    return {**drained,
            "ratio_vs_debezium_jdbc_sink": round(events_per_s / drained["debezium_jdbc_sink_events_per_s"], 2)}


def _drain(settings: Settings, pipe, launcher: LocalLauncher, argv, env, args, result: dict) -> None:
    """1. Throughput: the sink drains a backlog of ``args.backlog`` events."""
    name, topic = pipe.spec.name, pipe.spec.stream.topic
    t0 = time.monotonic()
    _publish(settings, topic, 1, args.backlog)
    print(f"published a backlog of {args.backlog} events in {time.monotonic() - t0:.1f} s", flush=True)
    _start(launcher, pipe, argv, env)
    first = _first_commit_after(pipe, 0, 180)
    while (n := _count(pipe)) < args.backlog:  # (micro-batch rows of older fences are pruned: one instance here)
        if not launcher.status(name).alive:
            raise RuntimeError(f"the sink died draining the backlog:\n{launcher.log_tail(name, 40)}")
        print(f"  drained {n}/{args.backlog} ({100 * n / args.backlog:.0f}%), "
              f"{n / max(time.time() - first, 1e-3):.0f} events/s", flush=True)
        time.sleep(5)
    # from the first micro-batch's commit to the last one's: the events after the first, over that time
    batches = pipe.query_wh("SELECT events, extract(epoch FROM committed_at) FROM tidemark_control.sink_micro_batches "
                            "WHERE consumer = %s AND events > 0 ORDER BY committed_at",
                            (ledger.consumer_for(name),))
    if len(batches) < 3:
        raise RuntimeError(f"the backlog went through in {len(batches)} micro-batch(es): too few for a rate; "
                           "use a larger --backlog or a smaller --max-per-trigger")
    span = float(batches[-1][1]) - float(batches[0][1])
    result["events_per_s"] = round(sum(e for e, _ in batches[1:]) / span)
    result["drain_s"] = round(span, 1)
    result["micro_batches"] = len(batches)
    # where the drain's time went, from the steps of each micro-batch's line: Spark's read (with the
    # executors' checks of a backlog) against the apply in PostgreSQL (with any checks the driver
    # made); a standing sink reads N+1 while N applies, so the two shares may add up past 1
    # (only the drain's micro-batches are in the log so far; the first is outside the span, as in the rate)
    by_step: dict[str, float] = {}
    for steps in APPLY_LINE.findall(Path(launcher.log_location(name)).read_text())[1:]:
        for step, seconds in STEP.findall(steps):
            by_step[step] = by_step.get(step, 0.0) + float(seconds)
    read = sum(s for step, s in by_step.items() if step.startswith("spark read"))
    apply = sum(s for step, s in by_step.items()  # not waiting, nor the executors' own COPY time
                if not step.startswith(("spark read", "wait", "tasks'")))
    print("drain steps summed over its micro-batches: "
          + ", ".join(f"{step} {seconds:.1f} s" for step, seconds in sorted(by_step.items(), key=lambda i: -i[1])),
          flush=True)
    result["drain_read_share"] = round(read / span, 2)
    result["drain_apply_share"] = round(apply / span, 2)
    print(f"throughput: {sum(e for e, _ in batches[1:])} events in {len(batches) - 1} micro-batches over "
          f"{span:.1f} s = {result['events_per_s']} events/s; Spark's read and checks took "
          f"{result['drain_read_share']} of that time, the apply in PostgreSQL {result['drain_apply_share']} "
          "(overlapped: the two may add up past 1)", flush=True)


def _latency(settings: Settings, pipe, args, result: dict) -> None:
    """2. Latency at a fixed rate, publish to visible in the serving view."""
    serving_view = pipe.spec.stream.serving_view
    sent: dict[int, float] = {}
    seen: dict[int, float] = {}
    n_latency = int(args.rate * args.seconds)
    first_id = args.backlog + 1
    stop = threading.Event()
    stop_at = [0.0]

    def poll() -> None:
        upto = first_id - 1
        conn = pipe.wh()
        try:
            while not stop.is_set() or upto < first_id + n_latency - 1:
                with conn, conn.cursor() as cur:
                    cur.execute(f"SELECT id FROM {quote(serving_view)} WHERE id > %s AND id < %s",
                                (upto, first_id + n_latency))
                    now = time.time()
                    for (i,) in cur.fetchall():
                        seen[i] = now
                while upto + 1 in seen:
                    upto += 1
                if stop.is_set() and time.time() > stop_at[0] + 120:
                    break
                time.sleep(0.05)
        finally:
            conn.close()

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    _publish(settings, pipe.spec.stream.topic, first_id, n_latency, rate=args.rate, sent=sent)
    stop_at[0] = time.time()
    stop.set()
    poller.join(180)
    latencies = sorted((seen[i] - sent[i]) * 1000 for i in sent if i in seen)
    if len(latencies) != n_latency:
        raise RuntimeError(f"only {len(latencies)} of {n_latency} events became visible")
    result["rate"] = args.rate
    result["p50_ms"] = round(statistics.median(latencies))
    result["p99_ms"] = round(latencies[int(0.99 * (len(latencies) - 1))])
    print(f"latency at {args.rate:.0f} events/s for {args.seconds:.0f} s: p50 {result['p50_ms']} ms, "
          f"p99 {result['p99_ms']} ms", flush=True)


def _restart(settings: Settings, pipe, launcher: LocalLauncher, argv, env, args, result: dict) -> None:
    """3. Restart: kill -9, then the supervisor's start, while events keep arriving; every event once."""
    fence = _fence(pipe)
    restart_first = args.backlog + int(args.rate * args.seconds) + 1
    feeder = threading.Thread(target=_publish, args=(settings, pipe.spec.stream.topic, restart_first,
                                                     int(args.rate * 40)),
                              kwargs={"rate": args.rate}, daemon=True)
    feeder.start()
    time.sleep(2)
    killed = time.time()
    launcher.kill(pipe.spec.name)
    _start(launcher, pipe, argv, env)
    result["restart_s"] = round(_first_commit_after(pipe, fence, 180) - killed, 1)
    print(f"restart: kill -9 to the first committed micro-batch of the new instance: {result['restart_s']} s",
          flush=True)
    feeder.join(120)
    total = restart_first - 1 + int(args.rate * 40)
    deadline = time.monotonic() + 300
    while _count(pipe) < total and time.monotonic() < deadline:
        time.sleep(1)
    rows, distinct = pipe.query_wh(f"SELECT count(*), count(DISTINCT id) FROM {quote(pipe.spec.stream.target_table)}")[0]
    result["events_checked"] = rows
    if rows != total or distinct != total:
        raise RuntimeError(f"the real-time table holds {rows} rows ({distinct} ids) for {total} events published")


if __name__ == "__main__":
    sys.exit(main())

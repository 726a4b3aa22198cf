"""Benchmark: one incremental batch of ledger rows end to end, against two baselines on the same data.

1. The demo source gets ``--rows`` ledger entries (``tidemark_workshop.bank.bulk_ledger``), vacuumed.
2. Tidemark: plan, BEGIN, extract (spark-submit), END, sink (spark-submit), until the ledger says
   committed, exactly as the nightly DAG runs them.
3. The raw pipe ``COPY (SELECT ... window ...) TO STDOUT | COPY ... FROM STDIN`` between the
   source and warehouse databases.
4. A naive Spark JDBC copy (``bench/naive_jdbc_copy.py``): one JDBC read, one JDBC write.
5. With ``--peers`` (``make bench-peers``): the peer, Debezium's initial snapshot of the table and
   its JDBC sink's upserts on the stack's Kafka Connect worker (``bench/peers.py``):
   ``ratio_vs_debezium`` is Tidemark's time (Kafka transport) over the peer's.

Tidemark also loads the same rows with a standing sink (started before the plan, as the
supervisor keeps it for ``sink: {mode: standing}``), through Kafka and direct, and once more with its Spark jobs at ``local[1]`` instead of the stack's
``local[2]``: ``ratio_local2_vs_local1`` is rows/s at two cores over rows/s at one.

Each copies the same window into an empty table of the same shape, and each copy is checked
(row count and exact amounts per currency) before its time counts. JVM start-up (launch of
spark-submit until the Spark session is ready) is reported apart and not counted. Then, for
``--memory-rows``, batches of those sizes are loaded and the sink's peak resident memory (JVM
plus Python, sampled every 0.2 s) is reported per size.

The last line printed is one JSON object with the figures. The source's demo schema is reset
and the benchmark's tables and topics are dropped at the end.

  make bench                       # 2,000,000 rows; memory at 1,000,000 and 4,000,000
  python bench/batch_load.py --rows 20000 --memory-rows 10000,40000   # a quick look
  make bench BENCH_ARGS="--max-offsets-per-trigger 1000000"   # larger sink micro-batches
  make bench-peers                 # also the peer: Debezium's snapshot and JDBC sink (bench/peers.py)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import replace
from datetime import date
from pathlib import Path

import psutil
import psycopg2

from tidemark.ledger.catalog import ensure_target
from tidemark.protocol.kafka_io import delete_topic, ensure_topic
from tidemark.protocol.progress import parse_summaries
from tidemark.protocol.spec import PipelineSpec, load_spec, quote
from tidemark.protocol.window import predicate
from tidemark_workshop import bank
from tidemark_workshop.settings import WAREHOUSE_DB, Settings
from tidemark_workshop.stack.batchrun import Pipeline
from tidemark_workshop.stack.spark import PeakRss, Submitted, submit, submit_command

BENCH = Path(__file__).resolve().parent
SCHEMAS = {"tidemark": "bench_tidemark", "standing": "bench_tidemark_standing", "local1": "bench_tidemark_local1",
           "direct": "bench_tidemark_direct", "direct_standing": "bench_tidemark_direct_standing",
           "copy": "bench_copy", "spark_jdbc": "bench_spark_jdbc", "debezium": "bench_debezium"}
MB = 1024 * 1024


def say(message: str) -> None:
    print(f"[bench] {message}", flush=True)


class BenchError(RuntimeError):
    pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=2_000_000, help="ledger rows in the timed batch (even)")
    p.add_argument("--memory-rows", default="1000000,4000000",
                   help="comma-separated batch sizes at which to measure the sink's peak memory ('' skips)")
    p.add_argument("--no-baselines", action="store_true", help="time Tidemark only (to profile it)")
    p.add_argument("--partitions", type=int, default=3, help="Kafka partitions of the benchmark pipeline")
    p.add_argument("--record-format", choices=("avro", "json"), default="avro",
                   help="how Tidemark's records travel: avro (protocol version 2) or json (version 1)")
    p.add_argument("--max-offsets-per-trigger", type=int,
                   help="records per sink micro-batch at most, for every Tidemark contender (default: the spec's)")
    p.add_argument("--peers", action="store_true",
                   help="also time the peer: Debezium's snapshot and JDBC sink (bench/peers.py; make bench-peers)")
    args = p.parse_args(argv)
    sink = {"max_offsets_per_trigger": args.max_offsets_per_trigger} if args.max_offsets_per_trigger else {}
    memory_rows = [int(n) for n in args.memory_rows.split(",") if n.strip()]

    settings = Settings.from_env()
    src, wh = psycopg2.connect(settings.dsn(settings.source_db)), psycopg2.connect(settings.dsn(WAREHOUSE_DB))
    pipe = _pipeline(settings, args.partitions, "tidemark", args.record_format, sink)
    standing = _pipeline(settings, args.partitions, "standing", args.record_format, sink)
    # The same batch again with one core per Spark job: does the work spread over the two?
    one_core = _pipeline(replace(settings, spark_master="local[1]"), args.partitions, "local1", args.record_format, sink)
    # The same batch with transport: direct (the extract's tasks stage the rows; Kafka carries BEGIN and END)
    direct = _pipeline(settings, args.partitions, "direct", "avro", sink, transport="direct")
    direct_standing = _pipeline(settings, args.partitions, "direct_standing", "avro", sink, transport="direct")
    try:
        _reset(src, wh)
        bank.seed(src)
        _load_source(src, args.rows)
        result = {"rows": args.rows, "record_format": args.record_format, **({"sink": sink} if sink else {}),
                  **_tidemark(pipe, src, wh, args.rows)}
        where = predicate(pipe.spec, result.pop("window"))
        kept = _standing_sink(settings, standing, src, wh, args.rows, "standing")
        result.update(tidemark_standing_sink_s=kept["seconds"], standing_sink_peak_mb=kept["peak_mb"])
        result.update(_cores(one_core, src, wh, args.rows, result))
        result.update(_direct(direct, src, wh, args.rows, result))
        kept = _standing_sink(settings, direct_standing, src, wh, args.rows, "direct_standing")
        result.update(direct_standing_sink_s=kept["seconds"], direct_standing_sink_steps_s=kept["steps_s"])
        if not args.no_baselines:
            result["copy_s"] = _copy_pipe(settings, _empty_target(src, wh, "copy"), where)
            _check(src, wh, "copy", where, args.rows)
            result.update(_spark_jdbc(settings, _empty_target(src, wh, "spark_jdbc"), where))
            _check(src, wh, "spark_jdbc", where, args.rows)
            result["ratio_vs_copy"] = round(result["tidemark_s"] / result["copy_s"], 2)
            result["ratio_vs_spark_jdbc"] = round(result["tidemark_s"] / result["spark_jdbc_s"], 2)
            result["standing_sink_ratio_vs_copy"] = round(result["tidemark_standing_sink_s"] / result["copy_s"], 2)
            result["standing_sink_ratio_vs_spark_jdbc"] = round(
                result["tidemark_standing_sink_s"] / result["spark_jdbc_s"], 2)
            result["direct_ratio_vs_copy"] = round(result["direct_s"] / result["copy_s"], 2)
            result["direct_ratio_vs_spark_jdbc"] = round(result["direct_s"] / result["spark_jdbc_s"], 2)
            result["direct_standing_sink_ratio_vs_copy"] = round(result["direct_standing_sink_s"] / result["copy_s"], 2)
            result["direct_standing_sink_ratio_vs_spark_jdbc"] = round(
                result["direct_standing_sink_s"] / result["spark_jdbc_s"], 2)
        if args.peers:
            result.update(_debezium(settings, src, wh, where, args.rows, result))
        result["sink_peak_mb"] = {str(args.rows): result.pop("sink_peak_mb")}
        result["extract_peak_mb"] = {str(args.rows): result.pop("extract_peak_mb")}
        for n in memory_rows:
            _load_source(src, n)
            plan, _ = pipe.run(f"bench-memory-{n}")
            _check(src, wh, "tidemark", predicate(pipe.spec, plan.window), n)
            result["sink_peak_mb"][str(n)] = round(pipe.jobs[-1].peak_rss_bytes / MB)
            result["extract_peak_mb"][str(n)] = round(pipe.jobs[-2].peak_rss_bytes / MB)
            say(f"peak memory at {n} rows: sink {result['sink_peak_mb'][str(n)]} MB, "
                f"extract {result['extract_peak_mb'][str(n)]} MB")
        if memory_rows:
            for job in ("sink", "extract"):
                peaks = result[f"{job}_peak_mb"]
                sizes = sorted(peaks, key=int)
                result[f"{job}_memory_growth"] = round(peaks[sizes[-1]] / peaks[sizes[0]], 2)
    finally:
        _save_logs(settings, pipe)
        _save_logs(settings, direct, prefix="bench-direct")
        _clean(settings, src, wh, pipe, standing, one_core, direct, direct_standing)
        src.close()
        wh.close()
    print(json.dumps(result, sort_keys=True), flush=True)
    return 0


def _pipeline(settings: Settings, partitions: int, contender: str, record_format: str, sink: dict,
              transport: str = "kafka") -> Pipeline:
    """A fresh pipeline over the demo ledger (its own name, so its own topic and watermark)."""
    name = f"bench_ledger_{uuid.uuid4().hex[:8]}"
    spec = {
        "name": name, "table": f"{bank.SCHEMA}.ledger_entries", "primary_key": ["entry_id"],
        "cursor": {"kind": "timestamp", "column": "created_at"}, "safe_lag": "PT0S",
        "target_table": f"{SCHEMAS[contender]}.ledger_entries", "write_mode": "append_window_replace",
        "create_target_schema": True,
        "partitions": partitions, "record_format": record_format, "sink": sink, "transport": transport,
    }
    path = settings.state_dir / "bench" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(spec))  # JSON is YAML
    return Pipeline(settings, load_spec(path), path)


def _reset(src, wh) -> None:
    bank.reset(src)
    with wh, wh.cursor() as cur:
        for schema in SCHEMAS.values():
            cur.execute(f"DROP SCHEMA IF EXISTS {quote(schema)} CASCADE")


def _load_source(src, rows: int) -> None:
    t0 = time.monotonic()
    bank.bulk_ledger(src, rows, business_date=date.today())
    # Set hint bits and statistics now, so that no contender pays for them on its first read.
    src.autocommit = True
    with src.cursor() as cur:
        cur.execute(f"VACUUM ANALYZE {bank.SCHEMA}.ledger_entries")
    src.autocommit = False
    say(f"source: {rows} ledger rows written and vacuumed in {time.monotonic() - t0:.1f} s")


def _ready_at(job: Submitted) -> float:
    sessions = [s for s in parse_summaries(job.stdout) if s.get("step") == "spark-session"]
    if not sessions:
        raise BenchError(f"no Spark session line in the job's output:\n{job.stdout[-2000:]}\n{job.stderr[-3000:]}")
    return sessions[0]["ready_at"]


def _tidemark(pipe: Pipeline, src, wh, rows: int, contender: str = "tidemark") -> dict:
    t0 = time.time()
    plan = pipe.plan("bench-timed")
    attempt = pipe.begin(plan)
    t_begun = time.time()
    psutil.cpu_percent(None)  # the machine's CPU from here: are both cores busy, or waiting?
    report = pipe.extract(plan, attempt)
    busy = {"extract": psutil.cpu_percent(None)}
    t_extracted = time.time()
    pipe.end(plan, attempt, report)
    t_ended = time.time()
    psutil.cpu_percent(None)
    summary = pipe.sink()
    busy["sink"] = psutil.cpu_percent(None)
    t1 = time.time()
    state = pipe.state(plan.batch_id, attempt)
    if state != "committed" or report["rows"] != rows:
        raise BenchError(f"tidemark batch {plan.batch_id}: state {state}, {report['rows']} rows extracted, "
                         f"{rows} expected: {pipe.ledger(plan.batch_id)}")
    _check(src, wh, contender, predicate(pipe.spec, plan.window), rows)
    extract, sink = pipe.jobs[-2], pipe.jobs[-1]
    startup = {"extract": _ready_at(extract) - extract.started_at, "sink": _ready_at(sink) - sink.started_at}
    steps = {
        "plan_begin": t_begun - t0,
        "extract_work": t_extracted - _ready_at(extract),
        "end": t_ended - t_extracted,
        "sink_work": t1 - _ready_at(sink),
    }
    tidemark_s = (t1 - t0) - sum(startup.values())
    say(f"tidemark ({pipe.settings.spark_master}): {rows} rows committed as {plan.batch_id} attempt {attempt} in "
        f"{tidemark_s:.1f} s + {sum(startup.values()):.1f} s JVM start-up; sink staged {summary.get('staged')}")
    return {
        "window": plan.window,
        "tidemark_s": round(tidemark_s, 2),
        "tidemark_wall_s": round(t1 - t0, 2),
        "tidemark_steps_s": {k: round(v, 2) for k, v in steps.items()},
        "jvm_startup_s": {k: round(v, 2) for k, v in startup.items()},
        # machine-wide, all cores, over each job's whole run (its JVM start-up included)
        "cpu_busy_pct": {k: round(v) for k, v in busy.items()},
        "sink_peak_mb": round(sink.peak_rss_bytes / MB),
        "extract_peak_mb": round(extract.peak_rss_bytes / MB),
    }


def _standing_sink(settings: Settings, pipe: Pipeline, src, wh, rows: int, contender: str) -> dict:
    """The same batch with the sink already running, as ``sink: {mode: standing}`` keeps it (the
    supervisor): through Kafka the sink stages records while the extract writes them, and only the
    merge follows END; direct, the extract stages them and the sink verifies and applies after END.
    Returns the seconds from plan to commit, its steps and the sink's peak memory."""
    ensure_topic(settings.kafka_bootstrap, pipe.spec.topic, pipe.spec.partitions)
    log_path = settings.logs_dir / f"bench-{contender.replace('_', '-')}-sink.log"
    cmd, env = submit_command(settings, "batch_sink.py", pipe.sink_args(available_now=False), secret=settings.pg_password)
    with open(log_path, "w") as log_file:
        sink = subprocess.Popen(cmd, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
    with PeakRss(sink.pid) as memory:
        try:
            deadline = time.monotonic() + 120
            while not any(s.get("step") == "sink-started" for s in parse_summaries(log_path.read_text(errors="replace"))):
                if sink.poll() is not None or time.monotonic() > deadline:
                    raise BenchError(f"the standing sink did not start; see {log_path}")
                time.sleep(0.2)
            t0 = time.time()
            plan = pipe.plan("bench-standing")
            attempt = pipe.begin(plan)
            t_begun = time.time()
            report = pipe.extract(plan, attempt)
            t_extracted = time.time()
            pipe.end(plan, attempt, report)
            t_ended = time.time()
            while (state := pipe.state(plan.batch_id, attempt)) not in ("committed", "refused"):
                if sink.poll() is not None or time.time() - t0 > 1800:
                    raise BenchError(f"standing sink: batch {plan.batch_id} still {state}; see {log_path}")
                time.sleep(0.1)
            t1 = time.time()
        finally:
            os.killpg(sink.pid, signal.SIGTERM)  # its state is in the warehouse: stopping it loses nothing
            try:
                sink.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(sink.pid, signal.SIGKILL)
                sink.wait(10)
    if state != "committed":
        raise BenchError(f"standing sink: batch {plan.batch_id} {state}: {pipe.ledger(plan.batch_id)}")
    _check(src, wh, contender, predicate(pipe.spec, plan.window), rows)
    extract = pipe.jobs[-1]
    startup = _ready_at(extract) - extract.started_at
    seconds = (t1 - t0) - startup
    steps = {"plan_begin": t_begun - t0, "extract_work": t_extracted - _ready_at(extract), "end": t_ended - t_extracted,
             "sink_work": t1 - t_ended}  # the sink's work after END: what a standing sink leaves to do then
    say(f"tidemark ({pipe.spec.transport}) with a standing sink: {rows} rows committed in {seconds:.1f} s + {startup:.1f} s "
        f"extract JVM start-up (steps {', '.join(f'{k} {v:.1f} s' for k, v in steps.items())}); "
        f"sink peak memory {memory.peak_bytes / MB:.0f} MB")
    return {"seconds": round(seconds, 2), "steps_s": {k: round(v, 2) for k, v in steps.items()},
            "peak_mb": round(memory.peak_bytes / MB)}


def _cores(pipe: Pipeline, src, wh, rows: int, two_cores: dict) -> dict:
    """The timed batch's rows once more, with extract and sink at local[1]: rows/s against local[2]."""
    one_core = _tidemark(pipe, src, wh, rows, "local1")
    rates = {"local1": rows / one_core["tidemark_s"], "local2": rows / two_cores["tidemark_s"]}
    say(f"rows/s: {rates['local2']:,.0f} at local[2], {rates['local1']:,.0f} at local[1] "
        f"(steps at local[1]: {one_core['tidemark_steps_s']}, CPU busy {one_core['cpu_busy_pct']} %)")
    _save_logs(pipe.settings, pipe, "bench-local1")
    return {"rows_per_s": {k: round(v) for k, v in rates.items()}, "tidemark_local1_s": one_core["tidemark_s"],
            "cpu_busy_pct_local1": one_core["cpu_busy_pct"],
            # rows/s at two cores over rows/s at one, i.e. the one-core time over the two-core time
            "ratio_local2_vs_local1": round(one_core["tidemark_s"] / two_cores["tidemark_s"], 2)}


def _direct(pipe: Pipeline, src, wh, rows: int, kafka: dict) -> dict:
    """The timed batch again with transport: direct, beside the Kafka transport's figures."""
    direct = _tidemark(pipe, src, wh, rows, "direct")
    return {"direct_s": direct["tidemark_s"], "direct_steps_s": direct["tidemark_steps_s"],
            "direct_jvm_startup_s": direct["jvm_startup_s"], "direct_peak_mb": {"extract": direct["extract_peak_mb"],
                                                                                "sink": direct["sink_peak_mb"]},
            "ratio_direct_vs_kafka": round(direct["tidemark_s"] / kafka["tidemark_s"], 2)}


def _empty_target(src, wh, contender: str) -> str:
    """An empty table shaped like the source ledger, with its primary key, as Tidemark makes its target."""
    target = f"{SCHEMAS[contender]}.ledger_entries"
    shape = PipelineSpec.model_validate({
        "name": "bench_shape", "table": f"{bank.SCHEMA}.ledger_entries", "primary_key": ["entry_id"],
        "cursor": {"kind": "timestamp", "column": "created_at"}, "safe_lag": "PT0S", "target_table": target,
        "create_target_schema": True,
    })
    with src, src.cursor() as s, wh, wh.cursor() as w:
        ensure_target(s, w, shape)
    return target


def _copy_pipe(settings: Settings, target: str, where: str) -> float:
    """Seconds for COPY TO STDOUT on the source piped into COPY FROM STDIN on the warehouse."""
    reader = psycopg2.connect(settings.dsn(settings.source_db))
    writer = psycopg2.connect(settings.dsn(WAREHOUSE_DB))
    read_fd, write_fd = os.pipe()
    failed: list[BaseException] = []

    def produce() -> None:
        try:
            with os.fdopen(write_fd, "wb") as out, reader.cursor() as cur:
                cur.copy_expert(f"COPY (SELECT * FROM {bank.SCHEMA}.ledger_entries WHERE {where}) TO STDOUT", out)
        except BaseException as exc:  # noqa: BLE001 -- re-raised below, after the consumer saw EOF
            failed.append(exc)

    t0 = time.monotonic()
    producer = threading.Thread(target=produce)
    producer.start()
    try:
        with os.fdopen(read_fd, "rb") as inp, writer.cursor() as cur:
            cur.copy_expert(f"COPY {quote(target)} FROM STDIN", inp)
        producer.join()
        if failed:
            raise BenchError(f"COPY TO STDOUT failed: {failed[0]}")
        writer.commit()
        seconds = time.monotonic() - t0
    finally:
        producer.join()
        reader.close()
        writer.close()
    say(f"copy pipe: {seconds:.1f} s")
    return round(seconds, 2)


def _spark_jdbc(settings: Settings, target: str, where: str) -> dict:
    job = submit(settings, BENCH / "naive_jdbc_copy.py", [
        *settings.database_args(settings.source_db),
        "--query", f"SELECT * FROM {bank.SCHEMA}.ledger_entries WHERE {where}",
        "--target-database", settings.database_args(WAREHOUSE_DB)[1], "--target-table", target,
    ], secret=settings.pg_password, timeout_s=3600)
    done = time.time()
    if job.returncode != 0:
        raise BenchError(f"naive Spark JDBC copy failed:\n{job.stdout[-3000:]}\n{job.stderr[-5000:]}")
    ready = _ready_at(job)
    seconds = done - ready
    say(f"naive Spark JDBC: {seconds:.1f} s + {ready - job.started_at:.1f} s JVM start-up")
    return {"spark_jdbc_s": round(seconds, 2), "spark_jdbc_jvm_startup_s": round(ready - job.started_at, 2)}


def _debezium(settings: Settings, src, wh, where: str, rows: int, result: dict) -> dict:
    """The peer on the same rows: Debezium's snapshot of the whole source table and its JDBC sink."""
    import peers

    with src, src.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM {bank.SCHEMA}.ledger_entries")
        (in_table,) = cur.fetchone()  # the snapshot takes the table, the others the window (the same rows here)
    seconds = peers.debezium_copy(settings, f"{bank.SCHEMA}.ledger_entries", _empty_target(src, wh, "debezium"),
                                  in_table)
    _check(src, wh, "debezium", where, rows)
    return {"debezium_s": seconds, "debezium_rows": in_table,
            "ratio_vs_debezium": round(result["tidemark_s"] / seconds, 2),
            "direct_ratio_vs_debezium": round(result["direct_s"] / seconds, 2),
            **({"debezium_ratio_vs_copy": round(seconds / result["copy_s"], 2)} if "copy_s" in result else {})}


def _check(src, wh, contender: str, where: str, rows: int) -> None:
    """The contender's table holds exactly the source window: count and amounts per currency."""
    expected = bank.source_totals(src, where=where)
    actual = bank.source_totals(wh, f"{SCHEMAS[contender]}.ledger_entries", where=where)
    if expected != actual or expected.rows < rows:
        raise BenchError(f"{contender}: target {actual} differs from source window {expected} ({rows} rows loaded)")


def _save_logs(settings: Settings, pipe: Pipeline, prefix: str = "bench") -> None:
    """Each Spark job's output, to see where the time went."""
    settings.logs_dir.mkdir(parents=True, exist_ok=True)
    for i, job in enumerate(pipe.jobs):
        script = next(Path(a).stem for a in job.args if a.endswith(".py"))
        (settings.logs_dir / f"{prefix}-{i:02d}-{script}.log").write_text(f"{job.stdout}\n{job.stderr}")


def _clean(settings: Settings, src, wh, *pipes: Pipeline) -> None:
    src.rollback()
    wh.rollback()
    _reset(src, wh)
    for pipe in pipes:
        delete_topic(settings.kafka_bootstrap, pipe.spec.topic)
        pipe.path.unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(main())

"""Where the sink's Spark job spends its time: the same batch read, cut short at each step.

Loads ``--rows`` ledger rows into the demo source and extracts them as one protocol-version-2 batch
onto a fresh pipeline topic (its attempt stays open), then runs one Spark job, with the sink's own
settings, that batch-reads the whole topic and times each of these ``--rounds`` times:

  1 kafka read        the Kafka source alone (every raw column, written to Spark's noop sink)
  2 + headers, hash   the sink's columns: control, batch and attempt headers, the row hash
  3 + decode, checks  Avro decoded and checked in the JVM (tidemark.protocol.avro.decode)
  4 + to Python       every column to a Python worker and back, nothing done (mapInArrow)
  5 + split, encode   the stage's split and binary encoding, no COPY; only totals come back
  6 + COPY            the sink's job: the tasks COPY into the stage (tidemark.batch.stage)

A step's cost is its time minus the step before. The first round warms the JVM and is left out of
the medians. The last line printed is one JSON object: per step, the median seconds and records/s.
At the end the attempt is aborted, its stage dropped, the topic deleted and the source reset.

  make profile-sink                                  # 400,000 rows, 3 rounds
  make profile-sink BENCH_ARGS="--rows 1000000"
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

STEPS = ["1 kafka read", "2 + headers, hash", "3 + decode, checks", "4 + to Python", "5 + split, encode", "6 + COPY"]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=400_000, help="ledger rows in the batch (even)")
    p.add_argument("--rounds", type=int, default=3, help="runs of every step; the first is warm-up")
    p.add_argument("--master", default=None, help="Spark master (default: the stack's, local[2])")
    p.add_argument("--in-spark", nargs=4, metavar=("DATABASE", "USER", "SPEC", "BOOTSTRAP"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.in_spark:
        return _job(*args.in_spark, rounds=args.rounds)
    return _profile(args)


def _profile(args) -> int:
    import psycopg2

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import batch_load as bench
    from tidemark import ledger
    from tidemark.protocol.spec import quote
    from tidemark.sink import stage_table
    from tidemark_workshop import bank
    from tidemark_workshop.settings import WAREHOUSE_DB, Settings
    from tidemark_workshop.stack.spark import submit_command

    settings = Settings.from_env()
    if args.master:
        settings = replace(settings, spark_master=args.master)
    src, wh = psycopg2.connect(settings.dsn(settings.source_db)), psycopg2.connect(settings.dsn(WAREHOUSE_DB))
    pipe = bench._pipeline(settings, 3, "tidemark", "avro", {})
    try:
        bench._reset(src, wh)
        bank.seed(src)
        bench._load_source(src, args.rows)
        plan = pipe.plan("profile")
        attempt = pipe.begin(plan)
        pipe.extract(plan, attempt)
        cmd, env = submit_command(settings, Path(__file__).resolve(),
                                  ["--in-spark", settings.database_args(WAREHOUSE_DB)[1], settings.pg_user, str(pipe.path),
                                   settings.kafka_bootstrap, "--rounds", str(args.rounds)], secret=settings.pg_password)
        job = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
        lines = [line for line in job.stdout.splitlines() if line.startswith("[profile]")]
        print("\n".join(lines), flush=True)
        if job.returncode != 0 or not lines:
            print(job.stderr[-3000:], file=sys.stderr)
            return 1
        pipe.abort(plan, attempt, "profile done")
        with wh, wh.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS {quote(stage_table(plan.batch_id, attempt))}")
            ledger.forget_staged(cur, plan.batch_id, attempt)
    finally:
        bench._clean(settings, src, wh, pipe)
        src.close()
        wh.close()
    return 0


def _job(database: str, user: str, spec_path: str, bootstrap: str, *, rounds: int) -> int:
    import pyarrow as pa
    from pyspark import cloudpickle
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema
    from pyspark.sql.types import StructField, StructType

    from tidemark.batch import stage
    from tidemark.protocol import avro, pgbinary, totals
    from tidemark.protocol.control import HEADER_ATTEMPT, HEADER_BATCH, HEADER_CONTROL, Keyring
    from tidemark.protocol.spec import load_spec
    from tidemark.sink import BatchSink
    from tidemark.spark.entry import connect, connect_params, password, session
    from tidemark.spark.jobs import PASSWORD_ENV

    secret = password(argparse.Namespace(password_env=PASSWORD_ENV))  # as submit_command passes it
    spec = load_spec(Path(spec_path))
    sink = BatchSink(connect(database, user, secret), spec, keyring=Keyring.from_env())  # as the sink job reads it
    sink.acquire_fence()
    formats = sink.formats()
    for module in (stage, totals, pgbinary):
        cloudpickle.register_pickle_by_value(module)
    spark = session("tidemark-sink-profile")

    def header(name: str):
        return F.expr(f"try_element_at(filter(headers, h -> h.key = '{name}'), 1).value").cast("string")

    raw = (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", spec.topic)
           .option("startingOffsets", "earliest").option("endingOffsets", "latest")
           .option("kafka.isolation.level", "read_committed").option("includeHeaders", "true")
           .option("maxRecordsPerPartition", spec.sink.max_records_per_task).load())
    key, value = F.col("key").cast("string"), F.col("value").cast("string")
    records = raw.select(F.col("topic"), F.col("partition"), F.col("offset"), F.col("key"), F.col("value"),
                         header(HEADER_CONTROL).alias("control"), header(HEADER_BATCH).alias("batch_id"),
                         header(HEADER_ATTEMPT).try_cast("int").alias("attempt"),
                         F.xxhash64(key, value).alias("row_hash"))
    decoded = avro.decode(records, formats, spec.topic, list(spec.primary_key), spec.cursor.column,
                          spec.max_record_bytes)
    schema = StructType([*(StructField(f.name, f.dataType, True) for f in decoded.schema.fields),
                         *from_arrow_schema(stage.load_schema()).fields])
    writer = sink.stager(formats, connect_params(database, user, secret))

    class EncodeOnly(stage.StageWriter):  # the stage's split and encoding, its COPY left out
        def _stage(self, held, batch_schema):
            for attempt_key, parts in held.items():
                target, table = self.targets[attempt_key], pa.Table.from_batches(parts, schema=batch_schema)
                pgbinary.encode([*table[target.row].combine_chunks().flatten(), pa.array([0] * table.num_rows)],
                                [*target.types, "bigint"])
                yield stage._load_rows(table, attempt_key, 0, 0.0)

    def to_python(batches):
        for batch in batches:
            yield stage._with_load(batch, None)

    def noop(df):
        df.write.format("noop").mode("overwrite").save()

    runs = dict(zip(STEPS, [
        lambda: noop(raw), lambda: noop(records), lambda: noop(decoded),
        lambda: noop(decoded.mapInArrow(to_python, schema)),
        lambda: decoded.mapInArrow(EncodeOnly(writer._connect, writer.topic, writer.targets, writer.next_offsets),
                                   schema).toArrow(),
        lambda: decoded.mapInArrow(writer, schema).toArrow(),
    ]))
    n = records.count()
    seconds: dict[str, list[float]] = {step: [] for step in STEPS}
    for r in range(rounds):
        for step, run in runs.items():
            started = time.perf_counter()
            run()
            seconds[step].append(time.perf_counter() - started)
            print(f"[profile] round {r}: {step}: {seconds[step][-1]:.2f} s, {n / seconds[step][-1]:,.0f} records/s",
                  flush=True)
    warm = {step: s[1:] or s for step, s in seconds.items()}
    print("[profile] " + json.dumps({"records": n, "rounds": rounds, "master": spark.sparkContext.master,
                                     "median_s": {k: round(statistics.median(v), 2) for k, v in warm.items()},
                                     "records_per_s": {k: round(n / statistics.median(v)) for k, v in warm.items()}}),
          flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

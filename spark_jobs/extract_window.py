"""Extract one batch window from the source to the pipeline topic, with its END totals.

Reads ``lo < (cursor, pk) and cursor <= hi`` over JDBC in parallel cursor ranges, writes each row
as JSON (protocol version 1) or Avro (version 2, ``--avro-schema``) keyed by primary key to the
partition Kafka's murmur2 partitioner gives the key, tagged with the batch id and attempt in
headers, and in the same pass counts rows and sums 64-bit row hashes per partition. The totals go
to ``--report`` (JSON) for the END step. Any inconsistency (rows outside the window, Kafka offsets
that moved by other amounts than counted) exits 3.

  spark-submit spark_jobs/extract_window.py --database 'host=127.0.0.1 port=25432 dbname=src' \
      --user tidemark --password-env PW --spec include/pipelines/ledger_entries.yaml \
      --batch-id B --attempt 1 --window '{"lo": ..., "hi": ...}' --bootstrap 127.0.0.1:29092 \
      --report /tmp/report.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def parse_args(argv: list[str]) -> argparse.Namespace:
    from tidemark.spark.entry import database_args

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    database_args(p)
    p.add_argument("--spec", required=True, type=Path, help="the pipeline's YAML spec")
    p.add_argument("--batch-id", required=True)
    p.add_argument("--attempt", required=True, type=int)
    p.add_argument("--window", required=True, help="the planned window as JSON")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--report", required=True, type=Path, help="where to write the per-partition totals")
    p.add_argument("--read-partitions", type=int, default=4, help="parallel JDBC range reads")
    p.add_argument("--repair-keys", type=Path, help="a repair batch: JSON document of the only keys to read")
    p.add_argument("--avro-schema", help="protocol version 2: the Avro writer schema of the batch's records "
                                         "(default: version 1, JSON)")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from pyspark.sql import functions as F
    from pyspark.sql.types import IntegerType

    from tidemark import avro, extract, repair, totals
    from tidemark.control import HEADER_ATTEMPT, HEADER_BATCH
    from tidemark.kafka_io import end_offsets
    from tidemark.progress import Steps, Ticker
    import psycopg2

    from tidemark.spark.entry import (JSON_OPTIONS, JobError, TransientJobError, jdbc_url, password, session,
                                      side_queries)
    from tidemark.spec import load_spec, quote
    from tidemark.progress import summary_line
    from tidemark.window import Window, split_predicates

    spec = load_spec(args.spec)
    window = Window.from_json(args.window)
    secret = password(args)
    tag = f"pipeline={spec.name} batch={args.batch_id} attempt={args.attempt} window={window}"
    started = time.monotonic()
    # One task failure fails the job: a retried Kafka write would duplicate records of this attempt.
    spark = session(f"tidemark-extract-{spec.name}", **{"spark.task.maxFailures": 1})
    try:
        spark.udf.registerJavaFunction("kafka_partition", "tidemark.KafkaPartition", IntegerType())
        props = {"user": args.user, "password": secret, "driver": "org.postgresql.Driver", "fetchsize": "20000"}
        table = quote(spec.table)
        if args.repair_keys is not None:  # a repair batch: only its keys, still inside the window
            keys = repair.read_document(args.repair_keys, spec)
            table = f"(SELECT * FROM {table} WHERE {repair.filter_from_document(keys)}) AS repair"
            tag += f" repair of {len(keys['keys'])} key(s)"
        steps = Steps()
        with steps.step("span query"):  # straight to the source: a Spark job for one row cost seconds
            with side_queries(args.database, args.user, secret, application=application_name(spec.name)) as source, \
                    source.cursor() as cur:
                numerics, temporal = extract.kinds_of_columns(cur, spec)
                lo, hi, n, infinite = extract.read_span(cur, spec, window, table, temporal)
                if infinite:
                    found = extract.unrepresentable(cur, spec, window, table, temporal, extract.INFINITE)
                    if not found:  # corrected between the two queries: the next attempt reads them
                        raise TransientJobError(f"{tag}: {infinite} row(s) with an infinite date or timestamp "
                                                "changed while being named; a new attempt reads the window again")
                    raise JobError(extract.unrepresentable_error(tag, spec, found, temporal=True))
                try:
                    histogram = extract.cursor_histogram(cur, spec)
                except psycopg2.Error as exc:  # statistics are advice: even cuts then
                    print(f"{tag}: no cursor histogram from the source ({' '.join(str(exc).split())}); "
                          "reads cut evenly", flush=True)
                    histogram = None
        cuts = extract.balanced_edges(histogram, lo, hi, args.read_partitions)
        how = "even steps" if cuts == extract.edges(lo, hi, args.read_partitions) else "the source's histogram"
        # Each parallel read is one cursor in one transaction (the driver streams rows only outside
        # autocommit): `idle in transaction` between fetches while its rows go to Kafka, committed
        # and closed when its task ends (Spark's JDBC reader). Named, so pg_stat_activity tells whose.
        df = spark.read.jdbc(jdbc_url(args.database, application=application_name(spec.name)), table,
                             predicates=split_predicates(spec, window, cuts), properties=props)
        missing = [c for c in (*spec.primary_key, spec.cursor.column) if c not in df.columns]
        if missing:
            raise JobError(f"{tag}: source table {spec.table} has no column(s) {missing}")
        value = (avro.encode(args.avro_schema) if args.avro_schema
                 else F.to_json(F.struct(*[F.col(c) for c in df.columns]), JSON_OPTIONS))
        records = df.select(
            avro.record_key([F.col(c) for c in spec.primary_key]).alias("key"), value.alias("value"),
            F.col(spec.cursor.column).alias("_cursor"),
        ).select(
            "key", "value", "_cursor",
            F.expr(f"kafka_partition(key, {spec.partitions})").alias("partition"),
            F.xxhash64("key", "value").alias("row_hash"),
        )
        headers = F.array(
            F.struct(F.lit(HEADER_BATCH).alias("key"), F.lit(args.batch_id).cast("binary").alias("value")),
            F.struct(F.lit(HEADER_ATTEMPT).alias("key"), F.lit(str(args.attempt)).cast("binary").alias("value")),
        )
        # One pass, all in the JVM: each record adds to the totals on its way to Kafka (tally()
        # returns its partition), so the totals describe exactly the records written, the source is
        # read once, and nothing is held in memory. Each task's update counts once (result stage,
        # spark.task.maxFailures=1).
        tally = spark._jvm.tidemark.Tally.register(spark._jsparkSession, "tally")
        as_long = "unix_micros(_cursor)" if spec.cursor.kind == "timestamp" else "CAST(_cursor AS BIGINT)"

        before = end_offsets(args.bootstrap, spec.topic)
        print(f"{tag}: {n} rows to extract, in {args.read_partitions} parallel reads cut at "
              f"{', '.join(map(str, cuts)) or 'nothing'} ({how})",
              flush=True)

        def written() -> int:  # the writer is not transactional: its records count as they land
            now = end_offsets(args.bootstrap, spec.topic)
            return sum(now.get(p, 0) - before.get(p, 0) for p in range(spec.partitions))

        try:
            with Ticker(tag, "written to Kafka", written, n), steps.step("read, encode, write"):
                (
                    records.select("key", "value", F.expr(f"tally(partition, row_hash, {as_long})").alias("partition"))
                    .withColumn("headers", headers)
                    .write.format("kafka")
                    .option("kafka.bootstrap.servers", args.bootstrap)
                    .option("kafka.enable.idempotence", "true")
                    .option("kafka.acks", "all")
                    .option("kafka.linger.ms", "20")  # fuller batches: a third less time on 2M records
                    .option("kafka.batch.size", str(1 << 20))
                    .option("topic", spec.topic)
                    .save()
                )
        except Exception:
            unreadable = _non_finite(args, secret, spec, window, table, numerics) if numerics else []
            if unreadable:  # the same rows fail every retry: say which, and what will work
                raise JobError(extract.unrepresentable_error(tag, spec, unreadable, temporal=False)) from None
            raise
        write_s = time.monotonic() - started
        with steps.step("offsets check"):
            after = end_offsets(args.bootstrap, spec.topic)
        counted = totals.from_tally(tally.text(), timestamps=spec.cursor.kind == "timestamp")
        # an ExtractError (terminal) or ExtractInterrupted (transient): run() exits 3 or 4 with its line
        report = extract.report(counted, spec.partitions)
        extract.check_read_range(tag, window, counted)
        extract.check_offsets(tag, before, after, report, spec.partitions)
        rows = sum(t["rows"] for t in report.values())
        # The offsets it wrote, per partition [first, next): exactly its records (check_offsets), so the
        # sink can tell them from any record another producer sent with the attempt's headers.
        offsets = {str(p): [before.get(p, 0), after.get(p, 0)] for p in range(spec.partitions)}
        args.report.write_text(json.dumps({"totals": report, "offsets": offsets, "rows": rows,
                                           "seconds": round(time.monotonic() - started, 3)}))
        print(summary_line("extract", pipeline=spec.name, batch_id=args.batch_id, attempt=args.attempt,
                           window=str(window), rows=rows, read_and_write_s=round(write_s, 1), steps_s=steps.rounded(),
                           partitions={p: t["rows"] for p, t in report.items()}), flush=True)
    finally:
        spark.stop()
    return 0


def application_name(pipeline: str) -> str:
    """The extract's sessions on the source, as pg_stat_activity names them (its Spark app's name)."""
    return f"tidemark-extract-{pipeline}"


def _non_finite(args: argparse.Namespace, secret: str, spec, window, relation: str, numerics: list[str]) -> list[str]:
    """After a failed read: the window's NaN and infinite numerics (none if the source cannot say)."""
    from tidemark import extract
    from tidemark.spark.entry import side_queries

    try:
        with side_queries(args.database, args.user, secret, application=application_name(spec.name)) as source, \
                source.cursor() as cur:
            return extract.unrepresentable(cur, spec, window, relation, numerics, extract.NAN_OR_INFINITE)
    except Exception:  # the diagnosis must never hide the read's own error
        return []


if __name__ == "__main__":
    from tidemark.spark.entry import run

    sys.exit(run(main, sys.argv[1:], "extract_window"))

"""The extract's Spark driver: what ``spark_jobs/extract_window.py`` runs with its parsed arguments.

``run`` asks the source for the window's span (straight, not through Spark), cuts it into parallel
JDBC range reads, writes every row to the pipeline topic keyed and partitioned as Kafka's murmur2
partitioner would, counting and summing row hashes per partition on the way (in the JVM), checks
the counts against the read range and the topic's offsets, and writes the report the END step
sends. Only the Spark driver imports this module.
"""

from __future__ import annotations

import json
import time
from argparse import Namespace
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tidemark.batch import repair
from tidemark.batch.extract import decisions as extract
from tidemark.batch.extract import direct, snapshot
from tidemark.batch.extract.attempt import Extract, non_finite, source_session
from tidemark.protocol import avro, totals
from tidemark.protocol.control import HEADER_ATTEMPT, HEADER_BATCH
from tidemark.protocol.kafka_io import end_offsets
from tidemark.protocol.progress import Steps, Ticker, summary_line
from tidemark.protocol.spec import load_spec, quote
from tidemark.protocol.window import Window, split_predicates
from tidemark.realtime.cdc import handoff as cdc_handoff
from tidemark.spark.entry import JobError, TransientJobError, connect_params, jdbc_url, password, session

FETCH_SIZE = "20000"  # rows per round trip of each parallel read


def run(args: Namespace) -> int:
    x = prepare(args)
    with reading_in_snapshot(x):
        return read_and_write(x)


@contextmanager
def reading_in_snapshot(x: Extract) -> Iterator[None]:
    """Every read of the attempt, on every partition, in one snapshot of the source, held for the whole
    extract (``tidemark.batch.extract.snapshot``).

    A handoff batch takes it from the pipeline's replication slot, created with an exported snapshot
    (dropped if the extract fails), and reads its window opened above: the rows after its end are in
    no later change event, and the next batch reads them again (a CDC pipeline upserts). Any other
    batch reads the window the orchestrator gave it (the ledger's records window: opened above for an
    upsert pipeline's scheduled batch, ``tidemark.ledger.records_window``). The ledger's window, and
    so the watermark, stay as planned either way."""
    spec = x.spec
    params = connect_params(x.args.database, x.args.user, x.secret, application=x.application)
    if not x.args.handoff:  # a capture group member's batch commits once the group's stream passed its snapshot
        with snapshot.exported(params, wal=spec.cdc is not None and spec.cdc.group is not None) as s:
            x.snapshot, x.taken = s.name, s
            print(f"{x.tag}: reading in one snapshot of the source, taken at {s.taken_at} ({s.seen}), held at most "
                  f"max_snapshot_hold {spec.max_snapshot_hold}", flush=True)
            yield
        return
    if spec.cdc is None or x.args.repair_keys is not None:
        raise JobError(f"{x.tag}: --handoff is for a CDC pipeline's batch (spec section cdc:), never a repair")
    _check_capture(x, params)
    if spec.cdc.group is not None:  # the group's slot is made once, by its first member's handoff
        with cdc_handoff.member_handoff(params, spec.cdc_slot, spec.cdc_slot,
                                        lambda: snapshot.exported(params, wal=True)) as h:
            x.handoff, x.snapshot, x.window = h, h.snapshot, x.window.opened_above()
            print(f"{x.tag}: CDC handoff of a member of capture group {spec.cdc.group}: slot {h.slot}, snapshot "
                  f"{h.snapshot} at {h.consistent_point}; reading {x.window} in it", flush=True)
            yield
        return
    # the ledger planned a handoff: no committed one exists, so a slot left by a killed attempt is stale
    with cdc_handoff.exported_snapshot(params, spec.cdc_slot, spec.cdc_slot, replace_stale=True) as h:
        x.handoff, x.snapshot, x.window = h, h.snapshot, x.window.opened_above()
        print(f"{x.tag}: CDC handoff: slot {h.slot} created at {h.consistent_point}, snapshot {h.snapshot}; "
              f"reading {x.window} in it", flush=True)
        yield


def _check_capture(x: Extract, params: dict) -> None:
    """Before a handoff reads as the replication role: the source is set up for its capture, or the job fails
    naming each missing statement (not with the first ``permission denied`` its read would meet)."""
    import psycopg2
    import psycopg2.errors

    from tidemark.realtime.cdc.groups import load_capture
    from tidemark.realtime.cdc.source import CaptureNotReady, check_capture

    capture = load_capture(x.spec, Path(x.args.spec).parent)
    conn = psycopg2.connect(**params)
    try:
        with conn, conn.cursor() as cur:
            check_capture(cur, capture, x.args.user)
    except CaptureNotReady as exc:
        missing = "; ".join(exc.missing)
    except psycopg2.errors.InsufficientPrivilege as exc:  # no USAGE on the schema: not even its catalog is readable
        missing = f"role {x.args.user} may not look into the table's schema ({' '.join(str(exc).split())})"
    else:
        return
    finally:
        conn.close()
    raise JobError(f"{x.tag}: {capture.describe()}: the source is not set up for its handoff: {missing}. Next: have "
                   f"the tables' owner run what `python -m tidemark.realtime.cdc.grants {x.spec.name}` prints (`make grants "
                   f"P={x.spec.name}` on the local stack), then run this batch again")


def read_and_write(x: Extract) -> int:
    args = x.args
    started, steps = time.monotonic(), Steps()
    # One task failure fails the job: a retried Kafka write would duplicate records of this attempt.
    spark = session(x.application, **{"spark.task.maxFailures": 1})
    try:
        from pyspark.sql.types import IntegerType

        spark.udf.registerJavaFunction("kafka_partition", "tidemark.KafkaPartition", IntegerType())
        with steps.step("span query"):  # straight to the source: a Spark job for one row cost seconds
            numerics, lo, hi, n, bounds = span(x)
        cuts = extract.balanced_edges(bounds, lo, hi, args.read_partitions)
        how = "even steps" if cuts == extract.edges(lo, hi, args.read_partitions) else "the source's histogram"
        records = encoded(x, source_rows(spark, x, cuts))
        # One pass, all in the JVM: each record adds to the totals on its way to Kafka (tally()
        # returns its partition), so the totals describe exactly the records written, the source is
        # read once, and nothing is held in memory. Each task's update counts once (result stage,
        # spark.task.maxFailures=1).
        tally = spark._jvm.tidemark.Tally.register(spark._jsparkSession, "tally")
        print(f"{x.tag}: {n} rows to extract, in {args.read_partitions} parallel reads cut at "
              f"{', '.join(map(str, cuts)) or 'nothing'} ({how}), {'straight to the stage' if args.warehouse else 'to the topic'}",
              flush=True)

        def counted():
            return totals.from_tally(tally.text(), timestamps=x.spec.cursor.kind == "timestamp")

        watchdog = snapshot.Watchdog(x.spec.max_snapshot_hold, spark.sparkContext.cancelAllJobs)
        try:
            with watchdog:
                if args.warehouse:
                    loads = direct.stage(x, records, n, numerics, steps)
                else:
                    before = end_offsets(args.bootstrap, x.spec.topic)
                    write(x, records, before, n, numerics, steps)
        except Exception:
            if watchdog.fired:
                raise watchdog.error(x.tag, x.spec.name) from None
            raise
        if args.warehouse:
            report_totals(x, counted(), {}, {}, started, time.monotonic() - started, steps, loads=loads)
            return 0
        write_s = time.monotonic() - started
        with steps.step("offsets check"):
            after = end_offsets(args.bootstrap, x.spec.topic)
        report_totals(x, counted(), before, after, started, write_s, steps)
    finally:
        spark.stop()
    return 0


def prepare(args: Namespace) -> Extract:
    spec = load_spec(args.spec)
    window = Window.from_json(args.window)
    tag = f"pipeline={spec.name} batch={args.batch_id} attempt={args.attempt} window={window}"
    relation = quote(spec.table)
    if args.repair_keys is not None:  # a repair batch: only its keys, still inside the window
        keys = repair.read_document(args.repair_keys, spec)
        relation = f"(SELECT * FROM {relation} WHERE {repair.filter_from_document(keys)}) AS repair"
        tag += f" repair of {len(keys['keys'])} key(s)"
    return Extract(args, spec, window, password(args), relation, tag)


def span(x: Extract):
    """The window's numeric columns, smallest and largest cursor, row count and the cursor's
    histogram; a row with an infinite date or timestamp (no JSON or Avro form) fails the extract
    by key."""
    with source_session(x) as source, source.cursor() as cur:
        numerics, temporal = extract.kinds_of_columns(cur, x.spec)
        lo, hi, n, infinite = extract.read_span(cur, x.spec, x.window, x.relation, temporal)
        if infinite:
            found = extract.unrepresentable(cur, x.spec, x.window, x.relation, temporal, extract.INFINITE)
            if not found:  # corrected between the two queries: the next attempt reads them
                raise TransientJobError(f"{x.tag}: {infinite} row(s) with an infinite date or timestamp "
                                        "changed while being named; a new attempt reads the window again")
            raise JobError(extract.unrepresentable_error(x.tag, x.spec, found, temporal=True))
        return numerics, lo, hi, n, histogram(x, cur)


def histogram(x: Extract, cur):
    """The source's statistics of the cursor, to cut reads of equal size (None: cut evenly)."""
    import psycopg2

    try:
        return extract.cursor_histogram(cur, x.spec)
    except psycopg2.Error as exc:  # statistics are advice: even cuts then
        print(f"{x.tag}: no cursor histogram from the source ({' '.join(str(exc).split())}); reads cut evenly",
              flush=True)
        return None


def source_rows(spark, x: Extract, cuts):
    """The window's rows, one parallel JDBC read per range between ``cuts``.

    Each read is one cursor in one transaction (the driver streams rows only outside autocommit):
    `idle in transaction` between fetches while its rows go to Kafka, committed and closed when its
    task ends (Spark's JDBC reader). Named, so pg_stat_activity tells whose."""
    # lower-case fetchsize: Spark then reads in a transaction, which the snapshot's import needs
    props = {"user": x.args.user, "password": x.secret, "driver": "org.postgresql.Driver", "fetchsize": FETCH_SIZE}
    if x.snapshot is not None:
        props["sessionInitStatement"] = snapshot.snapshot_init(x.snapshot)
    df = spark.read.jdbc(jdbc_url(x.args.database, application=x.application), x.relation,
                         predicates=split_predicates(x.spec, x.window, cuts), properties=props)
    missing = [c for c in (*x.spec.primary_key, x.spec.cursor.column) if c not in df.columns]
    if missing:
        raise JobError(f"{x.tag}: source table {x.spec.table} has no column(s) {missing}")
    return df


def encoded(x: Extract, df):
    """Each row as a record: key, value (JSON, protocol version 1, or Avro, version 2), cursor,
    partition and row hash."""
    from pyspark.sql import functions as F

    spec = x.spec
    value = (avro.encode(x.args.avro_schema) if x.args.avro_schema
             else F.to_json(F.struct(*[F.col(c) for c in df.columns]), avro.JSON_OPTIONS))
    return df.select(
        avro.record_key([F.col(c) for c in spec.primary_key]).alias("key"), value.alias("value"),
        F.col(spec.cursor.column).alias("_cursor"),
    ).select(
        "key", "value", "_cursor",
        F.expr(f"kafka_partition(key, {spec.partitions})").alias("partition"),
        F.xxhash64("key", "value").alias("row_hash"),
    )


def write(x: Extract, records, before: dict[int, int], n: int, numerics: list[str], steps: Steps) -> None:
    """Writes the records to the topic with the attempt's headers, each counted by tally() on its
    way; a failed read caused by a NaN or infinite numeric fails by key, not as a crash."""
    from pyspark.sql import functions as F

    args, spec = x.args, x.spec
    headers = F.array(
        F.struct(F.lit(HEADER_BATCH).alias("key"), F.lit(args.batch_id).cast("binary").alias("value")),
        F.struct(F.lit(HEADER_ATTEMPT).alias("key"), F.lit(str(args.attempt)).cast("binary").alias("value")),
    )
    as_long = "unix_micros(_cursor)" if spec.cursor.kind == "timestamp" else "CAST(_cursor AS BIGINT)"

    def written() -> int:  # the writer is not transactional: its records count as they land
        now = end_offsets(args.bootstrap, spec.topic)
        return sum(now.get(p, 0) - before.get(p, 0) for p in range(spec.partitions))

    try:
        with Ticker(x.tag, "written to Kafka", written, n), steps.step("read, encode, write"):
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
        unreadable = non_finite(x, numerics) if numerics else []
        if unreadable:  # the same rows fail every retry: say which, and what will work
            raise JobError(extract.unrepresentable_error(x.tag, spec, unreadable, temporal=False)) from None
        raise


def report_totals(x: Extract, counted, before: dict[int, int], after: dict[int, int], started: float,
                  write_s: float, steps: Steps, *, loads: list[list[int]] | None = None) -> None:
    """Checks what was counted against the window and the topic's offsets (or, direct, the loads the
    tasks staged), then writes the report for END. An ExtractError (terminal) or ExtractInterrupted
    (transient): run() exits 3 or 4."""
    spec = x.spec
    report = extract.report(counted, spec.partitions)
    extract.check_read_range(x.tag, x.window, counted)
    handoff = ({"slot": x.handoff.slot, "consistent_point": x.handoff.consistent_point,
                "made_slot": x.handoff.made_slot} if x.handoff is not None else None)
    rows = sum(t["rows"] for t in report.values())
    out = {"totals": report, "rows": rows, "handoff": handoff,
           "snapshot": {"taken_at": x.taken.taken_at, "snapshot": x.taken.seen, "wal": x.taken.wal}
           if x.taken is not None else None}
    if loads is not None:
        out["loads"] = loads
    else:
        extract.check_offsets(x.tag, before, after, report, spec.partitions)
        # The offsets it wrote, per partition [first, next): exactly its records (check_offsets), so the
        # sink can tell them from any record another producer sent with the attempt's headers.
        out["offsets"] = {str(p): [before.get(p, 0), after.get(p, 0)] for p in range(spec.partitions)}
    x.args.report.write_text(json.dumps({**out, "seconds": round(time.monotonic() - started, 3)}))
    print(summary_line("extract", pipeline=spec.name, batch_id=x.args.batch_id, attempt=x.args.attempt,
                       window=str(x.window), rows=rows, transport="kafka" if loads is None else "direct",
                       read_and_write_s=round(write_s, 1), steps_s=steps.rounded(),
                       partitions={p: t["rows"] for p, t in report.items()}), flush=True)

"""The batch sink: apply committed batches from a pipeline topic to the warehouse, two-phase.

A Spark Structured Streaming query over the pipeline topic (read_committed). Each micro-batch is
handed to ``tidemark.sink.BatchSink``, which stages records and applies a batch only once END
has arrived on every partition and counts and checksums match, in one PostgreSQL transaction
together with the ledger, the watermark and the consumer offsets. The query starts from the
offsets stored in the warehouse (not from a Spark checkpoint), after taking a fencing token.

``--available-now`` processes what is on the topic and stops (the nightly DAG runs it so);
without it the sink *stands*: it runs until stopped, with a heartbeat and lease
(``tidemark.streams.lifeline``), trigger and intake from the spec's ``sink`` section, and stops between two
micro-batches when its desired state leaves ``running`` or SIGTERM arrives (exit 0), or when
another instance took its fence (exit 3). The ``tidemark_supervisor`` DAG launches it so.

  spark-submit spark_jobs/batch_sink.py --database 'host=127.0.0.1 port=25432 dbname=wh' \
      --user tidemark --password-env PW --spec include/pipelines/ledger_entries.yaml \
      --bootstrap 127.0.0.1:29092 --available-now
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path


def parse_args(argv: list[str]) -> argparse.Namespace:
    from tidemark.spark.entry import database_args
    from tidemark.spec import DEAD_LETTER_TOPIC

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    database_args(p)
    p.add_argument("--spec", required=True, type=Path)
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--available-now", action="store_true", help="process what is there, then stop")
    p.add_argument("--max-records-per-trigger", type=int,
                   help="bounds the sink's memory: at most this many records per micro-batch "
                        "(default: the spec's sink.max_offsets_per_trigger)")
    p.add_argument("--dead-letter-topic", default=DEAD_LETTER_TOPIC)
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stdout)
    import pyarrow.compute as pc
    from pyspark import cloudpickle
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema
    from pyspark.sql.types import BooleanType, StringType, StructField, StructType

    from tidemark import avro
    from tidemark import pgbinary as pgbinary_module
    from tidemark import records as records_module
    from tidemark import stage as stage_module
    from tidemark import totals as totals_module
    from tidemark import window as window_module

    from tidemark.config import executor_checks_from
    from tidemark.control import HEADER_ATTEMPT, HEADER_BATCH, HEADER_CONTROL, Keyring, KeyringError
    from tidemark.dead_letters import DeadLetterOutbox
    from tidemark.kafka_io import end_offsets, ensure_topic
    from tidemark.progress import Steps, progress_line
    from tidemark.catalog import ensure_stream_target
    from tidemark.cdc.tables import ensure_cdc_target
    from tidemark.ledger import LeaseHeld, consumer_for, ensure_control_schema
    from tidemark.sink import BatchSink
    from tidemark.spark.entry import JobError, connect, connect_params, password, session
    from tidemark.streams.lifeline import StandingControl
    from tidemark.spec import load_spec
    from tidemark.progress import summary_line

    spec = load_spec(args.spec)
    try:  # control messages are verified against it: without one the sink does not start
        keyring = Keyring.from_env()
    except KeyringError as exc:
        raise JobError(f"pipeline {spec.name}: {exc}") from None
    load_fields = from_arrow_schema(stage_module.load_schema()).fields
    conn = connect(args.database, args.user, password(args))
    with conn, conn.cursor() as cur:
        ensure_control_schema(cur)
        if spec.stream is not None or spec.cdc is not None:
            try:  # the sink may start before the first event: the topics too (refused if their partitions differ)
                ensure_stream_target(cur, spec) if spec.stream is not None else ensure_cdc_target(cur, spec)
                for topic, partitions in spec.realtime_topics.items():
                    ensure_topic(args.bootstrap, topic, partitions)
            except (LookupError, ValueError) as exc:
                raise JobError(f"pipeline {spec.name}: {'stream' if spec.stream else 'cdc'}: {exc}") from None
    sink = BatchSink(conn, spec, keyring=keyring, dead_letters=DeadLetterOutbox(args.bootstrap, args.dead_letter_topic,
                                                               consumer_for(spec.name)))
    try:
        sink.check_stream()
    except LookupError as exc:
        raise JobError(str(exc)) from None
    control = None
    try:  # a live standing sink of this pipeline keeps its lease: a second copy never starts
        sink.acquire_fence(lease=spec.sink.lease)
        if not args.available_now:
            ensure_topic(args.bootstrap, spec.topic, spec.partitions)  # a standing sink may start before any batch
            control = StandingControl(lambda: connect(args.database, args.user, password(args)), spec, sink.fence,
                                      f"{socket.gethostname()}:{os.getpid()}", args.bootstrap)
            control.start()
    except LeaseHeld as exc:
        raise JobError(str(exc)) from None
    sink.sweep_stages()
    sink.dead_letters.flush(conn)  # what an earlier instance committed but could not publish
    if control is not None:
        signal.signal(signal.SIGTERM, lambda *_: control.request_stop("SIGTERM"))
    starting = sink.starting_offsets()
    totals = {"staged": 0, "discarded": 0, "rejected": 0, "committed": [], "refused": [], "events": 0,
              "duplicates": 0, "superseded": 0, "replayed": 0}
    # How much there is to read now: the denominator of the progress lines (None: from earliest).
    backlog = 0
    for topic, offsets in starting.items():
        ends = end_offsets(args.bootstrap, topic)
        if backlog is not None and all(o >= 0 for o in offsets.values()):
            backlog += sum(max(ends.get(p, 0) - o, 0) for p, o in offsets.items())
        else:
            backlog = None
    read = {"records": 0, "since": time.monotonic(), "last": 0}

    def header(name: str):
        return F.expr(f"try_element_at(filter(headers, h -> h.key = '{name}'), 1).value").cast("string")

    def apply(batch_df, epoch_id: int) -> None:
        if control is None:
            return apply_now(batch_df, epoch_id)
        with control.apply_lock:  # a stop waits for this micro-batch, and none starts after it
            if not control.stop_requested.is_set():
                started = time.monotonic()
                rows = apply_now(batch_df, epoch_id)
                control.progress(rows, sink.committed_offsets(), time.monotonic() - started)

    def apply_now(batch_df, epoch_id: int) -> int:
        started, steps = time.monotonic(), Steps()
        formats = sink.formats()
        if formats:  # protocol version 2: decoded and checked in the JVM, beside the read
            batch_df = avro.decode(batch_df, formats, spec.topic, list(spec.primary_key), spec.cursor.column,
                                   spec.max_record_bytes)
        checker = sink.checker(formats) if read["last"] >= executor_checks_from() else None
        if checker is not None and checker.has_work:  # a backlog: check where the records are
            schema = (batch_df.schema if "checked" in batch_df.columns else
                      StructType([*batch_df.schema.fields, StructField("reason", StringType()),
                                  StructField("checked", BooleanType())]))
            batch_df = batch_df.mapInArrow(checker, schema)
        loads = None
        if formats:  # the executors COPY the good records into the stage; the driver gets the rest and totals
            stager = sink.stager(formats, connect_params(args.database, args.user, password(args)))
            with steps.step("spark read, checks and stage"):
                # a load's row carries nulls where the records have none (row hash, checked): all nullable
                nullable = [StructField(f.name, f.dataType, True) for f in batch_df.schema.fields]
                table = batch_df.mapInArrow(stager, StructType([*nullable, *load_fields])).toArrow()
            is_load = pc.is_valid(table["load"])
            loads = table.filter(is_load)
            table = table.filter(pc.invert(is_load)).drop_columns(stage_module.load_schema().names)
            if loads.num_rows:
                # within the Spark job, added up over its tasks: not a step of its own
                steps.seconds["tasks' COPY summed"] = pc.sum(loads["load_seconds"]).as_py()
        else:
            with steps.step("spark read and checks" if checker is not None and checker.has_work else "spark read"):
                table = batch_df.toArrow()
        staged = pc.sum(loads["load_rows"]).as_py() if loads is not None and loads.num_rows else 0
        read["last"] = table.num_rows + staged
        report = sink.apply(table, epoch_id, steps, loads, started)
        read["records"] += table.num_rows + staged
        print(progress_line(f"pipeline={spec.name} sink micro-batch {epoch_id}", "records read", read["records"],
                            backlog, time.monotonic() - read["since"])
              + f"; staged {totals['staged'] + report.staged} so far, committed {totals['committed'] + report.committed or '-'}",
              flush=True)
        for key in ("staged", "discarded", "rejected", "events", "duplicates", "superseded", "replayed"):
            totals[key] += getattr(report, key)
        totals["committed"] += report.committed
        totals["refused"] += report.refused
        return table.num_rows + staged

    spark = session(f"tidemark-batch-sink-{spec.name}")
    try:
        stream = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", args.bootstrap)
            .option("assign", json.dumps({t: sorted(offsets) for t, offsets in starting.items()}))
            .option("startingOffsets", json.dumps({t: {str(p): o for p, o in offsets.items()}
                                                   for t, offsets in starting.items()}))
            .option("kafka.isolation.level", "read_committed")
            .option("includeHeaders", "true")
            .option("maxOffsetsPerTrigger", args.max_records_per_trigger or spec.sink.max_offsets_per_trigger)
            .option("maxRecordsPerPartition", spec.sink.max_records_per_task)
            .load()
        )
        # Key and value stay bytes: the sink checks their UTF-8 itself (a bad record is a dead letter,
        # not a crash). The row hash is over the same bytes, as the extract hashed its strings.
        key, value = F.col("key").cast("string"), F.col("value").cast("string")
        records = stream.select(
            F.col("topic"), F.col("partition"), F.col("offset"), F.col("key"), F.col("value"),
            header(HEADER_CONTROL).alias("control"), header(HEADER_BATCH).alias("batch_id"),
            header(HEADER_ATTEMPT).try_cast("int").alias("attempt"),
            F.xxhash64(key, value).alias("row_hash"),
        )
        # In a backlog, records are checked on the executors, beside the read (tidemark.records.Checker);
        # the module travels by value, so executors need no Tidemark installed.
        cloudpickle.register_pickle_by_value(records_module)
        cloudpickle.register_pickle_by_value(window_module)
        cloudpickle.register_pickle_by_value(stage_module)
        cloudpickle.register_pickle_by_value(pgbinary_module)
        cloudpickle.register_pickle_by_value(totals_module)
        with tempfile.TemporaryDirectory(prefix="tidemark-sink-") as checkpoint:
            writer = records.writeStream.foreachBatch(apply).option("checkpointLocation", checkpoint)
            trigger_s = spec.sink.trigger.total_seconds()
            writer = (writer.trigger(availableNow=True) if args.available_now
                      else writer.trigger(processingTime=f"{int(trigger_s * 1000)} milliseconds"))
            query = writer.start()
            print(summary_line("sink-started", pipeline=spec.name, offsets=starting, fence=sink.fence,
                               standing=control is not None), flush=True)
            if control is None:
                query.awaitTermination()
            else:
                while query.isActive and not control.stop_requested.wait(1.0):
                    pass
                if not control.stop_requested.is_set():
                    query.awaitTermination()  # it ended by itself: this raises its error
                with control.apply_lock:  # the micro-batch in flight, if any, finishes first
                    pass
                query.stop()
        print(summary_line("sink", pipeline=spec.name, **totals,
                           **({"stopped": control.reason} if control else {})), flush=True)
    finally:
        if control is not None:
            control.finish()
        spark.stop()
        conn.close()
    if control is not None and not control.graceful:
        raise JobError(f"pipeline {spec.name}: standing sink stopped: {control.reason}")
    return 0


if __name__ == "__main__":
    from tidemark.spark.entry import run

    sys.exit(run(main, sys.argv[1:], "batch_sink"))

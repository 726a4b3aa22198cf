"""The batch sink's Spark driver: what ``spark_jobs/batch_sink.py`` runs with its parsed arguments.

``run`` prepares (spec, keyring, targets, fencing token, a standing sink's life line, stages swept,
dead letters still owed published), then reads the pipeline's topics from the offsets stored in
the warehouse with a Structured Streaming query whose every micro-batch ``MicroBatches`` hands to
``BatchSink.apply``, and prints the run's totals as a summary line. Only the Spark driver imports
this module.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import tempfile
import time
from argparse import Namespace
from pathlib import Path

from tidemark import ledger
from tidemark.ledger import LeaseHeld, consumer_for, ensure_control_schema
from tidemark.protocol import avro
from tidemark.protocol.config import executor_checks_from
from tidemark.protocol.control import HEADER_ATTEMPT, HEADER_BATCH, HEADER_CONTROL, Keyring, KeyringError
from tidemark.protocol.errors import Outage
from tidemark.protocol.kafka_io import end_offsets, ensure_topic, probe_broker
from tidemark.protocol.replication import Replication
from tidemark.protocol.progress import Steps, progress_line, summary_line
from tidemark.protocol.screen import Screen
from tidemark.protocol.spec import PipelineSpec, load_spec
from tidemark.realtime import speed_layer
from tidemark.realtime.cdc import signing
from tidemark.realtime.cdc.signing import Verifier
from tidemark.sink.apply import BatchSink
from tidemark.sink.dead_letters import DeadLetterOutbox
from tidemark.sink.lifeline import StandingControl
from tidemark.sink.report import MicroBatchReport, loaded
from tidemark.spark.entry import JobError, connect, connect_params, one_line, password, session


def run(args: Namespace) -> int:
    """The whole job: 0 when it stopped as asked; a ``JobError`` (exit 3) names what refused it; a standing
    sink that failed while the broker or the warehouse does not answer ends with ``Outage`` (exit 75), which
    its supervisor waits out instead of counting it against the restart budget."""
    try:
        return _run(args)
    except Exception as exc:
        if args.available_now or isinstance(exc, Outage):
            raise
        down = outage(args) or _lost_warehouse(exc) or _lost_broker(exc)
        if down is None:
            raise
        raise Outage(f"pipeline {load_spec(args.spec).name}: standing sink stopped: {down}. Next: nothing to do "
                     "here: the supervisor starts it again once it answers (an outage is not counted against the "
                     f"restart budget). The error it met: {one_line(exc)}") from exc


# what libpq and the server say when a connection is gone (not a query's own failure: a deadlock or a
# statement timeout is an OperationalError too, and the job's)
CONNECTION_GONE = ("could not connect", "connection refused", "timeout expired", "server closed the connection",
                   "connection already closed", "terminating connection due to administrator command",
                   "the database system is", "ssl connection has been closed", "no connection to the server")


def outage(args: Namespace) -> str | None:
    """Which component the sink needs does not answer now, and why (None: the broker and the warehouse do)."""
    import psycopg2

    broken = probe_broker(args.bootstrap)
    if broken is not None:
        return f"Kafka ({args.bootstrap}) does not answer: {broken}"
    try:
        psycopg2.connect(**{**connect_params(args.database, args.user, password(args)), "connect_timeout": 5}).close()
    except psycopg2.OperationalError as exc:
        text = " ".join(str(exc).split())
        if any(t in text.lower() for t in CONNECTION_GONE):
            return f"the warehouse does not answer: {text}"
    return None


# what the Kafka clients (Spark's, librdkafka) say when the brokers are gone, not a record's own problem
BROKER_GONE = ("org.apache.kafka.common.errors.TimeoutException", "org.apache.kafka.common.errors.DisconnectException",
               "Broker transport failure", "All broker connections are down", "_ALL_BROKERS_DOWN", "_TRANSPORT")


def _chain(exc: BaseException):
    """The error and what it wraps, each with its text on one line."""
    seen: BaseException | None = exc
    while seen is not None:
        yield seen, " ".join(str(seen).split())
        seen = seen.__cause__ or seen.__context__


def _lost_broker(exc: BaseException) -> str | None:
    """The broker lost under the sink (back by now), as the Kafka client said it."""
    for _, text in _chain(exc):
        found = next((t for t in BROKER_GONE if t in text), None)
        if found is not None:
            at = text.index(found)
            return f"the broker connection was lost: {text[at:at + 300]}"
    return None


def _lost_warehouse(exc: BaseException) -> str | None:
    """The warehouse connection lost under the sink (a restart or failover that is over by now), as psycopg2
    said it, in the error or what it wraps (a micro-batch's error comes back through Spark as text)."""
    for seen, text in _chain(exc):
        found = next((t for t in CONNECTION_GONE if t in text.lower()), None)
        if found is not None and ("psycopg2" in text or type(seen).__module__.startswith("psycopg2")):
            at = text.lower().index(found)  # psycopg2's own words, not the Spark query's preamble
            start = max(text.rfind("psycopg2", 0, at), 0)
            return f"the warehouse connection was lost: {text[start:start + 300]}"
    return None


def _run(args: Namespace) -> int:
    spec = load_spec(args.spec)
    try:  # control messages are verified against it: without one the sink does not start
        keyring = Keyring.from_env()
    except KeyringError as exc:
        raise JobError(f"pipeline {spec.name}: {exc}") from None
    conn = connect(args.database, args.user, password(args))
    control = spark = batches = None
    try:
        sink = open_sink(conn, spec, keyring, args)
        control = take_over(sink, spec, args)
        sink.sweep_stages()
        sink.dead_letters.flush(conn)  # what an earlier instance committed but could not publish
        if control is not None:
            signal.signal(signal.SIGTERM, lambda *_: control.request_stop("SIGTERM"))
        starting = sink.starting_offsets()
        # a standing sink of changes or events reads micro-batch N+1 while N applies, on a connection of its own
        reader = connect(args.database, args.user, password(args)) if control and sink.speed is not None else None
        batches = MicroBatches(sink, spec, control, connect_params(args.database, args.user, password(args)),
                               backlog(args.bootstrap, starting), reader=reader)
        spark = session(f"tidemark-batch-sink-{spec.name}", **CHECKPOINT_CONF)
        if control is not None:  # the heartbeat names the JVM too: the process an operator sees in top
            control.holder += f" jvm {spark._jvm.java.lang.ProcessHandle.current().pid()}"
        records = topic_records(spark, args, spec, starting, signed=sink.speed is not None and sink.speed.signed)
        stream(records, batches, spec, args.available_now, control,
               started=summary_line("sink-started", pipeline=spec.name, offsets=starting, fence=sink.fence,
                                    standing=control is not None))
        batches.close()
        print(summary_line("sink", pipeline=spec.name, **batches.total.totals(),
                           **({"stopped": control.reason} if control else {})), flush=True)
    finally:
        if batches is not None:
            batches.close(raising=False)  # an apply in flight ends first (its lock is the life line's)
        if control is not None:
            control.finish()  # the lease ends first: a successor starts at once
        if spark is not None:
            spark.stop()
        conn.close()
    if control is not None and not control.graceful:
        raise JobError(f"pipeline {spec.name}: standing sink stopped: {control.reason}")
    return 0


# The query's checkpoint is a temporary directory of the driver (the offsets that count are committed
# with the rows): written through Hadoop's FileSystem, not FileContext, whose every rename started a
# readlink process (about 15 per micro-batch; 300 in 25 s of a drain).
CHECKPOINT_CONF = {"spark.sql.streaming.checkpointFileManagerClass":
                   "org.apache.spark.sql.execution.streaming.FileSystemBasedCheckpointFileManager"}


def topic_replication(args: Namespace) -> Replication:
    """What the job's command line says of the replicas of the topics it makes (unsaid: sized for the cluster)."""
    return Replication(args.replication_factor, args.min_insync_replicas)


def open_sink(conn, spec: PipelineSpec, keyring: Keyring, args: Namespace) -> BatchSink:
    """The sink over ``conn``, its control schema, real-time target and topics in place."""
    # a capture group's lead applies every member's changes: their real-time tables and topics too
    speed = speed_layer(spec, specs_dir=Path(args.spec).parent, verifier=Verifier(keyring))
    with conn, conn.cursor() as cur:
        ensure_control_schema(cur)
        if speed is not None:
            try:  # the sink may start before the first event: the topics too (refused if their partitions differ)
                speed.open(cur)
                for topic, partitions in speed.topics.items():
                    ensure_topic(args.bootstrap, topic, partitions, replication=topic_replication(args))
            except (LookupError, ValueError) as exc:
                raise JobError(f"pipeline {spec.name}: {speed.section}: {exc}") from None
    sink = BatchSink(conn, spec, keyring=keyring, speed=speed,
                     dead_letters=DeadLetterOutbox(args.bootstrap, args.dead_letter_topic, consumer_for(spec.name),
                                                  replication=topic_replication(args)))
    try:
        sink.check_stream()
    except LookupError as exc:
        raise JobError(str(exc)) from None
    return sink


def take_over(sink: BatchSink, spec: PipelineSpec, args: Namespace) -> StandingControl | None:
    """Take the fencing token; a standing sink (no ``--available-now``) also its lease and life line.
    A live standing sink of this pipeline keeps its lease: a second copy never starts."""
    try:
        sink.acquire_fence(lease=spec.sink.lease)
        if sink.speed is not None:  # what it reads, for the supervisor to compare (a capture group's)
            with sink.conn, sink.conn.cursor() as cur:
                sink.speed.fenced(cur, sink.fence)
        if args.available_now:
            return None
        # a standing sink may start before any batch
        ensure_topic(args.bootstrap, spec.topic, spec.partitions, replication=topic_replication(args))
        control = StandingControl(lambda: connect(args.database, args.user, password(args)), spec, sink.fence,
                                  f"{socket.gethostname()}:{os.getpid()}", args.bootstrap,
                                  realtime=sink.realtime_topics)
        control.start()
        return control
    except LeaseHeld as exc:
        raise JobError(str(exc)) from None


def backlog(bootstrap: str, starting: dict[str, dict[int, int]]) -> int | None:
    """How many records there are to read now: the progress lines' denominator (None: some
    partition starts from its earliest offset, so the count is unknown)."""
    total = 0
    for topic, offsets in starting.items():
        if any(o < 0 for o in offsets.values()):
            return None
        ends = end_offsets(bootstrap, topic)
        total += sum(max(ends.get(p, 0) - o, 0) for p, o in offsets.items())
    return total


def topic_records(spark, args: Namespace, spec: PipelineSpec, starting: dict[str, dict[int, int]], *,
                  signed: bool = False):
    """The streaming read of the pipeline's topics (read_committed, from ``starting``), one row per
    record with its position, control headers and row hash (``signed``: and the signature header)."""
    from pyspark.sql import functions as F

    stream = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("assign", json.dumps({t: sorted(offsets) for t, offsets in starting.items()}))
        .option("startingOffsets", json.dumps({t: {str(p): o for p, o in offsets.items()}
                                               for t, offsets in starting.items()}))
        .option("kafka.isolation.level", "read_committed")
        .option("includeHeaders", "true")
        .option("maxOffsetsPerTrigger", args.max_records_per_trigger or spec.records_per_trigger)
        .option("maxRecordsPerPartition", spec.records_per_task)
        .load()
    )

    def raw_header(name: str):
        return F.expr(f"try_element_at(filter(headers, h -> h.key = '{name}'), 1).value")

    def header(name: str):  # text, anything not UTF-8 replaced (Arrow would refuse it and stop the sink)
        return F.make_valid_utf8(raw_header(name).cast("string"))

    # Key and value stay bytes: the sink checks their UTF-8 itself (a bad record is a dead letter,
    # not a crash). The row hash is over the same bytes, as the extract hashed its strings.
    key, value = F.col("key").cast("string"), F.col("value").cast("string")
    return stream.select(
        F.col("topic"), F.col("partition"), F.col("offset"), F.col("key"), F.col("value"),
        header(HEADER_CONTROL).alias("control"), header(HEADER_BATCH).alias("batch_id"),
        header(HEADER_ATTEMPT).try_cast("int").alias("attempt"),
        F.xxhash64(key, value).alias("row_hash"),
        *([raw_header(signing.HEADER).alias("signature")] if signed else []),  # the Connect worker's, checked
    )


# The modules the executors run (checks, staging): they travel by value with each task.
EXECUTOR_MODULES = ("tidemark.protocol.records", "tidemark.protocol.columns", "tidemark.protocol.screen", "tidemark.protocol.window", "tidemark.batch.stage",
                    "tidemark.protocol.pgbinary", "tidemark.protocol.totals")


def ship_to_executors() -> None:
    """EXECUTOR_MODULES travel by value with each task, so executors need no Tidemark installed."""
    import importlib

    from pyspark import cloudpickle

    for name in EXECUTOR_MODULES:
        cloudpickle.register_pickle_by_value(importlib.import_module(name))


def stream(records, batches: MicroBatches, spec: PipelineSpec, available_now: bool,
           control: StandingControl | None, started: str) -> None:
    """Run the query: to the topic's end (``available_now``), or until the life line asks it to stop
    (between two micro-batches: the one in flight finishes first). ``started`` is printed once the
    query runs (the benchmark's clock starts at it)."""
    ship_to_executors()
    with tempfile.TemporaryDirectory(prefix="tidemark-sink-") as checkpoint:
        writer = records.writeStream.foreachBatch(batches).option("checkpointLocation", checkpoint)
        trigger_s = spec.trigger.total_seconds()
        writer = (writer.trigger(availableNow=True) if available_now
                  else writer.trigger(processingTime=f"{int(trigger_s * 1000)} milliseconds"))
        query = writer.start()
        print(started, flush=True)
        if control is None:
            query.awaitTermination()
            return
        while query.isActive and not control.stop_requested.wait(1.0):
            batches.raise_failure()  # an apply that failed on its own thread while no micro-batch came
        if not control.stop_requested.is_set():
            query.awaitTermination()  # it ended by itself: this raises its error
        with control.apply_lock:  # the micro-batch in flight, if any, finishes first
            pass
        query.stop()


class MicroBatches:
    """The query's ``foreachBatch`` function: reads one micro-batch (protocol version 2: decoded,
    checked and staged by the executors), hands it to ``BatchSink.apply``, adds its report to
    ``total`` and prints a progress line.

    With a ``reader`` connection (a standing sink of changes or events), the apply of micro-batch N
    runs on a thread of its own while Spark reads N+1: the read's only looks at the warehouse (are
    batch attempts open? the events' rules) go through ``reader``, and the events are screened in the
    JVM as they are read (``screened``; where the rules make no screen, a backlog is checked on the
    executors instead); applies stay in order (N+1's waits for N's), and the offsets
    commit with the rows as before, so a crash anywhere re-reads from the last commit. Where the
    read needs the ledger (an attempt open: decode, check, stage) or the micro-batch holds records of
    the pipeline's own topic (whose apply moves the ledger), it waits for the apply as before."""

    def __init__(self, sink: BatchSink, spec: PipelineSpec, control: StandingControl | None,
                 executor_db: dict, backlog: int | None, reader=None):
        from concurrent.futures import ThreadPoolExecutor

        self.sink, self.spec, self.control = sink, spec, control
        self.reader = reader if control is not None else None
        self._applying = ThreadPoolExecutor(1, thread_name_prefix="tidemark-apply") if self.reader else None
        self._pending = None  # the Future of the apply in flight (only the foreachBatch thread sets it)
        self._failed: BaseException | None = None  # an apply's error: sticky, no apply runs after it
        self.executor_db = executor_db  # the executors' own connection parameters (their COPY)
        self.backlog = backlog
        self.total = MicroBatchReport()
        self.records = 0
        self.last = 0  # the previous micro-batch's records: a backlog is checked on the executors
        self.since = time.monotonic()
        self._load_fields = None  # the executors' load rows' columns, as Spark types (made once)

    def __call__(self, batch_df, epoch_id: int) -> None:
        if self.control is None:
            self.apply(batch_df, epoch_id)
            return
        if self._applying is not None:
            self.overlapped(batch_df, epoch_id)
            return
        with self.control.apply_lock:  # a stop waits for this micro-batch, and none starts after it
            if not self.control.stop_requested.is_set():
                started = time.monotonic()
                rows = self.apply(batch_df, epoch_id)
                self.control.progress(rows, self.sink.committed_offsets(), time.monotonic() - started)

    def overlapped(self, batch_df, epoch_id: int) -> None:
        """Read this micro-batch while the previous one applies, then hand it to the apply thread."""
        import pyarrow.compute as pc

        self.raise_failure()
        started, steps = time.monotonic(), Steps()
        with self.reader, self.reader.cursor() as cur:
            attempts_open = bool(ledger.open_windows(cur, self.spec.name))
            # records checked where they are read: only events, and only while no batch attempt is open
            read_checks = None if attempts_open or self.sink.speed is None else self.sink.speed.read_checks(cur)
            screen = read_checks[1].screen() if read_checks is not None else None
            checker = (self.sink.checker({}, cur) if read_checks is not None and screen is None
                       and self.last >= executor_checks_from() else None)
        if attempts_open:  # the read looks at the ledger: after the apply before it
            self.wait_applied()
            table, loads = self.read(batch_df, steps)
        else:
            if screen is not None:  # events the JVM's screen passes need no check in Python
                batch_df = screened(batch_df, screen, read_checks[0])
            elif checker is not None:  # a backlog of events: checked where they are read
                batch_df = batch_df.mapInArrow(checker, with_reasons(batch_df.schema))
            with steps.step("spark read and screen" if screen is not None else
                            "spark read and checks" if checker is not None else "spark read"):
                table, loads = batch_df.toArrow(), None
            with steps.step("wait for the apply before"):  # long: the apply is what holds the stream back
                self.wait_applied()
        self._pending = self._applying.submit(self._apply_in_turn, table, loads, epoch_id, steps, started)
        if loads is not None or pc.any(pc.equal(table["topic"], self.spec.topic)).as_py():
            self.wait_applied()  # a batch's records: the next read must see what this apply did

    def _apply_in_turn(self, table, loads, epoch_id: int, steps: Steps, started: float) -> None:
        with self.control.apply_lock:  # a stop waits for this micro-batch, and none starts after it
            # after a failed apply none may follow: its offsets would move past the failed one's records
            if self.control.stop_requested.is_set() or self._failed is not None:
                return
            try:
                rows = self.applied(table, loads, epoch_id, steps, started)
            except BaseException as exc:
                self._failed = exc
                raise
            self.control.progress(rows, self.sink.committed_offsets(), time.monotonic() - started)

    def wait_applied(self) -> None:
        """The apply in flight done (foreachBatch's thread); its error, if it failed, raised here."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()
        self.raise_failure()

    def raise_failure(self) -> None:
        """The error of an apply that failed on its thread, raised here (any thread; none: nothing)."""
        if self._failed is not None:
            raise self._failed

    def close(self, raising: bool = True) -> None:
        """The apply in flight ends (or is skipped, the stop asked first) before the sink lets go; an
        apply that failed meanwhile is raised (the job does not end as if stopped cleanly)."""
        if self._applying is not None:
            self._applying.shutdown(wait=True)
            self.reader.close()
            self._applying = None
        if raising:
            self.raise_failure()

    def apply(self, batch_df, epoch_id: int) -> int:
        started, steps = time.monotonic(), Steps()
        table, loads = self.read(batch_df, steps)
        return self.applied(table, loads, epoch_id, steps, started)

    def applied(self, table, loads, epoch_id: int, steps: Steps, started: float) -> int:
        self.last = table.num_rows + loaded(loads)
        report = self.sink.apply(table, epoch_id, steps, loads, started)
        self.records += self.last
        self.total.add(report)
        print(progress_line(f"pipeline={self.spec.name} sink micro-batch {epoch_id}", "records read", self.records,
                            self.backlog, time.monotonic() - self.since)
              + f"; staged {self.total.staged} so far, committed {self.total.committed or '-'}", flush=True)
        return self.last

    def read(self, batch_df, steps: Steps):
        """The micro-batch as the driver's pyarrow table, and the executors' load rows (None under
        protocol version 1, where the driver stages)."""
        formats = self.sink.formats()
        if formats:  # protocol version 2: decoded and checked in the JVM, beside the read
            batch_df = avro.decode(batch_df, formats, self.spec.topic, list(self.spec.primary_key),
                                   self.spec.cursor.column, self.spec.max_record_bytes)
        checker = self.sink.checker(formats) if self.last >= executor_checks_from() else None
        checking = checker is not None and checker.has_work
        if checking:  # a backlog: check where the records are
            batch_df = batch_df.mapInArrow(checker, with_reasons(batch_df.schema))
        if not formats:
            with steps.step("spark read and checks" if checking else "spark read"):
                return batch_df.toArrow(), None
        return self.staged(batch_df, formats, steps)

    def staged(self, batch_df, formats, steps: Steps):
        """The executors COPY the good records into the stage; the driver gets the rest, and one
        load row (totals) per task."""
        import pyarrow.compute as pc
        from pyspark.sql.pandas.types import from_arrow_schema
        from pyspark.sql.types import StructField, StructType

        from tidemark.batch.stage import load_schema

        if self._load_fields is None:
            self._load_fields = from_arrow_schema(load_schema()).fields
        stager = self.sink.stager(formats, self.executor_db)
        with steps.step("spark read, checks and stage"):
            # a load's row carries nulls where the records have none (row hash, checked): all nullable
            nullable = [StructField(f.name, f.dataType, True) for f in batch_df.schema.fields]
            table = batch_df.mapInArrow(stager, StructType([*nullable, *self._load_fields])).toArrow()
        is_load = pc.is_valid(table["load"])
        loads = table.filter(is_load)
        table = table.filter(pc.invert(is_load)).drop_columns([f.name for f in self._load_fields])
        if loads.num_rows:
            # within the Spark job, added up over its tasks: not a step of its own
            steps.seconds["tasks' COPY summed"] = pc.sum(loads["load_seconds"]).as_py()
        return table, loads


def with_reasons(schema):
    """A micro-batch's Spark schema with the checks' ``reason`` and ``checked`` (``Checker``)."""
    from pyspark.sql.types import BooleanType, StringType, StructField, StructType

    if "checked" in schema.fieldNames():
        return schema
    return StructType([*schema.fields, StructField("reason", StringType()), StructField("checked", BooleanType())])


def screened(records, screen: Screen, topic: str):
    """The micro-batch with ``reason`` (null) and ``checked``: true for each event of ``topic`` the
    JVM's screen passes (``RecordRules.screen``: one its checks accept), false for any other record,
    which the sink checks in Python as before."""
    from pyspark.sql import functions as F

    # (a byte that is not UTF-8 reads as U+FFFD, which no pattern of the screen holds)
    key, value = F.col("key").cast("string"), F.col("value").cast("string")

    def distinct_and_complete(names):  # the field names: none twice, every required one there
        return (F.size(names) == F.size(F.array_distinct(names))) & (
            F.size(F.array_intersect(names, F.array(*map(F.lit, screen.required)))) == len(screen.required))

    # The names' array is said once, inside a lambda: written out three times, Spark's common
    # subexpression elimination made it for every event, the ordered ones too (the read, screen and
    # Arrow of a million events: 8.7 JVM CPU-seconds, 5.7 said once); now only an event the ordered
    # pattern fails makes it.
    fields_ok = F.transform(F.array(F.regexp_extract_all(value, F.lit(screen.names), 1)), distinct_and_complete)[0]
    any_order = (F.regexp_extract(value, screen.value, 1) == key) & fields_ok
    passes = ((F.col("topic") == topic) & (F.length("value") <= screen.max_bytes) & (key != "")
              & ((F.regexp_extract(value, screen.ordered, 1) == key) | any_order))
    return records.select("*", F.lit(None).cast("string").alias("reason"), F.coalesce(passes, F.lit(False)).alias("checked"))

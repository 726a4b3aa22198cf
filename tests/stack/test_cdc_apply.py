"""Change data capture, the apply half (issue 31, item 3): the standing sink applies Debezium's change
events to the real-time table with exactly-once effect, one source transaction at a time.

Real PostgreSQL with logical decoding, a real Connect worker with Debezium, a real broker, the real
Spark standing sink started by the supervisor's cycle. A source transaction of 1,000 inserts is
never seen in part by a reader of the serving view; an update and a delete reach it, the delete
audited with the row it deleted; Debezium's records delivered a second time (as after a crash of
its worker, at new offsets) change nothing; a record no transaction can be named for is a dead
letter, and so is one the Connect worker did not sign (someone else produced it to the topic), and
the next transaction still applies.
"""

from __future__ import annotations

import json
import threading
import uuid

import psycopg2.errors
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tidemark import ledger
from tidemark.protocol.kafka_io import end_offsets, producer_config
from tidemark.realtime.cdc import signing
from tidemark.spark import jobs
from tidemark.streams.cycle import prepare_stream_tables, run_cycle
from tidemark.streams.launch import LocalLauncher
from tidemark_workshop.stack.batchrun import dead_letters, until
from tidemark_workshop.stack.cdcrun import grant, make_cdc_pipeline, remove_capture, signature, start_connector
from tidemark_workshop.stack.spark import submit_command


@pytest.fixture
def cdc_pipeline(settings, tmp_path, bootstrap):
    pipe = make_cdc_pipeline(settings, tmp_path)
    launcher = LocalLauncher(tmp_path / "streams")
    yield pipe, launcher
    launcher.stop(pipe.spec.name, grace_s=5)
    remove_capture(settings, pipe.spec)


def _capture_and_stand(settings, pipe, launcher, wh) -> None:
    """The control schema, the target from the source, then the real-time table and view; the DBA's
    grants; the connector reading its slot; the standing sink started by the supervisor's cycle."""
    spec = pipe.spec

    with wh, wh.cursor() as cur:
        ledger.ensure_control_schema(cur)
    prepare_stream_tables(spec, wh, pipe.src)
    grant(settings, spec)
    start_connector(settings, spec)
    assert _stand(settings, pipe, launcher, wh) == "start"


def _stand(settings, pipe, launcher, wh) -> str:
    """The supervisor's cycle over the pipeline's standing sink: its decision's action."""
    def command(s):
        return submit_command(settings, jobs.SINK_JOB, pipe.sink_args(available_now=False), secret=settings.pg_password)

    return run_cycle([pipe.spec], wh, launcher, settings.kafka_bootstrap, command).decisions[pipe.spec.name].action


def _source(pipe, *statements: str) -> None:
    """One source transaction."""
    src = pipe.src()
    try:
        with src, src.cursor() as cur:
            for statement in statements:
                cur.execute(statement.format(table=pipe.spec.table))
    finally:
        src.close()


def _copy_records(bootstrap: str, topic: str, offsets: range | None = None) -> int:
    """Every record of a one-partition topic (or those at ``offsets``) produced to it again, signature and
    all: Debezium's redelivery after a crash."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"it-copy-{uuid.uuid4().hex[:8]}"})
    offsets = offsets or range(0, end_offsets(bootstrap, topic)[0])
    end = len(offsets)
    consumer.assign([TopicPartition(topic, 0, offsets.start)])
    producer, copied = Producer(producer_config(bootstrap)), 0
    try:
        while copied < end:
            msg = consumer.poll(5)
            assert msg is not None, f"{topic}: read {copied} of {end}"
            if not msg.error():
                producer.produce(topic, key=msg.key(), value=msg.value(), headers=msg.headers())
                copied += 1
    finally:
        consumer.close()
    assert producer.flush(30) == 0
    return copied


def _write_until(pipe, stop: threading.Event, written: list[int], *, deletes: bool = False) -> None:
    """Source transactions one at a time until ``stop``, counted in ``written``: 3 inserts and an update
    of an earlier row; with ``deletes``, also a delete of the second row of two transactions before
    (never a row that is updated later)."""
    import time

    src = pipe.src()
    try:
        while not stop.is_set():
            n = written[0]
            with src, src.cursor() as cur:
                cur.execute(f"INSERT INTO {pipe.spec.table} (id, amount) SELECT g, g * 0.01 FROM "
                            f"generate_series({n * 3 + 1}, {n * 3 + 3}) g")
                cur.execute(f"UPDATE {pipe.spec.table} SET amount = amount + 1, updated_at = now() WHERE id = %s",
                            (max(1, n * 3 - 5),))
                if deletes and n >= 2:
                    cur.execute(f"DELETE FROM {pipe.spec.table} WHERE id = %s", (n * 3 - 4,))
            written[0] += 1
            time.sleep(0.02)
    finally:
        src.close()


def _serving_is_source(pipe) -> bool:
    return pipe.rows("source", "amount") == {r[0]: r[1:] for r in pipe.query_wh(
        f"SELECT id, amount FROM {pipe.spec.cdc.serving_view} ORDER BY id")}


def test_source_transactions_apply_whole_and_once_and_an_unreadable_record_is_a_dead_letter(settings, cdc_pipeline):
    pipe, launcher = cdc_pipeline
    spec = pipe.spec
    view, live = spec.cdc.serving_view, spec.cdc.target_table

    wh = pipe.wh()
    try:
        _capture_and_stand(settings, pipe, launcher, wh)

        def count() -> int:
            return pipe.query_wh(f"SELECT count(*) FROM {view}")[0][0]

        _source(pipe, "INSERT INTO {table} (id, amount) VALUES (1, 0.37), (2, 0.74), (3, 1.11)")
        _source(pipe, "UPDATE {table} SET amount = 99999999999999.99, updated_at = now() WHERE id = 2",
                "DELETE FROM {table} WHERE id = 3")
        until("the update and the delete in the serving view", lambda: pipe.query_wh(
            f"SELECT id, amount::text FROM {view} ORDER BY id") == [(1, "0.37"), (2, "99999999999999.99")])
        deleted = pipe.query_wh("SELECT key, old_values ->> 'amount' FROM tidemark_control.cdc_deletions "
                                "WHERE pipeline = %s", (spec.name,))
        assert deleted == [(["3"], "1.11")]  # a deletion is a finding, with the row it deleted

        # 1,000 inserts in one source transaction: a reader polling the view sees none of them or all
        seen: set[int] = set()
        done = threading.Event()

        def poll():
            while not done.is_set():
                seen.add(count())

        reader = threading.Thread(target=poll)
        reader.start()
        try:
            _source(pipe, "INSERT INTO {table} (id, amount) SELECT g, g * 0.01 FROM generate_series(1000, 1999) g")
            until("the 1,000-row transaction", lambda: count() == 1002)
        finally:
            done.set()
            reader.join()
        # (the poller may not look again after the apply: the count it must never see is one in between)
        assert seen and seen <= {2, 1002}, f"a reader saw part of a source transaction: {sorted(seen)}"

        # Debezium's records again, at new offsets (its worker crashed before it stored its offsets)
        before = pipe.query_wh(f"SELECT id, amount, _tm_lsn FROM {live} ORDER BY id")
        copied = _copy_records(settings.kafka_bootstrap, spec.cdc_topic)
        _copy_records(settings.kafka_bootstrap, spec.cdc_transaction_topic)
        # and one genuine change produced again alone, without its END (issue 52: it waited in cdc_pending for ever)
        # (the update of the second transaction: Debezium's sequence names the first one's commit before it)
        copied += _copy_records(settings.kafka_bootstrap, spec.cdc_topic, offsets=range(3, 4))
        # then a record no transaction can be named for (Debezium never writes one), as the worker would sign
        # it; the same record from another producer, unsigned; and a good transaction
        producer = Producer(producer_config(settings.kafka_bootstrap))
        unnamed = json.dumps({"schema": {}, "payload": {"op": "c", "after": {"id": 5000}}}).encode()
        key_id = settings.control_keyring().keys[0][0]
        producer.produce(spec.cdc_topic, value=unnamed,
                         headers=[(signing.HEADER, signature(settings, spec.cdc_topic, unnamed))])
        producer.produce(spec.cdc_topic, value=unnamed)
        # and one whose headers are not even UTF-8 (Arrow refuses such text: it must not stop the sink)
        producer.produce(spec.cdc_topic, value=unnamed, headers=[(signing.HEADER, b"\xff\xfe:\x80"),
                                                                 ("tidemark.control", b"\xff")])
        assert producer.flush(30) == 0
        _source(pipe, "INSERT INTO {table} (id, amount) VALUES (6000, 60.00)")
        until("the transaction after them", lambda: pipe.query_wh(f"SELECT 1 FROM {view} WHERE id = 6000"))
        assert pipe.query_wh(f"SELECT id, amount, _tm_lsn FROM {live} WHERE id <> 6000 ORDER BY id") == before
        assert count() == 1003  # neither the unsigned record nor the unnamed one changed anything
        consumer = ledger.consumer_for(spec.name)
        until("every record read", lambda: pipe.query_wh(
            "SELECT sum(next_offset) FROM tidemark_control.sink_offsets WHERE consumer = %s AND topic = %s",
            (consumer, spec.cdc_topic))[0][0] == end_offsets(settings.kafka_bootstrap, spec.cdc_topic)[0])
        # the outbox publishes a dead letter after its micro-batch commits: wait for it
        until("the dead letter published", lambda: pipe.query_wh(
            "SELECT bool_and(in_dlq) FROM tidemark_control.sink_rejects WHERE consumer = %s", (consumer,))[0][0])
        rejects = pipe.query_wh("SELECT reason FROM tidemark_control.sink_rejects WHERE consumer = %s", (consumer,))
        assert sorted(rejects) == [
            ("change event rejected: no source or transaction block (provide.transaction.metadata must be on)",),
            ("change record rejected: no tidemark.signature header: not written by Tidemark's Connect worker",),
            (f"change record rejected: signed with key id '\ufffd\ufffd', which this sink's keyring ({key_id}) does "
             "not hold: forged, or a key retired while the connector still signs with it",)]
        letters = dead_letters(settings.kafka_bootstrap, spec.cdc_topic)
        assert len(letters) == 3 and all(b'"id": 5000' in letter["value"] for letter in letters)
        assert pipe.query_wh("SELECT count(*) FROM tidemark_control.cdc_pending WHERE consumer = %s",
                             (consumer,))[0][0] == 0  # nothing left waiting
        applied, duplicates = pipe.query_wh("SELECT sum(events), sum(duplicates) FROM tidemark_control.sink_micro_batches "
                                            "WHERE consumer = %s", (consumer,))[0]
        assert (applied, duplicates) == (3 + 2 + 1000 + 1, copied) and copied == 1006  # each change counted once

        # A transaction the real-time table refuses between two it takes, all three in one micro-batch (they
        # commit while the sink is stopped): the three are refused together, then applied one at a time, so
        # only the refused one is a dead letter, whole, and nothing of it is applied
        launcher.stop(spec.name, grace_s=5)
        with wh, wh.cursor() as cur:
            cur.execute(f"ALTER TABLE {live} ADD CONSTRAINT it_refuses CHECK (amount <> 4242.42)")
        changes, boundaries = (end_offsets(settings.kafka_bootstrap, t)[0]
                               for t in (spec.cdc_topic, spec.cdc_transaction_topic))
        _source(pipe, "INSERT INTO {table} (id, amount) VALUES (7001, 1.00)")
        _source(pipe, "INSERT INTO {table} (id, amount) VALUES (7002, 2.00)",
                "UPDATE {table} SET amount = 4242.42, updated_at = now() WHERE id = 1")
        _source(pipe, "INSERT INTO {table} (id, amount) VALUES (7003, 3.00)")
        until("their 4 changes and 3 BEGIN and END pairs on the topics", lambda: end_offsets(
            settings.kafka_bootstrap, spec.cdc_topic)[0] >= changes + 4 and end_offsets(
            settings.kafka_bootstrap, spec.cdc_transaction_topic)[0] >= boundaries + 6)
        stopped_at = pipe.query_wh("SELECT clock_timestamp()")[0][0]
        assert _stand(settings, pipe, launcher, wh) in ("start", "restart")
        reasons = until("the refused transaction a dead letter", lambda: pipe.query_wh(
            "SELECT reason FROM tidemark_control.sink_rejects WHERE consumer = %s AND reason LIKE '%%refused it%%'",
            (consumer,)))
        assert len(reasons) == 2 and all("it_refuses" in r for r, in reasons), reasons  # its two changes
        assert pipe.query_wh(f"SELECT id, amount::text FROM {view} WHERE id IN (1, 7001, 7002, 7003) ORDER BY id") == [
            (1, "0.37"), (7001, "1.00"), (7003, "3.00")]
        assert pipe.query_wh("SELECT events, rejected FROM tidemark_control.sink_micro_batches WHERE consumer = %s "
                             "AND committed_at > %s AND records > 0", (consumer, stopped_at)) == [(2, 2)]
    finally:
        wh.close()


@pytest.mark.serial("kills the Connect worker")
def test_a_connect_worker_killed_mid_stream_loses_and_duplicates_no_change(settings, cdc_pipeline):
    """kill -9 of the Connect worker's JVM while writers commit: its keeper starts it again, Debezium starts again from the offsets it
    had stored and delivers what followed them a second time; the serving view ends equal to the
    source, key by key (the lesson of its users: duplicates after a connector crash)."""
    import os
    import signal

    from tidemark_workshop.stack.connect import Connect

    pipe, launcher = cdc_pipeline
    spec = pipe.spec

    wh = pipe.wh()
    worker = Connect(settings)
    try:
        _capture_and_stand(settings, pipe, launcher, wh)
        stop = threading.Event()
        written = [0]
        writer = threading.Thread(target=_write_until, args=(pipe, stop, written))
        writer.start()
        try:
            until("a few hundred transactions", lambda: written[0] >= 150, timeout=60)
            jvm = worker.worker_pid()
            os.kill(jvm, signal.SIGKILL)  # the worker's JVM: what an operator or the OOM killer kills
            until("the worker gone", lambda: not worker.answers(), timeout=30)
            until("more transactions while it is down", lambda: written[0] >= 300, timeout=60)
            # the stack's keeper starts it again (compose's restart policy likewise)
            until("the worker started again by its keeper", worker.answers, timeout=300)
            assert worker.worker_pid() not in (None, jvm)
            until("more transactions after it", lambda: written[0] >= 450, timeout=120)
        finally:
            stop.set()
            writer.join()

        until("the serving view equal to the source, key by key", lambda: _serving_is_source(pipe), timeout=180)
        consumer = ledger.consumer_for(spec.name)
        assert pipe.query_wh("SELECT count(*) FROM tidemark_control.sink_rejects WHERE consumer = %s",
                             (consumer,))[0][0] == 0
        applied = pipe.query_wh("SELECT sum(events) FROM tidemark_control.sink_micro_batches WHERE consumer = %s",
                                (consumer,))[0][0]
        assert applied == written[0] * 4, (applied, written[0])  # every change applied once
    finally:
        wh.close()
        if not worker.answers():
            worker.start()


def test_a_column_added_or_widened_at_the_source_lands_before_its_rows_and_a_narrowed_one_is_refused(
        settings, cdc_pipeline):
    """Issue 31, item 6: the schema change ordered with the data. The column the source gained, or
    widened, is in the real-time table and the serving view, in the micro-batch transaction that
    applies the first change carrying it (the view's grants kept); a column narrowed at the source is
    refused loudly (the transaction a dead letter, with both schemas), and nothing of it is applied."""
    pipe, launcher = cdc_pipeline
    spec = pipe.spec
    view, live = spec.cdc.serving_view, spec.cdc.target_table

    wh = pipe.wh()
    try:
        _capture_and_stand(settings, pipe, launcher, wh)
        _source(pipe, "INSERT INTO {table} (id, amount) VALUES (1, 1.00)")
        until("the first row", lambda: pipe.query_wh(f"SELECT id FROM {view}") == [(1,)])

        _source(pipe, "ALTER TABLE {table} ADD COLUMN note varchar(20), ADD COLUMN fee numeric(9,3)")
        _source(pipe, "INSERT INTO {table} (id, amount, note, fee) VALUES (2, 2.00, 'hello', 1.234)",
                "UPDATE {table} SET note = 'first', updated_at = now() WHERE id = 1")
        def shown():
            try:
                return pipe.query_wh(f"SELECT id, note, fee::text FROM {view} ORDER BY id")
            except psycopg2.errors.UndefinedColumn:  # not added yet
                return None

        until("the rows that carry the new columns", lambda: shown() == [(1, "first", None), (2, "hello", "1.234")])
        columns = pipe.query_wh("SELECT column_name, data_type, character_maximum_length, numeric_precision, "
                                "numeric_scale FROM information_schema.columns WHERE table_schema || '.' || table_name "
                                "= %s AND column_name IN ('note', 'fee') ORDER BY column_name", (live,))
        assert columns == [("fee", "numeric", None, 9, 3), ("note", "character varying", 20, None, None)]

        # widened at the source: the real-time table widens before the first change that needs it, the serving
        # view made again around it with its grants
        pipe.query_wh(f"GRANT SELECT ON {view} TO PUBLIC")
        _source(pipe, "ALTER TABLE {table} ALTER COLUMN note TYPE varchar(50)")
        _source(pipe, "INSERT INTO {table} (id, amount, note) VALUES (3, 3.00, repeat('w', 40))")
        until("the row with the wider note", lambda: pipe.query_wh(f"SELECT length(note) FROM {view} WHERE id = 3")
              == [(40,)])
        assert pipe.query_wh("SELECT character_maximum_length FROM information_schema.columns WHERE table_schema "
                             "|| '.' || table_name = %s AND column_name = 'note'", (live,)) == [(50,)]
        assert pipe.query_wh("SELECT has_table_privilege('public', %s, 'SELECT')", (view,)) == [(True,)]

        _source(pipe, "ALTER TABLE {table} ALTER COLUMN note TYPE varchar(45)")  # narrowed (its 40 characters fit)
        _source(pipe, "INSERT INTO {table} (id, amount, note) VALUES (4, 4.00, 'narrow')")
        consumer = ledger.consumer_for(spec.name)
        reasons = until("the narrowed column's transaction refused", lambda: pipe.query_wh(
            "SELECT reason FROM tidemark_control.sink_rejects WHERE consumer = %s", (consumer,)))
        assert "column note is varchar(45) at the source, varchar(50) in the real-time table" in reasons[0][0]
        assert "Real-time table: (id bigint, amount numeric(18,2)" in reasons[0][0] and "source: (" in reasons[0][0]
        assert pipe.query_wh(f"SELECT id FROM {view} ORDER BY id") == [(1,), (2,), (3,)]  # nothing of it applied
        until("its dead letter published", lambda: pipe.query_wh(
            "SELECT bool_and(in_dlq) FROM tidemark_control.sink_rejects WHERE consumer = %s", (consumer,))[0][0])
    finally:
        wh.close()


def test_the_sink_killed_at_seeded_moments_of_its_apply_loses_and_duplicates_no_change(settings, cdc_pipeline):
    """Issue 31's tests, the sink's half: kill -9 of the standing sink while writers commit, once after
    a seeded delay, once just before its micro-batch's commit and once just after it (``tidemark.protocol.faults``,
    on a seeded pass). The micro-batch in flight commits nothing; the next start reads again from the
    offsets in the warehouse; the supervisor's cycle restarts the last. Every change is applied once
    (each DELETE audited once), and the serving view ends equal to the source.
    TIDEMARK_KILL_SEED picks other moments (``make kill-trials`` runs the long campaigns of events)."""
    import os
    import random
    import time

    from tidemark.protocol.faults import ENV as KILL_AT

    seed = int(os.environ.get("TIDEMARK_KILL_SEED", "31"))
    rng = random.Random(seed)
    pipe, launcher = cdc_pipeline
    spec, name = pipe.spec, pipe.spec.name
    argv, env = submit_command(settings, jobs.SINK_JOB, pipe.sink_args(available_now=False), secret=settings.pg_password)
    wh = pipe.wh()
    stop, written = threading.Event(), [0]

    def lease_free() -> bool:  # a killed instance's lease lasts until its last beat is a lease old
        return not pipe.query_wh(
            "SELECT 1 FROM tidemark_control.stream_heartbeats WHERE pipeline = %s AND ended_at IS NULL "
            "AND heartbeat_at > clock_timestamp() - %s", (name, spec.sink.lease))

    try:
        _capture_and_stand(settings, pipe, launcher, wh)
        writer = threading.Thread(target=_write_until, args=(pipe, stop, written), kwargs={"deletes": True})
        writer.start()
        deaths = []
        try:
            until("the sink's first micro-batch", lambda: pipe.query_wh(
                "SELECT count(*) FROM tidemark_control.sink_micro_batches WHERE consumer = %s AND events > 0",
                (ledger.consumer_for(name),))[0][0], timeout=180)
            delay = rng.uniform(0.5, 3.0)
            time.sleep(delay)
            launcher.kill(name)
            deaths.append(f"kill -9 {delay:.1f} s into the stream")
            for point in ("before_commit", "committed"):
                nth = rng.randint(1, 3)
                until("the killed sink's lease to lapse", lease_free, timeout=60)
                launcher.start(name, argv, {**env, KILL_AT: f"{point}:{nth}"})
                until(f"the sink's kill -9 at {point}, pass {nth}", lambda: not launcher.status(name).alive,
                      timeout=180)
                # its own line may not reach the log (the JVM copies the driver's output, and died with it)
                assert "FAILED" not in launcher.log_tail(name, 40), launcher.log_tail(name, 60)
                deaths.append(f"kill -9 at {point} (pass {nth})")
            until("the supervisor's restart", lambda: _stand(settings, pipe, launcher, wh) == "restart", timeout=60,
                  every=2)
            until("more transactions after it", lambda: written[0] >= 300, timeout=120)
        finally:
            stop.set()
            writer.join()

        until("the serving view equal to the source, key by key", lambda: _serving_is_source(pipe), timeout=180)
        # Applied once: a source transaction applied twice would audit its DELETE twice (cdc_deletions is
        # append-only); the upserts alone could not tell, the last version wins either way.
        deleted = sorted(n * 3 - 4 for n in range(2, written[0]))
        audited = [(int(k), times) for k, times in pipe.query_wh(
            "SELECT key ->> 0, count(*) FROM tidemark_control.cdc_deletions WHERE pipeline = %s GROUP BY 1 ORDER BY 1",
            (name,))]
        assert sorted(audited) == [(k, 1) for k in deleted], (deaths, len(audited), len(deleted))
        assert pipe.query_wh("SELECT count(*) FROM tidemark_control.sink_rejects WHERE consumer = %s",
                             (ledger.consumer_for(name),))[0][0] == 0
        print(f"seed {seed}: {'; '.join(deaths)}; {written[0]} source transactions, each of {len(deleted)} deletes "
              "audited once")
    finally:
        wh.close()

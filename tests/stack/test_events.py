"""Events outside batches: a pipeline's stream, applied as they arrive by its standing sink.

Real PostgreSQL, Kafka and Spark. One sink application applies both the pipeline's BEGIN/END
batches and its stream's events; bad events go to the dead-letter topic with their reason and
source position while the stream goes on; a redelivered event is a no-op, a different event under
a key already applied is a dead letter; after kill -9 the restarted sink applies nothing twice.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Producer

from tidemark import ledger
from tidemark.protocol.kafka_io import end_offsets, ensure_topic, producer_config
from tidemark.sink import BatchSink
from tidemark.spark import jobs
from tidemark.streams.cycle import prepare_stream_tables, run_cycle
from tidemark.streams.launch import LocalLauncher
from tidemark_workshop.stack.batchrun import PAYMENTS_DDL, dead_letters, insert_payments, make_pipeline, until
from tidemark_workshop.stack.spark import submit_command

STANDING = {"mode": "standing", "trigger": "PT1S", "heartbeat": "PT1S"}


def _stream() -> dict:
    unique = uuid.uuid4().hex[:10]
    return {"topic": f"it_events_{unique}", "key": "currency", "event_time": "updated_at",
            "target_table": f"public.it_{unique}_rt", "serving_view": f"public.it_{unique}_serving"}


def _event(i: int, amount: str = "1.25", currency: str = "EUR") -> bytes:
    """An event after any batch window of these tests (a batch commit compacts the events inside its window)."""
    return f'{{"id": {i}, "amount": {amount}, "currency": "{currency}", "updated_at": "2099-01-01T00:00:0{i}Z"}}'.encode()


def _publish(settings, topic: str, records: list[tuple[bytes | None, bytes]]) -> None:
    producer = Producer(producer_config(settings.kafka_bootstrap))
    for key, value in records:
        producer.produce(topic, value=value, key=key)
    assert producer.flush(30) == 0


def _tables(pipe) -> None:
    """The supervisor's step before a first start: the target from the source, then the real-time table."""
    wh = pipe.wh()
    try:
        with wh, wh.cursor() as cur:
            ledger.ensure_control_schema(cur)
        prepare_stream_tables(pipe.spec, wh, pipe.src)
    finally:
        wh.close()


BAD = {  # what each bad event's dead letter says
    "not JSON": (b"EUR", b'{"id": 90, "amount": 1'),
    "record without a key": (None, _event(5)),
    "is not a JSON number": (b"EUR", _event(6, amount='"abc"')),
    "is not valid UTF-8": (b"EUR", b'{"id": 7, "currency": "\xff\xfe"}'),
    "exceeds max_record_bytes 1024": (b"EUR", _event(8)[:-1] + b', "pad": "' + b"x" * 1100 + b'"}'),
    "does not match the key field currency": (b"USD", _event(9)),
    "with other values in amount": (b"EUR", _event(2, amount="9.99")),  # id 2 again, another amount
}


def test_one_standing_sink_applies_batches_and_events_and_nothing_twice_after_kill_9(settings, tmp_path):
    # append-only facts: a second, different event under a key already applied is a dead letter.
    # After the restart, while no attempt is open, the read of a micro-batch overlaps the apply of
    # the one before, and the JVM screens its events (tidemark.sink.job.MicroBatches, screened): the
    # good ones need no check in Python, the bad one is checked there and is a dead letter.
    pipe = make_pipeline(settings, tmp_path, PAYMENTS_DDL, sink=STANDING, stream=_stream(), max_record_bytes=1024,
                         write_mode="append_window_replace")
    name, topic = pipe.spec.name, pipe.spec.stream.topic
    launcher = LocalLauncher(tmp_path / "streams")

    def command(spec):
        return submit_command(settings, jobs.SINK_JOB, pipe.sink_args(available_now=False), secret=settings.pg_password)

    _tables(pipe)
    ensure_topic(settings.kafka_bootstrap, topic, 3)
    good = [(b"EUR", _event(i)) for i in (1, 2, 3, 4)]
    _publish(settings, topic, good[:2] + list(BAD.values()) + good[2:] + [good[0]])  # good[0] twice: a redelivery
    insert_payments(pipe, 1, 20)
    plan = pipe.plan("run-1")
    attempt = pipe.begin(plan)
    pipe.end(plan, attempt, pipe.extract(plan, attempt))
    wh = pipe.wh()
    try:
        def cycle():
            return run_cycle([pipe.spec], wh, launcher, settings.kafka_bootstrap, command).decisions[name]

        assert cycle().action == "start"
        until("the batch to commit", lambda: pipe.state(plan.batch_id, attempt) == "committed")
        until("the four events", lambda: pipe.query_wh(f"SELECT count(*) FROM {pipe.spec.stream.target_table}")[0][0] == 4)
        until("the sink to read every event", lambda: pipe.query_wh(
            "SELECT sum(next_offset) FROM tidemark_control.sink_offsets WHERE consumer = %s AND topic = %s",
            (ledger.consumer_for(name), topic))[0][0] == sum(end_offsets(settings.kafka_bootstrap, topic).values()))

        first = launcher.status(name)
        os.killpg(first.pid, signal.SIGKILL)
        until("the job to be seen dead", lambda: not launcher.status(name).alive, timeout=30)
        # a new event, event 3 redelivered, and a bad one
        _publish(settings, topic, [(b"EUR", _event(5)), good[2], BAD["is not a JSON number"]])
        assert cycle().action == "restart"
        until("event 5 after the restart", lambda: pipe.query_wh(
            f"SELECT 1 FROM {pipe.spec.stream.target_table} WHERE id = 5"))
        def restarted() -> str:  # the log of the instance running now
            return Path(launcher.log_location(name)).read_text().rsplit("\n--- ", 1)[-1]

        until("the restarted sink's micro-batch line", lambda: "wait for the apply before" in restarted())
        assert "spark read and screen" in restarted(), restarted()[-3000:]

        rows = pipe.query_wh(f"SELECT id, amount::text, currency, _tm_partition IS NOT NULL, _tm_micro_batch IS NOT NULL "
                             f"FROM {pipe.spec.stream.target_table} ORDER BY id")
        assert rows == [(i, "1.25", "EUR", True, True) for i in (1, 2, 3, 4, 5)]  # id 2 kept its first amount
        assert len(pipe.rows("target", "amount")) == 20  # the batch, by the same application
        rejects = pipe.query_wh("SELECT partition, kafka_offset, reason FROM tidemark_control.sink_rejects "
                                "WHERE consumer = %s AND topic = %s", (ledger.consumer_for(name), topic))
        assert len(rejects) == len(BAD) + 1 and len({(p, o) for p, o, _ in rejects}) == len(BAD) + 1  # each once
        for expected in BAD:
            assert sum(expected in reason for *_, reason in rejects) == (expected == "is not a JSON number") + 1, \
                (expected, rejects)
        letters = dead_letters(settings.kafka_bootstrap, topic)
        assert {d["tidemark.source"] for d in letters} == {f"{topic}/{p}@{o}".encode() for p, o, _ in rejects}
        # event 3's redelivery, counted by the restarted instance (the micro-batch rows of the first, with
        # event 1's redelivery, are pruned when a new fencing token commits)
        assert pipe.query_wh("SELECT sum(duplicates), count(DISTINCT fence) FROM tidemark_control.sink_micro_batches "
                             "WHERE consumer = %s", (ledger.consumer_for(name),)) == [(1, 1)]
    finally:
        launcher.kill(name)
        wh.close()


def test_a_replayed_micro_batch_and_records_below_the_stored_offsets_change_nothing(settings, tmp_path):
    pipe = make_pipeline(settings, tmp_path, PAYMENTS_DDL, sink=STANDING, stream=_stream())
    _tables(pipe)
    topic = pipe.spec.stream.topic
    events = pa.table({"topic": [topic] * 3, "partition": [0, 0, 1], "offset": [0, 1, 0],
                       "key": [b"EUR"] * 3, "value": [_event(1), _event(2), _event(3)],
                       "control": pa.nulls(3, pa.string()), "batch_id": pa.nulls(3, pa.string()),
                       "attempt": pa.nulls(3, pa.int32()), "row_hash": [0, 0, 0]})
    wh = pipe.wh()
    try:
        sink = BatchSink(wh, pipe.spec, keyring=pipe.keyring)
        sink.acquire_fence()
        assert sink.apply(events, micro_batch=0).events == 3
        again = sink.apply(events, micro_batch=0)  # Spark replays a micro-batch whose commit it missed
        assert again.replayed == 3 and again.events == 0
        later = sink.apply(events, micro_batch=1)  # the same records under a new id: below the stored offsets
        assert later.replayed == 3 and later.events == 0 and later.duplicates == 0
        assert pipe.query_wh(f"SELECT count(*) FROM {pipe.spec.stream.target_table}") == [(3,)]
        assert sink.committed_offsets() == {0: -2, 1: -2, 2: -2, f"{topic}/0": 2, f"{topic}/1": 1, f"{topic}/2": -2}
    finally:
        wh.close()


def _micro_batch(topic: str, events: list[tuple[int, int, bytes]]) -> pa.Table:
    """(partition, offset, value) events keyed EUR, as the sink's Spark query hands them over."""
    n = len(events)
    return pa.table({"topic": [topic] * n, "partition": [p for p, _, _ in events], "offset": [o for _, o, _ in events],
                     "key": [b"EUR"] * n, "value": [v for *_, v in events], "control": pa.nulls(n, pa.string()),
                     "batch_id": pa.nulls(n, pa.string()), "attempt": pa.nulls(n, pa.int32()), "row_hash": [0] * n})


def test_entities_keep_the_newest_version_and_count_each_older_or_equal_event_once(settings, tmp_path):
    pipe = make_pipeline(settings, tmp_path, PAYMENTS_DDL, sink=STANDING, stream=_stream())
    _tables(pipe)
    table, topic = pipe.spec.stream.target_table, pipe.spec.stream.topic

    def version(i: int, second: int, amount: str) -> bytes:
        return f'{{"id": {i}, "amount": {amount}, "currency": "EUR", "updated_at": "2099-01-01T00:00:0{second}Z"}}'.encode()

    wh = pipe.wh()
    try:
        sink = BatchSink(wh, pipe.spec, keyring=pipe.keyring)
        sink.acquire_fence()
        assert sink.apply(_micro_batch(topic, [(0, 0, version(1, 2, "1.00"))]), micro_batch=0).events == 1
        report = sink.apply(_micro_batch(topic, [
            (0, 1, version(1, 1, "2.00")),  # older than the stored version: superseded
            (1, 0, version(1, 2, "1.00")),  # equal to it, from elsewhere: a duplicate
            (1, 1, version(2, 1, "3.00")),  # new
            (2, 0, version(3, 2, "4.00")), (2, 1, version(3, 1, "5.00")),  # two versions in one micro-batch
        ]), micro_batch=1)
        assert (report.events, report.duplicates, report.superseded, report.rejected) == (2, 1, 2, 0)
        assert pipe.query_wh(f"SELECT id, amount::text FROM {table} ORDER BY id") == [(1, "1.00"), (2, "3.00"), (3, "4.00")]
    finally:
        wh.close()


def test_an_event_postgresql_refuses_is_a_dead_letter_and_the_rest_of_its_micro_batch_applies(settings, tmp_path):
    pipe = make_pipeline(settings, tmp_path, PAYMENTS_DDL, sink=STANDING, stream=_stream())
    _tables(pipe)
    table, topic = pipe.spec.stream.target_table, pipe.spec.stream.topic
    wh = pipe.wh()
    try:
        with wh, wh.cursor() as cur:  # rules only PostgreSQL knows: a type's own syntax, and a constraint
            cur.execute(f"ALTER TABLE {table} ADD COLUMN note inet, ADD CONSTRAINT small CHECK (amount < 100)")
        values = [_event(1), _event(2)[:-1] + b', "note": "not an address"}', _event(3, amount="500.00"), _event(4)]
        events = _micro_batch(topic, list(zip([0, 1, 1, 2], [0, 0, 1, 0], values)))
        sink = BatchSink(wh, pipe.spec, keyring=pipe.keyring)
        sink.acquire_fence()
        report = sink.apply(events, micro_batch=0)
        assert (report.events, report.rejected) == (2, 2)
        assert pipe.query_wh(f"SELECT id FROM {table} ORDER BY id") == [(1,), (4,)]
        rejects = dict(((p, o), reason) for p, o, reason in pipe.query_wh(
            "SELECT partition, kafka_offset, reason FROM tidemark_control.sink_rejects WHERE topic = %s", (topic,)))
        assert set(rejects) == {(1, 0), (1, 1)}
        assert "PostgreSQL cannot cast it" in rejects[1, 0] and "type inet" in rejects[1, 0], rejects
        assert f"the real-time table {table} refused it" in rejects[1, 1] and '"small"' in rejects[1, 1], rejects
        assert sink.committed_offsets()[f"{topic}/1"] == 2  # the refused ones are behind the stream, as dead letters
        # the next micro-batch of the same sink finds its refused events alike (each pass indexes them for the while)
        values = [_event(5)[:-1] + b', "note": "no"}', _event(6, amount="600.00"), _event(7)]
        report = sink.apply(_micro_batch(topic, list(zip([1, 1, 1], [2, 3, 4], values))), micro_batch=1)
        assert (report.events, report.rejected) == (1, 2)
        assert pipe.query_wh(f"SELECT id FROM {table} ORDER BY id") == [(1,), (4,), (7,)]
    finally:
        wh.close()


def test_the_serving_view_is_the_source_after_a_batch_and_the_events_that_followed(settings, tmp_path):
    stream = {**_stream(), "key": "id"}  # keyed by id: the events spread over the partitions
    pipe = make_pipeline(settings, tmp_path, PAYMENTS_DDL, sink=STANDING, stream=stream)
    _tables(pipe)
    ensure_topic(settings.kafka_bootstrap, stream["topic"], 3)

    def source(sql: str, params=()) -> list[tuple]:
        conn = pipe.src()
        try:
            with conn, conn.cursor() as cur:
                cur.execute(sql.format(table=pipe.source_table), params)
                return cur.fetchall() if cur.description else []
        finally:
            conn.close()

    def as_published(ids) -> list[tuple[bytes, bytes]]:  # the application's events: each row as the source has it
        return [(k.encode(), v.encode()) for k, v in source(
            "SELECT id::text, row_to_json(s)::text FROM {table} s WHERE id = ANY(%s) ORDER BY id", (list(ids),))]

    insert_payments(pipe, 1, 10, stamp="now() - interval '1 minute'")
    first = as_published(range(1, 11))
    _publish(settings, stream["topic"], first)
    plan = pipe.plan("run-1")
    attempt = pipe.begin(plan)
    pipe.end(plan, attempt, pipe.extract(plan, attempt))
    # after the batch's window: row 3 changes, rows 11 and 12 arrive; their events follow, and then
    # row 3's first event once more, delivered late
    source("UPDATE {table} SET amount = 99.99, updated_at = now() WHERE id = 3")
    insert_payments(pipe, 11, 12)
    _publish(settings, stream["topic"], as_published([3, 11, 12]) + [first[2]])
    summary = pipe.sink()  # one application: the batch and the events
    assert summary["committed"] and summary["events"] >= 3, summary

    view = {r[0]: r[1:] for r in pipe.query_wh(f"SELECT id, amount, currency, updated_at FROM {stream['serving_view']}")}
    assert view == pipe.rows("source", "amount, currency, updated_at") and len(view) == 12
    assert [r[0] for r in pipe.query_wh(f"SELECT id FROM {stream['target_table']} ORDER BY id")] == [3, 11, 12], \
        "the real-time rows inside the committed window are compacted away with the batch"
    assert pipe.query_wh(f"SELECT amount::text FROM {pipe.spec.target_table} WHERE id = 3") == [("1.11",)]  # batch: old
    batch_mark, complete = pipe.query_wh(f"SELECT batch_watermark, complete_up_to FROM {stream['serving_view']}_freshness")[0]
    assert batch_mark == plan.window.hi.cursor and complete >= batch_mark


@pytest.mark.serial("stops the broker")
def test_a_broker_restart_mid_stream_loses_and_duplicates_nothing(settings, tmp_path):
    """Events flow while the broker goes away for 40 s, the supervisor looking every 5 s; the sink recovers
    by itself or is started again once the broker answers, never restarted into the outage nor counted
    against its budget (issue 53, item 2), and each event is in the real-time table once."""
    import threading

    from tidemark_workshop.stack.kafka import Kafka

    stream = {**_stream(), "key": "id"}
    pipe = make_pipeline(settings, tmp_path, PAYMENTS_DDL, sink=STANDING, stream=stream)
    _tables(pipe)
    ensure_topic(settings.kafka_bootstrap, stream["topic"], 3)
    launcher = LocalLauncher(tmp_path / "streams")
    name, total = pipe.spec.name, 600

    def command(spec):
        return submit_command(settings, jobs.SINK_JOB, pipe.sink_args(available_now=False), secret=settings.pg_password)

    def event(i: int) -> bytes:
        return f'{{"id": {i}, "amount": {i}.00, "currency": "EUR", "updated_at": "2099-01-01T00:00:00Z"}}'.encode()

    delivered: set[int] = set()
    resent: list[int] = []
    feed_errors: list[Exception] = []

    def send(producer, ids, pace: float) -> None:
        def note(err, msg):
            if err is None:
                delivered.add(int(msg.key()))
        for i in ids:
            producer.produce(stream["topic"], value=event(i), key=str(i).encode(), on_delivery=note)
            producer.poll(0)
            time.sleep(pace)
        producer.flush(90)

    def feed():  # 20 events a second for 30 s; the producer holds them while the broker is away
        try:
            send(Producer(producer_config(settings.kafka_bootstrap, **{"message.timeout.ms": 60_000})),
                 range(1, total + 1), 0.05)
            # librdkafka's idempotent producer now and then stays stuck after a broker restart
            # (seen once in CI: 439 records undelivered 120 s after the broker was back, the sink
            # idle with no lag). The producer is the test's, not the system under test: send what
            # timed out again with a fresh one, as an application would; the key makes it an upsert.
            resent.extend(sorted(set(range(1, total + 1)) - delivered))
            if resent:
                send(Producer(producer_config(settings.kafka_bootstrap)), resent, 0)
                assert delivered == set(range(1, total + 1)), f"undelivered after a resend: {len(resent)}"
        except Exception as exc:  # a thread cannot fail the test: the test reads this below
            feed_errors.append(exc)

    wh = pipe.wh()
    try:
        _publish(settings, stream["topic"], [(b"0", event(0))])
        actions = [run_cycle([pipe.spec], wh, launcher, settings.kafka_bootstrap, command).decisions[name].action]
        until("the sink's first event", lambda: pipe.query_wh(f"SELECT count(*) FROM {stream['target_table']}")[0][0],
               timeout=120)
        feeder = threading.Thread(target=feed)
        feeder.start()
        time.sleep(8)
        with Kafka(settings).away():
            for _ in range(8):  # the supervisor's cycle every 5 s while the broker is away
                actions.append(run_cycle([pipe.spec], wh, launcher, settings.kafka_bootstrap, command).decisions[name])
                time.sleep(5)
        during = [d for d in actions if not isinstance(d, str)]
        assert all(d.action in ("none", "wait") for d in during), [(d.action, d.reason) for d in during]
        actions[:] = [d if isinstance(d, str) else d.action for d in actions]
        feeder.join(240)
        assert not feeder.is_alive() and not feed_errors, f"the test's producer failed: {feed_errors}"

        def caught_up():  # the supervisor's cycle every 5 s, as its DAG would (every minute)
            actions.append(run_cycle([pipe.spec], wh, launcher, settings.kafka_bootstrap, command).decisions[name].action)
            return pipe.query_wh(f"SELECT count(*) FROM {stream['target_table']}")[0][0] >= total + 1

        until("every event after the broker restart", lambda: caught_up() or time.sleep(5), timeout=300)
        ids = [r[0] for r in pipe.query_wh(f"SELECT id FROM {stream['target_table']} ORDER BY id")]
        assert ids == list(range(0, total + 1)), "each event exactly once"
        amounts = pipe.query_wh(f"SELECT sum(amount) FROM {stream['target_table']} WHERE id > 0")[0][0]
        assert amounts == sum(range(1, total + 1)), "control total"
        assert pipe.query_wh("SELECT count(*) FROM tidemark_control.sink_rejects WHERE consumer = %s",
                             (ledger.consumer_for(name),)) == [(0,)]
        assert "restart" not in actions and "crash_loop" not in actions, actions  # the outage cost no budget
        print(f"supervisor actions: {actions}; events sent again by the test's producer: {len(resent)}")
    finally:
        launcher.kill(name)
        wh.close()

"""Benchmark: change data capture on this machine (issue 31), against Debezium's own snapshot.

One CDC pipeline over the tests' payments table, ``--rows`` rows in the source:

1. Debezium's own initial snapshot of the table (a second connector, ``snapshot.mode: initial``, its
   own slot and publication) onto Kafka: ``debezium_snapshot_rows_per_s`` = rows / (connector created
   -> every snapshot record on its topic). Its snapshot records carry no transaction block, so no
   exactly-once sink can apply them as transactions: the figure stops at Kafka and so flatters it.
2. The handoff: Tidemark's first batch of the pipeline (slot with an exported snapshot, parallel
   JDBC reads in it, BEGIN/END, atomic apply) while writers insert, update and delete:
   ``snapshot_rows_per_s`` = rows / (plan -> committed), its two Spark start-ups included (about
   10 s each here, docs/local-stack.md).
3. The stream: the connector on the handoff's slot, the standing sink. After the writers stop,
   ``missing`` = keys whose serving-view row differs from the source's (absent, extra or other
   values), ``duplicates`` = change events applied twice (both must be 0).
4. ``changes_per_s``: ``--changes`` updates in source transactions of 100, committed as fast as
   one connection can, from the first commit until the sink has applied the last transaction;
   ``capture_changes_per_s``: the same changes until Debezium has put the last on the topic (the
   capture's share of the path).
5. Latency: ``--rate`` updates per second for ``--seconds`` (transactions of 50), each row's cursor
   set at its update; ``p50_ms``/``p99_ms`` = the real-time table's apply time minus that cursor
   (the apply's micro-batch commits a few milliseconds after it), also printed per 5 s of the phase;
   ``capture_p50_ms``/``capture_p99_ms`` = the capture's share: the change event's Kafka timestamp
   (when the Connect worker wrote it) minus the same cursor.
   ``--trigger`` sets the standing sink's trigger (by default a CDC pipeline's, ``spec.CDC_TRIGGER``).

The last line printed is one JSON object. The benchmark's tables, slots, publications, connectors
and topics are dropped at the end.

  make bench-cdc                                               # 2,000,000 rows, 200,000 changes, 5,000/s for 30 s
  python bench/cdc_handoff.py --rows 20000 --changes 2000 --rate 500 --seconds 5   # a quick look
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from tidemark import ledger
from tidemark.protocol.kafka_io import end_offsets, settled_replication
from tidemark.protocol.spec import load_spec, quote
from tidemark.realtime.cdc.connect import ConnectClient
from tidemark.realtime.cdc.connector import connector_config
from tidemark.realtime.cdc.groups import connector_name
from tidemark.spark import jobs
from tidemark.streams.capture import supervise_capture
from tidemark.streams.cycle import prepare_stream_tables, run_cycle
from tidemark.streams.launch import LocalLauncher
from tidemark.streams.policy import Policy
from tidemark_workshop.settings import Settings
from tidemark_workshop.stack.batchrun import Pipeline, until
from tidemark_workshop.stack.cdcrun import (
    SourceWriters,
    captured,
    grant,
    make_cdc_pipeline,
    remove_capture,
    source_endpoint,
)
from tidemark_workshop.stack.spark import submit_command


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--changes", type=int, default=200_000)
    p.add_argument("--rate", type=int, default=5_000, help="changes per second in the latency phase")
    p.add_argument("--seconds", type=int, default=30)
    p.add_argument("--trigger", default=None, help="the standing sink's trigger, ISO 8601 (default: a CDC pipeline's, PT0.5S)")
    p.add_argument("--transport", choices=("kafka", "direct"), default="kafka",
                   help="how the handoff batch's rows reach the warehouse (spec transport:)")
    args = p.parse_args(argv)
    if args.rate * args.seconds > args.rows or args.changes > args.rows:
        # the phases update existing rows by id: a transaction past the last row changes nothing, so the
        # capture sends nothing for it and the wait for it to be applied would never end
        p.error(f"--changes ({args.changes}) and --rate x --seconds ({args.rate * args.seconds}) must not "
                f"exceed --rows ({args.rows}): every change updates an existing row")
    settings = Settings.from_env()
    tmp = Path(tempfile.mkdtemp(prefix="tidemark-bench-cdc-"))
    pipe = make_cdc_pipeline(settings, tmp, args.trigger, args.transport)
    peer = _peer_spec(pipe, tmp)
    launcher = LocalLauncher(tmp / "streams")
    figures: dict[str, float | int | str] = {"rows": args.rows, "trigger_s": pipe.spec.trigger.total_seconds(),
                                             "transport": args.transport}
    try:
        _source(pipe, f"INSERT INTO {pipe.spec.table} (id, amount, updated_at) SELECT g, g %% 100000 / 100.0, "
                      "now() - interval '1 day' FROM generate_series(1, %s) g", (args.rows,))
        _source(pipe, f"ANALYZE {pipe.spec.table}")
        grant(settings, pipe.spec)
        grant(settings, peer)
        figures["debezium_snapshot_rows_per_s"] = _debezium_snapshot(settings, peer, args.rows)
        remove_capture(settings, peer)
        figures.update(_handoff(settings, pipe, launcher, args.rows))
        figures.update(_sustained(pipe, args.changes, settings.kafka_bootstrap))
        figures.update(_latency(pipe, args.rate, args.seconds, settings.kafka_bootstrap))
        figures["snapshot_ratio_vs_debezium"] = round(figures["snapshot_rows_per_s"]
                                                      / figures["debezium_snapshot_rows_per_s"], 2)
    finally:
        launcher.stop(pipe.spec.name, grace_s=5)
        remove_capture(settings, peer)
        remove_capture(settings, pipe.spec)
        _drop(pipe)
    print(json.dumps(figures), flush=True)
    return 1 if figures.get("missing") or figures.get("duplicates") else 0  # both must be 0


def _peer_spec(pipe: Pipeline, tmp: Path):
    """The same table under another name: Debezium's own snapshot gets its own slot, publication and topics."""
    raw = json.loads(pipe.path.read_text())
    path = tmp / f"{raw['name']}_dbz.yaml"
    path.write_text(json.dumps({**raw, "name": path.stem, "target_table": f"{raw['target_table']}_dbz",
                                "cdc": {**raw["cdc"], "target_table": f"{raw['cdc']['target_table']}_dbz",
                                        "serving_view": f"{raw['cdc']['serving_view']}_dbz"}}))
    return load_spec(path)


def _debezium_snapshot(settings: Settings, spec, rows: int) -> float:
    client = ConnectClient(settings.connect_url)
    config = {**connector_config(captured(spec), source_endpoint(settings),
                                 replication=settled_replication(settings.kafka_bootstrap)), "snapshot.mode": "initial"}
    started = time.monotonic()
    client.put_config(connector_name(spec), config)

    def on_topic() -> int:
        try:
            return sum(end_offsets(settings.kafka_bootstrap, spec.cdc_topic).values())
        except Exception:  # the topic is not there yet
            return 0

    until(f"Debezium's snapshot of {rows} rows on {spec.cdc_topic}", lambda: on_topic() >= rows,
          timeout=3600, every=0.2)
    seconds = time.monotonic() - started
    print(f"debezium initial snapshot: {rows} rows onto Kafka in {seconds:.1f} s", flush=True)
    return round(rows / seconds)


def _handoff(settings: Settings, pipe: Pipeline, launcher: LocalLauncher, rows: int) -> dict:
    spec, wh = pipe.spec, pipe.wh()
    try:
        with wh, wh.cursor() as cur:
            ledger.ensure_control_schema(cur)
        prepare_stream_tables(spec, wh, pipe.src)
        # the writers touch the last 100,000 ids and insert above them
        with SourceWriters(settings, spec.table, set(range(max(1, rows - 99_999), rows + 1)), seed=31,
                           pause_s=0.005) as writers:
            started = time.monotonic()
            plan, _ = pipe.run("bench-handoff")
            seconds = time.monotonic() - started
            assert plan.handoff, plan
            print(f"handoff batch: {rows} rows (and the writers' rows) committed in {seconds:.1f} s while writers "
                  f"made {writers.counts}", flush=True)
            source = pipe.src()
            try:
                line, failure = supervise_capture(captured(spec), wh, source, ConnectClient(settings.connect_url),
                                                  source_endpoint(settings), Policy(trigger_interval=timedelta(seconds=1)),
                                                  datetime.now(timezone.utc),
                                                  replication=settled_replication(settings.kafka_bootstrap))
            finally:
                source.close()
            assert "action=create" in line and failure is None, (line, failure)

            def command(s):
                return submit_command(settings, jobs.SINK_JOB, pipe.sink_args(available_now=False),
                                      secret=settings.pg_password)

            run_cycle([spec], wh, launcher, settings.kafka_bootstrap, command)
            time.sleep(10)
        expected = _rows(pipe, "source")
        try:
            until("the serving view equal to the source", lambda: _rows(pipe, "view") == expected, timeout=600)
        except AssertionError:
            pass  # counted below
        seen = _rows(pipe, "view")
        missing = sum(1 for k in expected.keys() | seen.keys() if expected.get(k) != seen.get(k))
        consumer = ledger.consumer_for(spec.name)
        duplicates = pipe.query_wh("SELECT coalesce(sum(duplicates), 0) FROM tidemark_control.sink_micro_batches "
                                   "WHERE consumer = %s", (consumer,))[0][0]
    finally:
        wh.close()
    return {"snapshot_rows_per_s": round(rows / seconds), "handoff_s": round(seconds, 1), "missing": missing,
            "duplicates": int(duplicates)}


def _sustained(pipe: Pipeline, changes: int, bootstrap: str) -> dict:
    """End to end, and (to tell the capture's share from the sink's) until Debezium has put them on the topic."""
    table = quote(pipe.spec.table)
    src, changed = pipe.src(), 0

    def on_topic() -> int:
        return sum(end_offsets(bootstrap, pipe.spec.cdc_topic).values())

    before = on_topic()
    try:
        started = time.monotonic()
        with src.cursor() as cur:
            for first in range(1, changes + 1, 100):
                cur.execute(f"UPDATE {table} SET amount = amount + 1, updated_at = clock_timestamp() "
                            "WHERE id BETWEEN %s AND %s", (first, min(first + 99, changes)))
                changed += cur.rowcount
                cur.execute("SELECT txid_current() % 4294967296")  # as Debezium's txId: without the epoch
                last = cur.fetchone()[0]
                src.commit()
    finally:
        src.close()
    committed = time.monotonic() - started
    until("Debezium to put every change on the topic", lambda: on_topic() >= before + changed, timeout=3600,
          every=0.2)
    captured = time.monotonic() - started
    _applied(pipe, last)
    seconds = time.monotonic() - started
    print(f"sustained: {changed} changes committed in {committed:.1f} s, on the topic after {captured:.1f} s, "
          f"applied after {seconds:.1f} s", flush=True)
    return {"changes_per_s": round(changed / seconds), "capture_changes_per_s": round(changed / captured)}


def _applied(pipe: Pipeline, txid: int) -> None:
    """Until the sink has applied source transaction ``txid`` (one connection's last: every one before it too)."""
    consumer = ledger.consumer_for(pipe.spec.name)
    until(f"the sink to apply source transaction {txid}", lambda: (pipe.query_wh(
        "SELECT txid FROM tidemark_control.cdc_positions WHERE consumer = %s", (consumer,)) or [(0,)])[0][0] >= txid,
        timeout=3600, every=0.2)


def _latency(pipe: Pipeline, rate: int, seconds: int, bootstrap: str) -> dict:
    table, live = quote(pipe.spec.table), quote(pipe.spec.cdc.target_table)
    per_tx, ids = 50, rate * seconds
    first_offsets = end_offsets(bootstrap, pipe.spec.cdc_topic)
    src = pipe.src()
    began = time.monotonic()
    try:
        with src.cursor() as cur:
            cur.execute("SELECT clock_timestamp()")
            since = cur.fetchone()[0]
            src.commit()
            for n, first in enumerate(range(1, ids + 1, per_tx)):
                cur.execute(f"UPDATE {table} SET amount = amount + 1, updated_at = clock_timestamp() "
                            "WHERE id BETWEEN %s AND %s", (first, first + per_tx - 1))
                cur.execute("SELECT txid_current() % 4294967296")
                last = cur.fetchone()[0]
                src.commit()
                ahead = began + (n + 1) * per_tx / rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
    finally:
        src.close()
    achieved = ids / (time.monotonic() - began)
    _applied(pipe, last)
    lags = sorted(float(r[0]) for r in pipe.query_wh(
        f"SELECT extract(epoch FROM _tm_applied_at - updated_at) * 1000 FROM {live} WHERE updated_at >= %s", (since,)))
    if not lags:
        raise SystemExit("no change of the latency phase reached the real-time table")
    for window, n, p50, p99 in pipe.query_wh(  # where in the phase the slow changes were
            f"""SELECT floor(extract(epoch FROM updated_at - %(s)s) / 5)::int * 5, count(*),
                       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM _tm_applied_at - updated_at)),
                       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM _tm_applied_at - updated_at))
                  FROM {live} WHERE updated_at >= %(s)s GROUP BY 1 ORDER BY 1""", {"s": since}):
        print(f"latency phase {window:>3}-{window + 5} s: {n} changes, p50 {p50 * 1000:,.0f} ms, p99 {p99 * 1000:,.0f} ms",
              flush=True)
    captured = _capture_lags(pipe, bootstrap, first_offsets, since)
    return {"rate_achieved": round(achieved), "latency_changes": len(lags), "p50_ms": round(statistics.median(lags)),
            "p99_ms": _p99(lags), "capture_p50_ms": round(statistics.median(captured)) if captured else None,
            "capture_p99_ms": _p99(captured) if captured else None}


def _p99(values: list[float]) -> int:
    return round(values[min(len(values) - 1, int(len(values) * 0.99))])


def _capture_lags(pipe: Pipeline, bootstrap: str, offsets: dict[int, int], since: datetime) -> list[float]:
    """The capture's share of each latency-phase change: when the Connect worker wrote its change event
    (the record's Kafka timestamp) minus its row's ``updated_at``, in ms, sorted."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"tidemark-bench-{pipe.spec.name}",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    topic, lags, open_parts = pipe.spec.cdc_topic, [], set(offsets)
    consumer.assign([TopicPartition(topic, p, o) for p, o in offsets.items()])
    try:
        while open_parts:
            msg = consumer.poll(10)
            if msg is None:
                break
            if msg.error():
                open_parts.discard(msg.partition())
                continue
            after = (json.loads(msg.value()).get("payload") or {}).get("after") or {}
            if after.get("updated_at"):
                written = datetime.fromisoformat(after["updated_at"].replace("Z", "+00:00"))
                if written >= since:
                    lags.append(msg.timestamp()[1] - written.timestamp() * 1000)
    finally:
        consumer.close()
    return sorted(lags)


def _rows(pipe: Pipeline, side: str) -> dict:
    if side == "source":
        src = pipe.src()
        try:
            with src, src.cursor() as cur:
                cur.execute(f"SELECT id, amount::text FROM {quote(pipe.spec.table)}")
                return dict(cur.fetchall())
        finally:
            src.close()
    return dict(pipe.query_wh(f"SELECT id, amount::text FROM {quote(pipe.spec.cdc.serving_view)}"))


def _source(pipe: Pipeline, sql: str, params=()) -> None:
    src = pipe.src()
    try:
        with src, src.cursor() as cur:
            cur.execute(sql, params)
    finally:
        src.close()


def _drop(pipe: Pipeline) -> None:
    spec = pipe.spec
    _source(pipe, f"DROP TABLE IF EXISTS {quote(spec.table)}")
    wh = pipe.wh()
    try:
        with wh, wh.cursor() as cur:
            cur.execute(f"DROP VIEW IF EXISTS {quote(spec.cdc.serving_view)}, {quote(spec.cdc.serving_view + '_freshness')}")
            cur.execute(f"DROP TABLE IF EXISTS {quote(spec.cdc.target_table)}, {quote(spec.target_table)}")
            ledger.forget_pipeline(cur, spec.name)
    finally:
        wh.close()



if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A capture group under PostgreSQL's own TPC-B workload (issue 52, item 4).

pgbench's transaction updates an account, its teller and its branch in one source transaction (and
inserts a history row, not captured). The three tables are captured as one group: one slot, one
connector, one standing sink (the accounts pipeline's, the group's lead) applying each source
transaction across the three real-time tables at once. A reader polling the three serving views in one
snapshot finds sum(accounts) = sum(tellers) = sum(branches) in every poll: while the members hand off
one after another (the views show no row until every member's handoff has committed, and a member's
batch commits only once the group's stream has passed its snapshot) and after, with pgbench running
throughout. The branches table joins the running group of the other two: its handoff waits until the
supervisor has restarted the group's connector with its table and the lead's sink with its topic, the
views show no row meanwhile, and a reader never sees a state the source never had. At a quiet point each
view equals the source key by key.

Real PostgreSQL with logical decoding and its pgbench, real Spark extracts and sinks, a real Connect
worker with Debezium.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone

import psycopg2
import pytest

from tidemark import ledger
from tidemark.protocol.kafka_io import settled_replication
from tidemark.protocol.spec import load_spec
from tidemark.realtime.cdc.connect import ConnectClient
from tidemark.realtime.cdc.groups import capture_of
from tidemark.realtime.cdc.layer import GroupNotStreaming
from tidemark.realtime.cdc.tables import ensure_cdc_serving_view
from tidemark.spark import jobs
from tidemark.status import collect, load_pipelines, status_lines
from tidemark.streams.capture import supervise_capture
from tidemark.streams.cycle import prepare_stream_tables, run_cycle
from tidemark.streams.launch import LocalLauncher
from tidemark.streams.policy import Policy
from tidemark_workshop.stack.batchrun import WAREHOUSE_DB, Pipeline, until
from tidemark_workshop.stack.cdcrun import STANDING, grant, remove_capture, source_endpoint
from tidemark_workshop.stack.spark import submit_command

pytestmark = [pytest.mark.stack]

TABLES = {"a": ("pgbench_accounts", "aid", "abalance"), "t": ("pgbench_tellers", "tid", "tbalance"),
          "b": ("pgbench_branches", "bid", "bbalance")}


class Reader(threading.Thread):
    """Polls the three serving views in one statement (one snapshot): each poll's three sums, then its three
    row counts."""

    def __init__(self, settings, views: dict[str, str]):
        super().__init__(daemon=True)
        self.settings, self.views = settings, views
        self.polls: list[tuple[int, ...]] = []  # (accounts, tellers, branches sums, and their rows)
        self.stop, self.error = threading.Event(), None

    def run(self) -> None:
        conn = psycopg2.connect(self.settings.dsn(WAREHOUSE_DB))
        conn.autocommit = True
        sums = ", ".join(f"(SELECT coalesce(sum({TABLES[k][2]}), 0) FROM {v})" for k, v in self.views.items())
        rows = ", ".join(f"(SELECT count(*) FROM {v})" for v in self.views.values())
        try:
            with conn.cursor() as cur:
                while not self.stop.is_set():
                    cur.execute(f"SELECT {sums}, {rows}")
                    self.polls.append(tuple(int(v) for v in cur.fetchone()))
                    time.sleep(0.05)
        except Exception as exc:  # surfaced by the test
            self.error = exc
        finally:
            conn.close()

    def unequal(self) -> list[tuple[int, ...]]:
        """Polls that saw a state the source never had: the views showing rows disagree (each TPC-B
        transaction adds one amount to all three tables), or branches shown without the other two."""
        return [p for p in self.polls if len({p[i] for i in range(3) if p[3 + i]}) > 1 or (p[5] and not p[3] * p[4])]

    def rows(self) -> int:
        return sum(self.polls[-1][3:]) if self.polls else 0


def _pgbench(settings, schema: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PGHOST": settings.pg_host, "PGPORT": str(settings.pg_port), "PGUSER": settings.pg_user,
           "PGPASSWORD": settings.pg_password, "PGOPTIONS": f"-c search_path={schema}"}
    return subprocess.Popen(["pgbench", *args, settings.source_db], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _source(settings, schema: str) -> None:
    """pgbench's tables in a schema of their own, each with the cursor every update sets."""
    conn = psycopg2.connect(settings.dsn(settings.source_db))
    try:
        with conn, conn.cursor() as cur:
            cur.execute(f"CREATE SCHEMA {schema}")
        init = _pgbench(settings, schema, "-i", "-s", "1", "-q")
        out, _ = init.communicate(timeout=300)
        assert init.returncode == 0, out
        with conn, conn.cursor() as cur:
            cur.execute(f"""CREATE FUNCTION {schema}.touch() RETURNS trigger LANGUAGE plpgsql AS
                            $$ BEGIN NEW.updated_at := clock_timestamp(); RETURN NEW; END $$""")
            for table, *_ in TABLES.values():
                cur.execute(f"ALTER TABLE {schema}.{table} ADD COLUMN updated_at timestamptz NOT NULL "
                            "DEFAULT clock_timestamp()")
                cur.execute(f"CREATE TRIGGER touch BEFORE UPDATE ON {schema}.{table} FOR EACH ROW "
                            f"EXECUTE FUNCTION {schema}.touch()")
    finally:
        conn.close()


def _member(settings, directory, schema: str, key: str) -> Pipeline:
    """A pipeline of group ``schema``, its spec written in ``directory`` (the sinks read the group there)."""
    table, pk, _ = TABLES[key]
    name = f"{schema}_{key}"
    path = directory / f"{name}.yaml"
    path.write_text(json.dumps({
        "name": name, "table": f"{schema}.{table}", "primary_key": [pk], "record_format": "avro",
        "cursor": {"kind": "timestamp", "column": "updated_at"}, "safe_lag": "PT0S",
        "target_table": f"public.{name}_tgt", "partitions": 2, "sink": STANDING,
        "cdc": {"target_table": f"public.{name}_rt", "serving_view": f"public.{name}_serving",
                "heartbeat": "PT1S", "group": schema}}))
    return Pipeline(settings, load_spec(path), path)


def status_line(pipe: Pipeline) -> str:
    wh = pipe.wh()
    try:
        report = collect(load_pipelines(pipe.path.parent), wh, lambda conn_id: pipe.src())
    finally:
        wh.close()
    return next(x for x in status_lines(report) if x.startswith(f"{pipe.spec.name}:"))


def test_a_reader_of_a_capture_groups_views_never_sees_part_of_a_tpcb_transaction(settings, tmp_path, bootstrap):
    schema = f"tpcb_{uuid.uuid4().hex[:8]}"
    _source(settings, schema)
    pipes = {key: _member(settings, tmp_path, schema, key) for key in ("a", "t")}
    later = tmp_path / "later"  # branches joins the running group of accounts and tellers
    later.mkdir()
    joining = _member(settings, later, schema, "b")
    lead = pipes["a"]
    capture = capture_of(lead.spec, [p.spec for p in pipes.values()])
    assert capture.lead.name == lead.spec.name and capture.grouped
    launcher = LocalLauncher(tmp_path / "streams")
    client, endpoint = ConnectClient(settings.connect_url), source_endpoint(settings)
    wh = lead.wh()
    reader = Reader(settings, {k: p.spec.cdc.serving_view for k, p in [*pipes.items(), ("b", joining)]})
    bench = None

    def capture_cycle(capture) -> tuple[str, str | None]:
        source = psycopg2.connect(settings.dsn(settings.source_db))
        try:
            return supervise_capture(capture, wh, source, client, endpoint,
                                     Policy(trigger_interval=timedelta(seconds=1), restart_budget=2),
                                     datetime.now(timezone.utc), replication=settled_replication(settings.kafka_bootstrap))
        finally:
            source.close()

    def sink_cycle(specs) -> str:  # the lead's sink only: the others' batches are loaded here (their desired: stopped)
        return run_cycle(specs, wh, launcher, settings.kafka_bootstrap, lambda s: submit_command(
            settings, jobs.SINK_JOB, lead.sink_args(available_now=False), secret=settings.pg_password)
        ).decisions[lead.spec.name].action

    try:
        with wh, wh.cursor() as cur:
            ledger.ensure_control_schema(cur)
            for key in ("t", "b"):
                ledger.set_desired(cur, f"{schema}_{key}", "stopped", "test")
        for pipe in [*pipes.values(), joining]:
            prepare_stream_tables(pipe.spec, wh, pipe.src)
        with wh, wh.cursor() as cur:  # for the reader: empty until branches has joined and handed off
            ensure_cdc_serving_view(cur, joining.spec)
        grant(settings, capture)  # one publication of the two tables and the group's heartbeat
        assert sink_cycle([p.spec for p in pipes.values()]) == "start"
        reader.start()
        bench = _pgbench(settings, schema, "-c", "4", "-R", "100", "-T", "900", "-n")  # 100 TPC-B transactions a second

        # the lead's handoff makes the group's slot; its standing sink commits it once the stream passed it
        plan = lead.plan("handoff")
        assert plan.handoff
        attempt = lead.begin(plan)
        lead.end(plan, attempt, lead.extract(plan, attempt))
        line, failure = capture_cycle(capture)
        assert "action=create" in line and failure is None, line
        until("the lead's handoff committed by its standing sink",
              lambda: lead.state(plan.batch_id, attempt) == "committed", timeout=240)
        assert reader.polls and reader.rows() == 0, "no view may show a row before every handoff"
        line = status_line(pipes["t"])  # make status, on a member's row: its group, and why its view is empty
        assert (f"capture: capture group {schema} (members {schema}_a, {schema}_t; one transaction whole across "
                "them): its serving views show NO row until every member's handoff has committed" in line), line
        # tellers reads its table in a snapshot taken after the slot, and waits for the stream to pass it
        member_plan, member_attempt = pipes["t"].run("handoff-t")
        assert member_plan.handoff
        with wh, wh.cursor() as cur:
            assert ledger.snapshot_wal(cur, member_plan.batch_id, member_attempt) <= ledger.stream_position(
                cur, capture.consumer)
        until("both views showing their rows", lambda: reader.rows() == 100_000 + 10, timeout=120)

        # branches joins: its spec beside the others'; its handoff waits until the connector captures its table
        pipes["b"] = joining = _member(settings, tmp_path, schema, "b")
        capture = capture_of(lead.spec, [p.spec for p in pipes.values()])
        with pytest.raises(GroupNotStreaming, match=f"waits for capture group {schema}'s connector to capture"):
            joining.plan("handoff-b")
        line, failure = capture_cycle(capture)  # the source's owner has not added it to the publication yet
        assert "capture: not set up" in line and f"ALTER PUBLICATION \"tidemark_group_{schema}\" ADD TABLE" in failure, failure
        grant(settings, capture)  # the group's grants again, as `make grants` prints them: the publication set
        line, failure = capture_cycle(capture)
        assert "action=update" in line and failure is None, line
        with wh, wh.cursor() as cur:
            assert sorted(ledger.group_streamed(cur, schema)) == sorted(p.spec.name for p in pipes.values())
        assert sink_cycle([p.spec for p in pipes.values()]) == "reconfigure"  # the lead reads branches' topic too
        until("the restarted lead reading the group's three members", lambda: len(lead.query_wh(
            f"SELECT unnest(members) FROM tidemark_control.capture_groups WHERE name = '{schema}'")) == 3, timeout=180)
        member_plan, member_attempt = joining.run("handoff-b")
        assert member_plan.handoff
        until("every view showing its rows", lambda: reader.rows() == 100_000 + 10 + 1, timeout=120)
        assert "its serving views show rows (every member's handoff committed)" in status_line(pipes["b"])
        assert sink_cycle([p.spec for p in pipes.values()]) == "none"  # started for the group as it is now
        time.sleep(20)  # the stream goes on under pgbench
        bench.terminate()
        bench.communicate(timeout=60)
        bench = None

        src = lead.src()
        try:
            with src, src.cursor() as cur:  # the quiet point: the source key by key
                cur.execute(f"SELECT count(*) FROM {schema}.pgbench_history")
                transactions = cur.fetchone()[0]
                expected = {}
                for key, (table, pk, balance) in TABLES.items():
                    cur.execute(f"SELECT {pk}, {balance} FROM {schema}.{table} ORDER BY {pk}")
                    expected[key] = cur.fetchall()
        finally:
            src.close()
        assert transactions > 100, transactions
        for key, (_, pk, balance) in TABLES.items():
            view = pipes[key].spec.cdc.serving_view
            until(f"{view} equal to the source key by key", lambda: lead.query_wh(
                f"SELECT {pk}, {balance} FROM {view} ORDER BY {pk}") == expected[key], timeout=180)
        time.sleep(1)
        reader.stop.set()
        reader.join(timeout=30)
        assert reader.error is None, reader.error
        shown = [p for p in reader.polls if sum(p[3:])]
        # a proof over nothing proves nothing: the views were read with rows, under pgbench, many times
        assert len(shown) > 50 and len({p[0] for p in shown}) > 10, (len(shown), shown[-3:])
        assert reader.unequal() == [], f"{len(reader.unequal())} of {len(reader.polls)} polls saw part of a " \
                                       f"transaction: {reader.unequal()[:5]}"
        with wh, wh.cursor() as cur:
            cur.execute("SELECT count(*) FROM tidemark_control.sink_rejects WHERE consumer = %s",
                        (ledger.consumer_for(lead.spec.name),))
            assert cur.fetchone()[0] == 0
    finally:
        if bench is not None:
            bench.terminate()
            bench.communicate(timeout=60)
        reader.stop.set()
        launcher.stop(lead.spec.name, grace_s=5)
        wh.close()
        remove_capture(settings, lead.spec)
        conn = psycopg2.connect(settings.dsn(settings.source_db))
        try:
            with conn, conn.cursor() as cur:
                cur.execute(f"DROP SCHEMA {schema} CASCADE")
        finally:
            conn.close()

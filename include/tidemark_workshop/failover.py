"""Failover trials on a replicated cluster: whatever node dies, every row and event has exactly one effect.

One pipeline of account balances with a standing events stream, on three Kafka nodes and a Spark
standalone cluster of two workers. Writers move money between two accounts in one transaction (the
sum never changes), most of them on a few hot accounts updated faster than the safe lag; a producer
publishes events without pause; a reader polls the serving view. Each trial runs a nightly batch as the
DAG does (a failed step is tried again from begin, as a new attempt) and, at a seeded moment, does one
of: ``leader_kill`` (kill -9 of the node leading a partition of the pipeline's topic), ``broker_stop``
(a node stopped cleanly), ``worker_kill`` (kill -9 of a Spark worker, with the executors on it). The
node comes back after a seeded pause; a standing sink that died is started again, as the supervisor
does. Then the writers pause, a batch without a fault catches up, and the trial is checked key by key:
the target equals the source, every event delivered is in the real-time table once with its amount,
and the reader never saw a sum but the constant one (no half transaction). It prints each trial's time
to recover: from the fault until the batch in flight committed and an event published after the fault
was applied.

``make campaign-failover`` runs it (TRIALS=, SEED=) on a replicated site beside the stack (three Kafka nodes,
a Spark master and two workers, on ports from 26000; the stack's PostgreSQL); ``make test`` runs a seeded
trial of each kind on the same.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path

from tidemark import ledger
from tidemark.batch import steps
from tidemark.protocol.kafka_io import end_offsets, producer_config
from tidemark.spark import jobs
from tidemark.streams.cycle import prepare_stream_tables
from tidemark.streams.launch import LocalLauncher
from tidemark_workshop.settings import Settings
from tidemark_workshop.stack.batchrun import PAYMENTS_DDL, Pipeline, make_pipeline
from tidemark_workshop.stack.kafka import Kafka
from tidemark_workshop.stack.spark import StandaloneCluster, submit_command

KINDS = ("leader_kill", "broker_stop", "worker_kill")
# accounts 1-5 are hot (most transfers start there), up to ACTIVE busy; one transfer in forty touches one of the
# rest, so many are settled (unchanged since before a batch's window end) when the faulted batch commits
ACCOUNTS, ACTIVE, HOT, OPENING = 200, 100, 5, Decimal("1000.00")
FIRST_EVENT = 1_000_000  # event ids above every account's
TRIES = 6  # attempts of one batch before the trial is a failure (the DAG: retries, then a person clears it)
COMMIT_WAIT_S = 240.0


@dataclass
class Trial:
    number: int
    kind: str
    at_s: float  # the fault, seconds after the batch started
    node: str = ""
    attempts: int = 0
    sink_restarts: int = 0
    retried: list[str] = field(default_factory=list)  # why an attempt was given up (the next one loaded the batch)
    recover_s: float | None = None  # the later of the two below
    batch_s: float | None = None  # from the fault until the batch in flight committed (None: it committed before)
    stream_s: float | None = None  # from the fault until the first event published after it was applied
    settled: int = 0  # accounts compared once the faulted batch committed and the node is back, writers going
    lost: int = 0
    duplicated: int = 0
    rows: int = 0  # what was compared: accounts key by key, events applied, sums the reader saw
    events: int = 0
    reads: int = 0
    problems: list[str] = field(default_factory=list)

    def line(self) -> str:
        recover = (f"{self.recover_s:.1f} s (batch {_s(self.batch_s)}, stream {_s(self.stream_s)})"
                   if self.recover_s is not None else "not measured")
        return (f"trial {self.number}: {self.kind} of {self.node} {self.at_s:.1f} s into the batch; "
                f"{self.attempts} attempt(s) over its 2 batches, {self.sink_restarts} sink restart(s); recovered in "
                f"{recover}; compared {self.settled} settled accounts under load, then {self.rows} accounts, "
                f"{self.events} events, {self.reads} reads of the serving view; lost {self.lost}, duplicated {self.duplicated}"
                + (f"; attempts given up: {self.retried}" if self.retried else "") + (f"; PROBLEMS: {self.problems}" if self.problems else ""))


def _s(seconds: float | None) -> str:
    return f"{seconds:.1f} s" if seconds is not None else "-"


@dataclass
class Cluster:
    """What the trials break: the Kafka nodes and the Spark workers the pipeline runs on."""
    kafka: Kafka
    spark: StandaloneCluster

    def check(self) -> None:
        if len(self.kafka.nodes) < 3 or len(self.spark.workers) < 2:
            raise SystemExit(f"failover trials need 3 Kafka nodes and 2 Spark workers, not {len(self.kafka.nodes)} "
                             f"and {len(self.spark.workers)}")


SITE_PORTS = 26000  # the replicated site's: Kafka 26092-26097, Spark's master 26077 (its UI 26080, workers' 26081-)


@contextmanager
def replicated_site(settings: Settings, home: Path, *, base: int = SITE_PORTS) -> Iterator[tuple[Settings, Cluster]]:
    """Three Kafka nodes and a Spark master with two workers beside the stack (its PostgreSQL serves both), on
    ports from ``base``, their state in ``home``; the settings that reach them. Stopped at the end."""
    site = replace(settings, kafka_port=base + 92, kafka_controller_port=base + 93, kafka_nodes=3,
                   spark_master=f"spark://127.0.0.1:{base + 77}")
    kafka = Kafka(site, home / "kafka")
    spark = StandaloneCluster(site, home / "spark", port=base + 77, ui_port=base + 80,
                              worker_ui_ports=[base + 81, base + 82])
    try:
        kafka.start()
        with spark:
            yield site, Cluster(kafka, spark)
    finally:
        kafka.stop()


class Load:
    """The writers, the events producer and the serving view's reader, each a thread, until ``stop``; the
    writers and the producer pause while ``going`` is clear. A thread that fails says why (``errors``) and
    goes on; ``writes`` and ``delivered`` show that load flowed."""

    def __init__(self, pipe: Pipeline, rng: random.Random):
        from confluent_kafka import Producer

        self.pipe = pipe
        self.producer = Producer(producer_config(pipe.settings.kafka_bootstrap))
        self.delivered: dict[int, Decimal] = {}  # written only by delivery reports, in the publisher's polls
        self.produced_at: dict[int, float] = {}
        self.writes = 0
        self.reads: Counter = Counter()  # (count, sum) the reader saw
        self.wrong_sums: list[tuple[int, Decimal]] = []
        self.errors: list[str] = []
        self.going = threading.Event()
        self._stop = threading.Event()
        self.next_event = FIRST_EVENT
        seeds = [rng.random(), rng.random()]
        self._threads = [threading.Thread(target=self._write, args=(random.Random(seeds[0]),), daemon=True),
                         threading.Thread(target=self._publish, args=(random.Random(seeds[1]),), daemon=True),
                         threading.Thread(target=self._read, daemon=True)]

    def start(self) -> Load:
        self.going.set()
        for t in self._threads:
            t.start()
        return self

    def alive(self) -> bool:
        return all(t.is_alive() for t in self._threads)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)
        self.producer.flush(60)

    def _looping(self, what: str, step) -> None:
        while not self._stop.is_set():
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - said, and the loop goes on (a trial checks that load flowed)
                self.errors.append(f"{what}: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}")
                time.sleep(1)

    def _write(self, rng: random.Random) -> None:
        table, conn = self.pipe.spec.table, None

        def transfer() -> None:
            nonlocal conn
            if not self.going.wait(0.2):
                return
            a = rng.randint(1, HOT if rng.random() < 0.7 else ACTIVE)  # mostly a hot account
            b = rng.randint(1, (ACTIVE if rng.random() < 0.95 else ACCOUNTS) - 1)
            b += b >= a  # another account
            amount = Decimal(rng.randint(1, 5000)).scaleb(-2)
            if conn is None or conn.closed:
                conn = self.pipe.src()
            with conn, conn.cursor() as cur:  # one transaction: the sum of all balances never changes
                cur.execute(f"UPDATE {table} SET amount = amount + CASE id WHEN %s THEN -%s ELSE %s END, "
                            "updated_at = now() WHERE id IN (%s, %s)", (a, amount, amount, a, b))
            self.writes += 1
            time.sleep(0.05)

        self._looping("writer", transfer)

    def _publish(self, rng: random.Random) -> None:
        topic = self.pipe.spec.stream.topic

        def publish() -> None:
            if not self.going.wait(0.2):
                return
            i, amount = self.next_event, Decimal(rng.randint(1, 99_999)).scaleb(-2)
            value = json.dumps({"id": i, "amount": 0, "currency": "EUR",
                                "updated_at": f"2099-01-01T00:00:00.{i % 1_000_000:06d}Z"}
                               ).replace('"amount": 0', f'"amount": {amount}').encode()
            self.produced_at[i] = time.monotonic()
            self.producer.produce(topic, key=b"EUR", value=value,
                                  on_delivery=lambda err, _msg, i=i, a=amount: err or self.delivered.__setitem__(i, a))
            self.next_event += 1
            self.producer.poll(0)
            time.sleep(0.05)

        self._looping("publisher", publish)

    def _read(self) -> None:
        view, conn = self.pipe.spec.stream.serving_view, None

        def read() -> None:
            nonlocal conn
            if conn is None or conn.closed:
                conn = self.pipe.wh()
            with conn, conn.cursor() as cur:
                cur.execute(f"SELECT count(*), coalesce(sum(amount), 0) FROM {view} WHERE id <= %s", (ACCOUNTS,))
                seen = cur.fetchone()
            self.reads[seen] += 1
            if seen != (ACCOUNTS, OPENING * ACCOUNTS):  # an account missing, or a transfer half applied
                self.wrong_sums.append(seen)
            time.sleep(0.25)

        self._looping("reader", read)


@dataclass
class Campaign:
    seed: int
    trials: list[Trial] = field(default_factory=list)
    topic_duplicates: int = 0  # events the topic holds twice (a producer's retry across a kill), each applied once

    def summary(self) -> dict:
        recovered = sorted(t.recover_s for t in self.trials if t.recover_s is not None)
        return {"trials": len(self.trials), "seed": self.seed, "kinds": dict(Counter(t.kind for t in self.trials)),
                "lost": sum(t.lost for t in self.trials), "duplicated": sum(t.duplicated for t in self.trials),
                "topic_duplicates": self.topic_duplicates,
                "recover_s": {"max": round(recovered[-1], 1) if recovered else None,
                              "median": round(recovered[len(recovered) // 2], 1) if recovered else None},
                "ok": bool(self.trials) and all(not t.problems and t.recover_s is not None for t in self.trials)}


def run(settings: Settings, cluster: Cluster, workdir: Path, trials: int, seed: int, log=print) -> Campaign:
    cluster.check()
    rng = random.Random(seed)
    unique = f"{seed}_{int(time.time())}"
    stream = {"topic": f"it_failover_{unique}", "key": "currency", "event_time": "updated_at",
              "target_table": f"public.it_failover_{unique}_rt",
              "serving_view": f"public.it_failover_{unique}_serving"}
    pipe = make_pipeline(settings, workdir, PAYMENTS_DDL, transport="kafka", safe_lag="PT1S", stream=stream,
                         write_mode="upsert", sink={"mode": "standing", "trigger": "PT0.5S", "heartbeat": "PT1S"})
    src = pipe.src()
    with src, src.cursor() as cur:
        cur.execute(f"INSERT INTO {pipe.spec.table} (id, amount) SELECT g, %s FROM generate_series(1, %s) g",
                    (OPENING, ACCOUNTS))
    src.close()
    wh = pipe.wh()
    with wh, wh.cursor() as cur:
        ledger.ensure_control_schema(cur)
    prepare_stream_tables(pipe.spec, wh, pipe.src)
    wh.close()
    sink = StandingSink(pipe, workdir)
    log(f"failover trials: {trials} trials, seed {seed}, pipeline {pipe.spec.name}, Kafka {settings.kafka_bootstrap}, "
        f"Spark {settings.spark_master}")
    sink.start()
    load = Load(pipe, rng)
    done = Campaign(seed)
    try:
        opening = Trial(0, "none", 0.0)
        _batch(pipe, sink, "opening", opening)  # the opening balances, before the reader counts
        if opening.problems:
            raise RuntimeError(f"the opening batch failed, no trial can run: {opening.problems}")
        load.start()
        kinds: list[str] = []
        for number in range(1, trials + 1):
            if not kinds:  # every kind once in each run of three, in a seeded order (a handful: in KINDS' order)
                kinds = list(KINDS) if trials <= len(KINDS) else rng.sample(KINDS, len(KINDS))
            trial = Trial(number, kinds.pop(0), rng.uniform(1.0, 15.0))
            _trial(pipe, sink, cluster, load, trial, rng)
            log(f"  {trial.line()}")
            done.trials.append(trial)
        load.stop()
        done.topic_duplicates = topic_duplicates(pipe.spec.stream.topic, settings.kafka_bootstrap)
    finally:
        load.stop()
        sink.stop()
    return done


class StandingSink:
    """The pipeline's standing sink on the cluster, started again when it dies (the supervisor's part)."""

    def __init__(self, pipe: Pipeline, workdir: Path):
        self.pipe, self.name = pipe, pipe.spec.name
        self.launcher = LocalLauncher(workdir / "streams")
        self.argv, self.env = submit_command(pipe.settings, jobs.SINK_JOB, pipe.sink_args(available_now=False),
                                             secret=pipe.settings.pg_password)

    def start(self) -> None:
        self.launcher.start(self.name, self.argv, self.env)

    def keep(self) -> int:
        """Start it again if it died (its lease freed first, as the supervisor does); 1 if it was restarted."""
        if self.launcher.status(self.name).alive:
            return 0
        wh = self.pipe.wh()
        try:
            with wh, wh.cursor() as cur:
                beat = ledger.heartbeat(cur, self.name)
                if beat is not None:
                    ledger.end_lease(cur, self.name, beat["fence"])
        finally:
            wh.close()
        self.start()
        return 1

    def stop(self) -> None:
        self.launcher.kill(self.name)


def _trial(pipe: Pipeline, sink: StandingSink, cluster: Cluster, load: Load, trial: Trial, rng: random.Random) -> None:
    pause = rng.uniform(5.0, 15.0)  # how long the broken node stays down
    fault: dict[str, object] = {}
    writes, delivered = load.writes, len(load.delivered)

    def strike() -> None:
        try:
            fault["at"], fault["event"] = time.monotonic(), load.next_event  # the first event after the fault
            watcher = threading.Thread(target=lambda: fault.update(applied=_applied(pipe, [fault["event"]], trial)))
            watcher.start()
            trial.node, mend = _break(cluster, trial.kind, pipe, rng)
            time.sleep(pause)
            mend()
            watcher.join()
        except Exception as exc:  # noqa: BLE001 - the trial fails with it
            fault["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"

    striker = threading.Timer(trial.at_s, strike)
    striker.start()
    plan, committed_at = _batch(pipe, sink, f"trial-{trial.number}", trial)
    striker.join()
    if "error" in fault or "at" not in fault:
        trial.problems.append(f"the fault failed: {fault.get('error', 'it never happened')}")
        return
    at = fault["at"]
    trial.batch_s = committed_at - at if committed_at is not None and committed_at > at else None
    trial.stream_s = fault["applied"] - at if fault.get("applied") is not None else None
    trial.recover_s = max(t for t in (trial.batch_s, trial.stream_s, 0.0) if t is not None)
    if plan is not None and committed_at is not None:
        _compare_below(pipe, plan, trial)  # under load: the rows the faulted batch settled
    # quiet: the writers and the producer pause, a batch without a fault carries what is left; then key by key
    load.going.clear()
    time.sleep(pipe.spec.safe_lag.total_seconds() + 1.5)
    _batch(pipe, sink, f"trial-{trial.number}-check", trial)
    _compare(pipe, load, sink, trial)
    if load.writes == writes or len(load.delivered) == delivered or not load.alive() or load.errors:
        trial.problems.append(f"the load did not flow: {load.writes - writes} transfers, "
                              f"{len(load.delivered) - delivered} events delivered, threads alive {load.alive()}, "
                              f"errors {load.errors[:3]}")
        load.errors.clear()
    load.going.set()


def _break(cluster: Cluster, kind: str, pipe: Pipeline, rng: random.Random):
    """Break one node; what was broken, and how to mend only that."""
    if kind == "leader_kill":  # the leader of a batch partition, or of the events' partition
        topic = rng.choice([pipe.spec.topic, pipe.spec.stream.topic])
        ends = end_offsets(pipe.settings.kafka_bootstrap, topic)
        partition = max(ends, key=ends.get) if topic == pipe.spec.stream.topic else rng.randrange(len(ends))
        node = cluster.kafka.leader(topic, partition)
        os.killpg(node.pid(), signal.SIGKILL)
        return f"Kafka node {node.node} (leader of {topic}/{partition}), kill -9", lambda: _restart(node)
    if kind == "broker_stop":
        node = rng.choice(cluster.kafka.nodes)
        node.stop()
        return f"Kafka node {node.node}, stopped", lambda: _restart(node)
    worker = rng.choice(cluster.spark.workers)
    os.killpg(cluster.spark.pid(worker), signal.SIGKILL)
    return f"Spark {worker}, kill -9", cluster.spark.start


def _restart(node) -> None:
    node.spawn()
    node.wait()


def _batch(pipe: Pipeline, sink: StandingSink, run_id: str, trial: Trial) -> tuple[steps.Plan | None, float | None]:
    """One batch as the DAG runs it: plan, then begin, extract and END, tried again from begin (a new attempt)
    while a step fails; committed by the standing sink. Its plan and when it committed (monotonic), or None."""
    plan, last = None, ""
    for _ in range(TRIES):
        try:
            plan = plan or pipe.plan(run_id)
            trial.attempts += 1
            attempt = pipe.begin(plan)
            report_path = pipe.path.with_suffix(f".{run_id}.{attempt}.json")
            report = pipe.extract_job(plan, attempt, report_path)
            if report.returncode != 0:
                said = [line for line in report.stderr.splitlines() if re.search(r"FAILED|Error|Exception", line)]
                raise RuntimeError(f"extract exited {report.returncode}: {(said or ['(no error line)'])[-1][-300:]}")
            pipe.end(plan, attempt, json.loads(report_path.read_text()))
            deadline = time.monotonic() + COMMIT_WAIT_S
            while time.monotonic() < deadline:
                trial.sink_restarts += sink.keep()
                wh = pipe.wh()
                try:
                    if steps.commit_state(pipe.spec, wh, plan.batch_id, attempt):
                        return plan, time.monotonic()
                finally:
                    wh.close()
                time.sleep(0.5)
            raise RuntimeError(f"attempt {attempt} not committed within {COMMIT_WAIT_S:.0f} s")
        except Exception as exc:  # noqa: BLE001 - as Airflow retries a task: the next attempt, after a pause
            last = f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}"
            trial.retried.append(last[:160])
            time.sleep(5)
    trial.problems.append(f"batch {run_id} not committed after {TRIES} attempts: {last}")
    return plan, None


def _applied(pipe: Pipeline, ids: list[int], trial: Trial, sink: StandingSink | None = None) -> float | None:
    """When every event in ``ids`` is in the real-time table (monotonic), or None within the wait."""
    deadline = time.monotonic() + COMMIT_WAIT_S
    while time.monotonic() < deadline:
        if sink is not None:
            trial.sink_restarts += sink.keep()
        found = pipe.query_wh(f"SELECT count(*) FROM {pipe.spec.stream.target_table} WHERE id = ANY(%s)", (ids,))
        if found[0][0] == len(ids):
            return time.monotonic()
        time.sleep(0.2)
    trial.problems.append(f"{len(ids)} delivered event(s) not applied within {COMMIT_WAIT_S:.0f} s")
    return None


def _compare_below(pipe: Pipeline, plan: steps.Plan, trial: Trial) -> None:
    """Right after the faulted batch commits, writers still going: every account last changed before its window's
    end holds in the target the source's value (the batch read them in a snapshot after that end; nothing but
    a batch changes the target). The source first: a row that changes meanwhile kept that value in the target."""
    table, hi = pipe.spec.table, plan.window.hi.cursor
    source = dict(_query(pipe.src, f"SELECT id, amount FROM {table} WHERE updated_at < %s", (hi,)))
    target = dict(_query(pipe.wh, f"SELECT id, amount FROM {pipe.spec.target_table} WHERE id = ANY(%s)",
                         (list(source),)))
    wrong = [k for k in source if target.get(k) != source[k]]
    trial.settled = len(source)
    trial.lost += len(wrong)
    if wrong:
        trial.problems.append(f"after the faulted batch: {len(wrong)} of {len(source)} settled accounts differ "
                              f"from the source (first: {wrong[:5]})")


def _query(connect, sql: str, params=()) -> list[tuple]:
    conn = connect()
    try:
        with conn, conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall()
    finally:
        conn.close()


def _compare(pipe: Pipeline, load: Load, sink: StandingSink, trial: Trial) -> None:
    source, target = pipe.rows("source", "amount"), pipe.rows("target", "amount")
    trial.rows, trial.reads = len(source), sum(load.reads.values())
    load.reads.clear()
    if len(source) != ACCOUNTS:
        trial.problems.append(f"the source holds {len(source)} accounts, not {ACCOUNTS}: nothing to compare")
    if source != target:
        missing = [k for k in source if k not in target]
        changed = [k for k in source if k in target and source[k] != target[k]]
        extra = [k for k in target if k not in source]
        trial.lost += len(missing) + len(changed)  # a lost update leaves the old amount
        trial.duplicated += len(extra)
        trial.problems.append(f"batch target: {len(missing)} missing, {len(changed)} different, {len(extra)} extra "
                              f"(first: {(missing + changed + extra)[:5]})")
    time.sleep(0.3)  # a produce in flight when the producer paused
    if load.producer.flush(60):
        trial.problems.append("events still unacknowledged 60 s after the producer paused")
    delivered = dict(load.delivered)
    _applied(pipe, sorted(delivered), trial, sink)
    rt = pipe.spec.stream.target_table
    # one row per event id (a redelivery is a no-op by the table's key): an event applied twice, or another's
    # version applied, shows as a row whose amount is not its own
    applied = dict(pipe.query_wh(f"SELECT id, amount FROM {rt}"))
    trial.events = len(applied)
    missing = [i for i in delivered if i not in applied]
    different = [i for i in applied if i in delivered and delivered[i] != applied[i]]
    unconfirmed = [i for i in applied if i not in delivered]
    trial.lost += len(missing)
    trial.duplicated += len(different)
    if missing or different or unconfirmed:
        trial.problems.append(f"events: {len(missing)} delivered but not applied, {len(different)} with another "
                              f"amount, {len(unconfirmed)} applied without a delivery report (of {len(delivered)})")
    if not delivered or not trial.reads:
        trial.problems.append(f"nothing to compare: {len(delivered)} events delivered, {trial.reads} reads of the view")
    if load.wrong_sums:
        trial.problems.append(f"the serving view showed {len(load.wrong_sums)} (count, sum) but ({ACCOUNTS}, "
                              f"{OPENING * ACCOUNTS}): a missing account or half a transfer; first {load.wrong_sums[:3]}")
        load.wrong_sums.clear()


def topic_duplicates(pipe_topic: str, bootstrap: str) -> int:
    """Events the topic holds more than once (a producer's retry): each must have been applied once."""
    from tidemark.protocol.kafka_io import read_committed

    ids = Counter(json.loads(r.value)["id"] for r in read_committed(bootstrap, pipe_topic, {}) if r.value)
    return sum(n - 1 for n in ids.values() if n > 1)


def main(argv: list[str] | None = None) -> int:
    import argparse
    import tempfile

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--seed", type=int, default=random.SystemRandom().randrange(1 << 31))
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tidemark-failover-") as workdir, \
            replicated_site(Settings.from_env(), Path(workdir) / "site") as (site, cluster):
        campaign = run(site, cluster, Path(workdir), args.trials, args.seed)
    result = campaign.summary()
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

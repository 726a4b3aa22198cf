"""Kill -9 trials of a standing sink: whatever moment it dies, every input has exactly one effect.

One pipeline with a stream; each trial publishes events (good ones, malformed ones, redeliveries)
and now and then a nightly batch, starts the standing sink (the real Spark job) and kills its whole
process group at a seeded moment: at a lifecycle point the job reaches (``tidemark.protocol.faults``:
between staging and commit, just before the PostgreSQL commit, between the commit and the
dead-letter write, between the dead-letter write and its mark) or after a random delay (start-up,
mid-stream). A last start without a fault lets it catch up; then the real-time table holds every
good event once, the batch target every source row once, and ``sink_rejects`` and the dead-letter
topic every malformed event once: set equality, counts and control totals against the input.

``make kill-trials`` runs a campaign (TRIALS=, SEED=); ``make test`` runs a seeded one.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

from tidemark import ledger
from tidemark.protocol.faults import ENV as KILL_AT
from tidemark.protocol.kafka_io import end_offsets, ensure_topic, producer_config
from tidemark.spark import jobs
from tidemark.streams.cycle import prepare_stream_tables
from tidemark.streams.launch import LocalLauncher
from tidemark_workshop.settings import Settings
from tidemark_workshop.stack.batchrun import PAYMENTS_DDL, Pipeline, dead_letters, insert_payments, make_pipeline
from tidemark_workshop.stack.spark import submit_command

GOOD_PER_TRIAL, BAD_PER_TRIAL, REPEATS_PER_TRIAL = 40, 3, 2
BATCH_EVERY = 10  # trials; a batch brings its own records, BEGIN/END and an apply to the trials
BATCH_ROWS = 30
ROTATION = ("timer", "before_commit", "timer", "committed", "timer", "dlq_published")
POINTS = {"staged": "between staging a batch's records and the commit",
          "before_commit": "just before the PostgreSQL commit",
          "committed": "between the commit and the dead-letter write",
          "dlq_published": "between the dead-letter write and its mark"}


@dataclass
class Campaign:
    trials: int
    seed: int
    kills: Counter = field(default_factory=Counter)  # trials per moment (a lifecycle point, or "timer")
    good: dict[int, Decimal] = field(default_factory=dict)  # event id -> amount
    bad: int = 0
    repeats: int = 0
    batches: int = 0
    problems: list[str] = field(default_factory=list)


def _bad_event(rng: random.Random, i: int) -> tuple[bytes | None, bytes]:
    kind = rng.randrange(4)
    if kind == 0:
        return b"EUR", f'{{"id": {i}, "amount": 1'.encode()  # cut short: not JSON
    if kind == 1:
        return None, _value(i, Decimal("1.00"))  # no key
    if kind == 2:
        return b"EUR", _value(i, Decimal("1.00")).replace(b'"amount": 1.00', b'"amount": "one"')  # wrong type
    return b"EUR", b'{"id": %d, "currency": "\xff"}' % i  # invalid UTF-8


def _value(i: int, amount: Decimal) -> bytes:
    # event times far after any batch window: a batch commit never compacts them away
    return json.dumps({"id": i, "amount": 0, "currency": "EUR", "updated_at": f"2099-01-01T00:00:00.{i:06d}Z"}
                      ).replace('"amount": 0', f'"amount": {amount}').encode()


def run(settings: Settings, workdir: Path, trials: int, seed: int, log=print) -> Campaign:
    from confluent_kafka import Producer

    rng = random.Random(seed)
    unique = f"{seed}_{int(time.time())}"
    stream = {"topic": f"it_kill_{unique}", "key": "currency", "event_time": "updated_at",
              "target_table": f"public.it_kill_{unique}_rt", "serving_view": f"public.it_kill_{unique}_serving"}
    pipe = make_pipeline(settings, workdir, PAYMENTS_DDL, write_mode="append_window_replace", stream=stream,
                         sink={"mode": "standing", "trigger": "PT0.5S", "heartbeat": "PT1S",
                               "max_offsets_per_trigger": 25})
    name, topic = pipe.spec.name, stream["topic"]
    wh = pipe.wh()
    with wh, wh.cursor() as cur:
        ledger.ensure_control_schema(cur)
    prepare_stream_tables(pipe.spec, wh, pipe.src)
    wh.close()
    ensure_topic(settings.kafka_bootstrap, topic, 3)
    launcher = LocalLauncher(workdir / "streams")
    argv, env = submit_command(settings, jobs.SINK_JOB, pipe.sink_args(available_now=False),
                               secret=settings.pg_password)
    producer = Producer(producer_config(settings.kafka_bootstrap))
    result = Campaign(trials, seed)
    next_id, source_rows = 1, 0
    log(f"kill trials: {trials} trials, seed {seed}, pipeline {name}")
    try:
        for trial in range(1, trials + 1):
            goods: list[tuple[bytes | None, bytes]] = []
            for _ in range(GOOD_PER_TRIAL):
                amount = Decimal(rng.randint(1, 99_999)).scaleb(-2)
                result.good[next_id] = amount
                goods.append((b"EUR", _value(next_id, amount)))
                next_id += 1
            published = goods + [_bad_event(rng, next_id + i) for i in range(BAD_PER_TRIAL)]
            next_id += BAD_PER_TRIAL
            published += rng.sample(goods, REPEATS_PER_TRIAL)  # redeliveries: no second row
            rng.shuffle(published)
            for key, value in published:
                producer.produce(topic, value=value, key=key)
            producer.flush(30)
            result.bad += BAD_PER_TRIAL
            result.repeats += REPEATS_PER_TRIAL
            # the moments: on batch trials between staging and commit; otherwise a seeded delay
            # and the other lifecycle points in turn, so a campaign of 7 or more reaches them all
            if trial % BATCH_EVERY == 1:
                insert_payments(pipe, source_rows + 1, source_rows + BATCH_ROWS)
                source_rows += BATCH_ROWS
                _send_batch(pipe, f"run-{trial}")
                result.batches += 1
                moment = "staged"
            else:
                moment = ROTATION[(trial - 1 - result.batches) % len(ROTATION)]
            _free_lease(pipe)
            how = _kill(launcher, name, argv, env, rng, moment)
            ended = launcher.status(name).exit_code
            if ended not in (None, 137):  # it ended by itself: not a kill trial
                result.problems.append(f"trial {trial}: the sink exited {ended} before the kill: "
                                       f"{launcher.log_tail(name, 5)}")
            result.kills[moment] += 1
            log(f"  trial {trial}/{trials}: {how}")
        _free_lease(pipe)
        how = _catch_up(launcher, name, argv, env, pipe, topic)
        log(f"  final start: {how}")
        result.problems += _verify(pipe, result, topic, source_rows, settings)
    finally:
        launcher.kill(name)
    return result


def _free_lease(pipe: Pipeline) -> None:
    """What the supervisor does before it launches the successor of a dead instance."""
    wh = pipe.wh()
    try:
        with wh, wh.cursor() as cur:
            beat = ledger.heartbeat(cur, pipe.spec.name)
            if beat is not None:
                ledger.end_lease(cur, pipe.spec.name, beat["fence"])
    finally:
        wh.close()


def _send_batch(pipe: Pipeline, run_id: str) -> None:
    plan = pipe.plan(run_id)
    attempt = pipe.begin(plan)
    pipe.end(plan, attempt, pipe.extract(plan, attempt))


def _kill(launcher: LocalLauncher, name: str, argv, env, rng: random.Random, moment: str) -> str:
    """Start the sink and kill it at ``moment`` (a lifecycle point, on a seeded pass through it,
    or a seeded delay after the start); returns how it died."""
    if moment != "timer":
        point, nth = moment, rng.randint(1, 2)
        launcher.start(name, argv, {**env, KILL_AT: f"{point}:{nth}"})
        deadline = time.monotonic() + 90
        while launcher.status(name).alive and time.monotonic() < deadline:
            time.sleep(0.2)
        if launcher.status(name).alive:  # the point was not reached (nothing of that kind to do): kill it now
            launcher.kill(name)
            return f"kill -9 after 90 s (point {point} not reached)"
        return f"kill -9 at {point} (pass {nth}): {POINTS[point]}"
    delay = rng.uniform(3.0, 12.0)  # start-up takes ~10 s: some die starting, some mid-stream
    launcher.start(name, argv, env)
    time.sleep(delay)
    launcher.kill(name)
    return f"kill -9 {delay:.1f} s after start"


def _catch_up(launcher: LocalLauncher, name: str, argv, env, pipe: Pipeline, topic: str) -> str:
    launcher.start(name, argv, env)
    consumer = ledger.consumer_for(name)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        ends = {t: end_offsets(pipe.settings.kafka_bootstrap, t) for t in (topic, pipe.spec.topic)}
        stored = {t: dict(pipe.query_wh("SELECT partition, next_offset FROM tidemark_control.sink_offsets "
                                        "WHERE consumer = %s AND topic = %s", (consumer, t))) for t in ends}
        events_done = all(stored[topic].get(p, 0) >= end for p, end in ends[topic].items())
        batches_done = all(stored[pipe.spec.topic].get(p, 0) >= end - 1 for p, end in ends[pipe.spec.topic].items())
        pending = pipe.query_wh("SELECT count(*) FROM tidemark_control.sink_rejects WHERE consumer = %s AND NOT in_dlq",
                                (consumer,))[0][0]
        if events_done and batches_done and not pending:
            return "caught up"
        if not launcher.status(name).alive:
            raise AssertionError(f"the final sink died: {launcher.log_tail(name, 60)}")
        time.sleep(1)
    raise AssertionError("the final sink did not catch up within 300 s")


def _verify(pipe: Pipeline, c: Campaign, topic: str, source_rows: int, settings: Settings) -> list[str]:
    problems = []
    rt = pipe.spec.stream.target_table
    rows = dict(pipe.query_wh(f"SELECT id, amount FROM {rt}"))
    if rows != c.good:
        missing, extra = set(c.good) - set(rows), set(rows) - set(c.good)
        changed = [i for i in set(rows) & set(c.good) if rows[i] != c.good[i]]
        problems.append(f"real-time table: {len(missing)} missing, {len(extra)} extra, {len(changed)} changed")
    total, expected = sum(rows.values(), Decimal(0)), sum(c.good.values(), Decimal(0))
    if total != expected:
        problems.append(f"real-time control total {total} != published {expected}")
    source, target = pipe.rows("source", "amount"), pipe.rows("target", "amount")
    if source != target or len(source) != source_rows:
        problems.append(f"batch target: {len(target)} rows for {len(source)} source rows ({source_rows} inserted)")
    consumer = ledger.consumer_for(pipe.spec.name)
    rejects = pipe.query_wh("SELECT partition, kafka_offset FROM tidemark_control.sink_rejects "
                            "WHERE consumer = %s AND topic = %s", (consumer, topic))
    if len(rejects) != c.bad or len(set(rejects)) != c.bad:
        problems.append(f"sink_rejects: {len(rejects)} rows, {len(set(rejects))} positions, for {c.bad} bad events")
    letters = Counter(d["tidemark.source"] for d in dead_letters(settings.kafka_bootstrap, topic))
    twice = [s for s, n in letters.items() if n > 1]
    expected_sources = {f"{topic}/{p}@{o}".encode() for p, o in rejects}
    if set(letters) != expected_sources or twice:
        problems.append(f"dead-letter topic: {sum(letters.values())} letters for {c.bad} bad events, "
                        f"{len(twice)} sent twice, {len(expected_sources - set(letters))} missing")
    return problems


def main(argv: list[str] | None = None) -> int:
    import argparse
    import tempfile

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--seed", type=int, default=random.SystemRandom().randrange(1 << 31))
    args = p.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tidemark-kill-trials-") as workdir:
        c = run(Settings.from_env(), Path(workdir), args.trials, args.seed)
    for problem in c.problems:
        print(f"PROBLEM: {problem}")
    print(json.dumps({"trials": c.trials, "seed": c.seed, "kills": dict(c.kills), "good_events": len(c.good),
                      "bad_events": c.bad, "redeliveries": c.repeats, "batches": c.batches,
                      "seconds": round(time.monotonic() - started), "ok": not c.problems}))
    return 1 if c.problems else 0


if __name__ == "__main__":
    raise SystemExit(main())

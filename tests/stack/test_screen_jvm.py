"""The events' screen as Spark runs it (tidemark.sink.job.screened, Java's regular expressions): it
passes exactly what the unit tests' Python stand-in passes, every event it passes is one the checks
accept, and an event repeating a field thousands of times is left to Python instead of overflowing
Java's stack (which would stop the standing sink at the same offsets on every restart); the widest
table screened passes its deepest events with half of HotSpot's default thread stack."""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import subprocess

import pytest

from tidemark_workshop.screen_fuzz import event_fields, event_text, passes, screen_rules, widest
from tidemark_workshop.settings import REPO_ROOT

pytestmark = pytest.mark.stack

# Runs in a Python of its own with a local Spark, its task threads' stack given: per case a screen and
# (key, value) pairs in, one verdict per pair out.
JOB = """
import json, pickle, sys
from pyspark.sql import SparkSession
from tidemark.sink.job import screened

cases = pickle.load(open(sys.argv[1], "rb"))
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.driver.extraJavaOptions", sys.argv[3]).getOrCreate())
out = []
for screen, pairs in cases:
    events = [(k, v, i) for i, (k, v) in enumerate(pairs)]
    df = spark.createDataFrame(events, "key binary, value binary, offset int").selectExpr("'t' AS topic", "*")
    verdicts = {r.offset: r.checked for r in screened(df, screen, "t").select("offset", "checked").collect()}
    out.append([verdicts[i] for i in range(len(events))])
jvm = list(spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
json.dump({"verdicts": out, "jvm": jvm}, open(sys.argv[2], "w"))
spark.stop()
"""
# Half of HotSpot's default thread stack (1 MB on 64-bit Linux): the widest screen's deepest events
# need between 256 and 512 KB in a task here, so they pass with twice that margin at the default and
# eight times it under Tidemark's own (tidemark.spark.jobs.THREAD_STACK_OPTION); with -Xss256k they overflow.
HALF_THE_DEFAULT_STACK = "-Xss512k"


def _jvm_verdicts(settings, tmp_path, cases) -> list[list[bool]]:
    (tmp_path / "cases.pickle").write_bytes(pickle.dumps([(rules.screen(), events) for rules, events in cases]))
    env = {**os.environ, **settings.runtime_env(), "PYTHONPATH": str(REPO_ROOT / "include")}
    proc = subprocess.run([str(settings.venv / "bin" / "python"), "-c", JOB, str(tmp_path / "cases.pickle"),
                           str(tmp_path / "verdicts.json"), HALF_THE_DEFAULT_STACK],
                          env=env, capture_output=True, text=True, timeout=300)
    thrown = next((line for line in proc.stderr.splitlines() if re.match(r"[\w.$]+(Error|Exception)\b", line)), "")
    assert proc.returncode == 0, f"{thrown}\n{proc.stderr[-5000:]}"  # java.lang.StackOverflowError, say
    out = json.loads((tmp_path / "verdicts.json").read_text())
    assert HALF_THE_DEFAULT_STACK in out["jvm"], out["jvm"]  # the task threads' stack is the one asked for
    return out["verdicts"]


def test_the_jvm_passes_what_the_python_stand_in_passes_and_only_what_the_checks_accept(settings, tmp_path):
    rules = screen_rules()
    rng = random.Random(20261128)
    base = '{"id":7,"amount":1.00,"currency":"EUR","updated_at":"2026-11-27T20:00:00Z"'
    events = [(b"7", (base + "}" + tail).encode()) for tail in ("", "\n", " \n", "\u0085", "\u2028", "\u2029")]
    events.append((b"7", (base + ',"memo":null' * 5000 + "}").encode()))  # a field 5,000 times: not a crash
    events.append((b"7", (base + ',"amount":1.00}').encode()))  # a field twice, within the fields' count: Python's
    for _ in range(3000):
        fields = event_fields(rng)
        events.append((rng.choice([str(fields["id"]).encode()] * 7 + [b"x", None]), event_text(rng, fields)))
    wide, deepest = widest()
    verdicts, at_the_cap = _jvm_verdicts(settings, tmp_path, [(rules, events), (wide, deepest)])

    # the widest table's events, in its order and in reverse: passed, and no stack overflowed on the way
    assert len(wide.screen().value) > 6000 and at_the_cap == [True] * len(deepest)
    assert all(passes(wide, k, v) and wide.check(k, v, None) is None for k, v in deepest)

    # Unicode line ends, a field said 5,000 times, one said twice: Python's
    assert verdicts[:3] == [True, True, True] and verdicts[3:8] == [False] * 5
    assert sum(verdicts) > 50
    for (key, value), jvm in zip(events, verdicts):
        assert jvm == passes(rules, key, value), (key, value[:300])
        if jvm:
            assert rules.check(key, value, None) is None, value

"""The events' screen as Spark runs it (tidemark.sink.job.screened, Java's regular expressions): it
passes exactly what the unit tests' Python stand-in passes, every event it passes is one the checks
accept, and an event repeating a field thousands of times is left to Python instead of overflowing
Java's stack (which would stop the standing sink at the same offsets on every restart)."""

from __future__ import annotations

import json
import os
import pickle
import random
import subprocess

import pytest

from tidemark_workshop.screen_fuzz import event_fields, event_text, passes, screen_rules
from tidemark_workshop.settings import REPO_ROOT

pytestmark = pytest.mark.stack

# Runs in a Python of its own with a local Spark: (key, value) pairs in, one verdict per pair out.
JOB = """
import json, pickle, sys
from pyspark.sql import SparkSession
from tidemark.sink.job import screened

screen = pickle.load(open(sys.argv[1], "rb"))
events = [(k.encode("latin-1") if k is not None else None, v.encode("latin-1"), i)
          for i, (k, v) in enumerate(json.load(open(sys.argv[2])))]
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
df = spark.createDataFrame(events, "key binary, value binary, offset int").selectExpr("'t' AS topic", "*")
verdicts = {r.offset: r.checked for r in screened(df, screen, "t").select("offset", "checked").collect()}
json.dump([verdicts[i] for i in range(len(events))], open(sys.argv[3], "w"))
spark.stop()
"""


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
    (tmp_path / "screen.pickle").write_bytes(pickle.dumps(rules.screen()))
    (tmp_path / "events.json").write_text(json.dumps([(k.decode("latin-1") if k is not None else None,
                                                       v.decode("latin-1")) for k, v in events]))
    env = {**os.environ, **settings.runtime_env(), "PYTHONPATH": str(REPO_ROOT / "include")}
    proc = subprocess.run([str(settings.venv / "bin" / "python"), "-c", JOB, str(tmp_path / "screen.pickle"),
                           str(tmp_path / "events.json"), str(tmp_path / "verdicts.json")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-5000:]
    verdicts = json.loads((tmp_path / "verdicts.json").read_text())

    # Unicode line ends, a field said 5,000 times, one said twice: Python's
    assert verdicts[:3] == [True, True, True] and verdicts[3:8] == [False] * 5
    assert sum(verdicts) > 50
    for (key, value), jvm in zip(events, verdicts):
        assert jvm == passes(rules, key, value), (key, value[:300])
        if jvm:
            assert rules.check(key, value, None) is None, value

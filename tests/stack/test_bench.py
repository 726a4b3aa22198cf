"""The batch benchmark's fast subset: the same script as `make bench`, on 20,000 rows.

It fails if any contender's copy differs from the source (the script checks counts and exact
amounts per currency) or if the figures the issue asks for are missing from its JSON line.
Speed itself is not asserted: that is what `make bench` is for.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tidemark_workshop.settings import REPO_ROOT


def test_bench_subset_reports_every_figure():
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "bench" / "batch_load.py"), "--rows", "20000", "--memory-rows", "10000,40000"],
        text=True, capture_output=True, timeout=900,
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["rows"] == 20000
    for key in ("tidemark_s", "copy_s", "spark_jdbc_s", "tidemark_standing_sink_s"):
        assert result[key] > 0, key
    assert result["ratio_vs_copy"] == round(result["tidemark_s"] / result["copy_s"], 2)
    assert result["ratio_vs_spark_jdbc"] == round(result["tidemark_s"] / result["spark_jdbc_s"], 2)
    assert set(result["sink_peak_mb"]) == {"10000", "20000", "40000"}
    assert all(mb > 100 for mb in result["sink_peak_mb"].values()), "a JVM and Python take more than that"
    assert all(s > 0 for s in result["jvm_startup_s"].values())

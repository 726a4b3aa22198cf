"""The benchmarks' fast subsets: the same scripts as `make bench`, `make bench-reconcile` (20,000 rows) and
`make bench-flood` (5,000 records).

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
        [sys.executable, str(REPO_ROOT / "bench" / "batch_load.py"), "--rows", "20000", "--memory-rows", "10000"],
        text=True, capture_output=True, timeout=900,
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["rows"] == 20000
    for key in ("tidemark_s", "copy_s", "spark_jdbc_s", "tidemark_standing_sink_s", "tidemark_local1_s"):
        assert result[key] > 0, key
    assert result["ratio_local2_vs_local1"] == round(result["tidemark_local1_s"] / result["tidemark_s"], 2)
    assert result["ratio_vs_copy"] == round(result["tidemark_s"] / result["copy_s"], 2)
    assert result["ratio_vs_spark_jdbc"] == round(result["tidemark_s"] / result["spark_jdbc_s"], 2)
    for job in ("sink", "extract"):
        assert set(result[f"{job}_peak_mb"]) == {"10000", "20000"}, job  # make bench: 1M, 2M and 4M rows
        assert all(mb > 100 for mb in result[f"{job}_peak_mb"].values()), "a JVM and Python take more than that"
        assert result[f"{job}_memory_growth"] > 0, job
    assert all(s > 0 for s in result["jvm_startup_s"].values())
    for busy in (result["cpu_busy_pct"], result["cpu_busy_pct_local1"]):  # the machine's, while each job ran
        assert set(busy) == {"extract", "sink"} and all(0 <= pct <= 100 for pct in busy.values()), busy


def test_reconcile_bench_subset_localises_exactly_the_changed_rows():
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "reconcile_batch.py"), "--rows", "20000"],
                          text=True, capture_output=True, timeout=600)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])  # the script itself checks the verdicts
    assert result["rows"] == 20000 and result["changed_found"] == 10
    for key in ("reconcile_s", "scan_s", "ratio_vs_scan", "localise_s", "rows_compared_fraction"):
        assert result[key] > 0, key


def test_flood_bench_subset_every_reject_reaches_the_dead_letter_topic_once():
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "reject_flood.py"), "--records", "5000"],
                          text=True, capture_output=True, timeout=600)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])  # the script checks sink_rejects and the DLQ
    assert result["records"] == 5000
    for key in ("good_s", "flood_s", "ratio_flood_vs_good", "rejects_per_s", "good_peak_mb", "flood_peak_mb"):
        assert result[key] > 0, key

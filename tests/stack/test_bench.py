"""The benchmarks' fast subsets: the same scripts as `make bench` with its peer (`make bench-peers`),
`make bench-reconcile` (20,000 rows), `make bench-flood` (5,000 records) and `make bench-cdc` (5,000
rows), and the stream peer's drain (20,000 events).

It fails if any contender's copy differs from the source (the script checks counts and exact
amounts per currency), if the figures the issue asks for are missing from its JSON line, or if the
batch benchmark's figures disagree with the ledger the loads left in the warehouse: each Tidemark
contender's batch committed with the rows the figures are for, and each time covers the load it
claims to time (from the plan to the commit, JVM start-up apart). Speed itself is not asserted:
that is what `make bench` is for.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import psycopg2

from tidemark_workshop.settings import REPO_ROOT, WAREHOUSE_DB


ROWS, MEMORY_ROWS = 20000, 10000
SLACK_S = 0.05  # the script rounds each figure to 0.01 s


def _clock(conn):
    with conn, conn.cursor() as cur:
        cur.execute("SELECT clock_timestamp()")
        return cur.fetchone()[0]


def _bench_batches(conn, since) -> list[dict]:
    """The batch benchmark's batches planned since ``since``, in order, with their latest attempt."""
    names = ("run_id", "state", "rows", "planned_at", "committed_at", "begun_at", "sealed_at")
    with conn, conn.cursor() as cur:
        cur.execute(r"""SELECT b.run_id, b.state, b.rows, b.planned_at, b.committed_at, a.begun_at, a.sealed_at
                          FROM tidemark_control.batches b
                          LEFT JOIN tidemark_control.batch_attempts a ON a.batch_id = b.batch_id AND a.attempt = b.attempt
                         WHERE b.pipeline LIKE 'bench\_ledger\_%%' AND b.planned_at >= %s
                         ORDER BY b.planned_at""", (since,))
        return [dict(zip(names, row)) for row in cur.fetchall()]


def _seconds(start, end) -> float:
    return (end - start).total_seconds()


def test_bench_subset_reports_every_figure_and_the_ledger_bears_them_out(warehouse_conn):
    since = _clock(warehouse_conn)
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "bench" / "batch_load.py"), "--rows", str(ROWS),
         "--memory-rows", str(MEMORY_ROWS), "--peers"],
        text=True, capture_output=True, timeout=900,
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in ("tidemark_s", "tidemark_wall_s", "copy_s", "spark_jdbc_s", "tidemark_standing_sink_s",
                "tidemark_local1_s", "ratio_local2_vs_local1", "ratio_vs_copy", "ratio_vs_spark_jdbc",
                "direct_s", "direct_ratio_vs_copy", "direct_ratio_vs_spark_jdbc", "ratio_direct_vs_kafka",
                "direct_standing_sink_s", "direct_standing_sink_ratio_vs_copy", "direct_standing_sink_ratio_vs_spark_jdbc",
                "debezium_s", "ratio_vs_debezium", "direct_ratio_vs_debezium", "debezium_ratio_vs_copy"):
        assert result[key] > 0, key
    assert result["debezium_rows"] >= ROWS  # the peer's snapshot takes the whole table (the script checks the window)
    for job in ("sink", "extract"):
        assert set(result[f"{job}_peak_mb"]) == {str(MEMORY_ROWS), str(ROWS)}, job  # make bench: 1M, 2M and 4M rows
        assert all(mb > 100 for mb in result[f"{job}_peak_mb"].values()), "a JVM and Python take more than that"
        assert result[f"{job}_memory_growth"] > 0, job
    assert set(result["jvm_startup_s"]) == {"extract", "sink"} and all(s > 0 for s in result["jvm_startup_s"].values())
    for busy in (result["cpu_busy_pct"], result["cpu_busy_pct_local1"]):  # the machine's, while each job ran
        assert set(busy) == {"extract", "sink"} and all(0 <= pct <= 100 for pct in busy.values()), busy

    # The ledger, written by the loads themselves: each Tidemark contender's batch really committed
    # the rows its figures are for (the timed batch at local[2], the standing sink, the timed batch
    # at local[1], the timed batch with transport: direct and again with a standing sink, then the memory
    # batch), in the order the script runs them.
    batches = _bench_batches(warehouse_conn, since)
    assert [(b["run_id"], b["state"], b["rows"]) for b in batches] == [
        ("bench-timed", "committed", ROWS), ("bench-standing", "committed", ROWS),
        ("bench-timed", "committed", ROWS), ("bench-timed", "committed", ROWS), ("bench-standing", "committed", ROWS),
        (f"bench-memory-{MEMORY_ROWS}", "committed", MEMORY_ROWS)], batches
    timed, standing, direct_standing = batches[0], batches[1], batches[4]
    # Each time covers the load it names: from before the plan until after the commit, less only
    # the JVM start-ups (which fall inside it), never a clock stopped before the commit.
    load = _seconds(timed["planned_at"], timed["committed_at"])
    startup = sum(result["jvm_startup_s"].values())
    assert result["tidemark_wall_s"] + SLACK_S >= load, (result["tidemark_wall_s"], load)
    assert startup < load, (result["jvm_startup_s"], load)
    assert result["tidemark_s"] + startup + SLACK_S >= load, (result["tidemark_s"], result["jvm_startup_s"], load)
    # a standing sink's time leaves out the extract's start-up, which lies between BEGIN and END
    for batch, seconds in ((standing, result["tidemark_standing_sink_s"]),
                           (direct_standing, result["direct_standing_sink_s"])):
        extract_span = _seconds(batch["begun_at"], batch["sealed_at"])
        standing_load = _seconds(batch["planned_at"], batch["committed_at"])
        assert seconds + extract_span + SLACK_S >= standing_load, (seconds, extract_span, standing_load)
    assert sum(result["direct_standing_sink_steps_s"].values()) <= result["direct_standing_sink_s"] + SLACK_S


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


def test_cdc_bench_subset_hands_off_under_writers_with_nothing_missing_or_twice():
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "cdc_handoff.py"), "--rows", "5000",
                           "--changes", "1000", "--rate", "300", "--seconds", "3"],
                          text=True, capture_output=True, timeout=900)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (result["missing"], result["duplicates"]) == (0, 0), result  # the script exits 1 otherwise
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    for key in ("snapshot_rows_per_s", "debezium_snapshot_rows_per_s", "snapshot_ratio_vs_debezium", "changes_per_s",
                "p50_ms", "p99_ms"):
        assert result[key] > 0, key


def test_the_stream_peer_drains_a_backlog_into_its_table(settings):
    """`make bench-peers`' stream half: Debezium's JDBC sink on the stack's worker drains keyed events
    (the plugin resolved from Maven, its connector run, its table and topic gone after)."""
    sys.path.insert(0, str(REPO_ROOT / "bench"))
    try:
        import peers
    finally:
        sys.path.remove(str(REPO_ROOT / "bench"))
    table = f"public.peer_subset_{uuid.uuid4().hex[:8]}"
    drained = peers.jdbc_sink_drain(settings, table, 20000, 3)
    assert drained["debezium_jdbc_sink_events_per_s"] > 0 and drained["debezium_jdbc_sink_drain_s"] >= 0, drained
    with psycopg2.connect(settings.dsn(WAREHOUSE_DB)) as conn, conn.cursor() as cur:
        cur.execute("SELECT to_regclass(%s)", (table,))
        assert cur.fetchone() == (None,)

"""Every file in dags/ imports cleanly in Airflow 3 and follows the authoring rules."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import PARSE_SECONDS
from tidemark_workshop.settings import REPO_ROOT

DAGS_DIR = REPO_ROOT / "dags"
DAG_FILES = sorted(p for p in DAGS_DIR.glob("*.py") if not p.name.startswith("_"))
# What only tasks need: the DAG processor parses every file again and again, so a DAG file (and what
# it imports at module level: the plugins, the core) must not load these (parse times are reported
# at the end of the run by conftest, not asserted: tests do not measure time).
TASK_ONLY_LIBRARIES = ("pyspark", "great_expectations", "pandas", "numpy", "pyarrow", "fastapi")
# A retry of the repair trigger would load a refused repair batch again (it names the next step instead).
NO_RETRIES = {("tidemark_reconcile.py", "repair")}
DAGLESS = {"tidemark_spec_errors.py"}  # only an import error, when a spec is invalid
REQUIRED_DAG_ARGS = {"schedule", "start_date", "catchup", "max_active_runs"}


def _dagbag(path: Path):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(path), safe_mode=False)


@pytest.fixture(scope="module")
def parsed() -> dict[Path, tuple[object, float]]:
    out = {}
    for path in DAG_FILES:
        t0 = time.perf_counter()
        bag = _dagbag(path)
        out[path] = (bag, time.perf_counter() - t0)
    return out


def test_there_are_dags():
    assert DAG_FILES, f"no DAG files in {DAGS_DIR}"


@pytest.mark.parametrize("path", DAG_FILES, ids=lambda p: p.name)
def test_imports_without_errors(parsed, path, record_property):
    bag, seconds = parsed[path]
    record_property(PARSE_SECONDS, (path.name, seconds))  # reported at the end of the run (conftest)
    assert bag.import_errors == {}, f"{path.name}: {bag.import_errors}"
    assert bag.dags or path.name in DAGLESS, f"{path.name} defines no DAG"


PARSE_IN_A_FRESH_PROCESS = """
import json, sys
from airflow.dag_processing.dagbag import DagBag
loaded = {}
for path in sys.argv[2:]:
    before = set(sys.modules)
    DagBag(dag_folder=path, safe_mode=False)
    new = {name.split(".")[0] for name in set(sys.modules) - before}
    loaded[path] = sorted(new & set(json.loads(sys.argv[1])))
print(json.dumps(loaded))
"""


def test_parsing_the_dags_loads_no_library_only_tasks_need():
    """In a fresh interpreter (this one has imported everything by now), file by file."""
    proc = subprocess.run([sys.executable, "-c", PARSE_IN_A_FRESH_PROCESS, json.dumps(TASK_ONLY_LIBRARIES),
                           *map(str, DAG_FILES)], text=True, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(loaded) == set(map(str, DAG_FILES))
    assert {Path(p).name: mods for p, mods in loaded.items() if mods} == {}


@pytest.mark.parametrize("path", DAG_FILES, ids=lambda p: p.name)
def test_dags_are_documented_tagged_and_retry(parsed, path):
    bag, _ = parsed[path]
    for dag_id, dag in bag.dags.items():
        assert (dag.doc_md or "").strip(), f"{dag_id}: doc_md is empty"
        assert dag.tags, f"{dag_id}: no tags"
        for task in dag.tasks:
            if (path.name, task.task_id) in NO_RETRIES:
                assert task.retries == 0, f"{dag_id}.{task.task_id}: retries={task.retries}, want 0"
                continue
            assert task.retries >= 2, f"{dag_id}.{task.task_id}: retries={task.retries}, want >= 2"


@pytest.mark.parametrize("path", DAG_FILES, ids=lambda p: p.name)
def test_schedule_and_catchup_are_explicit(path):
    """Defaults hide intent: every DAG states schedule, start_date, catchup, max_active_runs."""
    if path.name in DAGLESS:
        return
    tree = ast.parse(path.read_text(), filename=str(path))
    calls = [
        node for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in {"dag", "DAG"}
    ]
    assert calls, f"{path.name}: no dag(...) or DAG(...) call"
    for call in calls:
        missing = REQUIRED_DAG_ARGS - {kw.arg for kw in call.keywords}
        assert not missing, f"{path.name}:{call.lineno}: missing explicit {sorted(missing)}"


@pytest.mark.parametrize("path", DAG_FILES, ids=lambda p: p.name)
def test_authoring_imports_come_from_the_task_sdk(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("airflow"):
            allowed = node.module == "airflow.sdk" or node.module.startswith("airflow.providers.")
            assert allowed, f"{path.name}:{node.lineno}: import from {node.module}; use airflow.sdk"


def test_a_broken_dag_file_fails_alone(tmp_path):
    """A bad file shows as its own import error and leaves the other DAGs loadable."""
    for path in DAG_FILES:
        (tmp_path / path.name).write_text(path.read_text())
    (tmp_path / "broken_pipeline.py").write_text("raise ValueError('broken_pipeline.py: field table is required')\n")
    bag = _dagbag(tmp_path)
    assert [Path(p).name for p in bag.import_errors] == ["broken_pipeline.py"]
    assert "field table is required" in next(iter(bag.import_errors.values()))
    assert set(bag.dags) >= {dag_id for p in DAG_FILES for dag_id in _dagbag(p).dags}


def test_an_invalid_spec_is_an_import_error_naming_file_and_field_and_breaks_no_other_dag(tmp_path, monkeypatch):
    """A bad pipeline file (or two files writing one target) loads no DAG and shows up where
    Airflow users look for broken DAGs, the import errors; every valid pipeline still loads."""
    import shutil

    for spec in (REPO_ROOT / "include" / "pipelines").glob("*.yaml"):
        shutil.copy(spec, tmp_path / spec.name)
    (tmp_path / "broken_one.yaml").write_text(
        "name: broken_one\ntable: \"bank.x; DROP TABLE y\"\nprimary_key: [id]\n"
        "cursor: {kind: timestamp, column: updated_at}\nsafe_lag: PT1S\ntarget_table: batch.x\n"
    )
    for twin in ("twin_a", "twin_b"):
        (tmp_path / f"{twin}.yaml").write_text(
            f"name: {twin}\ntable: bank.{twin}\nprimary_key: [id]\n"
            "cursor: {kind: timestamp, column: updated_at}\nsafe_lag: PT1S\ntarget_table: batch.same\n"
        )
    monkeypatch.setenv("TIDEMARK_PIPELINES_DIR", str(tmp_path))
    bag = _dagbag(DAGS_DIR)
    assert [Path(p).name for p in bag.import_errors] == ["tidemark_spec_errors.py"]
    error = next(iter(bag.import_errors.values()))
    assert "3 invalid pipeline spec(s)" in error
    assert "broken_one.yaml: field 'table'" in error and "not a table name" in error
    assert "twin_a.yaml: field 'target_table': batch.same is also written by" in error and "twin_b.yaml" in error
    valid = {f"tidemark_batch_{p.stem}" for p in tmp_path.glob("bank_*.yaml")}
    assert {d for d in bag.dags if d.startswith("tidemark_batch_")} == valid
    for dag_id in valid:
        gated = ["wait_for_sink"] if dag_id == "tidemark_batch_bank_ledger_entries" else []  # its spec has max_lag
        assert sorted(t.task_id for t in bag.dags[dag_id].tasks) == sorted([
            *gated, "wait_turn", "plan", "begin", "extract", "end", "sink", "wait_committed", "publish", "abort_unfinished"])
        assert bag.dags[dag_id].get_task("abort_unfinished").is_teardown


def test_a_spec_with_max_lag_gets_the_backpressure_gate_before_plan(tmp_path, monkeypatch):
    from tidemark.batch.sequence import GATE, TURN

    (tmp_path / "gated.yaml").write_text(
        "name: gated\ntable: bank.gated\nprimary_key: [id]\ncursor: {kind: timestamp, column: updated_at}\n"
        "safe_lag: PT1S\ntarget_table: batch.gated\nsink: {mode: standing, max_lag: 1000, max_lag_wait: PT30M}\n")
    monkeypatch.setenv("TIDEMARK_PIPELINES_DIR", str(tmp_path))
    dag = _dagbag(DAGS_DIR / "tidemark_batch.py").dags["tidemark_batch_gated"]
    gate = dag.get_task(GATE)
    assert gate.mode == "reschedule" and TURN in gate.downstream_task_ids and not gate.upstream_task_ids


def test_cron_schedules_give_runs_real_data_intervals():
    """Backfills load their data interval: Airflow 3's default trigger timetable would make it
    empty (the scheduler tests load a three-day backfill through the REST API)."""
    bag = _dagbag(DAGS_DIR / "tidemark_batch.py")
    timetable = bag.dags["tidemark_batch_bank_ledger_entries"].timetable
    assert type(timetable).__name__ == "CronDataIntervalTimetable" and timetable.expression == "0 0 * * *"


def test_the_batch_dag_follows_the_one_sequence_and_its_jobs_get_the_shared_spark_settings(parsed):
    from tidemark.batch.sequence import CLEANUP, GATE, PUBLISH, STEPS, TURN
    from tidemark.spark.jobs import SPARK_CONF

    bag, _ = parsed[DAGS_DIR / "tidemark_batch.py"]
    dag = bag.dags["tidemark_batch_bank_ledger_entries"]
    order = [TURN, *STEPS, PUBLISH, CLEANUP]
    turn = dag.get_task(TURN)
    assert turn.mode == "reschedule" and turn.upstream_task_ids <= {GATE}  # first: a waiting run holds no slot
    assert dag.get_task(CLEANUP).is_teardown and turn.is_setup  # whatever ends the run hands the turn on
    for before, after in zip(order, order[1:]):
        assert after in dag.get_task(before).downstream_task_ids, (before, after)
    for task_id in ("extract", "sink"):
        assert dag.get_task(task_id).conf == SPARK_CONF


# What a person must type before the Trigger button enables; every other param is optional.
REQUIRED_PARAMS = {("tidemark_stream_control", "pipeline")}


@pytest.mark.parametrize("path", DAG_FILES, ids=lambda p: p.name)
def test_the_trigger_form_needs_nothing_typed_but_what_must_be(parsed, path):
    """The UI's trigger and backfill forms mark a param required (red *) when its schema has a type
    that does not admit null, and treat an empty string as missing: a default of "" greys the Trigger
    button out. A switch is never marked; a select a person can clear always is."""
    bag, _ = parsed[path]
    for dag_id, dag in bag.dags.items():
        for name in dag.params:
            param = dag.params.get_param(name)
            kinds = param.schema.get("type")
            nullable = "null" in (kinds if isinstance(kinds, list) else [kinds])
            given = param.value not in (None, "")
            marked = bool(kinds) and not nullable  # the form's red asterisk
            if "boolean" in (kinds if isinstance(kinds, list) else [kinds]):
                assert not marked, f"{dag_id}: switch {name} always has a value, yet the form marks it required"
            if "enum" in param.schema:
                assert marked, f"{dag_id}: select {name} can be cleared without the form marking it required"
            if (dag_id, name) in REQUIRED_PARAMS:
                assert not nullable and not given, f"{dag_id}: param {name} should be required"
                continue
            assert nullable or given, f"{dag_id}: param {name} (default {param.value!r}) greys out Trigger"
            param.resolve(param.value, suppress_exception=False)  # the default passes its own schema


def test_a_spec_with_a_full_schedule_gets_a_whole_table_reconciliation_on_it(parsed):
    bag, _ = parsed[DAGS_DIR / "tidemark_reconcile_full.py"]
    assert set(bag.dags) == {"tidemark_reconcile_full_bank_ledger_entries"}  # the one demo spec that asks
    dag = bag.dags["tidemark_reconcile_full_bank_ledger_entries"]
    assert getattr(dag.timetable, "expression", None) in ("@weekly", "0 0 * * 0"), vars(dag.timetable)
    assert dag.params.get_param("scope").value == "full" and [t.task_id for t in dag.tasks] == ["reconcile"]
    assert dag.is_paused_upon_creation is False  # a weekly proof runs unasked; Trigger starts no scheduled run

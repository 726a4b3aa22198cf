"""A pipeline spec file becomes a DAG that loads a batch end to end through Airflow."""

from __future__ import annotations

from tidemark.demo import run_dag
from tidemark.stack.batchrun import make_pipeline

DDL = "CREATE TABLE {table} (id bigint PRIMARY KEY, amount numeric(18,2) NOT NULL, updated_at timestamptz NOT NULL DEFAULT now())"


def test_spec_file_to_committed_batch_through_airflow(settings, tmp_path, monkeypatch):
    pipe = make_pipeline(settings, tmp_path, DDL)
    conn = pipe.src()
    with conn, conn.cursor() as cur:
        cur.execute(f"INSERT INTO {pipe.source_table} SELECT g, g * 1.5, now() - interval '1 minute' "
                    "FROM generate_series(1, 1234) g")
    conn.close()
    monkeypatch.setenv("TIDEMARK_PIPELINES_DIR", str(tmp_path))
    dag_id = f"tidemark_batch_{pipe.spec.name}"
    state, _, steps = run_dag(dag_id, settings)
    assert state == "success", f"see {settings.logs_dir / f'demo-{dag_id}.log'}"
    batch = next(s for s in steps if s["step"] == "batch")
    assert batch["state"] == "committed" and batch["rows"] == 1234 and batch["attempt"] == 1
    from decimal import Decimal

    assert pipe.query_wh(f"SELECT count(*), sum(amount) FROM {pipe.spec.target_table}")[0] == (
        1234, Decimal("1.5") * (1234 * 1235 // 2))
    assert pipe.watermark()["cursor"] == batch["watermark"]

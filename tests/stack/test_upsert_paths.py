"""The upsert's ways into the target (``tidemark.sink.merge.apply_batch``) against the real stack: a
window whose keys are all new to the target is appended without the merge; a window reaching keys
already loaded, or holding one key twice, is merged, and the newest version of each key wins."""

from __future__ import annotations

from decimal import Decimal

from tidemark_workshop.stack.batchrun import insert_payments, make_pipeline

# No primary key at the source: the spec's key (id) may come twice in one window.
KEYLESS_DDL = """
CREATE TABLE {table} (
    id bigint NOT NULL,
    amount numeric(18,2) NOT NULL,
    currency char(3) NOT NULL DEFAULT 'EUR',
    updated_at timestamptz NOT NULL DEFAULT now()
)"""


def test_new_keys_are_appended_and_loaded_or_repeated_keys_merge_newest_wins(settings, tmp_path):
    pipe = make_pipeline(settings, tmp_path, KEYLESS_DDL, write_mode="upsert")
    target = pipe.spec.target_table
    insert_payments(pipe, 1, 100)
    pipe.run("run-1")
    assert "every key new to the target: 100 row(s) appended without a merge" in pipe.jobs[-1].stdout

    # keys 1..10 changed, 101..150 new: the window reaches loaded keys, so it merges
    conn = pipe.src()
    with conn, conn.cursor() as cur:
        cur.execute(f"UPDATE {pipe.source_table} SET amount = amount + 1, updated_at = now() WHERE id <= 10")
    conn.close()
    insert_payments(pipe, 101, 150)
    pipe.run("run-2")
    assert "appended without a merge" not in pipe.jobs[-1].stdout
    assert pipe.query_wh(f"SELECT count(*), sum(amount) FROM {target}") == [
        (150, sum(Decimal(i) * Decimal("0.37") for i in range(1, 151)) + 10)]

    # keys new to the target, 205 among them twice: the plain insert meets the key, the merge keeps the newer
    insert_payments(pipe, 200, 210, stamp="now() - interval '1 second'")
    conn = pipe.src()
    with conn, conn.cursor() as cur:
        cur.execute(f"INSERT INTO {pipe.source_table} (id, amount) VALUES (205, 999.99)")
    conn.close()
    pipe.run("run-3")
    assert "one of them twice in the batch: merged" in pipe.jobs[-1].stdout
    assert pipe.query_wh(f"SELECT amount FROM {target} WHERE id = 205") == [(Decimal("999.99"),)]
    assert pipe.query_wh(f"SELECT count(*), count(DISTINCT id) FROM {target}") == [(161, 161)]
    assert pipe.query_wh(f"SELECT count(*) FROM {target} WHERE id <= 10 AND amount = id * 0.37 + 1") == [(10,)]

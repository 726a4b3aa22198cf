"""A run of rows sharing one cursor value is split across batches (real PostgreSQL, Kafka, Spark).

With ``max_batch_rows`` a window ends at the (cursor, key) of its last row, the watermark carries
that tuple, and the next batch goes on from it: a bulk update stamping a million rows with one
timestamp no longer has to fit in one batch.
"""

from __future__ import annotations

from tidemark.protocol.window import predicate
from tidemark_workshop.stack.batchrun import PAYMENTS_DDL, insert_payments, make_pipeline

AT = "'2026-01-01T12:00:00Z'::timestamptz"


def test_a_run_of_equal_timestamps_is_split_at_a_key_and_the_next_batch_goes_on_from_it(settings, tmp_path):
    pipe = make_pipeline(settings, tmp_path, PAYMENTS_DDL, max_batch_rows=10)
    insert_payments(pipe, 1, 15, stamp=AT)  # one bulk update: 15 rows, one timestamp
    insert_payments(pipe, 16, 18)  # and three later rows

    first, _ = pipe.run("run-1")
    assert first.window.hi.pk == (10,), first.window  # before: hi never carried a key, one batch took all 15
    assert pipe.watermark()["pk"] == [10]
    assert sorted(pipe.rows("target", "amount")) == list(range(1, 11))

    second, _ = pipe.run("run-2")  # the rest of the run and the later rows: 8 rows, under the cap
    assert second.window.lo == first.window.hi and second.window.hi.pk is None, second.window
    source = pipe.rows("source", "amount, currency, updated_at")
    assert len(source) == 18 and pipe.rows("target", "amount, currency, updated_at") == source
    assert pipe.watermark()["pk"] is None


def test_a_text_key_cut_is_read_back_in_the_source_collation(settings, tmp_path):
    """No Spark: the plan's cut and the predicate the extract would run, on the source itself."""
    ddl = "CREATE TABLE {table} (code text PRIMARY KEY, updated_at timestamptz NOT NULL)"
    pipe = make_pipeline(settings, tmp_path, ddl, primary_key=["code"], max_batch_rows=2)
    src = pipe.src()
    try:
        with src, src.cursor() as cur:
            cur.execute(f"INSERT INTO {pipe.source_table} VALUES ('b''1', {AT}), ('a', {AT}), ('B', {AT}), "
                        f"('c', {AT} + interval '1 s')")
            cur.execute(f"SELECT code FROM {pipe.source_table} ORDER BY updated_at, code")
            in_order = [r[0] for r in cur.fetchall()]
        plan = pipe.plan("run-1")
        assert plan.window.hi.pk == (in_order[1],), (plan.window, in_order)  # the 2nd row in PostgreSQL's order
        with src, src.cursor() as cur:
            cur.execute(f"SELECT code FROM {pipe.source_table} WHERE {predicate(pipe.spec, plan.window)} ORDER BY 1")
            assert sorted(r[0] for r in cur.fetchall()) == sorted(in_order[:2])
    finally:
        src.close()

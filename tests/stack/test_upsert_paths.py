"""The upsert's ways into the target (``tidemark.sink.merge.apply_batch``) against the real stack: a
window whose keys are all new to the target is appended without the merge; a window reaching keys
already loaded, or holding one key twice, is merged, and the newest version of each key wins;
what the batch changed in the target's columns stays when the plain insert falls back to the merge."""

from __future__ import annotations

from decimal import Decimal

from tidemark_workshop.stack.batchrun import PAYMENTS_DDL, insert_payments, make_pipeline

# No primary key at the source: the spec's key (id) may come twice in one window.
KEYLESS_DDL = PAYMENTS_DDL.replace("id bigint PRIMARY KEY", "id bigint NOT NULL")
assert KEYLESS_DDL != PAYMENTS_DDL


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
    assert "the plain insert of keys new to the target met UniqueViolation: merged instead" in pipe.jobs[-1].stdout
    assert pipe.query_wh(f"SELECT amount FROM {target} WHERE id = 205") == [(Decimal("999.99"),)]
    assert pipe.query_wh(f"SELECT count(*), count(DISTINCT id) FROM {target}") == [(161, 161)]
    assert pipe.query_wh(f"SELECT count(*) FROM {target} WHERE id <= 10 AND amount = id * 0.37 + 1") == [(10,)]


UUID_DDL = """
CREATE TABLE {table} (
    id uuid NOT NULL,
    amount numeric(10,2) NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
)"""


def test_a_uuid_key_twice_in_a_widening_batch_merges_into_the_widened_target(settings, tmp_path):
    """A key type without min/max (uuid); the batch widens a column and adds one, and holds one key
    twice: the plain insert falls back to the merge, which writes into the widened target."""
    pipe = make_pipeline(settings, tmp_path, UUID_DDL, write_mode="upsert")
    target = pipe.spec.target_table
    conn = pipe.src()
    with conn, conn.cursor() as cur:
        cur.execute(f"INSERT INTO {pipe.source_table} (id, amount) SELECT ('00000000-0000-0000-0000-' || "
                    "lpad(g::text, 12, '0'))::uuid, g FROM generate_series(1, 20) g")
    conn.close()
    pipe.run("run-1")
    assert "every key new to the target: 20 row(s) appended without a merge" in pipe.jobs[-1].stdout

    twice = "ffffffff-0000-0000-0000-000000000005"
    conn = pipe.src()
    with conn, conn.cursor() as cur:
        cur.execute(f"ALTER TABLE {pipe.source_table} ALTER COLUMN amount TYPE numeric(14,4), ADD COLUMN memo text")
        cur.execute(f"INSERT INTO {pipe.source_table} (id, amount, memo, updated_at) SELECT ('ffffffff-0000-0000-0000-' "
                    "|| lpad(g::text, 12, '0'))::uuid, g + 0.0001, 'new', now() - interval '1 second' "
                    "FROM generate_series(1, 10) g")
        cur.execute(f"INSERT INTO {pipe.source_table} (id, amount, memo) VALUES (%s, 123456789.1234, 'newer')", (twice,))
    conn.close()
    pipe.run("run-2")
    assert "the plain insert of keys new to the target met UniqueViolation: merged instead" in pipe.jobs[-1].stdout
    assert pipe.query_wh(f"SELECT amount, memo FROM {target} WHERE id = %s", (twice,)) == [
        (Decimal("123456789.1234"), "newer")]
    assert pipe.query_wh(f"SELECT count(*), count(memo), sum(amount) FROM {target}") == [
        (30, 10, Decimal(sum(range(1, 21))) + sum(Decimal(g) + Decimal("0.0001") for g in range(1, 11) if g != 5)
         + Decimal("123456789.1234"))]

"""The change stream's own rows in the control schema: change events waiting for the rest of their source
transaction (``cdc_pending``), the transactions' ENDs (``cdc_transactions``), the commit position applied
(``cdc_positions``), the transactions resolved within the hour (``cdc_resolved``), the deletions applied
(``cdc_deletions``) and the supervisor's watch of a slot. Written in the caller's transaction: the change
writer's micro-batch, with the rows it applies."""

from __future__ import annotations

from typing import Any

WAITING = ("cdc_pending", "cdc_transactions")  # the tables a transaction waits in, by txid


def park_events(cur, rows: list[tuple]) -> int:
    """Change events that wait for the rest of their transaction; how many were new (the others: the same
    event again, still waiting)."""
    from psycopg2.extras import execute_values

    kept = execute_values(cur, """INSERT INTO tidemark_control.cdc_pending (consumer, txid, total_order, lsn, op,
                                      row_values, source_ms, topic, partition, "offset", record_key, raw, after_commit)
                                  VALUES %s ON CONFLICT DO NOTHING RETURNING 1""", rows, page_size=1000, fetch=True)
    return len(kept)


def record_transaction_ends(cur, rows: list[tuple]) -> None:
    """ENDs (consumer, txid, commit_lsn, event_count, collections) of transactions that wait for their events."""
    from psycopg2.extras import execute_values

    execute_values(cur, """INSERT INTO tidemark_control.cdc_transactions (consumer, txid, commit_lsn, event_count,
                               collections) VALUES %s ON CONFLICT DO NOTHING""", rows)


def forget_waiting(cur, consumer: str, txids: list[int], tables: tuple[str, ...] = WAITING) -> None:
    """What of ``txids`` waits in ``tables`` (applied, dead-lettered or passed): gone."""
    for table in tables:
        if table not in WAITING:
            raise ValueError(f"not a table a transaction waits in: {table!r}")
        cur.execute(f"DELETE FROM tidemark_control.{table} WHERE consumer = %s AND txid = ANY(%s)", (consumer, txids))


def drop_passed_events(cur, consumer: str, txids: list[int]) -> int:
    """Drop the waiting events of ``txids``; how many were of transactions resolved within the hour (sent again)."""
    cur.execute("DELETE FROM tidemark_control.cdc_pending WHERE consumer = %s AND txid = ANY(%s) RETURNING "
                "txid IN (SELECT txid FROM tidemark_control.cdc_resolved WHERE consumer = %s)", (consumer, txids, consumer))
    return sum(1 for known, in cur.fetchall() if known)


def move_position(cur, consumer: str, lsn: int, txid: int, source_ms: int | None) -> None:
    """The commit position applied (and the source's commit time of its last transaction)."""
    cur.execute("""INSERT INTO tidemark_control.cdc_positions (consumer, commit_lsn, txid, source_ms)
                   VALUES (%s, %s, %s, %s)
                   ON CONFLICT (consumer) DO UPDATE SET commit_lsn = EXCLUDED.commit_lsn, txid = EXCLUDED.txid,
                       source_ms = coalesce(EXCLUDED.source_ms, cdc_positions.source_ms),
                       applied_at = clock_timestamp()""", (consumer, lsn, txid, source_ms))


def mark_resolved(cur, consumer: str, txids: list[int]) -> None:
    """Remember for an hour the transactions that wait no longer (a redelivery of one is told by it)."""
    from psycopg2.extras import execute_values

    execute_values(cur, "INSERT INTO tidemark_control.cdc_resolved (consumer, txid) VALUES %s ON CONFLICT DO NOTHING",
                   [(consumer, t) for t in txids])
    cur.execute("DELETE FROM tidemark_control.cdc_resolved WHERE consumer = %s "
                "AND resolved_at < clock_timestamp() - interval '1 hour'", (consumer,))


def record_change_deletions(cur, pipeline: str, key_sql: str, changes_sql: str, params: dict[str, Any]) -> int:
    """Keep each deletion a source transaction applied, with its old values: ``changes_sql`` gives the applied
    changes (``op``, ``row_values``, ``txid``, ``commit_lsn``, ``total_order``), ``key_sql`` each one's key
    (SQL built from validated, quoted column names). How many were kept."""
    cur.execute(f"""INSERT INTO tidemark_control.cdc_deletions (pipeline, key, old_values, txid, commit_lsn)
                    SELECT %(pipeline)s, jsonb_build_array({key_sql}), p.row_values, p.txid, p.commit_lsn
                      FROM ({changes_sql}) p
                     WHERE p.op = 'd' ORDER BY p.commit_lsn, p.total_order""", {**params, "pipeline": pipeline})
    return cur.rowcount


def record_drift(cur, pipeline: str, batch_id: str, drifted_sql: str) -> int:
    """Keep each key whose real-time version the batch holds with other values at the same cursor:
    ``drifted_sql`` selects ``key``, ``realtime`` and ``batch`` as jsonb. How many were kept."""
    cur.execute(f"""INSERT INTO tidemark_control.cdc_drift (pipeline, batch_id, key, realtime, batch)
                    SELECT %s, %s, d.key, d.realtime, d.batch FROM ({drifted_sql}) d""", (pipeline, batch_id))
    return cur.rowcount


def keep_batch_deletions(cur, pipeline: str, batch_id: str, deleting_sql: str) -> int:
    """Run ``deleting_sql`` (a DELETE from the batch target RETURNING key, old_values, lsn) and keep each row it
    deleted, in one statement: a deletion the change stream learned, reaching the batch target. How many."""
    cur.execute(f"""WITH gone AS ({deleting_sql})
                    INSERT INTO tidemark_control.cdc_batch_deletions (pipeline, batch_id, key, old_values, commit_lsn)
                    SELECT %s, %s, key, old_values, lsn FROM gone""", (pipeline, batch_id))
    return cur.rowcount


def watch_slot(cur, pipeline: str, unread: bool, now: Any) -> Any:
    """The supervisor's look at a capture's slot: since when it has had no reader (None: it is read)."""
    cur.execute("""INSERT INTO tidemark_control.cdc_slot_watch (pipeline, inactive_since)
                   VALUES (%(p)s, CASE WHEN %(unread)s THEN %(now)s END)
                   ON CONFLICT (pipeline) DO UPDATE SET inactive_since =
                       CASE WHEN %(unread)s THEN coalesce(cdc_slot_watch.inactive_since, %(now)s) END
                   RETURNING inactive_since""", {"p": pipeline, "unread": unread, "now": now})
    return cur.fetchone()[0]

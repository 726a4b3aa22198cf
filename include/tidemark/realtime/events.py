"""Events outside batches: a pipeline's stream, applied as it arrives to its real-time table.

The speed layer of a spec's ``stream`` (``tidemark.realtime.interface``). Applications publish events
(JSON objects, keyed by the stream's ``key`` field, with the event time in its ``event_time`` field) to the stream's topic, without Tidemark headers. The sink hands
each micro-batch's events to ``EventWriter.apply``, inside the transaction that also stores their
offsets. Each event is validated like a batch record (``tidemark.protocol.records``, no window), then
written to ``stream.target_table`` with its source position, fencing token and micro-batch, one
row per primary key. Protocol: ``docs/control-protocol.md`` section 12.
"""

from __future__ import annotations

import io
from typing import Any

import psycopg2
import psycopg2.errors

from tidemark import ledger
from tidemark.ledger import catalog
from tidemark.protocol.columns import target_columns
from tidemark.protocol.records import RecordRules, checked_upstream
from tidemark.protocol.spec import PipelineSpec, quote
from tidemark.protocol.window import Window, covered, predicate
from tidemark.realtime.interface import Reject, SpeedLayer, serving_views

# each event's source position, fencing token, micro-batch and time applied, beside the target's columns
STREAM_COLUMNS = ("_tm_partition", "_tm_offset", "_tm_fence", "_tm_micro_batch", "_tm_applied_at")
TABLE_REFUSED = (psycopg2.DataError, psycopg2.IntegrityError, psycopg2.errors.ProgramLimitExceeded)


RAW = "tidemark_events"  # (partition, offset, value text): what the micro-batch's good events said
TYPED = "tidemark_events_typed"  # the same, parsed once into the real-time table's column types


class _Positions:
    """A micro-batch's events by (partition, offset), as the dicts a dead letter is made from;
    built only when one is needed."""

    def __init__(self, events):
        self.events, self._index = events, None

    def record(self, i: int) -> dict[str, Any]:
        return {c: self.events[c][i].as_py() for c in ("topic", "partition", "offset", "key", "value")}

    def __getitem__(self, position: tuple[int, int]) -> dict[str, Any]:
        if self._index is None:
            self._index = {p: i for i, p in enumerate(zip(self.events["partition"].to_pylist(),
                                                          self.events["offset"].to_pylist()))}
        return self.record(self._index[position])


class EventWriter(SpeedLayer):
    section = "stream"

    def __init__(self, spec: PipelineSpec, consumer: str):
        assert spec.stream is not None
        super().__init__(spec, spec.stream.target_table, spec.stream.serving_view)
        self.stream, self.consumer = spec.stream, consumer
        # Facts (append-only) never change: the first event of a key stands. Entities: the newer
        # version wins by cursor, then source position.
        self.facts = spec.append_only or spec.write_mode == "append_window_replace"
        self._rules: RecordRules | None = None

    @property
    def topics(self) -> dict[str, int]:
        return {self.stream.topic: self.stream.partitions}

    def ensure(self, cur) -> bool:
        """The real-time table (``stream.target_table``): the batch target's columns and primary key, plus
        ``STREAM_COLUMNS``; and the serving views."""
        created = catalog.ensure_realtime_table(cur, self.spec, self.stream.target_table, "stream.target_table", """
            _tm_partition integer NOT NULL, _tm_offset bigint NOT NULL, _tm_fence bigint NOT NULL,
            _tm_micro_batch bigint, _tm_applied_at timestamptz NOT NULL DEFAULT clock_timestamp()""")
        self.views(cur)
        return created

    def views(self, cur, *, again: bool = False) -> None:
        """The serving views (``serving_views``); the stream's watermark: the events' earliest latest event
        time over the partitions, once every partition has one."""
        spec, stream = self.spec, self.stream
        serving_views(cur, spec, view=stream.serving_view, live=stream.target_table, field="stream.serving_view",
                      own=STREAM_COLUMNS, again=again,
                      comment=f"Tidemark pipeline {spec.name}: {spec.target_table} merged with {stream.target_table}, "
                              f"one row per key, newest {spec.cursor.column} wins",
                      stream_watermark="SELECT CASE WHEN count(*) = %(partitions)s THEN min(event_time) END "
                                       "FROM tidemark_control.stream_event_times "
                                       "WHERE consumer = %(consumer)s AND topic = %(topic)s",
                      params={"partitions": stream.partitions, "consumer": self.consumer, "topic": stream.topic})

    def widen_target(self, cur, wider: dict[str, str]) -> None:
        """The real-time table keeps the target's types: both widened, the serving view made again."""
        catalog.widen_columns(cur, [self.spec.target_table, self.stream.target_table], wider,
                              view=self.stream.serving_view, remake=lambda: self.views(cur, again=True))

    def read_checks(self, cur) -> tuple[str, RecordRules]:
        return self.stream.topic, self.rules(cur)

    def compact(self, cur, batch_id: str, window: Window) -> str:
        """The events inside the committed batch's window: the batch holds their rows now."""
        cur.execute(f"DELETE FROM {quote(self.stream.target_table)} WHERE {predicate(self.spec, window)}")
        return f"{cur.rowcount} real-time row(s) it covers compacted away"

    def apply(self, cur, events, fence: int, micro_batch: int | None, report, reject: Reject) -> None:
        """Validate the micro-batch's events and write the good ones. An event the committed
        watermark covers is in the batch target already (or the batch says the source has no such
        row): skipped, counted as superseded. One whose key is already there is a redelivery when
        equal (a no-op, counted as a duplicate); else, for facts, a dead letter naming the columns
        that differ, and for entities superseded when older than the stored version."""
        import pyarrow as pa

        rules = self.rules(cur)
        # where they were read (Spark's executors, or the JVM's screen), unless this one is not
        if "checked" not in events.column_names:
            reasons, unchecked = [None] * events.num_rows, list(range(events.num_rows))
        else:
            reasons = events["reason"].to_pylist()
            unchecked = [] if checked_upstream(events) else [i for i, done in enumerate(events["checked"].to_pylist())
                                                             if not done]
        if unchecked:
            rest = events if len(unchecked) == events.num_rows else events.take(unchecked)
            for i, k, v in zip(unchecked, rest["key"].to_pylist(), rest["value"].to_pylist()):
                reasons[i] = rules.check(k, v, None)
        by_position = _Positions(events)
        for i, reason in enumerate(reasons):
            if reason is not None:
                reject(by_position.record(i), f"event rejected: {reason}")
        kept = events.filter(pa.array([r is None for r in reasons], pa.bool_())) if any(reasons) else events
        if not kept.num_rows:
            return
        self._load(cur, kept)
        self._parse(cur, by_position, reject)
        mark = ledger.committed_watermark(cur, self.spec.name)
        # (a text key in the watermark may hold a %: these statements also take parameters)
        fresh = f"NOT ({covered(self.spec, mark, 'r')})".replace("%", "%%") if mark is not None else "true"
        written = self._insert(cur, list(rules.columns), fresh, fence, micro_batch, by_position, reject)
        report.events += written
        cur.execute(f"SELECT count(*) FILTER (WHERE {fresh}), count(*) FILTER (WHERE NOT ({fresh})) FROM {TYPED} r", ())
        unseen, covered_already = cur.fetchone()
        report.superseded += covered_already
        # Each row the insert wrote or updated is one event's: when it wrote every fresh one, none is left over.
        left_over = self._not_written(cur, list(rules.columns), fresh) if written < unseen else []
        for (p, o), (tp, to), differ in left_over:
            if not differ:
                report.duplicates += 1
            elif not self.facts:
                report.superseded += 1
            else:
                reject(by_position[(p, o)], f"event rejected: primary key {self.spec.primary_key} is already applied "
                       f"from {self.stream.topic}/{tp}@{to} with other values in {', '.join(differ)}; the first one "
                       "stands (the pipeline's facts are append-only)")
        cur.execute(f"SELECT r._tm_p, max(r.{quote(rules.time_column)})::timestamptz FROM {TYPED} r GROUP BY r._tm_p")
        ledger.advance_event_times(cur, self.consumer, self.stream.topic, dict(cur.fetchall()))

    def _load(self, cur, kept) -> None:
        """The good events into a temporary table: position and value as text."""
        import pyarrow as pa
        import pyarrow.csv as pacsv

        # no key: only one event at a time (``_each``) looks events up by position, and indexes them for that
        cur.execute(f"CREATE TEMP TABLE IF NOT EXISTS {RAW} (_tm_p integer, _tm_o bigint, _tm_value text) "
                    "ON COMMIT DELETE ROWS")
        buf = io.BytesIO()
        pacsv.write_csv(pa.table({"p": kept["partition"], "o": kept["offset"], "value": kept["value"].cast(pa.string())}),
                        buf, pacsv.WriteOptions(include_header=False, quoting_style="needed"))
        buf.seek(0)
        cur.copy_expert(f"COPY {RAW} (_tm_p, _tm_o, _tm_value) FROM STDIN WITH (FORMAT csv)", buf)

    def _parse(self, cur, by_position: _Positions, reject: Reject) -> None:
        """Parse the loaded events once, into ``TYPED`` (position and the real-time table's columns,
        dropped at commit): every later statement reads that. A value PostgreSQL cannot cast to its
        column is a dead letter, found one by one only when the whole micro-batch's parse fails."""
        table = quote(self.stream.target_table)
        parsed = f"{RAW} e CROSS JOIN LATERAL json_populate_record(NULL::{table}, e._tm_value::json) r"
        create = f"CREATE TEMP TABLE {TYPED} ON COMMIT DROP AS SELECT e._tm_p, e._tm_o, r.* FROM {parsed}"
        if self._all_or_each(cur, create, ()) is not None:
            return
        cur.execute(f"{create} WITH NO DATA")
        self._each(cur, f"INSERT INTO {TYPED} SELECT e._tm_p, e._tm_o, r.* FROM {parsed} "
                   "WHERE e._tm_p = %s AND e._tm_o = %s", (), RAW, by_position, reject,
                   f"PostgreSQL cannot cast it to the real-time table {self.stream.target_table}")

    def _insert(self, cur, names: list[str], fresh: str, fence: int, micro_batch: int | None,
                by_position: _Positions, reject: Reject) -> int:
        """Write the parsed events; if the table refuses one (a data or integrity error), write them
        one by one so only the refused ones are dead letters. Returns the rows written."""
        table, pk = quote(self.stream.target_table), [quote(c) for c in self.spec.primary_key]
        cols = ", ".join(quote(c) for c in names)
        if self.facts:
            distinct, order, conflict = "", "r._tm_p, r._tm_o", "DO NOTHING"
        else:  # one version per key in the statement, then the newer of it and the stored one
            cursor = quote(self.spec.cursor.column)
            newer = (f"({table}.{cursor}, {table}._tm_partition, {table}._tm_offset) < "
                     f"(EXCLUDED.{cursor}, EXCLUDED._tm_partition, EXCLUDED._tm_offset)")
            changed = (f"({', '.join(f'{table}.{quote(c)}' for c in names)}) IS DISTINCT FROM "
                       f"({', '.join(f'EXCLUDED.{quote(c)}' for c in names)})")
            sets = ", ".join(f"{c} = EXCLUDED.{c}" for c in (*map(quote, names), "_tm_partition", "_tm_offset",
                                                              "_tm_fence", "_tm_micro_batch"))
            distinct = f"DISTINCT ON ({', '.join(f'r.{c}' for c in pk)}) "
            order = f"{', '.join(f'r.{c}' for c in pk)}, r.{cursor} DESC, r._tm_p DESC, r._tm_o DESC"
            conflict = f"DO UPDATE SET {sets}, _tm_applied_at = clock_timestamp() WHERE {newer} AND {changed}"

        def insert(where: str) -> str:
            return (f"INSERT INTO {table} ({cols}, _tm_partition, _tm_offset, _tm_fence, _tm_micro_batch) "
                    f"SELECT {distinct}{', '.join(f'r.{quote(c)}' for c in names)}, r._tm_p, r._tm_o, %s, %s "
                    f"FROM {TYPED} r WHERE {fresh} {where} ORDER BY {order} "
                    f"ON CONFLICT ({', '.join(pk)}) {conflict}")

        written = self._all_or_each(cur, insert(""), (fence, micro_batch))
        if written is not None:
            return written
        return self._each(cur, insert("AND r._tm_p = %s AND r._tm_o = %s"), (fence, micro_batch), TYPED,
                          by_position, reject, f"the real-time table {self.stream.target_table} refused it")

    @staticmethod
    def _all_or_each(cur, statement: str, params: tuple) -> int | None:
        """Run ``statement`` for the whole micro-batch: its row count, or None (undone) when
        PostgreSQL refused some value in it, to be run one event at a time."""
        cur.execute("SAVEPOINT events")
        try:
            cur.execute(statement, params)
        except TABLE_REFUSED:
            cur.execute("ROLLBACK TO SAVEPOINT events")
            return None
        written = cur.rowcount
        cur.execute("RELEASE SAVEPOINT events")
        return written

    @staticmethod
    def _each(cur, statement: str, params: tuple, source: str, by_position: _Positions, reject: Reject, why: str) -> int:
        """Run ``statement`` (filtered by ``_tm_p = %s AND _tm_o = %s``) for each event in ``source``;
        the ones PostgreSQL refuses are dead letters and leave ``source``. Returns the rows written."""
        written = 0
        # Found by position, in an index made for the while: a scan for each made this quadratic (20,000
        # events 24 s, against 5 s indexed; 100,000 about ten minutes); the usual path's COPY is cheaper without.
        cur.execute(f"CREATE UNIQUE INDEX {source}_position ON {source} (_tm_p, _tm_o)")
        cur.execute(f"SELECT _tm_p, _tm_o FROM {source} ORDER BY _tm_p, _tm_o")
        for position in cur.fetchall():
            cur.execute("SAVEPOINT event")
            try:
                cur.execute(statement, (*params, *position))
                written += cur.rowcount
                cur.execute("RELEASE SAVEPOINT event")
            except TABLE_REFUSED as exc:
                cur.execute("ROLLBACK TO SAVEPOINT event")
                cur.execute(f"DELETE FROM {source} WHERE _tm_p = %s AND _tm_o = %s", position)
                reject(by_position[position], f"event rejected: {why}: {' '.join(str(exc).split())}")
        cur.execute(f"DROP INDEX pg_temp.{source}_position")  # RAW stays for the next micro-batch
        return written

    def _not_written(self, cur, names: list[str], fresh: str) -> list[tuple[tuple, tuple, list[str]]]:
        """The parsed events whose key holds another event's row: (their position, that row's
        position, the columns in which they differ)."""
        table = quote(self.stream.target_table)
        same_key = " AND ".join(f"t.{quote(c)} = r.{quote(c)}" for c in self.spec.primary_key)
        cur.execute(
            f"""SELECT r._tm_p, r._tm_o, t._tm_partition, t._tm_offset,
                       ARRAY(SELECT c FROM unnest(%s::text[]) c WHERE to_jsonb(r) -> c IS DISTINCT FROM to_jsonb(t) -> c)
                  FROM {TYPED} r JOIN {table} t ON {same_key}
                 WHERE (t._tm_partition, t._tm_offset) <> (r._tm_p, r._tm_o) AND {fresh}
                 ORDER BY r._tm_p, r._tm_o""", (names,))
        return [((p, o), (tp, to), differ) for p, o, tp, to, differ in cur.fetchall()]

    def rules(self, cur) -> RecordRules:
        """The checks for the stream's events; ``LookupError`` when the real-time table cannot take
        them (a column missing, or an event time that is not a timestamp or date)."""
        if self._rules is None:
            columns = [c for c in target_columns(cur, self.stream.target_table) if c.name not in STREAM_COLUMNS]
            rules = RecordRules(self.spec, columns, events=True)
            kind = rules.columns[rules.time_column].data_type
            if kind not in ("timestamp with time zone", "timestamp without time zone", "date"):
                raise LookupError(f"pipeline {self.spec.name}: stream.event_time {rules.time_column} is a {kind} "
                                  f"column of {self.stream.target_table}; an event time must be a timestamp or a date")
            self._rules = rules
        return self._rules

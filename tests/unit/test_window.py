"""Batch windows (tidemark.protocol.window): planning on the source clock, SQL predicates, JSON, time zones.

Pure logic: no database, no Kafka. Predicates are checked twice: as exact SQL text, and by
evaluating them (translated to Python) against generated rows to prove that the split parts are
disjoint and together cover exactly the window.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone

import pytest

from tidemark.protocol.spec import PipelineSpec
from tidemark.protocol.window import (
    MICROSECOND,
    SOURCE_CLOCK_SQL,
    Bound,
    PlanError,
    SourceClock,
    Window,
    literal,
    plan_window,
    predicate,
    read_source_clock,
    split_predicates,
)

UTC = timezone.utc
PLUS2 = timezone(timedelta(hours=2))
US = timedelta(microseconds=1)

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
T0 = datetime(2026, 1, 1, tzinfo=UTC)
T1 = datetime(2026, 1, 2, tzinfo=UTC)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _spec(**changes) -> PipelineSpec:
    fields = {
        "name": "ledger_entries",
        "table": "core.ledger_entries",
        "primary_key": ["entry_id"],
        "cursor": {"kind": "timestamp", "column": "updated_at"},
        "safe_lag": timedelta(minutes=5),
        "target_table": "dw.ledger_entries",
        "partitions": 3,
        **changes,
    }
    return PipelineSpec(**fields)


TS = _spec()
ID = _spec(cursor={"kind": "id", "column": "entry_id"}, append_only=True)
# Case-sensitive and reserved-word identifiers: only correct if every identifier is quoted.
QUOTED = _spec(primary_key=["order", "Line_No"], cursor={"kind": "timestamp", "column": "Booked_At"})


def _ts(value: datetime) -> str:
    return f"'{value.isoformat()}'::timestamptz"


# --- a tiny evaluator for the predicates this module generates -------------------------------

_TOKEN = re.compile(r"""'((?:[^']|'')*)'(::timestamptz)?|"([A-Za-z_][A-Za-z0-9_]*)"|\bAND\b""")


def _as_python(sql: str) -> str:
    def sub(m: re.Match) -> str:
        if m.group(0) == "AND":
            return "and"
        if m.group(3) is not None:
            return f"row[{m.group(3)!r}]"
        text = m.group(1).replace("''", "'")
        return f"_ts({text!r})" if m.group(2) else repr(text)

    return _TOKEN.sub(sub, sql)


def _matches(sql: str, row: dict) -> bool:
    # SQL row comparison "(a, b) > (x, y)" is lexicographic, exactly like Python tuples.
    return eval(_as_python(sql), {"__builtins__": {}, "_ts": datetime.fromisoformat, "row": row})  # noqa: S307


def test_the_evaluator_itself_reads_the_sql_it_is_given():
    sql = '("updated_at", "entry_id") > (\'2026-01-01T00:00:00+00:00\'::timestamptz, \'a\'\'b\') AND "updated_at" <= \'2026-01-02T00:00:00+00:00\'::timestamptz'
    assert _matches(sql, {"updated_at": T0, "entry_id": "a'c"}) is True
    assert _matches(sql, {"updated_at": T0, "entry_id": "a'b"}) is False
    assert _matches(sql, {"updated_at": T1 + US, "entry_id": "z"}) is False


# --- SourceClock and read_source_clock ---------------------------------------------------------

def test_safe_bound_is_the_source_clock_minus_the_safe_lag():
    assert SourceClock(NOW, None).safe_bound(timedelta(minutes=5)) == datetime(2026, 3, 1, 11, 55, tzinfo=UTC)
    assert SourceClock(NOW, None).safe_bound(timedelta(0)) == NOW


def test_safe_bound_is_clamped_one_microsecond_before_the_oldest_open_transaction():
    oldest = datetime(2026, 3, 1, 11, 0, tzinfo=UTC)
    assert SourceClock(NOW, oldest).safe_bound(timedelta(minutes=5)) == datetime(2026, 3, 1, 10, 59, 59, 999999, tzinfo=UTC)
    assert MICROSECOND == US


def test_safe_bound_ignores_an_open_transaction_younger_than_the_lag():
    young = datetime(2026, 3, 1, 11, 59, tzinfo=UTC)
    assert SourceClock(NOW, young).safe_bound(timedelta(minutes=5)) == datetime(2026, 3, 1, 11, 55, tzinfo=UTC)
    at_bound = datetime(2026, 3, 1, 11, 55, tzinfo=UTC)  # started exactly at now - lag: still clamps
    assert SourceClock(NOW, at_bound).safe_bound(timedelta(minutes=5)) == at_bound - US


class _FakeCursor:
    def __init__(self, row):
        self.row = row
        self.executed: list[str] = []

    def execute(self, sql, params=None):
        self.executed.append(sql)

    def fetchone(self):
        return self.row


def test_read_source_clock_treats_naive_database_times_as_utc():
    holder = {"pid": 7, "usename": "app", "application_name": "teller", "client_addr": None,
              "state": "idle in transaction", "xact_start": "2026-03-01T11:00:00"}
    cur = _FakeCursor((datetime(2026, 3, 1, 12, 0), holder, 0, True, None))
    clock = read_source_clock(cur)
    assert cur.executed == [SOURCE_CLOCK_SQL]
    assert clock == SourceClock(NOW, datetime(2026, 3, 1, 11, 0, tzinfo=UTC), holder, None)
    assert "session pid=7 user=app application='teller' client=local state='idle in transaction'" in clock.holders()
    assert "open since 2026-03-01T11:00:00+00:00 (3600 s)" in clock.holders()
    assert clock.now.tzinfo is UTC and clock.oldest_open_xact.tzinfo is UTC


def test_read_source_clock_keeps_aware_times_and_no_open_transaction():
    clock = read_source_clock(_FakeCursor((NOW.astimezone(PLUS2), None, 0, False, None)))
    assert clock.now == NOW and clock.now.utcoffset() == timedelta(hours=2)
    assert clock.oldest_open_xact is None


def test_read_source_clock_refuses_to_plan_when_sessions_are_hidden():
    with pytest.raises(PlanError, match=r"cannot see 2 session\(s\) on the source: grant pg_read_all_stats"):
        read_source_clock(_FakeCursor((NOW, None, 2, False, None)))


def test_read_source_clock_accepts_hidden_count_when_the_user_may_see_all_sessions():
    assert read_source_clock(_FakeCursor((NOW, None, 2, True, None))) == SourceClock(NOW, None)


# --- plan_window: scheduled runs ---------------------------------------------------------------

def test_first_scheduled_run_starts_at_the_initial_watermark():
    window = plan_window(TS, SourceClock(NOW, None), None)
    assert window == Window(Bound(EPOCH), Bound(datetime(2026, 3, 1, 11, 55, tzinfo=UTC)), backfill=False)


def test_first_scheduled_run_uses_the_spec_initial_watermark():
    spec = _spec(initial_watermark=datetime(2025, 6, 1, tzinfo=UTC))
    window = plan_window(spec, SourceClock(NOW, None), None)
    assert window.lo == Bound(datetime(2025, 6, 1, tzinfo=UTC), None)
    assert window.hi == Bound(datetime(2026, 3, 1, 11, 55, tzinfo=UTC), None)


def test_scheduled_run_starts_at_the_committed_watermark_including_its_key():
    committed = Bound(datetime(2026, 2, 28, tzinfo=UTC), (41,))
    window = plan_window(TS, SourceClock(NOW, None), committed)
    assert window.lo is committed
    assert window.hi == Bound(datetime(2026, 3, 1, 11, 55, tzinfo=UTC), None)
    assert window.backfill is False


def test_safe_lag_comes_from_the_spec():
    spec = _spec(safe_lag=timedelta(hours=2))
    assert plan_window(spec, SourceClock(NOW, None), None).hi.cursor == datetime(2026, 3, 1, 10, 0, tzinfo=UTC)
    spec = _spec(safe_lag=timedelta(0))
    assert plan_window(spec, SourceClock(NOW, None), None).hi.cursor == NOW


def test_scheduled_run_is_clamped_below_the_oldest_open_transaction():
    oldest = datetime(2026, 3, 1, 9, 30, tzinfo=UTC)
    window = plan_window(TS, SourceClock(NOW, oldest), Bound(T0))
    assert window.hi == Bound(datetime(2026, 3, 1, 9, 29, 59, 999999, tzinfo=UTC))


def test_hi_never_falls_below_a_committed_watermark_ahead_of_the_safe_bound():
    ahead = Bound(datetime(2026, 3, 1, 11, 58, tzinfo=UTC))  # safe bound is 11:55
    window = plan_window(TS, SourceClock(NOW, None), ahead)
    assert window == Window(ahead, Bound(datetime(2026, 3, 1, 11, 58, tzinfo=UTC)))
    assert window.empty is True


def test_hi_never_falls_below_lo_when_an_old_transaction_is_still_open():
    committed = Bound(datetime(2026, 3, 1, 10, 0, tzinfo=UTC))
    window = plan_window(TS, SourceClock(NOW, datetime(2026, 3, 1, 8, 0, tzinfo=UTC)), committed)
    assert window.hi.cursor == committed.cursor
    assert window.empty is True


def test_a_window_with_a_key_at_lo_is_not_empty_even_if_hi_equals_lo():
    at = datetime(2026, 3, 1, 11, 58, tzinfo=UTC)
    window = plan_window(TS, SourceClock(NOW, None), Bound(at, (7,)))
    assert window.hi.cursor == at
    assert window.empty is False  # the rows at `at` with a key above 7 are still due


# --- plan_window: backfill runs ----------------------------------------------------------------

FEB = (datetime(2026, 2, 1, tzinfo=UTC), datetime(2026, 3, 1, tzinfo=UTC))


def test_backfill_window_is_the_data_interval_made_inclusive_exclusive():
    window = plan_window(TS, SourceClock(datetime(2026, 3, 2, tzinfo=UTC), None), Bound(T0), interval=FEB)
    assert window == Window(
        Bound(datetime(2026, 1, 31, 23, 59, 59, 999999, tzinfo=UTC)),
        Bound(datetime(2026, 2, 28, 23, 59, 59, 999999, tzinfo=UTC)),
        backfill=True,
    )


def test_backfill_ignores_the_committed_watermark():
    far_ahead = Bound(datetime(2026, 6, 1, tzinfo=UTC))
    with_wm = plan_window(TS, SourceClock(datetime(2026, 7, 1, tzinfo=UTC), None), far_ahead, interval=FEB)
    without = plan_window(TS, SourceClock(datetime(2026, 7, 1, tzinfo=UTC), None), None, interval=FEB)
    assert with_wm == without
    assert with_wm.lo.cursor == datetime(2026, 1, 31, 23, 59, 59, 999999, tzinfo=UTC)


def test_backfill_selects_exactly_start_up_to_but_excluding_end():
    window = plan_window(TS, SourceClock(datetime(2026, 3, 2, tzinfo=UTC), None), None, interval=FEB)
    sql = predicate(TS, window)
    start, end = FEB
    got = {t: _matches(sql, {"updated_at": t}) for t in (start - US, start, end - US, end)}
    assert got == {start - US: False, start: True, end - US: True, end: False}


def test_backfill_hi_is_clamped_to_the_safe_bound():
    now = datetime(2026, 2, 15, 12, 0, tzinfo=UTC)
    window = plan_window(TS, SourceClock(now, None), None, interval=FEB)
    assert window.hi.cursor == datetime(2026, 2, 15, 11, 55, tzinfo=UTC)
    assert window.backfill is True


def test_backfill_hi_is_clamped_below_the_oldest_open_transaction():
    oldest = datetime(2026, 2, 27, tzinfo=UTC)
    spec = _spec(max_hold="P7D")
    window = plan_window(spec, SourceClock(datetime(2026, 3, 2, tzinfo=UTC), oldest), None, interval=FEB)
    assert window.hi.cursor == datetime(2026, 2, 26, 23, 59, 59, 999999, tzinfo=UTC)


def test_backfill_entirely_after_the_safe_bound_fails_instead_of_committing_nothing():
    now = datetime(2026, 1, 15, tzinfo=UTC)
    with pytest.raises(PlanError, match=r"starts after the source's safe bound 2026-01-14T23:55:00\+00:00"):
        plan_window(TS, SourceClock(now, None), None, interval=FEB)


@pytest.mark.parametrize("width", [timedelta(0), -US])
def test_backfill_of_an_empty_data_interval_fails_loudly(width):
    start = datetime(2026, 11, 20, tzinfo=UTC)
    with pytest.raises(PlanError, match=r"empty data interval \[2026-11-20T00:00:00\+00:00, .*CronDataIntervalTimetable"):
        plan_window(TS, SourceClock(datetime(2026, 11, 23, tzinfo=UTC), None), None, interval=(start, start + width))


def test_backfill_treats_a_naive_interval_as_utc():
    naive = (datetime(2026, 2, 1), datetime(2026, 3, 1))
    window = plan_window(TS, SourceClock(datetime(2026, 3, 2, tzinfo=UTC), None), None, interval=naive)
    assert window.lo.cursor == datetime(2026, 1, 31, 23, 59, 59, 999999, tzinfo=UTC)
    assert window.lo.cursor.tzinfo is UTC and window.hi.cursor.tzinfo is UTC


def test_backfill_keeps_an_aware_interval_in_its_own_zone():
    local = (datetime(2026, 2, 1, tzinfo=PLUS2), datetime(2026, 3, 1, tzinfo=PLUS2))
    window = plan_window(TS, SourceClock(datetime(2026, 3, 2, tzinfo=UTC), None), None, interval=local)
    assert window.lo.cursor == datetime(2026, 1, 31, 21, 59, 59, 999999, tzinfo=UTC)
    assert window.lo.cursor.utcoffset() == timedelta(hours=2)
    assert window.hi.cursor == datetime(2026, 2, 28, 21, 59, 59, 999999, tzinfo=UTC)
    assert predicate(TS, window) == (
        "\"updated_at\" > '2026-01-31T23:59:59.999999+02:00'::timestamptz"
        " AND \"updated_at\" <= '2026-02-28T23:59:59.999999+02:00'::timestamptz"
    )


def test_a_naive_source_clock_is_treated_as_utc():
    clock = SourceClock(datetime(2026, 3, 1, 12, 0), datetime(2026, 3, 1, 11, 0))
    window = plan_window(TS, clock, None)
    assert window.hi.cursor == datetime(2026, 3, 1, 10, 59, 59, 999999, tzinfo=UTC)


# --- plan_window: id cursors -------------------------------------------------------------------

def test_id_cursor_first_run_reads_every_id_up_to_the_final_high_even_zero_and_negative():
    window = plan_window(ID, SourceClock(NOW, None), None, id_high=500)
    assert window == Window(Bound(-(1 << 63)), Bound(500), backfill=False)
    assert predicate(ID, window) == '"entry_id" > -9223372036854775808 AND "entry_id" <= 500'


def test_id_cursor_first_run_honours_initial_watermark():
    spec = _spec(cursor={"kind": "id", "column": "entry_id"}, append_only=True, initial_watermark=-5)
    assert plan_window(spec, SourceClock(NOW, None), None, id_high=500) == Window(Bound(-5), Bound(500))


def test_id_cursor_continues_from_the_committed_watermark():
    window = plan_window(ID, SourceClock(NOW, None), Bound(120), id_high=500)
    assert window == Window(Bound(120), Bound(500))
    assert predicate(ID, window) == '"entry_id" > 120 AND "entry_id" <= 500'


@pytest.mark.parametrize(("committed", "id_high", "hi"), [
    (None, None, -(1 << 63)),  # empty source table
    (Bound(120), None, 120),
    (Bound(120), 90, 120),  # never below lo
    (Bound(120), 120, 120),
])
def test_id_cursor_hi_never_below_lo(committed, id_high, hi):
    window = plan_window(ID, SourceClock(NOW, None), committed, id_high=id_high)
    assert window.hi == Bound(hi)
    assert window.empty is True


def test_id_cursor_cannot_be_backfilled_by_data_interval():
    with pytest.raises(PlanError, match="pipeline ledger_entries: backfill by data interval needs a timestamp cursor"):
        plan_window(ID, SourceClock(NOW, None), None, interval=FEB, id_high=5)


# --- literal() ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "sql"), [
    (42, "42"),
    (-7, "-7"),
    ("abc", "'abc'"),
    ("O'Brien", "'O''Brien'"),
    ("''", "''''''"),
    ("x'; DROP TABLE t; --", "'x''; DROP TABLE t; --'"),
    ("C:\\dir", "'C:\\dir'"),
    (datetime(2026, 1, 1, 0, 0, 0, 1), "'2026-01-01T00:00:00.000001+00:00'::timestamptz"),
    (datetime(2026, 1, 1, tzinfo=PLUS2), "'2026-01-01T00:00:00+02:00'::timestamptz"),
])
def test_literal(value, sql):
    assert literal(value) == sql


@pytest.mark.parametrize("value", [None, True, False])
def test_literal_refuses_null_and_booleans(value):
    with pytest.raises(ValueError, match="unsupported cursor/key value"):
        literal(value)


def test_literal_refuses_a_nul_byte():
    with pytest.raises(ValueError, match="key value contains a NUL byte"):
        literal("a\x00b")


# --- predicate() -------------------------------------------------------------------------------

def test_predicate_without_a_key_at_lo():
    assert predicate(TS, Window(Bound(T0), Bound(T1))) == (
        "\"updated_at\" > '2026-01-01T00:00:00+00:00'::timestamptz"
        " AND \"updated_at\" <= '2026-01-02T00:00:00+00:00'::timestamptz"
    )


def test_predicate_with_a_key_at_lo_compares_the_tuple():
    assert predicate(TS, Window(Bound(T0, (41,)), Bound(T1))) == (
        "(\"updated_at\", \"entry_id\") > ('2026-01-01T00:00:00+00:00'::timestamptz, 41)"
        " AND \"updated_at\" <= '2026-01-02T00:00:00+00:00'::timestamptz"
    )


def test_predicate_quotes_identifiers_and_escapes_key_values():
    sql = predicate(QUOTED, Window(Bound(T0, ("O'Neil", 2)), Bound(T1)))
    assert sql == (
        "(\"Booked_At\", \"order\", \"Line_No\") > ('2026-01-01T00:00:00+00:00'::timestamptz, 'O''Neil', 2)"
        " AND \"Booked_At\" <= '2026-01-02T00:00:00+00:00'::timestamptz"
    )


def test_predicate_refuses_a_nul_byte_in_a_key():
    with pytest.raises(ValueError, match="NUL"):
        predicate(TS, Window(Bound(T0, ("a\x00",)), Bound(T1)))


def test_predicate_tuple_lower_bound_selects_rows_after_the_key_at_the_same_time():
    sql = predicate(TS, Window(Bound(T0, (41,)), Bound(T1)))
    rows = [
        ({"updated_at": T0 - US, "entry_id": 99}, False),
        ({"updated_at": T0, "entry_id": 40}, False),
        ({"updated_at": T0, "entry_id": 41}, False),
        ({"updated_at": T0, "entry_id": 42}, True),
        ({"updated_at": T0 + US, "entry_id": 1}, True),
        ({"updated_at": T1, "entry_id": 1}, True),
        ({"updated_at": T1 + US, "entry_id": 1}, False),
    ]
    assert [_matches(sql, row) for row, _ in rows] == [want for _, want in rows]


# --- split_predicates() ------------------------------------------------------------------------

def test_split_without_cuts_is_the_window_predicate():
    window = Window(Bound(T0), Bound(T1))
    assert split_predicates(TS, window, []) == [predicate(TS, window)]


def test_split_ignores_edges_on_or_outside_the_window():
    window = Window(Bound(T0), Bound(T1))
    edges = [T0, T1, T0 - timedelta(days=1), T1 + timedelta(days=1)]
    assert split_predicates(TS, window, edges) == [predicate(TS, window)]


def test_split_predicates_exact_text_sorted_deduplicated_and_naive_edges_as_utc():
    window = Window(Bound(T0), Bound(T1))
    six, noon = datetime(2026, 1, 1, 6), datetime(2026, 1, 1, 12, tzinfo=UTC)
    base = predicate(TS, window)
    assert split_predicates(TS, window, [noon, six, six, T1]) == [
        f"{base} AND \"updated_at\" <= '2026-01-01T06:00:00+00:00'::timestamptz",
        f"{base} AND \"updated_at\" > '2026-01-01T06:00:00+00:00'::timestamptz"
        f" AND \"updated_at\" <= '2026-01-01T12:00:00+00:00'::timestamptz",
        f"{base} AND \"updated_at\" > '2026-01-01T12:00:00+00:00'::timestamptz",
    ]


def test_split_predicates_for_id_cursors():
    window = Window(Bound(0), Bound(100))
    base = '"entry_id" > 0 AND "entry_id" <= 100'
    assert split_predicates(ID, window, [75, 25, 50]) == [
        f'{base} AND "entry_id" <= 25',
        f'{base} AND "entry_id" > 25 AND "entry_id" <= 50',
        f'{base} AND "entry_id" > 50 AND "entry_id" <= 75',
        f'{base} AND "entry_id" > 75',
    ]


def _assert_disjoint_and_covering(spec, window, parts, rows):
    base = predicate(spec, window)
    inside = 0
    for row in rows:
        hits = [i for i, part in enumerate(parts) if _matches(part, row)]
        if _matches(base, row):
            inside += 1
            assert len(hits) == 1, f"row {row} is in parts {hits}, expected exactly one"
        else:
            assert hits == [], f"row {row} is outside the window but in parts {hits}"
    return inside


def test_split_timestamp_parts_are_disjoint_and_cover_the_window():
    lo, hi = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, 10, tzinfo=UTC)
    window = Window(Bound(lo, (5,)), Bound(hi))
    edges = [lo + timedelta(hours=h) for h in (2.5, 5, 7.5)]
    parts = split_predicates(TS, window, edges)
    assert len(parts) == 4
    times = {lo + timedelta(minutes=m) for m in range(-60, 11 * 60, 15)}
    times |= {t + d for t in (lo, hi, *edges) for d in (-US, timedelta(0), US)}
    rows = [{"updated_at": t, "entry_id": k} for t in sorted(times) for k in (4, 5, 6)]
    inside = _assert_disjoint_and_covering(TS, window, parts, rows)
    # (lo, 5) excluded: at lo only key 6 is in; after lo up to and including hi every key is in.
    after_lo = [t for t in times if lo < t <= hi]
    assert inside == 1 + 3 * len(after_lo)


def test_split_id_parts_are_disjoint_and_cover_the_window():
    window = Window(Bound(10), Bound(110))
    parts = split_predicates(ID, window, [35, 60, 85, 60, 200, 10])
    rows = [{"entry_id": i} for i in range(0, 130)]
    assert _assert_disjoint_and_covering(ID, window, parts, rows) == 100
    assert [sum(_matches(p, r) for r in rows) for p in parts] == [25, 25, 25, 25]


# --- JSON round trips and time zones --------------------------------------------------------------

def test_bound_to_json_exact():
    assert Bound(datetime(2026, 1, 1, 0, 0, 0, 5, tzinfo=UTC), ("a'b", 5)).to_json() == {
        "cursor": "2026-01-01T00:00:00.000005+00:00", "pk": ["a'b", 5],
    }
    assert Bound(7).to_json() == {"cursor": 7, "pk": None}


@pytest.mark.parametrize("bound", [
    Bound(datetime(2026, 1, 1, 0, 0, 0, 5, tzinfo=UTC)),
    Bound(datetime(2026, 1, 1, tzinfo=UTC), ("a'b", 5)),
    Bound(7),
    Bound(0, (3,)),
])
def test_bound_json_round_trip(bound):
    back = Bound.from_json(json.loads(json.dumps(bound.to_json())))
    assert back == bound
    assert type(back.cursor) is type(bound.cursor)


def test_bound_from_json_refuses_naive_times_and_keeps_aware_zones():
    with pytest.raises(ValueError, match="has no time zone"):
        Bound.from_json({"cursor": "2026-01-01T00:00:00", "pk": None})
    zulu = Bound.from_json({"cursor": "2026-01-01T00:00:00Z"})
    assert zulu.cursor == T0 and zulu.pk is None
    local = Bound.from_json(Bound(datetime(2026, 1, 1, 2, 0, tzinfo=PLUS2)).to_json())
    assert local.cursor == T0 and local.cursor.utcoffset() == timedelta(hours=2)


def test_a_naive_bound_comes_back_as_utc():
    assert Bound(datetime(2026, 1, 1)).to_json() == {"cursor": "2026-01-01T00:00:00+00:00", "pk": None}
    assert Bound.from_json(Bound(datetime(2026, 1, 1)).to_json()) == Bound(T0)


def test_window_to_json_exact():
    window = Window(Bound(T0, (1,)), Bound(T1), backfill=True)
    assert window.to_json() == {
        "lo": {"cursor": "2026-01-01T00:00:00+00:00", "pk": [1]},
        "hi": {"cursor": "2026-01-02T00:00:00+00:00", "pk": None},
        "backfill": True,
    }


@pytest.mark.parametrize("window", [
    Window(Bound(T0), Bound(T1)),
    Window(Bound(T0, ("k", 2)), Bound(T1), backfill=True),
    Window(Bound(5), Bound(9)),
])
def test_window_json_round_trip_from_dict_and_from_text(window):
    assert Window.from_json(window.to_json()) == window
    assert Window.from_json(json.dumps(window.to_json())) == window


def test_window_from_json_defaults_backfill_to_false():
    raw = '{"lo": {"cursor": 5, "pk": null}, "hi": {"cursor": 9, "pk": null}}'
    assert Window.from_json(raw) == Window(Bound(5), Bound(9), backfill=False)


def test_window_and_bound_text():
    assert str(Window(Bound(T0, (41, "x")), Bound(T1), backfill=True)) == (
        "backfill (2026-01-01T00:00:00+00:00/41,x, 2026-01-02T00:00:00+00:00]"
    )
    assert str(Window(Bound(5), Bound(9))) == "(5, 9]"


def test_holds_cursors_checks_read_values_against_the_bounds_with_naive_as_utc():
    window = Window(Bound(T0), Bound(T1))
    after = T0 + timedelta(microseconds=1)
    assert not window.holds_cursors(T0, T1)  # lo without a key: every row at T0 is already loaded
    assert Window(Bound(T0, (7,)), Bound(T1)).holds_cursors(T0, T1)  # lo with a key: greater keys at T0 belong
    assert window.holds_cursors(after.replace(tzinfo=None), T1.replace(tzinfo=None))
    assert not window.holds_cursors(after, T1 + timedelta(microseconds=1))
    assert Window(Bound(10), Bound(20)).holds_cursors(11, 20)
    assert not Window(Bound(10), Bound(20)).holds_cursors(10, 20)


# --- windows capped at a key (max_batch_rows): tuple upper bounds ------------------------------

def test_predicate_tuple_upper_bound_ends_at_the_key_inside_a_run_of_equal_cursors():
    sql = predicate(TS, Window(Bound(T0, (10,)), Bound(T0, (20,))))
    rows = [
        ({"updated_at": T0, "entry_id": 10}, False),
        ({"updated_at": T0, "entry_id": 11}, True),
        ({"updated_at": T0, "entry_id": 20}, True),
        ({"updated_at": T0, "entry_id": 21}, False),
        ({"updated_at": T0 + US, "entry_id": 1}, False),
    ]
    assert [_matches(sql, row) for row, _ in rows] == [want for _, want in rows]
    follow = predicate(TS, Window(Bound(T0, (20,)), Bound(T1)))  # the next batch takes the rest of the run
    assert [_matches(follow, row) for row, _ in rows] == [False, False, False, True, True]


def test_a_capped_window_round_trips_and_is_empty_only_at_its_lower_bound():
    capped = Window(Bound(T0, (10,)), Bound(T0, (20,)))
    assert Window.from_json(json.dumps(capped.to_json())) == capped
    assert not capped.empty
    assert Window(Bound(T0, (20,)), Bound(T0, (20,))).empty
    assert not Window(Bound(T0), Bound(T1, (3,))).empty
    with pytest.raises(ValueError, match="is after"):
        Window.from_json(Window(Bound(T0), Bound(T0, (3,))).to_json())  # every row at T0 is already loaded
    with pytest.raises(ValueError, match="two lengths"):
        Window.from_json(Window(Bound(T0, (1, 2)), Bound(T1, (3,))).to_json())


def test_a_window_opened_above_keeps_its_start_and_holds_every_later_cursor():
    """A CDC handoff batch reads every row of its snapshot after the window's start (issue 31)."""
    ts = Window(Bound(datetime(2026, 1, 1, tzinfo=timezone.utc), (7,)), Bound(datetime(2026, 1, 2, tzinfo=timezone.utc)))
    opened = ts.opened_above()
    assert opened.lo == ts.lo and opened.holds_cursors(datetime(2026, 1, 1, tzinfo=timezone.utc),
                                                       datetime(9999, 12, 31, tzinfo=timezone.utc))
    assert not opened.holds_cursors(datetime(2025, 12, 31, tzinfo=timezone.utc), datetime(2026, 1, 1, tzinfo=timezone.utc))
    assert Window.from_json(opened.to_json()) == opened
    ids = Window(Bound(10), Bound(20)).opened_above()
    assert ids.holds_cursors(11, (1 << 63) - 1) and not ids.holds_cursors(10, 12)

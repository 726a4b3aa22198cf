"""Batch windows: which source rows one batch carries, decided on the source database's clock.

A window is ``lo < (cursor, pk) <= hi``. Both bounds are tuples ``(cursor, pk)`` where
``pk = None`` means "every row at ``cursor``": ``lo`` is the committed watermark, ``hi`` usually
the *safe bound* (a window capped by ``max_batch_rows`` ends at the key of its last row instead,
which may lie inside a run of rows sharing one cursor value). The safe bound is the source's own clock minus the safe lag, and strictly before the start of the
oldest transaction still open on the source. A transaction that started earlier stamps its rows
with an earlier time but commits later; without the clamp those rows would commit beneath a
watermark that has already moved past them, which is how timestamp-based pulls lose rows.

Nothing here imports Airflow or Spark; SQL text is built only from validated identifiers and
from values this module formats itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from tidemark.protocol.errors import Terminal
from tidemark.protocol.spec import PipelineSpec, quote

MICROSECOND = timedelta(microseconds=1)  # PostgreSQL's timestamp resolution


@dataclass(frozen=True)
class Bound:
    """A cursor position: a timestamp (or id) and, optionally, the primary key reached at it."""

    cursor: datetime | int
    pk: tuple[Any, ...] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.cursor, datetime):
            object.__setattr__(self, "cursor", _aware(self.cursor))

    def to_json(self) -> dict[str, Any]:
        value = self.cursor.isoformat() if isinstance(self.cursor, datetime) else self.cursor
        return {"cursor": value, "pk": list(self.pk) if self.pk is not None else None}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> "Bound":
        """Strict: an int id or an ISO timestamp with its zone, and a key list or null; nothing else."""
        if not isinstance(raw, dict) or set(raw) - {"cursor", "pk"} or "cursor" not in raw:
            raise ValueError(f"a bound is {{cursor, pk}}, got {raw!r}")
        value, pk = raw["cursor"], raw.get("pk")
        if isinstance(value, int) and not isinstance(value, bool):
            cursor: datetime | int = value
        elif isinstance(value, str):
            cursor = datetime.fromisoformat(value)
            if cursor.tzinfo is None:
                raise ValueError(f"timestamp bound {value!r} has no time zone")
        else:
            raise ValueError(f"a bound's cursor is an integer id or an ISO timestamp, got {value!r}")
        if pk is not None and (not isinstance(pk, list) or not pk
                               or not all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in pk)):
            raise ValueError(f"a bound's pk is a non-empty list of strings or integers, got {pk!r}")
        return cls(cursor, tuple(pk) if pk is not None else None)

    @property
    def kind(self) -> str:
        return "timestamp" if isinstance(self.cursor, datetime) else "id"

    def __str__(self) -> str:
        value = self.cursor.isoformat() if isinstance(self.cursor, datetime) else str(self.cursor)
        return value if self.pk is None else f"{value}/{','.join(map(str, self.pk))}"


TOP = {"timestamp": datetime.max.replace(tzinfo=timezone.utc), "id": (1 << 63) - 1}  # the last cursor value


@dataclass(frozen=True)
class Window:
    lo: Bound  # exclusive
    hi: Bound  # inclusive (hi.pk None: after every row at hi.cursor; else at that row's key)
    backfill: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"lo": self.lo.to_json(), "hi": self.hi.to_json(), "backfill": self.backfill}

    def holds_cursors(self, lo: datetime | int, hi: datetime | int) -> bool:
        """Whether cursor values ``lo``..``hi`` as read from the source lie within the window's bounds.

        ``lo`` may equal the lower bound (rows at that value with a greater key belong to the window);
        naive timestamps are UTC, as everywhere in this module."""
        def aware(v):
            return _aware(v) if isinstance(v, datetime) else v

        lo, hi = aware(lo), aware(hi)
        above = lo > self.lo.cursor or (lo == self.lo.cursor and self.lo.pk is not None)
        return above and hi <= self.hi.cursor

    @classmethod
    def from_json(cls, raw: dict[str, Any] | str) -> "Window":
        """Strict: both bounds of one cursor kind, ``lo <= hi``, keys of one length."""
        data = json.loads(raw) if isinstance(raw, str) else raw
        if not isinstance(data, dict) or set(data) - {"lo", "hi", "backfill"} or not {"lo", "hi"} <= set(data):
            raise ValueError(f"a window is {{lo, hi, backfill}}, got {data!r}")
        if not isinstance(data.get("backfill", False), bool):
            raise ValueError(f"backfill is true or false, got {data['backfill']!r}")
        lo, hi = Bound.from_json(data["lo"]), Bound.from_json(data["hi"])
        if lo.kind != hi.kind:
            raise ValueError(f"window bounds of two kinds: lo {lo} is a {lo.kind}, hi {hi} a {hi.kind}")
        if lo.pk is not None and hi.pk is not None and len(lo.pk) != len(hi.pk):
            raise ValueError(f"window bounds with keys of two lengths: lo {lo}, hi {hi}")
        if hi.cursor < lo.cursor or (hi.cursor == lo.cursor and lo.pk is None and hi.pk is not None):
            raise ValueError(f"window lo {lo} is after hi {hi}")
        return cls(lo, hi, bool(data.get("backfill", False)))

    def opened_above(self) -> "Window":
        """The window with no end: every row after ``lo`` (a CDC handoff batch reads all its snapshot
        holds; its ledger window, and so the watermark, keep the planned end)."""
        return Window(self.lo, Bound(TOP[self.lo.kind]), self.backfill)

    @property
    def empty(self) -> bool:
        lo, hi = self.lo, self.hi
        if hi.cursor != lo.cursor:
            return hi.cursor < lo.cursor
        return lo.pk is None or hi.pk == lo.pk

    def __str__(self) -> str:
        kind = "backfill " if self.backfill else ""
        return f"{kind}({self.lo}, {self.hi}]"


class PlanError(Terminal, RuntimeError):
    """The source cannot be planned safely (e.g. missing rights to see open transactions)."""


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)


def literal(value: Any) -> str:
    """A SQL literal for a value this package produced (timestamps, ints, key strings)."""
    if isinstance(value, bool) or value is None:
        raise ValueError(f"unsupported cursor/key value {value!r}")
    if isinstance(value, datetime):
        return f"'{_aware(value).isoformat()}'::timestamptz"
    if isinstance(value, int):
        return str(value)
    text = str(value)
    if "\x00" in text:
        raise ValueError("key value contains a NUL byte")
    return "'" + text.replace("'", "''") + "'"


def predicate(spec: PipelineSpec, window: Window) -> str:
    """SQL condition selecting the window's rows from the source table."""
    return f"{_compare(spec, '>', window.lo)} AND {_compare(spec, '<=', window.hi)}"


def covered(spec: PipelineSpec, bound: Bound, alias: str) -> str:
    """SQL condition: the row ``alias`` is at or before ``bound`` (a committed watermark covers it)."""
    return _compare(spec, "<=", bound, alias)


def _compare(spec: PipelineSpec, op: str, bound: Bound, alias: str | None = None) -> str:
    """``cursor <op> bound``, as a row comparison with the key when the bound has one."""
    prefix = f"{quote(alias)}." if alias else ""
    if bound.pk is None:
        return f"{prefix}{quote(spec.cursor.column)} {op} {literal(bound.cursor)}"
    cols = ", ".join(prefix + quote(c) for c in (spec.cursor.column, *spec.primary_key))
    vals = ", ".join(literal(v) for v in (bound.cursor, *bound.pk))
    return f"({cols}) {op} ({vals})"


def cap_rows(cur, spec: PipelineSpec, window: Window, types: dict[str, str]) -> Window:
    """The window cut after its ``spec.max_batch_rows``-th row in (cursor, key) order, if it has more.

    The cut falls between two cursor values where it can (``hi.pk`` stays None), else at the
    last row's key (integer key columns as ints, others as text: ``types`` maps the source's
    columns to their SQL types). Every row up to the cut is final: it lies before the safe bound."""
    n = spec.max_batch_rows
    if n is None or window.backfill or window.empty:
        return window
    cols = [spec.cursor.column, *spec.primary_key]
    whole = {name for name, type_ in types.items() if type_ in ("smallint", "integer", "bigint")}
    keys = ", ".join(quote(c) if c in whole else f"{quote(c)}::text" for c in spec.primary_key)
    order = ", ".join(quote(c) for c in cols)
    cur.execute(f"SELECT {quote(spec.cursor.column)}, {keys} FROM {quote(spec.table)} "
                f"WHERE {predicate(spec, window)} ORDER BY {order} OFFSET {n - 1} LIMIT 2")
    rows = cur.fetchall()
    if len(rows) < 2:
        return window
    last, after = rows
    cursor = _aware(last[0]) if isinstance(last[0], datetime) else last[0]
    following = _aware(after[0]) if isinstance(after[0], datetime) else after[0]
    return Window(window.lo, Bound(cursor) if following != cursor else Bound(cursor, tuple(last[1:])))


def split_predicates(spec: PipelineSpec, window: Window, edges: list[datetime | int]) -> list[str]:
    """Disjoint conditions covering the window, one per parallel read, cut at ``edges``."""
    base = predicate(spec, window)
    cur = quote(spec.cursor.column)
    edges = [_aware(e) if isinstance(e, datetime) else e for e in edges]
    cuts = [e for e in sorted(set(edges)) if window.lo.cursor < e < window.hi.cursor]
    if not cuts:
        return [base]
    parts = [f"{base} AND {cur} <= {literal(cuts[0])}"]
    parts += [f"{base} AND {cur} > {literal(a)} AND {cur} <= {literal(b)}" for a, b in zip(cuts, cuts[1:])]
    parts.append(f"{base} AND {cur} > {literal(cuts[-1])}")
    return parts


@dataclass(frozen=True)
class SourceClock:
    """The source's clock, its oldest open transaction and its oldest prepared (two-phase) one."""

    now: datetime
    oldest_open_xact: datetime | None
    holder: dict[str, Any] | None = None  # the session of the oldest open transaction (pg_stat_activity)
    prepared: dict[str, Any] | None = None  # the oldest prepared transaction (pg_prepared_xacts)

    def __post_init__(self) -> None:  # naive values are UTC, like everything else here
        object.__setattr__(self, "now", _aware(self.now))
        if self.oldest_open_xact is not None:
            object.__setattr__(self, "oldest_open_xact", _aware(self.oldest_open_xact))

    def safe_bound(self, safe_lag: timedelta) -> datetime:
        """The clock minus the safe lag, held strictly before the oldest open transaction
        (a pending prepared transaction holds the window at its lower bound: see ``plan_window``)."""
        hi = self.now - safe_lag
        if self.oldest_open_xact is not None:
            hi = min(hi, self.oldest_open_xact - MICROSECOND)
        return hi

    def holds_back(self, safe_lag: timedelta) -> bool:
        """Whether an open or prepared transaction, not the safe lag, sets a timestamp window's end."""
        return self.prepared is not None or self.safe_bound(safe_lag) < self.now - safe_lag

    @property
    def prepared_at(self) -> datetime | None:
        return _aware(datetime.fromisoformat(self.prepared["prepared"])) if self.prepared else None

    def held_since(self) -> datetime | None:
        """Since when the oldest open or prepared transaction holds the window back."""
        starts = [t for t in (self.oldest_open_xact, self.prepared_at) if t is not None]
        return min(starts) if starts else None

    def holders(self) -> str:
        """Who holds the window back, as ops need it to act (empty if nothing does)."""
        parts = []
        if self.oldest_open_xact is not None:
            h = self.holder or {}
            age = (self.now - self.oldest_open_xact).total_seconds()
            parts.append(
                f"session pid={h.get('pid')} user={h.get('usename')} application={h.get('application_name')!r} "
                f"client={h.get('client_addr') or 'local'} state={h.get('state')!r} in a transaction open since "
                f"{self.oldest_open_xact.isoformat()} ({age:.0f} s)")
        if self.prepared is not None:
            age = (self.now - self.prepared_at).total_seconds()  # type: ignore[operator]
            parts.append(
                f"prepared transaction gid={self.prepared.get('gid')!r} owner={self.prepared.get('owner')} "
                f"prepared at {self.prepared_at.isoformat()} ({age:.0f} s)"  # type: ignore[union-attr]
                + (f", {self.prepared['count']} prepared in all" if self.prepared.get("count", 1) > 1 else ""))
        return "; ".join(parts)


# What an extract's sessions on the source are named (``tidemark-extract-<pipeline>``): the plan leaves its
# reads out of the open-transaction clamp, the status page finds its held snapshot by it.
EXTRACT_APPLICATION = "tidemark-extract-"

SOURCE_CLOCK_SQL = f"""
SELECT clock_timestamp(),
       (SELECT row_to_json(a) FROM (
          SELECT pid, usename, application_name, host(client_addr) AS client_addr, state, xact_start
            FROM pg_stat_activity
           WHERE datname = current_database() AND backend_type = 'client backend'
             AND pid <> pg_backend_pid() AND xact_start IS NOT NULL
             -- a Tidemark extract's reads (named by it, never writing: no transaction id) commit no rows
             AND NOT (application_name LIKE '{EXTRACT_APPLICATION}%%' AND backend_xid IS NULL)
           ORDER BY xact_start LIMIT 1) a),
       (SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND backend_type = 'client backend' AND state IS NULL),
       (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
         OR pg_has_role(current_user, 'pg_read_all_stats', 'MEMBER'),
       (SELECT row_to_json(p) FROM (
          SELECT gid, prepared, owner, count(*) OVER () AS count FROM pg_prepared_xacts
           WHERE database = current_database() ORDER BY prepared LIMIT 1) p)
"""


def read_source_clock(cur) -> SourceClock:
    """The source's clock, its oldest open transaction and oldest prepared one (a DB-API cursor)."""
    cur.execute(SOURCE_CLOCK_SQL)
    now, holder, hidden, can_see, prepared = cur.fetchone()
    if not can_see and hidden:
        raise PlanError(
            f"cannot see {hidden} session(s) on the source: grant pg_read_all_stats (or pg_monitor) to "
            "the source connection's user, or open transactions could not be detected and rows "
            "committed late would be lost"
        )
    holder = json.loads(holder) if isinstance(holder, str) else holder
    prepared = json.loads(prepared) if isinstance(prepared, str) else prepared
    oldest = _aware(datetime.fromisoformat(holder["xact_start"])) if holder else None
    return SourceClock(_aware(now), oldest, holder, prepared)


def plan_window(
    spec: PipelineSpec,
    clock: SourceClock,
    committed: Bound | None,
    *,
    interval: tuple[datetime, datetime] | None = None,
    id_high: int | None = None,
) -> Window:
    """The next window for ``spec``.

    Scheduled runs: from the committed watermark (or the spec's start) up to the safe bound.
    Backfill runs (``interval`` = Airflow's data interval, half-open ``[start, end)``): exactly
    that interval, clamped to the safe bound. Id cursors use ``id_high``, the largest id known to
    be final (``ledger.safe_id_high``: no transaction that was open when it was read is still open).

    A pending prepared transaction started at an unknown time before it was prepared, but after
    the committed watermark (every earlier plan held the window before it while it was open): it
    holds the window at its lower bound. A hold older than ``spec.max_hold`` fails the plan.
    """
    window = _window(spec, clock, committed, interval, id_high)
    held_since = clock.held_since()
    if held_since is not None and clock.now - held_since > spec.max_hold:
        free = _window(spec, SourceClock(clock.now, None), committed, interval, id_high)
        if spec.cursor.kind == "id" or window.hi.cursor < free.hi.cursor:
            raise PlanError(
                f"pipeline {spec.name}: the source has held the window back for longer than max_hold "
                f"{spec.max_hold}: {clock.holders()}. Next: end that transaction on the source (SELECT "
                "pg_terminate_backend(<pid>), or COMMIT PREPARED / ROLLBACK PREPARED '<gid>'), or raise max_hold "
                "in the spec; then clear this task"
            )
    return window


def _window(spec: PipelineSpec, clock: SourceClock, committed: Bound | None,
            interval: tuple[datetime, datetime] | None, id_high: int | None) -> Window:
    lo = committed or Bound(spec.start)
    if spec.cursor.kind == "id":
        if interval is not None:
            raise PlanError(f"pipeline {spec.name}: backfill by data interval needs a timestamp cursor")
        if clock.prepared is not None or id_high is None:
            return Window(lo, Bound(lo.cursor))
        return Window(lo, Bound(max(int(id_high), int(lo.cursor))))
    safe = clock.safe_bound(spec.safe_lag)
    if interval is not None:
        start, end = (_aware(t) for t in interval)
        if end <= start:  # a trigger timetable's run: loading it would commit 0 rows and look fine
            raise PlanError(
                f"pipeline {spec.name}: backfill run has an empty data interval [{start.isoformat()}, "
                f"{end.isoformat()}); the DAG's timetable must give runs real data intervals "
                "(CronDataIntervalTimetable), nothing was loaded"
            )
        if start >= safe:
            raise PlanError(
                f"pipeline {spec.name}: backfill interval [{start.isoformat()}, {end.isoformat()}) starts after "
                f"the source's safe bound {safe.isoformat()} (source clock minus safe lag {spec.safe_lag}, held "
                "before any open source transaction); run it again once that interval has passed"
            )
        lo_b = Bound(start - MICROSECOND)
        hi = max(min(end - MICROSECOND, safe), lo_b.cursor)
        if clock.prepared is not None and (committed is None or hi > committed.cursor):
            raise PlanError(
                f"pipeline {spec.name}: backfill interval [{start.isoformat()}, {end.isoformat()}) reaches past the "
                f"committed watermark while a prepared transaction is pending ({clock.holders()}); its rows may "
                "lie anywhere after the watermark. Next: COMMIT PREPARED or ROLLBACK PREPARED it on the source, "
                "then clear this task"
            )
        return Window(lo_b, Bound(hi), backfill=True)
    if clock.prepared is not None:
        return Window(lo, Bound(lo.cursor))
    return Window(lo, Bound(max(safe, lo.cursor)))  # type: ignore[type-var]

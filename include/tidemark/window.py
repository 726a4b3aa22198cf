"""Batch windows: which source rows one batch carries, decided on the source database's clock.

A window is ``lo < (cursor, pk) and cursor <= hi``. ``lo`` is the committed watermark, a tuple
``(cursor, pk)`` where ``pk = None`` means "every row at ``cursor`` is already loaded". ``hi`` is
the *safe bound*: the source's own clock minus the safe lag, and strictly before the start of the
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

from tidemark.spec import PipelineSpec, quote

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
        value = raw["cursor"]
        cursor = value if isinstance(value, int) else _aware(datetime.fromisoformat(value))
        return cls(cursor, tuple(raw["pk"]) if raw.get("pk") is not None else None)

    def __str__(self) -> str:
        value = self.cursor.isoformat() if isinstance(self.cursor, datetime) else str(self.cursor)
        return value if self.pk is None else f"{value}/{','.join(map(str, self.pk))}"


@dataclass(frozen=True)
class Window:
    lo: Bound  # exclusive
    hi: Bound  # inclusive (hi.pk is always None: a window ends after a whole cursor value)
    backfill: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"lo": self.lo.to_json(), "hi": self.hi.to_json(), "backfill": self.backfill}

    def holds_cursors(self, lo: datetime | int, hi: datetime | int) -> bool:
        """Whether cursor values ``lo``..``hi`` as read from the source lie within the window's bounds.

        ``lo`` may equal the lower bound (rows at that value with a greater key belong to the window);
        naive timestamps are UTC, as everywhere in this module."""
        def aware(v):
            return _aware(v) if isinstance(v, datetime) else v

        return aware(lo) >= self.lo.cursor and aware(hi) <= self.hi.cursor

    @classmethod
    def from_json(cls, raw: dict[str, Any] | str) -> "Window":
        data = json.loads(raw) if isinstance(raw, str) else raw
        return cls(Bound.from_json(data["lo"]), Bound.from_json(data["hi"]), bool(data.get("backfill")))

    @property
    def empty(self) -> bool:
        return self.hi.cursor <= self.lo.cursor and self.lo.pk is None

    def __str__(self) -> str:
        kind = "backfill " if self.backfill else ""
        return f"{kind}({self.lo}, {self.hi}]"


class PlanError(RuntimeError):
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
    cur = quote(spec.cursor.column)
    if window.lo.pk is None:
        lower = f"{cur} > {literal(window.lo.cursor)}"
    else:
        cols = ", ".join(quote(c) for c in (spec.cursor.column, *spec.primary_key))
        vals = ", ".join(literal(v) for v in (window.lo.cursor, *window.lo.pk))
        lower = f"({cols}) > ({vals})"
    return f"{lower} AND {cur} <= {literal(window.hi.cursor)}"


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
    now: datetime
    oldest_open_xact: datetime | None

    def __post_init__(self) -> None:  # naive values are UTC, like everything else here
        object.__setattr__(self, "now", _aware(self.now))
        if self.oldest_open_xact is not None:
            object.__setattr__(self, "oldest_open_xact", _aware(self.oldest_open_xact))

    def safe_bound(self, safe_lag: timedelta) -> datetime:
        hi = self.now - safe_lag
        if self.oldest_open_xact is not None:
            hi = min(hi, self.oldest_open_xact - MICROSECOND)
        return hi


SOURCE_CLOCK_SQL = """
SELECT clock_timestamp(),
       (SELECT min(xact_start) FROM pg_stat_activity
         WHERE datname = current_database() AND backend_type = 'client backend'
           AND pid <> pg_backend_pid() AND xact_start IS NOT NULL),
       (SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND backend_type = 'client backend' AND state IS NULL),
       (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
         OR pg_has_role(current_user, 'pg_read_all_stats', 'MEMBER')
"""


def read_source_clock(cur) -> SourceClock:
    """The source's clock and the start of its oldest open transaction (a DB-API cursor)."""
    cur.execute(SOURCE_CLOCK_SQL)
    now, oldest, hidden, can_see = cur.fetchone()
    if not can_see and hidden:
        raise PlanError(
            f"cannot see {hidden} session(s) on the source: grant pg_read_all_stats (or pg_monitor) to "
            "the source connection's user, or open transactions could not be detected and rows "
            "committed late would be lost"
        )
    return SourceClock(_aware(now), _aware(oldest) if oldest is not None else None)


def plan_window(
    spec: PipelineSpec,
    clock: SourceClock,
    committed: Bound | None,
    *,
    interval: tuple[datetime, datetime] | None = None,
    id_high: int | None = None,
) -> Window:
    """The next window for ``spec``.

    Scheduled runs: from the committed watermark (or the spec's initial point) up to the safe
    bound. Backfill runs (``interval`` = Airflow's data interval, half-open ``[start, end)``):
    exactly that interval, clamped to the safe bound. Id cursors use ``id_high``, the largest id
    visible on the source when planning.
    """
    if spec.cursor.kind == "id":
        if interval is not None:
            raise PlanError(f"pipeline {spec.name}: backfill by data interval needs a timestamp cursor")
        lo = committed or Bound(0)
        hi = max(int(id_high or 0), int(lo.cursor))
        return Window(lo, Bound(hi))
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
        lo = Bound(start - MICROSECOND)
        hi = max(min(end - MICROSECOND, safe), lo.cursor)
        return Window(lo, Bound(hi), backfill=True)
    lo = committed or Bound(spec.initial_watermark)
    return Window(lo, Bound(max(safe, lo.cursor)))  # type: ignore[type-var]

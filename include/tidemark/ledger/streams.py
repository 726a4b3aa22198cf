"""Standing sinks: desired state, the supervisor's events, heartbeats."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tidemark.ledger.batches import consumer_for


STREAM_STATES = ("running", "paused", "stopped")


@dataclass(frozen=True)
class StreamState:
    desired: str
    changed_by: str | None  # None: never set, the default
    changed_at: Any
    reason: str | None
    crash_looping_since: Any


def stream_state(cur, pipeline: str) -> StreamState:
    cur.execute("""SELECT desired, changed_by, changed_at, reason, crash_looping_since
                     FROM tidemark_control.streams WHERE pipeline = %s""", (pipeline,))
    row = cur.fetchone()
    return StreamState(*row) if row else StreamState("running", None, None, None, None)


def set_desired(cur, pipeline: str, desired: str, actor: str, reason: str | None = None) -> str:
    """Record what a person wants of the pipeline's stream (and who, when, why); returns the state before."""
    if desired not in STREAM_STATES:
        raise ValueError(f"desired state is one of {STREAM_STATES}, got {desired!r}")
    before = stream_state(cur, pipeline).desired
    cur.execute(
        """INSERT INTO tidemark_control.streams (pipeline, desired, changed_by, reason) VALUES (%s, %s, %s, %s)
           ON CONFLICT (pipeline) DO UPDATE SET desired = EXCLUDED.desired, changed_by = EXCLUDED.changed_by,
               reason = EXCLUDED.reason, changed_at = clock_timestamp()""",
        (pipeline, desired, actor, reason))
    record_stream_event(cur, pipeline, "desired", actor, f"{before} -> {desired}" + (f": {reason}" if reason else ""))
    return before


def observe_stream(cur, pipeline: str, lag: int | None) -> tuple[int | None, Any]:
    """Keep the supervisor's look at the lag; returns the previous one (is the lag growing?) and since when
    the sink has had records to read without a break (None: none now), where a stall's clock starts: a sink
    idle for hours that receives a large batch is busy with it, not stalled for hours."""
    cur.execute(
        """INSERT INTO tidemark_control.streams AS s (pipeline, changed_by, observed_lag, observed_at, lagging_since)
           VALUES (%(p)s, 'supervisor', %(lag)s, clock_timestamp(), CASE WHEN %(lag)s > 0 THEN clock_timestamp() END)
           ON CONFLICT (pipeline) DO UPDATE SET observed_lag = EXCLUDED.observed_lag, observed_at = EXCLUDED.observed_at,
               lagging_since = CASE WHEN EXCLUDED.observed_lag > 0 THEN coalesce(s.lagging_since, clock_timestamp())
                                    WHEN EXCLUDED.observed_lag IS NULL THEN s.lagging_since END
           RETURNING (SELECT observed_lag FROM tidemark_control.streams WHERE pipeline = s.pipeline), s.lagging_since""",
        {"p": pipeline, "lag": lag})
    previous, lagging_since = cur.fetchone()
    return previous, lagging_since


def record_stream_event(cur, pipeline: str, kind: str, actor: str, detail: str | None = None) -> None:
    cur.execute("INSERT INTO tidemark_control.stream_events (pipeline, kind, actor, detail) VALUES (%s, %s, %s, %s)",
                (pipeline, kind, actor, detail))


def restarts_since(cur, pipeline: str, window: Any, kind: str = "restart", detail_prefix: str | None = None
                   ) -> list[Any]:
    """When the supervisor restarted the stream (``kind``: or its CDC connector, ``connector_restart``; or
    the starts whose detail begins with ``detail_prefix``) within ``window`` (a duration) of now and since a
    person last cleared a crash loop (the budget starts afresh then), oldest first."""
    cur.execute("""SELECT at FROM tidemark_control.stream_events
                    WHERE pipeline = %(p)s AND kind = %(k)s AND at >= clock_timestamp() - %(w)s
                      AND (%(d)s::text IS NULL OR starts_with(detail, %(d)s::text))
                      AND at > coalesce((SELECT max(at) FROM tidemark_control.stream_events
                                          WHERE pipeline = %(p)s AND kind = 'cleared'), '-infinity')
                    ORDER BY at""",
                {"p": pipeline, "w": window, "k": kind, "d": detail_prefix})
    return [r[0] for r in cur.fetchall()]


def mark_crash_looping(cur, pipeline: str, detail: str) -> None:
    cur.execute(
        """INSERT INTO tidemark_control.streams (pipeline, changed_by, crash_looping_since)
           VALUES (%s, 'supervisor', clock_timestamp())
           ON CONFLICT (pipeline) DO UPDATE
              SET crash_looping_since = coalesce(streams.crash_looping_since, EXCLUDED.crash_looping_since)""",
        (pipeline,))
    record_stream_event(cur, pipeline, "crash_loop", "supervisor", detail)


def clear_crash_loop(cur, pipeline: str, actor: str) -> bool:
    """A person's 'fixed, try again': the supervisor may restart the stream (its budget starts afresh)."""
    cur.execute("""UPDATE tidemark_control.streams SET crash_looping_since = NULL
                    WHERE pipeline = %s AND crash_looping_since IS NOT NULL""", (pipeline,))
    cleared = cur.rowcount == 1
    if cleared:
        record_stream_event(cur, pipeline, "cleared", actor, "crash loop cleared")
    return cleared


def beat(cur, pipeline: str, fence: int, holder: str, started_at: Any, *, records: int = 0,
         lag: dict[int, int] | None = None, offsets: dict[int, int] | None = None,
         batch_seconds: float | None = None) -> bool:
    """The running instance's heartbeat (and progress when ``records``), under its fencing token.
    False: the token is no longer current (another instance took over) or its lease was ended; this
    instance must stop."""
    cur.execute(
        """INSERT INTO tidemark_control.stream_heartbeats AS h (pipeline, fence, holder, started_at, heartbeat_at,
               progress_at, micro_batches, records, lag, offsets, batch_seconds)
           SELECT %(p)s, %(fence)s, %(holder)s, %(started)s, clock_timestamp(),
                  CASE WHEN %(records)s > 0 THEN clock_timestamp() END, %(batches)s, %(records)s,
                  %(lag)s, %(offsets)s, %(secs)s
             FROM tidemark_control.sink_fences f WHERE f.consumer = %(consumer)s AND f.fence = %(fence)s
           ON CONFLICT (pipeline) DO UPDATE SET
               fence = EXCLUDED.fence, holder = EXCLUDED.holder, heartbeat_at = EXCLUDED.heartbeat_at,
               ended_at = NULL,  -- only a new token gets here with an ended row (see WHERE)
               started_at = CASE WHEN h.fence = EXCLUDED.fence THEN h.started_at ELSE EXCLUDED.started_at END,
               progress_at = coalesce(EXCLUDED.progress_at, CASE WHEN h.fence = EXCLUDED.fence THEN h.progress_at END),
               micro_batches = CASE WHEN h.fence = EXCLUDED.fence THEN h.micro_batches ELSE 0 END
                               + EXCLUDED.micro_batches,
               records = CASE WHEN h.fence = EXCLUDED.fence THEN h.records ELSE 0 END + EXCLUDED.records,
               lag = coalesce(EXCLUDED.lag, h.lag), offsets = coalesce(EXCLUDED.offsets, h.offsets),
               batch_seconds = coalesce(EXCLUDED.batch_seconds, h.batch_seconds)
           WHERE h.fence < EXCLUDED.fence OR (h.fence = EXCLUDED.fence AND h.ended_at IS NULL)""",
        {"p": pipeline, "fence": fence, "holder": holder, "started": started_at, "records": records,
         "batches": 1 if batch_seconds is not None else 0, "consumer": consumer_for(pipeline),
         "lag": json.dumps({str(k): v for k, v in lag.items()}) if lag is not None else None,
         "offsets": json.dumps({str(k): v for k, v in offsets.items()}) if offsets is not None else None,
         "secs": batch_seconds})
    return cur.rowcount == 1


def heartbeat(cur, pipeline: str) -> dict[str, Any] | None:
    names = ("fence", "holder", "started_at", "heartbeat_at", "progress_at", "micro_batches", "records", "lag",
             "offsets", "batch_seconds", "ended_at")
    cur.execute(f"SELECT {', '.join(names)} FROM tidemark_control.stream_heartbeats WHERE pipeline = %s", (pipeline,))
    row = cur.fetchone()
    return dict(zip(names, row)) if row else None

"""What holds a pipeline, and the next step that works."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from tidemark.status.model import Health, Hold, PipelineStatus, SourceStatus, StreamStatus, format_duration, utc_iso

def pipeline_holds(p: PipelineStatus, *, health: Iterable[Health], source: SourceStatus | None,
                   stream: StreamStatus | None, now: datetime, lease: timedelta | None = None) -> list[Hold]:
    """What keeps the pipeline from moving, root causes first: the warehouse, its source or the
    broker down; its standing sink crash-looping, silent (no heartbeat within its lease) or not
    running; its stream paused or stopped by a person; a source transaction holding its window."""
    if p.error:
        return []
    holds = []
    for h in sorted(health, key=lambda h: ("warehouse", "source", "broker", "connect", "spark").index(h.kind)):
        if h.reachable or not (h.kind in ("warehouse", "broker")
                               or (h.kind == "source" and h.conn_id == p.source_conn_id)
                               or (h.kind == "connect" and stream is not None and stream.capture is not None)):  # CDC only
            continue
        name = {"warehouse": "warehouse", "broker": "Kafka broker", "connect": "Kafka Connect"}.get(
            h.kind, f"source {h.conn_id}")
        holds.append(Hold(h.kind, f"{name} unreachable ({h.address or h.conn_id})", h.since, h.next_step or ""))
    control = f"trigger the DAG tidemark_stream_control with pipeline={p.name}"
    if stream is not None:
        if stream.crash_looping_since is not None:
            holds.append(Hold("sink", "standing sink crash-looping", stream.crash_looping_since,
                              "fix the cause (the tidemark_supervisor task log names the sink's last error), "
                              f"then {control} action=clear"))
        elif stream.desired != "running":
            who = f" by {stream.changed_by}" if stream.changed_by else ""
            why = f": {stream.reason}" if stream.reason else ""
            holds.append(Hold("person", f"stream {stream.desired}{who}{why}", stream.changed_at,
                              f"{control} action=resume"))
        elif stream.heartbeat_at is not None and stream.ended_at is not None:
            holds.append(Hold("sink", "standing sink not running", stream.ended_at,
                              "the supervisor starts it within a minute while tidemark_supervisor runs "
                              "(unpaused, scheduler up: `make ui`)"))
        elif stream.heartbeat_at is not None and lease is not None and now - stream.heartbeat_at > lease:
            holds.append(Hold("sink", f"standing sink silent: no heartbeat for {format_duration(now - stream.heartbeat_at)} "
                                      f"(lease {format_duration(lease)})", stream.heartbeat_at,
                              "the supervisor restarts a hung sink while tidemark_supervisor runs (unpaused, scheduler "
                              "up: `make ui`); its log is in the streams directory"))
    if p.lag is not None and p.lag.held_back and source is not None and source.error is None:
        x, t = source.oldest_open_xact, source.oldest_prepared
        if t is not None:
            holds.append(Hold("transaction", f"prepared transaction {t.gid!r} on {source.conn_id} (owner {t.owner})",
                              t.prepared, f"COMMIT PREPARED '{t.gid}' or ROLLBACK PREPARED '{t.gid}' on the source"))
        if x is not None:
            holds.append(Hold("transaction", f"open transaction on {source.conn_id}: pid {x.pid}, user {x.usename}, "
                                             f"application {x.application_name!r}, {x.state}", x.xact_start,
                              f"end it (commit or roll back in that session), or SELECT pg_terminate_backend({x.pid}) "
                              "on the source"))
    return holds


def hold_text(hold: Hold, now: datetime | None = None) -> str:
    """held by: <what> since <time> (<how long>), next: <step>"""
    since = ""
    if hold.since is not None:
        since = f" since {utc_iso(hold.since)}"
        if now is not None:
            since += f" ({format_duration(now - hold.since)})"
    return f"held by: {hold.what}{since}, next: {hold.next}"

"""What the "Tidemark status" page shows, read from the warehouse's ledger and the source database.

Per pipeline spec: the last committed batch, the watermark and its lag behind the source clock,
unfinished attempts, recent failures and dead letters not yet in the dead-letter topic. Per source: the session whose open transaction holds
every window back (the planner's clamp) and any prepared transaction. In the warehouse: stage
tables nobody will apply or drop any more.

Health: whether the Kafka broker, the warehouse and each source answer, each check bounded by a
couple of seconds (``CHECK_TIMEOUT_S``), and since when one does not: the first failed check of an
outage is kept in a small JSON file (``health_file``, under the state directory), not in the
control schema, because the page never writes to a database and the warehouse is one of the
things that may be down. Per pipeline, what holds it (a component down, a crash-looping or silent
standing sink, a stream paused by a person, a source transaction holding the window) and the next
step that works (``Hold``).

Read-only by construction: every connection is switched to a read-only session in autocommit, so
each query is its own short transaction. The page therefore never holds a lock between queries
(the sink's DROP of a stage table never waits on it) and never keeps a transaction open on the
source (it would clamp the very windows it reports on). Plain DB-API cursors (psycopg2), no
Airflow import.

The rooms, each importing only those named before it: ``model`` (what the page shows, and how values are
written), ``queries``, ``health``, ``holds`` (what holds a pipeline), ``report`` (the whole page,
``collect``, and its text).
"""

from tidemark.status.model import (APPLICATION_NAME, CHECK_TIMEOUT_S, FAILED, FAILURE_WINDOW, UNFINISHED, Attempt,
                                   CaptureStatus, CommittedBatch, Health, Hold, Lag, PipelineEntry, PipelineLedger, PipelineStatus,
                                   PreparedXact, SourceSession, SourceStatus, StageTable, StatusReport, StreamStatus,
                                   Watermark, error_text, format_bytes, format_duration, jsonable, load_pipelines,
                                   utc_iso)
from tidemark.status.queries import (orphan_stage_tables, pipeline_ledger, read_only_session, source_status,
                                     stream_status, watermark_lag)
from tidemark.status.health import (Probe, health_file, next_step, pg_address, probe_broker, remember_health,
                                    track_health)
from tidemark.status.holds import hold_text, pipeline_holds
from tidemark.status.report import collect, health_lines, status_lines

__all__ = [
    "APPLICATION_NAME", "CHECK_TIMEOUT_S", "FAILED", "FAILURE_WINDOW", "UNFINISHED", "Attempt", "CaptureStatus", "CommittedBatch",
    "Health", "Hold", "Lag", "PipelineEntry", "PipelineLedger", "PipelineStatus", "PreparedXact", "SourceSession",
    "SourceStatus", "StageTable", "StatusReport", "StreamStatus", "Watermark", "error_text", "format_bytes",
    "format_duration", "jsonable", "load_pipelines", "utc_iso",
    "orphan_stage_tables", "pipeline_ledger", "read_only_session", "source_status", "stream_status", "watermark_lag",
    "Probe", "health_file", "next_step", "pg_address", "probe_broker", "remember_health", "track_health",
    "hold_text", "pipeline_holds", "collect", "health_lines", "status_lines",
]

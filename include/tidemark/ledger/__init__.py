"""The batch ledger and watermarks in the warehouse's control schema (DB-API cursors, psycopg2).

The orchestration side writes here (plan, attempts, extract totals); the sink writes the outcome
(committed, refused, superseded) in the same transaction as the data it applies. The ledger is the
only authority for what a batch is. One module per table family, imports only downward:

- ``schema``: the control schema itself;
- ``batches``: batches as planned (ids, plans, record schemas, repairs, id observations);
- ``lifecycle``: attempts, their one state machine, the per-pipeline turn;
- ``handoffs``: CDC handoff positions, per extract attempt and committed;
- ``changes``: the change stream's waiting events and transactions, its position, deletions, slot watch;
- ``streams``: standing sinks' desired state, events and heartbeats;
- ``sink_state``: fences, offsets, ENDs, staged totals, rejects, the watermark's advance;
- ``views``: read-only queries for the status page and CLI;
- ``reconciliations``: reconciliation evidence (append-only) and what the evidence pages read.

Callers use ``from tidemark import ledger`` and ``ledger.<name>``: every public name is here. The
source- and target-side catalog and DDL live in ``tidemark.ledger.catalog``.
"""

from __future__ import annotations

from tidemark.ledger.batches import (  # noqa: F401
    AlreadyCommitted,
    LedgerBatch,
    RepairDeletion,
    batch_id_for,
    column_fills,
    committed_watermark,
    consumer_for,
    latest_schema_columns,
    planned_batch,
    record_column_fills,
    record_plan,
    record_repair_plan,
    record_schema,
    recording_repair_deletions,
    records_window,
    register_schema,
    repair,
    repair_deletes,
    repair_deletions,
    safe_id_high,
)
from tidemark.ledger.changes import (  # noqa: F401
    drop_passed_events,
    forget_waiting,
    keep_batch_deletions,
    mark_resolved,
    move_position,
    park_events,
    record_change_deletions,
    record_drift,
    record_transaction_ends,
    watch_slot,
)
from tidemark.ledger.handoffs import (  # noqa: F401
    HandoffPosition,
    ResnapshotRequest,
    committed_handoff,
    group_members,
    group_streamed,
    record_group_streamed,
    record_handoff,
    record_sink_capture,
    record_snapshot_wal,
    register_group,
    request_resnapshot,
    resnapshot_asked,
    sealed_with_every_end,
    sink_capture,
    slot_made_after_handoff,
    snapshot_wal,
    stream_position,
)
from tidemark.ledger.lifecycle import (  # noqa: F401
    FINAL,
    MOVES,
    AttemptStatus,
    abort_unfinished,
    attempt_finished_at,
    attempt_state,
    attempt_status,
    batch_summary,
    extract_offsets,
    extract_totals,
    finished_attempts,
    lock_batch,
    open_attempt,
    record_extract,
    release_turn,
    seal_attempt,
    take_turn,
    transition,
)
from tidemark.ledger.reconciliations import (  # noqa: F401
    RESULT_COLUMNS,
    batch_overview,
    committed_batch,
    latest_reconciliation,
    left_out_before,
    reconciliation_evidence,
    reconciliation_results,
    reconciliation_runs,
    record_left_out,
    record_reconciliation,
    repair_batches,
)
from tidemark.ledger.schema import CONTROL_SCHEMA_LOCK, ensure_control_schema  # noqa: F401
from tidemark.ledger.sink_state import (  # noqa: F401
    MICRO_BATCHES_KEPT,
    LeaseHeld,
    acquire_fence,
    add_loads,
    add_staged,
    advance_event_times,
    advance_watermark,
    current_fence,
    data_rejects,
    end_lease,
    ends,
    forget_capture,
    forget_pipeline,
    forget_staged,
    mark_published,
    micro_batch_committed,
    open_formats,
    open_windows,
    pending_reject_summary,
    pending_rejects,
    record_end,
    record_micro_batch,
    record_rejects,
    staged,
    store_offset,
    stored_offsets,
)
from tidemark.ledger.streams import (  # noqa: F401
    STREAM_STATES,
    StreamState,
    beat,
    clear_crash_loop,
    heartbeat,
    mark_crash_looping,
    observe_stream,
    record_stream_event,
    restarts_since,
    set_desired,
    stream_state,
)
from tidemark.ledger.views import (  # noqa: F401
    ATTEMPT_COLUMNS,
    CONTROL_TABLES,
    attempts,
    batch_transport,
    control_schema_exists,
    every_attempt,
    last_committed,
    stream_tables_exist,
    watermark_row,
)

-- Tidemark's control schema, in the warehouse database so that data, offsets, watermarks and the
-- batch ledger commit in one transaction. Idempotent: applied before every plan and sink start.
CREATE SCHEMA IF NOT EXISTS tidemark_control;

-- Whose turn it is: one DAG run of a pipeline at a time goes from plan to commit (scheduled, manual,
-- backfill or repair alike; Airflow's max_active_runs does not count backfill runs with the others).
CREATE TABLE IF NOT EXISTS tidemark_control.pipeline_turns (
    pipeline    text PRIMARY KEY,
    run_id      text NOT NULL,                  -- the DAG run holding the turn
    taken_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Committed watermark per pipeline: everything up to and including `bound` is loaded.
CREATE TABLE IF NOT EXISTS tidemark_control.watermarks (
    pipeline    text PRIMARY KEY,
    bound       jsonb NOT NULL,                 -- {"cursor": ..., "pk": [...] | null}
    cursor_ts   timestamptz,                    -- the cursor, typed, for ordering
    cursor_id   bigint,
    batch_id    text NOT NULL,                  -- the batch that moved it last
    updated_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- The batch ledger: one row per batch (a window of one pipeline) ...
CREATE TABLE IF NOT EXISTS tidemark_control.batches (
    batch_id           text PRIMARY KEY,
    pipeline           text NOT NULL,
    run_id             text,
    window_lo          jsonb NOT NULL,
    window_hi          jsonb NOT NULL,
    backfill           boolean NOT NULL DEFAULT false,
    partitions         integer NOT NULL,
    state              text NOT NULL CHECK (state IN
                         ('planned', 'open', 'sealed', 'committed', 'refused', 'aborted')),
    attempt            integer NOT NULL DEFAULT 0,  -- the latest attempt
    committed_attempt  integer,
    rows               bigint,
    checksum           numeric,
    message            text,
    planned_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    committed_at       timestamptz,
    updated_at         timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS batches_pipeline ON tidemark_control.batches (pipeline, planned_at);

-- ... and one row per attempt. A newer attempt supersedes (fences) every older one.
CREATE TABLE IF NOT EXISTS tidemark_control.batch_attempts (
    batch_id        text NOT NULL REFERENCES tidemark_control.batches,
    attempt         integer NOT NULL,
    state           text NOT NULL CHECK (state IN
                      ('open', 'sealed', 'committed', 'refused', 'aborted', 'superseded')),
    extract_totals  jsonb,                      -- per partition, as the extract counted
    rows            bigint,
    checksum        numeric,
    message         text,
    begun_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    sealed_at       timestamptz,
    finished_at     timestamptz,
    PRIMARY KEY (batch_id, attempt)
);

-- END messages as the sink received them, one per partition.
CREATE TABLE IF NOT EXISTS tidemark_control.batch_ends (
    batch_id     text NOT NULL,
    attempt      integer NOT NULL,
    partition    integer NOT NULL,
    rows         bigint NOT NULL,
    checksum     numeric NOT NULL,
    kafka_offset bigint NOT NULL,
    received_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (batch_id, attempt, partition)
);

-- Records of open attempts wait in one table per attempt, tidemark_stage.s_<hash> (value text; typed
-- like the source under protocol version 2),
-- dropped once the attempt is applied, refused, aborted or superseded. Their running totals:
CREATE SCHEMA IF NOT EXISTS tidemark_stage;
CREATE TABLE IF NOT EXISTS tidemark_control.staged_totals (
    batch_id   text NOT NULL,
    attempt    integer NOT NULL,
    partition  integer NOT NULL,
    rows       bigint NOT NULL,
    checksum   numeric NOT NULL,               -- sum of xxhash64(key, value), as the extract hashed it
    PRIMARY KEY (batch_id, attempt, partition)
);
-- Protocol version 2: Spark tasks COPY records into the stage themselves, each task's rows tagged
-- with a load id (column "tidemark.load"). The sink's micro-batch transaction accepts a load with
-- its totals; the apply reads only accepted loads (a load whose micro-batch rolled back is never applied).
CREATE SEQUENCE IF NOT EXISTS tidemark_control.stage_loads;
CREATE TABLE IF NOT EXISTS tidemark_control.staged_loads (
    batch_id   text NOT NULL,
    attempt    integer NOT NULL,
    load       bigint NOT NULL,
    PRIMARY KEY (batch_id, attempt, load)
);

-- Sink fencing: each start takes the next token; only the holder of the latest may commit.
CREATE TABLE IF NOT EXISTS tidemark_control.sink_fences (
    consumer     text PRIMARY KEY,
    fence        bigint NOT NULL,
    holder       text,
    acquired_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Where each sink resumes: the database, not Spark's checkpoint, is the source of truth.
CREATE TABLE IF NOT EXISTS tidemark_control.sink_offsets (
    consumer     text NOT NULL,
    topic        text NOT NULL,
    partition    integer NOT NULL,
    next_offset  bigint NOT NULL,
    fence        bigint NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (consumer, topic, partition)
);

-- The micro-batches a sink committed under its fencing token (Spark's id for each): a micro-batch
-- Spark replays because it did not see its commit is skipped. Rows of older tokens are pruned.
CREATE TABLE IF NOT EXISTS tidemark_control.sink_micro_batches (
    consumer      text NOT NULL,
    fence         bigint NOT NULL,
    micro_batch   bigint NOT NULL,
    records       integer NOT NULL,       -- read and not already applied
    events        integer NOT NULL,       -- events inserted into the real-time table
    duplicates    integer NOT NULL,       -- redelivered events, already there unchanged
    rejected      integer NOT NULL,
    committed_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (consumer, fence, micro_batch)
);

-- Per events-topic partition, the newest event time applied: a stream is complete up to the
-- smallest of them (the watermark rule for a stream; a partition without events holds it back).
CREATE TABLE IF NOT EXISTS tidemark_control.stream_event_times (
    consumer    text NOT NULL,
    topic       text NOT NULL,
    partition   integer NOT NULL,
    event_time  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (consumer, topic, partition)
);

-- Records and control messages the sink could not use, with the reason (also sent to the DLQ).
CREATE TABLE IF NOT EXISTS tidemark_control.sink_rejects (
    id            bigserial PRIMARY KEY,
    consumer      text NOT NULL,
    topic         text NOT NULL,
    partition     integer NOT NULL,
    kafka_offset  bigint NOT NULL,
    batch_id      text,
    attempt       integer,
    reason        text NOT NULL,
    payload       text,
    rejected_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Id cursors: the largest id seen at each plan and when (read after it). An observation is final,
-- and may end a window, once no transaction that was open when it was taken is still open.
CREATE TABLE IF NOT EXISTS tidemark_control.id_observations (
    pipeline     text NOT NULL,
    observed_at  timestamptz NOT NULL,            -- the source's clock, read after max(id)
    max_id       bigint NOT NULL,
    PRIMARY KEY (pipeline, observed_at)
);

-- Streams (the speed layer): what a person wants of each pipeline's standing sink, and since when.
-- No row: the default (running). crash_looping_since is set by the supervisor past its restart
-- budget; only a person clears it.
CREATE TABLE IF NOT EXISTS tidemark_control.streams (
    pipeline             text PRIMARY KEY,
    desired              text NOT NULL DEFAULT 'running' CHECK (desired IN ('running', 'paused', 'stopped')),
    changed_by           text NOT NULL,
    changed_at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    reason               text,
    crash_looping_since  timestamptz,
    observed_lag         bigint,            -- the supervisor's last look: records behind in all
    observed_at          timestamptz
);

-- Everything done to a stream, by a person or the supervisor: desired-state changes, starts,
-- restarts (the restart budget counts these), stops, crash loops and their clearing. Append-only.
CREATE TABLE IF NOT EXISTS tidemark_control.stream_events (
    id        bigserial PRIMARY KEY,
    pipeline  text NOT NULL,
    at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    kind      text NOT NULL CHECK (kind IN ('desired', 'start', 'restart', 'stop', 'crash_loop', 'cleared')),
    actor     text NOT NULL,
    detail    text
);
CREATE INDEX IF NOT EXISTS stream_events_by_pipeline ON tidemark_control.stream_events (pipeline, at);

-- The running instance's heartbeat and progress, written under its fencing token: an instance
-- that lost the token cannot beat (it stops itself), so a live beat is always the current one's.
CREATE TABLE IF NOT EXISTS tidemark_control.stream_heartbeats (
    pipeline       text PRIMARY KEY,
    fence          bigint NOT NULL,
    holder         text NOT NULL,                  -- host:pid of the driver
    started_at     timestamptz NOT NULL,
    heartbeat_at   timestamptz NOT NULL,
    progress_at    timestamptz,                    -- the last micro-batch that read records
    micro_batches  bigint NOT NULL DEFAULT 0,
    records        bigint NOT NULL DEFAULT 0,      -- read since it started
    lag            jsonb,                          -- {"<partition>": records behind}
    offsets        jsonb,                          -- {"<partition>": next offset committed}
    batch_seconds  double precision,               -- the last micro-batch's duration
    ended_at       timestamptz                     -- it stopped (or was seen dead): its lease is free
);

-- Added after the first release (kept idempotent for existing control schemas).
-- since when the supervisor has seen the sink with records to read, without a break (a stall's clock starts there)
ALTER TABLE tidemark_control.streams ADD COLUMN IF NOT EXISTS lagging_since timestamptz;
ALTER TABLE tidemark_control.batch_ends ADD COLUMN IF NOT EXISTS batch_rows bigint;
-- The Kafka offsets the extract wrote, per partition {"p": [first, next)}: exactly its records.
ALTER TABLE tidemark_control.batch_attempts ADD COLUMN IF NOT EXISTS extract_offsets jsonb;
-- Columns a batch adds to its target: what the rows loaded before get in each {"column": text or null}.
ALTER TABLE tidemark_control.batches ADD COLUMN IF NOT EXISTS column_fills jsonb;
ALTER TABLE tidemark_control.sink_rejects ADD COLUMN IF NOT EXISTS control text;  -- BEGIN/END/ABORT; NULL: a data record
-- The dead-letter outbox (tidemark/sink/dead_letters.py): a reject is pending until it is in the DLQ;
-- older rows were sent before their commit, hence the default.
ALTER TABLE tidemark_control.sink_rejects ADD COLUMN IF NOT EXISTS in_dlq boolean NOT NULL DEFAULT true;
ALTER TABLE tidemark_control.sink_rejects ADD COLUMN IF NOT EXISTS dlq_offset bigint;
ALTER TABLE tidemark_control.sink_rejects ADD COLUMN IF NOT EXISTS raw bytea;      -- the record's bytes, until in the DLQ
ALTER TABLE tidemark_control.sink_rejects ADD COLUMN IF NOT EXISTS raw_key bytea;
CREATE INDEX IF NOT EXISTS sink_rejects_pending ON tidemark_control.sink_rejects (consumer, id) WHERE NOT in_dlq;

-- Reconciliation evidence (tidemark/reconcile.py): one row per check of every reconciliation run,
-- append-only. A trigger refuses UPDATE, DELETE and TRUNCATE whoever asks, and no role is granted
-- more than INSERT and SELECT; a repair run adds rows, it never edits the verdict before it.
CREATE TABLE IF NOT EXISTS tidemark_control.reconciliation_results (
    id                bigserial PRIMARY KEY,
    run_id            uuid NOT NULL,               -- one reconciliation run: all its checks
    pipeline          text NOT NULL,
    batch_id          text,                        -- NULL: a full-table reconciliation
    attempt           integer,
    scope             text NOT NULL CHECK (scope IN ('batch', 'full')),
    window_lo         jsonb,
    window_hi         jsonb,
    check_name        text NOT NULL,
    subject           text NOT NULL DEFAULT '',
    expected          text,
    actual            text,
    difference        text,
    verdict           text NOT NULL CHECK (verdict IN ('pass', 'fail')),
    tolerance         numeric NOT NULL DEFAULT 0,
    tolerance_reason  text,
    checked_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    code_version      text NOT NULL
);
-- The keys a batch's reconciliation left out (changed at the source past the window's end) that the batch did not
-- carry either (the target's version is at or before the window's start, or missing): one run's row per key. A key
-- in the rows of the reconciliations of reconcile.starved_after consecutive batches is a starved key (a finding).
CREATE TABLE IF NOT EXISTS tidemark_control.reconcile_left_out (
    run_id         uuid NOT NULL,
    pipeline       text NOT NULL,
    batch_id       text NOT NULL,
    first_key      text NOT NULL,                -- the key's first column, as text (what the comparison leaves out)
    source_cursor  text NOT NULL,                -- its newest cursor at the source then
    target_cursor  text,                         -- its newest in the target then (NULL: none)
    PRIMARY KEY (run_id, first_key)
);
CREATE INDEX IF NOT EXISTS reconcile_left_out_by_batch ON tidemark_control.reconcile_left_out (pipeline, batch_id);
CREATE INDEX IF NOT EXISTS reconciliation_results_by_batch
    ON tidemark_control.reconciliation_results (pipeline, batch_id, checked_at);
CREATE OR REPLACE FUNCTION tidemark_control.refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'tidemark_control.% is append-only evidence: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END $$;
DROP TRIGGER IF EXISTS reconciliation_results_append_only ON tidemark_control.reconciliation_results;
CREATE TRIGGER reconciliation_results_append_only
    BEFORE UPDATE OR DELETE OR TRUNCATE ON tidemark_control.reconciliation_results
    FOR EACH STATEMENT EXECUTE FUNCTION tidemark_control.refuse_change();
REVOKE UPDATE, DELETE, TRUNCATE ON tidemark_control.reconciliation_results FROM PUBLIC, CURRENT_USER;
ALTER TABLE tidemark_control.batches ADD COLUMN IF NOT EXISTS reconciliation text
    CHECK (reconciliation IN ('reconciled', 'reconciliation_failed'));
ALTER TABLE tidemark_control.batches ADD COLUMN IF NOT EXISTS reconciled_at timestamptz;
-- Repair batches (tidemark/batch/repair.py): a batch that re-loads only the keys a reconciliation found
-- differing. Its window reaches back to the pipeline's start (the keys' current source versions up
-- to the repaired window's end) and, like a backfill, never moves the watermark.
ALTER TABLE tidemark_control.batches ADD COLUMN IF NOT EXISTS repair_keys jsonb;  -- [[key values as text], ...]
ALTER TABLE tidemark_control.batches ADD COLUMN IF NOT EXISTS repair_of text;     -- the repaired batch; NULL: full table
ALTER TABLE tidemark_control.batches ADD COLUMN IF NOT EXISTS repair_run uuid;    -- the reconciliation that found them

-- Protocol version 2 (tidemark/protocol/avro.py): each pipeline's record schemas, one version per set of
-- source columns; a batch loads under the version its plan registered (NULL: version 1, JSON).
CREATE TABLE IF NOT EXISTS tidemark_control.record_schemas (
    pipeline       text NOT NULL,
    version        integer NOT NULL CHECK (version >= 1),
    columns        jsonb NOT NULL,               -- [[name, SQL type, not null], ...] as at the source
    writer_schema  text NOT NULL,                -- the Avro schema (JSON) the extract writes with
    registered_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (pipeline, version)
);
ALTER TABLE tidemark_control.batches ADD COLUMN IF NOT EXISTS schema_version integer;

-- Deletions are never silent (tidemark/reconcile.py, tidemark/batch/repair.py). A reconciliation tells a
-- row deleted at the source after a committed batch loaded it (kind deleted_at_source) from an
-- extra row no batch wrote. A repair batch's plan says what its apply may delete where the source
-- holds no version of a key: {"apply_source_deletes": bool, "extra": [[key text], ...],
-- "deleted_at_source": [[key text], ...]}; extra rows always, rows deleted at the source only when
-- the run set apply_source_deletes. NULL (planned before): every repair key, as before.
ALTER TABLE tidemark_control.batches ADD COLUMN IF NOT EXISTS repair_deletes jsonb;
-- Every target row a repair batch deleted without a staged replacement, with its old values,
-- written by the sink in the transaction that deletes it. Append-only, as reconciliation_results.
CREATE TABLE IF NOT EXISTS tidemark_control.repair_deletions (
    id            bigserial PRIMARY KEY,
    batch_id      text NOT NULL,                 -- the repair batch whose apply deleted the row
    pipeline      text NOT NULL,
    target_table  text NOT NULL,
    kind          text NOT NULL CHECK (kind IN ('deleted_at_source', 'extra', 'unclassified')),
    key           jsonb NOT NULL,                -- [key column values as text]
    old_values    jsonb NOT NULL,                -- the target row as it was before the delete
    deleted_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS repair_deletions_by_batch ON tidemark_control.repair_deletions (batch_id);
DROP TRIGGER IF EXISTS repair_deletions_append_only ON tidemark_control.repair_deletions;
CREATE TRIGGER repair_deletions_append_only
    BEFORE UPDATE OR DELETE OR TRUNCATE ON tidemark_control.repair_deletions
    FOR EACH STATEMENT EXECUTE FUNCTION tidemark_control.refuse_change();
REVOKE UPDATE, DELETE, TRUNCATE ON tidemark_control.repair_deletions FROM PUBLIC, CURRENT_USER;

-- Change data capture (tidemark/realtime/cdc/apply.py). Debezium's change events and its transaction
-- boundaries arrive on two topics, in any interleaving: a source transaction's events wait here,
-- committed with the sink's offsets, until its END has come and every one of its events with it;
-- then the transaction is applied whole, in commit order, in one warehouse transaction.
CREATE TABLE IF NOT EXISTS tidemark_control.cdc_pending (
    consumer     text NOT NULL,
    txid         bigint NOT NULL,                -- the source transaction (Debezium's source.txId)
    total_order  integer NOT NULL,               -- its events numbered 1..n
    lsn          bigint NOT NULL,                -- the event's own position in the source's WAL
    op           text NOT NULL CHECK (op IN ('c', 'u', 'd', 'r', 'x')),  -- x: cannot be applied (reason)
    row_values   jsonb NOT NULL,                 -- the row after (c, u, r) or before (d), as text; x: {reason}
    source_ms    bigint,                         -- when the source committed it
    topic        text NOT NULL,                  -- where it came from, for a dead letter
    partition    integer NOT NULL,
    "offset"     bigint NOT NULL,
    record_key   text,
    raw          text NOT NULL,
    PRIMARY KEY (consumer, txid, total_order)
);
-- The commit position streamed before the event's transaction (Debezium's source.sequence): once the applied
-- position is past it the transaction is done, and a change of it still waiting is a redelivery (dropped, counted).
ALTER TABLE tidemark_control.cdc_pending ADD COLUMN IF NOT EXISTS after_commit bigint;
CREATE TABLE IF NOT EXISTS tidemark_control.cdc_transactions (
    consumer     text NOT NULL,
    txid         bigint NOT NULL,
    commit_lsn   bigint NOT NULL,                -- from its END: the order transactions are applied in
    event_count  integer NOT NULL,
    PRIMARY KEY (consumer, txid)
);
-- END's events per table (schema.table -> count): a capture group's transaction applies whole across its tables
ALTER TABLE tidemark_control.cdc_transactions ADD COLUMN IF NOT EXISTS collections jsonb;
-- The source transactions a consumer resolved (applied, dead-lettered or skipped as redelivered) in the last
-- hour: a change event arriving alone after the stream passed its transaction is a redelivery only if its
-- transaction is here; otherwise its END never came (lost, or refused as forged) and it is a dead letter.
CREATE TABLE IF NOT EXISTS tidemark_control.cdc_resolved (
    consumer     text NOT NULL,
    txid         bigint NOT NULL,
    resolved_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (consumer, txid)
);
CREATE INDEX IF NOT EXISTS cdc_resolved_at ON tidemark_control.cdc_resolved (consumer, resolved_at);
-- The last source transaction applied, per consumer: one at or before it is a redelivery (a no-op).
CREATE TABLE IF NOT EXISTS tidemark_control.cdc_positions (
    consumer     text PRIMARY KEY,
    commit_lsn   bigint NOT NULL,
    txid         bigint NOT NULL,
    source_ms    bigint,                         -- when the source committed it
    applied_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- Every key a source DELETE removed from the serving view, with its old values: a deletion is a
-- finding, never silent. Append-only, as repair_deletions.
CREATE TABLE IF NOT EXISTS tidemark_control.cdc_deletions (
    id            bigserial PRIMARY KEY,
    pipeline      text NOT NULL,
    key           jsonb NOT NULL,                -- [key column values as text]
    old_values    jsonb NOT NULL,                -- the source row as the DELETE saw it
    txid          bigint NOT NULL,
    commit_lsn    bigint NOT NULL,
    deleted_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);
DROP TRIGGER IF EXISTS cdc_deletions_append_only ON tidemark_control.cdc_deletions;
CREATE TRIGGER cdc_deletions_append_only
    BEFORE UPDATE OR DELETE OR TRUNCATE ON tidemark_control.cdc_deletions
    FOR EACH STATEMENT EXECUTE FUNCTION tidemark_control.refuse_change();
REVOKE UPDATE, DELETE, TRUNCATE ON tidemark_control.cdc_deletions FROM PUBLIC, CURRENT_USER;

-- The supervisor's actions on a CDC pipeline's connector are stream events too (who, when, why), and so is
-- a person's request for a re-snapshot (tidemark_stream_control's resnapshot: the next batch is a new handoff).
ALTER TABLE tidemark_control.stream_events DROP CONSTRAINT IF EXISTS stream_events_kind_check;
ALTER TABLE tidemark_control.stream_events ADD CONSTRAINT stream_events_kind_check CHECK (kind IN (
    'desired', 'start', 'restart', 'stop', 'crash_loop', 'cleared',
    'connector_create', 'connector_update', 'connector_restart', 'connector_pause', 'connector_resume',
    'connector_stop', 'resnapshot'));
-- Since when a CDC pipeline's slot has had no reader (PostgreSQL 15 does not say): a connector whose
-- task looks RUNNING while Connect retries a failing poll forever is found by its unread slot.
CREATE TABLE IF NOT EXISTS tidemark_control.cdc_slot_watch (
    pipeline        text PRIMARY KEY,
    inactive_since  timestamptz
);
-- The handoff of a CDC pipeline (tidemark/realtime/cdc/handoff.py): its handoff batch reads the source in the
-- snapshot its replication slot exported, so the slot streams exactly the changes after that batch.
-- One row per extract attempt; the committed attempt's row is the pipeline's handoff position.
ALTER TABLE tidemark_control.batches ADD COLUMN IF NOT EXISTS handoff boolean NOT NULL DEFAULT false;
-- How the batch's records reach the warehouse (spec transport:): through the pipeline's topic, or
-- straight from the extract's tasks into the attempt's stage table (docs/control-protocol.md §15).
ALTER TABLE tidemark_control.batches ADD COLUMN IF NOT EXISTS transport text NOT NULL DEFAULT 'kafka'
    CHECK (transport IN ('kafka', 'direct'));
-- A scheduled batch of an upsert pipeline reads its snapshot's rows above its window's end as well
-- (docs/control-protocol.md §16: a row updated faster than the safe lag never starves); the watermark
-- still moves only to the window's end, and the next batch's upsert of those rows is idempotent.
ALTER TABLE tidemark_control.batches ADD COLUMN IF NOT EXISTS reads_above boolean NOT NULL DEFAULT false;
CREATE TABLE IF NOT EXISTS tidemark_control.cdc_handoffs (
    batch_id          text NOT NULL,
    attempt           integer NOT NULL,
    pipeline          text NOT NULL,
    slot              text NOT NULL,
    consistent_point  pg_lsn NOT NULL,            -- the slot streams the changes committed after it
    recorded_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (batch_id, attempt),
    FOREIGN KEY (batch_id, attempt) REFERENCES tidemark_control.batch_attempts
);
-- A capture group's member batch attempt: the source's WAL position just after its snapshot (every commit
-- it saw lies before it); it commits once the group's stream has applied past it (tidemark.realtime.cdc.groups).
ALTER TABLE tidemark_control.batch_attempts ADD COLUMN IF NOT EXISTS snapshot_wal pg_lsn;
-- Whether a handoff made its slot (a capture group's later members read in a snapshot after it): a member whose
-- committed handoff is older than the slot's making hands off again (the group's slot was lost and made again).
-- (rows from before the column: false, never 'made since'; every handoff recorded since says which it is)
ALTER TABLE tidemark_control.cdc_handoffs ADD COLUMN IF NOT EXISTS made_slot boolean NOT NULL DEFAULT false;
-- A capture group's members, as its lead's sink last saw them: its serving views show rows once every
-- member's handoff has committed (tidemark.realtime.cdc.tables).
CREATE TABLE IF NOT EXISTS tidemark_control.capture_groups (
    name        text PRIMARY KEY,
    members     text[] NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- The members whose tables the group's connector captures (set by the supervisor once it runs with them;
-- NULL: never started): a member added later hands off only once its table is in the stream.
ALTER TABLE tidemark_control.capture_groups ADD COLUMN IF NOT EXISTS streamed text[];
-- The capture a group member's sink started with, under its fencing token: the supervisor restarts a sink
-- started for an older membership (it would read the wrong change topics).
CREATE TABLE IF NOT EXISTS tidemark_control.sink_captures (
    pipeline   text PRIMARY KEY,
    fence      bigint NOT NULL,
    signature  text NOT NULL,
    at         timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- The nightly batch corrects the speed layer of a CDC pipeline (tidemark/realtime/cdc/compact.py), in its commit:
-- a deletion the change stream learned reaches the batch target, each row it deletes kept here
-- (append-only); a real-time version the batch holds with other values at the same cursor is drift.
CREATE TABLE IF NOT EXISTS tidemark_control.cdc_batch_deletions (
    id            bigserial PRIMARY KEY,
    pipeline      text NOT NULL,
    batch_id      text NOT NULL,                 -- the batch whose commit applied it
    key           jsonb NOT NULL,                -- [key column values as text]
    old_values    jsonb NOT NULL,                -- the batch target's row it deleted
    commit_lsn    bigint NOT NULL,               -- the source transaction that deleted it
    deleted_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS tidemark_control.cdc_drift (
    id            bigserial PRIMARY KEY,
    pipeline      text NOT NULL,
    batch_id      text NOT NULL,
    key           jsonb NOT NULL,
    realtime      jsonb NOT NULL,                -- the speed layer's version
    batch         jsonb NOT NULL,                -- the nightly truth at the same cursor
    found_at      timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS cdc_drift_batch ON tidemark_control.cdc_drift (batch_id);
DROP TRIGGER IF EXISTS cdc_batch_deletions_append_only ON tidemark_control.cdc_batch_deletions;
CREATE TRIGGER cdc_batch_deletions_append_only
    BEFORE UPDATE OR DELETE OR TRUNCATE ON tidemark_control.cdc_batch_deletions
    FOR EACH STATEMENT EXECUTE FUNCTION tidemark_control.refuse_change();
REVOKE UPDATE, DELETE, TRUNCATE ON tidemark_control.cdc_batch_deletions FROM PUBLIC, CURRENT_USER;
DROP TRIGGER IF EXISTS cdc_drift_append_only ON tidemark_control.cdc_drift;
CREATE TRIGGER cdc_drift_append_only
    BEFORE UPDATE OR DELETE OR TRUNCATE ON tidemark_control.cdc_drift
    FOR EACH STATEMENT EXECUTE FUNCTION tidemark_control.refuse_change();
REVOKE UPDATE, DELETE, TRUNCATE ON tidemark_control.cdc_drift FROM PUBLIC, CURRENT_USER;

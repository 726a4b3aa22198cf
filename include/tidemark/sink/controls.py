"""What the ledger says of a control message that decoded and carries a good signature: whether its
batch was planned so (window, versions, attempt), whether an END carries what the orchestrator
sealed, and why a copy of a committed attempt's message is a dead letter. Each returns the reason
to dead-letter it, or None."""

from __future__ import annotations

from tidemark import ledger
from tidemark.protocol.control import ControlMessage
from tidemark.protocol.spec import PipelineSpec


def unplanned(cur, spec: PipelineSpec, msg: ControlMessage) -> str | None:
    """Why the ledger does not confirm this control message's batch and window (None: it does)."""
    planned = ledger.planned_batch(cur, msg.batch_id)
    if planned is None:
        return f"{msg.kind} for batch {msg.batch_id}, which was never planned (no ledger row)"
    if planned.pipeline != spec.name:
        return f"{msg.kind} for batch {msg.batch_id}, which the ledger plans for pipeline {planned.pipeline}"
    if msg.parsed_window != planned.window:
        return (f"{msg.kind} for batch {msg.batch_id} carries window {msg.parsed_window}, the ledger planned "
                f"{planned.window}")
    if (msg.version, msg.schema_version) != ((2, planned.schema_version) if planned.schema_version else (1, 1)):
        return (f"{msg.kind} for batch {msg.batch_id} says protocol version {msg.version} schema version "
                f"{msg.schema_version}, the ledger planned "
                + (f"version 2 schema version {planned.schema_version}" if planned.schema_version else "version 1"))
    if msg.attempt > planned.latest_attempt:
        return (f"{msg.kind} for batch {msg.batch_id} attempt {msg.attempt}, which the orchestrator never opened "
                f"(latest attempt {planned.latest_attempt})")
    return None


def replayed(cur, msg: ControlMessage) -> str:
    """Why a signed BEGIN or END of a committed attempt is a dead letter: its batch is in, this is
    a copy (a replay by another producer, or an END step that sent twice), and it changes nothing."""
    committed = ledger.attempt_finished_at(cur, msg.batch_id, msg.attempt)
    return (f"{msg.describe()} arrived after its attempt committed at {committed:%Y-%m-%dT%H:%M:%S%z}: a copy "
            "(replayed, or sent twice by a retried END step); nothing applied, nothing changed")


def unsealed(cur, msg: ControlMessage, state: str) -> str | None:
    """Why this END is not the orchestrator's (None: it is). The orchestrator seals an attempt in
    the ledger with the extract's totals before it sends END, so an END that finds the attempt
    still open, or carries other totals than the ledger's, came from some other producer."""
    assert msg.totals is not None
    head = f"END for batch {msg.batch_id} attempt {msg.attempt} partition {msg.partition}"
    if state != "sealed":
        return (f"{head} arrived while the ledger shows the attempt {state} (the orchestrator seals an attempt "
                "with the extract's totals before it sends END): not sent by the orchestrator")
    sealed = ledger.extract_totals(cur, msg.batch_id, msg.attempt)
    mine = sealed.get(msg.partition)
    if mine is None or (mine.rows, mine.checksum) != (msg.totals.rows, msg.totals.checksum):
        return (f"{head} says rows={msg.totals.rows} checksum={msg.totals.checksum}, the ledger sealed rows="
                f"{mine.rows if mine else '-'} checksum={mine.checksum if mine else '-'} for it: not the "
                "orchestrator's totals")
    total = sum(t.rows for t in sealed.values())
    if msg.batch_rows is not None and msg.batch_rows != total:
        return f"{head} claims batch_rows={msg.batch_rows}, the ledger sealed {total} rows for the attempt"
    return None

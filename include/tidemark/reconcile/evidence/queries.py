"""One batch's evidence, from the warehouse (DB-API queries over ``tidemark.ledger``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tidemark import ledger
from tidemark.reconcile.evidence.reports import count_differing, differing_rows
from tidemark.reconcile.evidence.verdicts import (
    DifferingRow,
    Finding,
    RepairBatch,
    Run,
    VerdictLine,
    findings,
    repairs_from_rows,
    runs_from_results,
    verdict_line,
)


@dataclass(frozen=True)
class BatchEvidence:
    pipeline: str
    batch_id: str | None  # None: the full-table reconciliations
    runs: list[Run]  # oldest first
    repairs: list[RepairBatch]
    findings: list[Finding]
    verdict: VerdictLine
    rows: list[DifferingRow]  # of the newest failing run
    rows_from: str  # where those rows come from
    batch: dict[str, Any] | None = None  # ledger.batch_overview
    repair_batch: str | None = None  # the page was asked for this repair batch: its repaired batch's evidence
    recent: list[dict[str, Any]] = field(default_factory=list)  # the pipeline's newest runs (ledger.reconciliation_runs)

    @property
    def latest(self) -> Run | None:
        return self.runs[-1] if self.runs else None

    @property
    def failing(self) -> Run | None:
        """The newest run that failed: whose differing rows the page lists."""
        return next((r for r in reversed(self.runs) if not r.passed), None)


class NotFound(LookupError):
    """No such batch of that pipeline in the ledger."""


def batch_evidence(cur, root: Path | None, pipeline: str, batch_id: str | None, *, runs: int = 50,
                   recent: int = 20) -> BatchEvidence:
    """Everything the evidence page shows of a batch (``batch_id`` None: the full-table runs). A
    repair batch's page is its repaired batch's (the reconciliation after a repair is recorded there)."""
    overview, asked_repair = None, None
    if batch_id is not None:
        overview = ledger.batch_overview(cur, batch_id)
        if overview is None or overview["pipeline"] != pipeline:
            raise NotFound(f"pipeline {pipeline} has no batch {batch_id} in the ledger")
        if overview["is_repair"]:
            asked_repair, batch_id = batch_id, overview["repair_of"]
            overview = ledger.batch_overview(cur, batch_id) if batch_id is not None else None
    if overview is not None:
        overview = {**overview, "window": str(overview["window"])}
    subject = [(pipeline, batch_id)]
    found_runs = runs_from_results(ledger.reconciliation_evidence(cur, subject, runs=runs))
    repairs = repairs_from_rows(ledger.repair_batches(cur, subject))
    found = findings(found_runs, repairs, count_differing(root, repairs))
    failing = next((r for r in reversed(found_runs) if not r.passed), None)
    rows, rows_from = differing_rows(root, failing, repairs) if failing is not None else ([], "")
    return BatchEvidence(pipeline, batch_id, found_runs, repairs, found, verdict_line(found_runs, found), rows,
                         rows_from, overview, asked_repair, ledger.reconciliation_runs(cur, pipeline, limit=recent))


def verdict_lines(cur, root: Path | None, batches: dict[str, str]) -> dict[str, VerdictLine]:
    """{pipeline: its batch's verdict line} for ``batches`` ({pipeline: batch id}), in two queries."""
    subjects = list(batches.items())
    results = ledger.reconciliation_evidence(cur, subjects, runs=20)
    repairs = repairs_from_rows(ledger.repair_batches(cur, subjects))
    out = {}
    for pipeline, batch_id in subjects:
        runs = runs_from_results(r for r in results if r["pipeline"] == pipeline and r["batch_id"] == batch_id)
        mine = [r for r in repairs if r.repair_of == batch_id]
        out[pipeline] = verdict_line(runs, findings(runs, mine, count_differing(root, mine)))
    return out

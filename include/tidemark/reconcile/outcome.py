"""One reconciliation run: the verdict, its evidence in the ledger, and its report beside the Data Docs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidemark.protocol.spec import PipelineSpec
from tidemark.protocol.window import Window
from tidemark.reconcile.checks import ReconcileError, freshness, speed_layer_findings, starved_keys
from tidemark.reconcile.compare import reconcile
from tidemark.reconcile.localise import differences_csv
from tidemark.reconcile.verdict import DELETED_AT_SOURCE, Check, Verdict


@dataclass
class Outcome:
    run_id: str
    batch_id: str | None  # None: a full-table reconciliation
    window: Window
    verdict: Verdict
    line: str  # one line for the log: the verdict, and where the report is
    report: Path | None = None  # the HTML report (the CSV beside it), when rows differ
    data_docs: Path | None = None  # Great Expectations' Data Docs index
    after_repair: str | None = None  # the repair batch whose load set this run off


def run(spec: PipelineSpec, source_conn, warehouse_conn, root: Path, *, batch_id: str | None = None,
        warehouse_url: str | None = None, code_version: str = "unknown", invariants_conn=None,
        **options: Any) -> Outcome:
    """Reconcile one committed batch (``batch_id``) or, without one, the whole table up to the
    committed watermark; with ``warehouse_url`` (SQLAlchemy), run the declarative checks through
    Great Expectations and render Data Docs under ``root``; record every check in the evidence
    table and the batch's verdict on the ledger; write a CSV and HTML report of the differing rows
    under ``root/reports``. With ``invariants_conn`` (a second warehouse connection) the target's
    accounting invariants run beside the two passes."""
    import uuid

    from tidemark import ledger
    from tidemark.protocol.window import Bound

    after_repair, deleted = None, []
    with warehouse_conn, warehouse_conn.cursor() as cur:
        mark = ledger.committed_watermark(cur, spec.name)
        repaired = ledger.repair(cur, batch_id) if batch_id is not None else None
        if repaired is not None:  # a repair batch: reconcile what it repaired (a batch, or the whole table)
            after_repair, batch_id = batch_id, repaired.repair_of
            deleted = [d for d in ledger.repair_deletions(cur, after_repair) if d.kind == DELETED_AT_SOURCE]
        read_above = False
        if batch_id is not None:
            pipeline, window, attempt = ledger.committed_batch(cur, batch_id)
            if pipeline != spec.name:
                raise ReconcileError(f"batch {batch_id} belongs to pipeline {pipeline}, not {spec.name}")
            read_above = ledger.planned_batch(cur, batch_id).records_window != window
        else:
            if mark is None:
                raise ReconcileError(f"pipeline {spec.name} has no committed batch yet: nothing to reconcile")
            window, attempt = Window(Bound(spec.start), mark), None
    try:
        with source_conn, source_conn.cursor() as s, warehouse_conn, warehouse_conn.cursor() as t:
            s.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")  # one snapshot per side
            t.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            if invariants_conn is None:
                verdict = reconcile(spec, window, s, t, read_above=read_above, **options)
            else:
                with invariants_conn, invariants_conn.cursor() as i:
                    verdict = reconcile(spec, window, s, t, invariants_cur=i, read_above=read_above, **options)
            fresh = freshness(spec, s, mark.cursor if mark is not None else None)
            if fresh is not None:
                verdict.checks.append(fresh)
            if spec.cdc is not None and batch_id is not None:
                verdict.checks += speed_layer_findings(t, spec, batch_id)
    except LookupError as exc:
        raise ReconcileError(str(exc)) from None
    if batch_id is not None and verdict.left_out:  # a key no window of the last batches held: a finding
        with warehouse_conn, warehouse_conn.cursor() as cur:
            before = ledger.left_out_before(cur, spec.name, batch_id, spec.reconcile.starved_after - 1)
        if before:
            verdict.checks += starved_keys(spec, verdict.left_out, before, spec.reconcile.starved_after)
    verdict.deletions_applied = [
        Check("source_deletion_applied", f"key {_joined(d.key)}, deleted by repair batch {after_repair}",
              "no row at the source", json.dumps(d.old_values, default=str), None, True) for d in deleted]
    run_id = str(uuid.uuid4())
    docs = None
    if warehouse_url is not None:
        from tidemark.reconcile import expectations

        failed = [f"{c.check}{f' {c.subject}' if c.subject else ''}: expected {c.expected}, found {c.actual}"
                  for c in verdict.checks if not c.passed]
        expected, docs = expectations.validate(spec, verdict.where, verdict.rows_source, root, warehouse_url,
                                               run_id, failed)
        verdict.checks += [Check(e.check, e.subject, e.expected, e.actual, e.difference, e.passed) for e in expected]
    subject = f"batch {batch_id}" if batch_id else f"up to the watermark {window.hi}"
    line = verdict.summary(spec, batch_id or "(full table)")
    if after_repair is not None:
        line += f" (after repair batch {after_repair})"
    report = None
    if verdict.differences:
        report = write_report(root / "reports" / spec.name / run_id, spec, subject, verdict)
        line += f"; report: {report}"
    if docs is not None:
        line += f"; Data Docs: {docs}"
    with warehouse_conn, warehouse_conn.cursor() as cur:
        if batch_id is not None:
            ledger.record_left_out(cur, run_id, spec.name, batch_id, verdict.left_out)
        ledger.record_reconciliation(cur, run_id=run_id, pipeline=spec.name, batch_id=batch_id, attempt=attempt,
                                     window=window, checks=verdict.checks + verdict.deletions_applied,
                                     tolerance=spec.reconcile.tolerance,
                                     tolerance_reason=spec.reconcile.tolerance_reason, code_version=code_version,
                                     repair_batch=after_repair)
    return Outcome(run_id, batch_id, window, verdict, line, report, docs, after_repair)


def _joined(key: list[str]) -> str:
    return key[0] if len(key) == 1 else f"({', '.join(key)})"


def write_report(folder: Path, spec: PipelineSpec, subject: str, verdict: Verdict) -> Path:
    """differences.csv and differences.html in ``folder``; returns the HTML's path."""
    import html

    folder.mkdir(parents=True, exist_ok=True)
    first = verdict.differences[0]
    columns = list((first.source or first.target or {}).keys())  # every row has the compared columns
    (folder / "differences.csv").write_text(differences_csv(verdict.differences, columns))
    cells = []
    for d in verdict.differences:
        for side, row in (("source", d.source), ("target", d.target)):
            if row is None:
                continue
            tds = "".join(f'<td class="{"differs" if c in d.columns else ""}">{html.escape(str(row.get(c)))}</td>'
                          for c in columns)
            kind = d.kind if d.loaded_by is None else f"{d.kind} (loaded by batch {html.escape(d.loaded_by)})"
            cells.append(f"<tr><td>{html.escape(' '.join(map(str, d.key)))}</td><td>{kind}</td><td>{side}</td>{tds}</tr>")
    failed = "".join(f"<tr><td>{html.escape(c.check)}</td><td>{html.escape(c.subject)}</td>"
                     f"<td>{html.escape(str(c.expected))}</td><td>{html.escape(str(c.actual))}</td>"
                     f"<td>{html.escape(str(c.difference))}</td></tr>" for c in verdict.checks if not c.passed)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    gone = verdict.deleted_at_source
    deletions = (f"""<p><b>{len(gone)} rows deleted at the source after a committed batch loaded them</b> (kind
deleted_at_source; their old values are the target rows below). A repair deletes them from the target only when its
run sets apply_source_deletes, and keeps each one in tidemark_control.repair_deletions; otherwise they stay and
every reconciliation reports them.</p>""" if gone else "")
    (folder / "differences.html").write_text(f"""<!doctype html><meta charset="utf-8">
<title>Tidemark reconciliation: {html.escape(spec.name)}</title>
<style>body{{font-family:sans-serif}} td,th{{border:1px solid #ccc;padding:2px 6px}} .differs{{background:#fdd}}</style>
<h1>{html.escape(spec.target_table)}: {html.escape(subject)}</h1>
<p>{len(verdict.differences)} rows differ ({verdict.rows_source} source rows, {verdict.rows_target} target rows;
{verdict.rows_read_localising} rows read to localise them). CSV: differences.csv</p>{deletions}
<h2>Failed checks</h2><table><tr><th>check</th><th>subject</th><th>expected (source)</th><th>actual (target)</th>
<th>difference</th></tr>{failed}</table>
<h2>Rows</h2><table><tr><th>key</th><th>kind</th><th>side</th>{head}</tr>{''.join(cells)}</table>
""")
    return folder / "differences.html"

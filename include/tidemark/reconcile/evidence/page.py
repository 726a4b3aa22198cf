"""The evidence page and the status page's verdict links, as HTML: every value escaped."""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from tidemark.reconcile.evidence.queries import BatchEvidence
from tidemark.reconcile.evidence.reports import key_text, report_folder
from tidemark.reconcile.evidence.verdicts import (
    FULL,
    DifferingRow,
    RepairBatch,
    Result,
    Run,
    VerdictLine,
    plural,
    verdict_word,
    when,
)


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def batch_path(pipeline: str, batch_id: str | None) -> str:
    """The evidence page of a batch, under the evidence route: ``<pipeline>/<batch id, quoted>``."""
    return f"{quote(pipeline, safe='')}/{quote(batch_id, safe='') if batch_id is not None else FULL}"


def verdict_link(href: str, line: VerdictLine | None, ledger_word: str | None) -> str:
    """The status page's verdict cell: the verdict with its history, linked to the evidence page.
    Without a line (the evidence could not be read), the ledger's one word."""
    if line is None:
        text = ledger_word or "not reconciled yet"
        css = "bad" if ledger_word == "reconciliation_failed" else "ok" if ledger_word else ""
    else:
        text, css = line.text, {"differences": "bad", "nothing": "warn", "reconciled": "ok"}.get(line.state, "")
    return f"<small class='{css}'><a class=evidence href='{_e(href)}'>{_e(text)}</a></small>"


STYLE = """
body{font-family:system-ui,sans-serif;font-size:14px;margin:1em;color:#222}
table{border-collapse:collapse;margin-bottom:1em}th,td{border:1px solid #ccc;padding:4px 6px;vertical-align:top;text-align:left}
th{background:#f3f3f3}td.num{text-align:right}.bad{color:#b00020}.warn{color:#a05a00}.ok{color:#1b5e20}small{color:#666}
tr.fail td{background:#fff4f4}td.differs{background:#fdd;font-weight:600}p.verdict{font-size:16px}
code{font-size:12px}.msg{color:#555;font-size:12px}
"""


def _page(title: str, body: str) -> str:
    return (f"<!doctype html><html><head><meta charset=utf-8><title>{_e(title)}</title><style>{STYLE}</style>"
            f"</head><body>{body}</body></html>")


def _results_table(results: list[Result], table_id: str) -> str:
    rows = []
    for r in results:
        tolerance = f"{_e(r.tolerance)}<br><small>{_e(r.tolerance_reason)}</small>" if r.tolerance else ""
        rows.append(f"<tr class={'pass' if r.passed else 'fail'}><td>{_e(r.check)}</td><td>{_e(r.subject)}</td>"
                    f"<td>{_e(r.expected)}</td><td>{_e(r.actual)}</td><td>{_e(r.difference)}</td>"
                    f"<td class={'ok' if r.passed else 'bad'}>{'pass' if r.passed else 'FAIL'}</td><td>{tolerance}</td></tr>")
    return (f"<table id={table_id}><tr><th>check</th><th>subject</th><th>expected (source)</th><th>actual (target)</th>"
            f"<th>difference</th><th>result</th><th>tolerance</th></tr>{''.join(rows)}</table>")


def _rows_table(rows: list[DifferingRow]) -> str:
    columns = list(dict.fromkeys(c for r in rows for side in (r.source, r.target) if side for c in side))
    head = "".join(f"<th>{_e(c)}</th>" for c in columns)
    cells = []
    for r in rows:
        sides = [(s, v) for s, v in (("source", r.source), ("target", r.target)) if v is not None] or [("", None)]
        for side, values in sides:
            tds = "".join(f"<td class={'differs' if c in r.columns else ''}>{_e((values or {}).get(c))}</td>"
                          for c in columns)
            cells.append(f"<tr><td><b>{_e(r.key)}</b></td><td>{_e(r.kind.replace('_', ' '))}</td>"
                         f"<td>{_e(' '.join(r.columns))}</td><td>{_e(side)}</td>{tds}</tr>")
    return (f"<table id=rows><tr><th>key</th><th>kind</th><th>differing columns</th><th>side</th>{head}</tr>"
            f"{''.join(cells)}</table>")


@dataclass(frozen=True)
class Links:
    """Where the evidence page's links go (each a URL path; the plugin knows its mount point)."""

    status: str  # the status page
    evidence: str  # the evidence route: <evidence>/<pipeline>/<batch>
    reports: str  # <reports>/<pipeline>/<run id>/differences.csv
    docs: str  # the Data Docs site's root
    docs_page: Callable[[str], str | None] = lambda run_id: None  # a run's Data Docs page under ``docs``, if any


def _run_links(ev: BatchEvidence, run: Run, links: Links, root: Path | None) -> str:
    parts = []
    if root is not None and (report_folder(root, ev.pipeline, run.run_id) / "differences.csv").exists():
        base = f"{links.reports}/{quote(ev.pipeline, safe='')}/{run.run_id}"
        parts.append(f"<a href='{_e(base)}/differences.csv'>differences.csv</a>")
        parts.append(f"<a href='{_e(base)}/differences.html'>report</a>")
    page = links.docs_page(run.run_id)
    if page:
        parts.append(f"<a href='{_e(links.docs)}/{_e(quote(page))}'>Data Docs</a>")
    return " ".join(parts)


def render_batch(ev: BatchEvidence, links: Links, root: Path | None = None) -> str:
    """The evidence page of one batch (or of the full-table runs)."""
    subject = f"batch {ev.batch_id}" if ev.batch_id else "the whole table (full reconciliations)"
    title = f"Tidemark evidence: {ev.pipeline} {subject}"
    parts = [f"<p><small><a href='{_e(links.status)}'>Tidemark status</a> &gt; evidence &gt; {_e(ev.pipeline)}"
             f"</small></p><h2>{_e(ev.pipeline)}: {_e(subject)}</h2>"]
    if ev.repair_batch:
        parts.append(f"<p>{_e(ev.repair_batch)} is a repair batch: its reconciliation is recorded on the batch it "
                     "repaired, shown here.</p>")
    b = ev.batch
    if b is not None:
        parts.append(f"<p>window {_e(b['window'])}, {_e(b['rows'])} rows, {_e(b['state'])} at "
                     f"{_e(when(b['committed_at']))}</p>")
    css = {"differences": "bad", "nothing": "warn", "reconciled": "ok"}.get(ev.verdict.state, "")
    parts.append(f"<p class='verdict {css}' id=verdict><b>{_e(ev.verdict.text)}</b></p>")
    latest = ev.latest
    if latest is not None:
        source, target = latest.rows
        compared = (f"{_e(source)} source rows, {_e(target)} target rows compared" if source is not None
                    else "rows compared: not recorded")
        docs = links.docs_page(latest.run_id)
        docs_link = (f"<a href='{_e(links.docs)}/{_e(quote(docs))}'>this run's Data Docs</a>" if docs
                     else "Data Docs: no page for this run")
        parts.append(f"<h3>Latest verdict: {_e(verdict_word(latest))}</h3><p>run <code>{_e(latest.run_id)}</code> at "
                     f"{_e(when(latest.checked_at))}, window {_e(latest.window)}, {compared}, code "
                     f"{_e(latest.code_version)}. {docs_link} (<a href='{_e(links.docs)}/index.html'>all Data Docs"
                     f"</a>)</p>" + _results_table(latest.results, "checks"))
    failing = ev.failing
    if failing is not None:
        resolved = "" if failing is latest else " (a later run passed: kept as evidence)"
        if failing is not latest:
            parts.append(f"<h3>Checks that failed at {_e(when(failing.checked_at))}{resolved}</h3>"
                         + _results_table(failing.failed, "failed"))
        count = f"{len(ev.rows)} row(s), from {ev.rows_from}" if ev.rows else ev.rows_from
        parts.append(f"<h3>Differing rows found at {_e(when(failing.checked_at))}{resolved}</h3>"
                     f"<p><small>{_e(count)}</small></p>" + (_rows_table(ev.rows) if ev.rows else ""))
    if ev.runs:
        parts.append("<h3>History of this batch's reconciliations</h3>" + _history_table(ev, links, root))
    else:
        parts.append("<p>No reconciliation run of this batch yet: the DAG "
                     f"<code>tidemark_reconcile_{_e(ev.pipeline)}</code> records one after each load.</p>")
    if ev.repairs:
        parts.append("<h3>Repair batches</h3>" + _repairs_table(ev.repairs))
    if ev.recent:
        parts.append(f"<h3>Newest reconciliations of {_e(ev.pipeline)}</h3>" + _recent_table(ev, links))
    parts.append("<p><small>All times UTC. Every check of every run is kept, append-only, in "
                 "<code>tidemark_control.reconciliation_results</code>.</small></p>")
    return _page(title, "".join(parts))


def _history_table(ev: BatchEvidence, links: Links, root: Path | None) -> str:
    rows = []
    for run in reversed(ev.runs):
        planned = [r for r in ev.repairs if r.found_by == run.run_id]
        after = "; ".join(f"repair batch {r.batch_id} ({plural(len(r.keys), 'key')}): {r.state}"
                          + (f" at {when(r.committed_at)}" if r.committed_at else "") for r in planned)
        source, target = run.rows
        css = "ok" if run.passed and not run.compared_nothing else "warn" if run.passed else "bad"
        rows.append(f"<tr class={'pass' if run.passed else 'fail'}><td>{_e(when(run.checked_at))}</td>"
                    f"<td><code>{_e(run.run_id)}</code></td><td class={css}>{_e(verdict_word(run))}</td>"
                    f"<td class=num>{_e(source)}</td><td class=num>{_e(target)}</td><td>{_e(after)}</td>"
                    f"<td>{_run_links(ev, run, links, root)}</td></tr>")
    return ("<table id=history><tr><th>checked at</th><th>run</th><th>verdict</th><th>source rows</th>"
            "<th>target rows</th><th>repair planned from it</th><th>report</th></tr>" + "".join(rows) + "</table>")


def _repairs_table(repairs: list[RepairBatch]) -> str:
    rows = "".join(f"<tr><td>{_e(r.batch_id)}</td><td><code>{_e(r.found_by)}</code></td><td class=num>{len(r.keys)}</td>"
                   f"<td>{_e(', '.join(key_text(k) for k in r.keys[:10]))}{' ...' if len(r.keys) > 10 else ''}</td>"
                   f"<td>{_e(r.state)}</td><td>{_e(when(r.planned_at))}</td><td>{_e(when(r.committed_at))}</td></tr>"
                   for r in repairs)
    return ("<table id=repairs><tr><th>repair batch</th><th>found by run</th><th>keys</th><th>first keys</th>"
            "<th>state</th><th>planned at</th><th>committed at</th></tr>" + rows + "</table>")


def _recent_table(ev: BatchEvidence, links: Links) -> str:
    rows = []
    for r in ev.recent:
        target = f"{links.evidence}/{batch_path(ev.pipeline, r['batch_id'])}"
        label = r["batch_id"] or "whole table"
        nothing = r["failed"] == 0 and r["rows_source"] == "0" and r["rows_target"] == "0"
        word = ("nothing to compare yet" if nothing else "reconciled" if r["failed"] == 0
                else f"{r['failed']} of {r['checks']} checks failed")
        css = "warn" if nothing else "ok" if r["failed"] == 0 else "bad"
        rows.append(f"<tr><td>{_e(when(r['checked_at']))}</td><td><a href='{_e(target)}'>{_e(label)}</a></td>"
                    f"<td class={css}>{_e(word)}</td><td><code>{_e(r['run_id'])}</code></td></tr>")
    return ("<table id=recent><tr><th>checked at</th><th>batch</th><th>verdict</th><th>run</th></tr>"
            + "".join(rows) + "</table>")


def render_message(title: str, message: str, status_href: str) -> str:
    """A page that says why there is no evidence to show (no such batch, the warehouse down)."""
    return _page(title, f"<p><small><a href='{_e(status_href)}'>Tidemark status</a></small></p><h2>{_e(title)}</h2>"
                        f"<p class=bad>{_e(message)}</p>")

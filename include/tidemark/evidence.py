"""Reconciliation evidence for a person: a batch's verdicts, their checks, the differing rows, the history.

What a batch's reconciliation runs found comes from the control schema: every check of every run in
``tidemark_control.reconciliation_results`` (append-only), and the repair batches planned from a
run in ``tidemark_control.batches`` (the keys, which run found them, when the repair committed).
Both versions of each differing row are only in the report a run writes beside Great Expectations'
Data Docs (``<reconcile dir>/reports/<pipeline>/<run id>/differences.csv``, ``tidemark.reconcile.run``):
the keys are taken from the ledger (repair keys, one ``deleted_at_source`` result per row) where it
holds them, and the report adds the values; without the file the page says so.

A run that found differences stays a *finding* until a later run of the same batch passes, and then
stays in the batch's history ("found 1 difference at ...; repaired and reconciled at ..."), also when
a repair run's own task ended green. A verdict over 0 compared rows is "nothing to compare yet".

Data Docs load jQuery, Bootstrap, bootstrap-table and Font Awesome from CDNs: offline, the index
page (its tables are drawn by bootstrap-table) is blank. ``offline_html`` swaps those references
for two small local files (``ASSETS``) that do what the pages need of them; ``offline_site``
writes them into a Data Docs site for pages opened from disk, the evidence page serves them.

Pure functions and DB-API queries (``tidemark.ledger``): no Airflow import.
"""

from __future__ import annotations

import csv
import html
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from tidemark import ledger
from tidemark.window import Bound, Window

FULL = "full"  # the URL segment of a pipeline's full-table reconciliations (a batch id always holds a ':')
MAX_REPORT_ROWS = 1000  # differing rows read from a report (reconcile.run localises 1,000 at most)
REPORT_FILES = ("differences.csv", "differences.html")
RUN_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


# --- what a batch's reconciliations found ----------------------------------------------------

@dataclass(frozen=True)
class Result:
    """One check of one run, as the evidence table keeps it."""

    check: str
    subject: str
    expected: str | None
    actual: str | None
    difference: str | None
    passed: bool
    tolerance: str | None = None
    tolerance_reason: str | None = None


@dataclass(frozen=True)
class Run:
    """One reconciliation run: every check it recorded."""

    run_id: str
    pipeline: str
    batch_id: str | None  # None: the whole table up to the watermark
    scope: str
    attempt: int | None
    window: str | None
    checked_at: datetime
    code_version: str
    results: list[Result] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def failed(self) -> list[Result]:
        return [r for r in self.results if not r.passed]

    @property
    def rows(self) -> tuple[int | None, int | None]:
        """(source, target) rows compared: the row_count check's figures."""
        for r in self.results:
            if r.check == "row_count":
                return _int(r.expected), _int(r.actual)
        return None, None

    @property
    def compared_nothing(self) -> bool:
        """It passed over 0 rows on both sides: nothing to compare yet, not a reconciliation."""
        return self.passed and self.rows == (0, 0) and not any(r.check == "source_deletion_applied" for r in self.results)

    @property
    def deleted_at_source_keys(self) -> list[str]:
        """Keys of rows deleted at the source after a batch loaded them: one failing result each."""
        keys = []
        for r in self.results:
            if r.check == "deleted_at_source" and not r.passed and r.subject.startswith("key "):
                keys.append(_plain_key(r.subject[4:].split(", loaded by batch ")[0]))
        return keys


def _plain_key(shown: str) -> str:
    """A key as ``spec.key_text`` shows it (``7``, ``'a'``, ``(7, 'EUR')``) as the report writes it (``7 EUR``)."""
    import ast

    try:
        value = ast.literal_eval(shown)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return shown
    return " ".join(str(v) for v in value) if isinstance(value, tuple) else str(value)


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _window_text(lo: Any, hi: Any) -> str | None:
    if lo is None or hi is None:
        return None
    try:
        return str(Window(Bound.from_json(lo), Bound.from_json(hi)))
    except (ValueError, TypeError):
        return f"({lo}, {hi}]"


def runs_from_results(rows: Iterable[dict[str, Any]]) -> list[Run]:
    """Results (``ledger.reconciliation_evidence``'s dicts, in order) grouped into runs, in order."""
    runs: dict[str, Run] = {}
    for r in rows:
        run = runs.get(r["run_id"])
        if run is None:
            run = runs[r["run_id"]] = Run(r["run_id"], r["pipeline"], r["batch_id"], r["scope"], r["attempt"],
                                          _window_text(r.get("window_lo"), r.get("window_hi")), r["checked_at"],
                                          r["code_version"])
        elif r["checked_at"] > run.checked_at:
            run = runs[r["run_id"]] = Run(**{**run.__dict__, "checked_at": r["checked_at"]})
        tolerance = r.get("tolerance")
        run.results.append(Result(r["check_name"], r["subject"] or "", r["expected"], r["actual"], r["difference"],
                                  r["verdict"] == "pass", None if tolerance in (None, 0) else str(tolerance),
                                  r.get("tolerance_reason")))
    return list(runs.values())


@dataclass(frozen=True)
class RepairBatch:
    batch_id: str
    repair_of: str | None
    found_by: str | None  # the reconciliation run whose differing keys it loads again
    state: str
    keys: list[list[str]]
    planned_at: datetime | None = None
    committed_at: datetime | None = None


def repairs_from_rows(rows: Iterable[dict[str, Any]]) -> list[RepairBatch]:
    return [RepairBatch(r["batch_id"], r["repair_of"], r["repair_run"], r["state"], list(r["repair_keys"] or []),
                        r.get("planned_at"), r.get("committed_at")) for r in rows]


@dataclass(frozen=True)
class DifferingRow:
    key: str
    kind: str  # missing, changed, extra, deleted_at_source; "differs" when only the ledger's key is known
    columns: tuple[str, ...] = ()  # the columns that differ (changed rows)
    source: dict[str, str] | None = None
    target: dict[str, str] | None = None


@dataclass(frozen=True)
class Finding:
    """A run that found differences, and what followed until a later run of the batch passed."""

    run: Run
    rows: int | None  # differing rows, when known
    still: list[Run] = field(default_factory=list)  # later runs that failed too
    repair: RepairBatch | None = None  # the newest repair batch planned from it (or from a run in ``still``)
    resolved_by: Run | None = None  # the first later run that passed


def findings(runs: list[Run], repairs: list[RepairBatch],
             differing: Callable[[Run], int | None] = lambda run: None) -> list[Finding]:
    """Every finding of a batch's runs (oldest first): a failing run opens one, later failing runs
    join it, the first passing run after it closes it. ``differing(run)``: its differing rows."""
    out: list[Finding] = []
    current: Finding | None = None
    for run in runs:
        if not run.passed:
            if current is None:
                current = Finding(run, differing(run))
                out.append(current)
            else:
                current.still.append(run)
        elif current is not None:
            out[-1] = current = Finding(current.run, current.rows, current.still, current.repair, run)
            current = None
    for i, f in enumerate(out):
        found_by = {f.run.run_id, *(r.run_id for r in f.still)}
        planned = [r for r in repairs if r.found_by in found_by]
        if planned:
            out[i] = Finding(f.run, f.rows, f.still, planned[-1], f.resolved_by)
    return out


def when(value: datetime | None) -> str:
    """A time as finance reads it: 2026-11-25 18:40:19 UTC."""
    if value is None:
        return "-"
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def found_text(f: Finding) -> str:
    """found 1 difference at <time>, or, without differing rows to count, the checks that failed."""
    if f.rows:
        return f"found {_plural(f.rows, 'difference')} at {when(f.run.checked_at)}"
    names = ", ".join(sorted({r.check.split(' ')[0] for r in f.run.failed}))
    return f"found {_plural(len(f.run.failed), 'failed check')} ({names}) at {when(f.run.checked_at)}"


def verdict_word(run: Run) -> str:
    if run.compared_nothing:
        return "nothing to compare yet"
    if run.passed:
        return "reconciled"
    return f"{len(run.failed)} of {len(run.results)} checks failed"


@dataclass(frozen=True)
class VerdictLine:
    """A batch's verdict with its history, in one line (the status page's cell, the evidence page's header)."""

    text: str
    state: str  # none (not reconciled yet), nothing (0 rows compared), reconciled, differences


def verdict_line(runs: list[Run], found: list[Finding]) -> VerdictLine:
    """The latest verdict, and the last finding with what followed it:
    ``found 1 difference at T1; repaired and reconciled at T2``."""
    if not runs:
        return VerdictLine("not reconciled yet", "none")
    last = runs[-1]
    f = found[-1] if found else None
    if last.passed:
        done = "nothing to compare yet (0 rows)" if last.compared_nothing else "reconciled"
        if f is None:
            return VerdictLine(f"{done} at {when(last.checked_at)}", "nothing" if last.compared_nothing else "reconciled")
        repaired = f.repair is not None and f.repair.state == "committed"
        closed = f.resolved_by or last
        text = f"{found_text(f)}; {'repaired and ' if repaired else ''}reconciled at {when(closed.checked_at)}"
        if closed is not last:
            text += f"; last verdict: {done} at {when(last.checked_at)}"
        return VerdictLine(text, "nothing" if last.compared_nothing else "reconciled")
    text = found_text(f) if f is not None else f"{verdict_word(last)} at {when(last.checked_at)}"
    if f is not None and f.still:
        text += f"; still differing at {when(last.checked_at)}"
    if f is not None and f.repair is not None:
        r = f.repair
        if r.state == "committed" and (r.committed_at is None or r.committed_at > last.checked_at):
            text += f"; repair batch loaded at {when(r.committed_at)}, not reconciled again yet"
        elif r.state != "committed":
            text += f"; repair batch {r.state}"
    return VerdictLine(text, "differences")


# --- the differing rows: the ledger's keys, the report's values --------------------------------

def report_folder(root: Path, pipeline: str, run_id: str) -> Path:
    """Where ``tidemark.reconcile.run`` writes a run's report of differing rows."""
    return root / "reports" / pipeline / run_id


def read_report(folder: Path, limit: int = MAX_REPORT_ROWS) -> list[DifferingRow] | None:
    """The differing rows of a run's differences.csv (None: no such file, or not readable here)."""
    path = folder / "differences.csv"
    try:
        with open(path, newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if not header or header[:4] != ["key", "kind", "side", "differing_columns"]:
                return None
            columns = header[4:]
            rows: dict[tuple[str, str], dict[str, Any]] = {}
            for line in reader:
                if len(line) < 4:
                    continue
                key, kind, side, differing = line[:4]
                entry = rows.get((key, kind))
                if entry is None:
                    if len(rows) >= limit:
                        break
                    entry = rows[(key, kind)] = {"columns": tuple(differing.split()), "source": None, "target": None}
                if side in ("source", "target"):
                    entry[side] = dict(zip(columns, line[4:]))
    except (OSError, UnicodeDecodeError, csv.Error):
        return None
    return [DifferingRow(key, kind, e["columns"], e["source"], e["target"]) for (key, kind), e in rows.items()]


def _key_text(key: list[Any]) -> str:
    return " ".join(str(k) for k in key)


def differing_rows(root: Path | None, run: Run, repairs: list[RepairBatch]) -> tuple[list[DifferingRow], str]:
    """A failing run's differing rows and where they come from: the keys the ledger holds (the repair
    batch planned from the run, the ``deleted_at_source`` results), with both versions from the report
    where it can be read. The second value says which."""
    keys = [_key_text(k) for r in repairs if r.found_by == run.run_id for k in r.keys]
    keys += [k for k in run.deleted_at_source_keys if k not in keys]
    folder = report_folder(root, run.pipeline, run.run_id) if root is not None else None
    reported = read_report(folder) if folder is not None else None
    if reported is None:
        if not keys:  # reconcile.run writes a report only when rows differ (not, e.g., for unreachable rows)
            return [], "no differing row recorded: the failed checks above are the finding"
        report = f"the report {folder / 'differences.csv'} is not readable here" if folder else "no report folder"
        return ([DifferingRow(k, "differs") for k in keys],
                f"keys from the ledger (repair keys, deleted_at_source results); {report}")
    listed = {(r.key, r.kind) for r in reported}
    extra = [DifferingRow(k, "differs") for k in keys if not any(k == key for key, _ in listed)]
    return reported + extra, f"report {folder / 'differences.csv'}" + (
        f" and {len(extra)} more key(s) from the ledger" if extra else "")


def count_differing(root: Path | None, repairs: list[RepairBatch]) -> Callable[[Run], int | None]:
    """``findings``' count of a run's differing rows (None: nothing to count them by)."""
    def count(run: Run) -> int | None:
        rows, _ = differing_rows(root, run, repairs)
        return len(rows) or None
    return count


# --- one batch's evidence, from the warehouse -------------------------------------------------

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


# --- HTML -------------------------------------------------------------------------------------

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
        after = "; ".join(f"repair batch {r.batch_id} ({_plural(len(r.keys), 'key')}): {r.state}"
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
                   f"<td>{_e(', '.join(_key_text(k) for k in r.keys[:10]))}{' ...' if len(r.keys) > 10 else ''}</td>"
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


# --- Great Expectations' Data Docs, served and viewed offline ---------------------------------

def data_docs_site(root: Path) -> Path:
    """The Data Docs site ``tidemark.expectations`` renders under the reconcile directory."""
    return root / "gx" / "uncommitted" / "data_docs" / "local_site"


def docs_page(site: Path, pipeline: str, run_id: str) -> str | None:
    """A run's validation page in the site (GX: validations/<suite>/<run name>/<time>/<batch>.html),
    as a path relative to the site; None when there is none."""
    if not RUN_ID.match(run_id):
        return None
    found = sorted((site / "validations" / f"tidemark_{pipeline}" / run_id).glob("*/*.html"))
    return found[-1].relative_to(site).as_posix() if found else None


def safe_file(base: Path, path: str) -> Path | None:
    """``path`` (from a URL) inside ``base``, or None: no "..", no absolute path, nothing that
    resolves (symbolic links too) outside ``base``. A folder means its index.html."""
    parts = [p for p in path.replace("\\", "/").split("/") if p not in ("", ".")]
    if any(p == ".." or "\x00" in p or ":" in p for p in parts) or path.startswith(("/", "\\")):
        return None
    try:
        root = base.resolve(strict=True)
        target = base.joinpath(*parts).resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    if target != root and root not in target.parents:
        return None
    if target.is_dir():
        target = target / "index.html"
    return target if target.is_file() else None


LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
_SCRIPT = re.compile(r"<script\b[^>]*?\bsrc\s*=\s*([\"'])(?P<url>[^\"']*)\1[^>]*>\s*</script\s*>", re.I)
_LINK = re.compile(r"<link\b[^>]*?\bhref\s*=\s*([\"'])(?P<url>[^\"']*)\1[^>]*>", re.I)
_IMG = re.compile(r"(?P<head><img\b[^>]*?\bsrc\s*=\s*)([\"'])(?P<url>[^\"']*)\2", re.I)
_CSS_URL = re.compile(r"url\(\s*([\"']?)(?P<url>[^\"')]*)\1\s*\)", re.I)
JS, CSS = "tidemark-datadocs.js", "tidemark-datadocs.css"
JS_MARK = "/* Tidemark: the jQuery, Bootstrap and bootstrap-table calls"  # how each asset begins
CSS_MARK = "/* Tidemark: the part of Bootstrap 4 and Font Awesome"


def external(url: str) -> bool:
    """Whether the browser would fetch ``url`` from another machine (http, https or scheme-relative)."""
    u = url.strip()
    if not (u.lower().startswith(("http://", "https://")) or u.startswith("//")):
        return False
    return (urlsplit(u if "://" in u else "http:" + u).hostname or "") not in LOCAL_HOSTS


def offline_html(text: str, assets: str | None, images: str) -> str:
    """A Data Docs page that loads nothing from another machine: its CDN scripts and style sheets
    (jQuery, Bootstrap, bootstrap-table, Font Awesome, Vega) replaced by ``ASSETS``, at ``assets`` (a
    URL prefix ending in /) or, with None, inlined into the page (references to them that
    ``offline_site`` wrote too: a sandboxed page loads no script); GX's logo taken from the site's
    own images at ``images``; other remote images and CSS backgrounds left out. Idempotent."""
    inline = assets is None
    inserted = {JS: JS_MARK in text or (not inline and JS in text), CSS: CSS_MARK in text or (not inline and CSS in text)}

    def replaced(name: str, original: str, url: str) -> str:
        ours = url.rsplit("/", 1)[-1] == name
        if ours and not inline:
            return original
        if not ours and not external(url):
            return original
        if inserted[name] or (name == CSS and not ours and "stylesheet" not in original.lower()):
            return ""
        inserted[name] = True
        if name == JS:
            return f"<script>{DATA_DOCS_JS}</script>" if inline else f'<script src="{assets}{JS}"></script>'
        return f"<style>{ASSETS[CSS][1]}</style>" if inline else f'<link rel="stylesheet" href="{assets}{CSS}">'

    def script(m: re.Match) -> str:
        return replaced(JS, m[0], m["url"])

    def link(m: re.Match) -> str:
        return replaced(CSS, m[0], m["url"])

    def image(m: re.Match) -> str:
        url = m["url"]
        if not external(url):
            return m[0]
        name = urlsplit(url).path.rsplit("/", 1)[-1]
        local = f"{images}{name}" if name in GX_IMAGES else ""
        return f'{m["head"]}"{local}"'

    def css_url(m: re.Match) -> str:
        return "none" if external(m["url"]) else m[0]

    text = _SCRIPT.sub(script, text)
    text = _LINK.sub(link, text)
    text = _IMG.sub(image, text)
    return _CSS_URL.sub(css_url, text)


GX_IMAGES = frozenset({"logo-long.png", "short-logo.png", "favicon.ico", "logo-long-vector.svg",
                       "short-logo-vector.svg"})  # in every site's static/images (GX copies them)


def offline_site(site: Path, run_name: str | None = None) -> list[Path]:
    """Make a rendered Data Docs site viewable offline from disk: ``ASSETS`` written to
    ``static/tidemark/``, and the index, the suite pages and the validation pages of ``run_name``
    (every validation page without one) rewritten by ``offline_html``, each with relative paths.
    Returns the pages rewritten."""
    static = site / "static" / "tidemark"
    static.mkdir(parents=True, exist_ok=True)
    for name, (_, content) in ASSETS.items():
        target = static / name
        if not target.exists() or target.read_text() != content:
            _replace(target, content)
    pages = [site / "index.html", *sorted((site / "expectations").glob("**/*.html"))]
    pages += sorted((site / "validations").glob(f"*/{run_name}/**/*.html" if run_name else "**/*.html"))
    changed = []
    for page in pages:
        try:
            text = page.read_text()
        except (OSError, UnicodeDecodeError):
            continue
        up = os.path.relpath(site / "static", page.parent).replace(os.sep, "/")
        new = offline_html(text, f"{up}/tidemark/", f"{up}/images/")
        if new != text:
            _replace(page, new)
            changed.append(page)
    return changed


def _replace(path: Path, content: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(content)
    os.replace(tmp, path)


def _spacing() -> str:
    """Bootstrap 4's spacing utilities (m-0, pl-md-4, ...), which Data Docs' markup uses throughout."""
    sizes = {"0": "0", "1": ".25rem", "2": ".5rem", "3": "1rem", "4": "1.5rem", "5": "3rem", "auto": "auto"}
    sides = {"": ("",), "t": ("-top",), "b": ("-bottom",), "l": ("-left",), "r": ("-right",),
             "x": ("-left", "-right"), "y": ("-top", "-bottom")}
    out = {"": [], "sm": [], "md": [], "lg": []}
    for prop, letter in (("margin", "m"), ("padding", "p")):
        for side, props in sides.items():
            for size, value in sizes.items():
                if letter == "p" and size == "auto":
                    continue
                for bp in out:
                    name = f"{letter}{side}-{bp + '-' if bp else ''}{size}"
                    out[bp].append(f".{name}{{{';'.join(f'{prop}{p}:{value}!important' for p in props)}}}")
    media = {"sm": 576, "md": 768, "lg": 992}
    return "\n".join(out[""]) + "".join(f"\n@media (min-width:{media[bp]}px){{{''.join(out[bp])}}}"
                                        for bp in ("sm", "md", "lg"))


def _columns() -> str:
    rules = {"": [], "sm": [], "md": [], "lg": []}
    for bp in rules:
        for n in range(1, 13):
            name = f"col-{bp + '-' if bp else ''}{n}"
            rules[bp].append(f".{name}{{flex:0 0 {n / 12 * 100:.4f}%;max-width:{n / 12 * 100:.4f}%}}")
    for bp in ("", "sm", "md", "lg"):
        infix = f"{bp}-" if bp else ""
        rules[bp] += [f".d-{infix}none{{display:none!important}}", f".d-{infix}block{{display:block!important}}",
                      f".d-{infix}flex{{display:flex!important}}", f".d-{infix}inline-flex{{display:inline-flex!important}}",
                      f".d-{infix}inline-block{{display:inline-block!important}}",
                      f".d-{infix}inline{{display:inline!important}}", f".flex-{infix}row{{flex-direction:row!important}}",
                      f".flex-{infix}column{{flex-direction:column!important}}"]
    media = {"sm": 576, "md": 768, "lg": 992}
    return "\n".join(rules[""]) + "".join(f"\n@media (min-width:{media[bp]}px){{{''.join(rules[bp])}}}"
                                          for bp in ("sm", "md", "lg"))


DATA_DOCS_CSS = """/* Tidemark: the part of Bootstrap 4 and Font Awesome that Great Expectations' Data Docs use,
   so that they read offline (their pages load both from CDNs). */
*,::after,::before{box-sizing:border-box}
body{margin:0;font-family:system-ui,-apple-system,"Segoe UI",Roboto,Arial,sans-serif;font-size:14px;line-height:1.5;
color:#212529;background:#fff}
a{color:#0056b3;text-decoration:none}a:hover{text-decoration:underline}
h1,h2,h3,h4,h5,h6,.h6{margin-top:0;margin-bottom:.5rem;font-weight:500;line-height:1.2}
h6,.h6{font-size:1rem}p{margin-top:0;margin-bottom:1rem}.lead{font-size:1.15rem;font-weight:300}
code{font-size:87.5%;color:#c7254e;word-break:break-word}pre{white-space:pre-wrap}
ul,ol{margin-top:0}.list-unstyled{padding-left:0;list-style:none}
.container-fluid{width:100%;padding-left:15px;padding-right:15px;margin-left:auto;margin-right:auto}
.row{display:flex;flex-wrap:wrap;margin-left:-15px;margin-right:-15px}
[class*="col-"],.col{position:relative;width:100%;padding-left:15px;padding-right:15px}.col{flex:1 0 0%}
.w-100{width:100%!important}.h-100{height:100%!important}.mw-100{max-width:100%!important}
.float-left{float:left!important}.float-right{float:right!important}
.flex-wrap{flex-wrap:wrap!important}.flex-column{flex-direction:column!important}
.justify-content-center{justify-content:center!important}.justify-content-between{justify-content:space-between!important}
.align-items-center{align-items:center!important}.mr-auto{margin-right:auto!important}.ml-auto{margin-left:auto!important}
.text-center{text-align:center!important}.text-right{text-align:right!important}.text-left{text-align:left!important}
.text-success{color:#28a745!important}.text-danger{color:#dc3545!important}.text-warning{color:#b58105!important}
.text-info{color:#17a2b8!important}.text-muted,.text-secondary{color:#6c757d!important}.text-white{color:#fff!important}
.font-weight-bold{font-weight:700!important}.font-italic{font-style:italic!important}.small,small{font-size:80%}
.bg-light{background-color:#f8f9fa!important}.bg-white{background-color:#fff!important}
.border{border:1px solid #dee2e6!important}.border-bottom{border-bottom:1px solid #dee2e6!important}
.border-top{border-top:1px solid #dee2e6!important}.border-info{border-color:#17a2b8!important}
.rounded{border-radius:.25rem!important}.rounded-0{border-radius:0!important}.shadow-sm{box-shadow:0 .125rem .25rem rgba(0,0,0,.075)}
.sticky,.sticky-top{position:sticky;top:0;z-index:1020}.fixed-bottom{position:fixed;right:0;bottom:0;left:0;z-index:1030}
.invisible{visibility:hidden!important}.collapse:not(.show){display:none}.fade:not(.show){opacity:0}
.modal,.modal-backdrop{display:none!important}.tab-content>.tab-pane{display:none}.tab-content>.active{display:block}
.navbar{position:relative;display:flex;flex-wrap:wrap;align-items:center;justify-content:space-between;padding:.5rem 1rem;
background:#fff}.navbar-brand{display:inline-block;margin-right:1rem}
.nav{display:flex;flex-wrap:wrap;padding-left:0;margin-bottom:0;list-style:none}.nav-link{display:block;padding:.4rem .8rem}
.nav-pills .nav-link.active{color:#fff;background:#007bff;border-radius:.25rem}.nav-item{list-style:none}
.breadcrumb{display:flex;flex-wrap:wrap;padding:.5rem 1rem;margin-bottom:1rem;list-style:none;border-radius:.25rem}
.breadcrumb-item+.breadcrumb-item{padding-left:.5rem}.breadcrumb-item+.breadcrumb-item::before{content:"/";padding-right:.5rem;color:#6c757d}
.card{position:relative;display:flex;flex-direction:column;background:#fff;border:1px solid rgba(0,0,0,.125);border-radius:.25rem}
.card-header{padding:.6rem 1rem;background:rgba(0,0,0,.03);border-bottom:1px solid rgba(0,0,0,.125)}.card-body{flex:1 1 auto;padding:1rem}
.alert{position:relative;padding:.75rem 1.25rem;margin-bottom:1rem;border:1px solid transparent;border-radius:.25rem}
.alert-secondary{color:#383d41;background:#e2e3e5;border-color:#d6d8db}.alert-info{color:#0c5460;background:#d1ecf1;border-color:#bee5eb}
.alert-danger{color:#721c24;background:#f8d7da}.alert-success{color:#155724;background:#d4edda}
.alert-heading{color:inherit}.close{float:right;font-size:1.5rem;line-height:1;background:none;border:0;cursor:pointer}
.badge{display:inline-block;padding:.25em .4em;font-size:75%;font-weight:700;line-height:1;border-radius:.25rem;white-space:nowrap}
.badge-secondary{color:#fff;background:#6c757d}.badge-info{color:#fff;background:#17a2b8}.badge-success{color:#fff;background:#28a745}
.badge-danger{color:#fff;background:#dc3545}.badge-warning{color:#212529;background:#ffc107}.badge-primary{color:#fff;background:#007bff}
.btn{display:inline-block;padding:.3rem .7rem;font-size:.9rem;line-height:1.5;border:1px solid transparent;border-radius:.25rem;
cursor:pointer;background:#f8f9fa;color:#212529;text-align:center}.btn-sm{padding:.2rem .5rem;font-size:.8rem}
.btn-primary{color:#fff;background:#007bff;border-color:#007bff}.btn-secondary{color:#fff;background:#6c757d;border-color:#6c757d}
.btn-info{color:#fff;background:#17a2b8}.btn-outline-info{color:#17a2b8;border-color:#17a2b8;background:#fff}
.btn-group,.btn-group-toggle{display:inline-flex}
.table{width:100%;margin-bottom:1rem;border-collapse:collapse;color:#212529}
.table td,.table th{padding:.5rem;vertical-align:top;border-top:1px solid #dee2e6;text-align:left}
.table thead th{vertical-align:bottom;border-bottom:2px solid #dee2e6}.table-sm td,.table-sm th{padding:.3rem}
.table-bordered td,.table-bordered th{border:1px solid #dee2e6}.table-responsive{display:block;width:100%;overflow-x:auto}
.table-striped tbody tr:nth-of-type(odd){background:rgba(0,0,0,.03)}.tm-table tbody tr:hover{background:#f1f5fb}
.tm-search{margin:.25rem 0 .5rem;padding:.25rem .5rem;border:1px solid #ced4da;border-radius:.25rem;min-width:16rem}
.fas,.far,.fa,.fab{display:inline-block;font-style:normal;font-variant:normal;line-height:1}
.fa-check-circle::before{content:"\\2714"}.fa-check::before{content:"\\2713"}.fa-times::before{content:"\\2716"}
.fa-times-circle::before{content:"\\2716"}.fa-question-circle::before{content:"?"}.fa-exclamation-triangle::before{content:"\\26A0"}
.fa-comment::before{content:"\\1F4AC"}.fa-info-circle::before{content:"\\2139"}.fa-angle-down::before{content:"\\25BE"}
.fa-angle-up::before{content:"\\25B4"}.fa-search::before{content:"\\1F50D"}.fa-bars::before{content:"\\2630"}
#ge-cta-footer{display:none!important}
"""


DATA_DOCS_JS = r"""/* Tidemark: the jQuery, Bootstrap and bootstrap-table calls Great Expectations' Data Docs make,
   so that their pages render offline (they load those libraries from CDNs). Tables are drawn from the
   data each page embeds, with a search box and sortable columns; charts (Vega) are not drawn. */
(function (w, d) {
  "use strict";
  var NATIVE = ["click", "change", "input", "keyup", "keydown", "submit", "mouseover", "mouseout", "focus", "blur"];
  function List(nodes) {
    this.length = 0;
    for (var i = 0; i < nodes.length; i++) { if (nodes[i]) { this[this.length++] = nodes[i]; } }
  }
  function arr(list) { return Array.prototype.slice.call(list); }
  function ready(f) {
    if (d.readyState === "loading") { d.addEventListener("DOMContentLoaded", function () { f($); }); }
    else { setTimeout(function () { f($); }, 0); }
  }
  function $(sel) {
    if (sel instanceof List) { return sel; }
    if (typeof sel === "function") { ready(sel); return new List([d]); }
    if (typeof sel === "string") {
      var s = sel.trim();
      if (s.charAt(0) === "<") { var t = d.createElement("template"); t.innerHTML = s; return new List(arr(t.content.childNodes)); }
      try { return new List(arr(d.querySelectorAll(s))); } catch (e) { return new List([]); }
    }
    if (sel && (sel.nodeType || sel === w)) { return new List([sel]); }
    if (sel && typeof sel.length === "number") { return new List(arr(sel)); }
    return new List([]);
  }
  var fn = List.prototype;
  fn.each = function (f) { for (var i = 0; i < this.length; i++) { f.call(this[i], i, this[i]); } return this; };
  fn.get = function (i) { return i === undefined ? arr(this) : this[i]; };
  fn.eq = function (i) { return new List([this[i]]); };
  fn.first = function () { return this.eq(0); };
  fn.ready = function (f) { ready(f); return this; };
  fn.on = function (events, selector, f) {
    if (typeof selector === "function") { f = selector; selector = null; }
    var list = this;
    events.split(/\s+/).forEach(function (ev) {
      var type = ev.split(".")[0];
      if (!type) { return; }
      list.each(function (i, el) {
        if (NATIVE.indexOf(type) >= 0 && el.addEventListener) {
          el.addEventListener(type, function (e) {
            if (!selector || (e.target.closest && e.target.closest(selector))) { f.call(el, e); }
          });
        } else {
          el.__tmOn = el.__tmOn || {};
          (el.__tmOn[type] = el.__tmOn[type] || []).push(f);
        }
      });
    });
    return this;
  };
  fn.trigger = function (type, args) {
    var t = type.split(".")[0];
    return this.each(function (i, el) {
      ((el.__tmOn || {})[t] || []).forEach(function (f) { f.apply(el, [{type: t, target: el}].concat(args || [])); });
    });
  };
  fn.click = function (f) { return f ? this.on("click", f) : this.each(function (i, el) { el.click(); }); };
  function classes(list, c, how) {
    return list.each(function (i, el) { String(c || "").split(/\s+/).forEach(function (x) { if (x) { el.classList[how](x); } }); });
  }
  fn.addClass = function (c) { return classes(this, c, "add"); };
  fn.removeClass = function (c) { return classes(this, c, "remove"); };
  fn.toggleClass = function (c) { return classes(this, c, "toggle"); };
  fn.hasClass = function (c) { return this.length > 0 && this[0].classList.contains(c); };
  fn.attr = function (k, v) {
    if (v === undefined) { return this.length ? this[0].getAttribute(k) : undefined; }
    return this.each(function (i, el) { el.setAttribute(k, v); });
  };
  fn.data = function (k) {
    if (!this.length || !this[0].getAttribute) { return undefined; }
    var v = this[0].getAttribute("data-" + k);
    return v === null ? undefined : v;
  };
  fn.show = fn.fadeIn = fn.slideDown = function () {
    return this.each(function (i, el) { el.style.display = ""; if (getComputedStyle(el).display === "none") { el.style.display = "block"; } });
  };
  fn.hide = fn.fadeOut = fn.slideUp = function () { return this.each(function (i, el) { el.style.display = "none"; }); };
  fn.toggle = function () {
    return this.each(function (i, el) { if (getComputedStyle(el).display === "none") { $(el).show(); } else { $(el).hide(); } });
  };
  fn.parent = function () {
    var out = [];
    this.each(function (i, el) { if (el.parentElement && out.indexOf(el.parentElement) < 0) { out.push(el.parentElement); } });
    return new List(out);
  };
  fn.closest = function (s) {
    var out = [];
    this.each(function (i, el) { var c = el.closest && el.closest(s); if (c && out.indexOf(c) < 0) { out.push(c); } });
    return new List(out);
  };
  fn.find = function (s) {
    var out = [];
    this.each(function (i, el) { arr(el.querySelectorAll(s)).forEach(function (n) { if (out.indexOf(n) < 0) { out.push(n); } }); });
    return new List(out);
  };
  function insert(list, content, where) {
    return list.each(function (i, el) {
      if (typeof content === "string") { el.insertAdjacentHTML(where, content); }
      else { $(content).each(function (j, n) { el.insertAdjacentElement(where, n); }); }
    });
  }
  fn.prepend = function (c) { return insert(this, c, "afterbegin"); };
  fn.append = function (c) { return insert(this, c, "beforeend"); };
  fn.html = function (h) {
    if (h === undefined) { return this.length ? this[0].innerHTML : undefined; }
    return this.each(function (i, el) { el.innerHTML = h; });
  };
  fn.text = function (t) {
    if (t === undefined) { return this.length ? this[0].textContent : undefined; }
    return this.each(function (i, el) { el.textContent = t; });
  };
  fn.val = function (v) {
    if (v === undefined) { return this.length ? this[0].value : undefined; }
    return this.each(function (i, el) { el.value = v; });
  };
  fn.css = function (k, v) {
    if (typeof k === "string" && v === undefined) { return this.length ? getComputedStyle(this[0])[k] : undefined; }
    var props = typeof k === "string" ? {} : k;
    if (typeof k === "string") { props[k] = v; }
    return this.each(function (i, el) { Object.keys(props).forEach(function (p) { el.style[p] = props[p]; }); });
  };
  fn.modal = fn.tooltip = fn.popover = fn.dropdown = fn.alert = fn.button = function () { return this; };
  fn.collapse = function (how) {
    return this.each(function (i, el) {
      el.classList.toggle("show", how === "show" ? true : how === "hide" ? false : !el.classList.contains("show"));
    });
  };
  fn.tab = function () {
    return this.each(function (i, el) {
      var target = d.querySelector(el.getAttribute("href") || el.getAttribute("data-target"));
      if (!target) { return; }
      arr(target.parentNode.children).forEach(function (p) { p.classList.remove("active", "show"); });
      target.classList.add("active", "show");
      var nav = el.closest(".nav");
      if (nav) { arr(nav.querySelectorAll(".active")).forEach(function (a) { a.classList.remove("active"); }); }
      el.classList.add("active");
    });
  };

  function named(f) { return typeof f === "function" ? f : (typeof f === "string" && typeof w[f] === "function" ? w[f] : null); }
  function yes(v) { return v === true || v === "true"; }
  function plain(h) { var t = d.createElement("div"); t.innerHTML = h === null || h === undefined ? "" : String(h); return (t.textContent || "").trim(); }
  function esc(s) { var t = d.createElement("div"); t.textContent = s === null || s === undefined ? "" : String(s); return t.innerHTML; }
  function draw(table) {
    var o = table.__tmTable, cols = o.columns || [], q = (o.searchText || "").toLowerCase();
    var rows = (o.data || []).filter(function (row) {
      return !q || cols.some(function (c) { return plain(row[c.field]).toLowerCase().indexOf(q) >= 0; });
    });
    var col = null;
    cols.forEach(function (c) { if (c.field === o.sortName) { col = c; } });
    var key = (col && col.sortName) || o.sortName;
    if (key) {
      var dir = o.sortOrder === "desc" ? -1 : 1;
      rows = rows.slice().sort(function (a, b) {
        var x = a[key], y = b[key];
        if (typeof x !== "number" || typeof y !== "number") { x = plain(x); y = plain(y); }
        return x < y ? -dir : x > y ? dir : 0;
      });
    }
    table.innerHTML = "<thead><tr>" + cols.map(function (c, i) {
      var mark = c.field === o.sortName ? (o.sortOrder === "desc" ? " \u25BE" : " \u25B4") : "";
      return '<th data-tm-col="' + i + '"' + (yes(c.sortable) ? ' style="cursor:pointer"' : "") + ">" + esc(c.title || c.field) + mark + "</th>";
    }).join("") + "</tr></thead><tbody></tbody>";
    var body = table.tBodies[0], attributes = named(o.rowAttributes), style = named(o.rowStyle);
    if (!rows.length) { body.innerHTML = '<tr><td colspan="' + Math.max(cols.length, 1) + '">No matching records found</td></tr>'; }
    rows.forEach(function (row, i) {
      var tr = d.createElement("tr"), attrs = attributes ? attributes(row, i) || {} : {}, css = style ? (style(row, i) || {}).css || {} : {};
      Object.keys(attrs).forEach(function (k) { if (attrs[k] !== null && attrs[k] !== undefined) { tr.setAttribute(k, attrs[k]); } });
      Object.keys(css).forEach(function (k) { tr.style[k] = css[k]; });
      cols.forEach(function (c) {
        var td = d.createElement("td");
        if (c.align) { td.style.textAlign = c.align; }
        td.innerHTML = row[c.field] === null || row[c.field] === undefined ? "" : String(row[c.field]);
        tr.appendChild(td);
      });
      tr.addEventListener("click", function (e) { if (!(e.target.closest && e.target.closest("a"))) { $(table).trigger("click-row", [row, $(tr)]); } });
      body.appendChild(tr);
    });
    arr(table.tHead.rows[0].cells).forEach(function (th) {
      var c = cols[+th.getAttribute("data-tm-col")];
      if (!c || !yes(c.sortable)) { return; }
      th.addEventListener("click", function () {
        o.sortOrder = o.sortName === c.field && o.sortOrder !== "desc" ? "desc" : "asc";
        o.sortName = c.field;
        draw(table);
      });
    });
  }
  fn.bootstrapTable = function (options) {
    return this.each(function (i, table) {
      if (typeof options === "string") {
        if (table.__tmTable && (options === "resetSearch" || options === "clearFilterControl")) {
          table.__tmTable.searchText = "";
          if (table.__tmSearch) { table.__tmSearch.value = ""; }
          draw(table);
        }
        return;
      }
      table.__tmTable = Object.assign({}, options || {});
      table.classList.add("table", "table-sm", "tm-table");
      if (yes(table.__tmTable.search) && !table.__tmSearch) {
        var box = d.createElement("input");
        box.type = "search";
        box.placeholder = "Search";
        box.className = "tm-search";
        box.addEventListener("input", function () { table.__tmTable.searchText = box.value; draw(table); });
        table.__tmSearch = box;
        table.parentNode.insertBefore(box, table);
      }
      draw(table);
    });
  };
  $.fn = fn;
  $.extend = Object.assign;
  $.each = function (o, f) { Object.keys(o).forEach(function (k) { f.call(o[k], k, o[k]); }); return o; };
  w.jQuery = w.$ = $;
  w.vegaEmbed = function (el) {
    var n = typeof el === "string" ? d.querySelector(el) : el;
    if (n) { n.textContent = "(chart not drawn: Data Docs offline)"; }
    return Promise.resolve({});
  };
  d.addEventListener("click", function (e) {
    var t = e.target.closest ? e.target.closest("[data-toggle],[data-dismiss]") : null;
    if (!t) { return; }
    var toggle = t.getAttribute("data-toggle");
    if (toggle === "collapse") {
      e.preventDefault();
      var sel = t.getAttribute("data-target") || t.getAttribute("href");
      if (sel) { $(sel).collapse(); }
    } else if (toggle === "tab" || toggle === "pill") {
      e.preventDefault();
      $(t).tab();
    }
    if (t.getAttribute("data-dismiss") === "alert") {
      var a = t.closest(".alert");
      if (a) { a.parentNode.removeChild(a); $(a).trigger("closed"); }
    }
  });
})(window, document);
"""


ASSETS: dict[str, tuple[str, str]] = {
    JS: ("text/javascript", DATA_DOCS_JS),
    CSS: ("text/css", DATA_DOCS_CSS + _columns() + "\n" + _spacing() + "\n"),
}

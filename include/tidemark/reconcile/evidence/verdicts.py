"""What a batch's reconciliations found: runs, findings, the verdict line a person reads."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from tidemark.protocol.window import Bound, Window

FULL = "full"  # the URL segment of a pipeline's full-table reconciliations (a batch id always holds a ':')
RUN_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


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


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def found_text(f: Finding) -> str:
    """found 1 difference at <time>, or, without differing rows to count, the checks that failed."""
    if f.rows:
        return f"found {plural(f.rows, 'difference')} at {when(f.run.checked_at)}"
    names = ", ".join(sorted({r.check.split(' ')[0] for r in f.run.failed}))
    return f"found {plural(len(f.run.failed), 'failed check')} ({names}) at {when(f.run.checked_at)}"


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

"""The differing rows: the ledger's keys, the report's values (``tidemark.reconcile.run`` writes the report)."""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tidemark.reconcile.evidence.verdicts import DifferingRow, RepairBatch, Run

MAX_REPORT_ROWS = 1000  # differing rows read from a report (reconcile.run localises 1,000 at most)
REPORT_FILES = ("differences.csv", "differences.html")


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


def key_text(key: list[Any]) -> str:
    return " ".join(str(k) for k in key)


def differing_rows(root: Path | None, run: Run, repairs: list[RepairBatch]) -> tuple[list[DifferingRow], str]:
    """A failing run's differing rows and where they come from: the keys the ledger holds (the repair
    batch planned from the run, the ``deleted_at_source`` results), with both versions from the report
    where it can be read. The second value says which."""
    keys = [key_text(k) for r in repairs if r.found_by == run.run_id for k in r.keys]
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

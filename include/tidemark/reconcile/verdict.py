"""What a reconciliation finds: checks, differences, the verdict and its next step."""

from __future__ import annotations

from dataclasses import dataclass, field

from tidemark.protocol.spec import PipelineSpec


@dataclass(frozen=True)
class Check:
    """One result, as the evidence table keeps it."""

    check: str  # e.g. "row_count", "control_total amount by currency, business_date", "hash_total"
    subject: str  # what was compared: "" for the whole window, or the group ("EUR, 2026-11-23")
    expected: str | None  # the source's figure (or the rule)
    actual: str | None  # the target's figure
    difference: str | None
    passed: bool


@dataclass
class Difference:
    key: tuple
    # "missing" (in the source, not in the target), "changed", "deleted_at_source" (in the target, not
    # in the source, and a committed batch of the pipeline wrote the target row: the source deleted it
    # after the load) or "extra" (in the target, not in the source, and no batch wrote it)
    kind: str
    source: dict[str, str | None] | None
    target: dict[str, str | None] | None
    columns: list[str] = field(default_factory=list)  # the columns that differ (changed only)
    loaded_by: str | None = None  # deleted_at_source: the batch whose commit wrote the target row


DELETED_AT_SOURCE = "deleted_at_source"
KIND_LABELS = {DELETED_AT_SOURCE: "deleted at the source after loading"}  # the summary's words for a kind


@dataclass
class Verdict:
    checks: list[Check]
    differences: list[Difference]
    rows_source: int
    rows_target: int
    rows_read_localising: int = 0  # rows the databases scanned to localise the differences
    rows_fetched: int = 0  # of those, rows sent here to be compared column by column
    moved_keys: int = 0  # keys left out on both sides: updated at the source after the window
    # of those, the keys the batch did not carry either (``checks.left_out``): first key -> (source, target cursor)
    left_out: dict[str, tuple] = field(default_factory=dict)
    complete: bool = True  # False: localisation stopped at its limit, more rows differ than listed
    where: str = ""  # the rows compared (SQL), for the declarative checks on the same rows
    seconds: float = 0.0  # the checks (both passes and the target's own queries)
    seconds_localising: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)  # seconds per step, for the log and the benchmark
    # after a repair batch: the rows it deleted because the source had deleted them (the run asked
    # for it, apply_source_deletes), one passing result each, kept in the evidence beside the checks
    deletions_applied: list[Check] = field(default_factory=list)

    @property
    def read_fraction(self) -> float:
        """Rows read while localising over the rows the window holds on both sides."""
        return self.rows_read_localising / max(self.rows_source + self.rows_target, 1)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def deleted_at_source(self) -> list[Difference]:
        return [d for d in self.differences if d.kind == DELETED_AT_SOURCE]

    def summary(self, spec: PipelineSpec, batch_id: str) -> str:
        """One line an analyst understands."""
        moved = (f" ({self.moved_keys} keys left out: changed at the source since the batch read them, the next batch "
                 "carries them)") if self.moved_keys else ""
        if self.passed:
            n = len(self.deletions_applied)
            applied = f" after applying {n} source deletion{'s' if n != 1 else ''}" if n else ""
            if self.rows_source == self.rows_target == 0 and not n:  # every check holds over no rows: not a proof
                return (f"{spec.target_table} batch {batch_id}: nothing to compare yet, 0 rows in the window{moved}, "
                        f"{len(self.checks)} checks passed")
            return (f"{spec.target_table} batch {batch_id}: reconciled{applied}, {self.rows_target} rows{moved}, "
                    f"{len(self.checks)} checks passed")
        failed = [c for c in self.checks if not c.passed]
        kinds: dict[str, int] = {}
        for d in self.differences:
            label = f"{', '.join(d.columns)} changed" if d.kind == "changed" else KIND_LABELS.get(d.kind, d.kind)
            kinds[label] = kinds.get(label, 0) + 1
        parts = ", ".join(f"{n} {label}" for label, n in sorted(kinds.items()))
        more = "" if self.complete else " (localisation stopped there: more differ)"
        rows = f"{len(self.differences)} rows differ{more}: {parts}; " if self.differences else ""
        return (f"{spec.target_table} batch {batch_id}: {rows}{len(failed)} of {len(self.checks)} checks failed "
                f"({', '.join(sorted({c.check for c in failed}))})")

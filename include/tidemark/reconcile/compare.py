"""The whole reconciliation of a window: both passes at once, the checks beside them, the localisation."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

from tidemark.protocol.spec import PipelineSpec, quote
from tidemark.protocol.window import Window, predicate
from tidemark.reconcile.checks import (
    check_equal,
    invariant_checks,
    left_out,
    moved_keys,
    tell_deletions_apart,
    unique_keys,
    unreachable_rows,
)
from tidemark.reconcile.localise import localise_range
from tidemark.reconcile.passes import BUCKETS, LEAF_ROWS, compared_columns, key_bounds, key_type, one_pass, set_session
from tidemark.reconcile.verdict import Check, Verdict


def reconcile(spec: PipelineSpec, window: Window, source_cur, target_cur, *, invariants_cur=None,
              buckets: int = BUCKETS, leaf_rows: int = LEAF_ROWS, localise_limit: int = 1000,
              read_above: bool = False) -> Verdict:
    """Every check of the spec's ``reconcile`` section for ``window``; the differing rows localised.

    ``invariants_cur``, a cursor on a second warehouse connection whose transaction has not begun,
    runs the target's accounting invariants at the same time as the two passes, on the target
    cursor's snapshot (exported and imported, as ``pg_dump -j`` does); without it they run after.

    A pipeline that updates rows in place (upserts) may have moved a row past the window since the
    batch (a newer version for the next batch): the keys whose source version lies after ``hi``
    are left out on both sides (by the first key column, so both sides leave out the same rows).

    ``read_above``: the batch read its snapshot's rows above ``hi`` too (``LedgerBatch.reads_above``):
    every row above ``lo`` is compared, but for the keys whose source version is no longer the one the
    target holds (changed since the batch read them). A comparison of no rows while keys were left out
    fails (``compared_rows``): a proof that compared nothing proves nothing."""
    started = time.perf_counter()
    set_session(source_cur)
    set_session(target_cur)
    columns = compared_columns(source_cur, spec)
    kind = key_type(target_cur, spec)
    where = predicate(spec, window.opened_above() if read_above else window).replace("%", "%%")  # a key may hold %
    moved = moved_keys(source_cur, spec, window, target_cur if read_above else None)
    if moved:
        where += " AND " + source_cur.mogrify(f"{quote(spec.primary_key[0])} <> ALL (%s::{kind}[])",
                                               (moved,)).decode().replace("%", "%%")
    timings: dict[str, float] = {}

    def timed(step: str, since: float) -> float:
        now = time.perf_counter()
        timings[step] = round(now - since, 3)
        return now

    mark = timed("columns, moved keys", started)
    checks: list[Check] = [unique_keys(target_cur, spec, where)]
    mark = timed("unique keys", mark)
    bounds = key_bounds(target_cur, spec, spec.target_table, where, kind, buckets)
    mark = timed("key ranges", mark)
    invariants: list[Check] = []
    if invariants_cur is not None:
        target_cur.execute("SELECT pg_export_snapshot()")
        snapshot = target_cur.fetchone()[0]
        invariants_cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        invariants_cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot,))
        set_session(invariants_cur)
    with ThreadPoolExecutor(2) as others:  # one pass per side, at the same time (one backend each)
        source_pass = others.submit(one_pass, source_cur, spec, spec.table, where, columns, bounds, kind)
        target_invariants = (others.submit(invariant_checks, invariants_cur, spec, where, timings)
                             if invariants_cur is not None else None)
        tgt = one_pass(target_cur, spec, spec.target_table, where, columns, bounds, kind)
        src = source_pass.result()
        mark = timed("one pass per side", mark)
        if target_invariants is not None:
            invariants = target_invariants.result()
            mark = timed("invariants (beside the passes), waited for", mark)
    checks += totals_checks(spec, src, tgt)
    if src.rows == tgt.rows == 0 and moved:
        checks.append(Check("compared_rows", "rows of the window compared", f"at least 1 ({len(moved)} key(s) hold rows "
                            "past the window's start at the source)", "0",
                            f"every one of the {len(moved)} key(s) changed at the source since the batch read it", False))
    if invariants_cur is None:
        invariants = invariant_checks(target_cur, spec, where, timings)  # each timed on its own
        mark = time.perf_counter()
    checks += invariants
    not_carried = left_out(source_cur, target_cur, spec, window, moved)
    stranded = unreachable_rows(source_cur, spec)
    if stranded is not None:
        checks.append(stranded)
        timed("unreachable rows", mark)
    verdict = Verdict(checks, [], src.rows, tgt.rows, moved_keys=len(moved), where=where.replace("%%", "%"),
                      timings=timings, left_out=not_carried)
    verdict.seconds = time.perf_counter() - started
    if src.buckets != tgt.buckets:
        localise(spec, source_cur, target_cur, where, columns, kind, bounds, src, tgt, leaf_rows, localise_limit,
                 verdict)
        tell_deletions_apart(target_cur, spec, where, verdict)
        verdict.seconds_localising = time.perf_counter() - started - verdict.seconds
    return verdict


def totals_checks(spec: PipelineSpec, src, tgt) -> list[Check]:
    """Row count, hash total and each control total, source against target."""
    checks = [check_equal("row_count", "", src.rows, tgt.rows), check_equal("hash_total", "", src.hash_total, tgt.hash_total)]
    for label_group in sorted(set(src.totals) | set(tgt.totals), key=lambda k: (k[0], [str(v) for v in k[1]])):
        label, group = label_group
        checks.append(check_equal(f"control_total {label}", ", ".join(str(v) for v in group),
                                  src.totals.get(label_group, Decimal(0)), tgt.totals.get(label_group, Decimal(0)),
                                  spec.reconcile.tolerance))
    return checks


def localise(spec: PipelineSpec, source_cur, target_cur, where: str, columns, kind: str, bounds, src, tgt,
             leaf_rows: int, limit: int, verdict: Verdict) -> None:
    """The differing rows of every key range whose bucket differs, up to ``limit`` (then the
    verdict says it is incomplete)."""
    differing = sorted(b for b in set(src.buckets) | set(tgt.buckets) if src.buckets.get(b) != tgt.buckets.get(b))
    for b in differing:
        lo = bounds[b - 1] if b > 0 else None
        hi = bounds[b] if b < len(bounds) else None
        size = max(src.buckets.get(b, (0, 0))[0], tgt.buckets.get(b, (0, 0))[0])
        localise_range(spec, source_cur, target_cur, where, columns, kind, lo, hi, size, leaf_rows, verdict)
        if len(verdict.differences) >= limit:
            verdict.complete = False
            break

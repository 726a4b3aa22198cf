"""Reconcile a committed batch: the source against the target for the batch's window, in the databases.

One pass per side (both at once) computes, grouped by key range (``width_bucket`` over equal-width
ranges of integer keys, else the target's key quantiles) and by the control totals' grouping
columns: row counts, hash totals over the full content of every row (the values' own hashes), and
exact decimal sums. Separate queries on the target check what one pass cannot: duplicate keys
(skipped when a unique index enforces them), double-entry journals that do not sum to zero per
currency, balance continuity, and balances against the ledger pipeline's movements; given a second
warehouse connection, these invariants run beside the passes on the target's snapshot. Required
fields and accepted values are Great Expectations' (``tidemark.reconcile.expectations``), run by ``run``
over the same rows.

When the sides differ, only the key ranges whose count or hash total differ are read again,
split further while they hold more than ``leaf_rows`` rows, down to the rows: the report lists
missing, extra and changed keys, with both versions and the columns that differ. A key the target
holds and the source does not is *deleted at the source* when Tidemark loaded it (the target row
was written by the transaction that committed a batch of the pipeline), else *extra*. The rows read
while localising are counted, so a report can say what fraction of the batch it had to read.

Pure SQL over psycopg2 cursors: no Spark, no Airflow. Both sessions run in UTC so that every
value's text form (what localisation compares, and the row hash of types hashed as text) is the
same on both sides.

The rooms, each importing only those named before it: ``verdict`` (checks, differences, the verdict),
``passes`` (one pass per side), ``checks`` (what one pass cannot check), ``localise`` (down to the
rows), ``compare`` (the whole reconciliation of a window), ``outcome`` (one run: ledger and report).
"""

from tidemark.reconcile.checks import (
                                       MAX_MOVED_KEYS,
                                       ReconcileError,
                                       balance_continuity,
                                       deletion_check,
                                       double_entry,
                                       freshness,
                                       invariant_checks,
                                       left_out,
                                       loaded_by_batches,
                                       moved_keys,
                                       movements_match_ledger,
                                       starved_keys,
                                       tell_deletions_apart,
                                       unique_keys,
                                       unreachable_rows,
)
from tidemark.reconcile.compare import reconcile
from tidemark.reconcile.localise import differences_csv
from tidemark.reconcile.outcome import Outcome, run, write_report
from tidemark.reconcile.passes import BUCKETS, LEAF_ROWS, compared_columns, key_bounds, key_type, one_pass, set_session
from tidemark.reconcile.verdict import DELETED_AT_SOURCE, KIND_LABELS, Check, Difference, Verdict

__all__ = [
    "DELETED_AT_SOURCE", "KIND_LABELS", "Check", "Difference", "Verdict",
    "BUCKETS", "LEAF_ROWS", "compared_columns", "key_bounds", "key_type", "one_pass", "set_session",
    "MAX_MOVED_KEYS", "ReconcileError", "balance_continuity", "deletion_check", "double_entry", "freshness",
    "invariant_checks", "left_out", "loaded_by_batches", "moved_keys", "movements_match_ledger", "starved_keys",
    "tell_deletions_apart",
    "unique_keys", "unreachable_rows", "differences_csv", "reconcile", "Outcome", "run", "write_report",
]

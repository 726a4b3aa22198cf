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

Pure functions and DB-API queries (``tidemark.ledger``): no Airflow import. The rooms, each
importing only those named before it: ``verdicts`` (runs, findings, the verdict line), ``reports`` (the
differing rows' report), ``queries`` (one batch's evidence from the warehouse), ``page`` (HTML),
``datadocs`` (Great Expectations' Data Docs offline).
"""

from tidemark.reconcile.evidence.datadocs import (
                                        ASSETS,
                                        CSS,
                                        CSS_MARK,
                                        DATA_DOCS_CSS,
                                        DATA_DOCS_JS,
                                        JS,
                                        JS_MARK,
                                        data_docs_site,
                                        docs_page,
                                        external,
                                        offline_html,
                                        offline_site,
                                        safe_file,
)
from tidemark.reconcile.evidence.page import Links, batch_path, render_batch, render_message, verdict_link
from tidemark.reconcile.evidence.queries import BatchEvidence, NotFound, batch_evidence, verdict_lines
from tidemark.reconcile.evidence.reports import (
                                        MAX_REPORT_ROWS,
                                        REPORT_FILES,
                                        count_differing,
                                        differing_rows,
                                        read_report,
                                        report_folder,
)
from tidemark.reconcile.evidence.verdicts import (
                                        FULL,
                                        RUN_ID,
                                        DifferingRow,
                                        Finding,
                                        RepairBatch,
                                        Result,
                                        Run,
                                        VerdictLine,
                                        findings,
                                        found_text,
                                        repairs_from_rows,
                                        runs_from_results,
                                        verdict_line,
                                        verdict_word,
                                        when,
)

__all__ = [
    "FULL", "RUN_ID", "DifferingRow", "Finding", "RepairBatch", "Result", "Run", "VerdictLine", "findings",
    "found_text", "repairs_from_rows", "runs_from_results", "verdict_line", "verdict_word", "when",
    "MAX_REPORT_ROWS", "REPORT_FILES", "count_differing", "differing_rows", "read_report", "report_folder",
    "BatchEvidence", "NotFound", "batch_evidence", "verdict_lines",
    "Links", "batch_path", "render_batch", "render_message", "verdict_link",
    "ASSETS", "CSS", "CSS_MARK", "DATA_DOCS_CSS", "DATA_DOCS_JS", "JS", "JS_MARK", "data_docs_site", "docs_page",
    "external", "offline_html", "offline_site", "safe_file",
]

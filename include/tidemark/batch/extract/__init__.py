"""The extract of one batch window: source to pipeline topic, with its END totals.

Rooms in import order: ``decisions`` (read ranges, the report, the checks that keep a wrong attempt
from being sealed; no Spark), ``job`` (the Spark driver that ``spark_jobs/extract_window.py`` runs;
imported by the driver only).
"""

from __future__ import annotations

from tidemark.batch.extract.decisions import (  # noqa: F401
    CURSOR_TYPES,
    INFINITE,
    NAN_OR_INFINITE,
    ExtractError,
    ExtractInterrupted,
    balanced_edges,
    check_offsets,
    check_read_range,
    cursor_histogram,
    edges,
    kinds_of_columns,
    read_span,
    report,
    unrepresentable,
    unrepresentable_error,
)

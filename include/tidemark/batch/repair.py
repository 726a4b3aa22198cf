"""Repair: re-load only the keys a reconciliation found differing, through the same BEGIN/END path.

A repair batch is planned from a reconciliation's differences (missing, extra and changed rows,
and rows deleted at the source after a batch loaded them). Its keys are kept in the ledger; its
window reaches from the pipeline's start to the end of the repaired window, so the extract finds
each key's current source version even where the row's cursor moved back; like a backfill it never
moves the watermark. It then runs as any batch: a new batch id, BEGIN, the extract of those keys
only, END with their counts and checksums, the sink. In the apply transaction the sink replaces the
target's rows of the keys it staged; a key with nothing staged is deleted only where the plan
allows it (``deletes``): an extra row always, a row deleted at the source only when the run asked
for it (``apply_source_deletes``), each deleted row kept with its old values in
``tidemark_control.repair_deletions``. Without that flag a row deleted at the source is not even
re-extracted: it stays, and every later reconciliation reports it. A staged record whose key is
not one of the keys refuses the batch. The reconciliation that follows checks the repaired scope
again, and the evidence keeps both verdicts.

Keys travel as the text forms of their columns and are cast back to the columns' own types (read
from the catalog) inside the database, so an integer, a uuid or a ``char(3)`` compares as itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tidemark import ledger
from tidemark.batch.steps import Plan
from tidemark.ledger.catalog import source_columns
from tidemark.protocol.errors import Terminal
from tidemark.protocol.spec import PipelineSpec, quote
from tidemark.protocol.window import Bound, Window

MAX_KEYS = 1000  # what one reconciliation localises at most: more is a reload, not a repair
# format_type's output for built-in types: "bigint", "numeric(18,2)", "timestamp(3) with time zone"
_TYPE = re.compile(r"^[a-z][a-z0-9_ ]*(\(\d+(,\s?\d+)?\)[a-z ]*)?$")


class RepairError(Terminal, ValueError):
    """A repair that cannot be planned or loaded as asked (the message says why and what to do); the
    same input fails again, so orchestration does not retry it."""


def batch_id_for(pipeline: str, reconcile_run: str) -> str:
    """One repair batch per reconciliation run that found differences."""
    return f"{pipeline}:repair__{reconcile_run}"


def keys_of(differences: Iterable[Any]) -> list[list[str]]:
    """The differing rows' keys (``reconcile.Difference``), each as the text of its columns, once."""
    seen: dict[tuple[str, ...], None] = {}
    for d in differences:
        seen.setdefault(tuple(str(v) for v in d.key))
    return [list(k) for k in seen]


DELETED_AT_SOURCE = "deleted_at_source"  # reconcile.DELETED_AT_SOURCE


def deletes(differences: Iterable[Any], apply_source_deletes: bool = False) -> dict[str, Any]:
    """What a repair of ``differences`` may delete from the target where the source holds no
    version of a key (the ledger's ``batches.repair_deletes``): the extra rows' keys always; the
    keys of rows deleted at the source after a batch loaded them only with ``apply_source_deletes``
    (they are listed either way, for the record)."""
    differences = list(differences)
    return {"apply_source_deletes": bool(apply_source_deletes),
            "extra": keys_of(d for d in differences if getattr(d, "kind", None) == "extra"),
            "deleted_at_source": keys_of(d for d in differences if getattr(d, "kind", None) == DELETED_AT_SOURCE)}


def repair_keys(differences: Iterable[Any], apply_source_deletes: bool = False) -> list[list[str]]:
    """The keys a repair re-extracts: every differing row's, except those deleted at the source
    unless ``apply_source_deletes`` (without it the repair leaves them where they are)."""
    return keys_of(d for d in differences if apply_source_deletes or getattr(d, "kind", None) != DELETED_AT_SOURCE)


def window_for(spec: PipelineSpec, repaired: Window) -> Window:
    """From the pipeline's start to the repaired window's end, as a backfill (the watermark stays).
    A backfill reaches before the start: its repair then starts where the repaired window does."""
    start = Bound(spec.start)
    return Window(repaired.lo if repaired.lo.cursor < start.cursor else start, repaired.hi, backfill=True)


def key_types(cur, table: str, columns: list[str]) -> list[str]:
    """The SQL types of ``columns`` in ``table``, from the catalog."""
    types = {name: type_ for name, type_, _ in source_columns(cur, table)}
    missing = [c for c in columns if c not in types]
    if missing:
        raise RepairError(f"table {table} has no key column(s) {missing}")
    return [types[c] for c in columns]


def key_filter(columns: list[str], types: list[str], keys: list[list[str]]) -> str:
    """SQL condition: the row's key is one of ``keys``; each value cast to its column's type."""
    if len(columns) != len(types) or not columns:
        raise RepairError(f"key columns {columns} and types {types} do not match")
    for t in types:
        if not _TYPE.match(t):
            raise RepairError(f"key column type {t!r} is not one a repair can cast to")
    for key in keys:
        if len(key) != len(columns) or not all(isinstance(v, str) for v in key):
            raise RepairError(f"repair key {key!r} is not {len(columns)} text value(s) for {columns}")
    doc = json.dumps(keys, ensure_ascii=True)  # ASCII: no byte of it can end the literal but a quote
    picks = ", ".join(f"(k->>{i})::{t}" for i, t in enumerate(types))
    cols = ", ".join(quote(c) for c in columns)
    return f"({cols}) IN (SELECT {picks} FROM jsonb_array_elements('{doc.replace(chr(39), chr(39) * 2)}'::jsonb) k)"


def plan(spec: PipelineSpec, warehouse_conn, *, reconcile_run: str, repaired_batch: str | None, repaired: Window,
         differences: list[Any], complete: bool = True, apply_source_deletes: bool = False):
    """Record the repair batch for a reconciliation's ``differences`` (``complete``: the
    localisation found every differing row; ``apply_source_deletes``: rows deleted at the source
    after a batch loaded them are deleted from the target too); returns its ``batch.Plan``."""
    if not complete:
        raise RepairError(f"pipeline {spec.name}: the reconciliation stopped localising at {len(keys_of(differences))} "
                          "rows and more differ: a repair of some of them is not one; load the window again with a "
                          "backfill run")
    if not differences:
        raise RepairError(f"pipeline {spec.name}: the reconciliation found no differing rows: nothing to repair")
    keys = repair_keys(differences, apply_source_deletes)
    if not keys:
        raise RepairError(f"pipeline {spec.name}: the {len(keys_of(differences))} differing row(s) were deleted at the "
                          "source after a committed batch loaded them, and a repair deletes such rows only when asked. "
                          "Next: if the deletion is legitimate, run the reconciliation again with repair=true and "
                          "apply_source_deletes=true (each row is kept with its old values in "
                          "tidemark_control.repair_deletions); if not, restore the rows at the source")
    if len(keys) > MAX_KEYS:
        raise RepairError(f"pipeline {spec.name}: {len(keys)} rows differ, more than a repair re-loads "
                          f"({MAX_KEYS}): load the window again with a backfill run instead")
    window = window_for(spec, repaired)
    batch_id = batch_id_for(spec.name, reconcile_run)
    with warehouse_conn, warehouse_conn.cursor() as cur:
        ledger.record_repair_plan(cur, spec, batch_id, window, keys, repaired_batch, reconcile_run,
                                  deletes(differences, apply_source_deletes))
    return Plan(batch_id, window, reused=False, repair=True)


def load(spec: PipelineSpec, warehouse_conn, batch_id: str):
    """The ``batch.Plan`` of a planned repair batch of this pipeline (a run's ``repair_batch``), and
    the ledger's record of it (keys, what it repairs, the reconciliation run that found them)."""
    with warehouse_conn, warehouse_conn.cursor() as cur:
        found = ledger.repair(cur, batch_id)
    if found is None or found.pipeline != spec.name:
        raise RepairError(f"batch {batch_id} is not a repair batch of pipeline {spec.name} in the ledger: a repair "
                          f"is planned by tidemark_reconcile_{spec.name} with repair=true")
    return Plan(batch_id, found.window, reused=True, repair=True), found


def write_document(path, spec: PipelineSpec, source_conn, warehouse_conn, batch_id: str) -> None:
    """Write what the extract of a repair batch needs (``--repair-keys``): the key columns, their
    source types and the ledger's keys."""
    _, found = load(spec, warehouse_conn, batch_id)
    with source_conn, source_conn.cursor() as cur:
        types = key_types(cur, spec.table, list(spec.primary_key))
    Path(path).write_text(json.dumps({"columns": list(spec.primary_key), "types": types, "keys": found.repair_keys}))


def read_document(path, spec: PipelineSpec) -> dict[str, Any]:
    """A keys document from a file, checked against the spec's key columns."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise RepairError(f"repair keys document {path}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("columns") != list(spec.primary_key):
        raise RepairError(f"repair keys document {path}: its columns are not pipeline {spec.name}'s key "
                          f"{list(spec.primary_key)}")
    filter_from_document(doc)  # every check, before Spark reads anything
    return doc


def filter_from_document(doc: dict[str, Any]) -> str:
    """``key_filter`` of a document written by ``write_document`` (the extract job's side)."""
    if not isinstance(doc, dict) or set(doc) != {"columns", "types", "keys"}:
        raise RepairError("a repair keys document has exactly: columns, types, keys")
    return key_filter(list(doc["columns"]), list(doc["types"]), list(doc["keys"]))

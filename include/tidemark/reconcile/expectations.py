"""The declarative checks of a reconciliation, carried by Great Expectations 1.x on the warehouse side.

One expectation suite per pipeline, built from its spec: the key columns and ``reconcile.required``
are never null, ``reconcile.accepted_values`` hold, and the rows compared number what the source
holds. They run as one checkpoint over a query asset (the same rows the reconciliation compared)
and the checkpoint renders Data Docs into ``<root>/gx/uncommitted/data_docs/local_site/``.

The GX context is a file context under ``root``, built at run time (never at DAG parse time: the
import alone takes seconds). The warehouse connection string reaches GX through an environment
variable that the context's config names (``${TIDEMARK_GX_WAREHOUSE}``), so no password is written
to its files. Its progress bars are off (``quiet_progress_bars``): nothing of GX's progress reaches
a task log, where stderr counts as an error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tidemark.protocol.spec import PipelineSpec, quote

URL_ENV = "TIDEMARK_GX_WAREHOUSE"


@dataclass(frozen=True)
class Expected:
    check: str  # "gx:<expectation type>"
    subject: str  # its column(s), or ""
    expected: str
    actual: str
    passed: bool

    @property
    def difference(self) -> str | None:
        return None if self.passed else self.actual


def sqlalchemy_url(host: str, port: int | None, database: str, user: str, password: str) -> str:
    from urllib.parse import quote as escape

    return f"postgresql+psycopg2://{escape(user, safe='')}:{escape(password, safe='')}@{host}:{port or 5432}/{database}"


def quiet_progress_bars(context) -> None:
    """No "Calculating Metrics" progress bars: GX draws them with tqdm on stderr, which an Airflow
    task's log records at ERROR level, one line per refresh. Off in the context's config (the only
    switch GX reads: it passes ``disable=`` to tqdm itself, so ``TQDM_DISABLE`` cannot turn them off),
    and saved, so a context reopened from the same folder stays quiet too."""
    from great_expectations.data_context.types.base import ProgressBarsConfig

    current = context.variables.progress_bars
    if current is not None and current.get("globally") is False and current.get("metric_calculations") is False:
        return
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    context.variables.save()


def findings_query(failed: int) -> str:
    """The query of the expectation that carries Tidemark's own verdict into the Data Docs: one row per
    failed check (none: it passes), their text in the expectation's description only (a finding quotes
    source values: never SQL, and GX formats the query's braces). ``{batch}`` is named as GX asks, in a
    clause that reads nothing."""
    return (f"SELECT g AS failed_check FROM generate_series(1, {int(failed)}) g "
            "WHERE NOT EXISTS (SELECT FROM {batch} WHERE false)")


def validate(spec: PipelineSpec, where: str, source_rows: int, root: Path, url: str, run_name: str,
             findings: list[str] | None = None) -> tuple[list[Expected], Path]:
    """Run the pipeline's suite over ``SELECT * FROM target WHERE where``; the results, and the Data
    Docs index page. ``findings``: the reconciliation's own failed checks, one line each, carried by an
    expectation of their own, so a run whose verdict failed shows failed in the Data Docs too (GX's
    checks alone may all pass beside a sum that differs)."""
    import great_expectations as gx
    import great_expectations.expectations as gxe

    os.environ[URL_ENV] = url
    context = gx.get_context(mode="file", project_root_dir=str(root))
    quiet_progress_bars(context)
    source = context.data_sources.add_or_update_postgres(name="tidemark_warehouse",
                                                         connection_string="${" + URL_ENV + "}")
    # One asset, validation definition and checkpoint per pipeline, replaced at each run: the
    # context's config stays the same size however many runs there are (each run's results stay).
    asset_name = f"tidemark_{spec.name}"
    if asset_name in source.get_asset_names():
        source.delete_asset(asset_name)
    asset = source.add_query_asset(name=asset_name, query=f"SELECT * FROM {quote(spec.target_table)} WHERE {where}")
    batch = asset.add_batch_definition_whole_table("rows compared")
    suite = context.suites.add_or_update(gx.ExpectationSuite(name=f"tidemark_{spec.name}"))
    for existing in list(suite.expectations):
        suite.delete_expectation(existing)
    rec = spec.reconcile
    for column in dict.fromkeys([*spec.primary_key, *rec.required]):
        suite.add_expectation(gxe.ExpectColumnValuesToNotBeNull(column=column))
    for column, values in rec.accepted_values.items():
        suite.add_expectation(gxe.ExpectColumnValuesToBeInSet(column=column, value_set=[str(v) for v in values]))
    suite.add_expectation(gxe.ExpectTableRowCountToEqual(value=source_rows))
    findings = findings or []
    said = (f"{len(findings)} check(s) failed: " + "; ".join(findings[:5]))[:1000] if findings else "every check passed"
    suite.add_expectation(gxe.UnexpectedRowsExpectation(
        unexpected_rows_query=findings_query(len(findings)),
        description=f"Tidemark's reconciliation with the source (each unexpected row a failed check): {said}"))
    suite.save()
    definition = context.validation_definitions.add_or_update(
        gx.ValidationDefinition(name=asset_name, data=batch, suite=suite))
    checkpoint = context.checkpoints.add_or_update(gx.Checkpoint(
        name=asset_name, validation_definitions=[definition],
        actions=[gx.checkpoint.UpdateDataDocsAction(name="data_docs")], result_format={"result_format": "SUMMARY"}))
    result = checkpoint.run(run_id=gx.RunIdentifier(run_name=run_name))
    found = []
    for run in result.run_results.values():
        for item in run.results:
            config, outcome = item.expectation_config, item.result or {}
            kwargs = config.kwargs
            subject = kwargs.get("column") or ""
            if config.type == "unexpected_rows_expectation":
                continue  # Tidemark's own checks, in the verdict already
            if config.type == "expect_table_row_count_to_equal":
                found.append(Expected(f"gx:{config.type}", "", str(kwargs["value"]), str(outcome.get("observed_value")),
                                      bool(item.success)))
            elif config.type == "expect_column_values_to_not_be_null":
                found.append(Expected(f"gx:{config.type}", subject, "0 nulls",
                                      f"{outcome.get('unexpected_count', 0)} nulls", bool(item.success)))
            else:
                values = list(kwargs.get("value_set") or [])
                found.append(Expected(f"gx:{config.type}", subject, f"every value in {values}",
                                      f"{outcome.get('unexpected_count', 0)} rows outside", bool(item.success)))
    index = root / "gx" / "uncommitted" / "data_docs" / "local_site" / "index.html"
    offline_data_docs(index.parent, run_name)
    return found, index


def offline_data_docs(site: Path, run_name: str) -> None:
    """Data Docs that render with no internet: GX's pages load jQuery, Bootstrap, bootstrap-table and
    Font Awesome from CDNs (offline the index is blank: bootstrap-table draws its tables). The pages
    this run rendered or changed (index, suites, its validation page) are pointed at small local
    equivalents written into the site (``tidemark.reconcile.evidence.offline_site``); the evidence page serves
    the site the same way. A failure here costs only the offline view, never the verdict."""
    import logging

    from tidemark.reconcile.evidence import offline_site

    try:
        offline_site(site, run_name)
    except OSError as exc:
        logging.getLogger(__name__).warning("Data Docs in %s left as GX wrote them (CDN assets): %s", site, exc)

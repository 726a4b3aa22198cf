"""The reconciliation evidence pages, served beside the "Tidemark status" page (read-only).

``add_routes`` adds them to the status page's FastAPI app (``status_page.build_app``), so they sit
behind the same Airflow login, under ``/tidemark/evidence``:

- ``/tidemark/evidence/<pipeline>``: the batch of the pipeline's newest reconciliation (its last
  committed batch when none ran yet); ``/tidemark/evidence/<pipeline>/<batch id>`` one batch
  (``full``: the full-table reconciliations): the latest verdict's checks with expected and actual
  figures, the differing rows, every run of the batch and the repairs planned from them;
- ``/tidemark/evidence/_api/<pipeline>/<batch id>``: the same as JSON;
- ``/tidemark/evidence/_docs/...``: Great Expectations' Data Docs site, as static files, each page
  made to render offline (``tidemark.reconcile.evidence.offline_html``: its CDN scripts and styles inlined as
  small local equivalents) and sandboxed by its Content-Security-Policy: a Data Docs page shows
  warehouse values, so its scripts run in an origin of their own, never with the Airflow session;
- ``/tidemark/evidence/_reports/<pipeline>/<run id>/differences.csv`` (or ``.html``): a run's report.

A path that leaves its folder (``..``, a symbolic link out) is refused. Like the status page, this
module imports nothing heavy at Airflow's plugin import; the work is ``tidemark.reconcile.evidence``.
"""

# No ``from __future__ import annotations``: FastAPI reads the handlers' annotations (``Request``, imported
# in ``add_routes``) as objects, not as names to find in this module.
import logging
from pathlib import Path
from typing import Any

from tidemark.protocol.config import CONN_WAREHOUSE

EVIDENCE = "/evidence"  # under the status app's url_prefix: /tidemark/evidence
log = logging.getLogger(__name__)

# Our own pages: escaped text and inline styles, nothing to run. Data Docs: GX's inline scripts run,
# sandboxed (an opaque origin: no Airflow cookie, storage or same-origin API call reaches them).
PAGE_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; base-uri 'none'; form-action 'none'"
DOCS_CSP = ("sandbox allow-scripts allow-popups allow-popups-to-escape-sandbox; default-src 'none'; "
            "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src 'self' data:; font-src 'self'; "
            "base-uri 'none'; form-action 'none'")


def reconcile_root() -> Path:
    from tidemark.protocol.config import reconcile_dir

    return reconcile_dir()


def _session(conn) -> None:
    from tidemark.status import read_only_session

    read_only_session(conn)


def read_evidence(pipeline: str, batch_id: str | None, *, latest: bool = False):
    """``tidemark.reconcile.evidence.batch_evidence`` over a read-only warehouse session of its own; with
    ``latest`` the batch of the pipeline's newest reconciliation (or its last committed batch)."""
    from tidemark import ledger
    from tidemark.reconcile import evidence
    from tidemark_airflow.hooks import DatabaseHook

    conn = DatabaseHook.for_page(CONN_WAREHOUSE).get_conn()
    try:
        _session(conn)
        with conn.cursor() as cur:
            if not ledger.control_schema_exists(cur):
                raise evidence.NotFound("no batch yet: the warehouse has no control schema")
            if latest:
                newest = ledger.latest_reconciliation(cur, pipeline)
                if newest is not None:
                    batch_id = newest[0]
                else:
                    committed = ledger.last_committed(cur, pipeline)
                    if committed is None:
                        raise evidence.NotFound(f"pipeline {pipeline} has no committed batch yet")
                    batch_id = committed[0]
            return evidence.batch_evidence(cur, reconcile_root(), pipeline, batch_id)
    finally:
        conn.close()


def verdicts_for(report) -> dict[str, Any]:
    """{pipeline: ``tidemark.reconcile.evidence.VerdictLine``} of each pipeline's last committed batch on the
    status page ``report``; {} when the warehouse cannot tell (the cells then show the ledger's word)."""
    from tidemark.reconcile import evidence
    from tidemark.status import error_text
    from tidemark_airflow.hooks import DatabaseHook

    batches = {p.name: p.ledger.last_committed.batch_id for p in report.pipelines
               if not p.error and p.ledger.last_committed is not None}
    if not batches or report.warehouse_error or not report.control_schema:
        return {}
    try:
        conn = DatabaseHook.for_page(CONN_WAREHOUSE).get_conn()
        try:
            _session(conn)
            with conn.cursor() as cur:
                return evidence.verdict_lines(cur, reconcile_root(), batches)
        finally:
            conn.close()
    except Exception as exc:  # the verdicts' history is extra: the page still shows the ledger's word
        log.warning("Tidemark status: reconciliation history unavailable: %s", error_text(exc))
        return {}


def evidence_href(pipeline: str, batch_id: str | None, prefix: str = "/tidemark") -> str:
    """The evidence page of a batch, for links from other pages (``prefix``: the status app's mount)."""
    from tidemark.reconcile.evidence import batch_path

    return f"{prefix}{EVIDENCE}/{batch_path(pipeline, batch_id)}"


def links_for(request) -> Any:
    """Where an evidence page's links go, from the mount point the request came through."""
    from tidemark.reconcile import evidence

    root = request.scope.get("root_path", "")
    base = f"{root}{EVIDENCE}"
    site = evidence.data_docs_site(reconcile_root())
    return evidence.Links(status=f"{root}/", evidence=base, reports=f"{base}/_reports", docs=f"{base}/_docs",
                          docs_page=lambda run_id: evidence.docs_page(site, request.path_params.get("pipeline", ""),
                                                                      run_id))


def add_routes(app) -> None:
    """The evidence routes, on the status page's app (its login dependency covers them)."""
    add_file_routes(app)
    add_batch_routes(app)


def _page(text: str, status: int = 200):
    from fastapi.responses import HTMLResponse

    return HTMLResponse(text, status_code=status, headers={"Content-Security-Policy": PAGE_CSP})


def _missing(request, what: str):
    from tidemark.reconcile import evidence

    return _page(evidence.render_message("Tidemark evidence: not found", what,
                                         f"{request.scope.get('root_path', '')}/"), 404)


def _unavailable(request, exc: BaseException):
    from tidemark.reconcile import evidence
    from tidemark.status import error_text

    log.warning("Tidemark evidence unavailable: %s", error_text(exc))
    return _page(evidence.render_message("Tidemark evidence unavailable", error_text(exc),
                                         f"{request.scope.get('root_path', '')}/"), 503)


def add_file_routes(app) -> None:
    """The page's own assets, the offline Data Docs site and the reconciliation reports' files."""
    from fastapi import Request
    from fastapi.responses import FileResponse, HTMLResponse, Response

    from tidemark.protocol.spec import NAME_PATTERN
    from tidemark.reconcile import evidence

    @app.get(EVIDENCE + "/_assets/{name}")
    def asset(name: str):
        found = evidence.ASSETS.get(name)
        if found is None:
            return Response("no such asset", status_code=404, media_type="text/plain")
        return Response(found[1], media_type=found[0], headers={"Cache-Control": "max-age=3600"})

    @app.get(EVIDENCE + "/_docs/{path:path}")
    def docs(path: str, request: Request):
        site = evidence.data_docs_site(reconcile_root())
        target = evidence.safe_file(site, path or "index.html")
        if target is None:
            return _missing(request, f"no Data Docs page {path!r} in {site}")
        headers = {"Content-Security-Policy": DOCS_CSP}
        if target.suffix.lower() in (".html", ".htm"):
            base = f"{request.scope.get('root_path', '')}{EVIDENCE}"
            text = evidence.offline_html(target.read_text(errors="replace"), None, f"{base}/_docs/static/images/")
            return HTMLResponse(text, headers=headers)
        return FileResponse(target, headers=headers)

    @app.get(EVIDENCE + "/_reports/{pipeline}/{run_id}/{name}")
    def report(pipeline: str, run_id: str, name: str, request: Request):
        target = None
        if NAME_PATTERN.fullmatch(pipeline) and evidence.RUN_ID.match(run_id) and name in evidence.REPORT_FILES:
            target = evidence.safe_file(reconcile_root() / "reports", f"{pipeline}/{run_id}/{name}")
        if target is None:
            return _missing(request, f"no report {name!r} of run {run_id!r} of pipeline {pipeline!r}")
        if name.endswith(".csv"):
            return FileResponse(target, media_type="text/csv", filename=f"{pipeline}-{run_id}-{name}")
        return _page(target.read_text(errors="replace"))


def add_batch_routes(app) -> None:
    """A batch's evidence, as a page and as JSON (its latest batch, one batch, or the full
    reconciliation)."""
    from fastapi import Request
    from fastapi.responses import JSONResponse

    from tidemark.protocol.spec import NAME_PATTERN
    from tidemark.reconcile import evidence
    from tidemark.status import error_text, jsonable

    @app.get(EVIDENCE + "/_api/{pipeline}/{batch_id:path}")
    def api(pipeline: str, batch_id: str):
        if not NAME_PATTERN.fullmatch(pipeline):
            return JSONResponse({"error": f"no pipeline {pipeline!r}"}, status_code=404)
        try:
            found = read_evidence(pipeline, None if batch_id == evidence.FULL else batch_id)
        except evidence.NotFound as exc:
            return JSONResponse({"error": str(exc)}, status_code=404)
        except Exception as exc:
            return JSONResponse({"error": error_text(exc)}, status_code=503)
        return JSONResponse(jsonable(found))

    def show(request: Request, pipeline: str, batch_id: str | None, latest: bool = False):
        if not NAME_PATTERN.fullmatch(pipeline):
            return _missing(request, f"no pipeline {pipeline!r}")
        try:
            found = read_evidence(pipeline, batch_id, latest=latest)
        except evidence.NotFound as exc:
            return _missing(request, str(exc))
        except Exception as exc:  # the warehouse down, a query refused: say so rather than a bare 500
            return _unavailable(request, exc)
        return _page(evidence.render_batch(found, links_for(request), reconcile_root()))

    @app.get(EVIDENCE + "/{pipeline}")
    def latest_batch(pipeline: str, request: Request):  # sync handlers: the thread pool runs the queries
        return show(request, pipeline, None, latest=True)

    @app.get(EVIDENCE + "/{pipeline}/{batch_id:path}")
    def one_batch(pipeline: str, batch_id: str, request: Request):
        return show(request, pipeline, None if batch_id == evidence.FULL else batch_id)


def build_app(*, login: bool = True):
    """The evidence routes alone, on an app of their own (tests; ``login=False``: no Airflow login,
    for a browser in a test to load them)."""
    from fastapi import Depends, FastAPI

    dependencies = []
    if login:
        from airflow.api_fastapi.core_api.security import get_user

        dependencies = [Depends(get_user)]
    app = FastAPI(title="Tidemark evidence", dependencies=dependencies, docs_url=None, redoc_url=None,
                  openapi_url=None)
    add_routes(app)
    return app

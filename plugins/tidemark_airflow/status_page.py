"""The "Tidemark status" page in the Airflow UI: one row per pipeline, read-only.

Airflow imports every ``.py`` file under the plugins folder as a top-level module, in the API
server and in every task process alike, so this module stays cheap: FastAPI, Airflow's API
security and the queries (``tidemark.status``) are imported on the page's first request, and
connections are resolved per request. The page is served by the API server under ``/tidemark``
(HTML at ``/tidemark/``, the same data as JSON at ``/tidemark/api/status``) and requires an
Airflow login like the rest of the API (Airflow's ``get_user``: JWT cookie or bearer token).
"""

from __future__ import annotations

import html
import logging
from datetime import datetime, timezone
from typing import Any

from airflow.plugins_manager import AirflowPlugin

from tidemark.protocol.config import CONN_WAREHOUSE

URL_PREFIX = "/tidemark"
NAME = "Tidemark status"
log = logging.getLogger(__name__)


def broker_bootstrap() -> str | BaseException:
    """The broker the pipelines use (the Kafka connection's bootstrap servers), or why it cannot be read."""
    from tidemark_airflow.hooks import KafkaHook

    try:
        return KafkaHook().bootstrap()
    except Exception as exc:  # a missing connection or extra: shown as the broker's health, not a failed page
        return exc


def connect_client() -> Any:
    """Kafka Connect's client for the CDC pipelines' connector states, or why it cannot be made."""
    from tidemark.status import CHECK_TIMEOUT_S
    from tidemark_airflow.hooks import ConnectHook

    try:
        return ConnectHook().client(timeout_s=CHECK_TIMEOUT_S)
    except Exception as exc:  # a missing connection: shown on the CDC pipeline's line, not a failed page
        return exc


def spark_master() -> str | BaseException:
    """The Spark master the jobs are submitted to (the ``tidemark_spark`` connection, read as the Spark
    provider reads it: ``SparkHook.cluster``), or why it cannot be read."""
    from tidemark_airflow.hooks import SparkHook

    try:
        return SparkHook().cluster().master
    except Exception as exc:  # shown as the master's health, not a failed page
        return exc


def current_status():
    from tidemark.protocol.config import pipelines_dir
    from tidemark.status import collect, health_file, load_pipelines
    from tidemark_airflow.hooks import DatabaseHook

    directory = pipelines_dir()
    entries = load_pipelines(directory)
    return collect(entries, None, lambda conn_id: DatabaseHook.for_page(conn_id).get_conn(),
                   open_warehouse=DatabaseHook.for_page(CONN_WAREHOUSE).get_conn,
                   kafka_bootstrap=broker_bootstrap(), health_path=health_file(), pipelines_directory=directory,
                   connect=connect_client() if any(e.spec and e.spec.cdc for e in entries) else None,
                   spark_master=spark_master())


# --- HTML -------------------------------------------------------------------------------------

def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _attempts(attempts, *, with_message: bool) -> str:
    from tidemark.status import utc_iso

    if not attempts:
        return ""
    items = []
    for a in attempts:
        when = a.finished_at or a.begun_at
        text = f"{_e(a.batch_id)} #{a.attempt} <b>{_e(a.state)}</b> {_e(utc_iso(when))}"
        if a.staged is not None:
            text += f"<br><small>{_e(a.staged_text())}</small>"
        if with_message and a.message:
            text += f"<br><span class=msg>{_e(a.message)}</span>"
        items.append(f"<li>{text}</li>")
    return f"<ul>{''.join(items)}</ul>"


def _lag(p) -> str:
    from tidemark.status import format_duration

    if p.lag is None:
        return "no batch yet"
    if p.lag.error:
        return f"<span class=bad>{_e(p.lag.error)}</span>"
    if p.lag.ids is not None:
        return f"{p.lag.ids} ids" + _snapshot(p.lag)
    text = _e(format_duration(p.lag.seconds))
    text += " <span class=warn>held back by an open or prepared source transaction</span>" if p.lag.held_back else ""
    return text + _snapshot(p.lag)


def _snapshot(lag) -> str:
    """An extract holding its snapshot of the source now (issue 52), warned about past half its limit."""
    said = lag.snapshot_text()
    if not said:
        return ""
    warn = lag.snapshot_limit_s and lag.snapshot_held_s > lag.snapshot_limit_s / 2
    return f" <span class={'warn' if warn else 'ok'}>{_e(said)}</span>"


def _pipeline_row(p, now=None, verdict=None) -> str:
    from tidemark.reconcile.evidence import verdict_link
    from tidemark.status import utc_iso
    from tidemark_airflow.evidence_page import evidence_href

    name = f"<td title='{_e(p.spec_path)}'><b>{_e(p.name)}</b></td>"
    if p.error:
        return f"<tr class=invalid>{name}<td colspan=10 class=bad>invalid spec: {_e(p.error)}</td></tr>"
    led = p.ledger
    c = led.last_committed
    if c is None:
        batch = "<td colspan=4>no batch yet</td>"
    else:
        batch = (f"<td>{_e(c.batch_id)} #{_e(c.attempt)}</td><td>{_e(c.window)}</td>"
                 f"<td class=num>{_e(c.rows)}</td><td>{_e(utc_iso(c.committed_at))}<br>"
                 f"{verdict_link(evidence_href(p.name, c.batch_id, URL_PREFIX), verdict, c.reconciliation)}</td>")
    w = led.watermark
    watermark = f"{_e(w.bound)}<br><small>by {_e(w.batch_id)}</small>" if w else "no batch yet"
    failures = _attempts(led.recent_failures, with_message=True) or "none"
    last = led.last_failure
    last_failure = (f"{_e(utc_iso(last.finished_at or last.begun_at))} {_e(last.batch_id)} #{last.attempt} "
                    f"<b>{_e(last.state)}</b><br><span class=msg>{_e(last.message)}</span>") if last else ""
    pending = (f"<span class=bad>{_e(led.dead_letters_pending)}</span><br><small>oldest from "
               f"{_e(utc_iso(led.oldest_pending_reject))}</small>") if led.dead_letters_pending else "none"
    return (f"<tr>{name}{batch}<td>{watermark}</td><td>{_lag(p)}</td>"
            f"<td>{_attempts(led.unfinished, with_message=False) or 'none'}</td>"
            f"<td>{failures}</td><td>{last_failure}</td><td class=num>{pending}</td></tr>"
            + _held_rows(p, now))


def _held_rows(p, now) -> str:
    """One row under the pipeline's per thing that holds it: what, since when, and the next step."""
    from tidemark.status import format_duration, utc_iso

    rows = []
    for h in p.held_by:
        since = f" since {_e(utc_iso(h.since))}" if h.since else ""
        if h.since and now:
            since += f" ({_e(format_duration(now - h.since))})"
        rows.append(f"<tr class=held><td></td><td colspan=10><span class=bad>held by: {_e(h.what)}</span>{since}, "
                    f"next: {_e(h.next)}</td></tr>")
    return "".join(rows)


def _health(report) -> str:
    """The broker and the databases: reachable, or since when not (the first failed check) and what to do."""
    from tidemark.status import format_duration, utc_iso

    if not report.health:
        return ""
    rows = []
    for h in report.health:
        if h.reachable:
            state, since, step = "<span class=ok>reachable</span>", "", ""
        else:
            state = "<span class=bad>unreachable</span>"
            since = (f"{_e(utc_iso(h.since))}<br><small>{_e(format_duration(report.generated_at - h.since))} ago"
                     f"{', last reachable ' + _e(utc_iso(h.last_ok)) if h.last_ok else ''}</small>") if h.since else ""
            step = f"<span class=msg>{_e(h.error)}</span><br>next: {_e(h.next_step)}"
        rows.append(f"<tr class={'up' if h.reachable else 'down'}><td><b>{_e(h.component)}</b></td>"
                    f"<td><code>{_e(h.address or h.conn_id)}</code></td><td>{state}</td><td>{since}</td>"
                    f"<td>{step}</td></tr>")
    return ("<table id=health><tr><th>component</th><th>address</th><th>state</th><th>unreachable since (UTC)</th>"
            "<th>error and next step</th></tr>" + "".join(rows) + "</table>")


def _source_section(s) -> str:
    from tidemark.status import format_duration, utc_iso

    head = f"<h3>Source <code>{_e(s.conn_id)}</code></h3>"
    if s.error:
        return head + f"<p class=bad>{_e(s.error)}</p>"
    parts = [head, f"<p>source clock {_e(utc_iso(s.now))}</p>"]
    x = s.oldest_open_xact
    if x is None:
        parts.append("<p>no open transaction: windows end at the source clock minus the safe lag</p>")
    else:
        parts.append(
            "<p>oldest open transaction (the clamp: no window ends after its start)</p>"
            "<table><tr><th>pid</th><th>application_name</th><th>usename</th><th>client_addr</th><th>state</th>"
            "<th>xact_start (UTC)</th><th>age</th></tr>"
            f"<tr class=clamp><td>{x.pid}</td><td>{_e(x.application_name)}</td><td>{_e(x.usename)}</td>"
            f"<td>{_e(x.client_addr)}</td><td>{_e(x.state)}</td><td>{_e(utc_iso(x.xact_start))}</td>"
            f"<td>{_e(format_duration(x.age))}</td></tr></table>"
        )
    t = s.oldest_prepared
    if t is not None:
        parts.append(
            "<p class=warn>prepared transaction: every window is held at its watermark until it is committed or "
            "rolled back (COMMIT PREPARED / ROLLBACK PREPARED)</p>"
            "<table><tr><th>gid</th><th>owner</th><th>prepared (UTC)</th><th>prepared in all</th></tr>"
            f"<tr class=clamp><td>{_e(t.gid)}</td><td>{_e(t.owner)}</td><td>{_e(utc_iso(t.prepared))}</td>"
            f"<td>{t.count}</td></tr></table>")
    return "".join(parts)


def _orphans(report) -> str:
    from tidemark.status import format_bytes

    if not report.orphan_stage_tables:
        return "<p>none</p>"
    rows = "".join(
        f"<tr><td><code>{_e(t.table)}</code></td><td>{_e(t.pipeline or '?')}</td><td>{_e(t.batch_id or 'unknown')}</td>"
        f"<td>{_e(t.attempt)}</td><td>{_e(t.state or 'no such attempt')}</td><td class=num>{_e(format_bytes(t.bytes))}</td></tr>"
        for t in report.orphan_stage_tables)
    return ("<table><tr><th>table</th><th>pipeline</th><th>batch</th><th>attempt</th><th>attempt state</th>"
            f"<th>size</th></tr>{rows}</table>")


STYLE = """
body{font-family:system-ui,sans-serif;font-size:14px;margin:1em;color:#222}
table{border-collapse:collapse;margin-bottom:1em}th,td{border:1px solid #ccc;padding:4px 6px;vertical-align:top;text-align:left}
td{overflow-wrap:anywhere}
th{background:#f3f3f3}td.num{text-align:right}ul{margin:0;padding-left:1.1em}.msg{color:#555;font-size:12px}
.bad{color:#b00020}.warn{color:#a05a00}small{color:#666}.ok{color:#1b5e20}tr.held td{border-top:none;background:#fff4f4}
"""

LEGEND = """<p><small>
<b>Window</b> (lo, hi]: the cursor range the batch loaded. <b>Watermark</b>: everything up to it is in the
warehouse. <b>Lag</b>: source clock minus the watermark (timestamp cursors), or ids not loaded yet (id
cursors). <b>Unfinished</b>: attempts open or sealed, waiting for the sink. <b>Failures</b>: attempts
refused or aborted in the last 7 days. Orphaned stage tables belong to finished or unknown attempts; the
pipeline's next sink start drops those it knows. All times UTC.</small></p>"""


def _streams(streams, *, broker_down: bool = False) -> str:
    """Standing sinks: desired state (who, when, why), the instance's beat and progress, restarts.
    With the broker down, the lag of the last beat is no news: it says so."""
    from tidemark.status import format_duration, utc_iso

    if not streams:
        return ""
    now = datetime.now(timezone.utc)
    rows = []
    for t in streams:
        if t.crash_looping_since:
            state = (f"<span class=bad>crash-looping since {_e(utc_iso(t.crash_looping_since))}</span>: run "
                     "<code>tidemark_stream_control</code> with action=clear once fixed")
        elif t.heartbeat_at is None:
            state = "never started"
        elif t.ended_at is not None:
            state = f"stopped at {_e(utc_iso(t.ended_at))}"
        else:
            state = f"beat {_e(format_duration(now - t.heartbeat_at))} ago ({_e(t.holder)}, fence {t.fence})"
        who = f"<br><small>by {_e(t.changed_by)} {_e(utc_iso(t.changed_at))} {_e(t.reason)}</small>" if t.changed_by else ""
        lag = ", ".join(f"p{p}: {n}" if str(p).isdigit() else f"{p}: {n}"
                        for p, n in sorted((t.lag or {}).items())) or "-"
        serving = (f"<code>{_e(t.serving_view)}</code> complete up to {_e(utc_iso(t.complete_up_to)) or '-'}"
                   if t.serving_view else "-")
        if t.capture is not None:  # a CDC pipeline: its handoff, last position applied and slot
            serving += f"<br><small class=capture>capture: {_capture(t.capture)}</small>"
        lag = _e(lag)
        if broker_down:
            lag = f"<span class=bad>unknown: broker unreachable</span><br><small>at its last beat: {lag}</small>"
        rows.append(f"<tr><td><b>{_e(t.pipeline)}</b></td><td>{_e(t.desired)}{who}</td><td>{state}</td>"
                    f"<td>{_e(utc_iso(t.progress_at)) or '-'}</td><td class=num>{_e(t.records)}</td><td>{lag}</td>"
                    f"<td class=num>{t.restarts}/{t.restart_budget}</td><td>{serving}</td></tr>")
    return ("<h3>Standing sinks</h3><table id=streams><tr><th>pipeline</th><th>desired</th><th>instance</th>"
            "<th>last progress (UTC)</th><th>records read</th><th>lag (records)</th><th>restarts</th>"
            "<th>serving view (UTC)</th></tr>"
            + "".join(rows) + "</table>")


def _capture(capture) -> str:
    """A waiting re-snapshot in amber (asked for: attention, not a fault), then the capture's state, red
    when a person must look at it."""
    waiting = capture.resnapshot_text()
    state = f"<span{' class=bad' if capture.is_bad() else ''}>{_e(capture.state_text())}</span>"
    return f"<span class=warn>{_e(waiting)}</span>; {state}" if waiting else state


def render_html(report, verdicts=None) -> str:
    from tidemark.status import utc_iso

    head = ("<tr><th>pipeline</th><th>last committed batch</th><th>window</th><th>rows</th><th>committed at (UTC)</th>"
            "<th>watermark</th><th>lag</th><th>unfinished attempts</th><th>failures (7 days)</th><th>last failure</th>"
            "<th title='rejects committed, not yet in the dead-letter topic: the sink sends them at its next flush'>"
            "dead letters waiting</th></tr>")
    rows = "".join(_pipeline_row(p, report.generated_at, (verdicts or {}).get(p.name)) for p in report.pipelines)
    if not report.pipelines:
        rows = "<tr><td colspan=11>no pipeline specs</td></tr>"
    if report.warehouse_error:
        note = (f"<p class=bad>status unavailable: the warehouse does not answer ({_e(report.warehouse_error)}): "
                "no ledger to show</p>")
    else:
        note = "" if report.control_schema else "<p>no batch yet: the warehouse has no control schema</p>"
    return (
        f"<!doctype html><html><head><meta charset=utf-8><title>{_e(NAME)}</title><style>{STYLE}</style></head><body>"
        f"<h2>{_e(NAME)}</h2><p><small>{_e(utc_iso(report.generated_at))}, specs in "
        f"<code>{_e(report.pipelines_dir)}</code></small></p>{note}"
        + _health(report)
        + f"<table id=pipelines>{head}{rows}</table>"
        + _streams(report.streams, broker_down=report.broker_down())
        + "".join(_source_section(s) for s in report.sources)
        + f"<h3>Orphaned stage tables</h3>{_orphans(report)}{LEGEND}</body></html>"
    )


def render_error(exc: BaseException) -> str:
    from tidemark.status import error_text

    return (f"<!doctype html><html><head><meta charset=utf-8><title>{_e(NAME)}</title><style>{STYLE}</style></head>"
            f"<body><h2>{_e(NAME)}</h2><p class=bad>status unavailable: {_e(error_text(exc))}</p></body></html>")


# --- the app and the plugin -------------------------------------------------------------------

def build_app():
    from airflow.api_fastapi.core_api.security import get_user
    from fastapi import Depends, FastAPI
    from fastapi.responses import HTMLResponse, JSONResponse

    from tidemark.status import error_text
    from tidemark_airflow.evidence_page import add_routes as add_evidence_routes
    from tidemark_airflow.evidence_page import verdicts_for

    app = FastAPI(title=NAME, dependencies=[Depends(get_user)], docs_url=None, redoc_url=None, openapi_url=None)

    # The warehouse down: the page still answers, with the health of each component, as a 503 (the
    # ledger cannot be read); the JSON then also carries "error", as any failure of the page does.
    @app.get("/", response_class=HTMLResponse)
    def page():  # sync: runs in the thread pool, the queries block
        try:
            report = current_status()
            return HTMLResponse(render_html(report, verdicts_for(report)),
                                status_code=503 if report.warehouse_error else 200)
        except Exception as exc:  # anything else: say so rather than a bare 500
            log.warning("Tidemark status unavailable: %s", error_text(exc))
            return HTMLResponse(render_error(exc), status_code=503)

    @app.get("/api/status")
    def api_status():
        try:
            report = current_status()
        except Exception as exc:
            return JSONResponse({"error": error_text(exc)}, status_code=503)
        if report.warehouse_error:
            return JSONResponse({**report.to_json(), "error": f"warehouse unreachable: {report.warehouse_error}"},
                                status_code=503)
        return report.to_json()

    add_evidence_routes(app)  # /tidemark/evidence/...: the verdicts' evidence, behind the same login
    return app


class BuiltOnFirstRequest:
    """An ASGI app that builds the real one when it is first called (see the module docstring)."""

    def __init__(self, factory):
        self._factory = factory
        self._app = None

    async def __call__(self, scope, receive, send):
        if self._app is None:
            self._app = self._factory()
        await self._app(scope, receive, send)


class TidemarkStatusPlugin(AirflowPlugin):
    name = "tidemark_status"
    fastapi_apps = [{"app": BuiltOnFirstRequest(build_app), "url_prefix": URL_PREFIX, "name": NAME}]
    # url_route: shown inside the UI (an iframe at /plugin/tidemark-status); no category: top nav
    external_views = [{"name": NAME, "href": f"{URL_PREFIX}/", "destination": "nav", "url_route": "tidemark-status"}]

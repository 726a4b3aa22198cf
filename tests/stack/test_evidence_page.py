"""The evidence page against a real reconciled batch (real PostgreSQL, Kafka, Spark, Great Expectations).

A committed batch's target row is changed by a cent; its reconciliation (as the DAG runs it, with
Great Expectations' Data Docs) fails, then a repair batch re-loads the key and the second verdict
passes. Through Airflow's own API app (plugins mounted, login enforced; no Airflow service is
started) the evidence page must show the failing checks with both figures, the differing row, the
finding kept after the repair, and the Data Docs, which must load nothing from another machine: in
headless Chromium (the evidence routes alone, served on a free local port) the index's tables are
drawn from its own data.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from urllib.parse import quote

import pytest

from tidemark import reconcile
from tidemark.reconcile import evidence
from tidemark_workshop.stack.batchrun import PAYMENTS_DDL, insert_payments, make_pipeline

pytestmark = pytest.mark.stack

RECONCILE = {"control_totals": [{"columns": ["amount"], "group_by": ["currency"]}],
             "accepted_values": {"currency": ["EUR", "USD"]}}
EXTERNAL_ASSET = re.compile(r"<(?:script|link|img)\b[^>]*?\b(?:src|href)\s*=\s*[\"']?(?:https?:)?//(?!127\.0\.0\.1[:/])",
                            re.I)


def _reconcile(pipe, root, url, batch_id) -> reconcile.Outcome:
    src, wh = pipe.src(), pipe.wh()
    try:
        return reconcile.run(pipe.spec, src, wh, root, batch_id=batch_id, warehouse_url=url, code_version="test")
    finally:
        src.close()
        wh.close()


@pytest.fixture(scope="module")
def airflow_api():
    """Airflow's API server app as `airflow api-server` builds it, in this process (no server)."""
    from airflow.api_fastapi.app import create_app
    from fastapi.testclient import TestClient

    with TestClient(create_app("core")) as client:
        yield client


def _get(client, path: str) -> str:
    response = client.get(path)
    assert response.status_code == 200, (path, response.status_code, response.text[-2000:])
    return response.text


def test_the_evidence_page_shows_the_finding_its_row_the_repair_and_offline_data_docs(
        settings, tmp_path, monkeypatch, airflow_api, bootstrap):
    from tidemark.reconcile.expectations import sqlalchemy_url
    from tidemark_workshop.settings import WAREHOUSE_DB

    pipe = make_pipeline(settings, tmp_path, PAYMENTS_DDL, write_mode="append_window_replace", reconcile=RECONCILE)
    name = pipe.spec.name
    insert_payments(pipe, 1, 60)
    plan, _ = pipe.run("run-1")
    wh = pipe.wh()
    with wh, wh.cursor() as cur:  # a stray manual fix in the warehouse
        cur.execute(f"UPDATE {pipe.spec.target_table} SET amount = amount + 0.01 WHERE id = 17")
    wh.close()

    root = tmp_path / "reconcile"
    url = sqlalchemy_url(settings.pg_host, settings.pg_port, WAREHOUSE_DB, settings.pg_user, settings.pg_password)
    first = _reconcile(pipe, root, url, plan.batch_id)
    assert not first.verdict.passed and [(d.key[0], d.kind) for d in first.verdict.differences] == [(17, "changed")]
    monkeypatch.setenv("TIDEMARK_RECONCILE_DIR", str(root))
    monkeypatch.setenv("TIDEMARK_PIPELINES_DIR", str(tmp_path))

    # the finding: the failing checks with expected and actual figures, the row, the report, the Data Docs
    batch_page = f"/tidemark/evidence/{name}/{quote(plan.batch_id, safe='')}"
    page = _get(airflow_api, batch_page)
    assert page == _get(airflow_api, f"/tidemark/evidence/{name}")  # the newest reconciliation's batch
    found_at = evidence.when(max(r[-1] for r in pipe.query_wh(
        "SELECT run_id::text, checked_at FROM tidemark_control.reconciliation_results WHERE run_id = %s",
        (first.run_id,))))
    assert f"<p class='verdict bad' id=verdict><b>found 1 difference at {found_at}</b></p>" in page, page
    total = next(c for c in first.verdict.checks if c.check.startswith("control_total") and not c.passed)
    assert (f"<td>{total.check}</td><td>{total.subject}</td><td>{total.expected}</td><td>{total.actual}</td>"
            f"<td>{total.difference}</td><td class=bad>FAIL</td>") in page
    assert "<td>hash_total</td>" in page and "<h3>Latest verdict: 2 of" in page
    rows = page.split("<table id=rows>")[1].split("</table>")[0]
    assert "<td><b>17</b></td><td>changed</td><td>amount</td><td>source</td>" in rows
    assert "<td class=differs>6.29</td>" in rows and "<td class=differs>6.30</td>" in rows  # 17 * 0.37, + 0.01
    assert f"/tidemark/evidence/_reports/{name}/{first.run_id}/differences.csv" in page
    report = _get(airflow_api, f"/tidemark/evidence/_reports/{name}/{first.run_id}/differences.csv")
    assert report.splitlines()[0].startswith("key,kind,side,differing_columns") and "17,changed" in report

    docs_link = re.search(r"href='(/tidemark/evidence/_docs/validations/[^']+)'>this run's Data Docs", page)
    assert docs_link and first.run_id in docs_link[1], page
    index = airflow_api.get("/tidemark/evidence/_docs/index.html")
    assert index.status_code == 200 and index.headers["content-security-policy"].startswith("sandbox allow-scripts")
    assert first.run_id in index.text and not EXTERNAL_ASSET.search(index.text), EXTERNAL_ASSET.search(index.text)
    validation = _get(airflow_api, docs_link[1])
    assert not EXTERNAL_ASSET.search(validation) and "currency" in validation and "Must have exactly" in validation
    on_disk = (evidence.data_docs_site(root) / "index.html").read_text()  # opened from disk, offline too
    assert not EXTERNAL_ASSET.search(on_disk) and "static/tidemark/tidemark-datadocs.js" in on_disk

    data = airflow_api.get(f"/tidemark/evidence/_api/{name}/{quote(plan.batch_id, safe='')}").json()
    assert data["verdict"]["state"] == "differences" and [r["run_id"] for r in data["runs"]] == [first.run_id]
    assert data["rows"][0]["key"] == "17" and data["rows"][0]["columns"] == ["amount"]

    # the repair: a new batch re-loads the key, the second verdict passes; the finding stays in view
    fixed, _ = pipe.repair(first)
    second = _reconcile(pipe, root, url, fixed.batch_id)
    assert second.verdict.passed and second.after_repair == fixed.batch_id
    page = _get(airflow_api, batch_page)
    verdict = re.search(r"<p class='verdict ok' id=verdict><b>([^<]+)</b></p>", page)
    assert verdict and verdict[1].startswith(f"found 1 difference at {found_at}; repaired and reconciled at "), page
    assert "<h3>Latest verdict: reconciled</h3>" in page and f"Checks that failed at {found_at}" in page
    assert "<td><b>17</b></td><td>changed</td>" in page  # the differing row, kept as evidence
    history = page.split("<table id=history>")[1].split("</table>")[0]
    assert history.index(second.run_id) < history.index(first.run_id) and f"repair batch {fixed.batch_id}" in history
    assert _get(airflow_api, f"/tidemark/evidence/{name}/{quote(fixed.batch_id, safe='')}").count(verdict[1]) == 1

    # the status page links the last verdict, with its history, to this page
    status = _get(airflow_api, "/tidemark/")
    assert f"<a class=evidence href='{batch_page}'>{verdict[1]}</a>" in status, status[-3000:]

    _in_chromium(settings, name, plan.batch_id, first.run_id)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _in_chromium(settings, name: str, batch_id: str, run_id: str) -> None:
    """The Data Docs index and the evidence page in headless Chromium, served by the evidence routes
    alone (no login, a free local port, stopped after): the index's tables drawn offline."""
    import uvicorn

    from tidemark_airflow.evidence_page import build_app

    exe = shutil.which("chromium")
    if exe is None:
        pytest.skip("Debian's chromium is missing (stack/bootstrap.sh installs it when run as root)")
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(login=False), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "the evidence app did not start"
            time.sleep(0.1)
        base = f"http://127.0.0.1:{port}/evidence"
        shots = settings.state_dir / "screenshots"
        shots.mkdir(parents=True, exist_ok=True)
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--virtual-time-budget=10000", "--window-size=1400,1000"]
        with tempfile.TemporaryDirectory() as profile:
            subprocess.run([exe, *flags, f"--user-data-dir={profile}/a", f"--screenshot={shots}/evidence-data-docs.png",
                            f"{base}/_docs/index.html"], capture_output=True, timeout=120, check=True)
            dom = subprocess.run([exe, *flags, f"--user-data-dir={profile}/b", "--dump-dom", f"{base}/_docs/index.html"],
                                 capture_output=True, text=True, timeout=120, check=True).stdout
            page = subprocess.run([exe, *flags, f"--user-data-dir={profile}/c", f"--screenshot={shots}/evidence-page.png",
                                   f"{base}/{name}/{quote(batch_id, safe='')}"], capture_output=True, timeout=120,
                                  check=True)
        assert page.returncode == 0 and (shots / "evidence-page.png").stat().st_size > 10_000
        # bootstrap-table's job, done offline: the validation runs' table drawn from the page's data
        bodies = re.findall(r"<tbody>(.*?)</tbody>", dom, re.S)
        assert any(run_id in b and 'class="clickable-row"' in b for b in bodies), dom[-3000:]
        assert (shots / "evidence-data-docs.png").stat().st_size > 10_000
    finally:
        server.should_exit = True
        thread.join(timeout=30)

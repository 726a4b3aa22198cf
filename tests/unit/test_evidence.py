"""The evidence page's pure parts: verdict history, differing rows from a report, HTML, and Data Docs offline."""

from __future__ import annotations

import importlib.util
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest

from tidemark.reconcile import evidence
from tidemark.reconcile.evidence import DifferingRow, Links, RepairBatch, findings, runs_from_results, verdict_line

T0 = datetime(2026, 11, 25, 8, 0, tzinfo=timezone.utc)
RUN_A, RUN_B, RUN_C = ("00000000-0000-0000-0000-00000000000a", "00000000-0000-0000-0000-00000000000b",
                       "00000000-0000-0000-0000-00000000000c")


def _results(run_id: str, minutes: int, *, failed: tuple[str, ...] = (), rows: tuple[int, int] = (100, 100),
             batch: str | None = "p:run-1", extra: list[tuple] = ()) -> list[dict]:
    checks = [("unique_keys", "id", "unique", "enforced by p_tgt_pkey", None),
              ("row_count", "", str(rows[0]), str(rows[1]), None if rows[0] == rows[1] else str(rows[1] - rows[0])),
              ("hash_total", "", "123", "123" if "hash_total" not in failed else "456",
               None if "hash_total" not in failed else "333"),
              ("control_total amount by currency", "EUR", "10.00", "10.01" if "control_total" in failed else "10.00",
               "0.01" if "control_total" in failed else None), *extra]
    out = []
    for name, subject, expected, actual, difference in checks:
        passed = name.split(" ")[0] not in failed
        out.append({"run_id": run_id, "pipeline": "p", "batch_id": batch, "attempt": 1,
                    "scope": "batch" if batch else "full",
                    "window_lo": {"cursor": "2026-11-24T00:00:00+00:00", "pk": None},
                    "window_hi": {"cursor": "2026-11-25T00:00:00+00:00", "pk": None}, "check_name": name,
                    "subject": subject, "expected": expected, "actual": actual, "difference": difference,
                    "verdict": "pass" if passed else "fail", "tolerance": 0, "tolerance_reason": None,
                    "checked_at": T0 + timedelta(minutes=minutes), "code_version": "abc123"})
    return out


def _repair(found_by: str, state: str = "committed", minutes: int = 5, keys=(["10"],)) -> RepairBatch:
    return RepairBatch(f"p:repair__{found_by}", "p:run-1", found_by, state, [list(k) for k in keys],
                       T0 + timedelta(minutes=minutes - 1), T0 + timedelta(minutes=minutes) if state == "committed" else None)


def _line(results: list[dict], repairs=(), rows: int | None = 1):
    runs = runs_from_results(results)
    return verdict_line(runs, findings(runs, list(repairs), lambda run: rows))


def test_runs_group_their_checks_in_order_with_row_counts_and_windows():
    runs = runs_from_results(_results(RUN_A, 0, failed=("hash_total",)) + _results(RUN_B, 10))
    assert [r.run_id for r in runs] == [RUN_A, RUN_B]
    assert [r.check for r in runs[0].results][:2] == ["unique_keys", "row_count"]
    assert runs[0].rows == (100, 100) and not runs[0].passed and [r.check for r in runs[0].failed] == ["hash_total"]
    assert runs[1].passed and not runs[1].compared_nothing
    assert runs[0].window == "(2026-11-24T00:00:00+00:00, 2026-11-25T00:00:00+00:00]"
    assert runs[0].results[0].tolerance is None  # a zero tolerance is no tolerance


@pytest.mark.parametrize("results, repairs, rows, text, state", [
    ([], [], None, "not reconciled yet", "none"),
    (_results(RUN_A, 0), [], None, "reconciled at 2026-11-25 08:00:00 UTC", "reconciled"),
    (_results(RUN_A, 0, rows=(0, 0)), [], None, "nothing to compare yet (0 rows) at 2026-11-25 08:00:00 UTC",
     "nothing"),
    # the finding stays in the line after the repair's verdict passed (the repair run's task was green)
    (_results(RUN_A, 0, failed=("hash_total", "control_total")) + _results(RUN_B, 10), [_repair(RUN_A)], 1,
     "found 1 difference at 2026-11-25 08:00:00 UTC; repaired and reconciled at 2026-11-25 08:10:00 UTC",
     "reconciled"),
    # fixed by hand, no repair batch
    (_results(RUN_A, 0, failed=("hash_total",)) + _results(RUN_B, 10), [], 2,
     "found 2 differences at 2026-11-25 08:00:00 UTC; reconciled at 2026-11-25 08:10:00 UTC", "reconciled"),
    (_results(RUN_A, 0, failed=("hash_total",)) + _results(RUN_B, 10) + _results(RUN_C, 20), [], 1,
     "found 1 difference at 2026-11-25 08:00:00 UTC; reconciled at 2026-11-25 08:10:00 UTC; "
     "last verdict: reconciled at 2026-11-25 08:20:00 UTC", "reconciled"),
    # still open: a repair planned, or loaded but not reconciled again
    (_results(RUN_A, 0, failed=("hash_total",)), [_repair(RUN_A, "planned")], 1,
     "found 1 difference at 2026-11-25 08:00:00 UTC; repair batch planned", "differences"),
    (_results(RUN_A, 0, failed=("hash_total",)), [_repair(RUN_A)], 1,
     "found 1 difference at 2026-11-25 08:00:00 UTC; repair batch loaded at 2026-11-25 08:05:00 UTC, "
     "not reconciled again yet", "differences"),
    (_results(RUN_A, 0, failed=("hash_total",)) + _results(RUN_B, 10, failed=("hash_total",)), [], 1,
     "found 1 difference at 2026-11-25 08:00:00 UTC; still differing at 2026-11-25 08:10:00 UTC", "differences"),
    # no differing row to count (e.g. unreachable rows): the checks that failed
    (_results(RUN_A, 0, failed=("hash_total", "row_count"), rows=(100, 99)), [], None,
     "found 2 failed checks (hash_total, row_count) at 2026-11-25 08:00:00 UTC", "differences"),
])
def test_the_verdict_line_keeps_the_last_finding_until_a_later_run_passes(results, repairs, rows, text, state):
    line = _line(results, repairs, rows)
    assert (line.text, line.state) == (text, state)


def test_the_report_gives_both_versions_and_the_ledger_adds_the_keys_it_holds(tmp_path):
    from tidemark.reconcile import Difference, differences_csv

    folder = evidence.report_folder(tmp_path, "p", RUN_A)
    folder.mkdir(parents=True)
    diffs = [Difference((10,), "changed", {"id": "10", "amount": "3.70"}, {"id": "10", "amount": "3.71"}, ["amount"]),
             Difference((11,), "missing", {"id": "11", "amount": "4.07"}, None)]
    (folder / "differences.csv").write_text(differences_csv(diffs, ["id", "amount"]))
    run = runs_from_results(_results(RUN_A, 0, failed=("hash_total", "deleted_at_source"), extra=[
        ("deleted_at_source", "key 12, loaded by batch p:run-1", "no row at the source", '{"id": "12"}',
         "deleted at the source after it was loaded")]))[0]
    assert run.deleted_at_source_keys == ["12"]
    rows, origin = evidence.differing_rows(tmp_path, run, [_repair(RUN_A, keys=(["10"], ["11"]))])
    assert rows[:2] == [DifferingRow("10", "changed", ("amount",), {"id": "10", "amount": "3.70"},
                                     {"id": "10", "amount": "3.71"}),
                        DifferingRow("11", "missing", (), {"id": "11", "amount": "4.07"}, None)]
    assert rows[2] == DifferingRow("12", "differs") and "1 more key(s) from the ledger" in origin
    assert str(folder / "differences.csv") in origin

    # without the file (another machine's disk): the ledger's keys, and why there are no values
    rows, origin = evidence.differing_rows(tmp_path / "elsewhere", run, [_repair(RUN_A, keys=(["10"], ["11"]))])
    assert [r.key for r in rows] == ["10", "11", "12"] and "not readable here" in origin
    assert evidence.read_report(tmp_path / "nothing") is None
    stranded = runs_from_results(_results(RUN_B, 0, failed=("unreachable_rows",), extra=[
        ("unreachable_rows", "rows whose updated_at is NULL", "0", "2", "2")]))[0]
    assert evidence.differing_rows(tmp_path, stranded, []) == (
        [], "no differing row recorded: the failed checks above are the finding")
    assert evidence.verdicts._plain_key("(7, 'EUR')") == "7 EUR" and evidence.verdicts._plain_key("'a b'") == "a b"


def _evidence(tmp_path: Path) -> evidence.BatchEvidence:
    results = (_results(RUN_A, 0, failed=("hash_total", "control_total"))
               + _results(RUN_B, 10, extra=[("gx:expect_column_values_to_be_in_set", "currency",
                                             "every value in ['EUR', '<USD>']", "0 rows outside", None)]))
    runs = runs_from_results(results)
    repairs = [_repair(RUN_A)]
    found = findings(runs, repairs, lambda run: 1)
    rows = [DifferingRow("10", "changed", ("amount",), {"id": "10", "amount": "3.70", "memo": "<b>x</b>"},
                         {"id": "10", "amount": "3.71", "memo": "<b>x</b>"})]
    return evidence.BatchEvidence(
        "p", "p:run-1", runs, repairs, found, verdict_line(runs, found), rows, "report /x/differences.csv",
        batch={"batch_id": "p:run-1", "window": "(a, b]", "rows": 100, "state": "committed", "committed_at": T0},
        recent=[{"run_id": RUN_B, "batch_id": "p:run-1", "scope": "batch", "checked_at": T0, "checks": 5, "failed": 0,
                 "rows_source": "100", "rows_target": "100"},
                {"run_id": RUN_C, "batch_id": None, "scope": "full", "checked_at": T0, "checks": 5, "failed": 0,
                 "rows_source": "0", "rows_target": "0"}])


def test_the_batch_page_shows_the_finding_its_checks_rows_and_history_escaped(tmp_path):
    links = Links(status="/tidemark/", evidence="/tidemark/evidence", reports="/tidemark/evidence/_reports",
                  docs="/tidemark/evidence/_docs", docs_page=lambda run_id: f"validations/tidemark_p/{run_id}/t/b.html")
    page = evidence.render_batch(_evidence(tmp_path), links, tmp_path)
    assert "found 1 difference at 2026-11-25 08:00:00 UTC; repaired and reconciled at 2026-11-25 08:10:00 UTC" in page
    # the latest verdict's checks with both figures, and the failed checks of the finding, kept
    assert "<h3>Latest verdict: reconciled</h3>" in page and "every value in [&#x27;EUR&#x27;, &#x27;&lt;USD&gt;&#x27;]" in page
    failed = page.split("<table id=failed>")[1].split("</table>")[0]
    assert "hash_total" in failed and "<td>123</td><td>456</td><td>333</td>" in failed and "unique_keys" not in failed
    rows = page.split("<table id=rows>")[1].split("</table>")[0]
    assert "<td><b>10</b></td><td>changed</td><td>amount</td><td>source</td>" in rows
    assert "<td class=differs>3.71</td>" in rows and "&lt;b&gt;x&lt;/b&gt;" in rows and "<b>x</b>" not in page
    history = page.split("<table id=history>")[1].split("</table>")[0]
    assert history.index(RUN_B) < history.index(RUN_A)  # newest first
    assert "2 of 4 checks failed" in history and "repair batch p:repair__" in history and ": committed at" in history
    assert f"/tidemark/evidence/_docs/validations/tidemark_p/{RUN_B}/t/b.html" in page
    recent = page.split("<table id=recent>")[1].split("</table>")[0]
    assert "/tidemark/evidence/p/p%3Arun-1" in recent and "/tidemark/evidence/p/full" in recent
    assert "nothing to compare yet" in recent  # the full run over 0 rows
    assert "<script" not in page


def test_the_status_cell_links_the_verdict_and_its_history():
    from tidemark_airflow.evidence_page import evidence_href

    href = evidence_href("p", "p:manual__2026-11-25T08:00:00+00:00")
    assert href == "/tidemark/evidence/p/p%3Amanual__2026-11-25T08%3A00%3A00%2B00%3A00"
    cell = evidence.verdict_link(href, evidence.VerdictLine("found 1 difference at <t>; reconciled", "reconciled"), None)
    assert cell == (f"<small class='ok'><a class=evidence href='{href}'>found 1 difference at &lt;t&gt;; reconciled</a>"
                    "</small>")
    assert "class='warn'" in evidence.verdict_link(href, evidence.VerdictLine("nothing to compare yet", "nothing"), None)
    assert ">reconciliation_failed</a>" in evidence.verdict_link(href, None, "reconciliation_failed")
    assert "class='bad'" in evidence.verdict_link(href, None, "reconciliation_failed")
    assert ">not reconciled yet</a>" in evidence.verdict_link(href, None, None)


def test_the_status_page_links_each_last_verdict_to_its_evidence():
    from test_status import _report

    from tidemark_airflow.status_page import render_html

    page = render_html(_report(), {"loaded": evidence.VerdictLine(
        "found 1 difference at 2026-11-22 08:00:00 UTC; repaired and reconciled at 2026-11-22 09:00:00 UTC",
        "reconciled")})
    assert ("<a class=evidence href='/tidemark/evidence/loaded/p%3Arun-a'>found 1 difference at 2026-11-22 08:00:00 "
            "UTC; repaired and reconciled at 2026-11-22 09:00:00 UTC</a>") in page
    assert ">not reconciled yet</a>" in render_html(_report())  # no history read: the ledger's word, linked


def test_a_verdict_over_no_rows_says_nothing_to_compare_yet():
    from tidemark.reconcile import Check, Verdict

    spec = SimpleNamespace(target_table="public.t")
    checks = [Check("row_count", "", "0", "0", None, True), Check("hash_total", "", "0", "0", None, True)]
    assert Verdict(checks, [], 0, 0).summary(spec, "p:b") == \
        "public.t batch p:b: nothing to compare yet, 0 rows in the window, 2 checks passed"
    assert Verdict(checks, [], 5, 5).summary(spec, "p:b") == "public.t batch p:b: reconciled, 5 rows, 2 checks passed"


# --- Data Docs ---------------------------------------------------------------------------------

def _gx_template(name: str) -> str:
    """A template of the installed Great Expectations (found, not imported: the import takes seconds)."""
    package = importlib.util.find_spec("great_expectations").submodule_search_locations[0]
    return (Path(package) / "render" / "view" / "templates" / name).read_text()


EXTERNAL_ASSET = re.compile(r"<(?:script|link|img)\b[^>]*?\b(?:src|href)\s*=\s*[\"']?(?:https?:)?//(?!127\.0\.0\.1[:/])",
                            re.I)


def test_data_docs_pages_load_nothing_from_cdns_and_the_rewrite_is_idempotent():
    head = _gx_template("index_page.j2") + _gx_template("js_script_imports.j2") + _gx_template("top_navbar.j2")
    assert EXTERNAL_ASSET.search(head)  # this GX version loads its scripts and styles from CDNs
    page = head.replace("{{ static_images_dir + \"logo-long.png\" | add_data_context_id_to_url }}",
                        "https://great-expectations-web-assets.s3.us-east-2.amazonaws.com/logo-long.png?d=42")
    page += ("<style>.x{background:url('https://great-expectations-web-assets.s3.amazonaws.com/full_logo_dark.png')}"
             "</style><script src='http://127.0.0.1:28080/ok.js'></script>"
             "<a href='https://docs.greatexpectations.io/x'>docs</a><link rel=icon href='./static/images/favicon.ico'>")
    linked = evidence.offline_html(page, "/tidemark/evidence/_assets/", "/d/static/images/")
    assert not EXTERNAL_ASSET.search(linked), EXTERNAL_ASSET.search(linked)
    assert linked.count('<script src="/tidemark/evidence/_assets/tidemark-datadocs.js"></script>') == 1
    assert linked.count('<link rel="stylesheet" href="/tidemark/evidence/_assets/tidemark-datadocs.css">') == 1
    assert 'src="/d/static/images/logo-long.png"' in linked and "background:none" in linked
    assert "http://127.0.0.1:28080/ok.js" in linked and "https://docs.greatexpectations.io/x" in linked  # kept
    assert "./static/images/favicon.ico" in linked
    assert evidence.offline_html(linked, "/tidemark/evidence/_assets/", "/d/static/images/") == linked

    inlined = evidence.offline_html(page, None, "/d/static/images/")
    assert not EXTERNAL_ASSET.search(inlined)
    assert inlined.count(evidence.JS_MARK) == 1 and inlined.count(evidence.CSS_MARK) == 1
    assert evidence.offline_html(inlined, None, "/d/static/images/") == inlined
    js = evidence.ASSETS[evidence.JS][1]
    assert "</script" not in js.lower() and "bootstrapTable" in js and "w.jQuery = w.$ = $" in js
    assert ".col-md-10{" in evidence.ASSETS[evidence.CSS][1] and ".pl-md-4{" in evidence.ASSETS[evidence.CSS][1]


def test_a_site_on_disk_is_made_offline_with_relative_paths(tmp_path):
    site = tmp_path / "local_site"
    deep = site / "validations" / "tidemark_p" / RUN_A / "20261125T080000Z"
    deep.mkdir(parents=True)
    other = site / "validations" / "tidemark_p" / RUN_B / "20261125T070000Z"
    other.mkdir(parents=True)
    cdn = '<script src="https://code.jquery.com/jquery-3.7.1.min.js"></script>'
    for page in (site / "index.html", deep / "b.html", other / "b.html"):
        page.write_text(f"<html><head>{cdn}</head></html>")
    changed = evidence.offline_site(site, RUN_A)
    assert sorted(p.relative_to(site).as_posix() for p in changed) == [
        "index.html", f"validations/tidemark_p/{RUN_A}/20261125T080000Z/b.html"]
    assert 'src="static/tidemark/tidemark-datadocs.js"' in (site / "index.html").read_text()
    assert 'src="../../../../static/tidemark/tidemark-datadocs.js"' in (deep / "b.html").read_text()
    assert (other / "b.html").read_text().count("code.jquery.com") == 1  # another run's page: left for its run
    assert (site / "static" / "tidemark" / evidence.JS).read_text() == evidence.DATA_DOCS_JS
    assert evidence.offline_site(site, RUN_A) == []
    assert evidence.docs_page(site, "p", RUN_A) == f"validations/tidemark_p/{RUN_A}/20261125T080000Z/b.html"
    assert evidence.docs_page(site, "p", "../x") is None and evidence.docs_page(site, "q", RUN_A) is None


def test_paths_that_leave_the_folder_are_refused(tmp_path):
    site = tmp_path / "site"
    (site / "sub").mkdir(parents=True)
    (site / "index.html").write_text("index")
    (site / "sub" / "index.html").write_text("sub")
    (tmp_path / "secret.txt").write_text("secret")
    (site / "out").symlink_to(tmp_path)
    assert evidence.safe_file(site, "index.html") == (site / "index.html").resolve()
    assert evidence.safe_file(site, "") == (site / "index.html").resolve()
    assert evidence.safe_file(site, "sub/") == (site / "sub" / "index.html").resolve()
    for bad in ("../secret.txt", "sub/../../secret.txt", "/etc/passwd", "out/secret.txt", "..", "missing.html",
                "c:/windows", "sub\\..\\..\\secret.txt"):
        assert evidence.safe_file(site, bad) is None, bad


def test_the_routes_serve_docs_sandboxed_and_refuse_what_is_not_theirs(tmp_path, monkeypatch):
    from fastapi.testclient import TestClient

    from tidemark_airflow.evidence_page import DOCS_CSP, build_app

    monkeypatch.setenv("TIDEMARK_RECONCILE_DIR", str(tmp_path))
    site = evidence.data_docs_site(tmp_path)
    site.mkdir(parents=True)
    (site / "index.html").write_text('<html><head><link rel="stylesheet" href="https://maxcdn.bootstrapcdn.com/b.css">'
                                     '<script src="https://code.jquery.com/jquery.js"></script></head></html>')
    evidence.offline_site(site)  # as the run left it: pointed at static/tidemark/, which a sandboxed page cannot load
    (tmp_path / "secret.txt").write_text("TOP-SECRET-CONTENT")
    folder = evidence.report_folder(tmp_path, "p", RUN_A)
    folder.mkdir(parents=True)
    (folder / "differences.csv").write_text("key,kind,side,differing_columns,id\n10,missing,source,,10\n")

    client = TestClient(build_app(login=False))
    index = client.get("/evidence/_docs/index.html")
    assert index.status_code == 200 and index.headers["content-security-policy"] == DOCS_CSP
    assert not EXTERNAL_ASSET.search(index.text) and "tidemark-datadocs" not in index.text  # inlined instead
    assert index.text.count(evidence.JS_MARK) == 1 and index.text.count(evidence.CSS_MARK) == 1
    assert client.get("/evidence/_docs/").text == index.text
    for bad in ("/evidence/_docs/%2e%2e/%2e%2e/%2e%2e/%2e%2e/secret.txt", "/evidence/_docs/..%2F..%2F..%2F..%2Fsecret.txt",
                "/evidence/_reports/p/not-a-run/differences.csv", f"/evidence/_reports/p/{RUN_A}/other.csv",
                f"/evidence/_reports/P/{RUN_A}/differences.csv", "/evidence/_assets/x.js", "/evidence/Not-A-Pipeline"):
        response = client.get(bad)
        assert response.status_code == 404 and "TOP-SECRET-CONTENT" not in response.text, bad
    csv_file = client.get(f"/evidence/_reports/p/{RUN_A}/differences.csv")
    assert csv_file.status_code == 200 and csv_file.text.startswith("key,kind") and "text/csv" in csv_file.headers["content-type"]
    assert client.get(f"/evidence/_assets/{evidence.JS}").text == evidence.DATA_DOCS_JS

    guarded = TestClient(build_app())  # as Airflow serves it: the login first
    for path in ("/evidence/p", "/evidence/p/p:run-1", "/evidence/_docs/index.html",
                 f"/evidence/_reports/p/{RUN_A}/differences.csv", "/evidence/_api/p/full"):
        assert guarded.get(path).status_code == 401, path


def test_the_status_app_carries_the_evidence_routes():
    from tidemark_airflow.status_page import build_app

    paths = {getattr(r, "path", "") for r in build_app().routes}
    assert {"/", "/api/status", "/evidence/{pipeline}", "/evidence/{pipeline}/{batch_id:path}",
            "/evidence/_docs/{path:path}"} <= paths

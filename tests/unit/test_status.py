"""The status page's pure parts: formatting, spec rows, HTML escaping, and the login requirement."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from tidemark.status import (
    Attempt,
    CommittedBatch,
    Lag,
    PipelineLedger,
    PipelineStatus,
    PreparedXact,
    SourceSession,
    StreamStatus,
    SourceStatus,
    StageTable,
    StatusReport,
    Watermark,
    format_bytes,
    format_duration,
    load_pipelines,
    utc_iso,
)

T0 = datetime(2026, 11, 22, 8, 0, tzinfo=timezone.utc)
CET = timezone(timedelta(hours=1))


@pytest.mark.parametrize("seconds, text", [
    (0.25, "0.2s"), (42, "42s"), (185, "3m 05s"), (2 * 3600 + 7 * 60 + 9, "2h 07m"), (4 * 86400 + 3 * 3600, "4d 03h"),
    (-5, "-5.0s"), (None, ""),
])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text
    if seconds is not None:
        assert format_duration(timedelta(seconds=seconds)) == text


def test_format_bytes_and_utc_times():
    assert [format_bytes(v) for v in (0, 8192, 5 * 1024**2, 3 * 1024**4, None)] == [
        "0 B", "8.0 kB", "5.0 MB", "3072.0 GB", "?"]
    assert utc_iso(datetime(2026, 11, 22, 9, 30, tzinfo=CET)) == "2026-11-22T08:30:00+00:00"
    assert utc_iso(datetime(2026, 11, 22, 9, 30)) == "2026-11-22T09:30:00+00:00"  # naive is UTC
    assert utc_iso(None) is None


def test_every_spec_file_is_a_row_invalid_ones_with_their_error(tmp_path):
    good = {"name": "good", "table": "public.src", "primary_key": ["id"], "safe_lag": "PT2S",
            "cursor": {"kind": "timestamp", "column": "updated_at"}, "target_table": "public.tgt"}
    (tmp_path / "good.yaml").write_text(json.dumps(good))
    (tmp_path / "bad.yaml").write_text(json.dumps({**good, "name": "bad", "partitions": 0}))
    (tmp_path / "notes.txt").write_text("not a spec")
    entries = load_pipelines(tmp_path)
    assert [(e.name, e.spec is not None) for e in entries] == [("bad", False), ("good", True)]
    assert "field 'partitions'" in entries[0].error and str(tmp_path / "bad.yaml") in entries[0].error


def _report() -> StatusReport:
    failure = Attempt("p:run-b", 1, "refused", 10, "partition 0: END says rows=<3>", T0, T0 + timedelta(minutes=1))
    loaded = PipelineStatus(
        "loaded", "/specs/loaded.yaml", source_conn_id="tidemark_source", cursor_kind="timestamp",
        ledger=PipelineLedger(
            CommittedBatch("p:run-a", "(2026-11-22T07:00:00+00:00, 2026-11-22T08:00:00+00:00]", False, 1234,
                           T0.astimezone(CET), 2),
            Watermark("2026-11-22T08:00:00+00:00", T0, "p:run-a", T0),
            [Attempt("p:run-c", 1, "open", None, None, T0, None)], [failure], failure,
            dead_letters_pending=3, oldest_pending_reject=(T0 - timedelta(minutes=2)).astimezone(CET)),
        lag=Lag(seconds=185.0, held_back=True))
    return StatusReport(
        generated_at=T0, pipelines_dir="/specs", control_schema=True,
        pipelines=[
            PipelineStatus("broken", "/specs/broken.yaml", error="/specs/broken.yaml: field 'table': <script>x</script>"),
            PipelineStatus("idle", "/specs/idle.yaml", source_conn_id="tidemark_source", cursor_kind="id"),
            loaded,
        ],
        sources=[SourceStatus("tidemark_source", T0, SourceSession(
            4242, "psql <me>", "alice", "10.0.0.7", "idle in transaction", T0 - timedelta(minutes=3),
            timedelta(minutes=3)), PreparedXact("etl-<2pc>", T0 - timedelta(minutes=9), "bob", 2))],
        orphan_stage_tables=[StageTable("tidemark_stage.s_abc", 16384, "p:run-a", 2, "loaded", "committed"),
                             StageTable("tidemark_stage.s_def", None)],
        streams=[StreamStatus("loaded", "paused", "alice <a@b>", T0, "broker <maintenance>", None, 7, "host:42",
                              T0, T0, 1234, {"0": 0, "1": 5}, T0, 1, 3),
                 StreamStatus("looping", "running", crash_looping_since=T0, restarts=3, restart_budget=3)],
    )


def test_html_has_a_row_per_pipeline_and_escapes_everything():
    from tidemark_airflow.status_page import render_html

    page = render_html(_report())
    assert page.count("<tr class=invalid>") == 1 and page.count("<tr><td title=") == 2
    assert "<script>" not in page and "&lt;script&gt;x&lt;/script&gt;" in page
    assert "psql &lt;me&gt;" in page and "rows=&lt;3&gt;" in page
    assert "no batch yet" in page  # the idle pipeline
    assert "p:run-a #2" in page and "1234" in page and "2026-11-22T08:00:00+00:00" in page  # committed_at in UTC
    assert "3m 05s" in page and "held back by an open or prepared source transaction" in page
    assert "4242" in page and "10.0.0.7" in page
    assert "alice &lt;a@b&gt;" in page and "broker &lt;maintenance&gt;" in page and "p1: 5" in page
    assert "stopped at 2026-11-22T08:00:00+00:00" in page and "crash-looping since" in page and "3/3" in page
    assert "etl-&lt;2pc&gt;" in page and "ROLLBACK PREPARED" in page  # the prepared one holds every window too
    assert "tidemark_stage.s_abc" in page and "16.0 kB" in page and "no such attempt" in page
    waiting = page.split("<tr><td title='/specs/loaded.yaml'>")[1].split("</tr>")[0].rsplit("<td class=num>", 1)[1]
    assert waiting.startswith("<span class=bad>3</span>") and "oldest from 2026-11-22T07:58:00+00:00" in waiting
    assert "dead letters waiting</th>" in page


def test_json_has_utc_times_and_seconds():
    data = _report().to_json()
    json.dumps(data)  # plain JSON
    loaded = data["pipelines"][2]
    assert loaded["ledger"]["last_committed"]["committed_at"] == "2026-11-22T08:00:00+00:00"
    assert loaded["lag"] == {"seconds": 185.0, "ids": None, "held_back": True, "error": None}
    assert data["sources"][0]["oldest_open_xact"]["age"] == 180.0
    assert data["sources"][0]["oldest_prepared"] == {"gid": "etl-<2pc>", "prepared": "2026-11-22T07:51:00+00:00",
                                                     "owner": "bob", "count": 2}
    assert "clock" not in data["sources"][0]  # the planner's read, already shown field by field


def test_the_page_requires_an_airflow_login():
    from fastapi.testclient import TestClient

    from tidemark_airflow.status_page import TidemarkStatusPlugin, build_app

    client = TestClient(build_app())
    for path in ("/", "/api/status"):
        assert client.get(path).status_code == 401  # no cookie, no bearer token: refused before any query
    app = TidemarkStatusPlugin.fastapi_apps[0]
    assert app["url_prefix"] == "/tidemark"
    view = TidemarkStatusPlugin.external_views[0]
    assert view["destination"] == "nav" and view["href"] == "/tidemark/"


def test_importing_the_plugin_loads_neither_fastapi_nor_the_queries():
    import subprocess
    import sys

    heavy = ("fastapi", "airflow.api_fastapi.core_api.security", "tidemark.status")
    code = f"import sys, tidemark_airflow.status_page; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_text_lines_name_each_pipeline_its_batch_lag_and_stream():
    from tidemark.status import status_lines

    lines = status_lines(_report())
    assert lines[0].startswith("broken: invalid spec: /specs/broken.yaml")
    assert lines[1] == "idle: no batch yet; watermark -; behind the source -"
    assert lines[2].startswith("loaded: last batch p:run-a (1234 rows, 2026-11-22T08:00:00+00:00, not reconciled yet)")
    assert "behind the source 3m 05s (held back by a source transaction)" in lines[2]
    assert "; 3 dead letter(s) not yet in the DLQ, oldest from 2026-11-22T07:58:00+00:00; stream" in lines[2]
    assert lines[2].endswith("; stream desired=paused stopped at 2026-11-22T08:00:00+00:00 lag 5 records, restarts 1/3")

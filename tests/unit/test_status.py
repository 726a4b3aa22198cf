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
    SourceStatus,
    StageTable,
    StatusReport,
    StreamStatus,
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
        "0 B", "8.0 KiB", "5.0 MiB", "3072.0 GiB", "?"]
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
            [Attempt("p:run-c", 1, "open", None, None, T0, None, staged=1234567),
             Attempt("p:run-d", 1, "open", None, None, T0, None, staged=2000000, staged_directly=True)],
            [failure], failure,
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
    # unfinished attempts say how far their staging got: the sink's count, or the stage's for a direct one
    assert "1,234,567 records staged<" in page and "about 2,000,000 rows staged directly<" in page
    assert "3m 05s" in page and "held back by an open or prepared source transaction" in page
    assert "4242" in page and "10.0.0.7" in page
    assert "alice &lt;a@b&gt;" in page and "broker &lt;maintenance&gt;" in page and "p1: 5" in page
    assert "stopped at 2026-11-22T08:00:00+00:00" in page and "crash-looping since" in page and "3/3" in page
    assert "etl-&lt;2pc&gt;" in page and "ROLLBACK PREPARED" in page  # the prepared one holds every window too
    assert "tidemark_stage.s_abc" in page and "16.0 KiB" in page and "no such attempt" in page
    waiting = page.split("<tr><td title='/specs/loaded.yaml'>")[1].split("</tr>")[0].rsplit("<td class=num>", 1)[1]
    assert waiting.startswith("<span class=bad>3</span>") and "oldest from 2026-11-22T07:58:00+00:00" in waiting
    assert "dead letters waiting</th>" in page


def test_json_has_utc_times_and_seconds():
    data = _report().to_json()
    json.dumps(data)  # plain JSON
    loaded = data["pipelines"][2]
    assert loaded["ledger"]["last_committed"]["committed_at"] == "2026-11-22T08:00:00+00:00"
    assert loaded["lag"] == {"seconds": 185.0, "ids": None, "held_back": True, "error": None, "snapshot_held_s": None,
                             "snapshot_limit_s": None}
    assert [(a["staged"], a["staged_directly"]) for a in loaded["ledger"]["unfinished"]] == [(1234567, False),
                                                                                            (2000000, True)]
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


@pytest.mark.parametrize("rows, verdict, word", [
    (0, "reconciled", "nothing to compare yet"),  # a pass over no rows proves nothing (issue 29)
    (5, "reconciled", "reconciled"),
    (0, "reconciliation_failed", "reconciliation_failed"),
    (0, None, "not reconciled yet"),
])
def test_the_text_line_says_nothing_to_compare_yet_for_a_pass_over_no_rows(rows, verdict, word):
    from dataclasses import replace

    from tidemark.status import status_lines

    report = _report()
    loaded = report.pipelines[2]
    last = replace(loaded.ledger.last_committed, rows=rows, reconciliation=verdict)
    report = replace(report, pipelines=[replace(loaded, ledger=replace(loaded.ledger, last_committed=last))])
    assert f"({rows} rows, 2026-11-22T08:00:00+00:00, {word});" in status_lines(report)[0]


# --- health: broker and databases, since when one is down, and what holds each pipeline -------------

def _probe(component="kafka", error=None):
    from tidemark.status import Probe

    kind = {"kafka": "broker", "warehouse": "warehouse"}.get(component, "source")
    conn_id = {"kafka": "tidemark_kafka", "warehouse": "tidemark_warehouse"}.get(component, component.split()[-1])
    return Probe(component, kind, conn_id, "127.0.0.1:29092" if kind == "broker" else "127.0.0.1:25432/db", error)


def test_an_outage_dates_from_its_first_failed_check_and_ends_when_it_answers():
    from tidemark.status import track_health

    refused = "no bootstrap server accepts a connection (127.0.0.1:29092: Connection refused)"
    [up], state = track_health([_probe()], {}, T0)
    assert up.reachable and up.since is None and up.last_ok == T0 and up.next_step is None
    [down], state = track_health([_probe(error=refused)], state, T0 + timedelta(minutes=1))
    assert not down.reachable and down.since == T0 + timedelta(minutes=1) and down.last_ok == T0
    assert down.error == refused and "make start C=kafka" in down.next_step
    [still], state = track_health([_probe(error=refused)], state, T0 + timedelta(minutes=5))
    assert still.since == T0 + timedelta(minutes=1) and still.checked_at == T0 + timedelta(minutes=5)  # the first failure
    healths, state = track_health([_probe("warehouse")], state, T0 + timedelta(minutes=6))  # another check
    assert state["components"]["kafka"]["down_since"] == (T0 + timedelta(minutes=1)).isoformat()  # kept
    [back], state = track_health([_probe()], state, T0 + timedelta(minutes=7))
    assert back.reachable and back.since is None and state["components"]["kafka"]["down_since"] is None
    [again], _ = track_health([_probe(error=refused)], state, T0 + timedelta(minutes=9))
    assert again.since == T0 + timedelta(minutes=9) and again.last_ok == T0 + timedelta(minutes=7)  # a new outage


def test_the_health_file_keeps_the_since_across_checks_and_a_broken_one_costs_only_the_since(tmp_path):
    from tidemark.status import remember_health

    path = tmp_path / "status" / "health.json"
    [first] = remember_health([_probe("source tidemark_source", "Connection refused")], path, T0)
    [later] = remember_health([_probe("source tidemark_source", "Connection refused")], path, T0 + timedelta(seconds=30))
    assert first.since == later.since == T0 and json.loads(path.read_text())["components"]["source tidemark_source"]
    assert "start C=postgres" in later.next_step
    path.write_text("{not json")
    [fresh] = remember_health([_probe("source tidemark_source", "Connection refused")], path, T0 + timedelta(minutes=1))
    assert fresh.since == T0 + timedelta(minutes=1)
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    [unwritable] = remember_health([_probe(error="refused")], blocked / "health.json", T0)  # parent is a file
    assert unwritable.since == T0 and not unwritable.reachable
    assert remember_health([_probe(error="refused")], None, T0)[0].since == T0


@pytest.mark.parametrize("kind, error, step", [
    ("broker", "no bootstrap server accepts a connection (x: Connection refused)", "make start C=kafka"),
    ("broker", "no bootstrap servers configured", "bootstrap.servers in the Airflow connection tidemark_kafka"),
    ("warehouse", 'OperationalError: connection to server at "127.0.0.1", port 25432 failed: Connection refused',
     "make start C=postgres"),
    ("source", "OperationalError: timeout expired", "make start C=postgres"),
    ("source", 'OperationalError: FATAL:  password authentication failed for user "tidemark_reader"',
     "fix the Airflow connection tidemark_source"),
    ("warehouse", 'OperationalError: FATAL:  database "nope" does not exist', "fix the Airflow connection tidemark_warehouse"),
])
def test_the_next_step_fits_the_failure(kind, error, step):
    from tidemark.status import next_step

    conn_id = {"broker": "tidemark_kafka", "warehouse": "tidemark_warehouse", "source": "tidemark_source"}[kind]
    assert step in next_step(kind, conn_id, error)


def _health(*down: str, since=T0):
    from tidemark.status import Health

    components = {"kafka": ("broker", "tidemark_kafka", "127.0.0.1:29092"),
                  "warehouse": ("warehouse", "tidemark_warehouse", "127.0.0.1:25432/tidemark_warehouse"),
                  "source tidemark_source": ("source", "tidemark_source", "127.0.0.1:25432/tidemark_source"),
                  "source other_source": ("source", "other_source", "db.example:5432/other")}
    return [Health(c, kind, conn_id, address, c not in down, T0 + timedelta(minutes=2),
                   since if c in down else None, None, "Connection refused" if c in down else None,
                   f"start {c}" if c in down else None)
            for c, (kind, conn_id, address) in components.items()]


def _pipeline(name="p", source="tidemark_source", lag=None):
    return PipelineStatus(name, f"/specs/{name}.yaml", source_conn_id=source, cursor_kind="timestamp", lag=lag)


def test_what_holds_a_pipeline_root_causes_first():
    from tidemark.status import pipeline_holds

    now = T0 + timedelta(minutes=2)
    clamp = SourceStatus("tidemark_source", now, SourceSession(4242, "psql", "alice", None, "idle in transaction",
                                                               T0, timedelta(minutes=2)))
    held = pipeline_holds(_pipeline(lag=Lag(seconds=120, held_back=True)), source=clamp, now=now,
                          health=_health("kafka", "source other_source"),
                          stream=StreamStatus("p", "running", crash_looping_since=T0 - timedelta(hours=1)))
    assert [h.by for h in held] == ["broker", "sink", "transaction"]  # the other source holds other pipelines
    broker, sink, xact = held
    assert broker.what == "Kafka broker unreachable (127.0.0.1:29092)" and broker.since == T0 and broker.next == "start kafka"
    assert "crash-looping" in sink.what and "tidemark_stream_control with pipeline=p action=clear" in sink.next
    assert "pid 4242" in xact.what and xact.since == T0 and "pg_terminate_backend(4242)" in xact.next

    everything = pipeline_holds(_pipeline(source="other_source"), source=None, stream=None, now=now,
                                health=_health("warehouse", "kafka", "source other_source"))
    assert [h.by for h in everything] == ["warehouse", "source", "broker"]
    assert everything[1].what == "source other_source unreachable (db.example:5432/other)"
    assert pipeline_holds(_pipeline(), source=clamp, stream=None, now=now, health=_health()) == []  # not held back
    assert pipeline_holds(PipelineStatus("bad", "/x", error="no"), source=None, stream=None, now=now,
                          health=_health("kafka")) == []


@pytest.mark.parametrize("stream, by, what, step", [
    (StreamStatus("p", "paused", "alice", T0, "maintenance"), "person", "stream paused by alice: maintenance",
     "action=resume"),
    (StreamStatus("p", "running", heartbeat_at=T0 - timedelta(minutes=3)), "sink",
     "standing sink silent: no heartbeat for 5m 00s (lease 30s)", "the supervisor restarts a hung sink"),
    (StreamStatus("p", "running", heartbeat_at=T0, ended_at=T0 + timedelta(seconds=1)), "sink",
     "standing sink not running", "the supervisor starts it"),
])
def test_a_standing_sink_holds_its_pipeline(stream, by, what, step):
    from tidemark.status import pipeline_holds

    [held] = pipeline_holds(_pipeline(), source=None, stream=stream, now=T0 + timedelta(minutes=2), health=_health(),
                            lease=timedelta(seconds=30))
    assert (held.by, held.what) == (by, what) and step in held.next
    beating = StreamStatus("p", "running", heartbeat_at=T0 + timedelta(minutes=1, seconds=58))
    assert pipeline_holds(_pipeline(), source=None, stream=beating, now=T0 + timedelta(minutes=2), health=_health(),
                          lease=timedelta(seconds=30)) == []


def _broker_down_report() -> StatusReport:
    from tidemark.status import Hold

    now = T0 + timedelta(minutes=2)
    held = [Hold("broker", "Kafka broker unreachable (127.0.0.1:29092)", T0,
                 "start the broker: `make start C=kafka`")]
    return StatusReport(
        generated_at=now, pipelines_dir="/specs", control_schema=True,
        pipelines=[PipelineStatus("streamed", "/specs/streamed.yaml", source_conn_id="tidemark_source",
                                  cursor_kind="timestamp", lag=Lag(seconds=3.0), held_by=held)],
        sources=[SourceStatus("tidemark_source", now)], orphan_stage_tables=[],
        streams=[StreamStatus("streamed", "running", fence=3, holder="host:1", heartbeat_at=now - timedelta(seconds=2),
                              progress_at=now, records=10, lag={"0": 0}, restarts=0, restart_budget=3)],
        health=_health("kafka"))


def test_text_with_the_broker_down_says_so_and_what_holds_each_pipeline():
    from tidemark.status import health_lines, status_lines

    report = _broker_down_report()
    health = health_lines(report)
    assert health[0] == ("kafka: 127.0.0.1:29092 UNREACHABLE since 2026-11-22T08:00:00+00:00 (2m 00s): "
                         "Connection refused; next: start kafka")
    assert health[1] == "warehouse: 127.0.0.1:25432/tidemark_warehouse reachable"
    line, held = status_lines(report)
    assert "running (beat 2.0s ago) lag unknown (broker unreachable; 0 records at its last beat)" in line
    assert " lag 0 records" not in line
    assert held == ("  held by: Kafka broker unreachable (127.0.0.1:29092) since 2026-11-22T08:00:00+00:00 (2m 00s), "
                    "next: start the broker: `make start C=kafka`")


def test_html_and_json_show_the_health_and_the_holds():
    from tidemark_airflow.status_page import render_html

    report = _broker_down_report()
    page = render_html(report)
    health = page.split("<table id=health>")[1].split("</table>")[0]
    assert health.count("<tr class=down>") == 1 and health.count("<tr class=up>") == 3
    assert "unreachable</span>" in health and "2026-11-22T08:00:00+00:00" in health and "2m 00s ago" in health
    assert "next: start kafka" in health
    assert ("<tr class=held><td></td><td colspan=10><span class=bad>held by: Kafka broker unreachable (127.0.0.1:29092)"
            "</span> since 2026-11-22T08:00:00+00:00 (2m 00s), next: start the broker: `make start C=kafka`</td></tr>") in page
    assert "unknown: broker unreachable" in page.split("<table id=streams>")[1]
    data = report.to_json()
    json.dumps(data)
    kafka = next(h for h in data["health"] if h["component"] == "kafka")
    assert kafka["reachable"] is False and kafka["since"] == "2026-11-22T08:00:00+00:00" and kafka["next_step"]
    assert data["pipelines"][0]["held_by"] == [{"by": "broker", "what": "Kafka broker unreachable (127.0.0.1:29092)",
                                                "since": "2026-11-22T08:00:00+00:00",
                                                "next": "start the broker: `make start C=kafka`"}]
    assert data["warehouse_error"] is None


def test_a_warehouse_or_source_that_does_not_answer_is_shown_not_raised(tmp_path):
    import psycopg2

    from tidemark.status import collect

    good = {"name": "good", "table": "public.src", "primary_key": ["id"], "safe_lag": "PT2S",
            "cursor": {"kind": "timestamp", "column": "updated_at"}, "target_table": "public.tgt"}
    (tmp_path / "good.yaml").write_text(json.dumps(good))

    def refused(*_args):
        raise psycopg2.OperationalError('connection to server at "127.0.0.1", port 9 failed: Connection refused')

    report = collect(load_pipelines(tmp_path), None, refused, open_warehouse=refused, kafka_bootstrap="127.0.0.1:9",
                     broker_probe=lambda bootstrap: f"no bootstrap server accepts a connection ({bootstrap}: refused)",
                     health_path=tmp_path / "health.json")
    assert "Connection refused" in report.warehouse_error and not report.control_schema
    assert {h.component: h.reachable for h in report.health} == {
        "warehouse": False, "source tidemark_source": False, "kafka": False}
    [p] = report.pipelines
    assert [h.by for h in p.held_by] == ["warehouse", "source", "broker"]
    assert all(h.since == report.generated_at for h in p.held_by) and "make start C=postgres" in p.held_by[0].next
    again = collect(load_pipelines(tmp_path), None, refused, open_warehouse=refused,
                    kafka_bootstrap=KeyError("tidemark_kafka"), health_path=tmp_path / "health.json")
    assert again.pipelines[0].held_by[0].since == report.generated_at  # the first failed check
    kafka = next(h for h in again.health if h.kind == "broker")
    assert "connection tidemark_kafka: KeyError" in kafka.error and "bootstrap.servers" in kafka.next_step


def test_a_broker_check_gives_up_within_seconds(monkeypatch):
    """A closed port is refused at the TCP connect, before any Kafka client exists (at once, and
    without librdkafka's reconnect noise); a port that accepts but never speaks Kafka gets a client
    whose every wait is the check's timeout, so it costs that timeout, not more."""
    import socket

    import confluent_kafka.admin

    from tidemark.status import probe_broker

    clients = []
    admin = confluent_kafka.admin.AdminClient
    init, list_topics = admin.__init__, admin.list_topics

    def spy_init(self, conf, **kwargs):
        clients.append({"conf": dict(conf)})
        init(self, conf, **kwargs)

    def spy_list_topics(self, *args, **kwargs):
        clients[-1]["list_topics"] = kwargs.get("timeout", args[1] if len(args) > 1 else None)
        return list_topics(self, *args, **kwargs)

    monkeypatch.setattr(admin, "__init__", spy_init)
    monkeypatch.setattr(admin, "list_topics", spy_list_topics)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    assert "Connection refused" in probe_broker(f"127.0.0.1:{port}")
    assert clients == []
    with socket.socket() as mute:  # listens (the kernel accepts), never answers
        mute.bind(("127.0.0.1", 0))
        mute.listen(8)
        why = probe_broker(f"127.0.0.1:{mute.getsockname()[1]}", timeout_s=1.0)
        assert "does not answer" in why, why
    [client] = clients
    conf = client["conf"]
    assert (conf["socket.timeout.ms"], conf["socket.connection.setup.timeout.ms"], client["list_topics"]) == (1000, 1000, 1.0)
    assert probe_broker("") == "no bootstrap servers configured"


def test_a_cdc_pipeline_shows_its_handoff_last_position_and_slot_on_the_page_and_in_the_text():
    """Issue 31, items 7 and 8: per CDC pipeline, what the warehouse and the source say of its capture."""
    from tidemark.status import CaptureStatus, StatusReport, status_lines
    from tidemark_airflow.status_page import render_html

    captured = CaptureStatus("cdc:run-1", "0/16B3748", "0/17000A0", T0, "tidemark_cdc", True, False, "extended",
                             3 << 20)
    report = StatusReport(generated_at=T0, pipelines_dir="/specs", control_schema=True,
                          pipelines=[PipelineStatus("cdc", "/specs/cdc.yaml", source_conn_id="tidemark_source",
                                                    cursor_kind="timestamp")],
                          sources=[], orphan_stage_tables=[],
                          streams=[StreamStatus("cdc", "running", serving_view="rt.cdc", capture=captured)])
    expected = ("capture: handoff cdc:run-1 at 0/16B3748; applied up to 0/17000A0 (source commit "
                "2026-11-22T08:00:00+00:00); slot tidemark_cdc UNREAD, wal_status extended, retains 3.0 MiB")
    assert expected in status_lines(report)[0]
    assert "<span class=bad>handoff cdc:run-1 at 0/16B3748;" in render_html(report)
    assert CaptureStatus(slot="s").text() == ("no handoff batch committed yet; no change applied yet; slot s: not read")
    assert "slot s MISSING on the source" in CaptureStatus(slot="s", slot_found=False).text()


def test_a_cdc_pipeline_shows_its_connector_and_task_states_and_a_failed_or_missing_one_is_bad():
    """Issue 31, item 8: the connector's state from Connect's REST API, its failed task's own error
    line, a connector missing after the handoff, and Connect unreachable, each named."""
    from tidemark.realtime.cdc.connect import ConnectError, ConnectorState, TaskState
    from tidemark.status import CaptureStatus
    from tidemark.status.queries import with_connector

    class Connect:  # answers as Kafka Connect's REST API would, for one connector
        def __init__(self, state):
            self.answer = state

        def state(self, name):
            if isinstance(self.answer, Exception):
                raise self.answer
            return ConnectorState(name, self.answer[0], self.answer[1])

    handed = CaptureStatus("cdc:run-1", "0/16B3748", slot="s")
    running = with_connector(handed, Connect(("RUNNING", (TaskState(0, "RUNNING"),))), "tidemark-cdc-x")
    assert (running.connector, running.connector_ok) == ("tidemark-cdc-x RUNNING, task 0 RUNNING", True)
    assert running.text().startswith("connector tidemark-cdc-x RUNNING, task 0 RUNNING; handoff cdc:run-1")
    trace = "org.apache.kafka.connect.errors.ConnectException: password authentication failed\n\tat x.y(Z.java:1)"
    failed = with_connector(handed, Connect(("RUNNING", (TaskState(0, "FAILED", trace),))), "c")
    assert failed.connector == ("c RUNNING, task 0 FAILED (org.apache.kafka.connect.errors.ConnectException: "
                                "password authentication failed)") and failed.connector_ok is False
    missing = with_connector(handed, Connect(("MISSING", ())), "c")
    assert (missing.connector, missing.connector_ok) == ("c not created", False)
    waiting = with_connector(CaptureStatus(slot="s"), Connect(("MISSING", ())), "c")
    assert (waiting.connector, waiting.connector_ok) == ("c not created yet (after the handoff)", True)
    away = with_connector(handed, Connect(ConnectError("GET /connectors/c/status", None, "no answer")), "c")
    assert away.connector == "state unknown (Kafka Connect GET /connectors/c/status: no answer)"
    assert away.connector_ok is False
    unresolved = with_connector(handed, ValueError("connection tidemark_connect missing"), "c")
    assert unresolved.connector_ok is False and "tidemark_connect missing" in unresolved.connector


def test_a_waiting_re_snapshot_is_on_the_capture_line_in_amber_until_a_handoff_commits_after_it():
    """A re-snapshot a person asked for and no handoff has answered yet (``ledger.resnapshot_asked``): the
    capture line says who, when, why and what happens next, marked for attention (not bad); its connector
    kept STOPPED and its slot unread are what was asked for. A handoff committed after the request answers
    it: the ledger then has no waiting request, and the line is the capture's state alone."""
    import html
    from dataclasses import replace

    from tidemark.ledger import ResnapshotRequest
    from tidemark.realtime.cdc.connect import ConnectorState
    from tidemark.realtime.cdc.source import Slot
    from tidemark.status import CaptureStatus, StatusReport, status_lines
    from tidemark.status.queries import with_connector, with_slot
    from tidemark_airflow.status_page import render_html

    class Connect:  # Kafka Connect's answer for a connector the supervisor stopped
        def state(self, name):
            return ConnectorState(name, "STOPPED", ())

    asked = ResnapshotRequest("alice <a@b>", T0.astimezone(CET), "suspected drift")
    handed = CaptureStatus("cdc:run-1", "0/16B3748", "0/17000A0", T0, "tidemark_cdc", resnapshot=asked)
    slot = Slot("tidemark_cdc", False, "reserved", 3 << 20, "0/17000A0")
    waiting = with_slot(with_connector(handed, Connect(), "c"), slot)

    def report(capture):
        return StatusReport(generated_at=T0, pipelines_dir="/specs", control_schema=True,
                            pipelines=[PipelineStatus("cdc", "/specs/cdc.yaml", source_conn_id="tidemark_source",
                                                      cursor_kind="timestamp")],
                            sources=[], orphan_stage_tables=[],
                            streams=[StreamStatus("cdc", "running", serving_view="rt.cdc", capture=capture)])

    said = ("re-snapshot asked by alice <a@b> at 2026-11-22T08:00:00+00:00 (suspected drift): waiting for the "
            "pipeline's next batch run, which will be a new handoff (slot tidemark_cdc made again with a snapshot of "
            "the table); the supervisor keeps the connector stopped until that handoff commits, then resumes it on "
            "the new slot; next: the batch DAG's scheduled run, or Trigger it")
    assert f"; capture: {said}; connector c STOPPED, no task; handoff cdc:run-1 at 0/16B3748;" in status_lines(
        report(waiting))[0]
    assert waiting.connector_ok is True and not waiting.is_bad()  # stopped and unread: asked for
    page = render_html(report(waiting))
    assert (f"capture: <span class=warn>{html.escape(said)}</span>; "
            "<span>connector c STOPPED, no task;") in page
    assert report(waiting).to_json()["streams"][0]["capture"]["resnapshot"] == {
        "actor": "alice <a@b>", "at": "2026-11-22T08:00:00+00:00", "reason": "suspected drift"}
    assert "re-snapshot asked by bob at 2026-11-22T08:00:00+00:00: waiting" in replace(
        handed, resnapshot=ResnapshotRequest("bob", T0, None)).text()  # no reason given: none shown

    # the new handoff committed after the request: nothing waits, and a stopped connector is bad again
    answered = with_slot(with_connector(replace(handed, handoff_batch="cdc:run-2", resnapshot=None), Connect(), "c"),
                         slot)
    assert "re-snapshot" not in status_lines(report(answered))[0]
    assert answered.connector_ok is False and answered.is_bad()
    assert "class=warn" not in render_html(report(answered)).split("<table id=streams>")[1]


def test_an_extracts_held_snapshot_is_said_against_its_limit():
    """Issue 52: while an extract holds its snapshot of the source (vacuum waits for it), the page says so."""
    from tidemark.status.model import Lag

    assert Lag(seconds=3.0).snapshot_text() == ""
    said = Lag(seconds=3.0, snapshot_held_s=75.0, snapshot_limit_s=3600.0).snapshot_text()
    assert said == ("extract reading in one snapshot of the source, held 1m 15s of max_snapshot_hold 1h 00m "
                    "(vacuum waits for it)")


def test_kafka_connect_down_is_a_health_row_with_its_next_step_and_holds_the_cdc_pipelines_only():
    """Issue 53, item 5: Connect is checked like the broker (one row, since when, the next step), and a
    CDC pipeline's line is held by it, not a raw urlopen error per connector."""
    import socket

    from tidemark.realtime.cdc.connect import ConnectClient
    from tidemark.status import CaptureStatus, health_lines
    from tidemark.status.health import track_health
    from tidemark.status.holds import pipeline_holds
    from tidemark.status.report import connect_view

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    probe = connect_view(ConnectClient(f"http://127.0.0.1:{port}", timeout_s=1.0))
    assert (probe.component, probe.kind, probe.address) == ("connect", "connect", f"http://127.0.0.1:{port}")
    assert "Connection refused" in probe.error, probe.error
    first, state = track_health([probe], {}, T0)
    later, _ = track_health([probe], state, T0 + timedelta(minutes=5))
    [down] = later
    assert down.since == T0 and not down.reachable and "make start C=connect" in down.next_step
    report = StatusReport(generated_at=T0 + timedelta(minutes=5), pipelines_dir="/specs", control_schema=True,
                          pipelines=[], sources=[], orphan_stage_tables=[], health=later)
    assert health_lines(report)[0].startswith(f"connect: http://127.0.0.1:{port} UNREACHABLE since 2026-11-22T08:00:00")
    cdc = PipelineStatus("cdc", "/specs/cdc.yaml", source_conn_id="tidemark_source", cursor_kind="timestamp")
    held = pipeline_holds(cdc, health=later, source=None, now=T0,
                          stream=StreamStatus("cdc", "running", serving_view="rt.cdc", capture=CaptureStatus(slot="s")))
    assert [(h.by, h.what) for h in held] == [("connect", f"Kafka Connect unreachable (http://127.0.0.1:{port})")]
    batch = PipelineStatus("ledger", "/specs/ledger.yaml", source_conn_id="tidemark_source", cursor_kind="timestamp")
    assert pipeline_holds(batch, health=later, source=None, stream=None, now=T0) == []
    assert connect_view(KeyError("tidemark_connect")).error.startswith("connection tidemark_connect: ")


def test_a_standalone_spark_master_is_a_health_row_and_local_mode_is_none():
    """Issue 53 item 5: the Spark master, when the jobs use one, is in the health table."""
    import socket

    from tidemark.status.health import next_step
    from tidemark.status.report import spark_view

    assert spark_view("local[2]") is None and spark_view(None) is None
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        up = spark_view(f"spark://127.0.0.1:{listening.getsockname()[1]}")
        closed = listening.getsockname()[1]
    assert (up.component, up.error) == ("spark", None)
    down = spark_view(f"spark://127.0.0.1:{closed}")
    assert down.error and "refused" in down.error.lower(), down
    assert "start the Spark master" in next_step("spark", "tidemark_spark", down.error)
    unresolved = spark_view(KeyError("tidemark_spark"))
    assert unresolved.address is None and unresolved.error.startswith("connection tidemark_spark")


def test_the_report_with_a_standalone_spark_master_lists_it_whatever_its_state(tmp_path):
    """A `spark://` master (compose's) or an unreadable connection is a health row, and the page is whole."""
    from tidemark.status.health import probe_spark_master
    from tidemark.status.report import collect

    for master in ("spark://127.0.0.1:9", "spark://127.0.0.1:9,127.0.0.1:10", KeyError("tidemark_spark")):
        report = collect([], None, lambda _c: (_ for _ in ()).throw(OSError("no source")),
                         open_warehouse=lambda: (_ for _ in ()).throw(OSError("no warehouse")),
                         health_path=tmp_path / "health.json", spark_master=master)
        assert [h.component for h in report.health if h.component == "spark"] == ["spark"], report.health
    assert "no master accepts a connection" in probe_spark_master("spark://127.0.0.1:9,127.0.0.1:10")

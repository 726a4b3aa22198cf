"""A CDC pipeline's Debezium connector, made from its spec: every setting Tidemark relies on, no secret."""

from __future__ import annotations

import pytest

from tidemark.protocol.replication import Replication
from tidemark.protocol.spec import PipelineSpec
from tidemark.realtime.cdc.connect import ConnectorState, TaskState
from tidemark.realtime.cdc.connector import SourceEndpoint, connector_config
from tidemark.realtime.cdc.groups import capture_of, captures, connector_name
from tidemark.realtime.cdc.signing import SigningKey

SPEC = {"name": "ledger", "table": "core.ledger_entries", "primary_key": ["entry_id"],
        "cursor": {"kind": "timestamp", "column": "updated_at"}, "safe_lag": "PT5M", "target_table": "dw.ledger",
        "sink": {"mode": "standing"},
        "cdc": {"target_table": "rt.ledger", "serving_view": "serving.ledger", "heartbeat": "PT3S"}}
SIGNING = SigningKey("k2", "tidemark-cdc-signing-k2")
ONE = Replication(1, 1)  # one broker
SOURCE = SourceEndpoint("db.internal", 5432, "core", "tidemark_cdc", "tidemark_cdc", "/opt/connect/secrets", SIGNING)


def test_the_connector_reads_the_pipelines_slot_and_publication_and_holds_no_secret():
    spec = PipelineSpec.model_validate(SPEC)
    config = connector_config(capture_of(spec, [spec]), SOURCE, replication=ONE)
    assert connector_name(spec) == "tidemark-cdc-ledger"
    assert config["slot.name"] == config["publication.name"] == "tidemark_ledger"
    assert config["publication.autocreate.mode"] == "disabled"  # the DBA's publication, least privilege
    assert config["database.password"] == "${dir:/opt/connect/secrets:tidemark_cdc}"
    # every record signed by the worker, with a key it reads from its secrets directory
    assert config["value.converter"] == "tidemark.connect.SigningJsonConverter"
    assert config["value.converter.signing.key.id"] == "k2"
    assert config["value.converter.signing.secret"] == "${dir:/opt/connect/secrets:tidemark-cdc-signing-k2}"
    assert config["table.include.list"] == r"core\.ledger_entries"  # Debezium reads a regular expression
    assert config["topic.prefix"] == "tidemark.cdc.ledger" and config["heartbeat.interval.ms"] == "3000"
    assert config["decimal.handling.mode"] == "string" and config["provide.transaction.metadata"] == "true"
    assert config["snapshot.mode"] == "no_data" and config["tasks.max"] == "1"
    assert all(isinstance(v, str) for v in config.values())


def test_no_connector_without_cdc_and_no_path_tricks_in_the_secret_reference():
    spec = PipelineSpec.model_validate({k: v for k, v in SPEC.items() if k not in ("cdc", "sink")})
    with pytest.raises(ValueError, match="pipeline ledger has no cdc section"):
        connector_config(capture_of(spec, [spec]), SOURCE, replication=ONE)
    alone = capture_of(PipelineSpec.model_validate(SPEC), [])
    with pytest.raises(ValueError, match="secret file name '../etc/passwd'"):
        connector_config(alone, SourceEndpoint("h", 1, "d", "u", "../etc/passwd", "/s", SIGNING), replication=ONE)
    with pytest.raises(ValueError, match="secret file name '../k'"):
        connector_config(alone, SourceEndpoint("h", 1, "d", "u", "p", "/s", SigningKey("k", "../k")), replication=ONE)


def member(name: str, table: str, group: str | None = "bank", heartbeat: str = "PT10S") -> PipelineSpec:
    return PipelineSpec.model_validate({**SPEC, "name": name, "table": table, "target_table": f"dw.{name}",
                                        "cdc": {"target_table": f"rt.{name}", "serving_view": f"serving.{name}",
                                                "group": group, "heartbeat": heartbeat}})


def test_a_capture_group_has_one_slot_connector_and_transaction_topic_for_all_its_tables():
    entries, balances = member("ledger", "core.ledger_entries"), member("balances", "core.balances", heartbeat="PT2S")
    alone = member("fx", "core.fx_rates", group=None)
    group, single = captures([entries, alone, balances])
    assert [m.name for m in group.members] == ["balances", "ledger"] and group.lead.name == "balances"
    assert group.slot == entries.cdc_slot == balances.cdc_slot == "tidemark_group_bank"
    assert group.connector == connector_name(entries) == "tidemark-cdc-group-bank"
    assert entries.cdc_topic == "tidemark.cdcgroup.bank.core.ledger_entries"
    assert group.topics == {"tidemark.cdcgroup.bank.core.balances": 1, "tidemark.cdcgroup.bank.core.ledger_entries": 1,
                            "tidemark.cdcgroup.bank.core.tidemark_heartbeat": 1, "tidemark.cdcgroup.bank.transaction": 1}
    assert group.realtime_topics(balances) == group.topics and group.realtime_topics(entries) == {}
    assert group.member_for(entries.cdc_topic) == entries and group.member_for(alone.cdc_topic) is None
    assert group.consumer == "capture-group.bank" and single.consumer == "batch-sink.fx"
    config = connector_config(group, SOURCE, replication=ONE)
    # the group's heartbeat row: a source transaction in its stream at every heartbeat, however quiet its tables
    assert config["table.include.list"] == r"core\.balances,core\.ledger_entries,core\.tidemark_heartbeat"
    assert config["heartbeat.action.query"] == ('INSERT INTO "core"."tidemark_heartbeat" (capture, beat_at) VALUES '
                                                "('bank', now()) ON CONFLICT (capture) DO UPDATE SET beat_at = "
                                                "EXCLUDED.beat_at")
    assert "heartbeat.action.query" not in connector_config(single, SOURCE, replication=ONE)
    assert config["slot.name"] == "tidemark_group_bank" and config["topic.prefix"] == "tidemark.cdcgroup.bank"
    assert config["heartbeat.interval.ms"] == "2000"  # the most frequent member's
    assert single.realtime_topics(alone) == {alone.cdc_topic: 1, alone.cdc_transaction_topic: 1} == single.topics


def test_a_connector_runs_only_when_it_and_every_task_run_and_a_failed_task_gives_its_own_error_line():
    failed = TaskState(0, "FAILED", "org.apache.kafka.connect.errors.ConnectException: slot is active\n\tat x.y(Z)")
    assert not ConnectorState("c", "RUNNING", (failed,)).running
    assert ConnectorState("c", "RUNNING", (failed,)).failed_tasks[0].error_line == (
        "org.apache.kafka.connect.errors.ConnectException: slot is active")
    assert not ConnectorState("c", "RUNNING").running  # no task assigned yet
    assert ConnectorState("c", "RUNNING", (TaskState(0, "RUNNING"),)).running


def test_the_grants_command_prints_a_groups_statements_to_pipe_into_psql_and_they_can_run_again(tmp_path, capsys):
    """Issue 53, item 3: what the source's owner runs, printed by a command; the publication is set to the
    group's tables when it exists, so the same statements run again when a member joins."""
    import json

    from tidemark.realtime.cdc import grants

    for spec in (member("ledger", "core.ledger_entries"), member("balances", "core.balances")):
        (tmp_path / f"{spec.name}.yaml").write_text(json.dumps(spec.model_dump(mode="json", exclude_none=True)))
    assert grants.main(["ledger", "--pipelines", str(tmp_path), "--role", "cdc_reader"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "-- capture group bank (balances, ledger; lead balances): run as the owner of its tables, on the " \
                     "source database"
    statements = [line for line in out if not line.startswith("--")]
    assert all(s.endswith(";") for s in statements)
    publication = next(s for s in statements if s.startswith("DO $$"))
    tables = '"core"."balances", "core"."ledger_entries", "core"."tidemark_heartbeat"'
    assert (f'ALTER PUBLICATION "tidemark_group_bank" SET TABLE {tables}; ELSE CREATE PUBLICATION '
            f'"tidemark_group_bank" FOR TABLE {tables}; END IF;') in publication
    assert 'GRANT SELECT ON "core"."ledger_entries" TO "cdc_reader";' in statements
    assert grants.main(["fx", "--pipelines", str(tmp_path)]) == 2
    assert "no pipeline fx in" in capsys.readouterr().err

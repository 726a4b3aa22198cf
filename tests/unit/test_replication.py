"""Topics sized for the cluster (``tidemark.protocol.replication``): the defaults, what a connection may
say, and every refusal naming the topic, both numbers and the next step."""

from __future__ import annotations

import json

import pytest

from tidemark.protocol.replication import Replication
from tidemark.realtime.cdc.connector import connector_config
from tidemark.realtime.cdc.groups import capture_of
from tidemark_airflow.hooks import KafkaHook


@pytest.mark.parametrize(("brokers", "factor", "min_insync"), [(1, 1, 1), (2, 2, 1), (3, 3, 2), (5, 3, 2)])
def test_unsaid_the_replicas_follow_the_cluster(brokers, factor, min_insync):
    assert Replication().settle(brokers) == Replication(factor, min_insync)


def test_what_the_connection_says_wins_and_the_rest_follows_from_it():
    assert Replication(5).settle(3) == Replication(5, 4)  # refused later: too few brokers, not silently lowered
    assert Replication(2).settle(5) == Replication(2, 1)
    assert Replication(min_insync=3).settle(3) == Replication(3, 3)
    # more in sync than replicas: kept, and every topic refused with the reason (never lowered unsaid)
    assert Replication(min_insync=3).settle(1) == Replication(1, 3)
    too_many, = Replication(1, 3).refusals("t", 1, replicas=1, min_insync=1, unclean=False)
    assert "min.insync.replicas 3 exceeds the replication factor 1" in too_many
    assert Replication(3, 2).topic_config() == {"min.insync.replicas": "2", "unclean.leader.election.enable": "false"}
    assert Replication(3).args() == ["--replication-factor", "3"] and Replication().args() == []


@pytest.mark.parametrize("extra", [{"replication.factor": 0}, {"replication.factor": "three"},
                                   {"replication.factor": True}, {"min.insync.replicas": -1},
                                   {"replication.factor": 2, "min.insync.replicas": 3}])
def test_a_malformed_setting_names_the_connection_and_the_key(extra):
    with pytest.raises(ValueError, match=r"^conn x: .*(replication.factor|min.insync.replicas)"):
        Replication.from_extra(extra, source="conn x")


def test_the_kafka_hook_reads_the_settings_from_the_extra(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_TIDEMARK_KAFKA", json.dumps({"conn_type": "kafka", "extra": {
        "bootstrap.servers": "b1:9092,b2:9092,b3:9092", "replication.factor": "3", "min.insync.replicas": 2}}))
    assert KafkaHook().replication() == Replication(3, 2)
    monkeypatch.setenv("AIRFLOW_CONN_TIDEMARK_KAFKA", json.dumps({"conn_type": "kafka", "extra": {
        "bootstrap.servers": "b1:9092", "min.insync.replicas": 0}}))
    with pytest.raises(ValueError, match="Airflow connection tidemark_kafka .*min.insync.replicas"):
        KafkaHook().replication()


def test_an_existing_topic_is_refused_for_each_weaker_setting_with_its_next_step():
    want = Replication(3, 2)
    assert want.refusals("t", 3, replicas=3, min_insync=2, unclean=False) == []
    assert want.refusals("t", 3, replicas=4, min_insync=3, unclean=False) == []
    fewer, = want.refusals("t", 3, replicas=1, min_insync=2, unclean=False)
    assert "'t' has 1 replica(s)" in fewer and "asks for 3" in fewer and "kafka-reassign-partitions" in fewer
    lower, = want.refusals("t", 3, replicas=3, min_insync=1, unclean=False)
    assert "min.insync.replicas=1" in lower and "asks for 2" in lower and "--add-config min.insync.replicas=2" in lower
    unclean, = want.refusals("t", 3, replicas=3, min_insync=2, unclean=True)
    assert "unclean.leader.election.enable=false" in unclean
    assert len(want.refusals("t", 3, replicas=1, min_insync=1, unclean=True)) == 3


def test_a_topic_is_not_made_on_fewer_brokers_than_its_replicas():
    short, = Replication(3, 2).refusals("t", 2, replicas=None, min_insync=None, unclean=None)
    assert "needs 3 replicas" in short and "has 2 broker(s)" in short
    assert Replication(2, 1).refusals("t", 2, replicas=None, min_insync=None, unclean=None) == []


def test_debeziums_change_topics_are_made_as_tidemarks_own():
    from test_cdc_connector import SOURCE, SPEC

    from tidemark.protocol.spec import PipelineSpec

    spec = PipelineSpec.model_validate(SPEC)
    said = connector_config(capture_of(spec, [spec]), SOURCE, replication=Replication(3, 2))
    assert said["topic.creation.default.replication.factor"] == "3"
    assert said["topic.creation.default.min.insync.replicas"] == "2"
    assert said["topic.creation.default.unclean.leader.election.enable"] == "false"
    with pytest.raises(ValueError, match="not settled for the cluster"):
        connector_config(capture_of(spec, [spec]), SOURCE, replication=Replication(3))

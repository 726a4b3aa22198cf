"""The real KRaft broker: transactions, read_committed, aborted writes stay invisible."""

import pytest
from confluent_kafka import Producer

from tidemark.protocol.kafka_io import end_offsets, producer_config, read_committed

pytestmark = pytest.mark.stack


def _transactional(bootstrap: str, txn_id: str) -> Producer:
    producer = Producer(producer_config(bootstrap, **{"transactional.id": txn_id}))
    producer.init_transactions(30)
    return producer


def test_committed_transaction_is_read_and_aborted_one_is_invisible(bootstrap, topic):
    start = end_offsets(bootstrap, topic)
    producer = _transactional(bootstrap, f"{topic}-txn")

    producer.begin_transaction()
    for i in range(50):
        producer.produce(topic, key=f"committed-{i}", value=b"keep")
    producer.commit_transaction(30)

    producer.begin_transaction()
    for i in range(50):
        producer.produce(topic, key=f"aborted-{i}", value=b"drop")
    producer.flush(30)  # the aborted records really reach the log before the abort
    producer.abort_transaction(30)

    producer.begin_transaction()
    producer.produce(topic, key="after-abort", value=b"keep")
    producer.commit_transaction(30)

    raw_offsets = sum(end_offsets(bootstrap, topic).values()) - sum(start.values())
    records = list(read_committed(bootstrap, topic, start))
    keys = {r.key.decode() for r in records}
    assert len(records) == 51
    assert keys == {f"committed-{i}" for i in range(50)} | {"after-abort"}
    assert {r.value for r in records} == {b"keep"}
    # the aborted records occupy offsets in the log: read_committed skipped them
    assert raw_offsets >= 101


def test_open_transaction_blocks_read_committed_until_commit(bootstrap, topic):
    start = end_offsets(bootstrap, topic)
    producer = _transactional(bootstrap, f"{topic}-open")
    producer.begin_transaction()
    producer.produce(topic, key="pending", value=b"v")
    producer.flush(30)
    assert list(read_committed(bootstrap, topic, start)) == []
    producer.commit_transaction(30)
    assert [r.key for r in read_committed(bootstrap, topic, start)] == [b"pending"]


def test_topics_are_made_for_the_cluster_and_a_plan_refuses_one_with_fewer_replicas_than_asked(
        settings, bootstrap, warehouse_conn, tmp_path, monkeypatch):
    """The Kafka connection asks for one replica more than the cluster has brokers (on one node: 2): the
    plan task refuses the pipeline's existing topic, naming it, both numbers and the next step, before it
    records anything; a topic that does not exist yet is not made on too few brokers."""
    import json
    import uuid

    from airflow.sdk.exceptions import AirflowFailException
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    from tidemark.protocol.kafka_io import ensure_topic
    from tidemark.protocol.replication import Replication, TopicRefused
    from tidemark_airflow.batch import PlanWindowOperator

    name = f"replicas_{uuid.uuid4().hex[:8]}"
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(f"name: {name}\ntable: public.{name}\nprimary_key: [id]\n"
                    "cursor: {kind: timestamp, column: updated_at}\nsafe_lag: PT5M\n"
                    f"target_table: public.{name}_target\n")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    brokers = len(admin.list_topics(timeout=30).brokers)
    assert brokers == settings.kafka_nodes
    made = Replication().settle(brokers)
    ensure_topic(bootstrap, f"tidemark.{name}", 3)  # as an earlier run made it, for the cluster
    try:
        meta = admin.list_topics(f"tidemark.{name}", timeout=30).topics[f"tidemark.{name}"]
        assert {len(p.replicas) for p in meta.partitions.values()} == {made.factor}
        resource = ConfigResource(ResourceType.TOPIC, f"tidemark.{name}")
        config = admin.describe_configs([resource])[resource].result(timeout=30)
        assert config["min.insync.replicas"].value == str(made.min_insync)
        assert config["unclean.leader.election.enable"].value == "false"

        monkeypatch.setenv("AIRFLOW_CONN_TIDEMARK_KAFKA", json.dumps({"conn_type": "kafka", "extra": {
            "bootstrap.servers": bootstrap, "replication.factor": brokers + 1}}))
        run = type("Run", (), {"run_id": "manual__replicas", "run_type": "manual"})()
        with pytest.raises(AirflowFailException) as refused:
            PlanWindowOperator(task_id="plan", spec_path=str(spec)).execute({"dag_run": run, "params": {}})
        said = str(refused.value)
        for part in (f"pipeline={name}", f"topic 'tidemark.{name}' has {made.factor} replica(s)",
                     f"asks for {brokers + 1}", "kafka-reassign-partitions", "replication.factor"):
            assert part in said, f"{part!r} missing from the plan's failure: {said}"
        with warehouse_conn, warehouse_conn.cursor() as cur:
            cur.execute("SELECT to_regclass('tidemark_control.batches') IS NOT NULL")
            if cur.fetchone()[0]:
                cur.execute("SELECT count(*) FROM tidemark_control.batches WHERE pipeline = %s", (name,))
                assert cur.fetchone()[0] == 0, "a refused plan recorded a batch"

        with pytest.raises(TopicRefused, match=rf"needs {brokers + 1} replicas but the cluster has {brokers} broker"):
            ensure_topic(bootstrap, f"tidemark.{name}.new", 1, replication=Replication(brokers + 1))
        assert f"tidemark.{name}.new" not in admin.list_topics(timeout=30).topics
    finally:
        admin.delete_topics([f"tidemark.{name}"])[f"tidemark.{name}"].result(timeout=30)

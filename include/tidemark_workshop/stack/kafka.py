"""Apache Kafka in KRaft mode, from Maven Central jars: one node by default, or a replicated cluster.

Each node is a combined broker and controller with its own ports and state directory. One node
(``TIDEMARK_KAFKA_NODES=1``, the default) forms its quorum alone (``--standalone``); several form a
static quorum (``controller.quorum.voters``). Every replication setting follows the node count as
Tidemark's topics do (``tidemark.protocol.replication``): internal topics and the brokers' defaults at
min(3, nodes) replicas, one fewer in sync from three, and unclean leader election off.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

from tidemark.protocol.replication import Replication
from tidemark_workshop.settings import REPO_ROOT, Settings
from tidemark_workshop.stack.maven import resolve
from tidemark_workshop.stack.proc import StackError, read_pid, run, say, spawn, stop_pid, wait_until

POM = REPO_ROOT / "stack" / "kafka" / "pom.xml"
LOG4J = REPO_ROOT / "stack" / "kafka" / "log4j2.properties"


class KafkaNode:
    """One KRaft node (``node`` from 1): the first keeps the single-node layout (``kafka/data``,
    ``kafka.pid``, ``logs/kafka.log``); node k keeps ``kafka/node-k``."""

    def __init__(self, settings: Settings, node: int):
        self.s, self.node = settings, node
        self.port, self.controller_port = settings.kafka_node_ports(node)
        self.bootstrap = f"127.0.0.1:{self.port}"
        home = settings.kafka_dir if node == 1 else settings.kafka_dir / f"node-{node}"
        self.libs = settings.kafka_dir / "libs"
        self.data = home / "data"
        self.config = home / "server.properties"
        self.pid_file = home / "kafka.pid"
        self.log = settings.logs_dir / ("kafka.log" if node == 1 else f"kafka-{node}.log")
        self.name = "kafka" if settings.kafka_nodes == 1 else f"kafka-{node}"

    def _properties(self) -> str:
        s, nodes = self.s, self.s.kafka_nodes
        settled = Replication().settle(nodes)
        quorum = (f"controller.quorum.bootstrap.servers=127.0.0.1:{self.controller_port}" if nodes == 1 else
                  "controller.quorum.voters=" + ",".join(f"{k}@127.0.0.1:{s.kafka_node_ports(k)[1]}"
                                                          for k in range(1, nodes + 1)))
        return "\n".join([
            "process.roles=broker,controller",
            f"node.id={self.node}",
            quorum,
            f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names=CONTROLLER",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "inter.broker.listener.name=PLAINTEXT",
            f"log.dirs={self.data}",
            "num.partitions=1",
            # the cluster's own topics and every topic made without a setting (Debezium's, at -1) replicated
            # as Tidemark's: a write counts once all but one replica hold it
            f"default.replication.factor={settled.factor}",
            f"min.insync.replicas={settled.min_insync}",
            "unclean.leader.election.enable=false",
            f"offsets.topic.replication.factor={settled.factor}",
            f"transaction.state.log.replication.factor={settled.factor}",
            f"transaction.state.log.min.isr={settled.min_insync}",
            f"share.coordinator.state.topic.replication.factor={settled.factor}",
            f"share.coordinator.state.topic.min.isr={settled.min_insync}",
            # topics are created deliberately, with their partition count, never by a typo
            "auto.create.topics.enable=false",
            "group.initial.rebalance.delay.ms=0",
            "",
        ])

    def java(self, main: str, *args: str) -> list[str]:
        return [
            "java", "-Xms256m", "-Xmx768m", f"-Dlog4j2.configurationFile={LOG4J}",
            "-cp", f"{self.libs}/*", main, *args,
        ]

    def pid(self) -> int | None:
        return read_pid(self.pid_file)

    def is_running(self) -> bool:
        return self.pid() is not None

    def answers(self) -> bool:
        from confluent_kafka.admin import AdminClient

        try:  # cheap port probe first: librdkafka would log every refused connection
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            return False
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "socket.timeout.ms": 2000, "log_level": 0})
        try:
            return self.node in admin.list_topics(timeout=2).brokers  # itself registered, not a peer's view
        except Exception:  # noqa: BLE001 - any failure means "not yet"
            return False

    def format(self, cluster_id: str) -> None:
        self.config.parent.mkdir(parents=True, exist_ok=True)
        self.config.write_text(self._properties())
        if (self.data / "meta.properties").exists():
            return
        say(self.name, f"formatting KRaft storage in {self.data}")
        alone = ["--standalone"] if self.s.kafka_nodes == 1 else []
        run(self.java("kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(self.config), *alone),
            what=f"{self.name} storage format")

    def spawn(self) -> bool:
        """Start the node unless it runs and answers; False when it was running already."""
        if self.is_running() and self.answers():
            return False
        if self.is_running():
            stop_pid(self.pid_file)
        elif self.answers():
            raise StackError(
                f"another Kafka broker already answers on {self.bootstrap} (not this checkout's): stop it, or set "
                "TIDEMARK_KAFKA_PORT and TIDEMARK_KAFKA_CONTROLLER_PORT"
            )
        say(self.name, f"starting node {self.node} on {self.bootstrap}")
        spawn(self.java("kafka.Kafka", str(self.config)), log=self.log, pid_file=self.pid_file)
        return True

    def wait(self) -> None:
        wait_until(self.answers, timeout_s=120, what=f"Kafka node {self.node}", alive=self.is_running, log=self.log)

    def stop(self) -> bool:
        return stop_pid(self.pid_file)


class Kafka:
    """The local cluster: ``settings.kafka_nodes`` nodes, started and stopped together."""

    def __init__(self, settings: Settings):
        self.s = settings
        self.nodes = [KafkaNode(settings, k) for k in range(1, settings.kafka_nodes + 1)]
        self.cluster_id_file = settings.kafka_dir / "cluster.id"

    def is_running(self) -> bool:
        return any(n.is_running() for n in self.nodes)

    def answers(self) -> bool:
        return all(n.answers() for n in self.nodes)

    def _cluster_id(self) -> str:
        """One id for every node of the cluster, kept beside the first node's state; a state directory made
        for another node count is refused (its quorum and replicas would not match)."""
        formatted = (self.nodes[0].data / "meta.properties").exists()
        made_for = self.s.kafka_dir / "nodes"
        if formatted and (made_for.read_text().strip() if made_for.exists() else "1") != str(len(self.nodes)):
            raise StackError(f"the Kafka state in {self.s.kafka_dir} holds a cluster of "
                             f"{made_for.read_text().strip() if made_for.exists() else 1} node(s), not "
                             f"TIDEMARK_KAFKA_NODES={len(self.nodes)}: give the other size its own "
                             "TIDEMARK_STATE_DIR (or make down and delete that directory)")
        if not self.cluster_id_file.exists():
            out = run(self.nodes[0].java("kafka.tools.StorageTool", "random-uuid"), what="kafka random-uuid")
            self.cluster_id_file.parent.mkdir(parents=True, exist_ok=True)
            self.cluster_id_file.write_text(out.strip().splitlines()[-1])
            made_for.write_text(str(len(self.nodes)))
        return self.cluster_id_file.read_text().strip()

    def start(self) -> None:
        resolve(POM, self.nodes[0].libs)
        self.s.logs_dir.mkdir(parents=True, exist_ok=True)
        cluster_id = self._cluster_id()
        for node in self.nodes:
            node.format(cluster_id)
        started = [node.spawn() for node in self.nodes]  # all before any wait: a quorum needs a majority up
        for node in self.nodes:
            node.wait()
        if any(started):
            say("kafka", f"{len(self.nodes)} node(s) answer on {self.s.kafka_bootstrap}")
        else:
            say("kafka", f"already running on {self.s.kafka_bootstrap}")

    @contextmanager
    def away(self) -> Iterator[None]:
        """The cluster stopped for the ``with`` block and started again after it (outage tests)."""
        self.stop()
        try:
            yield
        finally:
            self.start()

    def stop(self) -> None:
        stopped = [node.stop() for node in reversed(self.nodes)]
        say("kafka", "stopped" if any(stopped) else "not running")

    def status(self) -> str:
        lines = []
        for node in self.nodes:
            state = "running" if node.is_running() else "stopped"
            if state == "running" and not node.answers():
                state = "starting"
            lines.append(f"{node.name:9} {state:8} {node.bootstrap}  data={node.data}  log={node.log}")
        return "\n".join(lines)


def require_broker(settings: Settings) -> None:
    if not Kafka(settings).answers():
        raise StackError(f"no Kafka broker answers on {settings.kafka_bootstrap}: run `make up`")

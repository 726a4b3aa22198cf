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
from pathlib import Path

from tidemark.protocol.replication import Replication
from tidemark_workshop.settings import REPO_ROOT, Settings
from tidemark_workshop.stack.maven import resolve
from tidemark_workshop.stack.proc import StackError, read_pid, run, say, spawn, stop_pid, wait_until

POM = REPO_ROOT / "stack" / "kafka" / "pom.xml"
LOG4J = REPO_ROOT / "stack" / "kafka" / "log4j2.properties"


class KafkaNode:
    """One KRaft node (``node`` from 1): the first keeps the single-node layout (``kafka/data``,
    ``kafka.pid``, ``logs/kafka.log``); node k keeps ``kafka/node-k``."""

    def __init__(self, settings: Settings, node: int, home: Path):
        self.s, self.node = settings, node
        self.port, self.controller_port = settings.kafka_node_ports(node)
        self.bootstrap = f"127.0.0.1:{self.port}"
        own = home if node == 1 else home / f"node-{node}"
        self.libs = settings.kafka_dir / "libs"
        self.data = own / "data"
        self.config = own / "server.properties"
        self.pid_file = own / "kafka.pid"
        logs = settings.logs_dir if home == settings.kafka_dir else home / "logs"
        self.log = logs / ("kafka.log" if node == 1 else f"kafka-{node}.log")
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
            # the cluster's own topics and any topic made without a setting replicated as Tidemark's: a write
            # counts once all but one replica hold it
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

    def port_open(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            return True
        except OSError:
            return False

    def answers(self) -> bool:
        from confluent_kafka.admin import AdminClient

        if not self.port_open():  # cheap probe first: librdkafka would log every refused connection
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
        elif self.port_open():
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
    """The local cluster: ``settings.kafka_nodes`` nodes, started and stopped together; its state in the
    stack's ``kafka_dir``, or in ``home`` (a test's cluster beside the stack's, on other ports)."""

    def __init__(self, settings: Settings, home: Path | None = None):
        self.s = settings
        self.home = home or settings.kafka_dir
        self.nodes = [KafkaNode(settings, k, self.home) for k in range(1, settings.kafka_nodes + 1)]
        self.made_for = self.home / "nodes"  # the node count the state was formatted for
        ports = [p for node in self.nodes for p in (node.port, node.controller_port)]
        if len(set(ports)) != len(ports):
            raise StackError(f"Kafka's ports overlap ({ports}): node k listens on TIDEMARK_KAFKA_PORT and "
                             "TIDEMARK_KAFKA_CONTROLLER_PORT plus 2(k - 1); set them further apart")

    def is_running(self) -> bool:
        return any(n.is_running() for n in self.nodes)

    def answers(self) -> bool:
        return all(n.answers() for n in self.nodes)

    def _cluster_id(self) -> str:
        """The cluster's id: the first node's when it is formatted (a state directory made for another node
        count is refused: its quorum and replicas would not match), else a new one."""
        meta = self.nodes[0].data / "meta.properties"
        if not meta.exists():
            return run(self.nodes[0].java("kafka.tools.StorageTool", "random-uuid"), what="kafka random-uuid"
                       ).strip().splitlines()[-1]
        made_for = int(self.made_for.read_text()) if self.made_for.exists() else 1  # older states: one node
        if made_for != len(self.nodes):
            raise StackError(f"the Kafka state in {self.home} holds a cluster of {made_for} node(s), not "
                             f"TIDEMARK_KAFKA_NODES={len(self.nodes)}: give the other size its own "
                             "TIDEMARK_STATE_DIR (or make down and delete that directory)")
        return next(line.split("=", 1)[1].strip() for line in meta.read_text().splitlines()
                    if line.startswith("cluster.id="))

    def start(self) -> None:
        resolve(POM, self.nodes[0].libs)
        for node in self.nodes:
            node.log.parent.mkdir(parents=True, exist_ok=True)
        cluster_id = self._cluster_id()
        for node in self.nodes:
            node.format(cluster_id)
        self.made_for.write_text(str(len(self.nodes)))
        started = [node.spawn() for node in self.nodes]  # all before any wait: a quorum needs a majority up
        for node in self.nodes:
            node.wait()
        if any(started):
            say("kafka", f"{len(self.nodes)} node(s) answer on {self.s.kafka_bootstrap}")
        else:
            say("kafka", f"already running on {self.s.kafka_bootstrap}")

    def node(self, node_id: int) -> KafkaNode:
        return self.nodes[node_id - 1]

    def leader(self, topic: str, partition: int = 0) -> KafkaNode:
        """The node leading ``partition`` of ``topic`` now (a failover trial kills it)."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.s.kafka_bootstrap, "log_level": 0})
        leader = admin.list_topics(topic, timeout=10).topics[topic].partitions[partition].leader
        if leader < 1:
            raise StackError(f"partition {partition} of {topic} has no leader now")
        return self.node(leader)

    @contextmanager
    def away(self) -> Iterator[None]:
        """The cluster stopped for the ``with`` block and started again after it (outage tests)."""
        self.stop()
        try:
            yield
        finally:
            self.start()

    def stop(self) -> None:
        """Every node at once: one by one, the last would wait out its grace period for a quorum gone."""
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(len(self.nodes)) as pool:
            stopped = list(pool.map(KafkaNode.stop, self.nodes))
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
        raise StackError(f"not every Kafka node answers on {settings.kafka_bootstrap}: run `make up`")

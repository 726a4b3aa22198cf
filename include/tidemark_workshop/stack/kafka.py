"""A real single-node Apache Kafka broker in KRaft mode, from Maven Central jars.

Combined broker + controller; internal topics (offsets, transaction state, share state) with
replication factor 1 so that transactions work on one broker.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

from tidemark_workshop.settings import REPO_ROOT, Settings
from tidemark_workshop.stack.maven import resolve
from tidemark_workshop.stack.proc import StackError, read_pid, run, say, spawn, stop_pid, wait_until

POM = REPO_ROOT / "stack" / "kafka" / "pom.xml"
LOG4J = REPO_ROOT / "stack" / "kafka" / "log4j2.properties"


class Kafka:
    def __init__(self, settings: Settings):
        self.s = settings
        self.libs = settings.kafka_dir / "libs"
        self.data = settings.kafka_dir / "data"
        self.config = settings.kafka_dir / "server.properties"
        self.pid_file = settings.kafka_dir / "kafka.pid"
        self.log = settings.logs_dir / "kafka.log"

    def _properties(self) -> str:
        s = self.s
        return "\n".join([
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.bootstrap.servers=127.0.0.1:{s.kafka_controller_port}",
            f"listeners=PLAINTEXT://127.0.0.1:{s.kafka_port},CONTROLLER://127.0.0.1:{s.kafka_controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{s.kafka_port}",
            "controller.listener.names=CONTROLLER",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "inter.broker.listener.name=PLAINTEXT",
            f"log.dirs={self.data}",
            "num.partitions=1",
            # one broker: every internal topic must be satisfiable with a single replica
            "offsets.topic.replication.factor=1",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "share.coordinator.state.topic.replication.factor=1",
            "share.coordinator.state.topic.min.isr=1",
            # topics are created deliberately, with their partition count, never by a typo
            "auto.create.topics.enable=false",
            "group.initial.rebalance.delay.ms=0",
            "",
        ])

    def _java(self, main: str, *args: str) -> list[str]:
        return [
            "java", "-Xms256m", "-Xmx768m", f"-Dlog4j2.configurationFile={LOG4J}",
            "-cp", f"{self.libs}/*", main, *args,
        ]

    def is_running(self) -> bool:
        return read_pid(self.pid_file) is not None

    def answers(self) -> bool:
        from confluent_kafka.admin import AdminClient

        try:  # cheap port probe first: librdkafka would log every refused connection
            socket.create_connection(("127.0.0.1", self.s.kafka_port), timeout=1).close()
        except OSError:
            return False
        admin = AdminClient(
            {"bootstrap.servers": self.s.kafka_bootstrap, "socket.timeout.ms": 2000, "log_level": 0}
        )
        try:
            admin.list_topics(timeout=2)
            return True
        except Exception:  # noqa: BLE001 - any failure means "not yet"
            return False

    def start(self) -> None:
        resolve(POM, self.libs)
        self.s.logs_dir.mkdir(parents=True, exist_ok=True)
        self.config.write_text(self._properties())
        if not (self.data / "meta.properties").exists():
            say("kafka", f"formatting KRaft storage in {self.data}")
            out = run(self._java("kafka.tools.StorageTool", "random-uuid"), what="kafka random-uuid")
            cluster_id = out.strip().splitlines()[-1]
            run(
                self._java("kafka.tools.StorageTool", "format", "-t", cluster_id,
                           "-c", str(self.config), "--standalone"),
                what="kafka storage format",
            )
        if self.is_running() and self.answers():
            say("kafka", f"already running on {self.s.kafka_bootstrap}")
            return
        if self.is_running():
            stop_pid(self.pid_file)
        elif self.answers():
            raise StackError(
                f"another Kafka broker already answers on {self.s.kafka_bootstrap} (not this checkout's): "
                "stop it, or set TIDEMARK_KAFKA_PORT and TIDEMARK_KAFKA_CONTROLLER_PORT"
            )
        say("kafka", f"starting broker on {self.s.kafka_bootstrap}")
        spawn(self._java("kafka.Kafka", str(self.config)), log=self.log, pid_file=self.pid_file)
        wait_until(self.answers, timeout_s=120, what="Kafka broker", alive=self.is_running, log=self.log)
        say("kafka", "broker answers")

    @contextmanager
    def away(self) -> Iterator[None]:
        """The broker stopped for the ``with`` block and started again after it (outage tests)."""
        self.stop()
        try:
            yield
        finally:
            self.start()

    def stop(self) -> None:
        if stop_pid(self.pid_file):
            say("kafka", "stopped")
        else:
            say("kafka", "not running")

    def status(self) -> str:
        state = "running" if self.is_running() else "stopped"
        if state == "running" and not self.answers():
            state = "starting"
        return f"kafka     {state:8} {self.s.kafka_bootstrap}  data={self.data}  log={self.log}"


def require_broker(settings: Settings) -> None:
    if not Kafka(settings).answers():
        raise StackError(f"no Kafka broker answers on {settings.kafka_bootstrap}: run `make up`")

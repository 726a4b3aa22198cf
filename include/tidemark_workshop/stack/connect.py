"""One Kafka Connect worker in distributed mode, with Debezium's PostgreSQL connector as a plugin.

Both come from Maven Central like the broker: the worker at the broker's version
(stack/connect/pom.xml), the connector apart into the plugin path (stack/connect/debezium/pom.xml)
so that it keeps its own class loader; Debezium's JDBC sink likewise (stack/connect/jdbc-sink/pom.xml,
the peer ``make bench-peers`` measures Tidemark against); and beside them Tidemark's converter that signs every record
the connector writes (stack/java/signing, built by Maven against the worker's Connect API). The worker's internal
topics have as many replicas as Tidemark's (min(3, Kafka nodes)); its REST API listens on 127.0.0.1 only. A keeper starts the worker again when it dies (kill -9, an OOM
kill), as compose's restart policy does: the pid file names the keeper, whose process group is the unit.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from tidemark.protocol.replication import Replication
from tidemark_workshop.settings import REPO_ROOT, Settings
from tidemark_workshop.stack.maven import build_java, install, resolve
from tidemark_workshop.stack.proc import StackError, group_process, read_pid, say, spawn, stop_pid, wait_until

POM = REPO_ROOT / "stack" / "connect" / "pom.xml"
DEBEZIUM_POM = REPO_ROOT / "stack" / "connect" / "debezium" / "pom.xml"
LOG4J = REPO_ROOT / "stack" / "kafka" / "log4j2.properties"
# The worker provides Kafka's and Connect's APIs (and SLF4J); a plugin's own copies would shadow them.
PROVIDED = frozenset({"connect-api", "kafka-clients", "slf4j-api"})
JDBC_SINK_POM = REPO_ROOT / "stack" / "connect" / "jdbc-sink" / "pom.xml"
DEBEZIUM_POSTGRES = "io.debezium.connector.postgresql.PostgresConnector"
JDBC_SINK = "io.debezium.connector.jdbc.JdbcSinkConnector"
GROUP = "tidemark-connect"


class Connect:
    def __init__(self, settings: Settings):
        self.s = settings
        self.libs = settings.connect_dir / "libs"
        self.plugins = settings.connect_dir / "plugins"
        self.config = settings.connect_dir / "worker.properties"
        self.pid_file = settings.connect_dir / "connect.pid"
        self.log = settings.logs_dir / "connect.log"

    def _properties(self) -> str:
        s = self.s
        replicas = Replication().settle(s.kafka_nodes).factor
        return "\n".join([
            f"bootstrap.servers={s.kafka_bootstrap}",
            f"group.id={GROUP}",
            f"listeners=http://127.0.0.1:{s.connect_port}",
            "rest.advertised.host.name=127.0.0.1",
            f"rest.advertised.port={s.connect_port}",
            f"plugin.path={self.plugins}",
            # change events as JSON with their schema: the sink reads each field's type from the event
            "key.converter=org.apache.kafka.connect.json.JsonConverter",
            "value.converter=org.apache.kafka.connect.json.JsonConverter",
            "key.converter.schemas.enable=true",
            "value.converter.schemas.enable=true",
            # the worker's own state (its connectors, their source offsets) replicated as Tidemark's topics
            "config.storage.topic=tidemark-connect-configs",
            "offset.storage.topic=tidemark-connect-offsets",
            "status.storage.topic=tidemark-connect-status",
            f"config.storage.replication.factor={replicas}",
            f"offset.storage.replication.factor={replicas}",
            f"status.storage.replication.factor={replicas}",
            # a change record counts once every in-sync replica holds it, and a retry never writes it twice
            "producer.acks=all",
            "producer.enable.idempotence=true",
            "offset.storage.partitions=5",
            "status.storage.partitions=1",
            "offset.flush.interval.ms=1000",
            # a connector creates its topics itself (the broker refuses automatic creation)
            "topic.creation.enable=true",
            # secrets in connector configs are references (${dir:<secrets dir>:<file>}), resolved here only
            "config.providers=dir",
            "config.providers.dir.class=org.apache.kafka.common.config.provider.DirectoryConfigProvider",
            f"config.providers.dir.param.allowed.paths={s.connect_secrets_dir}",
            "",
        ])

    def _java(self) -> list[str]:
        return [
            "java", "-Xms256m", "-Xmx1g", f"-Dlog4j2.configurationFile={LOG4J}",
            "-cp", f"{self.libs}/*", "org.apache.kafka.connect.cli.ConnectDistributed", str(self.config),
        ]

    def prepare(self) -> bool:
        """Jars and plugins in place; True when the signing converter was built anew or the JDBC sink
        resolved anew (a running worker has not loaded them)."""
        resolve(POM, self.libs)
        resolve(DEBEZIUM_POM, self.plugins / "debezium-postgres", skip_names=PROVIDED)
        jar = self.plugins / "tidemark-signing" / "tidemark-signing.jar"
        sink = self.plugins / "debezium-jdbc-sink" / ".resolved"
        before = [p.stat().st_mtime_ns if p.exists() else None for p in (jar, sink)]
        resolve(JDBC_SINK_POM, sink.parent, skip_names=PROVIDED)
        install(build_java(self.s.state_dir)["signing"], jar)  # the converter that signs change records
        return [p.stat().st_mtime_ns for p in (jar, sink)] != before

    def is_running(self) -> bool:
        return read_pid(self.pid_file) is not None

    def worker_pid(self) -> int | None:
        """The worker's JVM (the keeper's child, what an operator or the OOM killer kills); None: not running."""
        keeper = read_pid(self.pid_file)
        return None if keeper is None else group_process(keeper, "java")

    def get(self, path: str):
        with urllib.request.urlopen(self.s.connect_url + path, timeout=5) as response:
            return json.loads(response.read() or b"null")

    def _plugins(self) -> set[str]:
        """The connector classes the worker lists (empty: it does not answer)."""
        try:
            return {p.get("class") for p in self.get("/connector-plugins")}
        except (OSError, urllib.error.URLError, ValueError):
            return set()

    def answers(self) -> bool:
        """The REST API answers and lists Debezium's connector among its plugins (what the pipelines
        need; the JDBC sink serves ``make bench-peers`` only, and its absence is said, not fatal)."""
        return DEBEZIUM_POSTGRES in self._plugins()

    def start(self) -> None:
        rebuilt = self.prepare()
        self.s.logs_dir.mkdir(parents=True, exist_ok=True)
        self.s.connect_secrets_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.config.write_text(self._properties())
        if rebuilt and self.is_running():
            say("connect", "the signing converter or a plugin changed: restarting the worker to load it")
            stop_pid(self.pid_file)
        if self.is_running() and self.answers():
            say("connect", f"already running on {self.s.connect_url}")
            return
        if self.is_running():
            stop_pid(self.pid_file)
        elif self.answers():
            raise StackError(f"another Kafka Connect worker already answers on {self.s.connect_url} (not this "
                             "checkout's): stop it, or set TIDEMARK_CONNECT_PORT")
        say("connect", f"starting worker on {self.s.connect_url}")
        spawn(self._java(), log=self.log, pid_file=self.pid_file, keep="connect")  # restarted when it dies
        wait_until(self.answers, timeout_s=180, what="Kafka Connect worker", alive=self.is_running, log=self.log)
        if JDBC_SINK in self._plugins():
            say("connect", "worker answers, Debezium's PostgreSQL connector and JDBC sink loaded")
        else:
            say("connect", f"worker answers, Debezium's PostgreSQL connector loaded; its JDBC sink did NOT load (see "
                           f"{self.log}): everything but make bench-peers' peer works")

    def stop(self) -> None:
        if stop_pid(self.pid_file):
            say("connect", "stopped")
        else:
            say("connect", "not running")

    def status(self) -> str:
        state = "running" if self.is_running() else "stopped"
        if state == "running" and not self.answers():
            state = "starting"
        return f"connect   {state:8} {self.s.connect_url}  log={self.log}"

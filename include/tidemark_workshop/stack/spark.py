"""Spark in local mode: the connector jars it needs, resolved ahead of any job."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
from pathlib import Path

from tidemark.protocol.config import spark_driver_memory
from tidemark_workshop.settings import QUICK_JIT, REPO_ROOT, Settings
from tidemark_workshop.stack.maven import artifact_name, build_java, install, resolve
from tidemark_workshop.stack.proc import StackError, read_pid, say, spawn, stop_pid, wait_until

POM = REPO_ROOT / "stack" / "spark" / "pom.xml"
UDF_JAR = "tidemark-udf.jar"
WARM_CLASSES = REPO_ROOT / "stack" / "spark" / "warm_classes.py"


def pyspark_jars_dir() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def prepare(settings: Settings) -> list[Path]:
    shipped = frozenset(artifact_name(p.name) for p in pyspark_jars_dir().glob("*.jar"))
    jars = resolve(POM, settings.spark_jars_dir, skip_names=shipped)
    jars = [*[j for j in jars if j.name != UDF_JAR], build_udf_jar(settings)]
    names = " ".join(j.name for j in jars)
    for needed in ("spark-sql-kafka-0-10", "spark-avro", "postgresql-"):
        if needed not in names:
            raise StackError(f"Spark connector jar {needed}* missing from {settings.spark_jars_dir}")
    if settings.spark_quick_start:
        build_class_archive(settings)
    return jars


def build_class_archive(settings: Settings) -> Path | None:
    """The AppCDS archive Spark jobs start from (``Settings.quick_start_opts``): dumped once from a
    small job, again when the JDK or Spark's jars change. Without it jobs start slower, nothing else."""
    archive = settings.spark_class_archive
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    jars = sorted(p.name for p in pyspark_jars_dir().glob("*.jar"))
    digest = hashlib.sha256("\n".join([java, *jars]).encode()).hexdigest()
    stamp = archive.with_suffix(".built")
    if archive.exists() and stamp.exists() and stamp.read_text() == digest:
        return archive
    archive.unlink(missing_ok=True)
    dumping = archive.with_suffix(".dumping")
    env = {**os.environ, **settings.runtime_env(),
           "SPARK_SUBMIT_OPTS": f"{QUICK_JIT} -XX:ArchiveClassesAtExit={dumping}"}
    cmd = [str(settings.venv / "bin" / "spark-submit"), "--master", "local[1]", "--conf", "spark.ui.enabled=false",
           str(WARM_CLASSES)]
    say("spark", "dumping the class archive Spark jobs start from (once, about 30 s)")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0 or not dumping.exists():
        say("spark", f"no class archive (jobs start slower): spark-submit exited {done.returncode}: "
                     f"{done.stderr.strip()[-500:]}")
        dumping.unlink(missing_ok=True)
        return None
    dumping.rename(archive)
    stamp.write_text(digest)
    return archive


def status(settings: Settings) -> str:
    cluster = StandaloneCluster.of_stack(settings)
    if cluster is not None:
        return cluster.status()
    jars = settings.spark_jars()
    state = "ready" if jars else "missing"
    return f"spark     {state:8} master={settings.spark_master}  jars={len(jars)} in {settings.spark_jars_dir}"


def describe(settings: Settings) -> None:
    mode = "local mode" if StandaloneCluster.of_stack(settings) is None else "standalone cluster"
    say("spark", f"{mode} {settings.spark_master}, {len(settings.spark_jars())} connector jars ready")


def build_udf_jar(settings: Settings) -> Path:
    """Tidemark's Spark UDFs and direct COPY (stack/java/udf, built by Maven), beside the connector jars."""
    return install(build_java(settings.state_dir)["udf"], settings.spark_jars_dir / UDF_JAR)


def submit_command(settings: Settings, script: str | Path, args: list[str], *, secret: str,
                   env: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """The spark-submit command line and environment for a job in local mode.

    ``script`` is a file name in spark_jobs/ or a path. ``secret`` reaches the job only as the
    environment variable TIDEMARK_JDBC_PASSWORD; ``env``: more of the job's variables (another secret).
    """
    from tidemark.spark.jobs import PASSWORD_ENV, SPARK_CONF  # the same settings the DAG's operators pass

    env = {**os.environ, **settings.runtime_env(), **(env or {}), PASSWORD_ENV: secret}
    conf = [arg for key, value in SPARK_CONF.items() for arg in ("--conf", f"{key}={value}")]
    cmd = [
        str(settings.venv / "bin" / "spark-submit"), "--master", settings.spark_master,
        "--jars", ",".join(str(j) for j in settings.spark_jars()), *conf, "--driver-memory", spark_driver_memory(),
        str(REPO_ROOT / "spark_jobs" / script), *args,
    ]
    return cmd, env


class Submitted(subprocess.CompletedProcess):
    """A finished job: its output, when it was launched (epoch s) and its process tree's peak RSS."""

    started_at: float = 0.0
    peak_rss_bytes: int = 0


def submit(settings: Settings, script: str | Path, args: list[str], *, secret: str, timeout_s: float = 600.0,
           sample_s: float = 0.2, env: dict[str, str] | None = None) -> Submitted:
    """Run a job as the DAGs do (tests, benchmarks); never raises on a non-zero exit.

    While it runs, the resident memory of its whole process tree (JVM and Python workers) is
    sampled every ``sample_s`` seconds; the peak is on the result.
    """
    import time

    cmd, env = submit_command(settings, script, args, secret=secret, env=env)
    started_at = time.time()
    proc = subprocess.Popen(cmd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    with PeakRss(proc.pid, sample_s) as memory:
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            err += f"\nspark-submit {script}: killed after {timeout_s:.0f} s"
    result = Submitted(cmd, proc.returncode, out, err)
    result.started_at, result.peak_rss_bytes = started_at, memory.peak_bytes
    return result


class PeakRss:
    """Within ``with``: samples the resident memory of a session's processes; keeps the peak."""

    def __init__(self, session_id: int, sample_s: float = 0.2):
        import threading

        self.session_id, self.sample_s, self.peak_bytes = session_id, sample_s, 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.wait(self.sample_s):
            self.peak_bytes = max(self.peak_bytes, session_rss_bytes(self.session_id))

    def __enter__(self) -> "PeakRss":
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()
        self._thread.join()


def session_rss_bytes(session_id: int) -> int:
    """Resident memory of every process in a session (a job started with start_new_session)."""
    page, total = os.sysconf("SC_PAGE_SIZE"), 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        if int(fields[3]) == session_id:  # fields after the name: state ppid pgrp session ... rss at [21]
            total += int(fields[21]) * page
    return total


class StandaloneCluster:
    """A Spark standalone master and its workers, started from the PySpark distribution
    (``spark-class ...deploy.master.Master`` / ``...deploy.worker.Worker``) on 127.0.0.1, each a process of
    its own with a pid file and a log in ``work_dir``: the local stack's cluster when
    ``TIDEMARK_SPARK_WORKERS`` is set (:meth:`of_stack`), and the scale-out tests' (within ``with`` it runs).
    The same jobs submit to it as to a real cluster.

    ``default_cores`` is the master's ``spark.deploy.defaultCores``: without it the first
    application takes every core and the next one waits forever."""

    def __init__(self, settings: Settings, work_dir: Path, *, port: int, ui_port: int, worker_ui_ports: list[int],
                 cores: int = 4, memory: str = "6g", default_cores: int = 1):
        self.settings, self.work_dir = settings, Path(work_dir)
        self.master = f"spark://127.0.0.1:{port}"
        self.master_ui = f"http://127.0.0.1:{ui_port}"
        self.workers = [f"worker-{k}" for k in range(1, len(worker_ui_ports) + 1)]
        self._roles = {"master": ("master.Master", ["--host", "127.0.0.1", "--port", str(port),
                                                    "--webui-port", str(ui_port)])}
        for name, ui in zip(self.workers, worker_ui_ports):
            self._roles[name] = ("worker.Worker", ["--host", "127.0.0.1", "--webui-port", str(ui), "--cores",
                                                   str(cores), "--memory", memory, "--work-dir",
                                                   str(self.work_dir / name), self.master])
        self._default_cores = default_cores

    @classmethod
    def of_stack(cls, settings: Settings) -> StandaloneCluster | None:
        """The local stack's cluster: ``settings.spark_workers`` workers, or one started before under another
        setting that still runs (``make down`` stops it); None in local mode."""
        home = settings.state_dir / "spark" / "cluster"
        running = sorted(home.glob("worker-*.pid")) if read_pid(home / "master.pid") is not None else []
        workers = settings.spark_workers or len(running)
        if not workers:
            return None
        port, ui = settings.spark_cluster_ports
        return cls(settings, home, port=port, ui_port=ui, worker_ui_ports=[ui + k for k in range(1, workers + 1)])

    def pid_file(self, role: str) -> Path:
        return self.work_dir / f"{role}.pid"

    def log(self, role: str) -> Path:
        return self.work_dir / f"{role}.log"

    def pid(self, role: str) -> int | None:
        """The role's JVM (spark-class execs it): what an operator, or a failover trial, kills."""
        return read_pid(self.pid_file(role))

    def alive_workers(self) -> int:
        import json
        import urllib.request

        try:
            with urllib.request.urlopen(f"{self.master_ui}/json/", timeout=5) as response:
                return len([w for w in json.load(response).get("workers", []) if w.get("state") == "ALIVE"])
        except (OSError, ValueError):
            return 0

    def start(self) -> None:
        """Start every role not running yet (a killed worker too); wait until the master lists each worker."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.settings.runtime_env(), "SPARK_HOME": str(pyspark_jars_dir().parent),
               "SPARK_WORKER_DIR": str(self.work_dir / "work"), "SPARK_LOG_DIR": str(self.work_dir),
               "SPARK_MASTER_OPTS": f"-Dspark.deploy.defaultCores={self._default_cores}"}
        for role, (main, args) in self._roles.items():
            if self.pid(role) is None:
                spawn([str(self.settings.venv / "bin" / "spark-class"), f"org.apache.spark.deploy.{main}", *args],
                      log=self.log(role), pid_file=self.pid_file(role), env=env)
        wait_until(lambda: self.alive_workers() >= len(self.workers), timeout_s=120,
                   what=f"Spark master {self.master} with {len(self.workers)} worker(s)",
                   alive=lambda: self.pid("master") is not None, log=self.log("master"))

    def stop(self) -> None:
        stopped = [stop_pid(self.pid_file(role)) for role in reversed(list(self._roles))]  # the workers first
        say("spark", f"master and {len(self.workers)} worker(s) stopped" if any(stopped) else "not running")

    def status(self) -> str:
        running = [role for role in self._roles if self.pid(role) is not None]
        state = "running" if len(running) == len(self._roles) else ("partial" if running else "stopped")
        return (f"spark     {state:8} {self.master} ui={self.master_ui}  {self.alive_workers()}/{len(self.workers)} "
                f"worker(s) alive  logs={self.work_dir}")

    def __enter__(self) -> StandaloneCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

"""A private PostgreSQL cluster in the state directory, run as an unprivileged OS user.

initdb and postgres refuse to run as root, so when we are root the cluster belongs to
``TIDEMARK_OS_USER`` (created on demand) and every server command runs through ``runuser``.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tidemark_workshop.settings import AIRFLOW_DB, WAREHOUSE_DB, Settings
from tidemark_workshop.stack.proc import StackError, run, say, tail

_CREATECLUSTER_CONF = Path("/etc/postgresql-common/createcluster.conf")


def server_bin_dir() -> Path | None:
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parent.parent.name)
    )
    return candidates[-1].parent if candidates else None


def ensure_installed() -> Path:
    found = server_bin_dir()
    if found:
        return found
    if os.geteuid() != 0:
        raise StackError(
            "PostgreSQL server binaries are missing (no /usr/lib/postgresql/*/bin/pg_ctl). "
            "Install them once as root: sudo apt-get update && sudo apt-get install -y postgresql"
        )
    say("postgres", "server binaries missing: installing Debian's postgresql package")
    # Only the binaries are wanted: stop the package from creating a system cluster on 5432.
    _CREATECLUSTER_CONF.parent.mkdir(parents=True, exist_ok=True)
    if not _CREATECLUSTER_CONF.exists():
        _CREATECLUSTER_CONF.write_text("create_main_cluster = false\n")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run(["apt-get", "update", "-q"], what="apt-get update", env=env)
    run(["apt-get", "install", "-y", "-q", "postgresql"], what="apt-get install postgresql", env=env)
    found = server_bin_dir()
    if not found:
        raise StackError("apt-get installed postgresql but no /usr/lib/postgresql/*/bin/pg_ctl exists")
    return found


class Postgres:
    def __init__(self, settings: Settings):
        self.s = settings
        self.data = settings.pg_dir / "data"
        self.log = settings.logs_dir / "postgres.log"
        self.as_root = os.geteuid() == 0

    # --- running commands as the cluster owner ---------------------------------------
    def _as_owner(self, cmd: list[str]) -> list[str]:
        return ["runuser", "-u", self.s.os_user, "--", *cmd] if self.as_root else cmd

    def _prepare_owner(self) -> None:
        self.s.pg_dir.mkdir(parents=True, exist_ok=True)
        self.s.logs_dir.mkdir(parents=True, exist_ok=True)
        if not self.as_root:
            return
        if subprocess.run(["id", "-u", self.s.os_user], capture_output=True).returncode != 0:
            say("postgres", f"creating unprivileged OS user {self.s.os_user!r} to own the cluster")
            run(
                ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", self.s.os_user],
                what="useradd",
            )
        _grant_traverse(self.s.pg_dir)
        shutil.chown(self.s.pg_dir, user=self.s.os_user)
        for path in (self.data, self.log):
            if path.exists():
                run(["chown", "-R", self.s.os_user, str(path)], what=f"chown {path}")
        if not self.log.exists():
            self.log.touch()
            shutil.chown(self.log, user=self.s.os_user)

    # --- lifecycle -------------------------------------------------------------------
    def init(self, bin_dir: Path) -> None:
        if (self.data / "PG_VERSION").exists():
            return
        say("postgres", f"initdb {self.data}")
        pwfile = self.s.pg_dir / ".pwfile"
        fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # never readable by others
        with os.fdopen(fd, "w") as fh:
            fh.write(self.s.pg_password + "\n")
        try:
            if self.as_root:
                shutil.chown(pwfile, user=self.s.os_user)
            run(
                self._as_owner([
                    str(bin_dir / "initdb"), "-D", str(self.data), "-U", self.s.pg_user,
                    f"--pwfile={pwfile}", "--auth-host=scram-sha-256", "--auth-local=peer",
                    "-E", "UTF8", "--no-locale",
                ]),
                what="initdb",
            )
        finally:
            pwfile.unlink(missing_ok=True)
        conf = self.data / "postgresql.conf"
        with open(conf, "a") as fh:
            fh.write("\n# settings written by tidemark on every start\ninclude_if_exists = 'tidemark.conf'\n")

    def _write_runtime_conf(self) -> bool:
        """Write the settings; whether they changed. Ports come from the environment at each start,
        so a checkout can move its port."""
        conf = self.data / "tidemark.conf"
        before = conf.read_text() if conf.exists() else None
        conf.write_text(
            f"port = {self.s.pg_port}\n"
            f"listen_addresses = '{self.s.pg_host}'\n"
            "unix_socket_directories = ''\n"
            "max_connections = 200\n"
            "shared_buffers = 256MB\n"
            # A 2M-row batch writes about 2 GB of WAL (staging, then the merge): with the default 1GB
            # a checkpoint came every 15-20 s in the middle of it.
            "max_wal_size = 4GB\n"
            "max_prepared_transactions = 20\n"
            # change data capture: Debezium reads the source through a logical replication slot; a
            # slot nobody reads (a stopped connector) may keep at most this much WAL, then it is lost
            # (the pipeline says so and re-snapshots) instead of filling the disk
            "wal_level = logical\n"
            "max_replication_slots = 20\n"
            "max_wal_senders = 20\n"
            "max_slot_wal_keep_size = 4GB\n"
            "log_line_prefix = '%m [%p] %q%u@%d '\n"
        )
        if self.as_root:
            shutil.chown(conf, user=self.s.os_user)
        return conf.read_text() != before

    def is_running(self, bin_dir: Path | None = None) -> bool:
        bin_dir = bin_dir or server_bin_dir()
        if bin_dir is None or not (self.data / "PG_VERSION").exists():
            return False
        proc = subprocess.run(
            self._as_owner([str(bin_dir / "pg_ctl"), "status", "-D", str(self.data)]),
            capture_output=True, text=True,
        )
        return proc.returncode == 0

    def start(self) -> None:
        bin_dir = ensure_installed()
        self._prepare_owner()
        self.init(bin_dir)
        if self.is_running(bin_dir) and self._write_runtime_conf():
            say("postgres", "settings changed (tidemark.conf): restarting")
            run(self._as_owner([str(bin_dir / "pg_ctl"), "restart", "-w", "-t", "60", "-m", "fast",
                                "-D", str(self.data), "-l", str(self.log)]), what="pg_ctl restart")
        elif self.is_running(bin_dir):
            say("postgres", f"already running on {self.s.pg_host}:{self.s.pg_port}")
        else:
            self._write_runtime_conf()
            say("postgres", f"starting on {self.s.pg_host}:{self.s.pg_port}")
            try:
                run(
                    self._as_owner([
                        str(bin_dir / "pg_ctl"), "start", "-w", "-t", "60",
                        "-D", str(self.data), "-l", str(self.log),
                    ]),
                    what="pg_ctl start",
                )
            except StackError as exc:
                raise StackError(f"{exc}\nlast lines of {self.log}:\n{tail(self.log)}") from None
        self.create_databases()

    def create_databases(self) -> None:
        import psycopg2  # from the venv; imported late so `status` works before bootstrap

        conn = psycopg2.connect(self.s.dsn("postgres"))
        conn.autocommit = True  # CREATE DATABASE cannot run in a transaction block
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT datname FROM pg_database")
                existing = {row[0] for row in cur.fetchall()}
                for name in (self.s.source_db, WAREHOUSE_DB, AIRFLOW_DB):
                    if name not in existing:
                        say("postgres", f"creating database {name}")
                        cur.execute(f'CREATE DATABASE "{name}"')
        finally:
            conn.close()
        self.create_source_reader()

    def create_source_reader(self) -> None:
        """The role pipelines read the source with: SELECT on tables (those of the stack's owner
        role, today's and future ones) and pg_read_all_stats (to see open transactions), nothing
        more. A table created by another role needs its own GRANT SELECT ... TO this role."""
        reader, owner = _ident(self.s.source_user), _ident(self.s.pg_user)
        with self._source_role(self.s.source_user, self.s.source_password, "", "read-only") as cur:
            cur.execute(f"GRANT pg_read_all_stats TO {reader}")
            cur.execute(f"GRANT CONNECT ON DATABASE {_ident(self.s.source_db)} TO {reader}")
            cur.execute(f"ALTER DEFAULT PRIVILEGES FOR ROLE {owner} GRANT USAGE ON SCHEMAS TO {reader}")
            cur.execute(f"ALTER DEFAULT PRIVILEGES FOR ROLE {owner} GRANT SELECT ON TABLES TO {reader}")
            cur.execute("SELECT nspname FROM pg_namespace WHERE nspname !~ '^pg_' AND nspname <> 'information_schema'")
            for (schema,) in cur.fetchall():
                cur.execute(f"GRANT USAGE ON SCHEMA {_ident(schema)} TO {reader}")
                cur.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA {_ident(schema)} TO {reader}")
        self.create_cdc_role()

    def create_cdc_role(self) -> None:
        """The replication role Debezium reads the source's WAL as: LOGIN REPLICATION and nothing
        else; each CDC pipeline's publication and SELECT on its table are granted apart
        (tidemark.realtime.cdc.source.grant_sql), as a DBA would."""
        with self._source_role(self.s.cdc_user, self.s.cdc_password, "REPLICATION", "replication") as cur:
            cur.execute(f"GRANT CONNECT ON DATABASE {_ident(self.s.source_db)} TO {_ident(self.s.cdc_user)}")

    @contextmanager
    def _source_role(self, user: str, password: str, attributes: str, kind: str) -> Iterator[Any]:
        """A login role of the source (made if missing, its password and attributes set every time),
        and a cursor in the same transaction for its grants."""
        import psycopg2

        role = _ident(user)
        conn = psycopg2.connect(self.s.dsn(self.s.source_db))
        try:
            with conn, conn.cursor() as cur:
                cur.execute("SELECT pg_advisory_xact_lock(hashtext('tidemark_workshop.stack.role'), hashtext(%s))",
                            (user,))
                cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (user,))
                if cur.fetchone() is None:
                    say("postgres", f"creating the source's {kind} role {user}")
                    cur.execute(f"CREATE ROLE {role} LOGIN")
                # hashed here: the clear password never appears in a statement (server log, pg_stat_activity)
                hashed = psycopg2.extensions.encrypt_password(password, user, conn, "scram-sha-256")
                cur.execute(f"ALTER ROLE {role} NOSUPERUSER NOCREATEDB NOCREATEROLE LOGIN {attributes} PASSWORD %s",
                            (hashed,))
                yield cur
        finally:
            conn.close()

    def stop(self) -> None:
        bin_dir = server_bin_dir()
        if not self.is_running(bin_dir):
            say("postgres", "not running")
            return
        run(
            self._as_owner([str(bin_dir / "pg_ctl"), "stop", "-m", "fast", "-w", "-D", str(self.data)]),
            what="pg_ctl stop",
        )
        say("postgres", "stopped")

    def status(self) -> str:
        state = "running" if self.is_running() else "stopped"
        return f"postgres  {state:8} {self.s.pg_host}:{self.s.pg_port}  data={self.data}  log={self.log}"


class Standby:
    """A streaming replica of the stack's server (``pg_basebackup -R``), its data in ``home``, on ``port``, run
    as the cluster's owner: what a warehouse or a source fails over to (``promote``, as ``pg_ctl promote``)."""

    def __init__(self, settings: Settings, home: Path, port: int):
        self.s, self.home, self.port = settings, home, port
        self.primary = Postgres(settings)
        self.data, self.log = home / "data", home / "standby.log"

    def start(self) -> None:
        bin_dir = ensure_installed()
        if not (self.data / "PG_VERSION").exists():
            self.home.mkdir(parents=True, exist_ok=True)
            if self.primary.as_root:
                _grant_traverse(self.home)
                shutil.chown(self.home, user=self.s.os_user)
            say("postgres", f"pg_basebackup of {self.s.pg_host}:{self.s.pg_port} into {self.data}")
            # -c fast: a checkpoint at once (the default spreads it: minutes while other work writes)
            run(self.primary._as_owner([str(bin_dir / "pg_basebackup"), "-D", str(self.data), "-R", "-X", "stream",
                                        "-c", "fast",
                                        "-h", self.s.pg_host, "-p", str(self.s.pg_port), "-U", self.s.pg_user]),
                what="pg_basebackup", env={**os.environ, "PGPASSWORD": self.s.pg_password})
        say("postgres", f"starting the standby on {self.s.pg_host}:{self.port}")
        run(self.primary._as_owner([str(bin_dir / "pg_ctl"), "start", "-w", "-t", "60", "-D", str(self.data),
                                    "-l", str(self.log), "-o", f"-p {self.port}"]), what="pg_ctl start (standby)")

    def promote(self) -> None:
        run(self.primary._as_owner([str(server_bin_dir() / "pg_ctl"), "promote", "-w", "-D", str(self.data)]),
            what="pg_ctl promote")

    def stop(self, mode: str = "fast") -> None:
        """``immediate``: as a crash (no checkpoint)."""
        run(self.primary._as_owner([str(server_bin_dir() / "pg_ctl"), "stop", "-m", mode, "-w", "-D",
                                    str(self.data)]), what="pg_ctl stop (standby)")


def _grant_traverse(path: Path) -> None:
    """The cluster owner must be able to reach the state directory through its parents.

    A checkout under a private directory (mktemp -d, /root) would otherwise stop the server.
    Only the search (x) bit is added, never read: directory listings stay private.
    """
    for parent in reversed(path.resolve().parents):
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            say("postgres", f"adding o+x to {parent} so the cluster owner can reach its data")
            parent.chmod(mode | stat.S_IXOTH)


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'

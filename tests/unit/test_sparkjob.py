"""How a Spark entry script fails: an exit code that says whether retrying can help, and one
line of cause for the task that submitted it. What every job is submitted with: its JVMs in UTC.
How the extract's side queries leave the source: no transaction open."""

from __future__ import annotations

import pytest

from tidemark.batch.extract import ExtractInterrupted
from tidemark.protocol.spec import SpecError
from tidemark.spark.entry import ERROR_FILE_ENV, JobError, TransientJobError, one_line, read_cause, run
from tidemark.spark.jobs import (
    JAVA_OPTIONS_KEYS,
    SPARK_CONF,
    THREAD_STACK_OPTION,
    UTC_JVM_OPTION,
    spark_conf,
    thread_stack_options,
    utc_java_options,
)


def _raising(exc):
    def main(argv):
        raise exc
    return main


def test_exit_codes_and_the_cause_file(tmp_path, monkeypatch):
    cause = tmp_path / "cause.txt"
    monkeypatch.setenv(ERROR_FILE_ENV, str(cause))
    assert read_cause(cause) == (None, None)  # nothing written: killed, or failed before it ran
    assert run(_raising(JobError("table t has no column c")), [], "job") == 3
    assert read_cause(cause) == (3, "table t has no column c")
    assert run(_raising(TransientJobError("offsets moved by 2, counted 1")), [], "job") == 4
    assert read_cause(cause) == (4, "offsets moved by 2, counted 1")
    # any of Tidemark's own errors, by its kind (tidemark.protocol.errors): a spec error is not retried
    assert run(_raising(SpecError("pipelines/p.yml: table: required")), [], "job") == 3
    assert read_cause(cause) == (3, "pipelines/p.yml: table: required")
    assert run(_raising(ExtractInterrupted("offsets moved")), [], "job") == 4
    with pytest.raises(ZeroDivisionError):
        run(_raising(ZeroDivisionError("division by zero")), [], "job")
    assert read_cause(cause) == (1, "ZeroDivisionError: division by zero")


def test_one_line_skips_jvm_frames():
    exc = RuntimeError("\n  at org.apache.spark.Foo(Foo.java:1)\nERROR: permission denied for table t\n  at bar")
    assert one_line(exc) == "RuntimeError: ERROR: permission denied for table t"


# --- every Spark JVM in UTC (issue 29, item 6) -------------------------------------------------

QUICK = "-XX:TieredStopAtLevel=1 -XX:SharedArchiveFile=/s/spark/jvm-classes.jsa"


def test_every_job_s_driver_and_executors_run_in_utc():
    assert JAVA_OPTIONS_KEYS == ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions")
    for key in JAVA_OPTIONS_KEYS:
        assert SPARK_CONF[key] == "-Xss4m -Duser.timezone=UTC" == f"{THREAD_STACK_OPTION} {UTC_JVM_OPTION}"
    assert SPARK_CONF["spark.executorEnv.TZ"] == "UTC"
    assert spark_conf() == SPARK_CONF and spark_conf() is not SPARK_CONF


def test_a_caller_s_java_options_are_kept_and_its_zone_replaced():
    conf = spark_conf({"spark.driver.extraJavaOptions": f"{QUICK} -Duser.timezone=Europe/Berlin -Dx=\"a  b\"",
                       "spark.executor.extraJavaOptions": "-Duser.timezone=Europe/Berlin",
                       "spark.executorEnv.TZ": "Europe/Berlin", "spark.task.maxFailures": 1})
    assert conf["spark.driver.extraJavaOptions"] == f"-Xss4m {QUICK} -Dx=\"a  b\" -Duser.timezone=UTC"
    assert conf["spark.executor.extraJavaOptions"] == "-Xss4m -Duser.timezone=UTC"
    assert conf["spark.executorEnv.TZ"] == "UTC" and conf["spark.task.maxFailures"] == "1"
    assert conf["spark.ui.enabled"] == "false"  # Tidemark's own settings stay
    assert utc_java_options(f"{QUICK} -Duser.timezone=UTC") == f"{QUICK} -Duser.timezone=UTC"  # once


def test_the_task_threads_stack_is_the_caller_s_where_it_sets_one():
    assert thread_stack_options() == "-Xss4m" and thread_stack_options(QUICK) == f"-Xss4m {QUICK}"
    assert thread_stack_options(f"{QUICK} -Xss16m") == f"{QUICK} -Xss16m"
    assert thread_stack_options("'-Xss2m' -Dy=1") == "'-Xss2m' -Dy=1"
    conf = spark_conf({"spark.executor.extraJavaOptions": "-Xss8m"})
    assert conf["spark.executor.extraJavaOptions"] == "-Xss8m -Duser.timezone=UTC"
    assert conf["spark.driver.extraJavaOptions"] == "-Xss4m -Duser.timezone=UTC"


def test_a_local_submission_carries_utc_and_keeps_the_quick_start(monkeypatch, tmp_path):
    from tidemark_workshop.settings import QUICK_JIT, Settings
    from tidemark_workshop.stack.spark import submit_command

    monkeypatch.setenv("TIDEMARK_STATE_DIR", str(tmp_path))
    monkeypatch.delenv("TIDEMARK_SPARK_QUICK_START", raising=False)
    monkeypatch.delenv("SPARK_SUBMIT_OPTS", raising=False)
    monkeypatch.setenv("TZ", "Europe/Berlin")  # the worker's zone: it reaches the JVM, which must not use it
    settings = Settings.from_env()
    settings.spark_class_archive.parent.mkdir(parents=True)
    settings.spark_class_archive.write_bytes(b"")
    cmd, env = submit_command(settings, "extract_window.py", ["--x"], secret="s")
    confs = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--conf"]
    assert "spark.driver.extraJavaOptions=-Xss4m -Duser.timezone=UTC" in confs
    assert "spark.executor.extraJavaOptions=-Xss4m -Duser.timezone=UTC" in confs
    assert "spark.executorEnv.TZ=UTC" in confs
    # the quick start travels as spark-submit's own JVM options; the launcher puts the driver's
    # extraJavaOptions after them on the same JVM's command line (client mode), so UTC wins there too
    assert env["SPARK_SUBMIT_OPTS"] == f"{QUICK_JIT} -XX:SharedArchiveFile={settings.spark_class_archive}"


def test_the_airflow_operator_merges_a_dag_s_conf_with_utc():
    from tidemark_airflow.spark import SparkJdbcSubmitOperator

    plain = SparkJdbcSubmitOperator(task_id="plain", script="extract_window.py", jdbc_conn_id="c")
    assert plain.conf == SPARK_CONF
    own = SparkJdbcSubmitOperator(task_id="own", script="extract_window.py", jdbc_conn_id="c",
                                  conf={"spark.driver.extraJavaOptions": QUICK, "spark.sql.shuffle.partitions": "8"})
    assert own.conf["spark.driver.extraJavaOptions"] == f"-Xss4m {QUICK} -Duser.timezone=UTC"
    assert own.conf["spark.executor.extraJavaOptions"] == "-Xss4m -Duser.timezone=UTC"
    assert own.conf["spark.sql.shuffle.partitions"] == "8"


# --- the extract's side queries end their transactions (issue 29, item 8) ----------------------

def test_side_queries_run_in_autocommit_named_and_always_close(monkeypatch):
    import psycopg2

    from tidemark.spark.entry import connect_params, side_queries

    made = []

    class Conn:
        autocommit, closed = False, False

        def __init__(self, **params):
            self.params = params
            made.append(self)

        def close(self):
            self.closed = True

    monkeypatch.setattr(psycopg2, "connect", lambda **params: Conn(**params))
    url = "host=db port=5433 dbname=src sslmode=require"
    with side_queries(url, "reader", "pw", application="tidemark-extract-p") as conn:
        assert conn.autocommit and not conn.closed
    assert conn.closed and conn.params == {"host": "db", "port": "5433", "dbname": "src", "sslmode": "require",
                                           "user": "reader", "password": "pw", "application_name": "tidemark-extract-p"}
    with pytest.raises(JobError):
        with side_queries(url, "reader", "pw") as conn:
            raise JobError("refused")
    assert made[-1].closed and "application_name" not in made[-1].params
    assert "application_name" not in connect_params(url, "reader", "pw")


# --- a job's database: libpq parameters, TLS included, on both of its connections ---------------

def test_a_connection_s_tls_options_reach_both_the_job_s_psycopg2_and_jdbc_connections():
    from tidemark.spark.entry import connect_params, database, jdbc_url
    from tidemark.spark.jobs import database_args

    extras = {"sslmode": "verify-full", "sslrootcert": "/etc/tidemark/ca.pem", "connect_timeout": 5,
              "cursor": "dictcursor"}  # an Airflow-side extra stays with Airflow
    dsn = database_args("db.bank.internal", 6432, "ledger db", "reader", extras)[1]
    assert database(dsn) == {"host": "db.bank.internal", "port": "6432", "dbname": "ledger db", "sslmode": "verify-full",
                             "sslrootcert": "/etc/tidemark/ca.pem", "connect_timeout": "5"}
    assert connect_params(dsn, "reader", "pw")["sslmode"] == "verify-full"
    assert jdbc_url(dsn, application="tidemark-extract-p") == (
        "jdbc:postgresql://db.bank.internal:6432/ledger%20db?sslmode=verify-full&sslrootcert=%2Fetc%2Ftidemark%2Fca.pem"
        "&connectTimeout=5&ApplicationName=tidemark-extract-p")
    assert jdbc_url("host=::1 dbname=wh", stringtype="unspecified") == "jdbc:postgresql://[::1]:5432/wh?stringtype=unspecified"
    # libpq's require checks the server against a root certificate when one is given; the driver's does not
    assert "sslmode=verify-ca" in jdbc_url("host=db dbname=wh sslmode=require sslrootcert=/ca.pem")
    assert "sslmode=require" in jdbc_url("host=db dbname=wh sslmode=require")


def test_a_primary_and_its_replicas_are_one_connection_that_follows_a_promotion():
    """Several servers in a connection's host field: every session, psycopg2's and JDBC's, goes to the one that
    takes writes (libpq's target_session_attrs=read-write, the driver's targetServerType=primary)."""
    from tidemark.spark.entry import connect_params, database, jdbc_url
    from tidemark.spark.jobs import UnsupportedOption, database_args, servers

    assert servers("db1:5432,db2:5433", None) == {"host": "db1,db2", "port": "5432,5433",
                                                  "target_session_attrs": "read-write"}
    assert servers("db1, db2", 6432) == {"host": "db1,db2", "port": "6432,6432", "target_session_attrs": "read-write"}
    assert servers("db1", 6432) == {"host": "db1", "port": "6432"}  # one server: nothing added
    with pytest.raises(UnsupportedOption, match="is not host"):
        servers("db1:x,db2", None)
    dsn = database_args("wh1:5432,wh2:5433", None, "wh", "tidemark", {"sslmode": "require"})[1]
    assert database(dsn) == {"host": "wh1,wh2", "port": "5432,5433", "dbname": "wh", "sslmode": "require",
                             "target_session_attrs": "read-write"}
    assert connect_params(dsn, "tidemark", "pw")["target_session_attrs"] == "read-write"
    assert jdbc_url(dsn) == "jdbc:postgresql://wh1:5432,wh2:5433/wh?sslmode=require&targetServerType=primary"
    said = database_args("a,b", 5432, "wh", "u", {"target_session_attrs": "any"})[1]
    assert jdbc_url(said).endswith("targetServerType=any")
    with pytest.raises(UnsupportedOption, match="target_session_attrs='prefer-primary'"):
        database_args("a,b", 5432, "wh", "u", {"target_session_attrs": "prefer-primary"})


def test_a_connection_that_logs_in_with_a_client_certificate_is_refused_by_name():
    from tidemark.protocol.errors import Terminal
    from tidemark.spark.jobs import UnsupportedOption, database_args

    with pytest.raises(UnsupportedOption, match="sets sslcert, sslkey: Spark jobs cannot log in with a client") as err:
        database_args("db", 5432, "src", "reader", {"sslmode": "verify-full", "sslcert": "/c.pem", "sslkey": "/k.pem"})
    assert isinstance(err.value, Terminal)


@pytest.mark.parametrize("dsn, named", [
    ("host=db dbname=src password=hunter2", "must not hold the password"),
    ("host=db dbname=src options=-cstatement_timeout=0", "got ['dbname', 'host', 'options']"),
    ("jdbc:postgresql://db/src", "is not libpq key=value parameters"),
    ("host=db password='hunter2 dbname=src", "is not libpq key=value parameters"),  # unparsable: not echoed
    ("dbname=src", "got ['dbname']"),
    ("host=a,b port=1,2,3 dbname=src", "each with its port or one port for all"),
    ("host=/var/run/postgresql dbname=src", "not a socket directory"),
    ("host=a,b dbname=src target_session_attrs=prefer-primary", "the JDBC driver knows"),
    ("host=db dbname=src sslkey=/k.pem", "got ['dbname', 'host', 'sslkey']"),
])
def test_a_database_argument_the_job_cannot_honour_exactly_is_refused_by_name(dsn, named):
    from tidemark.spark.entry import database

    with pytest.raises(JobError, match=None) as err:
        database(dsn)
    assert named in str(err.value) and "hunter2" not in str(err.value)

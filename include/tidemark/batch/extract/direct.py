"""A direct extract (``PipelineSpec.transport: direct``): the Spark tasks COPY the window's rows into
the attempt's stage table in the warehouse instead of writing them to the pipeline's topic.

Everything else is the Kafka extract's: the same Avro value is encoded and hashed in the JVM, so
the totals that BEGIN/END and the ledger carry are bit for bit those a Kafka extract of the same
rows would seal; each row staged is that value decoded again, exactly as the sink decodes it. The
tasks COPY it and report their loads (``tidemark.DirectCopy``, in the stack's UDF jar); the
orchestrator accepts them only when they add up to the totals, and the sink verifies the stage
against the sealed totals before it applies. Only the Spark driver imports this module.
"""

from __future__ import annotations

from tidemark import ledger
from tidemark.batch.extract.attempt import Extract, non_finite
from tidemark.batch.extract.decisions import unrepresentable_error
from tidemark.batch.stage import STAGE_REFUSED_CLASS, Target, create_typed, rows_inserted
from tidemark.protocol.avro import sql_type
from tidemark.protocol.progress import Steps, Ticker
from tidemark.spark.entry import JobError, jdbc_url, side_queries


def _secret(x: Extract) -> str:
    """The warehouse's password, from the environment variable ``--warehouse-password-env`` names."""
    import os

    secret = os.environ.get(x.args.warehouse_password_env or "")
    if not x.args.warehouse_user or secret is None:
        raise JobError(f"{x.tag}: --warehouse needs --warehouse-user and --warehouse-password-env naming a set "
                       "environment variable (the warehouse's password)")
    return secret


def _queries(x: Extract):
    """The driver's own connection to the warehouse, for a few queries (autocommit, closed on leaving)."""
    return side_queries(x.args.warehouse, x.args.warehouse_user, _secret(x), application=x.application)


def prepare_stage(x: Extract) -> tuple[Target, list[str]]:
    """The attempt's typed stage, made from the ledger's record schema while the ledger shows a
    direct batch and the attempt open, and the record's field names; else JobError saying what the
    ledger shows."""
    with _queries(x) as conn, conn.cursor() as cur:
        planned = ledger.planned_batch(cur, x.args.batch_id)
        state = ledger.attempt_state(cur, x.args.batch_id, x.args.attempt)
        if planned is None or planned.transport != "direct" or planned.schema_version is None:
            shows = ("no such batch" if planned is None else
                     f"transport {planned.transport}, schema version {planned.schema_version}")
            raise JobError(f"{x.tag}: --warehouse is for a direct protocol-version-2 batch; the ledger shows "
                           f"{shows}. Next: clear the DAG run from its 'plan' task")
        if state != "open":
            raise JobError(f"{x.tag}: attempt {x.args.attempt} is {state or 'not in the ledger'}, not open: it stages "
                           "nothing (a newer attempt or the run's teardown ended it); nothing to do for this one")
        columns = ledger.record_schema(cur, x.spec.name, planned.schema_version)[0]
        stage = create_typed(cur, x.args.batch_id, x.args.attempt, [(c.name, sql_type(c.sql_type)) for c in columns])
    return Target.of(stage, planned.schema_version, columns), [c.name for c in columns]


# Rows per load: each load is one transaction of a task (its FOR SHARE of the attempt, its COPY).
LOAD_ROWS = 50_000


def stage(x: Extract, records, n: int, numerics: list[str], steps: Steps) -> list[list[int]]:
    """Stage the encoded ``records`` (``job.encoded``), each counted by tally() on its way; returns the
    loads [load, partition, rows, checksum] the tasks staged."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    target, fields = prepare_stage(x)
    as_long = "unix_micros(_cursor)" if x.spec.cursor.kind == "timestamp" else "CAST(_cursor AS BIGINT)"
    decoded = from_avro(F.col("value"), x.args.avro_schema)  # made once per row (common subexpressions)
    rows = records.select(  # the row's fields by position (any source name is safe), then partition and hash
        *[decoded.getField(name).alias(f"c{i}") for i, name in enumerate(fields)],
        F.expr(f"tally(partition, row_hash, {as_long})").alias("partition"), "row_hash")
    # The tasks COPY in the JVM (tidemark.DirectCopy): handing every row to a Python worker cost more
    # CPU than the read and the COPY together.
    columns, types = target.copy_columns()
    try:
        with Ticker(x.tag, "staged", lambda: _staged(x), n), steps.step("read, encode, stage"):
            loads = rows.sparkSession._jvm.tidemark.DirectCopy.stage(
                rows._jdf, jdbc_url(x.args.warehouse, application=x.application), x.args.warehouse_user, _secret(x),
                x.args.batch_id, x.args.attempt, target.stage, "\n".join(columns), "\n".join(types), LOAD_ROWS)
    except Exception as exc:
        refused = refusal(str(exc))
        if refused is not None:  # the source's own rows: every new attempt meets the same refusal
            raise JobError(f"{x.tag}: {refused}. Next: make the target's record schema hold the value (the "
                           "refusal names it), or correct the source row") from None
        ended = _attempt_state(x)
        if ended not in (None, "open"):  # superseded or aborted while its tasks staged: say so, not a stack trace
            raise JobError(f"{x.tag}: attempt {x.args.attempt} became {ended or 'unknown'} while its tasks staged: "
                           "they stopped; nothing of it can apply (a newer attempt or the run's teardown ended it)") from None
        unreadable = non_finite(x, numerics) if numerics else []
        if unreadable:  # the same rows fail every retry: say which, and what will work
            raise JobError(unrepresentable_error(x.tag, x.spec, unreadable, temporal=False)) from None
        raise
    return [[int(v) for v in line.split()] for line in loads]


def refusal(error: str) -> str | None:
    """The words of a task's refusal (tidemark.StageRefused) in a JVM error as Py4J renders it, the first
    line naming the class, read after ``<class>: ``; None: the error is no refusal."""
    marker = f"{STAGE_REFUSED_CLASS}: "
    line = next((line for line in error.splitlines() if marker in line), None)
    return None if line is None else line[line.index(marker) + len(marker):].strip()


def _staged(x: Extract) -> int:
    """Rows the tasks have staged so far, from PostgreSQL's statistics (no scan of the growing stage)."""
    with _queries(x) as conn, conn.cursor() as cur:
        return rows_inserted(cur, x.args.batch_id, x.args.attempt)


def _attempt_state(x: Extract) -> str | None:
    """The attempt's state in the ledger now (None: it cannot be read)."""
    import psycopg2

    try:
        with _queries(x) as conn, conn.cursor() as cur:
            return ledger.attempt_state(cur, x.args.batch_id, x.args.attempt)
    except psycopg2.Error:
        return None

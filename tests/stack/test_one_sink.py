"""Two sinks of one pipeline in one warehouse database never share a batch (real PostgreSQL, Kafka, Spark).

The sink's identity is its pipeline in its warehouse database (``ledger.consumer_for``): a second
sink started there is the same consumer, takes the fencing token, and the first can no longer
stage or commit anything. Sinks in two databases have two control schemas and share nothing.
"""

from __future__ import annotations

import psycopg2
import pyarrow as pa
import pytest

from tidemark import ledger
from tidemark.sink import BatchSink, FencedError
from tidemark_workshop.settings import WAREHOUSE_DB
from tidemark_workshop.stack.batchrun import PAYMENTS_DDL, insert_payments, make_pipeline


def test_a_sink_fenced_by_a_second_sink_of_its_pipeline_stages_and_commits_nothing(settings, tmp_path):
    pipe = make_pipeline(settings, tmp_path, PAYMENTS_DDL)
    insert_payments(pipe, 1, 5)
    plan = pipe.plan("run-1")
    attempt = pipe.begin(plan)
    pipe.end(plan, attempt, pipe.extract(plan, attempt))

    first = psycopg2.connect(settings.dsn(WAREHOUSE_DB))
    try:
        old = BatchSink(first, pipe.spec, keyring=pipe.keyring)
        old.acquire_fence()
        pipe.sink()  # the second sink (the real Spark job) takes the next token and commits the batch
        assert pipe.state(plan.batch_id, attempt) == "committed"
        offsets = pipe.query_wh("SELECT partition, next_offset FROM tidemark_control.sink_offsets "
                                "WHERE consumer = %s ORDER BY 1", (ledger.consumer_for(pipe.spec.name),))
        late = pa.table({"partition": [0], "offset": [0], "key": [b"1"], "value": [b'{"id": 1}'],
                         "control": pa.array([None], pa.string()), "batch_id": [plan.batch_id],
                         "attempt": [attempt], "row_hash": [0]})
        with pytest.raises(FencedError, match="no longer current"):
            old.apply(late)
    finally:
        first.close()
    assert pipe.query_wh("SELECT partition, next_offset FROM tidemark_control.sink_offsets WHERE consumer = %s "
                         "ORDER BY 1", (ledger.consumer_for(pipe.spec.name),)) == offsets
    source = pipe.rows("source", "amount")
    assert len(source) == 5 and pipe.rows("target", "amount") == source

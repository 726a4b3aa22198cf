"""The nightly batch's sequence, as the DAG factory (``tidemark_airflow.batch``) and the local runner
(``tidemark_workshop.stack.batchrun``) both follow it: names only, light enough for a DAG file's parse."""

# plan -> begin -> extract -> end -> sink -> wait_committed, then publish; abort_unfinished is the
# teardown of the whole chain (whatever ended the run, no attempt stays open).
PLAN, BEGIN, EXTRACT, END, SINK, COMMITTED = STEPS = ("plan", "begin", "extract", "end", "sink", "wait_committed")
PUBLISH, CLEANUP = "publish", "abort_unfinished"
# Before plan, in the DAG only: backpressure from a standing sink that lags (the local runner
# applies each batch itself, so nothing lags behind it).
GATE = "wait_for_sink"
TURN = "wait_turn"  # one run of a pipeline at a time, plan to commit

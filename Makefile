# Tidemark: two commands on a fresh machine.
#   make demo   installs what is missing, starts the stack, runs the demo end to end
#   make unit   ruff (pyproject.toml), the Java tests when mvn is on PATH, then the tests that need no stack (tests/unit,
#               DAG integrity, compose, launcher choice): starts nothing, under a minute
#   make java-test  the JUnit tests of Tidemark's Java (stack/java: the direct COPY's encoding, the UDFs, the signing converter)
#   make test   installs what is missing, starts the stack, runs the whole suite, both kinds (what CI runs; 7 seeded kill trials):
#               the Java tests first, then in LANES lanes (2; each lane its own source database: docs/local-stack.md), then
#               the tests marked serial alone (tests/conftest.py)
#               every test's duration: .state/test-report.xml and test-report-serial.xml (JUnit; TIDEMARK_STATE_DIR
#               moves .state); PYTEST_ARGS= for pytest (both phases)
#   make bench  the batch benchmark: 2M ledger rows vs the raw COPY pipe and naive Spark JDBC
#   make bench-stream  the streaming benchmark: events/s drained, p50/p99 publish-to-visible at 5,000/s, restart
#   make bench-peers  both benchmarks above with the peer in the same run: Debezium's snapshot + JDBC sink on the
#               same rows (ratio_vs_debezium), its JDBC sink on the same backlog (ratio_vs_debezium_jdbc_sink);
#               BENCH_ARGS go to the batch one, STREAM_ARGS to the stream one
#   make bench-cdc  CDC: handoff snapshot rows/s vs Debezium's own snapshot, changes/s, p50/p99 at 5,000/s, missing/duplicates
#   make bench-reconcile  reconcile a 2M-row ledger batch against plain count+sum scans; localise 10 changed rows
#   make profile-sink  where the sink's Spark job spends its time, step by step (400,000 rows)
#   make bench-flood  1,000,000 records the sink cannot use against a good batch of that size: rejects/s, memory
#   make campaign  id-cursor campaign: writers hold transactions 20-60 s while batches run back to back
#   make kill-trials  kill -9 the standing sink at seeded moments (TRIALS=20 SEED=...): exactly one effect (make test runs 7)
#   make campaign-failover  a Kafka leader or broker, a Spark worker lost at seeded moments on a replicated site
#                    beside the stack (TRIALS=20 SEED=...): 0 lost, 0 duplicated, each trial's recovery time (make test runs 3)
#   make grants P=<pipeline>  the statements the source's owner runs for a CDC pipeline's capture (again when a
#               member joins its group)
#   make test-direct  the batch tests again with every pipeline they make on transport: direct where its spec allows
#               (the lanes only; a test of the Kafka transport itself is marked kafka_transport and skipped)
SHELL := /bin/bash
ROOT := $(abspath $(dir $(lastword $(MAKEFILE_LIST))))
STATE := $(or $(TIDEMARK_STATE_DIR),$(ROOT)/.state)
export TIDEMARK_STATE_DIR := $(STATE)
export PYTHONPATH := $(ROOT)/include
PY := $(STATE)/venv/bin/python
STACK := $(PY) -m tidemark_workshop.stack
PYTEST_ARGS ?=
LANES ?= 2
BENCH_ARGS ?=
STREAM_ARGS ?=
CAMPAIGN_ARGS ?=
TRIALS ?= 20
SEED ?=

# The batch benchmarks measure throughput: their Spark JVMs start plain, with the full JIT (the
# stack's default is C1 only and a class archive, for the quick start of short local jobs).
# bench-stream runs the standing sink as the stack runs it (quick start: its restart is a start).
bench bench-reconcile bench-flood campaign profile-sink: export TIDEMARK_SPARK_QUICK_START := 0

.PHONY: help bootstrap up down start stop status logs ui demo unit java-test test bench bench-stream bench-peers bench-cdc bench-reconcile bench-flood campaign kill-trials campaign-failover test-direct profile-sink clean grants

help:
	@sed -n 's/^#   //p' Makefile; echo; $(STACK) --help 2>/dev/null || true

bootstrap:
	@bash stack/bootstrap.sh

up: bootstrap
	@$(STACK) up

down:
	@if [ -x $(PY) ]; then $(STACK) down; fi

# one component, the rest stays up: C=postgres, kafka, airflow, or one Airflow service (scheduler, ...)
start:
	@$(STACK) start $(C)

stop:
	@if [ -x $(PY) ]; then $(STACK) stop $(C); fi

status:
	@$(STACK) status

# what the source's owner runs for a CDC pipeline's capture (P=<pipeline>): pipe it into psql as the tables' owner
grants:
	@$(STACK) run -- $(PY) -m tidemark.realtime.cdc.grants $(P) --role $${TIDEMARK_CDC_USER:-tidemark_cdc}

logs:
	@$(STACK) logs $(C)

ui: up
	@$(STACK) ui

demo: up
	@$(STACK) run -- $(PY) -m tidemark_workshop.demo

# The no-stack lane: `stack run` only sets the stack's environment (Airflow home, connections), it
# starts nothing. Bootstrap only when the venv is missing or not built from requirements.txt.
unit:
	@if [[ ! -x $(PY) || "$$(cat $(STATE)/venv/.requirements.sha256 2>/dev/null)" != "$$(sha256sum requirements.txt | cut -d' ' -f1)" ]]; then \
	  bash stack/bootstrap.sh; fi
	@$(PY) -m ruff check --quiet
	@if command -v mvn >/dev/null && command -v javac >/dev/null; then $(MAKE) --no-print-directory java-test; \
	  else echo "make unit: mvn or javac (a JDK) is not on PATH: the Java tests (make java-test) are skipped"; fi
	@$(STACK) run -- $(PY) -m pytest -m "not stack" $(PYTEST_ARGS)

# Tidemark's Java (stack/java): its JUnit tests, with Maven's own repository (~/.m2) as the cache. Starts nothing.
java-test:
	@mvn -q -B -f stack/java/pom.xml test

# Two phases (tests/conftest.py): the suite in $(LANES) parallel lanes, a file per unit of work (the
# Airflow files one unit), then the tests marked serial alone. Both run; either failing fails. Exit 5
# is "nothing collected" in that phase, and fails only when both phases collected nothing.
test: up
	@$(PY) -m ruff check --quiet
	@$(MAKE) --no-print-directory java-test
	@$(STACK) run -- $(PY) -m pytest -n $(LANES) --dist loadfile --no-loadscope-reorder -m "not serial" \
	    --junitxml=$(STATE)/test-report.xml $(PYTEST_ARGS); lanes=$$?; \
	  $(STACK) run -- $(PY) -m pytest -m serial --junitxml=$(STATE)/test-report-serial.xml $(PYTEST_ARGS); alone=$$?; \
	  echo "make test: lanes exit $$lanes, serial phase exit $$alone"; \
	  [[ $$lanes =~ ^[05]$$ && $$alone =~ ^[05]$$ && $$lanes$$alone != 55 ]]

bench: up
	@$(STACK) run -- $(PY) bench/batch_load.py $(BENCH_ARGS)

bench-stream: up
	@$(STACK) run -- $(PY) bench/stream_events.py $(BENCH_ARGS)

bench-peers: up
	@TIDEMARK_SPARK_QUICK_START=0 $(STACK) run -- $(PY) bench/batch_load.py --peers $(BENCH_ARGS)
	@$(STACK) run -- $(PY) bench/stream_events.py --peers $(STREAM_ARGS)

bench-cdc: up
	@$(STACK) run -- $(PY) bench/cdc_handoff.py $(BENCH_ARGS)

bench-reconcile: up
	@$(STACK) run -- $(PY) bench/reconcile_batch.py $(BENCH_ARGS)

profile-sink: up
	@$(STACK) run -- $(PY) bench/sink_profile.py $(BENCH_ARGS)

bench-flood: up
	@$(STACK) run -- $(PY) bench/reject_flood.py $(BENCH_ARGS)

campaign: up
	@$(STACK) run -- $(PY) bench/id_cursor_campaign.py $(CAMPAIGN_ARGS)

# the batch files whose tests make pipelines with batchrun.make_pipeline; not the serial ones, the Airflow
# ones (AIRFLOW_FILES) or the standing sinks' (test_events, test_supervisor, test_standalone_cluster)
DIRECT_FILES := $(addprefix tests/stack/,test_batch_faults.py test_protocol_v2.py test_untrusted_input.py \
  test_repair.py test_forgery.py test_upsert_paths.py test_capped_windows.py test_source_clamps.py \
  test_batch_consistency.py test_direct_transport.py test_evidence_page.py test_reconcile.py test_one_sink.py \
  test_source_access.py)

test-direct: up
	@TIDEMARK_TEST_TRANSPORT=direct $(STACK) run -- $(PY) -m pytest -n $(LANES) --dist loadfile --no-loadscope-reorder \
	    -m "not serial" \
	    --junitxml=$(STATE)/test-report-direct.xml $(DIRECT_FILES) $(PYTEST_ARGS)

kill-trials: up
	@$(STACK) run -- $(PY) -m tidemark_workshop.kill_trials --trials $(TRIALS) $(if $(SEED),--seed $(SEED))

campaign-failover: up
	@$(STACK) run -- $(PY) -m tidemark_workshop.failover --trials $(TRIALS) $(if $(SEED),--seed $(SEED))

clean: down
	rm -rf $(STATE)

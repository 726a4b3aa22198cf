"""The batch sink: apply committed batches from a pipeline topic to the warehouse, two-phase.

A Spark Structured Streaming query over the pipeline topic (read_committed). Each micro-batch is
handed to ``tidemark.sink.BatchSink``, which stages records and applies a batch only once END
has arrived on every partition and counts and checksums match, in one PostgreSQL transaction
together with the ledger, the watermark and the consumer offsets. The query starts from the
offsets stored in the warehouse (not from a Spark checkpoint), after taking a fencing token.
The driver's body is ``tidemark.sink.job``; this script only parses its arguments.

``--available-now`` processes what is on the topic and stops (the nightly DAG runs it so);
without it the sink *stands*: it runs until stopped, with a heartbeat and lease
(``tidemark.sink.lifeline``), trigger and intake from the spec's ``sink`` section, and stops between two
micro-batches when its desired state leaves ``running`` or SIGTERM arrives (exit 0), or when
another instance took its fence (exit 3). The ``tidemark_supervisor`` DAG launches it so.

  spark-submit spark_jobs/batch_sink.py --database 'host=127.0.0.1 port=25432 dbname=wh' \
      --user tidemark --password-env PW --spec include/pipelines/ledger_entries.yaml \
      --bootstrap 127.0.0.1:29092 --available-now
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path


def parse_args(argv: list[str]) -> argparse.Namespace:
    from tidemark.protocol.spec import DEAD_LETTER_TOPIC
    from tidemark.spark.entry import database_args

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    database_args(p)
    p.add_argument("--spec", required=True, type=Path)
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--available-now", action="store_true", help="process what is there, then stop")
    p.add_argument("--max-records-per-trigger", type=int,
                   help="bounds the sink's memory: at most this many records per micro-batch "
                        "(default: the spec's sink.max_offsets_per_trigger)")
    p.add_argument("--dead-letter-topic", default=DEAD_LETTER_TOPIC)
    p.add_argument("--replication-factor", type=int, help="of the topics it makes (default: min(3, brokers))")
    p.add_argument("--min-insync-replicas", type=int,
                   help="of the topics it makes (default: the replication factor - 1 from 3, else 1)")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stdout)
    from tidemark.sink.job import run

    return run(args)


if __name__ == "__main__":
    from tidemark.spark.entry import run

    sys.exit(run(main, sys.argv[1:], "batch_sink"))

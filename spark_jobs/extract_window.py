"""Extract one batch window from the source to the pipeline topic, with its END totals.

Reads ``lo < (cursor, pk) and cursor <= hi`` over JDBC in parallel cursor ranges, writes each row
as JSON (protocol version 1) or Avro (version 2, ``--avro-schema``) keyed by primary key to the
partition Kafka's murmur2 partitioner gives the key, tagged with the batch id and attempt in
headers, and in the same pass counts rows and sums 64-bit row hashes per partition. The totals go
to ``--report`` (JSON) for the END step. Any inconsistency (rows outside the window, Kafka offsets
that moved by other amounts than counted) exits 3. The driver's body is ``tidemark.batch.extract.job``;
this script only parses its arguments.

  spark-submit spark_jobs/extract_window.py --database 'host=127.0.0.1 port=25432 dbname=src' \
      --user tidemark --password-env PW --spec include/pipelines/ledger_entries.yaml \
      --batch-id B --attempt 1 --window '{"lo": ..., "hi": ...}' --bootstrap 127.0.0.1:29092 \
      --report /tmp/report.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def parse_args(argv: list[str]) -> argparse.Namespace:
    from tidemark.spark.entry import database_args

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    database_args(p)
    p.add_argument("--spec", required=True, type=Path, help="the pipeline's YAML spec")
    p.add_argument("--batch-id", required=True)
    p.add_argument("--attempt", required=True, type=int)
    p.add_argument("--window", required=True, help="the planned window as JSON")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--report", required=True, type=Path, help="where to write the per-partition totals")
    p.add_argument("--read-partitions", type=int, default=4, help="parallel JDBC range reads")
    p.add_argument("--repair-keys", type=Path, help="a repair batch: JSON document of the only keys to read")
    p.add_argument("--avro-schema", help="protocol version 2: the Avro writer schema of the batch's records "
                                         "(default: version 1, JSON)")
    p.add_argument("--handoff", action="store_true",
                   help="a CDC pipeline's handoff batch: create its replication slot with an exported snapshot and "
                        "read every row above the window's start in it (the user needs REPLICATION)")
    p.add_argument("--warehouse", help="transport: direct: the warehouse as libpq parameters; the tasks COPY the "
                                       "rows into the attempt's stage there instead of writing them to the topic")
    p.add_argument("--warehouse-user")
    p.add_argument("--warehouse-password-env", help="name of the env var holding the warehouse's password")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    from tidemark.batch.extract.job import run

    return run(parse_args(argv))


if __name__ == "__main__":
    from tidemark.spark.entry import run

    sys.exit(run(main, sys.argv[1:], "extract_window"))

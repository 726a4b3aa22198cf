"""The naive Spark JDBC copy the batch benchmark compares with: one JDBC read, one JDBC write.

What a hand-written job would do: ``spark.read.jdbc`` of the window's rows (no partitioning),
then ``DataFrame.write.jdbc`` in append mode, with Spark's defaults.

  spark-submit bench/naive_jdbc_copy.py --database 'host=127.0.0.1 port=25432 dbname=src' \
      --user tidemark --password-env PW --query "SELECT * FROM bank.ledger_entries WHERE ..." \
      --target-database 'host=127.0.0.1 port=25432 dbname=wh' --target-table bench_spark.ledger_entries
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str]) -> int:
    from tidemark.protocol.progress import summary_line
    from tidemark.spark.entry import database_args, jdbc_url, password, session

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    database_args(p)
    p.add_argument("--query", required=True, help="SELECT of the rows to copy")
    p.add_argument("--target-database", required=True, help="libpq parameters, as --database")
    p.add_argument("--target-table", required=True)
    args = p.parse_args(argv)
    props = {"user": args.user, "password": password(args), "driver": "org.postgresql.Driver"}
    spark = session("tidemark-bench-naive-jdbc")
    try:
        df = spark.read.jdbc(jdbc_url(args.database), f"({args.query}) AS q", properties=props)
        # stringtype=unspecified: the usual fix so that uuid columns accept Spark's strings
        target = jdbc_url(args.target_database, stringtype="unspecified")
        df.write.jdbc(target, args.target_table, mode="append", properties=props)
        print(summary_line("naive-jdbc", table=args.target_table), flush=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    from tidemark.spark.entry import run

    sys.exit(run(main, sys.argv[1:], "naive_jdbc_copy"))

"""Copy one table from PostgreSQL (JDBC) to a Kafka topic, keyed by primary key, as JSON.

The smoke job of the local stack: it proves Spark, the JDBC driver and the Kafka connector work
together. The database password is read from an environment variable, never from argv, so it
does not show up in process listings or spark-submit logs.

  spark-submit spark_jobs/table_to_topic.py --database 'host=127.0.0.1 port=25432 dbname=db' \
      --user tidemark --password-env TIDEMARK_SOURCE_PASSWORD --table smoke_accounts \
      --key id --topic tidemark.smoke.accounts --bootstrap 127.0.0.1:29092
"""

from __future__ import annotations

import argparse
import sys


def parse_args(argv: list[str]) -> argparse.Namespace:
    from tidemark.spark.entry import database_args

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    database_args(p)
    p.add_argument("--table", required=True)
    p.add_argument("--key", required=True, help="primary-key column, used as the Kafka key")
    p.add_argument("--topic", required=True)
    p.add_argument("--bootstrap", required=True)
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from tidemark.protocol.avro import JSON_OPTIONS
    from tidemark.protocol.progress import summary_line
    from tidemark.protocol.spec import quote
    from tidemark.spark.entry import JobError, jdbc_url, password, session

    secret = password(args)
    table = quote(args.table)  # validated identifier: nothing else reaches Spark's SQL
    quote(args.key)

    from pyspark.sql import functions as F

    spark = session(f"tidemark-table-to-topic-{args.table}")
    try:
        props = {"user": args.user, "password": secret, "driver": "org.postgresql.Driver"}
        df = spark.read.jdbc(jdbc_url(args.database), table, properties=props)
        if args.key not in df.columns:
            raise JobError(f"key column {args.key!r} not in {args.table} columns {df.columns}")
        # Decimals are JSON numbers with every digit; readers parse them as Decimal, never float.
        out = df.select(
            F.col(args.key).cast("string").alias("key"),
            F.to_json(F.struct(*[F.col(c) for c in df.columns]), JSON_OPTIONS).alias("value"),
        ).cache()
        rows = out.count()
        (
            out.write.format("kafka")
            .option("kafka.bootstrap.servers", args.bootstrap)
            .option("kafka.enable.idempotence", "true")
            .option("topic", args.topic)
            .save()
        )
        print(summary_line("spark", job="table_to_topic", table=args.table, topic=args.topic, rows=rows), flush=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    from tidemark.spark.entry import run

    sys.exit(run(main, sys.argv[1:], "table_to_topic"))

"""Copy one table from PostgreSQL (JDBC) to a Kafka topic, keyed by primary key, as JSON.

The smoke job of the local stack: it proves Spark, the JDBC driver and the Kafka connector work
together. The database password is read from an environment variable, never from argv, so it
does not show up in process listings or spark-submit logs.

  spark-submit spark_jobs/table_to_topic.py --jdbc-url jdbc:postgresql://127.0.0.1:55432/db \
      --user tidemark --password-env TIDEMARK_SOURCE_PASSWORD --table smoke_accounts \
      --key id --topic tidemark.smoke.accounts --bootstrap 127.0.0.1:59092
"""

from __future__ import annotations

import argparse
import os
import sys


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jdbc-url", required=True)
    p.add_argument("--user", required=True)
    p.add_argument("--password-env", required=True, help="name of the env var holding the password")
    p.add_argument("--table", required=True)
    p.add_argument("--key", required=True, help="primary-key column, used as the Kafka key")
    p.add_argument("--topic", required=True)
    p.add_argument("--bootstrap", required=True)
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    password = os.environ.get(args.password_env)
    if password is None:
        print(f"table_to_topic: environment variable {args.password_env} is not set", file=sys.stderr)
        return 2

    from pyspark.sql import SparkSession, functions as F

    from tidemark.spec import quote
    from tidemark.summary import summary_line

    table = quote(args.table)  # validated identifier: nothing else reaches Spark's SQL
    quote(args.key)

    spark = SparkSession.builder.appName(f"tidemark-table-to-topic-{args.table}").getOrCreate()
    try:
        df = (
            spark.read.format("jdbc")
            .option("url", args.jdbc_url)
            .option("dbtable", table)
            .option("user", args.user)
            .option("password", password)
            .option("driver", "org.postgresql.Driver")
            .load()
        )
        if args.key not in df.columns:
            print(f"table_to_topic: key column {args.key!r} not in {args.table} columns {df.columns}", file=sys.stderr)
            return 2
        # Decimals are JSON numbers with every digit; readers parse them as Decimal, never float.
        out = df.select(
            F.col(args.key).cast("string").alias("key"),
            F.to_json(F.struct(*[F.col(c) for c in df.columns]), {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX"}).alias("value"),
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
    sys.exit(main(sys.argv[1:]))

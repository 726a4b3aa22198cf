"""A small Spark job that touches what Tidemark's jobs touch (DataFrames, JSON, decimals, a shuffle,
Arrow): ``make up`` runs it once with -XX:ArchiveClassesAtExit so later jobs map those classes."""

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

spark = SparkSession.builder.appName("tidemark-warm-classes").getOrCreate()
spark.conf.set("spark.sql.execution.arrow.pyspark.enabled", "true")
rows = spark.range(10_000).select(
    "id", F.col("id").cast("decimal(18,2)").alias("amount"),
    F.to_json(F.struct(F.col("id"), F.current_timestamp().alias("at"))).alias("value"))
parsed = rows.select("amount", F.from_json("value", "id long, at timestamp").alias("r"))
totals = parsed.groupBy((F.col("r.id") % 7).alias("k")).agg(F.sum("amount"), F.count("*"))
print(sorted(totals.collect()))
print(len(rows.limit(100).toArrow() if hasattr(rows, "toArrow") else rows.limit(100).toPandas()))
spark.stop()

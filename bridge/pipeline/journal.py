"""The journal as a DataFrame: the schema of ``bridge/app/journal.schema.json`` in Spark's
terms, read from any URI Spark reads (a folder, a file, a glob; local, HDFS, S3...)."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

SCHEMA = StructType([
    StructField("v", IntegerType()),
    StructField("time", LongType()),
    StructField("event", StringType()),
    StructField("broker", StringType()),
    StructField("instance", StringType()),
    StructField("process", StringType()),
    StructField("message_id", StringType()),
    StructField("destination", StringType()),
    StructField("size", LongType()),
    StructField("due", LongType()),
    StructField("late_ms", LongType()),
    StructField("expires", LongType()),
    StructField("delivery_count", IntegerType()),
    StructField("delay_ms", LongType()),
    StructField("reason", StringType()),
    StructField("reason_code", IntegerType()),
    StructField("detail", StringType()),
    StructField("queue", StringType()),
])  # fmt: skip


def read(spark: SparkSession, path: str | list[str]) -> DataFrame:
    """The events of the closed journal files (``*.jsonl``) under ``path``; the files still
    being written (``*.jsonl.tmp``) are not read. Lines that are not JSON are dropped."""
    return (
        spark.read.schema(SCHEMA)
        .option("mode", "DROPMALFORMED")
        .option("pathGlobFilter", "*.jsonl")
        .option("recursiveFileLookup", "true")
        .json(path)
    )


def hour(time_ms: Column) -> Column:
    """The UTC hour an epoch-ms time falls in, as a timestamp."""
    return F.date_trunc("hour", F.timestamp_millis(time_ms))

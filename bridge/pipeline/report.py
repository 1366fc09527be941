"""``jms-bridge report``: what happened to messages, per destination and per hour, from the
event journal; Parquet tables and one self-contained HTML page of charts.

Each table is a function of the events DataFrame, so it is tested on a small one:

- ``outcomes``: messages by event (staged, released, expired...);
- ``lateness``: releases, lateness p50/p90/p99/max in ms, and how many were released early
  (``late_ms`` < 0: must be zero; an operator's release-now is not a release here);
- ``lateness_buckets``: the lateness distribution, over everything chosen;
- ``redeliveries``: failed deliveries redelivered, the messages they were of, redeliveries per
  message (mean and max);
- ``dead_letters``: messages dead-lettered, sent to the undelivered queue, deleted by their
  policy, or undeliverable when due, by reason.

Run under ``spark-submit`` as ``spark-submit --master URL bridge/pipeline/report.py --journal
PATH --out DIR``, or through ``jms-bridge report``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from bridge.pipeline import journal
from bridge.pipeline.options import add_arguments
from bridge.pipeline.session import existing_paths, in_one_line, started
from bridge.pipeline.watch import Interrupted, Meter, Watch

# Upper bounds (ms, inclusive) of the lateness buckets; below 0 is early, above the last is
# the last bucket.
LATENESS_BOUNDS_MS: tuple[int, ...] = (
    0, 1, 2, 5, 10, 20, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 60_000,
)
PERCENTILE_ACCURACY = 10_000  # percentile_approx: relative rank error of 1/10,000
FAILED = ("dead-lettered", "undelivered", "deleted", "undeliverable")
TABLES = ("outcomes", "lateness", "lateness_buckets", "redeliveries", "dead_letters")


def events(df: DataFrame, since_ms: int | None = None, until_ms: int | None = None) -> DataFrame:
    """The events from ``since_ms`` (inclusive) to ``until_ms`` (exclusive), with their hour;
    events of an unknown schema version are left out."""
    df = df.where(F.col("v") == 1)
    if since_ms is not None:
        df = df.where(F.col("time") >= since_ms)
    if until_ms is not None:
        df = df.where(F.col("time") < until_ms)
    return df.withColumn("hour", journal.hour(F.col("time"))).withColumn(
        "destination", F.coalesce(F.col("destination"), F.lit("(none)")))


def outcomes(ev: DataFrame) -> DataFrame:
    return (ev.groupBy("destination", "hour", "event").agg(F.count(F.lit(1)).alias("messages"))
            .orderBy("destination", "hour", "event"))


def lateness(ev: DataFrame) -> DataFrame:
    late = F.col("late_ms")
    return (
        ev.where(F.col("event") == "released")
        .groupBy("destination", "hour")
        .agg(
            F.count(F.lit(1)).alias("released"),
            F.percentile_approx(late, [0.5, 0.9, 0.99], PERCENTILE_ACCURACY).alias("p"),
            F.max(late).alias("max_ms"),
            F.sum(F.when(late < 0, 1).otherwise(0)).alias("early"),
        )
        .select("destination", "hour", "released",
                F.col("p")[0].alias("p50_ms"), F.col("p")[1].alias("p90_ms"),
                F.col("p")[2].alias("p99_ms"), "max_ms", F.col("early").cast("long"))
        .orderBy("destination", "hour")
    )


def lateness_bucket(late: Column) -> Column:
    """The label of a lateness's bucket: ``early``, ``<=N ms``, or ``>N ms`` past the last."""
    label = F.when(late < 0, F.lit("early"))
    for bound in LATENESS_BOUNDS_MS:
        label = label.when(late <= bound, F.lit(f"<={bound} ms"))
    return label.otherwise(F.lit(f">{LATENESS_BOUNDS_MS[-1]} ms"))


def bucket_order() -> list[str]:
    return ["early", *(f"<={b} ms" for b in LATENESS_BOUNDS_MS), f">{LATENESS_BOUNDS_MS[-1]} ms"]


def lateness_buckets(ev: DataFrame) -> DataFrame:
    return (ev.where(F.col("event") == "released")
            .groupBy(lateness_bucket(F.col("late_ms")).alias("bucket"))
            .agg(F.count(F.lit(1)).alias("released")))


def redeliveries(ev: DataFrame) -> DataFrame:
    per_message = (
        ev.where(F.col("event") == "redelivered")
        .groupBy("destination", "hour", "message_id")
        .agg(F.count(F.lit(1)).alias("n"))
    )
    return (
        per_message.groupBy("destination", "hour")
        .agg(F.sum("n").alias("redeliveries"), F.count(F.lit(1)).alias("messages"),
             F.max("n").alias("max_per_message"))
        .withColumn("per_message", F.col("redeliveries") / F.col("messages"))
        .select("destination", "hour", F.col("redeliveries").cast("long"), "messages",
                "per_message", "max_per_message")
        .orderBy("destination", "hour")
    )


def dead_letters(ev: DataFrame) -> DataFrame:
    return (
        ev.where(F.col("event").isin(*FAILED))
        .groupBy("destination", "hour", "event",
                 F.coalesce(F.col("reason"), F.lit("(none)")).alias("reason"))
        .agg(F.count(F.lit(1)).alias("messages"))
        .orderBy("destination", "hour", F.desc("messages"))
    )


@dataclass(frozen=True, slots=True)
class Report:
    tables: dict[str, DataFrame]
    events: int
    seconds: float


def run(
    spark: SparkSession,
    journal_path: str | list[str],
    out: str,
    *,
    since_ms: int | None = None,
    until_ms: int | None = None,
    html: bool = True,
) -> Report:
    """Read, aggregate, write the Parquet tables under ``out`` and ``out/report.html``."""
    started = time.monotonic()
    columns = ["v", "time", "event", "destination", "message_id", "late_ms", "reason"]
    ev = events(journal.read(spark, journal_path).select(*columns), since_ms, until_ms)
    ev = ev.persist()
    first_last = ev.agg(F.count("*"), F.min("time"), F.max("time")).first()
    count = int(first_last[0]) if first_last is not None else 0
    # The page states the range it covers: the one asked for, else the events' own.
    if count and first_last is not None:
        since_ms = since_ms if since_ms is not None else int(first_last[1])
        until_ms = until_ms if until_ms is not None else int(first_last[2])
    tables = {
        "outcomes": outcomes(ev), "lateness": lateness(ev),
        "lateness_buckets": lateness_buckets(ev), "redeliveries": redeliveries(ev),
        "dead_letters": dead_letters(ev),
    }
    for name, table in tables.items():
        table.coalesce(1).write.mode("overwrite").parquet(f"{out.rstrip('/')}/{name}")
    written = {name: spark.read.parquet(f"{out.rstrip('/')}/{name}") for name in tables}
    ev.unpersist()
    if html:
        from bridge.pipeline.charts import render

        page = render(written, events=count, since_ms=since_ms, until_ms=until_ms,
                      bucket_order=bucket_order())
        _write_text(spark, f"{out.rstrip('/')}/report.html", page)
    return Report(written, count, time.monotonic() - started)


def _write_text(spark: SparkSession, uri: str, text: str) -> None:
    """A small text file at ``uri``: a local path directly, anything else through Hadoop's
    file system of that URI (so ``--out s3a://...`` gets its page too)."""
    if "://" not in uri or uri.startswith("file://"):
        path = Path(uri.removeprefix("file://"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return
    jvm: Any = spark.sparkContext._jvm  # noqa: SLF001 -- the one way to Hadoop's FileSystem
    hadoop_path = jvm.org.apache.hadoop.fs.Path(uri)
    fs = hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())  # noqa: SLF001
    stream = fs.create(hadoop_path, True)
    try:
        stream.write(bytearray(text.encode("utf-8")))
    finally:
        stream.close()


def main_with(ns: argparse.Namespace, meter: Callable[[], Meter] | None = None) -> int:
    """``jms-bridge report``; a ConfigError of one line for a journal that is not there or a
    failure in Spark; ``Interrupted`` when Ctrl-C stopped it. ``meter``: the progress bar the
    job's tasks advance."""
    existing_paths(ns.journal, "--journal")
    spark = started(ns.master, "jms-bridge report", ns.conf)
    where = spark.sparkContext.master  # named in a failure's line
    try:
        with Watch(spark, meter) as watch:
            try:
                report = run(spark, ns.journal, ns.out, since_ms=ns.since, until_ms=ns.until)
            except Exception as exc:  # noqa: BLE001 - Spark's own, in one line (in_one_line)
                if watch.asked:
                    raise Interrupted("interrupted: the report was not written") from None
                raise in_one_line(exc, f"report failed on {where}") from None
    finally:
        spark.stop()
    print(f"{report.events} events; tables and report.html in {ns.out} "
          f"({report.seconds:.1f} s)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="report", description=__doc__.split("\n")[0])
    add_arguments(parser)
    try:
        return main_with(parser.parse_args(argv))
    except Interrupted as stopped:
        print(stopped.line, file=sys.stderr)
        return 130  # 128 + SIGINT


if __name__ == "__main__":
    sys.exit(main())

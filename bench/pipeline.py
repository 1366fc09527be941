"""The report job's time on synthetic journals of 1, 3 and 10 million events, on local[2].

    python bench/pipeline.py [--sizes 1000000,3000000] [--dir /tmp/jms-bridge-bench]

Each journal is generated once (by Spark, as the writer's ``*.jsonl`` files, about 180 bytes an
event) and kept in ``--dir`` for the next run. The events are a plausible mix over 50
destinations and 24 hours: staged and released messages (lateness mostly a few ms, a tail to
seconds), refusals, expiries, undeliverables, redeliveries and dead letters.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from bridge.pipeline import report  # noqa: E402
from bridge.pipeline.session import session  # noqa: E402

START_MS = 1_767_225_600_000  # 2026-01-01T00:00Z
DAY_MS = 86_400_000
FILE_EVENTS = 250_000  # about 45 MB a file, as a writer rotating at 64 MiB leaves them


def generate(spark: SparkSession, events: int, folder: Path) -> None:
    """``events`` journal lines in ``folder``, as ``*.jsonl`` files."""
    staging = folder.with_name(folder.name + ".parts")
    shutil.rmtree(staging, ignore_errors=True)
    r = F.rand(7)
    pick = (F.when(r < 0.45, "staged").when(r < 0.85, "released").when(r < 0.87, "refused")
            .when(r < 0.89, "expired").when(r < 0.90, "undeliverable")
            .when(r < 0.97, "redelivered").when(r < 0.99, "dead-lettered").otherwise("deleted"))
    late = F.floor(F.pow(F.rand(11), 8) * 3000).cast("long")  # mostly 0-2 ms, a tail to 3 s
    df = (
        spark.range(events, numPartitions=max(1, events // FILE_EVENTS))
        .withColumn("event", pick)
        .withColumn("time",
                    (F.lit(START_MS) + F.floor(F.col("id") * DAY_MS / events)).cast("long"))
        .select(
            F.lit(1).alias("v"), "time", "event", F.lit("rabbitmq").alias("broker"),
            F.lit("bench-1").alias("instance"),
            F.when(F.col("event").isin("staged", "refused", "redelivered", "dead-lettered",
                                       "deleted"), "bridge").otherwise("engine").alias("process"),
            F.concat(F.lit("ID:m"), (F.col("id") % (events // 2 + 1)).cast("string"))
            .alias("message_id"),
            F.concat(F.lit("/queue/orders."), (F.col("id") % 50).cast("string"))
            .alias("destination"),
            (F.col("id") % 4096).alias("size"),
            F.when(F.col("event").isin("staged", "released", "expired", "undeliverable"),
                   F.col("time") - late).alias("due"),
            F.when(F.col("event").isin("released", "expired", "undeliverable"), late)
            .alias("late_ms"),
            F.when(F.col("event").isin("redelivered", "dead-lettered", "deleted"),
                   (F.col("id") % 7 + 1).cast("int")).alias("delivery_count"),
            F.when(F.col("event") == "refused", "MQRC_EXPIRY_ERROR")
            .when(F.col("event") == "expired", "MQFB_EXPIRATION")
            .when(F.col("event") == "undeliverable", "MQRC_Q_FULL")
            .when(F.col("event").isin("dead-lettered", "deleted"),
                  "MQRC_BACKOUT_THRESHOLD_REACHED").alias("reason"),
        )
        .withColumn("reason_code", F.when(F.col("reason") == "MQRC_EXPIRY_ERROR", 2013)
                    .when(F.col("reason") == "MQFB_EXPIRATION", 258)
                    .when(F.col("reason") == "MQRC_Q_FULL", 2053)
                    .when(F.col("reason").isNotNull(), 2362))
    )
    df.write.mode("overwrite").json(str(staging))
    folder.mkdir(parents=True, exist_ok=True)
    for i, part in enumerate(sorted(staging.glob("part-*"))):
        part.rename(folder / f"bench-1-engine-{START_MS}-{i:05d}.jsonl")
    shutil.rmtree(staging)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000000,3000000,10000000")
    parser.add_argument("--dir", default="/tmp/jms-bridge-bench")
    parser.add_argument("--master", default="local[2]")
    ns = parser.parse_args()
    root = Path(ns.dir)
    sizes = [int(s) for s in ns.sizes.split(",")]
    spark = session(ns.master, "jms-bridge bench")
    print(f"{'events':>12} {'journal MB':>11} {'report s':>9} {'events/s':>10}")
    try:
        for n in sizes:
            folder = root / f"journal-{n}"
            if not list(folder.glob("*.jsonl")):
                generate(spark, n, folder)
            mb = sum(f.stat().st_size for f in folder.glob("*.jsonl")) / 1e6
            out = root / f"report-{n}"
            shutil.rmtree(out, ignore_errors=True)
            started = time.monotonic()
            result = report.run(spark, str(folder), str(out))
            seconds = time.monotonic() - started
            assert result.events == n, (result.events, n)
            print(f"{n:>12,} {mb:>11,.0f} {seconds:>9.1f} {n / seconds:>10,.0f}", flush=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Replay of a dead-letter archive on Spark: ``jms-bridge replay --archive PATH --selector EXPR``.

The archive is what ``jms-bridge dlq export`` writes (``bridge.deadletter.archive``: Parquet or
JSON lines, one row a message, any URI Spark reads). The job

1. reads it, keeps one row per message (an interrupted export may have written a message twice:
   the key is its original id, else queue + broker id + position) and the rows the JMS selector
   selects (the dead-letter tools' grammar and header map, ``JMSDestination='Queue[A]'`` being
   the original destination), compiled to a Spark SQL expression
   (``bridge.pipeline.spark_selectors``);
2. leaves out the keys in the ledger: a queue on the broker (``jms-bridge.replay-ledger.<name>``)
   whose messages list the keys already replayed;
3. in each partition, puts its messages back to their original destination (or ``--to``) with
   the application's headers restored (``bridge.deadletter.metadata.replay_headers``), a batch
   at a time, at an optional overall ``--rate``: a batch and the ledger message naming its keys
   go in ONE broker transaction (RabbitMQ tx.commit, answered once persistent messages are on
   disk; ActiveMQ's STOMP COMMIT). A driver or executor killed at any moment leaves each batch
   either replayed and in the ledger, or neither: a rerun with the same ledger replays nothing
   twice and misses nothing;
4. prints and (with ``--out``) writes its summary: matched, replayed, skipped as already done,
   failed with reasons. A batch the broker refuses is put again one message at a time, so one
   refused message (an unknown destination, say) fails alone, with its reason.

The ledger's name defaults to a digest of the archive paths and ``--to``, not the selector: every
replay of one archive to one target shares it, so a rerun, or a replay with another selector that
overlaps an earlier one, skips what was put back already. ``--ledger NAME`` names it explicitly.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bridge.pipeline.session import existing_paths, in_one_line, started
from bridge.pipeline.spark_selectors import matches
from bridge.pipeline.watch import Interrupted, Meter, Watch

LEDGER_PREFIX = "jms-bridge.replay-ledger."
BATCH = 500


@dataclass
class Summary:
    archive_rows: int = 0
    matched: int = 0
    skipped_done: int = 0
    replayed: int = 0
    failed: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    ledger: str = ""
    seconds: float = 0.0


def ledger_name(archives: list[str], to: str | None) -> str:
    """The default ledger's name: a digest of the archive (its paths, local ones made absolute)
    and ``--to``, not of the selector, so that replays of one archive with any selectors never
    put a message back twice."""
    paths = sorted(p if "://" in p else str(Path(p).resolve()) for p in archives)
    return hashlib.sha256(json.dumps([paths, to or ""]).encode()).hexdigest()[:16]


def read_archive(spark: SparkSession, paths: list[str]) -> DataFrame:
    """The archive's rows with ``body`` as binary, whichever format each path holds."""
    frames = []
    for path in paths:
        if path.rstrip("/").endswith(".jsonl") or _holds(spark, path, ".jsonl"):
            df = spark.read.json(path, schema=_JSON_SCHEMA)
            df = df.withColumn("body", F.unbase64("body_base64")).drop("body_base64")
        else:
            df = spark.read.parquet(path)
        frames.append(df.select(*_COLUMNS))
    out = frames[0]
    for more in frames[1:]:
        out = out.unionByName(more)
    return out


def _holds(spark: SparkSession, path: str, suffix: str) -> bool:
    """Whether a folder holds files ending in ``suffix`` (through Hadoop's file system, so any
    URI Spark reads works)."""
    jvm: Any = spark.sparkContext._jvm  # noqa: SLF001 -- the one way to Hadoop's FileSystem
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    fs = hpath.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())  # noqa: SLF001
    if not fs.exists(hpath) or not fs.getFileStatus(hpath).isDirectory():
        return False
    return any(str(s.getPath().getName()).endswith(suffix) for s in fs.listStatus(hpath))


_COLUMNS = ["queue", "broker", "broker_id", "position", "original_id", "original_destination",
            "headers", "body"]
_JSON_SCHEMA = ("schema INT, queue STRING, broker STRING, broker_id STRING, position LONG, "
                "exported_at_ms LONG, original_id STRING, kind STRING, reason STRING, "
                "reason_code INT, reason_text STRING, original_destination STRING, "
                "failed_at_ms LONG, delivery_count INT, persistent BOOLEAN, "
                "headers MAP<STRING,STRING>, body_base64 STRING")


def selected(df: DataFrame, selector: str | None, broker: str) -> DataFrame:
    """One row a message (with its ``key``), those the selector selects."""
    from bridge.deadletter.metadata import selector_headers
    from policies.selector import for_broker

    key = F.when(F.coalesce(F.col("original_id"), F.lit("")) != "", F.col("original_id")) \
        .otherwise(F.concat_ws("#", "queue", "broker_id", F.col("position").cast("string")))
    df = df.withColumn("key", key).dropDuplicates(["key"])
    if selector:
        header_map = selector_headers(for_broker(broker))
        df = df.filter(matches(selector, "headers", header_map))
    return df


# -- the broker side: runs on the driver (the ledger) and in each partition (the puts) ------------

@dataclass(frozen=True)
class Target:
    """Where to replay, as plain values (pickled to the executors, each of which opens its own
    connection): the broker, its endpoint, ``--to``, the ledger queue and the pace."""

    broker: str
    endpoint: Any  # policies.endpoints.Endpoint
    management: Any  # Endpoint | None: RabbitMQ's management API
    to: str | None
    ledger_queue: str
    rate_per_partition: float | None
    batch: int = BATCH

    def tools(self) -> Any:
        if self.broker == "rabbitmq":
            from adapters.queues_rabbitmq import RabbitMQQueues

            tools: Any = RabbitMQQueues(self.endpoint, management=self.management)
        else:
            from adapters.queues_activemq import ActiveMQQueues

            tools = ActiveMQQueues(self.endpoint)
        tools.connect()
        return tools


def done_keys(target: Target) -> set[str]:
    """Every key the ledger names (read without removing anything)."""
    tools = target.tools()
    try:
        if tools.size(target.ledger_queue) is None:
            return set()
        keys: set[str] = set()
        for found in tools.inspect(target.ledger_queue):
            keys.update(k for k in found.message.body.decode().split("\n") if k)
        return keys
    finally:
        tools.close()


def publish_partition(target: Target, rows: Iterable[Any]) -> Iterator[dict[str, Any]]:
    """Put a partition's rows, a batch (and its ledger entry) per transaction; yields one
    count of replayed and failed (by reason) for the partition."""
    from adapters.base import Message
    from adapters.queues import Put
    from bridge.deadletter.metadata import describe, replay_headers
    from policies.errors import BrokerUnavailable, PutRefused

    _quiet_logs()
    _no_sigint()
    tools = target.tools()
    fmt = tools.format
    ledger_dest = f"/queue/{target.ledger_queue}"
    replayed, reasons = 0, Counter[str]()
    started, sent = time.monotonic(), 0

    def put(batch: list[tuple[str, Put]]) -> None:
        nonlocal replayed
        keys = "\n".join(k for k, _ in batch).encode()
        ledger = Put(ledger_dest, Message({"persistent": "true"}, keys))
        tools.put_all([p for _, p in batch] + [ledger])
        replayed += len(batch)

    def flush(batch: list[tuple[str, Put]]) -> None:
        if not batch:
            return
        try:
            put(batch)
        except PutRefused:
            for one in batch:  # find the one the broker refuses: the rest go in
                try:
                    put([one])
                except PutRefused as refused:
                    reasons[f"{refused.reason.name} ({refused.reason.code})"] += 1
        batch.clear()

    try:
        batch: list[tuple[str, Put]] = []
        for row in rows:
            headers = dict(row["headers"] or {})
            info = describe(headers, row["broker_id"] or "")
            where = target.to or row["original_destination"] or info.original_destination
            if not where:
                reasons["no original destination (give --to)"] += 1
                continue
            body = bytes(row["body"] or b"")
            message = Message(replay_headers(headers, info, fmt), body)
            batch.append((row["key"], Put(where, message)))
            if len(batch) >= target.batch:
                flush(batch)
            sent += 1
            if target.rate_per_partition:
                ahead = started + sent / target.rate_per_partition - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
        flush(batch)
    except BrokerUnavailable as gone:
        reasons[f"broker unavailable: {gone}"] += 1
    finally:
        tools.close()
    yield {"replayed": replayed, "reasons": dict(reasons)}


def _quiet_logs() -> None:
    """A Python worker logs the adapters' warnings and errors only (its own process: structlog
    is not configured there)."""
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


def _no_sigint() -> None:
    """A terminal's Ctrl-C reaches this worker too (one process group): the driver cancels the
    job, and the worker stops between transactions without a traceback of its own."""
    import signal

    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the worker's main thread
        pass


def run(
    spark: SparkSession,
    archives: list[str],
    selector: str | None,
    target: Target,
    *,
    broker: str,
    partitions: int | None = None,
    done: set[str] | None = None,
) -> Summary:
    """The job. ``partitions``: how many publish in parallel (default: Spark's parallelism);
    ``done``: the ledger's keys, if the caller read them already."""
    started = time.monotonic()
    summary = Summary(ledger=target.ledger_queue)
    rows = read_archive(spark, archives)
    summary.archive_rows = rows.count()
    chosen = selected(rows, selector, broker).persist()
    summary.matched = chosen.count()
    done = done_keys(target) if done is None else done
    if done:
        done_df = spark.createDataFrame([(k,) for k in done], "key STRING")
        todo = chosen.join(F.broadcast(done_df), "key", "left_anti")
    else:
        todo = chosen
    n = partitions or spark.sparkContext.defaultParallelism
    todo = todo.repartition(n)
    to_put = todo.count()
    summary.skipped_done = summary.matched - to_put
    if target.rate_per_partition is not None:
        target = replace(target, rate_per_partition=target.rate_per_partition / n)
    results = todo.rdd.mapPartitions(lambda it: publish_partition(target, it)).collect()
    chosen.unpersist()
    reasons: Counter[str] = Counter()
    for r in results:
        summary.replayed += r["replayed"]
        reasons.update(r["reasons"])
    summary.failed = to_put - summary.replayed
    summary.reasons = dict(reasons)
    summary.seconds = round(time.monotonic() - started, 3)
    return summary


def render(summary: Summary) -> str:
    lines = [f"matched {summary.matched:,} of {summary.archive_rows:,} archived messages; "
             f"replayed {summary.replayed:,}, skipped {summary.skipped_done:,} already replayed "
             f"(ledger {summary.ledger}), failed {summary.failed:,} ({summary.seconds:.1f} s)"]
    lines += [f"  failed: {n:,} {why}" for why, n in sorted(summary.reasons.items())]
    return "\n".join(lines)


def target_of(ns: argparse.Namespace, broker: str, endpoint: Any, management: Any) -> Target:
    """The command's target: its ledger is ``--ledger``, else the default one."""
    ledger = LEDGER_PREFIX + (ns.ledger or ledger_name(ns.archive, ns.to))
    return Target(broker, endpoint, management, ns.to, ledger, ns.rate, ns.batch)


def main_with(ns: argparse.Namespace, broker: str, endpoint: Any, management: Any,
              meter: Callable[[], Meter] | None = None) -> int:
    """``jms-bridge replay``: 0 when every matching message is replayed (now or before);
    ``Interrupted`` when Ctrl-C stopped it. ``endpoint``: the broker connection the bridge's
    own tools use (the CLI resolves it); ``meter``: the progress bar the job's tasks advance."""
    from policies.selector import parse

    if ns.selector:
        parse(ns.selector)  # InvalidSelector, at the column, before Spark starts
    existing_paths(ns.archive, "--archive")
    target = target_of(ns, broker, endpoint, management)
    spark = started(ns.master, "jms-bridge replay", ns.conf)
    where = spark.sparkContext.master  # named in a failure's line
    done: set[str] = set()
    try:
        with Watch(spark, meter) as watch:
            try:
                done = done_keys(target)
                summary = run(spark, ns.archive, ns.selector, target, broker=broker,
                              partitions=ns.partitions, done=done)
            except Exception as exc:  # noqa: BLE001 - Spark's own, in one line (in_one_line)
                if not watch.asked:
                    raise in_one_line(exc, f"replay failed on {where}") from None
                interrupted = True
            else:
                interrupted = False
    finally:
        spark.stop()
    if interrupted:  # Spark stopped: no worker publishes any more
        now = len(done_keys(target) - done)
        raise Interrupted(f"interrupted: {now:,} replayed so far (in the ledger "
                          f"{target.ledger_queue}); the rest stays in the archive, and the "
                          "same command goes on where it stopped")
    print(render(summary))
    if ns.out:
        _write_summary(ns.out, summary)
    return 0 if summary.failed == 0 else 1


def _write_summary(out: str, summary: Summary) -> None:
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    tmp = path / ".summary.json.tmp"
    tmp.write_text(json.dumps(asdict(summary), indent=2) + "\n")
    tmp.replace(path / "summary.json")

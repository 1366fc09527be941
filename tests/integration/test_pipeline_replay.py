"""The PySpark replay of a dead-letter archive, against both brokers: a selector picks half of
an archive; a replay killed part-way (SIGKILL of the driver) and run again puts every matching
message back exactly once, and none of the others."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from bridge.deadletter.archive import row
from bridge.staging import envelope
from policies.endpoints import Endpoint
from tests.integration.brokers import Broker
from tests.integration.clients import connect

ROOT = Path(__file__).resolve().parents[2]
COUNT = 240  # half of them red


def write_archive(folder: Path, broker: Broker, run: str) -> tuple[str, str]:
    """A JSON lines archive as `dlq export` writes it: bridge dead letters from two queues."""
    red, blue = f"/queue/jbt-rp-{run}-red", f"/queue/jbt-rp-{run}-blue"
    rows = []
    for i in range(COUNT):
        dest = red if i % 2 == 0 else blue
        headers = {
            envelope.REASON: "MQRC_BACKOUT_THRESHOLD_REACHED", envelope.REASON_CODE: "2362",
            envelope.ORIGINAL_DESTINATION: dest, envelope.DELIVERY_COUNT: "5",
            envelope.MESSAGE_ID: f"id-{run}-{i}", "color": "red" if i % 2 == 0 else "blue",
            "seq": str(i), "persistent": "true",
        }
        rows.append(row("jms-bridge.undelivered", broker.name, "", i, headers,
                        f"body {i}".encode(), now_ms=1))
    folder.mkdir(parents=True)
    with (folder / "archive-1.jsonl").open("w") as f:
        for r in rows:
            r = dict(r)
            import base64

            r["body_base64"] = base64.b64encode(r.pop("body")).decode()
            f.write(json.dumps(r) + "\n")
    return red, blue


def target_args(broker: Broker) -> list[str]:
    if broker.name == "rabbitmq":
        return ["--broker", "rabbitmq", "--upstream-stomp",
                f"stomp://{broker.user}:{broker.password}@{broker.stomp_host}:{broker.stomp_port}",
                "--upstream-amqp", broker.amqp_url or ""]
    return ["--broker", "activemq", "--upstream-stomp",
            f"stomp://{broker.user}:{broker.password}@{broker.stomp_host}:{broker.stomp_port}"]


def replayed_so_far(target: Any, destination: str) -> int:
    """How many messages the target queue holds (0 while the broker cannot say)."""
    from policies.errors import BrokerUnavailable

    try:
        tools = target.tools()
        try:
            return tools.size(destination.rsplit("/", 1)[1]) or 0
        finally:
            tools.close()
    except BrokerUnavailable:  # ActiveMQ's statistics plugin can be slow under load
        return 0


def drain(broker: Broker, destination: str, expect: int) -> list[Any]:
    conn, inbox = connect(broker.stomp_port, broker.user, broker.password)
    conn.subscribe(destination, id="d", ack="auto")
    got = inbox.take(expect, timeout=20)
    got += inbox.quiet(0.5)
    conn.disconnect()
    return got


def test_a_killed_replay_rerun_puts_each_matching_message_back_once(
    broker: Broker, spark: Any, tmp_path: Path
) -> None:
    from bridge.pipeline import replay

    run = uuid.uuid4().hex[:8]
    archive = tmp_path / "archive"
    red, blue = write_archive(archive, broker, run)
    ledger = f"jbt-rp-{run}"
    selector = "JMSDestination = 'Queue[" + red.rsplit("/", 1)[1] + "]' AND color = 'red'"
    argv = [sys.executable, "-m", "bridge.app.cli", "replay", *target_args(broker),
            "--archive", str(archive), "--selector", selector, "--ledger", ledger,
            "--rate", "60", "--batch", "10", "--partitions", "2", "--master", "local[2]"]
    rabbit = broker.name == "rabbitmq"
    endpoint = (Endpoint("127.0.0.1", 5672, "guest", "guest", "/") if rabbit else
                Endpoint(broker.stomp_host, broker.stomp_port, broker.user, broker.password))
    target = replay.Target(broker.name, endpoint, None, None,
                           replay.LEDGER_PREFIX + ledger, None, 10)
    driver = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              start_new_session=True)
    # kill the driver (and its Spark JVM) once some batches are in, well before the end
    deadline = time.monotonic() + 90
    while replayed_so_far(target, red) < 20 and driver.poll() is None:
        assert time.monotonic() < deadline, "the replay never started"
        time.sleep(0.2)
    os.killpg(driver.pid, signal.SIGKILL)
    output = driver.communicate()[0].decode(errors="replace")
    assert driver.returncode == -signal.SIGKILL, f"the replay ended by itself:\n{output[-3000:]}"
    time.sleep(0.5)
    summary = replay.run(spark, [str(archive)], selector, target, broker=broker.name,
                         partitions=2)
    assert summary.matched == COUNT // 2
    assert summary.failed == 0, summary
    assert 0 < summary.skipped_done < COUNT // 2, summary  # the killed run did some
    assert summary.skipped_done + summary.replayed == COUNT // 2

    got = drain(broker, red, COUNT // 2)
    seqs = sorted(int(m.headers["seq"]) for m in got)
    missing = sorted(set(range(0, COUNT, 2)) - set(seqs))
    assert seqs == list(range(0, COUNT, 2)), (
        f"{len(seqs)} arrived: duplicates or gaps; missing {missing}; {summary}")
    h = got[0].headers
    assert envelope.REASON not in h and envelope.ORIGINAL_DESTINATION not in h
    assert h["jms-bridge-replay-of"] == h[envelope.MESSAGE_ID]
    assert drain(broker, blue, 0) == []

    again = replay.run(spark, [str(archive)], selector, target, broker=broker.name)
    assert (again.replayed, again.skipped_done) == (0, COUNT // 2)


def forget_ledger(broker: Broker, ledger_queue: str) -> None:
    """Delete a test's ledger queue on RabbitMQ (its name is not the suite's ``jbt-``), empty it
    on ActiveMQ."""
    if broker.name == "rabbitmq":
        import pika

        conn = pika.BlockingConnection(pika.URLParameters(broker.amqp_url or ""))
        conn.channel().queue_delete(ledger_queue)
        conn.close()
    else:
        drain(broker, f"/queue/{ledger_queue}", 0)


def test_replays_with_overlapping_selectors_deliver_the_overlap_once(
    broker: Broker, spark: Any, tmp_path: Path
) -> None:
    """The default ledger is the archive's (and the target's), whatever the selector: a second
    replay of the same archive skips what the first one put back, and says so."""
    from bridge.app.cli import build_parser
    from bridge.pipeline import replay

    run = uuid.uuid4().hex[:8]
    archive = tmp_path / "archive"
    write_archive(archive, broker, f"spark-{run}")
    to = f"/queue/jbt-spark-{run}-again"
    rabbit = broker.name == "rabbitmq"
    endpoint = (Endpoint("127.0.0.1", 5672, "guest", "guest", "/") if rabbit else
                Endpoint(broker.stomp_host, broker.stomp_port, broker.user, broker.password))
    summaries, ledgers = [], set()
    for selector in ("seq < 30", "seq >= 20 AND seq < 50"):  # seq 20..29 in both
        ns = build_parser().parse_args(["replay", *target_args(broker), "--archive",
                                        str(archive), "--selector", selector, "--to", to])
        target = replay.target_of(ns, broker.name, endpoint, None)
        ledgers.add(target.ledger_queue)
        summaries.append(replay.run(spark, ns.archive, ns.selector, target,
                                    broker=broker.name, partitions=2))
    try:
        first, second = summaries
        assert (first.matched, first.replayed, first.skipped_done) == (30, 30, 0), first
        assert (second.matched, second.replayed, second.skipped_done) == (30, 20, 10), second
        assert "replayed 20, skipped 10 already replayed" in replay.render(second)
        got = drain(broker, to, 50)
        seqs = sorted(int(m.headers["seq"]) for m in got)
        assert seqs == list(range(50)), f"{len(seqs)} arrived: duplicates or gaps"
    finally:
        for ledger in ledgers:
            forget_ledger(broker, ledger)


def test_a_replay_without_pyspark_errors_is_one_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "bridge.app.cli", "replay", "--broker",
                           "rabbitmq", "--archive", str(tmp_path / "none"), "--selector",
                           "JMSPriority >> 4"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    assert "column" in done.stderr or "selector" in done.stderr.lower(), done.stderr


pytestmark = pytest.mark.slow

"""``jms-bridge dlq replay`` of N dead-lettered messages with a selector that picks half of them,
on both brokers in one run: replayed messages per second and the replay process's peak RSS (at
N/4 and at N, to see whether it grows with N), against a reference move of the same number of
messages by the broker's own means, and the selector's evaluation rate.

    PYTHONPATH=. .venv/bin/python bench/dlq_replay.py [--count N] [--brokers rabbitmq,activemq]

Each message is a bridge dead-letter copy: 20 headers (the bridge's metadata and application
properties) and a 1 KiB body. The replay is the real command, ``python -m bridge.app.cli dlq
replay --selector "n_mod = 'even'"``, run as a child process (startup included in its time;
its peak RSS is the child's ru_maxrss).

References (the brokers here offer no move of their own: RabbitMQ 3.10 has no shovel plugin
enabled, ActiveMQ runs without JMX or the web console, so no ``moveMatchingMessages``): a plain
pika consumer (prefetch 1000) that republishes every message of the same queue to another
with publisher confirms and then acks, and for ActiveMQ a plain stomp.py consumer moving every
message in STOMP transactions of 150. Both move all N, without any selector, so they are the
broker-bound ceiling of a move, not a move of the matching half.

Queues are named ``jbb-dlq-<run>-...`` and deleted at the end (RabbitMQ; ActiveMQ removes idle
empty queues itself).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pika
import stomp

from adapters.base import Message
from adapters.rabbitmq_stomp import amqp_properties
from bench.selector_micro import messages as micro_messages
from bridge.app.config import resolve
from bridge.app.dlq import queue_tools
from bridge.deadletter import metadata
from bridge.staging import envelope
from policies.selector import ACTIVEMQ, compile_selector

ROOT = Path(__file__).resolve().parents[1]
AMQP = "amqp://guest:guest@127.0.0.1:5672/%2F"
FLAGS = {
    "rabbitmq": ["--broker", "rabbitmq", "--upstream-stomp", "stomp://guest:guest@127.0.0.1:61613",
                 "--upstream-management", "http://guest:guest@127.0.0.1:15672"],
    "activemq": ["--broker", "activemq", "--upstream-stomp",
                 "stomp://admin:admin@127.0.0.1:61623"],
}
BODY = b"x" * 1024


def headers(run: str, i: int, target: str) -> dict[str, str]:
    h = {
        "persistent": "true", "n": str(i), "n_mod": "odd" if i % 2 else "even",
        "region": ["EU", "US", "APAC"][i % 3], "tenant": f"t{i % 7}", "source": "erp",
        "trace-id": f"{i:032x}", "correlation-id": f"c-{i}", "type": "order",
        envelope.MESSAGE_ID: f"{run}-{i}", envelope.DELIVERY_COUNT: "5",
        envelope.REASON: "MQRC_BACKOUT_THRESHOLD_REACHED", envelope.REASON_CODE: "2362",
        envelope.REASON_TEXT: "delivered 5 times", envelope.FAILED_AT: "1795596000000",
        envelope.ORIGINAL_DESTINATION: f"/queue/{target}",
        envelope.ORIGINAL_JMS_DESTINATION: f"Queue[{target}]",
        envelope.POLICY: "jmsjca: 5:move(queue:dlq)", "retry": "0", "channel": "web",
    }
    assert len(h) == 20
    return h


def settings(broker: str):  # type: ignore[no-untyped-def]
    flags = FLAGS[broker]
    return resolve({k.lstrip("-"): v for k, v in zip(flags[::2], flags[1::2], strict=True)})


def fill(broker: str, queue: str, run: str, target: str, n: int) -> None:
    if broker == "rabbitmq":
        conn = pika.BlockingConnection(pika.URLParameters(AMQP))
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        ch.confirm_delivery()
        for i in range(n):
            ch.basic_publish("", queue, BODY, amqp_properties(headers(run, i, target)))
        conn.close()
        return
    tools = queue_tools(settings(broker))
    tools.connect()
    conn = tools._live()  # type: ignore[attr-defined]
    for i in range(n):
        message = Message(headers(run, i, target), BODY)
        if i == n - 1:
            tools.publish(f"/queue/{queue}", message)  # type: ignore[attr-defined]
        else:
            tools._send(conn, f"/queue/{queue}", message, text=False)  # type: ignore
    deadline = time.monotonic() + 60
    while (tools.size(queue) or 0) < n and time.monotonic() < deadline:
        time.sleep(0.2)
    tools.close()


def run_child(args: list[str]) -> tuple[float, int, str]:
    """Run a child, return seconds, its own peak RSS (KiB), last line of stdout."""
    started = time.perf_counter()
    child = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - started
    out = (child.stdout.read() if child.stdout else b"").decode()
    err = (child.stderr.read() if child.stderr else b"").decode()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{args[3:5]} failed: {err.strip()[-800:]}")
    lines = out.strip().splitlines()
    return seconds, usage.ru_maxrss, lines[-1] if lines else ""


def reference_rabbitmq(queue: str, to: str, n: int) -> float:
    conn = pika.BlockingConnection(pika.URLParameters(AMQP))
    ch = conn.channel()
    ch.queue_declare(to, durable=True)
    ch.confirm_delivery()
    ch.basic_qos(prefetch_count=1000)
    moved = 0
    started = time.perf_counter()
    for method, props, body in ch.consume(queue, inactivity_timeout=2):
        if method is None:
            break
        ch.basic_publish("", to, body, props)
        ch.basic_ack(method.delivery_tag)
        moved += 1
        if moved >= n:
            break
    seconds = time.perf_counter() - started
    ch.cancel()
    conn.close()
    return moved / seconds


def reference_activemq(queue: str, to: str, n: int) -> float:
    conn = stomp.Connection12([("127.0.0.1", 61623)], auto_decode=False)
    got: list[stomp.utils.Frame] = []
    import threading

    cv = threading.Condition()

    class Listener(stomp.ConnectionListener):  # type: ignore[misc]
        def on_message(self, frame: stomp.utils.Frame) -> None:
            with cv:
                got.append(frame)
                cv.notify()

        def on_receipt(self, frame: stomp.utils.Frame) -> None:
            with cv:
                receipts.add(frame.headers["receipt-id"])
                cv.notify()

    receipts: set[str] = set()
    conn.set_listener("", Listener())
    conn.connect("admin", "admin", wait=True)
    conn.subscribe(f"/queue/{queue}", id="ref", ack="client-individual",
                   headers={"activemq.prefetchSize": "300"})
    moved, tx_n = 0, 0
    started = time.perf_counter()
    while moved < n:
        with cv:
            if not cv.wait_for(lambda: got, 3):
                break
            batch, got[:] = got[:150], got[150:]
        tx_n += 1
        tx = f"ref-{tx_n}"
        conn.begin(tx)
        for frame in batch:
            h = {k: v for k, v in frame.headers.items()
                 if k not in ("message-id", "destination", "subscription", "ack")}
            conn.send(f"/queue/{to}", frame.body, headers={**h, "transaction": tx})
            conn.ack(frame.headers["ack"], transaction=tx)
        conn.commit(tx, receipt=tx)
        with cv:
            cv.wait_for(lambda tx=tx: tx in receipts, 30)  # type: ignore[misc]
        moved += len(batch)
    seconds = time.perf_counter() - started
    conn.disconnect()
    return moved / seconds


def selector_rate(seconds: float = 2.0) -> list[tuple[str, float]]:
    batch = micro_messages()
    for i, h in enumerate(batch):
        h["n_mod"] = "odd" if i % 2 else "even"
        h[envelope.ORIGINAL_DESTINATION] = f"/queue/orders.{['eu', 'us'][i % 2]}"
        del h["retry"], h["source"]  # still 20 headers
    base = metadata.selector_headers(ACTIVEMQ)
    out = []
    for text in ("n_mod = 'even'", "JMSDestination = 'Queue[orders.eu]'",
                 "JMSDestination LIKE 'Queue[orders.%' AND region IN ('EU', 'US')"):
        matches = compile_selector(text, base).matches
        best = 0.0
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            for _ in range(20):
                for h in batch:
                    matches(h)
            best = max(best, 20 * len(batch) / (time.perf_counter() - t0))
        out.append((text, best))
    return out


def empty_activemq(names: list[str]) -> None:
    """Empty what this run filled or replayed to on ActiveMQ (it removes idle empty queues
    itself): a broker left holding a run's messages runs short of heap for everyone else."""
    from adapters.queues import DROP

    if not names:
        return
    tools = queue_tools(settings("activemq"))
    tools.connect()
    try:
        for name in names:
            tools.sweep(name, lambda _f: DROP)
    finally:
        tools.close()


def delete_rabbitmq(prefix: str) -> None:
    import json
    import urllib.request

    req = urllib.request.Request("http://127.0.0.1:15672/api/queues/%2F?columns=name")
    req.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
    with urllib.request.urlopen(req, timeout=10) as answer:
        names = [q["name"] for q in json.loads(answer.read()) if q["name"].startswith(prefix)]
    conn = pika.BlockingConnection(pika.URLParameters(AMQP))
    ch = conn.channel()
    for name in names:
        ch.queue_delete(name)
    conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=20_000,
                        help="dead letters per broker (the issue's figure is 100,000)")
    parser.add_argument("--brokers", default="rabbitmq,activemq")
    ns = parser.parse_args()
    run = uuid.uuid4().hex[:8]
    prefix = f"jbb-dlq-{run}-"
    filled: list[str] = []
    print(f"dlq replay bench: {ns.count} dead letters per broker, 20 headers, 1 KiB bodies, "
          f"selector n_mod = 'even' (half)")
    try:
        for broker in ns.brokers.split(","):
            for n in (ns.count // 4, ns.count):
                queue, target = f"{prefix}{broker}-{n}-dlq", f"{prefix}{broker}-{n}-target"
                if broker == "activemq":
                    filled += [queue, target]
                fill(broker, queue, run, target, n)
                args = [sys.executable, "-m", "bridge.app.cli", "dlq", "replay", *FLAGS[broker],
                        "--queue", queue, "--selector", "n_mod = 'even'",
                        "--log-level", "warning"]
                seconds, rss, line = run_child(args)
                print(f"{broker:9} replay  N={n:>7}: {n // 2 / seconds:9,.0f} replayed msgs/s "
                      f"({n} examined in {seconds:.1f} s, {n / seconds:,.0f} examined/s), "
                      f"peak RSS {rss / 1024:.0f} MiB  [{line}]")
            queue, to = f"{prefix}{broker}-ref", f"{prefix}{broker}-ref-out"
            if broker == "activemq":
                filled += [queue, to]
            fill(broker, queue, run, to, ns.count // 2)
            if broker == "rabbitmq":
                rate = reference_rabbitmq(queue, to, ns.count // 2)
                how = "pika consume+publish (confirms) of every message, no selector"
            else:
                rate = reference_activemq(queue, to, ns.count // 2)
                how = "stomp.py consume+send in transactions of 150, no selector"
            print(f"{broker:9} reference N={ns.count // 2:>7}: {rate:9,.0f} moved msgs/s  [{how}]")
        for text, per_second in selector_rate():
            print(f"selector  {per_second:12,.0f} msgs/s on one core (20-header messages): {text}")
    finally:
        delete_rabbitmq(prefix)
        empty_activemq(filled)


if __name__ == "__main__":
    main()

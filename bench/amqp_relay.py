"""AMQP relay throughput: pika direct to RabbitMQ, through a byte-copying TCP relay, and
through the AMQP relay (no hook).

pika's BlockingConnection publishes N messages (default 20,000 of 1 KiB) with publisher
confirms (each publish waits for its confirm), then consumes them with a prefetch of 500 and
a multiple ack every 100. Each round runs every path on a fresh queue, in rotated order.
The AMQP relay runs in its own process (``python -m bridge.frontends.amqp.server``); so does
the copy relay (asyncio streams copying bytes both ways, no parsing: the cost of the extra hop).

Usage:
    .venv/bin/python bench/amqp_relay.py --messages 20000 --size 1024 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

import pika


def wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"relay did not listen on {port}")


def run(port: int, messages: int, size: int) -> tuple[float, float]:
    """(publish-with-confirms msgs/s, consume msgs/s) through 127.0.0.1:port."""
    params = pika.ConnectionParameters(
        "127.0.0.1", port, credentials=pika.PlainCredentials("guest", "guest")
    )
    conn = pika.BlockingConnection(params)
    channel: Any = conn.channel()
    queue = f"amqp-relay-bench-{uuid.uuid4().hex[:8]}"
    channel.queue_declare(queue, auto_delete=False)
    channel.confirm_delivery()
    body = b"x" * size
    props = pika.BasicProperties(delivery_mode=1, headers={"n": 1, "kind": "bench"})
    start = time.perf_counter()
    for _ in range(messages):
        channel.basic_publish("", queue, body, props)
    publish_rate = messages / (time.perf_counter() - start)
    channel.basic_qos(prefetch_count=500)
    got = 0
    start = time.perf_counter()
    for method, _, _ in channel.consume(queue, inactivity_timeout=10):
        if method is None:
            raise SystemExit(f"only {got} of {messages} consumed")
        got += 1
        if got % 100 == 0 or got == messages:
            channel.basic_ack(method.delivery_tag, multiple=True)
        if got == messages:
            break
    consume_rate = messages / (time.perf_counter() - start)
    channel.cancel()
    channel.queue_delete(queue)
    conn.close()
    return publish_rate, consume_rate


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(256 * 1024):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


async def _serve_copy(port: int, upstream: int) -> None:
    async def link(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", upstream)
        await asyncio.gather(_copy(reader, up_w), _copy(up_r, writer), return_exceptions=True)

    server = await asyncio.start_server(link, "127.0.0.1", port, reuse_address=True)
    await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--upstream-port", type=int, default=5672)
    parser.add_argument("--relay-port", type=int, default=5695)
    parser.add_argument("--copy-port", type=int, default=5696)
    parser.add_argument("--serve-copy", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_copy:
        asyncio.run(_serve_copy(args.copy_port, args.upstream_port))
        return
    copy = subprocess.Popen(
        [sys.executable, __file__, "--serve-copy", "--copy-port", str(args.copy_port),
         "--upstream-port", str(args.upstream_port)],
    )
    relay = subprocess.Popen(
        [sys.executable, "-m", "bridge.frontends.amqp.server",
         "--listen", f"127.0.0.1:{args.relay_port}",
         "--upstream", f"127.0.0.1:{args.upstream_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(args.relay_port)
        wait_port(args.copy_port)
        paths = {"direct": args.upstream_port, "copy": args.copy_port, "relay": args.relay_port}
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in paths}
        for round_no in range(args.rounds):
            names = list(paths)
            order = names[round_no % 3 :] + names[: round_no % 3]
            for name in order:
                results[name].append(run(paths[name], args.messages, args.size))
        print(f"{args.messages} msgs of {args.size} B, {args.rounds} rounds (median msgs/s)")
        print(f"{'path':8} {'publish+confirm':>16} {'consume':>10}")
        for name, runs in results.items():
            pub = statistics.median(r[0] for r in runs)
            con = statistics.median(r[1] for r in runs)
            print(f"{name:8} {pub:16.0f} {con:10.0f}")
        r = results["relay"]
        for base in ("direct", "copy"):
            b = results[base]
            print(
                f"relay/{base}: publish "
                f"{statistics.median(x[0] for x in r) / statistics.median(x[0] for x in b):.2f}, "
                f"consume "
                f"{statistics.median(x[1] for x in r) / statistics.median(x[1] for x in b):.2f}"
            )
    finally:
        for proc in (relay, copy):
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()

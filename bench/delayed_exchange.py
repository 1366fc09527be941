"""Delayed publishes to a delayed-message exchange (``x-delayed-message``) through the bridge,
against plain publishes to a direct exchange through the same bridge, measured side by side.

Each round publishes ``--count`` messages of ``--size`` bytes with publisher confirms
(``--window`` outstanding) to a direct exchange, and the same to an ``x-delayed-message``
exchange (``x-delayed-type: direct``) with ``x-delay`` of an hour, each staged by the bridge;
every other round the delayed ones go first. The bridge runs with a staging prefix of its own
and its engine off; its staging queues, the exchanges and the queues are deleted at the end.
Names start with ``bench-delayx-``.

Usage:
    .venv/bin/python bench/delayed_exchange.py --count 5000 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import uuid
from pathlib import Path

import pika

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.amqp import Client, purge_staging, start  # noqa: E402


async def _publish(port: int, exchange: str, key: str, args: argparse.Namespace,
                   headers: dict[str, object] | None) -> float:
    client = Client(port)
    await client.open()
    took = await client.publish(key, args.count, b"x" * args.size, args.window, headers,
                                exchange=exchange)
    await client.close()
    return args.count / took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--amqp-port", type=int, default=5672)
    parser.add_argument("--stomp-port", type=int, default=61613)
    args = parser.parse_args()
    args.paths, args.delayed = "bridge", True
    tag = uuid.uuid4().hex[:8]
    prefix = f"bench-delayx-staging-{tag}"
    procs = start(args, prefix)
    port = procs["bridge"].port
    plain_x, delayed_x, queue = (f"bench-delayx-{kind}-{tag}" for kind in
                                 ("plain", "delayed", "q"))
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    ch.exchange_declare(plain_x, "direct")
    ch.exchange_declare(delayed_x, "x-delayed-message", arguments={"x-delayed-type": "direct"})
    ch.queue_declare(queue)
    ch.queue_bind(queue, plain_x, queue)
    ch.queue_bind(queue, delayed_x, queue)
    figures: dict[str, list[float]] = {"plain": [], "delayed": []}
    try:
        for n in range(args.rounds):
            kinds = [("plain", plain_x, None), ("delayed", delayed_x, {"x-delay": 3_600_000})]
            for name, exchange, headers in (kinds if n % 2 == 0 else kinds[::-1]):
                figures[name].append(asyncio.run(_publish(port, exchange, queue, args, headers)))
            ch.queue_purge(queue)
    finally:
        ch.queue_delete(queue)
        ch.exchange_delete(plain_x)
        ch.exchange_delete(delayed_x)
        conn.close()
        staged = purge_staging(args, prefix)
        for proc in procs.values():
            proc.stop()
    plain, delayed = (statistics.median(figures[k]) for k in ("plain", "delayed"))
    print(f"{args.count:,} publishes of {args.size} B, confirms with a window of "
          f"{args.window}, {args.rounds} rounds (median), through the bridge:")
    print(f"  plain, direct exchange               {plain:>10,.0f} msg/s")
    print(f"  delayed, x-delayed-message exchange  {delayed:>10,.0f} msg/s   "
          f"({delayed / plain:.0%} of plain; {staged:,} staged copies removed)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How long a selector over the staged catalogue takes at a million pending.

Fills a staged catalogue (``bridge.staging.catalogue``, the SQLite file a bridge keeps with
``--staged-catalogue``) with ``--count`` rows through its own writer, as a bridge's delayed sends
do (each with its own headers: ``orderId``, ``region``, ``customer``), then times what a running
engine does to answer ``jms-bridge staged list|count|cancel --selector``: ``Catalogue.entries``
with the compiled selector. No broker is needed: the catalogue is the engine's answer.

Three selectors: a business key (``orderId = 42 AND region = 'EU'``, which SQLite narrows to the
rows whose properties have those values before the selector runs on them), an IN list, and a
range (``orderId > 999990``, which SQLite can only narrow to the rows that have an ``orderId``:
the selector runs on every one of those).

Usage:
    .venv/bin/python bench/staged_selector.py                 # 1,000,000 rows
    .venv/bin/python bench/staged_selector.py --count 100000 --file /tmp/c.db
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time

from bridge.staging.catalogue import MAX_PENDING, Catalogue, CatalogueWriter, Entry
from bridge.staging.envelope import DUE, MESSAGE_ID, TARGET
from bridge.staging.selection import compile_for

SELECTORS = (
    "orderId = 42 AND region = 'EU'",
    "customer IN ('c-17', 'c-99999')",
    "orderId > 999990",
)


def fill(path: str, count: int, now_ms: int) -> float:
    writer = CatalogueWriter(path).start()
    rng = random.Random(34)
    started = time.monotonic()
    batch = min(MAX_PENDING // 2, 50_000)
    for first in range(0, count, batch):
        adds = []
        for i in range(first, min(first + batch, count)):
            message_id = f"ID:bench-{i}"
            due = now_ms + 3_600_000 + rng.randrange(30 * 86_400_000)
            target = f"/queue/bench.orders.{i % 50}"
            region = "EU" if i == 42 else rng.choice(("EU", "US", "APAC"))
            headers = {"persistent": "true", "content-type": "application/json",
                       "orderId": str(i), "region": region,
                       "customer": f"c-{i % 100_000}", TARGET: target, DUE: str(due),
                       MESSAGE_ID: message_id}
            adds.append(Entry(message_id, target, due, 512, headers))
        writer.offer(adds, [])
        while writer.written < min(first + batch, count):
            time.sleep(0.05)
    writer.close()
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--file", help="the catalogue file (default: a temporary one)")
    parser.add_argument("--broker", choices=("rabbitmq", "activemq"), default="rabbitmq")
    ns = parser.parse_args()
    folder = None
    path = ns.file
    if path is None:
        folder = tempfile.mkdtemp(prefix="bench-staged-selector-")
        path = os.path.join(folder, "staged.db")
    now_ms = time.time_ns() // 1_000_000
    took = fill(path, ns.count, now_ms)
    print(f"filled {ns.count:,} rows in {took:.1f} s ({path})")
    catalogue = Catalogue(path)
    try:
        for text in SELECTORS:
            selector = compile_for(text, ns.broker)
            started = time.monotonic()
            found = catalogue.entries(now_ms=now_ms, selector=selector)
            took = time.monotonic() - started
            print(f"{text!r}: {len(found):,} selected of {ns.count:,} in {took:.2f} s")
    finally:
        catalogue.close()
        if folder is not None:
            for name in os.listdir(folder):
                os.remove(os.path.join(folder, name))
            os.rmdir(folder)


if __name__ == "__main__":
    main()

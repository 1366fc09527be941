"""Helpers for staging tests: a private staging prefix per test, cleaned up afterwards."""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from base64 import b64encode
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pika
import stomp

from adapters import activemq, rabbitmq
from bridge.staging.levels import Layout, layout_for
from tests.integration.bridgeproc import BridgeProcess
from tests.integration.brokers import Broker


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants (the bridge and its staging engine process)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, ()))
    return found


def rss_kb(pid: int) -> int:
    """Resident memory of the bridge's process tree."""
    total = 0
    for p in tree(pid):
        try:
            status = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        total += next((int(line.split()[1]) for line in status.splitlines()
                       if line.startswith("VmRSS:")), 0)
    return total


def management(broker: Broker, path: str) -> dict:  # type: ignore[type-arg]
    request = urllib.request.Request(f"{broker.management_url}/api{path}")
    request.add_header("Authorization", "Basic " + b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(request, timeout=10) as reply:
        return json.loads(reply.read())  # type: ignore[no-any-return]


def clean(broker: Broker, layout: Layout, also: Sequence[str] = ()) -> None:
    """Remove a test's staging queues, and the queues ``also`` names, with whatever is left on
    them (on ActiveMQ, which removes a queue once it is empty and unused, they are drained)."""
    queues = [*layout.all_queues, *also]
    if broker.name == "rabbitmq":
        conn = pika.BlockingConnection(pika.URLParameters(broker.amqp_url or ""))
        channel = conn.channel()
        for q in queues:
            channel.queue_delete(q)
        channel.exchange_delete(layout.expired)  # the engine's dead-letter exchange
        conn.close()
        return
    conn = stomp.Connection12([(broker.stomp_host, broker.stomp_port)], heartbeats=(0, 0))
    received: list[int] = []
    conn.set_listener("drain", type("L", (stomp.ConnectionListener,), {
        "on_message": lambda self, f: received.append(1)})())
    conn.connect(broker.user, broker.password, wait=True)
    for i, q in enumerate(queues):
        conn.subscribe(f"/queue/{q}", id=str(i), ack="auto")
    last, quiet_since = -1, time.monotonic()
    while time.monotonic() - quiet_since < 1.0:
        if len(received) != last:
            last, quiet_since = len(received), time.monotonic()
        time.sleep(0.1)
    conn.disconnect()


@contextmanager
def private_bridges(broker: Broker, tmp: Path, n: int = 1,
                    extra: tuple[str, ...] = ()) -> Iterator[tuple[Layout, list[BridgeProcess]]]:
    """``n`` bridges sharing a staging prefix of their own."""
    layout = layout_for({"rabbitmq": rabbitmq.FORMAT, "activemq": activemq.FORMAT}[broker.name],
                        f"jbt-staging-{uuid.uuid4().hex[:8]}")
    procs = [
        BridgeProcess(broker.name, f"{broker.stomp_host}:{broker.stomp_port}",
                      tmp / f"bridge{i}.log",
                      extra=["--staging-prefix", layout.prefix, *extra])
        for i in range(n)
    ]
    try:
        for p in procs:
            p.start()
        yield layout, procs
    finally:
        for p in procs:
            p.stop()
        clean(broker, layout)

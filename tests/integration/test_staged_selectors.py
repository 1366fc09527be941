"""Staged messages picked by business key: ``jms-bridge staged list|count|cancel|release
--selector`` and the admin API's ``selector=``, against each real broker, with and without a
staged catalogue."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pika
import pytest

from adapters import activemq, rabbitmq
from bridge.staging.levels import Layout, layout_for
from tests.integration.bridgeproc import BridgeProcess, free_port, wait_port
from tests.integration.brokers import Broker
from tests.integration.clients import connect
from tests.integration.staging_util import clean

HOUR_MS = 3_600_000


@dataclass
class Staged:
    broker: Broker
    layout: Layout
    bridge: BridgeProcess
    catalogue: bool
    amqp_port: int | None


@contextmanager
def staged_bridge(broker: Broker, tmp: Path, *, catalogue: bool,
                  extra: tuple[str, ...] = ()) -> Iterator[Staged]:
    """A bridge of its own (its own staging prefix), with its AMQP listener on RabbitMQ."""
    fmt = {"rabbitmq": rabbitmq.FORMAT, "activemq": activemq.FORMAT}[broker.name]
    layout = layout_for(fmt, f"jbt-staging-staged-{uuid.uuid4().hex[:12]}")
    args = ["--staging-prefix", layout.prefix, *extra]
    if catalogue:
        args += ["--staged-catalogue", str(tmp / "staged.db")]
    amqp_port = None
    if broker.name == "rabbitmq":
        amqp_port = free_port()
        args += ["--amqp-listen", f"127.0.0.1:{amqp_port}"]
    bridge = BridgeProcess(broker.name, f"{broker.stomp_host}:{broker.stomp_port}",
                           tmp / "bridge.log", extra=args)
    try:
        bridge.start()
        if amqp_port is not None:
            assert wait_port(amqp_port, 20, bridge.proc), bridge.log()
        yield Staged(broker, layout, bridge, catalogue, amqp_port)
    finally:
        bridge.stop()
        clean(broker, layout)


@pytest.fixture(params=[False, True], ids=["queues", "catalogue"])
def setup(request: pytest.FixtureRequest, broker: Broker,
          tmp_path: Path) -> Iterator[Staged]:
    with staged_bridge(broker, tmp_path, catalogue=request.param) as s:
        yield s


@pytest.fixture
def queue() -> str:
    return f"jbt-staged-{uuid.uuid4().hex[:12]}"


def cli(s: Staged, *args: str, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bridge.app.cli", "staged", *args, "--broker", s.broker.name,
         "--upstream-stomp", f"stomp://{s.bridge.upstream}", "--staging-prefix",
         s.layout.prefix, *extra],
        capture_output=True, text=True, timeout=120)


def amqp_publish(s: Staged, queue: str, body: bytes, headers: dict[str, object]) -> None:
    """Published through the bridge's AMQP listener, its properties typed (an int stays an
    int on the wire)."""
    assert s.amqp_port is not None
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", s.amqp_port, credentials=pika.PlainCredentials(s.broker.user,
                                                                     s.broker.password)))
    try:
        channel = conn.channel()
        channel.confirm_delivery()
        channel.queue_declare(queue, durable=True)
        channel.basic_publish("", queue, body, pika.BasicProperties(headers=headers,
                                                                     delivery_mode=2))
    finally:
        conn.close()


SELECTOR = "orderId = 42 AND region = 'EU'"


def send_orders(s: Staged, queue: str) -> dict[str, dict[str, str]]:
    """Four staged messages for ``queue``; the two the selector selects are "a" (orderId "42"
    over STOMP) and "d" (42 as an AMQP int on RabbitMQ, "042" over STOMP on ActiveMQ)."""
    dest = s.broker.queue_destination(queue)
    conn, inbox = connect(s.bridge.stomp_port, s.broker.user, s.broker.password)
    sent = {"a": {"orderId": "42", "region": "EU"}, "b": {"orderId": "42", "region": "US"},
            "c": {"orderId": "7", "region": "EU"}}
    if s.amqp_port is None:
        sent["d"] = {"orderId": "042", "region": "EU"}
    for i, (body, props) in enumerate(sent.items()):
        conn.send(dest, body, headers={"x-delay": str((2 + i) * HOUR_MS), "receipt": body,
                                       "persistent": "true", **props})
        assert inbox.wait_receipt(body)
    conn.disconnect()
    if s.amqp_port is not None:
        amqp_publish(s, queue, b"d", {"x-delay": 6 * HOUR_MS, "orderId": 42, "region": "EU"})
        sent["d"] = {"orderId": "42", "region": "EU"}
    return sent


def listed(s: Staged, *args: str) -> list[dict[str, object]]:
    out = cli(s, "list", "--json", *args)
    assert out.returncode == 0, out.stdout + out.stderr
    return list(json.loads(out.stdout))


def wait_listed(s: Staged, n: int, *args: str) -> list[dict[str, object]]:
    """The rows once there are ``n`` (the catalogue's writer commits a moment after)."""
    deadline = time.monotonic() + 15
    while len(rows := listed(s, *args)) != n and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(rows) == n, rows
    return rows


def by_size(rows: list[dict[str, object]]) -> set[int]:
    return {int(str(r["size"])) for r in rows}


def test_list_count_and_cancel_by_selector(setup: Staged, queue: str) -> None:
    s = setup
    send_orders(s, queue)
    # (The AMQP publish's target is /amq/queue/NAME: every row of the private prefix is ours.)
    everything = wait_listed(s, 4)
    ids = {str(r["message_id"]) for r in everything}
    chosen = wait_listed(s, 2, "--selector", SELECTOR)
    chosen_ids = {str(r["message_id"]) for r in chosen}
    assert chosen_ids < ids
    # The body names the message: "a" and "d" (both one byte); the due times tell them apart.
    dues = sorted(int(str(r["due_ms"])) for r in chosen)
    all_dues = sorted(int(str(r["due_ms"])) for r in everything)
    assert dues == [all_dues[0], all_dues[3]], (chosen, everything)
    count = cli(s, "count", "--selector", SELECTOR)
    assert count.returncode == 0 and count.stdout.strip() == "2", count.stdout + count.stderr
    assert cli(s, "count", "--selector", "orderId > 10").stdout.strip() == "3"
    assert cli(s, "count", "--selector", "region = 'EU' AND orderId < 10").stdout.strip() == "1"
    assert cli(s, "count", "--selector", f"JMSDestination = 'Queue[{queue}]' AND "
                                         "region = 'US'").stdout.strip() == "1"

    bad = cli(s, "cancel", "--selector", "orderId = = 42")
    assert bad.returncode == 1 and "invalid selector at column" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr
    both = cli(s, "cancel", "x", "--selector", SELECTOR)
    assert both.returncode == 1 and "one of them" in both.stderr, both.stderr

    cancelled = cli(s, "cancel", "--selector", SELECTOR)
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    assert cancelled.stdout.strip().endswith(
        "cancelled 2 of the 2 staged message(s) the selector selects"), cancelled.stdout
    for message_id in chosen_ids:
        assert f"cancelled {message_id}" in cancelled.stdout
    assert cli(s, "count", "--selector", SELECTOR).stdout.strip() == "0"
    left = {str(r["message_id"]) for r in wait_listed(s, 2)}
    assert left == ids - chosen_ids


def test_admin_api_lists_and_releases_by_selector(setup: Staged, queue: str) -> None:
    s = setup
    dest = s.broker.queue_destination(queue)
    send_orders(s, queue)
    wait_listed(s, 4)
    q = urllib.parse.quote("orderId = 7")
    status, body = s.bridge.http(f"/staged?selector={q}")
    assert status == 200, body
    (row,) = json.loads(body)
    status, body = s.bridge.http(f"/staged?selector={q}&count=1")
    assert status == 200 and json.loads(body) == {"count": 1}, body
    status, body = s.bridge.http("/staged?selector=" + urllib.parse.quote("orderId = ="))
    assert status == 400 and "invalid selector" in json.loads(body)["error"], body
    status, body = s.bridge.http("/staged/release", "POST")
    assert status == 400 and "selector is required" in body
    status, _ = s.bridge.http(f"/staged/release?selector={q}", "POST", authorized=False)
    assert status == 401

    conn, inbox = connect(s.bridge.stomp_port, s.broker.user, s.broker.password)
    conn.subscribe(dest, id="r", ack="auto")
    status, body = s.bridge.http(f"/staged/release?selector={q}", "POST", timeout=60)
    assert status == 200, body
    assert json.loads(body) == {"selected": 1, "released": [row["message_id"]], "failed": {}}
    got = inbox.take(1, timeout=10)
    conn.disconnect()
    assert [m.body for m in got] == ["c"] and got[0].headers["orderId"] == "7"
    assert len(wait_listed(s, 3)) == 3

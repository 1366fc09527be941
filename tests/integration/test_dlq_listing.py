"""``jms-bridge dlq list`` and ``GET /dlq`` on a real RabbitMQ: a dead-letter queue shows among
many unrelated queues (the management API is asked only for the names that can be dead-letter
queues, a page at a time), and when that API cannot be reached the listing shows the queues
known by name and says it is incomplete, and why."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pika
import pytest
from pamqp import commands
from pamqp import frame as pframe
from pika.adapters.blocking_connection import BlockingChannel

from bridge.app.config import Settings, resolve
from bridge.app.dlq import queue_tools
from bridge.deadletter import metadata
from policies.endpoints import Endpoint
from tests.integration.amqp_raw import handshake, read_frame
from tests.integration.brokers import BROKERS, Broker, require

ROOT = Path(__file__).resolve().parents[2]
MANAGEMENT = Endpoint("127.0.0.1", 15672, user="guest", password="guest")
# Not jbt-: other sessions' suites delete every jbt- queue when they end.
PREFIX = f"jbtl-{uuid.uuid4().hex[:6]}-"
UNRELATED = 1500


@pytest.fixture
def rabbitmq() -> Broker:
    broker = BROKERS["rabbitmq"]
    require(broker)
    return broker


@contextmanager
def channel(broker: Broker) -> Iterator[BlockingChannel]:
    conn = pika.BlockingConnection(pika.URLParameters(broker.amqp_url or ""))
    try:
        yield conn.channel()
    finally:
        conn.close()


@contextmanager
def queues(ch: BlockingChannel, names: list[str], fill: dict[str, int]) -> Iterator[None]:
    """``names`` declared on ``ch`` (``fill`` puts that many messages on some), deleted after."""
    try:
        for name in names:
            ch.queue_declare(name)
        for name, n in fill.items():
            for i in range(n):
                ch.basic_publish("", name, f"dead {i}".encode())
        yield
    finally:
        for name in names:
            ch.queue_delete(name)


@contextmanager
def exclusive(names: list[str]) -> Iterator[None]:
    """``names`` as exclusive queues of one connection, gone when it closes however the test
    ends: the declares sent in one go on one channel (no-wait), the last one answered, so the
    broker has them all (a declare a round trip takes seconds for a thousand queues)."""
    sock = handshake(5672)
    sock.settimeout(60)  # a busy broker makes a thousand queues in seconds
    try:
        sock.sendall(pframe.marshal(commands.Channel.Open(), 1))
        assert isinstance(read_frame(sock)[1], commands.Channel.OpenOk)
        sock.sendall(b"".join(
            pframe.marshal(commands.Queue.Declare(queue=name, exclusive=True,
                                                  nowait=name != names[-1]), 1)
            for name in names))
        answer = read_frame(sock)[1]
        assert isinstance(answer, commands.Queue.DeclareOk), answer
        yield
    finally:
        sock.sendall(pframe.marshal(commands.Connection.Close(200, "done", 0, 0), 0))
        read_frame(sock)
        sock.close()


def closed_port() -> int:
    """A port nothing listens on: bound, then let go."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def dlq_list(broker: Broker, management: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JMS_BRIDGE_")}
    return subprocess.run(
        [sys.executable, "-m", "bridge.app.cli", "dlq", "list", "--broker", "rabbitmq",
         "--upstream-stomp", f"stomp://guest:guest@{broker.stomp_host}:{broker.stomp_port}",
         "--upstream-management", management, *args],
        capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)


def test_a_dead_letter_queue_shows_among_many_other_queues(rabbitmq: Broker) -> None:
    from adapters.rabbitmq_management import queue_counts

    run = uuid.uuid4().hex[:6]
    dlq = f"{PREFIX}{run}.dlq"
    # Names RabbitMQ's reading of the expression (PCRE, caseless) must take or leave as
    # Python's does.
    edge = [f"{PREFIX}{run}-orders-DLQ", f"{PREFIX}{run}.Dead.letters", f"{PREFIX}{run}.DLQ.eu",
            f"{PREFIX}{run}_undeliverable", f"{PREFIX}{run}-dlqueue", f"{PREFIX}{run}_dlq_x",
            f"{PREFIX}{run}.dlqs", f"{PREFIX}{run}-xdlq"]
    unrelated = [f"{PREFIX}{run}-q{i:04}" for i in range(UNRELATED)]
    with channel(rabbitmq) as ch, queues(ch, [dlq], {dlq: 3}), exclusive([*edge, *unrelated]):
        # No filtering here: what comes back is what RabbitMQ matched.
        matched = queue_counts(MANAGEMENT, "/", metadata.CANDIDATE_NAMES)
        ours = {name for name in matched if name.startswith(f"{PREFIX}{run}")}
        assert ours == {dlq, *(n for n in edge if metadata.is_candidate(n))}
        assert len(ours) == 5, ours  # (the table above is what it says)

        # Page by page: every matched queue, whatever the page size. (Matching this test's own
        # names: other tests beside it make and delete dead-letter-like queues, and a listing
        # of hundreds of small pages would begin again at each.)
        mine = f"^{re.escape(PREFIX + run)}(?!-q\\d{{4}}$)"
        paged = queue_counts(MANAGEMENT, "/", mine, page_size=2)
        assert set(paged) == {dlq, *edge}

        listed = dlq_list(rabbitmq, "http://guest:guest@127.0.0.1:15672", "--json")
        assert listed.returncode == 0, listed.stderr
        answer = json.loads(listed.stdout)
        assert answer["incomplete"] is None
        assert {"queue": dlq, "messages": 3} in answer["queues"]
        names = [q["queue"] for q in answer["queues"]]
        assert not set(unrelated) & set(names)
        # Exclusive queues of another connection: counted by the management API.
        assert {n for n in edge if metadata.is_candidate(n)} <= set(names)


def test_an_unreachable_management_api_makes_an_incomplete_listing(
    rabbitmq: Broker, tmp_path: Path
) -> None:
    """The management API at a closed port: the queues known by name are counted, and every
    form of the listing says it is incomplete and why."""
    run = uuid.uuid4().hex[:6]
    prefix = f"{PREFIX}{run}.staging"
    undeliverable = f"{prefix}.undeliverable"
    other = f"{PREFIX}{run}.dlq"  # a dead-letter queue the broker cannot be asked about
    port = closed_port()
    away = f"http://guest:guest@127.0.0.1:{port}"
    with channel(rabbitmq) as ch, queues(ch, [undeliverable, other], {undeliverable: 2}):
        listed = dlq_list(rabbitmq, away, "--staging-prefix", prefix, "--json")
        assert listed.returncode == 0, listed.stderr
        answer = json.loads(listed.stdout)
        assert {"queue": undeliverable, "messages": 2} in answer["queues"]
        assert other not in [q["queue"] for q in answer["queues"]]
        why = answer["incomplete"]
        assert f"127.0.0.1:{port}" in why and "refused" in why.lower(), why

        text = dlq_list(rabbitmq, away, "--staging-prefix", prefix)
        assert text.returncode == 0, text.stderr
        last = text.stdout.strip().splitlines()[-1]
        assert last.startswith("INCOMPLETE: only the queues known by name are shown; "), last
        assert f"127.0.0.1:{port}" in last
        assert any(line.split() == [undeliverable, "2"] for line in text.stdout.splitlines())

        listing = admin_listing(resolve({
            "broker": "rabbitmq", "staging-prefix": prefix, "upstream-management": away,
            "upstream-stomp": f"stomp://guest:guest@{rabbitmq.stomp_host}:"
                              f"{rabbitmq.stomp_port}"}), tmp_path)
        assert listing["incomplete"] == why
        assert {"queue": undeliverable, "messages": 2} in listing["queues"]


def admin_listing(settings: Settings, tmp: Path) -> dict:  # type: ignore[type-arg]
    """``GET /dlq`` of an admin app over ``settings``' broker."""
    from aiohttp.test_utils import TestClient, TestServer

    from bridge.app.admin import Admin
    from bridge.app.auth import TokenFile
    from bridge.app.metrics import Metrics
    from bridge.staging.levels import Layout

    (tmp / "token").write_text("listing-token\n")

    async def get() -> dict:  # type: ignore[type-arg]
        admin = Admin(metrics=Metrics(), broker="rabbitmq", upstream=Endpoint("127.0.0.1", 1),
                      tokens=TokenFile(str(tmp / "token")),
                      layout=Layout(settings.staging_prefix),
                      queue_tools=lambda: queue_tools(settings))
        async with TestClient(TestServer(admin.app)) as client:
            got = await client.get("/dlq", headers={"Authorization": "Bearer listing-token"})
            assert got.status == 200, await got.text()
            return await got.json()  # type: ignore[no-any-return]

    return asyncio.run(get())


def test_a_management_api_that_does_not_answer_makes_an_incomplete_listing(
    rabbitmq: Broker,
) -> None:
    """A port that takes the connection and never answers: the listing waits the HTTP timeout
    (here half a second), then says it is incomplete."""
    from adapters.queues_rabbitmq import RabbitMQQueues
    from bridge.app.config import bridge_amqp
    from bridge.deadletter import ops

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = int(silent.getsockname()[1])
        settings = resolve({"broker": "rabbitmq", "upstream-stomp": f"stomp://guest:guest@"
                            f"{rabbitmq.stomp_host}:{rabbitmq.stomp_port}"})
        tools = RabbitMQQueues(bridge_amqp(settings), http_timeout=0.5,
                               management=Endpoint("127.0.0.1", port, user="guest",
                                                   password="guest"))
        tools.connect()
        try:
            listing = ops.candidates(tools, prefix=f"{PREFIX}silent")
        finally:
            tools.close()
    assert listing.incomplete is not None
    assert f"127.0.0.1:{port}" in listing.incomplete and "timed out" in listing.incomplete

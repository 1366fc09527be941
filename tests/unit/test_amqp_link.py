"""A link carries each event the connection gives by its own method: the bytes that reach each
side, in order, for publishes relayed, rewritten, held and refused, and for the broker's frames;
every kind of event the connection gives either way has its method."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from pamqp import commands

from bridge.frontends.amqp import Answer, Forward, Frame, Message, ProtocolHeader
from bridge.frontends.amqp.connection import DeliveryRun, PlainRun, ProxyConnection
from bridge.frontends.amqp.link import FLUSH_EVERY, Link
from bridge.frontends.amqp.upstream import Upstream
from bridge.frontends.budget import Budget
from bridge.frontends.relay_stats import AmqpStats
from policies.errors import Refused
from policies.reasons import MQRC_EXPIRY_ERROR
from tests.unit.amqp_wire import HEARTBEAT, body, content_header, method, publish
from tests.unit.test_amqp_connection import HANDSHAKE, decoded


class _Transport:
    def get_write_buffer_limits(self) -> tuple[int, int]:
        return 0, 1 << 20

    def get_write_buffer_size(self) -> int:
        return 0


class _Side:
    """Either side's socket, as the link writes to it: each write kept."""

    def __init__(self) -> None:
        self.transport = _Transport()
        self.writes: list[bytes] = []
        self.writable = True

    def get_extra_info(self, name: str) -> Any:
        return None

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    async def drain(self) -> None:
        pass


class _Relay:
    def __init__(self, hook: Any = None) -> None:
        self.chain = None
        self.hook = hook
        self.delayed_exchanges = False
        self.max_body_size = 1 << 20
        self.handshake_timeout = 1.0
        self.settled: Callable[[float], Awaitable[str | None]]
        self.budget = Budget(1 << 30)
        self.stats = AmqpStats()
        self.protocol_errors = 0
        self.log = structlog.get_logger("test")

    async def connect(self, protocol: Callable[[], Upstream], reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter, log: Any) -> Upstream | None:
        raise AssertionError("not opened in these tests")


def _link(hook: Any = None) -> tuple[Link, _Side, _Side]:
    client, broker = _Side(), _Side()
    link = Link(_Relay(hook), None, client)  # type: ignore[arg-type]
    link.up = broker  # type: ignore[assignment]
    return link, client, broker


async def _client_sends(link: Link, data: bytes) -> None:
    events = link.conn.client_data(data)
    link._count(events, link.relay.stats.methods_up)
    await link._carry(events)


def _opened(link: Link) -> None:
    asyncio.run(_client_sends(link, HANDSHAKE + method(commands.Channel.Open(), 1)))


def test_publishes_refused_rewritten_and_relayed_reach_each_side_in_order() -> None:
    def hook(message: Message, conn: ProxyConnection) -> bytes | None:
        if message.body == b"no":
            raise Refused(MQRC_EXPIRY_ERROR, "ttl shorter than delay")
        return b"<copy>" if message.body == b"copy" else None

    link, client, broker = _link(hook)
    _opened(link)
    broker.writes.clear()
    qos = method(commands.Basic.Qos(prefetch_count=1), 2)
    asyncio.run(_client_sends(link, publish(1, b"as is") + publish(2, b"copy")
                              + publish(1, b"no") + publish(1, b"after") + qos))
    close_up = method(commands.Channel.Close(200, "closed by jms-bridge", 0, 0), 1)
    assert broker.writes == [publish(1, b"as is") + b"<copy>" + close_up + qos]
    [close_back] = client.writes
    channel, close = decoded(close_back)
    assert (channel, close.reply_code, close.class_id, close.method_id) == (1, 406, 60, 40)
    assert close.reply_text == "MQRC_EXPIRY_ERROR (2013): ttl shorter than delay"
    assert link.relay.stats.refusals["MQRC_EXPIRY_ERROR"] == 1


def test_rewritten_publishes_go_up_a_few_at_a_time() -> None:
    link, _, broker = _link(lambda message, conn: b"R")
    _opened(link)
    broker.writes.clear()
    n = 2 * FLUSH_EVERY + 3
    asyncio.run(_client_sends(link, b"".join(publish(1, b"x") for _ in range(n))))
    assert broker.writes == [b"R" * FLUSH_EVERY, b"R" * FLUSH_EVERY, b"R" * 3]


def test_a_held_publish_is_waited_for_before_what_follows() -> None:
    async def hook(message: Message, conn: ProxyConnection) -> bytes | None:
        await asyncio.sleep(0.01)
        if message.body == b"no":
            raise Refused(MQRC_EXPIRY_ERROR, "held, then refused")
        return b"<held>"

    link, client, broker = _link(hook)
    _opened(link)
    broker.writes.clear()
    asyncio.run(_client_sends(link, publish(1, b"a") + HEARTBEAT + publish(2, b"no")
                              + publish(2, b"dropped")))
    close_up = method(commands.Channel.Close(200, "closed by jms-bridge", 0, 0), 2)
    assert b"".join(broker.writes) == b"<held>" + HEARTBEAT + close_up
    [close_back] = client.writes
    channel, close = decoded(close_back)
    assert (channel, close.reply_code) == (2, 406)


def test_the_brokers_frames_reach_the_client_as_they_came() -> None:
    link, client, broker = _link()
    deliver = method(commands.Basic.Deliver("ctag", 1, False, "", "q"), 1)
    data = deliver + content_header(1, 3) + body(1, b"abc") + HEARTBEAT
    for i in range(0, len(data), 5):  # cut anywhere: what is whole goes on
        link._broker_data(data[i:i + 5])
    assert b"".join(client.writes) == data
    assert broker.writes == []
    assert link.relay.stats.methods_down[commands.Basic.Deliver.index] == 1
    assert link.relay.stats.heartbeats["downstream"] == 1


def test_every_kind_of_event_has_its_method_each_way() -> None:
    link, _, _ = _link()
    # The client's bytes give no deliveries; the broker's no protocol header or publishes,
    # and, with no consumer side, no messages or delivery runs either.
    assert set(link._from_client) == {Frame, ProtocolHeader, Message, PlainRun, Answer, Forward}
    assert set(link._from_broker) == {Frame, Answer, Forward}
    assert DeliveryRun not in link._from_client

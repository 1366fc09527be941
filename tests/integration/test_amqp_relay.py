"""The AMQP 0-9-1 relay between pika (and raw sockets) and the real RabbitMQ.

The relay runs in this process, on its own event loop in a thread, in front of RabbitMQ's
AMQP port; one relay has a publish hook that refuses or rewrites, to show the hook point.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pika
import pika.exceptions
import pytest
from pamqp import commands
from pamqp import frame as pframe
from pamqp.body import ContentBody

from bridge.frontends.amqp import PROTOCOL_HEADER, Message, ProxyConnection, publish_frames
from bridge.frontends.amqp.server import AmqpRelay
from policies.errors import Refused
from policies.reasons import MQRC_EXPIRY_ERROR
from tests.integration.amqp_raw import handshake, read_frame, recv_exactly
from tests.integration.bridgeproc import free_port

pytestmark = pytest.mark.integration

RABBIT = ("127.0.0.1", 5672)


def _rabbit_answers() -> str | None:
    try:
        with socket.create_connection(RABBIT, timeout=2) as sock:
            sock.sendall(PROTOCOL_HEADER)
            sock.settimeout(5)
            first = sock.recv(1)
            return None if first == b"\x01" else f"answered {first!r} to the protocol header"
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"


def _require_rabbit() -> None:
    problem = _rabbit_answers()
    if problem is None:
        return
    message = f"RabbitMQ AMQP at {RABBIT[0]}:{RABBIT[1]} is not reachable: {problem}"
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def _hook(message: Message, conn: ProxyConnection) -> bytes | None:
    publish: Any = message.method  # a Basic.Publish
    key = publish.routing_key
    if key.startswith("jbt-amqp-relay-refuse"):
        raise Refused(MQRC_EXPIRY_ERROR, "time to live shorter than the delay")
    if key.startswith("jbt-amqp-relay-rewrite"):
        props = message.properties
        props.headers = {**(props.headers or {}), "rewritten": 1}
        return publish_frames(
            message.channel, publish, props, message.body.upper(), conn.frame_max
        )
    return None


class _RelayThread:
    def __init__(self, hook: Any = None, relay: AmqpRelay | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        self.relay = relay or AmqpRelay(*RABBIT, hook=hook)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> _RelayThread:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.relay.listen("127.0.0.1", 0), self.loop).result(5)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.relay.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    @property
    def port(self) -> int:
        return self.relay.port


@pytest.fixture(scope="module")
def relay() -> Iterator[_RelayThread]:
    _require_rabbit()
    with _RelayThread(_hook) as running:
        yield running


@pytest.fixture
def queue() -> str:
    return f"jbt-amqp-relay-{uuid.uuid4().hex[:12]}"


def params(port: int, password: str = "guest") -> pika.ConnectionParameters:
    return pika.ConnectionParameters(
        "127.0.0.1", port, credentials=pika.PlainCredentials("guest", password),
        connection_attempts=1, socket_timeout=5, blocked_connection_timeout=10,
    )


@pytest.fixture
def conn(relay: _RelayThread) -> Iterator[pika.BlockingConnection]:
    connection = pika.BlockingConnection(params(relay.port))
    yield connection
    if connection.is_open:
        connection.close()


def declare(channel: Any, name: str) -> str:
    return str(channel.queue_declare(name, auto_delete=True).method.queue)


def test_publish_and_consume_exact(conn: pika.BlockingConnection, queue: str) -> None:
    channel: Any = conn.channel()
    declare(channel, queue)
    props = pika.BasicProperties(
        content_type="application/octet-stream", delivery_mode=2, priority=3,
        correlation_id="corr-1", message_id="id-1", expiration="60000", app_id="tests",
        timestamp=1_700_000_000, type="kind",
        headers={"i": 1, "neg": -5, "big": 2**40, "s": "text", "nested": {"k": "v"}},
    )
    bodies = [b"", b"hello", bytes(range(256)) * 1200]  # the last spans several frames
    for data in bodies:
        channel.basic_publish("", queue, data, props)
    got = []
    for method, properties, data in channel.consume(queue, auto_ack=True, inactivity_timeout=5):
        assert method is not None, "delivery missing"
        got.append((data, properties))
        if len(got) == len(bodies):
            break
    channel.cancel()
    assert [data for data, _ in got] == bodies
    for _, properties in got:
        assert properties.headers == props.headers
        for name in ("content_type", "delivery_mode", "priority", "correlation_id",
                     "message_id", "expiration", "app_id", "timestamp", "type"):
            assert getattr(properties, name) == getattr(props, name), name


def test_publisher_confirms(conn: pika.BlockingConnection, queue: str) -> None:
    channel: Any = conn.channel()
    channel.confirm_delivery()
    declare(channel, queue)
    for i in range(200):
        channel.basic_publish("", queue, f"m{i}".encode())  # raises unless confirmed
    assert channel.queue_declare(queue, passive=True).method.message_count == 200
    with pytest.raises(pika.exceptions.UnroutableError):
        channel.basic_publish("", f"{queue}-nowhere", b"x", mandatory=True)


def test_transactions(conn: pika.BlockingConnection, queue: str) -> None:
    channel: Any = conn.channel()
    declare(channel, queue)
    channel.tx_select()
    channel.basic_publish("", queue, b"rolled back")
    channel.tx_rollback()
    assert channel.queue_declare(queue, passive=True).method.message_count == 0
    channel.basic_publish("", queue, b"committed")
    channel.tx_commit()
    assert channel.queue_declare(queue, passive=True).method.message_count == 1
    method, _, data = channel.basic_get(queue, auto_ack=False)
    assert data == b"committed"
    channel.basic_ack(method.delivery_tag)
    channel.tx_commit()
    assert channel.queue_declare(queue, passive=True).method.message_count == 0


def test_mandatory_publish_returned(conn: pika.BlockingConnection, queue: str) -> None:
    channel: Any = conn.channel()
    returned: list[tuple[Any, Any, bytes]] = []
    channel.add_on_return_callback(lambda _c, m, p, b: returned.append((m, p, b)))
    channel.basic_publish("", queue, b"to nowhere", pika.BasicProperties(headers={"n": 2}),
                          mandatory=True)
    for _ in range(50):
        conn.process_data_events(time_limit=0.1)  # type: ignore[arg-type]
        if returned:
            break
    [(method, properties, data)] = returned
    assert (method.reply_code, method.reply_text, method.routing_key) == (312, "NO_ROUTE", queue)
    assert data == b"to nowhere" and properties.headers == {"n": 2}


def test_wrong_password_refused_in_rabbitmq_words(relay: _RelayThread) -> None:
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        pika.BlockingConnection(params(relay.port, password="wrong"))
    assert "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN" in str(
        info.value)


# -- raw sockets ----------------------------------------------------------------------------


def test_amqplain_login_reaches_rabbitmq(relay: _RelayThread) -> None:
    sock = handshake(relay.port, "AMQPLAIN")
    sock.sendall(pframe.marshal(commands.Connection.Close(200, "bye", 0, 0), 0))
    _, close_ok = read_frame(sock)
    assert isinstance(close_ok, commands.Connection.CloseOk)
    sock.close()


@pytest.mark.parametrize(
    ("garbage", "code"),
    [
        (b"\x01\x00\x00\x00\x00\x00\x04\x00\x0a\x00\x33\x00", 501),  # bad frame-end octet
        (b"\x07\x00\x00\x00\x00\x00\x00\xce", 501),  # unknown frame type
        (b"\x01\x00\x00\x00\x00\x00\x04\x00\x63\x00\x01\xce", 502),  # unknown method
    ],
    ids=["bad-frame-end", "unknown-type", "undecodable-method"],
)
def test_garbage_closes_only_that_client(
    relay: _RelayThread, conn: pika.BlockingConnection, queue: str, garbage: bytes, code: int
) -> None:
    channel: Any = conn.channel()
    declare(channel, queue)
    channel.basic_publish("", queue, b"before")
    bad = handshake(relay.port)
    errors_before = relay.relay.protocol_errors
    bad.sendall(garbage)
    frame_channel, close = read_frame(bad)
    assert frame_channel == 0 and isinstance(close, commands.Connection.Close)
    assert close.reply_code == code
    assert close.reply_text.startswith({501: "FRAME_ERROR", 502: "SYNTAX_ERROR"}[code])
    assert bad.recv(100) == b""  # and then the connection is closed
    bad.close()
    assert relay.relay.protocol_errors == errors_before + 1  # the relay's answer, not RabbitMQ's
    channel.basic_publish("", queue, b"after")
    assert [channel.basic_get(queue, auto_ack=True)[2] for _ in range(2)] == [b"before", b"after"]


@pytest.mark.parametrize(
    "opening",
    [b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"AMQP\x00\x00\x09\x00", b"AMQP\x01\x01\x00\x0a"],
)
def test_other_protocols_get_the_protocol_header(relay: _RelayThread, opening: bytes) -> None:
    with socket.create_connection(("127.0.0.1", relay.port), timeout=5) as sock:
        sock.sendall(opening)
        assert recv_exactly(sock, 8) == PROTOCOL_HEADER
        assert sock.recv(100) == b""


def test_hook_refusal_closes_the_channel(conn: pika.BlockingConnection, queue: str) -> None:
    channel: Any = conn.channel()
    channel.confirm_delivery()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channel.basic_publish("", "jbt-amqp-relay-refuse-x", b"x")
    assert info.value.reply_code == 406
    assert info.value.reply_text.startswith("MQRC_EXPIRY_ERROR")
    other: Any = conn.channel()  # the connection carries on
    declare(other, queue)
    other.basic_publish("", queue, b"still here")
    assert other.basic_get(queue, auto_ack=True)[2] == b"still here"


def test_hook_replacement_is_what_arrives(conn: pika.BlockingConnection) -> None:
    channel: Any = conn.channel()
    name = f"jbt-amqp-relay-rewrite-{uuid.uuid4().hex[:8]}"
    declare(channel, name)
    channel.basic_publish("", name, b"abc" * 50_000, pika.BasicProperties(headers={"a": "b"}))
    _, properties, data = channel.basic_get(name, auto_ack=True)
    assert data == b"ABC" * 50_000
    assert properties.headers == {"a": "b", "rewritten": 1}



def _settled(read: Any, timeout: float = 15.0) -> int:
    """``read()`` once it has given the same figure for a second (or after ``timeout``)."""
    deadline = time.monotonic() + timeout
    last, same_since = read(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = read()
        if now != last:
            last, same_since = now, time.monotonic()
        elif time.monotonic() - same_since >= 1.0:
            break
    return int(last)


def test_a_client_that_does_not_read_stops_the_relay_reading_the_broker(
    relay: _RelayThread, conn: pika.BlockingConnection, queue: str
) -> None:
    """Back-pressure towards the broker: while a consumer does not read its socket, the relay
    reads no more of the broker's deliveries than its sockets hold (RabbitMQ keeps the rest);
    once the consumer reads, every delivery arrives."""
    channel: Any = conn.channel()
    declare(channel, queue)
    body, count = b"m" * 65_536, 600  # 39 MB
    for _ in range(count):
        channel.basic_publish("", queue, body)
    stats = relay.relay.stats
    before = stats.bytes["downstream"]
    sock = handshake(relay.port)
    try:
        sock.sendall(pframe.marshal(commands.Channel.Open(), 1))
        assert isinstance(read_frame(sock)[1], commands.Channel.OpenOk)
        sock.sendall(pframe.marshal(commands.Basic.Consume(queue=queue, no_ack=True), 1))
        assert isinstance(read_frame(sock)[1], commands.Basic.ConsumeOk)
        read = _settled(lambda: stats.bytes["downstream"]) - before
        assert read < count * len(body) // 2, f"the relay read {read} bytes of deliveries " \
            "for a consumer that reads none"
        bodies = 0
        while bodies < count:
            _, value = read_frame(sock)
            if isinstance(value, ContentBody):
                assert value.value == body  # the whole body in one frame (frame_max 131072)
                bodies += 1
    finally:
        sock.close()


def test_a_node_that_does_not_answer_is_passed_over_and_none_answering_is_named() -> None:
    """A cluster's nodes: a client's upstream connection goes to the first that answers (the
    next client's starts at that one); when none answers, the client is refused with
    MQRC_HOST_NOT_AVAILABLE naming every node."""
    _require_rabbit()
    down = ("127.0.0.1", free_port())
    with _RelayThread(relay=AmqpRelay(*down, alternates=[RABBIT])) as running:
        connection = pika.BlockingConnection(params(running.port))
        channel: Any = connection.channel()
        name = declare(channel, f"jbt-amqp-relay-{uuid.uuid4().hex[:12]}")
        channel.basic_publish("", name, b"via the second node")
        assert channel.basic_get(name, auto_ack=True)[2] == b"via the second node"
        connection.close()
        assert running.relay.node_at == 1
    with _RelayThread(relay=AmqpRelay(*down, alternates=[("127.0.0.1", free_port())])) as running:
        with pytest.raises(pika.exceptions.AMQPConnectionError) as refused:
            pika.BlockingConnection(params(running.port))
        text = repr(refused.value)
        assert "MQRC_HOST_NOT_AVAILABLE (2538)" in text and f"127.0.0.1:{down[1]}," in text, text

"""The broker adapters against the real brokers: header fidelity both ways with plain STOMP
clients, holding, FIFO, crash-safe settling, subscriptions, browsing and taking."""

from __future__ import annotations

import base64
import contextlib
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any
from urllib.parse import unquote, urlsplit

import pika
import pytest
import structlog

from adapters import rabbitmq_puts
from adapters.activemq import ActiveMQ
from adapters.amqp_events import Publish
from adapters.base import Held, Message, Move, StagingBroker
from adapters.rabbitmq import RabbitMQ
from adapters.rabbitmq_client import Publisher, encoded
from adapters.rabbitmq_stomp import amqp_properties, route, stomp_headers
from policies.endpoints import Endpoint
from policies.errors import BrokerUnavailable, PutRefused
from tests.integration.brokers import Broker
from tests.integration.clients import Inbox, connect
from tests.integration.tcpproxy import TcpProxy

PER_DELIVERY = {"message-id", "subscription", "ack", "destination", "redelivered", "content-length"}
# Headers ActiveMQ gives every message that did not set them (timestamp: the send time).
BROKER_DEFAULTS = {"rabbitmq": {}, "activemq": {"expires": "0", "priority": "4", "timestamp": None}}
ODD = "ü:\\ñ 🦀 a:b\\c"


def only(name: str) -> pytest.MarkDecorator:
    """Run a test on one broker only (overrides the ``broker`` fixture's parameters)."""
    return pytest.mark.parametrize("broker", [name], indirect=True)


def _amqp_endpoint(broker: Broker) -> Endpoint:
    assert broker.amqp_url is not None
    url = urlsplit(broker.amqp_url)
    vhost = unquote(url.path[1:]) or "/"
    host, port = url.hostname or "127.0.0.1", url.port or 5672
    return Endpoint(host, port, url.username, url.password, vhost)


def _address(broker: Broker) -> tuple[str, int]:
    if broker.name == "rabbitmq":
        ep = _amqp_endpoint(broker)
        return ep.host, ep.port
    return broker.stomp_host, broker.stomp_port


def _adapter(broker: Broker, port: int | None = None) -> StagingBroker:
    """An unconnected adapter for ``broker``; ``port`` on 127.0.0.1 instead (a proxy)."""
    if broker.name == "rabbitmq":
        ep = _amqp_endpoint(broker)
        if port is not None:
            ep = Endpoint("127.0.0.1", port, ep.user, ep.password, ep.vhost)
        return RabbitMQ(ep)
    host, port = (broker.stomp_host, broker.stomp_port) if port is None else ("127.0.0.1", port)
    return ActiveMQ(Endpoint(host, port, broker.user, broker.password))


@pytest.fixture
def adapter(broker: Broker) -> Iterator[StagingBroker]:
    a = _adapter(broker)
    a.connect()
    yield a
    a.close()


@pytest.fixture
def names(broker: Broker) -> Iterator[Callable[[], str]]:
    """Fresh queue names; RabbitMQ's are deleted afterwards."""
    made: list[str] = []

    def new() -> str:
        made.append(f"jbt-ad-{uuid.uuid4().hex[:12]}")
        return made[-1]

    yield new
    if broker.name == "rabbitmq" and made:
        with contextlib.closing(_pika(broker)) as c:
            ch = c.channel()
            for name in made:
                ch.queue_delete(name)


def _pika(broker: Broker) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(broker.amqp_url or ""))


def _stomp(broker: Broker, **kw: Any) -> tuple[Any, Inbox]:
    return connect(broker.stomp_port, broker.user, broker.password, auto_decode=False, **kw)


def _own(headers: dict[str, str]) -> dict[str, str]:
    return {n: v for n, v in headers.items() if n not in PER_DELIVERY}


def _without_defaults(broker: Broker, got: dict[str, str], sent: dict[str, str]) -> dict[str, str]:
    """``got`` less the headers the broker adds to a message that did not set them."""
    out = dict(got)
    for name, value in BROKER_DEFAULTS[broker.name].items():
        if name not in sent and name in out and value in (None, out[name]):
            del out[name]
    return out


def _receive(broker: Broker, destination: str, n: int, **kw: Any) -> list[Any]:
    conn, inbox = _stomp(broker, **kw)
    conn.subscribe(destination, id="t", ack="auto")
    frames = inbox.take(n, timeout=10)
    conn.disconnect()
    return frames


def _app_headers(broker: Broker) -> dict[str, str]:
    headers = {
        "custom": ODD,
        "x-num": "42",
        "persistent": "true",
        "priority": "7",
        "correlation-id": "corr-1",
        "reply-to": "/queue/replies",
        "type": "OrderPlaced",
        "content-type": "application/octet-stream",
    }
    if broker.name == "rabbitmq":
        headers |= {"expiration": "600000", "amqp-message-id": "amqp-1", "app-id": "bench",
                    "user-id": "guest", "timestamp": "1700000000", "content-encoding": "gzip"}
    else:
        headers |= {"expires": str(int(time.time() * 1000) + 600_000)}
    return headers


def _peek(adapter: StagingBroker, queue: str, timeout: float = 3.0) -> Held:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        held = adapter.peek(queue)
        if held is not None:
            return held
        time.sleep(0.01)
    raise AssertionError(f"nothing to peek on {queue}")


def _fill(adapter: StagingBroker, queue: str, n: int, **headers: str) -> None:
    for i in range(n):
        adapter.publish(f"/queue/{queue}", Message({"seq": str(i), **headers}, f"m{i}".encode()))


# -- fidelity -------------------------------------------------------------------------------


def test_publish_reaches_a_stomp_subscriber_with_exactly_its_headers(
    broker: Broker, adapter: StagingBroker, names: Callable[[], str]
) -> None:
    queue = names()
    sent = _app_headers(broker)
    binary = bytes(range(256)) + b"\0\0end"
    big = bytes(i % 251 for i in range(1 << 20))
    adapter.publish(f"/queue/{queue}", Message(sent, binary))
    adapter.publish(f"/queue/{queue}", Message({"k": "big"}, big))

    first, second = _receive(broker, f"/queue/{queue}", 2)
    assert first.body == binary
    assert _without_defaults(broker, _own(first.headers), sent) == sent
    assert second.body == big
    assert _without_defaults(broker, _own(second.headers), {}) == {"k": "big"}


def test_stomp_send_to_the_staging_destination_peeks_as_a_subscriber_sees_it(
    broker: Broker, adapter: StagingBroker, names: Callable[[], str]
) -> None:
    queue = names()
    adapter.ensure_queues([queue])
    destination = adapter.format.client_destination(queue)
    sent = _app_headers(broker)
    body = b"\0binary\0\xff\xfe body"
    conn, inbox = _stomp(broker)
    conn.send(destination, body, headers={**sent, "receipt": "r1"})
    assert inbox.wait_receipt("r1")
    conn.disconnect()

    held = _peek(adapter, queue)
    assert held.message.body == body
    peeked = held.message.headers
    adapter.close()  # gives it back

    (frame,) = _receive(broker, destination, 1)
    assert frame.body == body
    assert peeked == _own(frame.headers)
    for name, value in sent.items():  # and they are the application's own
        assert peeked[name] == value


def test_put_back_then_peek_gives_the_same_message(
    adapter: StagingBroker, names: Callable[[], str]
) -> None:
    queue = names()
    adapter.ensure_queues([queue])
    _fill(adapter, queue, 2)
    first = _peek(adapter, queue)
    adapter.put_back(first)
    again = _peek(adapter, queue)
    assert again.message == first.message
    assert again.message.headers["seq"] == "0"


def test_a_put_back_head_can_be_taken_by_another_connection(
    broker: Broker, adapter: StagingBroker, names: Callable[[], str]
) -> None:
    queue = names()
    adapter.ensure_queues([queue])
    _fill(adapter, queue, 2)
    adapter.put_back(_peek(adapter, queue))
    tool = _adapter(broker)
    tool.connect()
    try:
        taken = tool.take(queue, "seq", "0")
    finally:
        tool.close()
    assert taken is not None and taken.body == b"m0"
    assert _peek(adapter, queue).message.headers["seq"] == "1"


@only("activemq")
def test_activemq_hold_put_back_keeps_the_head(broker: Broker, names: Callable[[], str]) -> None:
    queue = names()
    holder = ActiveMQ(
        Endpoint(broker.stomp_host, broker.stomp_port, broker.user, broker.password),
        hold_put_back=True,
    )
    holder.connect()
    try:
        _fill(holder, queue, 2)
        first = _peek(holder, queue)
        holder.put_back(first)
        assert holder.peek(queue) is first  # at once, no wait
    finally:
        holder.close()


def test_fifo_over_a_hundred_messages(adapter: StagingBroker, names: Callable[[], str]) -> None:
    queue = names()
    adapter.ensure_queues([queue])
    _fill(adapter, queue, 100)
    seen = []
    for _ in range(100):
        held = _peek(adapter, queue)
        seen.append(int(held.message.headers["seq"]))
        adapter.settle([Move(held)])
    assert seen == list(range(100))
    assert adapter.peek(queue) is None


def test_settle_moves_a_message_to_another_queue(
    broker: Broker, adapter: StagingBroker, names: Callable[[], str]
) -> None:
    source, target = names(), names()
    adapter.ensure_queues([source, target])
    _fill(adapter, source, 1, custom=ODD)
    held = _peek(adapter, source)
    moved = Message({**held.message.headers, "hop": "1"}, held.message.body)
    adapter.settle([Move(held, adapter.format.client_destination(target), moved)])
    assert list(adapter.browse(source)) == []
    (arrived,) = list(adapter.browse(target))
    assert arrived == moved


def test_settle_cut_off_mid_way_duplicates_and_never_loses(
    broker: Broker, names: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    source, target = names(), names()
    proxy = TcpProxy(_address(broker))
    cut = _adapter(broker, proxy.port)
    try:
        cut.connect()
        cut.ensure_queues([source, target])
        _fill(cut, source, 1)
        held = _peek(cut, source)
        if isinstance(cut, RabbitMQ):
            publish = cut._publish  # the replacement is confirmed; the ack never leaves

            def publish_then_die(*args: object) -> None:
                publish(*args)  # type: ignore[arg-type]
                proxy.cut()

            monkeypatch.setattr(cut, "_publish", publish_then_die)
        else:
            assert isinstance(cut, ActiveMQ) and cut._conn is not None
            # The SEND's receipt is in; the ACK never leaves.
            monkeypatch.setattr(cut._conn, "ack", lambda *a, **k: proxy.cut())
        with contextlib.suppress(BrokerUnavailable):
            cut.settle([Move(held, cut.format.client_destination(target), held.message)])
            cut.peek(source)  # notices the cut if settle did not
    finally:
        cut.close()
        proxy.close()

    check = _adapter(broker)
    check.connect()
    try:
        deadline = time.monotonic() + 5  # the broker notices the cut connection
        while time.monotonic() < deadline and not list(check.browse(source)):
            time.sleep(0.05)
        in_source, in_target = list(check.browse(source)), list(check.browse(target))
    finally:
        check.close()
    assert [m.body for m in in_source] == [b"m0"]  # never lost
    assert [m.body for m in in_target] == [b"m0"]  # confirmed before the ack was lost: twice


def test_subscribe_and_poll_respect_the_prefetch(
    adapter: StagingBroker, names: Callable[[], str]
) -> None:
    queue = names()
    adapter.ensure_queues([queue])
    _fill(adapter, queue, 5)
    adapter.subscribe(queue, 2)

    def collect(n: int, within: float) -> list[Held]:
        got: list[Held] = []
        deadline = time.monotonic() + within
        while len(got) < n and time.monotonic() < deadline:
            got += adapter.poll(0.1)
        return got

    first = collect(2, 3.0)
    assert [h.message.headers["seq"] for h in first] == ["0", "1"]
    assert collect(1, 0.3) == []  # both held: nothing more comes
    adapter.settle([Move(h) for h in first])
    rest = collect(2, 3.0)
    assert [h.message.headers["seq"] for h in rest] == ["2", "3"]
    adapter.settle([Move(h) for h in rest])
    last = collect(1, 3.0)
    assert [h.message.headers["seq"] for h in last] == ["4"]


def test_depths_of_queues_sharing_a_prefix_match_their_depths(
    broker: Broker, adapter: StagingBroker, names: Callable[[], str]
) -> None:
    """The staging engine counts its queues with ``depths`` (one wildcard request on ActiveMQ):
    each queue's own count, held messages included, 0 for a queue the broker does not have,
    and nothing from another queue under the same prefix."""
    base = names()
    level, ready, absent, other = (f"{base}.staging.{s}" for s in ("L10", "ready", "L11", "x"))
    adapter.ensure_queues([level, ready, other])
    _fill(adapter, level, 3)
    _fill(adapter, ready, 2)
    _fill(adapter, other, 4)
    try:
        adapter.subscribe(ready, 1)
        held: list[Held] = []
        deadline = time.monotonic() + 3.0
        while not held and time.monotonic() < deadline:
            held += adapter.poll(0.1)
        assert len(held) == 1
        expected = {level: 3, ready: 2, absent: 0}
        assert adapter.depths([level, ready, absent]) == expected
        assert {q: adapter.depth(q) for q in expected} == expected
        adapter.settle([Move(held[0])])
        held.clear()
        deadline = time.monotonic() + 3.0
        while not held and time.monotonic() < deadline:
            held += adapter.poll(0.1)  # the next one, held now
        assert len(held) == 1
        assert adapter.depths([level, ready, absent]) == {**expected, ready: 1}
    finally:
        if broker.name == "rabbitmq":
            with contextlib.closing(_pika(broker)) as c:
                ch = c.channel()
                for name in (level, ready, other):
                    ch.queue_delete(name)


def test_browse_returns_all_and_consumes_none(
    adapter: StagingBroker, names: Callable[[], str]
) -> None:
    queue = names()
    adapter.ensure_queues([queue])
    _fill(adapter, queue, 3)
    first = [m.headers["seq"] for m in adapter.browse(queue)]
    second = [m.headers["seq"] for m in adapter.browse(queue)]
    assert first == second == ["0", "1", "2"]
    assert _peek(adapter, queue).message.headers["seq"] == "0"


@pytest.mark.parametrize("header", ["k", "jms-bridge-message-id", "correlation-id"])
def test_take_removes_exactly_the_matching_message(
    adapter: StagingBroker, names: Callable[[], str], header: str
) -> None:
    queue = names()
    adapter.ensure_queues([queue])
    for value in ("a", "b'x", "c"):
        adapter.publish(f"/queue/{queue}", Message({header: value}, value.encode()))
    taken = adapter.take(queue, header, "b'x")
    assert taken is not None and taken.body == b"b'x" and taken.headers[header] == "b'x"
    assert adapter.take(queue, header, "zzz") is None
    assert [m.body for m in adapter.browse(queue)] == [b"a", b"c"]


def test_take_finds_the_head_this_adapter_holds(
    adapter: StagingBroker, names: Callable[[], str]
) -> None:
    queue = names()
    adapter.ensure_queues([queue])
    _fill(adapter, queue, 2)
    held = _peek(adapter, queue)
    if isinstance(adapter, RabbitMQ):
        adapter.put_back(held)  # RabbitMQ: a held message is out of its queue until given back
    taken = adapter.take(queue, "seq", "0")
    assert taken is not None and taken.body == b"m0"
    assert [m.body for m in adapter.browse(queue)] == [b"m1"]


# -- failures -------------------------------------------------------------------------------


def test_connect_to_a_closed_port_names_broker_and_address(broker: Broker) -> None:
    with socket_closed_port() as port:
        a = _adapter(broker, port)
        with pytest.raises(BrokerUnavailable) as err:
            a.connect()
    text = str(err.value)
    assert text.startswith(broker.name)
    assert f"127.0.0.1:{port}" in text and "ConnectionRefusedError" in text
    assert "\n" not in text


@contextlib.contextmanager
def socket_closed_port() -> Iterator[int]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]  # bound, never listening: refused


def test_a_lost_connection_raises_broker_unavailable_from_the_next_call(
    broker: Broker, names: Callable[[], str]
) -> None:
    queue = names()
    proxy = TcpProxy(_address(broker))
    a = _adapter(broker, proxy.port)
    try:
        a.connect()
        a.ensure_queues([queue])
        proxy.cut()
        with pytest.raises(BrokerUnavailable) as err:
            for _ in range(50):  # the receiver thread (ActiveMQ) notices within moments
                a.peek(queue)
                time.sleep(0.02)
        assert str(err.value).startswith(broker.name)
        with pytest.raises(BrokerUnavailable):
            a.poll(0)
    finally:
        a.close()
        proxy.close()


def test_destinations_a_staged_message_cannot_target_are_refused(
    adapter: StagingBroker,
) -> None:
    for destination in ("/temp-queue/x", "queue/x/y", "/queue/"):
        with pytest.raises(ValueError):
            adapter.publish(destination, Message({}, b""))
    if adapter.name == "rabbitmq":
        # A client's temporary reply queue, as a reply-to shows it: the engine puts reports
        # there (a delayed send to it is refused before it is staged); one that is gone is a
        # refusal, not an outage.
        with pytest.raises(PutRefused) as refused:
            adapter.publish(f"/reply-queue/jbt-gone-{uuid.uuid4().hex}", Message({}, b""))
        assert refused.value.reason.name == "MQRC_UNKNOWN_OBJECT_NAME"
    else:
        with pytest.raises(ValueError):
            adapter.publish("/reply-queue/x", Message({}, b""))


# -- RabbitMQ: the STOMP plugin's mapping ----------------------------------------------------


@only("rabbitmq")
def test_rabbitmq_pika_properties_read_as_the_plugin_shows_them(
    broker: Broker, adapter: StagingBroker, names: Callable[[], str]
) -> None:
    queue = names()
    adapter.ensure_queues([queue])
    props = pika.BasicProperties(
        headers={"s": "str", "i": 7, "big": 2**40, "flag": True, "table": {"a": 1},
                 "dec": Decimal("1.5")},
        delivery_mode=1, priority=3, timestamp=99, reply_to="bare-queue", type="t",
    )
    with contextlib.closing(_pika(broker)) as c:
        ch = c.channel()
        for _ in range(2):
            ch.basic_publish("", queue, b"amqp", props)
    held = _peek(adapter, queue)
    (frame,) = _receive(broker, adapter.format.client_destination(queue), 1)
    # As the plugin shows them, and the booleans and decimals it drops read by their meaning
    # (policies.properties: a boolean JMS_TIBCO_PRESERVE_UNDELIVERED must not vanish).
    shown = _own(frame.headers)
    assert {k: v for k, v in held.message.headers.items() if k in shown} == shown
    assert held.message.headers == {
        "s": "str", "i": "7", "big": "1099511627776", "persistent": "1", "priority": "3",
        "timestamp": "99", "reply-to": "/reply-queue/bare-queue", "type": "t",
        "flag": "true", "dec": "1.5",
    }


@only("rabbitmq")
def test_rabbitmq_missing_amq_queue_fails_instead_of_dropping(
    broker: Broker, adapter: StagingBroker
) -> None:
    # A refusal of that one message (PutRefused), not an outage: the adapter stays usable.
    with pytest.raises(PutRefused, match="no queue") as missing_queue:
        adapter.publish(f"/amq/queue/jbt-missing-{uuid.uuid4().hex}", Message({}, b"x"))
    with pytest.raises(PutRefused, match="NOT_FOUND") as missing_exchange:
        adapter.publish(f"/exchange/jbt-missing-{uuid.uuid4().hex}/k", Message({}, b"x"))
    assert missing_queue.value.reason.code == missing_exchange.value.reason.code == 2085
    adapter.publish("/topic/jbt.nobody", Message({}, b"x"))  # a topic may have no subscriber


def _held(adapter: StagingBroker, queue: str, n: int) -> list[Held]:
    """The first ``n`` messages of ``queue``, delivered to a subscription and held."""
    adapter.subscribe(queue, n)
    held: list[Held] = []
    deadline = time.monotonic() + 5
    while len(held) < n and time.monotonic() < deadline:
        held += adapter.poll(0.1)
    assert [h.message.headers["seq"] for h in held] == [str(i) for i in range(n)]
    return held


@only("rabbitmq")
def test_rabbitmq_a_batch_stops_at_its_unroutable_put_and_acks_only_what_it_settled(
    broker: Broker, names: Callable[[], str]
) -> None:
    """One transaction for the batch; a put returned unroutable is refused at its index, the
    moves before it are acked (with the run of the oldest held in one multiple ack), and so is
    the one after it the transaction put (named in ``also_done``): what the batch did not
    settle is still held."""
    source, target = names(), names()
    a = _adapter(broker)
    a.connect()
    try:
        a.ensure_queues([source, target])
        _fill(a, source, 6)
        held = _held(a, source, 6)
        to = f"/amq/queue/{target}"
        moves = [Move(held[i], to, held[i].message) for i in (0, 1, 3)]
        missing = f"/amq/queue/jbt-gone-{uuid.uuid4().hex}"
        with pytest.raises(PutRefused) as refused:
            a.settle([*moves, Move(held[4], missing, held[4].message), Move(held[5], to,
                                                                              held[5].message)])
        assert refused.value.index == 3 and refused.value.destination == missing
        assert refused.value.reason.name == "MQRC_UNKNOWN_OBJECT_NAME"
        assert refused.value.also_done == (4,)
        assert a.depth(source) == 2  # 2 and 4: still held, still this adapter's
    finally:
        a.close()  # 2 and 4 go back
    left, put = (sorted(m.body for m in _adapter_browse(broker, q)) for q in (source, target))
    assert left == [b"m2", b"m4"]
    assert put == [b"m0", b"m1", b"m3", b"m5"]


@only("rabbitmq")
@pytest.mark.parametrize(("missing", "count", "also_done", "left_over"), [
    # Returned unroutable: its commit is done but for it, and it is the last commit made.
    ("/amq/queue/jbt-gone-{}", 8, (5,), [b"m4", b"m6", b"m7"]),
    # A channel error undoes its commit: the rest after the first commit go one by one.
    ("/exchange/jbt-missing-{}/k", 6, (), [b"m4", b"m5"]),
], ids=["returned", "channel-error"])
def test_rabbitmq_a_batch_stopped_in_its_second_commit_acks_what_it_put(
    broker: Broker, names: Callable[[], str], monkeypatch: pytest.MonkeyPatch, missing: str,
    count: int, also_done: tuple[int, ...], left_over: list[bytes],
) -> None:
    """A batch is committed COMMIT_EVERY puts at a time, and acked once the last commit is in.
    Refused at move 4, in the second commit: every move put is acked (those after the refused
    one named in ``also_done``) and no message is put twice; the rest stay held."""
    monkeypatch.setattr(rabbitmq_puts, "COMMIT_EVERY", 3)
    source, target = names(), names()
    missing = missing.format(uuid.uuid4().hex)
    a = _adapter(broker)
    a.connect()
    try:
        a.ensure_queues([source, target])
        _fill(a, source, count)
        held = _held(a, source, count)
        to = f"/amq/queue/{target}"
        moves = [Move(h, missing if i == 4 else to, h.message) for i, h in enumerate(held)]
        with pytest.raises(PutRefused) as refused:
            a.settle(moves)
        assert (refused.value.index, refused.value.destination) == (4, missing)
        assert refused.value.also_done == also_done
        assert a.depth(source) == len(left_over)  # still held
    finally:
        a.close()
    left, put = (sorted(m.body for m in _adapter_browse(broker, q)) for q in (source, target))
    assert left == left_over
    assert put == sorted(f"m{i}".encode() for i in range(count) if f"m{i}".encode()
                         not in left_over)


@only("rabbitmq")
def test_rabbitmq_a_batch_refused_by_a_channel_error_is_put_one_by_one(
    broker: Broker, adapter: StagingBroker, names: Callable[[], str]
) -> None:
    """A missing exchange closes the transaction's channel: nothing of the batch was put, and
    one by one the refused move is named; the next batch goes in a transaction again."""
    source, target = names(), names()
    adapter.ensure_queues([source, target])
    _fill(adapter, source, 4)
    held = _held(adapter, source, 4)
    to = f"/amq/queue/{target}"
    missing = f"/exchange/jbt-missing-{uuid.uuid4().hex}/k"
    with pytest.raises(PutRefused, match="NOT_FOUND") as refused:
        adapter.settle([Move(held[0], to, held[0].message), Move(held[1], missing,
                                                                 held[1].message)])
    assert refused.value.index == 1
    adapter.settle([Move(h, to, h.message) for h in held[1:]])
    assert adapter.depth(source) == 0
    assert [m.body for m in adapter.browse(target)] == [b"m0", b"m1", b"m2", b"m3"]


@only("rabbitmq")
def test_rabbitmq_a_transaction_waits_doing_other_work_until_that_work_is_done(
    broker: Broker, adapter: StagingBroker, names: Callable[[], str]
) -> None:
    """While the broker commits a batch, the Publisher calls ``meanwhile`` (the adapter reads
    its subscriptions' deliveries then), until it returns False; the commit is as without."""
    target = names()
    adapter.ensure_queues([target])
    ep = _amqp_endpoint(broker)
    publisher = Publisher(pika.ConnectionParameters(
        ep.host, ep.port, ep.vhost, pika.PlainCredentials(ep.user or "", ep.password or "")),
        "test", structlog.get_logger())
    calls: list[int] = []

    def meanwhile() -> bool:
        calls.append(len(calls))
        return len(calls) < 2

    try:
        for n in range(5):
            publisher.commit([Publish("", target, encoded(pika.BasicProperties()),
                                      f"m{n}".encode(), True)], meanwhile=meanwhile)
            assert 1 <= len(calls) <= 2, calls  # called at once, never again after False
            calls.clear()
    finally:
        publisher.close()
    assert [m.body for m in adapter.browse(target)] == [f"m{n}".encode() for n in range(5)]


@only("rabbitmq")
def test_rabbitmq_a_transactions_connection_the_broker_closed_is_made_again(
    broker: Broker, adapter: StagingBroker, names: Callable[[], str]
) -> None:
    """The broker closes the connection that carries the batches while the adapter is idle
    (an operator, a node's restart): the next batch opens another and goes through."""
    assert isinstance(adapter, RabbitMQ) and broker.management_url is not None
    source, target = names(), names()
    adapter.ensure_queues([source, target])
    _fill(adapter, source, 4)
    held = _held(adapter, source, 4)
    to = f"/amq/queue/{target}"
    adapter.settle([Move(h, to, h.message) for h in held[:2]])
    assert adapter._publisher is not None and adapter._publisher._sock is not None
    port = adapter._publisher._sock.getsockname()[1]
    name = urllib.parse.quote(f"127.0.0.1:{port} -> 127.0.0.1:{_address(broker)[1]}", safe="")
    url = urlsplit(broker.management_url)
    request = urllib.request.Request(f"{broker.management_url}/api/connections/{name}",
                                     method="DELETE")
    auth = base64.b64encode(f"{url.username or 'guest'}:{url.password or 'guest'}".encode())
    request.add_header("Authorization", f"Basic {auth.decode()}")
    deadline = time.monotonic() + 10
    while True:  # the management API lists a connection some moments after it opened
        try:
            urllib.request.urlopen(request, timeout=5).close()
            break
        except urllib.error.HTTPError as missing:
            if missing.code != 404 or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    time.sleep(0.2)
    adapter.settle([Move(h, to, h.message) for h in held[2:]])
    assert adapter.depth(source) == 0
    assert [m.body for m in adapter.browse(target)] == [b"m0", b"m1", b"m2", b"m3"]


@only("rabbitmq")
def test_rabbitmq_a_node_that_does_not_answer_is_passed_over_and_the_batches_follow(
    broker: Broker, names: Callable[[], str]
) -> None:
    """A cluster's nodes are tried in turn: the one that answers takes the connection and the
    batches' transactions, and is tried first the next time."""
    real = _amqp_endpoint(broker)
    source, target = names(), names()
    with socket_closed_port() as closed:
        down = Endpoint("127.0.0.1", closed, real.user, real.password, real.vhost)
        a = RabbitMQ(Endpoint(down.host, down.port, down.user, down.password, down.vhost,
                              alternates=(real,)))
        try:
            for _ in range(2):
                a.connect()
                assert a._params.port == real.port
                a.ensure_queues([source, target])
                _fill(a, source, 2)
                held = _held(a, source, 2)
                a.settle([Move(h, f"/amq/queue/{target}", h.message) for h in held])
                assert a._publisher is not None and a._publisher._sock is not None
                assert a._publisher._sock.getpeername()[1] == real.port
                a.close()
        finally:
            a.close()
    assert [m.body for m in _adapter_browse(broker, target)] == [b"m0", b"m1"] * 2


def _adapter_browse(broker: Broker, queue: str) -> list[Message]:
    b = _adapter(broker)
    b.connect()
    try:
        return list(b.browse(queue))
    finally:
        b.close()


@only("rabbitmq")
def test_rabbitmq_queue_target_is_declared_like_the_plugin_and_tolerates_other_arguments(
    broker: Broker, adapter: StagingBroker, names: Callable[[], str]
) -> None:
    queue = names()
    adapter.publish(f"/queue/{queue}", Message({"x-max-priority": "9"}, b"one"))
    other = _adapter(broker)
    other.connect()
    try:  # the queue has x-max-priority now; a message without it still gets there
        other.publish(f"/queue/{queue}", Message({}, b"two"))
    finally:
        other.close()
    assert [m.body for m in adapter.browse(queue)] == [b"one", b"two"]


@only("rabbitmq")
def test_rabbitmq_classic_staging_queues_are_lazy_and_of_version_2_or_used_as_an_earlier_bridge_left_them(  # noqa: E501
    broker: Broker, adapter: StagingBroker, names: Callable[[], str]
) -> None:
    from adapters.rabbitmq import CLASSIC_ARGUMENTS

    new, earlier = names(), names()
    with contextlib.closing(_pika(broker)) as c:
        c.channel().queue_declare(earlier, durable=True)  # as bridges before declared them
    adapter.ensure_queues([new, earlier])  # no StagingQueueMismatch for the earlier one
    with contextlib.closing(_pika(broker)) as c:
        # A queue's arguments show in what RabbitMQ accepts to declare again: the same only.
        c.channel().queue_declare(new, durable=True, arguments=CLASSIC_ARGUMENTS)
        c.channel().queue_declare(earlier, durable=True)  # left as it was
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            c.channel().queue_declare(new, durable=True)
        assert refused.value.reply_code == 406 and "x-queue-mode" in refused.value.reply_text
    adapter.publish(adapter.format.client_destination(new), Message({"n": "1"}, b"staged"))
    assert [m.body for m in adapter.browse(new)] == [b"staged"]


def test_rabbitmq_header_mapping_is_the_plugins() -> None:
    props = amqp_properties({
        "persistent": "True", "priority": " 5 ", "reply-to": "/reply-queue/amq.gen-1",
        "custom": "v", "destination": "/queue/x", "content-length": "3",
    })
    assert (props.delivery_mode, props.priority, props.reply_to) == (2, 5, "amq.gen-1")
    assert props.headers == {"custom": "v"}
    assert stomp_headers(props) == {
        "custom": "v", "persistent": "true", "priority": "5", "reply-to": "/reply-queue/amq.gen-1",
    }
    assert amqp_properties({"persistent": "false"}).delivery_mode is None
    for bad in ({"message-id": "m"}, {"priority": "high"}, {"timestamp": "1_0"}):
        with pytest.raises(ValueError):
            amqp_properties(bad)
    # a table entry shadows a property of the same name, as on the plugin's MESSAGE
    assert stomp_headers(pika.BasicProperties(priority=3, headers={"priority": "x"})) == {
        "priority": "x"
    }
    assert route("/queue/a%2Fb").routing_key == "a/b"
    assert route("/exchange/amq.direct").exchange == "amq.direct"
    assert (route("/topic/t.x").exchange, route("/topic/t.x").routing_key) == ("amq.topic", "t.x")
    assert route("bare").declare


# -- ActiveMQ: message kinds -----------------------------------------------------------------


@only("activemq")
def test_activemq_a_move_keeps_a_text_message_text(
    broker: Broker, adapter: StagingBroker, names: Callable[[], str]
) -> None:
    source, target = names(), names()
    adapter.ensure_queues([source, target])
    conn, inbox = _stomp(broker, auto_content_length=False)
    conn.send(f"/queue/{source}", b"plain text", headers={"receipt": "r"})
    conn.send(f"/queue/{source}", b"by\0tes", headers={"receipt": "s", "content-length": "6"})
    assert inbox.wait_receipt("r") and inbox.wait_receipt("s")
    conn.disconnect()
    for _ in range(2):
        held = _peek(adapter, source)
        adapter.settle([Move(held, f"/queue/{target}", held.message)])
    text, binary = _receive(broker, f"/queue/{target}", 2)
    assert text.body == b"plain text" and "content-length" not in text.headers
    assert binary.body == b"by\0tes" and binary.headers["content-length"] == "6"


@only("activemq")
def test_activemq_a_refused_send_mid_batch_leaves_only_it_held(
    adapter: StagingBroker, names: Callable[[], str]
) -> None:
    source, target = names(), names()
    adapter.ensure_queues([source, target])
    _fill(adapter, source, 3)
    adapter.subscribe(source, 10)
    held: list[Held] = []
    deadline = time.monotonic() + 3
    while len(held) < 3 and time.monotonic() < deadline:
        held += adapter.poll(0.1)
    gone = f"/remote-temp-queue/ID:jbt-gone-{uuid.uuid4().hex[:12]}-1:1:1"
    there = adapter.format.client_destination(target)
    to = [there, gone, there]
    with pytest.raises(PutRefused) as refused:
        adapter.settle([Move(h, d, h.message) for h, d in zip(held, to, strict=True)])
    assert refused.value.index == 1 and refused.value.also_done == (2,)
    assert refused.value.reason.name == "MQRC_UNKNOWN_OBJECT_NAME"
    assert sorted(m.body for m in adapter.browse(target)) == [b"m0", b"m2"]
    adapter.settle([Move(held[1])])  # still held, and still ours to settle
    assert list(adapter.browse(source)) == []



@only("activemq")
@pytest.mark.parametrize("late", [False, True], ids=["error-first", "error-late"])
def test_activemq_a_refused_send_in_a_transaction_is_put_again_with_receipts(
    adapter: StagingBroker, names: Callable[[], str], monkeypatch: pytest.MonkeyPatch,
    late: bool,
) -> None:
    """A settle of ``TX_MIN`` SENDs or more goes in one transaction: one SEND refused in it gets
    the COMMIT refused and nothing stored, and the SENDs go again with receipts, which name it;
    every other copy is on its target once. ``late``: the refused SEND's ERROR (naming no
    receipt) held back 0.3 s, as CI once saw it come after the COMMIT's answer: it is that
    refusal's echo, not a broker failure, and the adapter goes on."""
    import threading

    from adapters.activemq_puts import TX_MIN

    answers: list[object] = []
    put = adapter._put_in_transaction  # type: ignore[attr-defined]

    def spied(*args: object) -> object:
        answers.append(put(*args))
        return answers[-1]

    monkeypatch.setattr(adapter, "_put_in_transaction", spied)
    source, target = names(), names()
    adapter.ensure_queues([source, target])
    held_back: list[object] = []
    if late:
        listener = adapter._listener  # type: ignore[attr-defined]
        on_error = listener.on_error

        def hold_back(frame: Any) -> None:
            if "receipt-id" in frame.headers:
                on_error(frame)
            else:
                held_back.append(frame)
                threading.Timer(0.3, on_error, (frame,)).start()

        listener.on_error = hold_back
    _fill(adapter, source, 2 * TX_MIN)
    adapter.subscribe(source, 2 * TX_MIN)
    held: list[Held] = []
    deadline = time.monotonic() + 5
    while len(held) < 2 * TX_MIN and time.monotonic() < deadline:
        held += adapter.poll(0.1)
    assert len(held) == 2 * TX_MIN
    there = adapter.format.client_destination(target)
    adapter.settle([Move(h, there, h.message) for h in held[:TX_MIN]])
    assert answers == [{}]  # committed
    assert len(list(adapter.browse(target))) == TX_MIN
    rest, bad = held[TX_MIN:], 3
    gone = f"/remote-temp-queue/ID:jbt-gone-{uuid.uuid4().hex[:12]}-1:1:1"
    moves = [Move(h, gone if i == bad else there, h.message) for i, h in enumerate(rest)]
    with pytest.raises(PutRefused) as refused:
        adapter.settle(moves)
    assert answers == [{}, None]  # the COMMIT refused, then one by one
    assert refused.value.index == bad
    assert refused.value.also_done == tuple(range(bad + 1, len(moves)))
    assert refused.value.reason.name == "MQRC_UNKNOWN_OBJECT_NAME"
    bodies = sorted(m.body for m in adapter.browse(target))
    assert len(bodies) == len(set(bodies)) == 2 * TX_MIN - 1  # each once
    adapter.settle([Move(rest[bad])])  # still held, and still ours to settle
    assert list(adapter.browse(source)) == []
    if late:
        assert held_back, "no ERROR naming no receipt came: nothing was held back"
        time.sleep(0.5)  # the echo is in by now
        assert adapter._listener.errors == []  # type: ignore[attr-defined]
        _fill(adapter, source, 1)  # and the adapter goes on
        adapter.subscribe(source, 1)
        more: list[Held] = []
        deadline = time.monotonic() + 5
        while not more and time.monotonic() < deadline:
            more += adapter.poll(0.1)
        adapter.settle([Move(h, there, h.message) for h in more])

"""The delivery fast path (``fastpath.delivery_run`` in ``ProxyConnection.broker_data``, carried
out by ``ConsumerSide``) against the framed path it shortcuts: on random streams from the
broker (deliveries plain and redelivered, with and without the headers the chain names, to
consumers that acknowledge and that do not, Basic.GetOk, publisher confirms, heartbeats and
other methods), cut
into random chunks, both must hand the client the same bytes, remember the same unsettled
deliveries, and offer the chain the same views and messages when the client fails them."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands

from adapters import rabbitmq
from bridge.frontends.amqp import ProxyConnection
from bridge.frontends.amqp.connection import DeliveryRun
from bridge.frontends.amqp.consumers import Failure
from bridge.frontends.amqp.fastpath import delivery_run
from bridge.frontends.amqp.framer import FRAME_METHOD
from bridge.frontends.amqp.settling import ConsumerSide
from bridge.frontends.relay_stats import RelayStats
from bridge.intercept.chain import Chain
from bridge.intercept.guard import StagingGuard
from bridge.intercept.redelivery import RedeliveryInterceptor
from bridge.staging.levels import layout_for
from policies.redelivery import PolicyTable
from tests.unit.amqp_wire import HEADER, HEARTBEAT, body, content_header, method, random_chunks

B = commands.Basic
C = commands.Connection
FMT = rabbitmq.FORMAT
LAYOUT = layout_for(FMT)
# Channel 1: a consumer that acknowledges ("acks"); channel 2: one that does not ("auto").
CONSUMERS = {1: ("acks", False), 2: ("auto", True)}


def side(fast: bool) -> tuple[ProxyConnection, ConsumerSide]:
    chain = Chain([StagingGuard(LAYOUT),
                   RedeliveryInterceptor(table=PolicyTable(), fmt=FMT, layout=LAYOUT)])
    conn = ProxyConnection(assemble_broker=True, reserve_channel=True)
    consumer_side = ConsumerSide(chain, conn, RelayStats())
    consumer_side.attach(lambda data: None)
    if not fast:
        conn.delivery_needles = None
    client(conn, consumer_side, HEADER + method(C.StartOk(client_properties={}, mechanism="PLAIN",
                                                          response="\0g\0g"))
           + method(C.TuneOk(channel_max=100, frame_max=4096, heartbeat=0))
           + method(C.Open(virtual_host="/")))
    for channel, (tag, no_ack) in CONSUMERS.items():
        client(conn, consumer_side, method(commands.Channel.Open(), channel)
               + method(B.Consume(queue="q", consumer_tag=tag, no_ack=no_ack), channel))
        broker(conn, consumer_side, method(B.ConsumeOk(consumer_tag=tag), channel))
    client(conn, consumer_side, method(B.Get(queue="q"), 1))
    return conn, consumer_side


def client(conn: ProxyConnection, consumer_side: ConsumerSide, data: bytes) -> list[Any]:
    found: list[Any] = []
    for event in conn.client_data(data):
        if getattr(event, "type", None) == FRAME_METHOD:
            result = consumer_side.client_frame(event)
            if result is not None:
                found.append(result)
    return found


def broker(conn: ProxyConnection, consumer_side: ConsumerSide, data: bytes) -> bytes:
    out = [consumer_side.broker_event(event) for event in conn.broker_data(data)]
    return b"".join(part for part in out if part)


def delivery(channel: int, tag: int, *, redelivered: bool, headers: dict[str, Any] | None,
             size: int, frame_max: int = 4096) -> bytes:
    consumer = CONSUMERS[channel][0]
    data = b"b" * size
    props = commands.Basic.Properties(headers=headers, content_type="text/plain")
    parts = [method(B.Deliver(consumer_tag=consumer, delivery_tag=tag, redelivered=redelivered,
                              exchange="ex", routing_key="q"), channel),
             content_header(channel, size, props)]
    step = frame_max - 8
    parts += [body(channel, data[i:i + step]) for i in range(0, size, step)]
    return b"".join(parts)


HEADERS = st.sampled_from([None, {"app": "x"}, {"x-delivery-count": 2}, {"JMSXDeliveryCount": 5},
                           {"jms-bridge-delivery-count": "3", "n": 1}])
ITEM = st.one_of(
    st.tuples(st.just("deliver"), st.sampled_from([1, 2]), st.booleans(), HEADERS,
              st.sampled_from([0, 1, 100, 5000, 40_000])),  # (40,000: past stamping's copy)
    st.tuples(st.just("get"), st.just(1), st.booleans(), HEADERS, st.just(3)),
    st.tuples(st.just("heartbeat"), st.just(0), st.just(False), st.none(), st.just(0)),
    st.tuples(st.just("method"), st.just(1), st.just(False), st.none(), st.just(0)),
    st.tuples(st.just("confirm"), st.sampled_from([1, 3]), st.booleans(), st.none(), st.just(0)),
)


def stream(items: list[tuple[Any, ...]]) -> bytes:
    out: list[bytes] = []
    tags = {1: 0, 2: 0}
    for kind, channel, redelivered, headers, size in items:
        if kind == "heartbeat":
            out.append(HEARTBEAT)
        elif kind == "method":
            out.append(method(B.QosOk(), channel))
        elif kind == "confirm":  # a publisher confirm, on a consumer's channel or another
            out.append(method(B.Ack(delivery_tag=7, multiple=redelivered), channel))
        else:
            tags[channel] += 1
            if kind == "deliver":
                out.append(delivery(channel, tags[channel], redelivered=redelivered,
                                    headers=headers, size=size))
            else:
                out.append(method(B.GetOk(delivery_tag=tags[channel], redelivered=redelivered,
                                          exchange="", routing_key="q", message_count=0),
                                  channel)
                           + content_header(channel, 3, commands.Basic.Properties(headers=headers))
                           + body(channel, b"get"))
    return b"".join(out)


def view_of(d: Any) -> tuple[Any, ...]:
    return (d.destination, d.subscription, d.ack_id, dict(d.headers.items()), d.body_size,
            d.redelivered)


@settings(max_examples=300, deadline=None)
@given(st.lists(ITEM, max_size=25), st.integers(0, 2**32))
def test_the_fast_path_does_what_the_framed_path_does(items: list[tuple[Any, ...]],
                                                        seed: int) -> None:
    data = stream(items)
    seen: dict[bool, Any] = {}
    for fast in (True, False):
        conn, consumer_side = side(fast)
        sent = b"".join(broker(conn, consumer_side, chunk) for chunk in random_chunks(
            data, random.Random(seed), (1, 7, 64, 900, 5000, 100_000)))
        unacked = {tag: (held.message.raw, view_of(held.view))
                   for tag, held in consumer_side.consumers._chan(1).unacked.items()}
        # The client fails everything on channel 1: the chain is offered every view.
        failures = client(conn, consumer_side, method(B.Nack(delivery_tag=0, multiple=True,
                                                             requeue=True), 1))
        offered = [view_of(d) for f in failures if isinstance(f, Failure)
                   for d in f.settle.deliveries]
        seen[fast] = (sent, unacked, offered)
    assert seen[True] == seen[False]


def test_a_chunk_of_plain_deliveries_is_one_run() -> None:
    data = b"".join(delivery(1, tag, redelivered=False, headers={"a": "b"}, size=5000)
                    for tag in (1, 2, 3))
    done, found, confirms, short = delivery_run(data, own=100)
    assert not short and confirms == 0
    assert done == len(data)
    assert [(f[4], f[5], f[6]) for f in found] == [(1, b"acks", t) for t in (1, 2, 3)]
    conn, consumer_side = side(fast=True)
    events = conn.broker_data(data)
    assert [type(e) for e in events] == [DeliveryRun]
    assert broker(conn, consumer_side, data) == data  # first deliveries: the broker's bytes


def test_a_run_ends_at_a_redelivery_a_partial_message_or_the_bridges_own_channel() -> None:
    plain = delivery(1, 1, redelivered=False, headers=None, size=10)
    again = delivery(1, 2, redelivered=True, headers=None, size=10)
    assert delivery_run(plain + again, own=100) == (len(plain), delivery_run(plain, own=100)[1],
                                                    0, False)
    done, _, _, short = delivery_run(plain + plain[:-1], own=100)
    assert (done, short) == (len(plain), True)  # the rest is held back
    assert delivery_run(plain, own=1) == (0, [], 0, False)
    confirm = method(B.Ack(delivery_tag=9, multiple=True), 1)
    assert delivery_run(confirm + plain + confirm, own=100)[::2] == (2 * len(confirm) + len(plain),
                                                                    2)
    # A delivery whose header table has a key the chain names (on the wire: its length, then
    # its name) ends the run; its body holding the name does not.
    counted = delivery(1, 3, redelivered=False, headers={"x-delivery-count": 2}, size=10)
    named = delivery(1, 4, redelivered=False, headers={"a": "b"}, size=30)
    named = named.replace(b"b" * 30, b"\x10x-delivery-count" + b"b" * 13)
    keys = (b"\x10x-delivery-count",)
    assert delivery_run(plain + counted, own=100, keys=keys)[:2] == (len(plain), [
        delivery_run(plain, own=100)[1][0]])
    assert delivery_run(plain + counted, own=100)[0] == len(plain + counted)
    assert delivery_run(plain + named, own=100, keys=keys)[0] == len(plain + named)


def test_a_delivery_tag_above_32_bits_is_read_whole() -> None:
    """A channel's delivery tags count up past 2**32 on a long-lived consumer."""
    tag = 2**40 + 5
    data = delivery(1, tag, redelivered=False, headers=None, size=10)
    done, found, confirms, short = delivery_run(data, None)
    assert (done, confirms, short) == (len(data), 0, False)
    assert found[0][6] == tag

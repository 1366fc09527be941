"""The AMQP consumer side without a broker: stamping a content header in place, the channel the
bridge keeps for itself, what each settlement covers, and the header table's types carried
through STOMP-shaped headers."""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Any

import pika
import pytest
from pamqp import commands
from pamqp import frame as pframe

from adapters import amqp_types
from adapters.rabbitmq_stomp import amqp_properties, stomp_headers
from bridge.frontends.amqp import Frame, Message, ProxyConnection
from bridge.frontends.amqp.consumers import DROP, Consumers, Failure
from bridge.frontends.amqp.deliveries import delivery_fields, delivery_view, stamped_header
from bridge.frontends.amqp.errors import ReplyCode
from bridge.frontends.amqp.framer import Framer
from bridge.intercept.views import Principal, Settlement
from tests.unit.amqp_wire import HEADER, body, content_header, method

B = commands.Basic
C = commands.Connection
WHO = Principal("guest", "guest", "/")


def frames(data: bytes) -> list[Any]:
    return Framer(expect_header=False, validate=False, frame_max=0).feed(data)


def decode_header(raw: bytes) -> commands.Basic.Properties:
    _, _, header = pframe.unmarshal(raw)
    return header.properties  # type: ignore[no-any-return,attr-defined]


@pytest.mark.parametrize("props", [
    commands.Basic.Properties(),
    commands.Basic.Properties(content_type="text/plain", content_encoding="utf-8",
                              delivery_mode=2, app_id="a"),
    commands.Basic.Properties(content_type="t", headers={"n": 7, "s": "x", "l": [1, "2"]},
                              priority=4, message_id="m"),
    commands.Basic.Properties(headers={"JMSXDeliveryCount": 9, "b": True}),
])
def test_a_stamped_header_keeps_every_other_property_and_entry(
    props: commands.Basic.Properties,
) -> None:
    raw = content_header(1, 3, props)
    out = stamped_header(raw, (("JMSXDeliveryCount", "2"),))
    got = decode_header(out)
    want = {**(props.headers or {}), "JMSXDeliveryCount": 2}
    assert got.headers == want
    for name in ("content_type", "content_encoding", "delivery_mode", "priority",
                 "message_id", "app_id"):
        assert getattr(got, name) == getattr(props, name)
    if props.headers and "JMSXDeliveryCount" not in props.headers:  # the table's own bytes
        old = raw[raw.index(b"\x01n"):raw.index(b"\x01n") + 10]
        assert old in out


def test_a_stamped_header_frame_has_its_new_size() -> None:
    raw = content_header(5, 0, commands.Basic.Properties(headers={"a": "b"}))
    (frame,) = frames(stamped_header(raw, (("JMSXDeliveryCount", "1"),)))
    assert frame.channel == 5 and frame.type == 2


def _deliver(channel: int, tag: int, consumer: str = "ctag", redelivered: bool = False,
             props: commands.Basic.Properties | None = None) -> Message:
    data = (method(B.Deliver(consumer_tag=consumer, delivery_tag=tag, redelivered=redelivered,
                             exchange="", routing_key="q"), channel)
            + content_header(channel, 2, props) + body(channel, b"hi"))
    parts = frames(data)
    return Message(channel, parts[0], parts[1], parts[2:])


def test_a_delivery_view_reads_counts_lazily_and_everything_on_demand() -> None:
    props = commands.Basic.Properties(
        content_type="text/plain", headers={"jms-bridge-delivery-count": "2", "n": 5})
    message = _deliver(1, 9, redelivered=True, props=props)
    assert delivery_fields(message) == (9, True)
    view = delivery_view(message, 1, "orders", *delivery_fields(message))
    assert view.ack_id == "1/9" and view.destination == "/amq/queue/orders"
    assert view.headers.get("x-delivery-count") is None
    assert view.headers["redelivered"] == "true"
    assert view.headers["jms-bridge-delivery-count"] == "2"
    assert dict(view.headers)["content-type"] == "text/plain"
    assert amqp_types.TYPES_HEADER in view.headers  # the int 5 keeps its type on a copy


def _client(data: bytes) -> Frame:
    (frame,) = frames(data)
    return frame  # type: ignore[no-any-return]


def _consuming(tags: range, no_ack: bool = False) -> Consumers:
    consumers = Consumers()
    assert consumers.client_frame(_client(method(B.Consume(queue="q", no_ack=no_ack), 1)),
                                  WHO) is None
    assert consumers.broker_frame(_client(method(B.ConsumeOk(consumer_tag="ctag"), 1)))
    for tag in tags:
        consumers.delivered(_deliver(1, tag))
    return consumers


def test_acks_single_and_multiple_forget_what_they_cover() -> None:
    consumers = _consuming(range(1, 6))
    consumers.client_frame(_client(method(B.Ack(delivery_tag=2), 1)), WHO)
    assert consumers.unsettled() == 4
    consumers.client_frame(_client(method(B.Ack(delivery_tag=4, multiple=True), 1)), WHO)
    assert consumers.unsettled() == 1
    consumers.client_frame(_client(method(B.Ack(delivery_tag=0, multiple=True), 1)), WHO)
    assert consumers.unsettled() == 0


def test_an_auto_ack_consumer_is_not_tracked() -> None:
    assert _consuming(range(1, 4), no_ack=True).unsettled() == 0


def test_a_multiple_nack_with_requeue_is_one_failure_of_every_delivery_up_to_its_tag() -> None:
    consumers = _consuming(range(1, 6))
    consumers.client_frame(_client(method(B.Ack(delivery_tag=1), 1)), WHO)
    found = consumers.client_frame(
        _client(method(B.Nack(delivery_tag=3, multiple=True, requeue=True), 1)), WHO)
    assert isinstance(found, Failure) and found.settle.outcome is Settlement.NACK
    assert [d.ack_id for d in found.settle.deliveries] == ["1/2", "1/3"]
    assert found.then == b"" and found.relay.startswith(b"\x01")


def test_requeue_false_is_relayed_and_forgotten() -> None:
    consumers = _consuming(range(1, 3))
    assert consumers.client_frame(
        _client(method(B.Reject(delivery_tag=1, requeue=False), 1)), WHO) is None
    assert consumers.unsettled() == 1


def test_a_transaction_keeps_requeues_back_until_commit_and_rollback_fails_its_acks() -> None:
    consumers = _consuming(range(1, 4))
    consumers.client_frame(_client(method(commands.Tx.Select(), 1)), WHO)
    assert consumers.client_frame(_client(method(B.Ack(delivery_tag=1), 1)), WHO) is None
    assert consumers.client_frame(
        _client(method(B.Reject(delivery_tag=2, requeue=True), 1)), WHO) is DROP
    commit = consumers.client_frame(_client(method(commands.Tx.Commit(), 1)), WHO)
    assert isinstance(commit, Failure)
    assert [d.ack_id for d in commit.settle.deliveries] == ["1/2"]
    assert commit.then == method(commands.Tx.Commit(), 1)
    consumers.take("1/2")
    assert consumers.unsettled() == 1  # 1 committed, 2 replaced, 3 left
    consumers.client_frame(_client(method(B.Ack(delivery_tag=3), 1)), WHO)
    rollback = consumers.client_frame(_client(method(commands.Tx.Rollback(), 1)), WHO)
    assert isinstance(rollback, Failure) and rollback.settle.outcome is Settlement.ROLLBACK
    assert rollback.before == method(commands.Tx.Rollback(), 1) and rollback.commit == {1}


def test_recover_is_answered_by_the_bridge_and_a_close_loses_everything_unsettled() -> None:
    consumers = _consuming(range(1, 3))
    recover = consumers.client_frame(_client(method(B.Recover(requeue=True), 1)), WHO)
    assert isinstance(recover, Failure) and recover.then == b""
    assert recover.answer == method(B.RecoverOk(), 1)
    close = consumers.client_frame(_client(method(C.Close(200, "bye", 0, 0), 0)), WHO)
    assert isinstance(close, Failure) and close.settle.outcome is Settlement.LOST
    assert close.cancel == [(1, "ctag")] and len(close.settle.deliveries) == 2


def test_the_bridge_answers_to_its_own_commit_are_not_the_clients() -> None:
    consumers = Consumers()
    consumers.tx_sent(1, own=False)
    consumers.tx_sent(1, own=True)
    ok = _client(method(commands.Tx.CommitOk(), 1))
    assert consumers.broker_frame(ok) is True
    assert consumers.broker_frame(ok) is False


def test_the_last_channel_is_kept_for_the_bridge() -> None:
    conn = ProxyConnection(reserve_channel=True)
    tune = method(C.Tune(channel_max=2047, frame_max=131072, heartbeat=60))
    (told,) = conn.broker_data(tune)
    assert pframe.unmarshal(told.raw)[2].channel_max == 2046
    start_ok = method(C.StartOk(client_properties={}, mechanism="PLAIN", response="\0g\0g"))
    events = conn.client_data(HEADER + start_ok + method(C.TuneOk(2046, 131072, 60)))
    assert pframe.unmarshal(events[-1].raw)[2].channel_max == 2047
    assert conn.own_channel == 2047
    conn.client_data(method(C.Open(virtual_host="/")))
    with pytest.raises(Exception) as refused:
        conn.client_data(method(commands.Channel.Open(), 2047))
    assert refused.value.reply_code == ReplyCode.CHANNEL_ERROR  # type: ignore[attr-defined]


TYPED = {"i": 7, "t": True, "f": 1.5, "x": b"\x00raw", "d": decimal.Decimal("2.50"),
         "ts": dt.datetime(2026, 1, 2, tzinfo=dt.UTC), "nested": {"a": 1}, "s": "plain"}


def test_the_types_of_a_header_table_come_back_over_its_strings() -> None:
    carried = amqp_types.encode(TYPED, 1)
    assert carried is not None
    headers = stomp_headers(pika.BasicProperties(headers=TYPED, delivery_mode=1))
    headers[amqp_types.TYPES_HEADER] = carried
    props = amqp_properties(headers)
    assert props.headers == {**TYPED, "f": decimal.Decimal("1.5")}  # pika writes no floats
    assert props.delivery_mode == 1


def test_a_changed_or_removed_entry_stays_as_left_and_staged_copies_keep_the_types() -> None:
    headers = stomp_headers(pika.BasicProperties(headers={"i": 7, "gone": 3, "t": True}))
    headers[amqp_types.TYPES_HEADER] = amqp_types.encode({"i": 7, "gone": 3, "t": True}) or ""
    headers["i"] = "8"
    del headers["gone"]
    props = amqp_properties(headers)
    assert props.headers == {"i": "8", "t": True}
    headers["jms-bridge-target"] = "/amq/queue/q"
    staged = amqp_properties(headers)
    assert amqp_types.TYPES_HEADER in staged.headers


def test_only_tables_a_stomp_view_would_change_carry_their_types() -> None:
    assert amqp_types.encode({"a": "b"}, 2) is None
    assert amqp_types.encode(None, None) is None
    assert amqp_types.decode("not base64!") is None


def test_a_types_header_that_is_not_a_table_reads_as_none_not_an_error() -> None:
    """A client may send a header of that name itself: what is not a base64 table (empty, too
    short for a table's length, not base64) is ignored, never a traceback on release."""
    for text in ("", "AAA=", "AAAAAA==", "QUJD", "1", "not base64!"):
        assert amqp_types.decode(text) is None, text
    headers = {"persistent": "1", amqp_types.TYPES_HEADER: "AAA="}
    assert amqp_properties(headers).delivery_mode is None


def test_content_frames_write_negative_integers_and_doubles_that_pamqp_reads_back() -> None:
    from bridge.frontends.amqp.builders import content_frames

    table = {"neg": -3, "min": -(2**31), "big": -(2**40), "f": 0.1, "d": decimal.Decimal("1.25"),
             "nested": {"l": [-1, "x", None]}, "b": False, "x": b"\x00"}
    props = commands.Basic.Properties(content_type="text/plain", headers=table, priority=1)
    raw = content_frames(3, props, b"", 4096)
    got = decode_header(raw)
    assert got.headers == {**table, "x": bytearray(b"\x00")}
    assert got.content_type == "text/plain" and got.priority == 1


@pytest.mark.parametrize("mandatory", [True, False])
def test_a_written_publish_method_is_what_pamqp_writes(mandatory: bool) -> None:
    from bridge.frontends.amqp.builders import publish_method

    want = method(B.Publish(exchange="ex", routing_key="kéy", mandatory=mandatory), 7)
    assert publish_method(7, "ex", "kéy", mandatory) == want


def test_a_channel_the_bridge_refuses_forgets_its_deliveries() -> None:
    from adapters.rabbitmq import FORMAT
    from bridge.frontends.amqp.settling import ConsumerSide
    from bridge.frontends.relay_stats import AmqpStats
    from bridge.intercept.chain import Chain
    from bridge.intercept.redelivery import RedeliveryInterceptor
    from bridge.staging.levels import layout_for
    from policies.redelivery import PolicyTable

    conn = ProxyConnection(assemble_broker=True)
    chain = Chain([RedeliveryInterceptor(table=PolicyTable(), fmt=FORMAT,
                                         layout=layout_for(FORMAT, "s"))])
    side = ConsumerSide(chain, conn, AmqpStats())
    side.consumers.client_frame(_client(method(B.Consume(queue="q"), 1)), WHO)
    side.consumers.broker_frame(_client(method(B.ConsumeOk(consumer_tag="ctag"), 1)))
    side.broker_event(_deliver(1, 1))
    assert side.consumers.unsettled() == 1
    conn.refuse(1, "MQRC_OPTIONS_ERROR (2046): no")
    assert side.consumers.unsettled() == 0  # the broker has it back: no copy may replace it


def test_without_a_channel_of_its_own_a_failure_goes_to_the_broker_as_sent() -> None:
    import asyncio

    from adapters.rabbitmq import FORMAT
    from bridge.frontends.amqp.settling import ConsumerSide
    from bridge.frontends.relay_stats import AmqpStats
    from bridge.intercept.chain import Chain
    from bridge.intercept.redelivery import RedeliveryInterceptor
    from bridge.staging.levels import layout_for
    from policies.redelivery import PolicyTable

    conn = ProxyConnection(assemble_broker=True, reserve_channel=True)  # never tuned: no channel
    chain = Chain([RedeliveryInterceptor(table=PolicyTable(), fmt=FORMAT,
                                         layout=layout_for(FORMAT, "s"))])
    side = ConsumerSide(chain, conn, AmqpStats())
    sent: list[bytes] = []
    side.attach(sent.append)
    side.consumers.client_frame(_client(method(B.Consume(queue="q"), 1)), WHO)
    side.consumers.broker_frame(_client(method(B.ConsumeOk(consumer_tag="ctag"), 1)))
    side.broker_event(_deliver(1, 1))
    nack = method(B.Nack(delivery_tag=1, requeue=True), 1)
    failure = side.client_frame(_client(nack))
    assert isinstance(failure, Failure)
    assert asyncio.run(side.settle(failure)) == b""
    assert sent == [nack] and side.consumers.unsettled() == 0


@pytest.mark.parametrize("sizes", [(3, 0, 100), (40_000, 3, 70_000), (20_000, 17_000, 5)])
def test_a_run_of_deliveries_is_stamped_header_by_header_and_the_rest_kept(
    sizes: tuple[int, ...],
) -> None:
    """``Stamper.run`` (the fast path's stamping of a run) gives what stamping each content
    header on its own gives, bodies small and large (past the size from which they are not
    copied) and a confirm between two deliveries kept where it was."""
    from bridge.frontends.amqp.fastpath import delivery_run
    from bridge.frontends.amqp.stamping import Stamper

    headers = (("JMSXDeliveryCount", "1"),)
    props = commands.Basic.Properties(content_type="text/plain", headers={"a": "b"})
    pieces = []
    for tag, size in enumerate(sizes, 1):
        pieces.append(method(B.Deliver(consumer_tag="c", delivery_tag=tag, redelivered=False,
                                       exchange="", routing_key="q"), 1)
                      + content_header(1, size, props)
                      + b"".join(body(1, b"z" * min(4088, size - i))
                                 for i in range(0, size, 4088)))
        pieces.append(method(B.Ack(delivery_tag=tag), 1))
    raw = b"".join(pieces)
    done, found, confirms, short = delivery_run(raw, None)
    assert (done, len(found), confirms, short) == (len(raw), len(sizes), len(sizes), False)
    want = raw
    for _, header_at, body_at, *_ in reversed(found):
        want = want[:header_at] + stamped_header(raw[header_at:body_at], headers) + want[body_at:]
    assert Stamper(headers).run(raw, found) == want

"""The per-channel assembler: method + header + bodies -> one Message, in both directions."""

from __future__ import annotations

from typing import Any

import pytest
from pamqp import commands

from bridge.frontends.amqp import AmqpProtocolError, Assembler, Frame, Framer, Message
from bridge.frontends.amqp.assembler import BROKER_CONTENT
from bridge.frontends.amqp.builders import content_frames, publish_frames
from bridge.frontends.amqp.errors import ReplyCode
from tests.unit.amqp_wire import HEARTBEAT, body, content_header, method, publish, raw_frame

PROPS = commands.Basic.Properties(
    content_type="application/json",
    delivery_mode=2,
    message_id="m-1",
    headers={"count": 7, "name": "x", "big": 2**40},
)


def assemble(stream: bytes, assembler: Assembler | None = None, mode: str = "whole") -> list[Any]:
    assembler = assembler or Assembler()
    framer = Framer(expect_header=False, frame_max=0)
    out: list[Any] = []
    chunks = [stream] if mode == "whole" else [stream[i : i + 1] for i in range(len(stream))]
    for chunk in chunks:
        for frame in framer.feed(chunk):
            assert isinstance(frame, Frame)
            event = assembler.receive(frame)
            if event is not None:
                out.append(event)
    return out


@pytest.mark.parametrize("mode", ["whole", "bytewise"])
def test_publish_across_frames(mode: str) -> None:
    data = b"0123456789" * 50
    stream = (
        method(commands.Basic.Publish(exchange="ex", routing_key="rk", mandatory=True), 1)
        + content_header(1, len(data), PROPS)
        + body(1, data[:100]) + body(1, data[100:400]) + body(1, data[400:])
    )
    [message] = assemble(stream, mode=mode)
    assert isinstance(message, Message)
    assert message.channel == 1
    assert message.raw == stream
    assert message.body == data and message.body_size == len(data)
    assert len(message.frames) == 5
    publish_method = message.method
    assert isinstance(publish_method, commands.Basic.Publish)
    assert (publish_method.exchange, publish_method.routing_key, publish_method.mandatory) == (
        "ex", "rk", True)
    assert message.properties.content_type == "application/json"
    assert message.properties.delivery_mode == 2
    assert message.headers == {"count": 7, "name": "x", "big": 2**40}


def test_held_counts_the_bodies_of_messages_in_part() -> None:
    assembler = Assembler()
    one = method(commands.Basic.Publish(routing_key="a"), 1) + content_header(1, 300, PROPS)
    two = method(commands.Basic.Publish(routing_key="b"), 2) + content_header(2, 50, PROPS)
    assert assemble(one + body(1, b"x" * 100) + two + body(2, b"y" * 20), assembler) == []
    assert assembler.held == 120  # what the budget counts for a client
    assemble(body(1, b"x" * 200), assembler)  # channel 1's message is complete: not held
    assert assembler.held == 20
    assembler.forget(2)
    assert assembler.held == 0


def test_empty_body_completes_at_header() -> None:
    [message] = assemble(publish(2, b""))
    assert isinstance(message, Message) and message.body == b"" and message.body_frames == []


def test_channels_interleave() -> None:
    a, b = publish(1, b"aaaa"), publish(2, b"bbbb")
    a_frames, b_frames = split(a), split(b)
    stream = b"".join(x + y for x, y in zip(a_frames, b_frames, strict=True)) + HEARTBEAT
    events = assemble(stream)
    assert [e.channel for e in events[:2]] == [1, 2]
    assert events[0].raw == a and events[1].raw == b
    assert isinstance(events[2], Frame) and events[2].type == 8


def split(stream: bytes) -> list[bytes]:
    out = []
    while stream:
        size = int.from_bytes(stream[3:7], "big") + 8
        out.append(stream[:size])
        stream = stream[size:]
    return out


def test_other_methods_pass_through() -> None:
    stream = method(commands.Basic.Ack(delivery_tag=3), 1) + method(commands.Channel.Open(), 2)
    frames = assemble(stream)
    assert [type(f.method).__name__ for f in frames] == ["Ack", "Open"]


@pytest.mark.parametrize(
    "broker_method",
    [
        commands.Basic.Deliver(consumer_tag="c", delivery_tag=1, exchange="", routing_key="q"),
        commands.Basic.GetOk(delivery_tag=1, exchange="", routing_key="q", message_count=0),
        commands.Basic.Return(reply_code=312, reply_text="NO_ROUTE", exchange="", routing_key="x"),
    ],
)
def test_broker_messages(broker_method: Any) -> None:
    stream = method(broker_method, 5) + content_frames(5, PROPS, b"payload", 4096)
    [message] = assemble(stream, Assembler(BROKER_CONTENT))
    assert type(message.method) is type(broker_method)
    assert message.body == b"payload" and message.raw == stream
    assert message.headers["count"] == 7


def test_publish_from_broker_is_not_content() -> None:
    with pytest.raises(AmqpProtocolError) as info:
        assemble(publish(1, b"x"), Assembler(BROKER_CONTENT))
    assert info.value.reply_code == ReplyCode.UNEXPECTED_FRAME


PUBLISH_1 = method(commands.Basic.Publish(routing_key="q"), 1)
UNEXPECTED = [
    ("body-without-header", PUBLISH_1 + body(1, b"x")),
    ("body-without-method", body(1, b"x")),
    ("header-without-publish", content_header(1, 1)),
    ("method-instead-of-header", PUBLISH_1 + method(commands.Basic.Ack(), 1)),
    ("method-instead-of-body", PUBLISH_1 + content_header(1, 3) + method(commands.Basic.Ack(), 1)),
    ("second-header", PUBLISH_1 + content_header(1, 3) + content_header(1, 3)),
    ("body-beyond-size", PUBLISH_1 + content_header(1, 3) + body(1, b"abcd")),
    ("header-on-channel-0", content_header(0, 3)),
    ("body-on-channel-0", body(0, b"x")),
    ("publish-on-channel-0", publish(0, b"x")),
    ("header-of-other-class",
     PUBLISH_1 + raw_frame(2, 1, b"\x00\x32" + content_header(1, 1)[9:-1])),
]


@pytest.mark.parametrize(("name", "stream"), UNEXPECTED, ids=[u[0] for u in UNEXPECTED])
def test_unexpected_frames(name: str, stream: bytes) -> None:
    with pytest.raises(AmqpProtocolError) as info:
        assemble(stream)
    assert info.value.reply_code == ReplyCode.UNEXPECTED_FRAME
    assert info.value.channel == 0  # a connection error


def test_body_above_the_cap_is_a_channel_error() -> None:
    assembler = Assembler(max_body_size=10)
    assemble(publish(1, b"x" * 10), assembler)
    with pytest.raises(AmqpProtocolError) as info:
        assemble(PUBLISH_1 + content_header(1, 11), assembler)
    exc = info.value
    assert (exc.reply_code, exc.channel, exc.class_id, exc.method_id) == (406, 1, 60, 40)
    assert exc.reply_text == "message size 11 is larger than configured max size 10"
    assert not assembler.pending(1)


def test_default_cap_is_rabbitmq_maximum() -> None:
    assembler = Assembler()
    with pytest.raises(AmqpProtocolError) as info:
        assemble(PUBLISH_1 + content_header(1, 128 * 1024 * 1024 + 1), assembler)
    assert info.value.reply_code == 406
    assemble(PUBLISH_1 + content_header(1, 128 * 1024 * 1024), assembler)
    assert assembler.pending(1)


def test_bad_properties_are_502_when_read() -> None:
    """From the broker (not validated on arrival): when read. A client's: see test_fuzz_targets."""
    bad_header = raw_frame(2, 1, b"\x00\x3c\x00\x00" + (1).to_bytes(8, "big") + b"\x80\x00")
    assembler = Assembler()
    framer = Framer(expect_header=False, validate=False, frame_max=0)
    events = [assembler.receive(f) for f in framer.feed(PUBLISH_1 + bad_header + body(1, b"x"))]
    message = events[-1]
    assert isinstance(message, Message)  # content-type flag, no value
    with pytest.raises(AmqpProtocolError) as info:
        message.properties  # noqa: B018
    assert info.value.reply_code == ReplyCode.SYNTAX_ERROR


@pytest.mark.parametrize("frame_max", [4096, 131072, 0])
def test_publish_frames_round_trip(frame_max: int) -> None:
    data = bytes(range(256)) * 1000
    built = publish_frames(
        3, commands.Basic.Publish(exchange="e", routing_key="r"), PROPS, data, frame_max
    )
    sizes = [len(f) for f in split(built)]
    assert max(sizes) <= (frame_max or 131072)
    [message] = assemble(built)
    assert message.body == data and message.headers == PROPS.headers
    assert message.method.routing_key == "r"


def test_publish_frames_refuse_bad_arguments() -> None:
    with pytest.raises(ValueError):
        publish_frames(0, commands.Basic.Publish(), PROPS, b"x", 4096)
    with pytest.raises(ValueError):
        content_frames(1, PROPS, b"x", 8)

"""ProxyConnection: the handshake's state table, frame_max from Tune-Ok, publishes offered
whole, and a refused publish closing its channel on both sides."""

from __future__ import annotations

from typing import Any

import pytest
from pamqp import commands
from pamqp import frame as pframe

from bridge.frontends.amqp import (
    AmqpProtocolError,
    Answer,
    Forward,
    Frame,
    Message,
    ProtocolHeader,
    ProxyConnection,
    State,
)
from bridge.frontends.amqp.connection import CLIENT_TRANSITIONS
from bridge.frontends.amqp.errors import ReplyCode
from tests.unit.amqp_wire import HEADER, HEARTBEAT, body, method, publish

C = commands.Connection
START_OK = method(C.StartOk(client_properties={}, mechanism="PLAIN", response="\0g\0g"))
TUNE_OK = method(C.TuneOk(channel_max=2047, frame_max=8192, heartbeat=30))
OPEN = method(C.Open(virtual_host="/"))
HANDSHAKE = HEADER + START_OK + TUNE_OK + OPEN


def opened() -> ProxyConnection:
    conn = ProxyConnection()
    conn.client_data(HANDSHAKE + method(commands.Channel.Open(), 1))
    return conn


def decoded(raw: bytes) -> tuple[int, Any]:
    _, channel, value = pframe.unmarshal(raw)
    return channel, value


def test_handshake_relayed_and_tuned() -> None:
    conn = ProxyConnection()
    events = conn.client_data(HANDSHAKE)
    assert isinstance(events[0], ProtocolHeader)
    assert b"".join(e.raw for e in events) == HANDSHAKE
    assert conn.state is State.OPEN
    assert (conn.frame_max, conn.heartbeat) == (8192, 30)


def test_tuned_frame_max_is_enforced() -> None:
    conn = opened()
    conn.client_data(publish(1, b"x" * 8184))  # a body frame of exactly 8192 bytes
    with pytest.raises(AmqpProtocolError) as info:
        conn.client_data(publish(1, b"x" * 8185))
    assert info.value.reply_code == ReplyCode.FRAME_ERROR
    assert len(info.value.events) == 0  # the method and header were held, not relayed


def test_publish_offered_whole_and_heartbeats_pass() -> None:
    conn = opened()
    data = publish(1, b"abc", commands.Basic.Properties(headers={"n": 1}))
    events = conn.client_data(HEARTBEAT + data[:20])
    assert [type(e) for e in events] == [Frame]
    [message] = conn.client_data(data[20:])
    assert isinstance(message, Message) and message.raw == data and message.headers == {"n": 1}


@pytest.mark.parametrize(
    ("stream", "code"),
    [
        (HEADER + START_OK + OPEN + OPEN, ReplyCode.COMMAND_INVALID),
        (HEADER + START_OK + method(C.CloseOk()), ReplyCode.COMMAND_INVALID),
        (HANDSHAKE + TUNE_OK, ReplyCode.COMMAND_INVALID),
        (HEADER + START_OK + method(commands.Channel.Open(), 1), ReplyCode.UNEXPECTED_FRAME),
        (HANDSHAKE + method(commands.Basic.Qos(), 0), ReplyCode.COMMAND_INVALID),
        (HANDSHAKE + publish(0, b"x"), ReplyCode.UNEXPECTED_FRAME),
        (HANDSHAKE + body(1, b"x"), ReplyCode.UNEXPECTED_FRAME),
    ],
    ids=["open-twice", "close-ok-unasked", "tune-after-open", "channel-before-open",
         "basic-on-channel-0", "publish-on-channel-0", "body-without-header"],
)
def test_state_table_errors(stream: bytes, code: int) -> None:
    with pytest.raises(AmqpProtocolError) as info:
        ProxyConnection().client_data(stream)
    assert info.value.reply_code == code
    assert info.value.events  # what came before the fault, to be relayed
    _, close = decoded(info.value.close_frame())
    assert close.reply_code == code


def test_every_transition_is_in_the_table() -> None:
    assert (State.OPEN, C.Open.index) not in CLIENT_TRANSITIONS
    assert CLIENT_TRANSITIONS[(State.HANDSHAKE, C.Open.index)] is State.OPEN


def test_close_handshake_both_ways() -> None:
    conn = opened()
    conn.client_data(method(C.Close(200, "bye", 0, 0)))
    assert conn.state is State.CLOSING
    conn.broker_data(method(C.CloseOk()))
    assert conn.state.value == "closed"
    other = opened()
    other.broker_data(method(C.Close(320, "CONNECTION_FORCED", 0, 0)))
    assert other.state is State.CLOSING
    other.client_data(method(C.CloseOk()))
    assert other.state.value == "closed"


def test_a_client_gone_without_closing_gets_its_connection_closed_once() -> None:
    conn = opened()
    close = conn.close_upstream("the client went away")
    assert close is not None
    channel, sent = decoded(close)
    assert (channel, type(sent), sent.reply_code, sent.reply_text) == (
        0, C.Close, 200, "the client went away")
    assert conn.state is State.CLOSING
    assert conn.close_upstream("again") is None  # already closing: nothing more goes up
    conn.broker_data(method(C.CloseOk()))
    assert conn.state is State.CLOSED
    assert ProxyConnection().close_upstream("mid-handshake") is None


def test_refusal_closes_the_channel_on_both_sides() -> None:
    conn = opened()
    [message] = conn.client_data(publish(1, b"delayed"))
    assert isinstance(message, Message)
    to_client, to_broker = conn.refuse(1, "MQRC_EXPIRY_ERROR (2013): ttl shorter than delay")
    assert isinstance(to_client, Answer) and isinstance(to_broker, Forward)
    channel, close = decoded(to_client.raw)
    assert (channel, close.reply_code, close.class_id, close.method_id) == (1, 406, 60, 40)
    assert close.reply_text.startswith("MQRC_EXPIRY_ERROR")
    assert decoded(to_broker.raw)[1].reply_code == 200
    # The client's frames still in flight on channel 1 are dropped, other channels pass.
    assert conn.client_data(publish(1, b"more")) == []
    ok = method(commands.Basic.Qos(prefetch_count=1), 2)
    assert [e.raw for e in conn.client_data(ok)] == [ok]
    # The broker's frames on channel 1 are dropped until its Close-Ok, which is swallowed.
    assert conn.broker_data(method(commands.Basic.Ack(delivery_tag=1), 1)) == []
    assert conn.broker_data(method(commands.Channel.CloseOk(), 1)) == []
    assert conn.client_data(method(commands.Channel.CloseOk(), 1)) == []
    assert not conn.closing(1)
    # The client reopens the channel: relayed again both ways.
    reopen = method(commands.Channel.Open(), 1)
    assert [e.raw for e in conn.client_data(reopen)] == [reopen]
    open_ok = method(commands.Channel.OpenOk(), 1)
    assert [e.raw for e in conn.broker_data(open_ok)] == [open_ok]


def test_refusal_crossing_a_close_from_each_side() -> None:
    conn = opened()
    conn.refuse(1, "MQRC_OPTIONS_ERROR (2046): grouped")
    assert conn.refuse(1, "again") == []
    [answer] = conn.client_data(method(commands.Channel.Close(200, "", 0, 0), 1))
    assert isinstance(answer, Answer)
    assert isinstance(decoded(answer.raw)[1], commands.Channel.CloseOk)
    [answer] = conn.broker_data(method(commands.Channel.Close(404, "NOT_FOUND", 60, 40), 1))
    assert isinstance(answer, Answer)
    assert conn.broker_data(method(commands.Channel.CloseOk(), 1)) == []
    assert not conn.closing(1)


def test_body_above_the_cap_refuses_the_channel() -> None:
    conn = ProxyConnection(max_body_size=100)
    conn.client_data(HANDSHAKE + method(commands.Channel.Open(), 1))
    events = conn.client_data(publish(1, b"x" * 101) + HEARTBEAT)
    assert [type(e) for e in events] == [Answer, Forward, Frame]
    close = decoded(events[0].raw)[1]
    assert close.reply_code == 406
    assert "message size 101 is larger than configured max size 100" in close.reply_text


def test_broker_side_frames_and_deliveries() -> None:
    conn = ProxyConnection(assemble_broker=True)
    conn.client_data(HANDSHAKE)
    deliver = method(commands.Basic.Deliver("c", 1, False, "", "q"), 1)
    stream = deliver + pframe.marshal(commands.Basic.Ack(), 2)
    events = conn.broker_data(stream)
    assert [type(e) for e in events] == [Frame]
    assert conn.broker_data(b"") == []


def test_refuse_needs_a_channel() -> None:
    with pytest.raises(ValueError):
        opened().refuse(0, "x")


def test_a_channel_reopened_before_the_broker_closed_it_waits_for_the_broker() -> None:
    conn = opened()
    conn.client_data(publish(1, b"refused"))
    conn.refuse(1, "MQRC_NOT_AUTHORIZED (2035): staging queue")
    assert conn.client_data(method(commands.Channel.CloseOk(), 1)) == []
    reopen = method(commands.Channel.Open(), 1)
    assert conn.client_data(reopen) == []  # RabbitMQ has not closed channel 1 yet
    [released] = conn.broker_data(method(commands.Channel.CloseOk(), 1))
    assert isinstance(released, Answer) and released.raw == reopen  # goes up now
    assert not conn.closing(1)

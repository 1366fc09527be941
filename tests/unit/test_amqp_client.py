"""The adapter's own AMQP client without a broker: its handshake, a batch's bytes (those pika
writes for the same publishes and acks), the broker's answers and deliveries whole, byte by byte
and with trailing data, its closes, and garbage (parsed or a ClientProtocolError, nothing
else)."""

from __future__ import annotations

import copy
import random
import struct
from typing import Any

import pika
import pika.frame
import pika.spec
import pytest
from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader

from adapters.amqp_client import (
    PROTOCOL_HEADER,
    ClientChannel,
    ClientProtocolError,
    State,
    ack_frame,
    publish_frames,
)
from adapters.amqp_events import (
    Blocked,
    CancelOk,
    ChannelClosed,
    Committed,
    ConnectionClosed,
    ConsumeOk,
    DeclareOk,
    Delivery,
    GetEmpty,
    Got,
    Publish,
    QosOk,
    Ready,
    Returned,
    Unblocked,
)
from adapters.rabbitmq_client import decoded, encoded
from tests.unit.amqp_wire import HEARTBEAT, body, chunked, content_header, method, raw_frame

FRAME_MAX = 4096


def frames(data: bytes) -> list[tuple[int, Any]]:
    """Every frame in ``data``: (channel, what pamqp reads)."""
    out = []
    while data:
        used, channel, value = pframe.unmarshal(data)
        out.append((channel, value))
        data = data[used:]
    return out


def feed(proto: ClientChannel, data: bytes, mode: str = "whole") -> list[Any]:
    events: list[Any] = []
    for chunk in chunked(data, mode):
        events += proto.receive_data(chunk)
    return events


def ready(frame_max: int = FRAME_MAX, *, transactional: bool = True) -> ClientChannel:
    proto = ClientChannel(virtual_host="/v", mechanism="PLAIN", response="\0u\0p",
                          client_properties={"product": "t"}, frame_max=131072,
                          transactional=transactional)
    proto.data_to_send()
    assert feed(proto, method(commands.Connection.Start(mechanisms="AMQPLAIN PLAIN"))
                + method(commands.Connection.Tune(2047, frame_max, 60))
                + method(commands.Connection.OpenOk())
                + method(commands.Channel.OpenOk(), 1)
                + (method(commands.Tx.SelectOk(), 1) if transactional else b"")) == [Ready()]
    proto.data_to_send()
    return proto


@pytest.mark.parametrize("mode", ["whole", "bytewise"])
def test_the_handshake_runs_by_itself_to_ready(mode: str) -> None:
    proto = ClientChannel(virtual_host="/v", mechanism="PLAIN", response="\0u\0p",
                          client_properties={"product": "t"}, frame_max=131072)
    assert proto.data_to_send() == PROTOCOL_HEADER
    assert feed(proto, method(commands.Connection.Start(mechanisms="PLAIN")), mode) == []
    (_, start_ok), = frames(proto.data_to_send())
    assert isinstance(start_ok, commands.Connection.StartOk)
    assert (start_ok.mechanism, start_ok.response) == ("PLAIN", "\0u\0p")
    assert feed(proto, method(commands.Connection.Tune(2047, 8192, 60)), mode) == []
    (_, tune_ok), (_, open_) = frames(proto.data_to_send())
    # the smaller frame size; no heart-beats (the socket waits for each answer itself)
    assert (tune_ok.channel_max, tune_ok.frame_max, tune_ok.heartbeat) == (2047, 8192, 0)
    assert open_.virtual_host == "/v"
    assert feed(proto, method(commands.Connection.OpenOk()), mode) == []
    assert [(c, type(v)) for c, v in frames(proto.data_to_send())] == [
        (1, commands.Channel.Open)]
    assert feed(proto, method(commands.Channel.OpenOk(), 1), mode) == []
    assert [(c, type(v)) for c, v in frames(proto.data_to_send())] == [(1, commands.Tx.Select)]
    assert feed(proto, method(commands.Tx.SelectOk(), 1), mode) == [Ready()]
    assert proto.state is State.READY and proto.frame_max == 8192


def test_a_mechanism_the_broker_does_not_offer_is_a_protocol_error() -> None:
    proto = ClientChannel(virtual_host="/", mechanism="EXTERNAL", response="",
                          client_properties={}, frame_max=0)
    with pytest.raises(ClientProtocolError, match="does not offer EXTERNAL"):
        feed(proto, method(commands.Connection.Start(mechanisms="PLAIN AMQPLAIN")))


def pika_bytes(channel: int, exchange: str, key: str, props: pika.BasicProperties,
               data: bytes, mandatory: bool, frame_max: int) -> bytes:
    """What pika writes for the same publish (pika.channel.Channel.basic_publish's frames)."""
    out = [pika.frame.Method(channel, pika.spec.Basic.Publish(
        exchange=exchange, routing_key=key, mandatory=mandatory)).marshal(),
        pika.frame.Header(channel, len(data), props).marshal()]
    step = frame_max - 8
    out += [pika.frame.Body(channel, data[i:i + step]).marshal()
            for i in range(0, len(data), step)]
    return b"".join(out)


PROPS = [
    pika.BasicProperties(),
    pika.BasicProperties(delivery_mode=2, content_type="text/plain", message_id="m-1",
                         priority=4, timestamp=1_700_000_000, expiration="5000",
                         headers={"n": 5, "big": 2**40, "b": True, "s": "é", "raw": b"\x00\x01",
                                  "table": {"x": [1, "two"]}, "none": None}),
]


@pytest.mark.parametrize("props", PROPS)
@pytest.mark.parametrize("size", [0, 1, FRAME_MAX - 8, FRAME_MAX - 7, 3 * FRAME_MAX])
@pytest.mark.parametrize("mandatory", [False, True])
def test_a_publish_is_the_bytes_pika_writes(props: pika.BasicProperties, size: int,
                                            mandatory: bool) -> None:
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    ours = b"".join(publish_frames(1, "amq.topic", "a.b/ç", encoded(props), data,
                                   mandatory=mandatory, frame_max=FRAME_MAX))
    assert ours == pika_bytes(1, "amq.topic", "a.b/ç", props, data, mandatory, FRAME_MAX)


def test_a_batch_is_its_publishes_its_acks_then_the_commit() -> None:
    proto = ready()
    props = encoded(pika.BasicProperties(delivery_mode=2))
    proto.commit([Publish("", "q1", props, b"one", False),
                  Publish("x", "k", props, b"two" * 2000, True)], acks=[7, 9])
    assert proto.state is State.WAITING
    data = proto.data_to_send()
    got = frames(data)
    assert [type(v).__name__ for _, v in got] == [
        "Publish", "ContentHeader", "ContentBody",
        "Publish", "ContentHeader", "ContentBody", "ContentBody", "Ack", "Ack", "Commit"]
    assert {c for c, _ in got} == {1}
    assert (got[3][1].exchange, got[3][1].routing_key, got[3][1].mandatory) == ("x", "k", True)
    assert got[4][1].body_size == 6000 and got[4][1].properties.delivery_mode == 2
    assert got[5][1].value + got[6][1].value == b"two" * 2000
    assert [(v.delivery_tag, v.multiple) for _, v in got[7:9]] == [(7, False), (9, False)]
    assert ack_frame(1, 7) == pika.frame.Method(1, pika.spec.Basic.Ack(7)).marshal()
    assert feed(proto, method(commands.Tx.CommitOk(), 1)) == [Committed()]
    assert proto.state is State.READY


def test_a_publish_that_cannot_be_written_queues_nothing() -> None:
    proto = ready()
    with pytest.raises(ValueError, match="255 bytes"):
        proto.commit([Publish("", "q", b"\x00\x00", b"ok", False),
                       Publish("", "q" * 256, b"\x00\x00", b"too long a key", False)])
    assert proto.state is State.READY and proto.data_to_send() == b""
    with pytest.raises(ValueError, match="properties"):
        proto.commit([Publish("", "q", b"\x00" * FRAME_MAX, b"", False)])
    with pytest.raises(RuntimeError, match="cannot open the channel"):
        proto.open_channel()
    with pytest.raises(RuntimeError, match="not in transaction mode"):
        ready(transactional=False).commit([])


def returned(code: int, key: str, data: bytes, pieces: int = 1) -> bytes:
    step = max(1, -(-len(data) // pieces))
    return (method(commands.Basic.Return(code, "NO_ROUTE", "", key), 1)
            + content_header(1, len(data))
            + b"".join(body(1, data[i:i + step]) for i in range(0, len(data), step)))


@pytest.mark.parametrize("mode", ["whole", "bytewise"])
def test_returns_come_before_the_commit_ok(mode: str) -> None:
    proto = ready()
    proto.commit([Publish("", "gone", b"\x00\x00", b"x" * 5000, True),
                  Publish("", "gone2", b"\x00\x00", b"", True)])
    proto.data_to_send()
    answer = (HEARTBEAT + returned(312, "gone", b"x" * 5000, pieces=3)
              + returned(312, "gone2", b"") + method(commands.Tx.CommitOk(), 1))
    assert feed(proto, answer, mode) == [
        Returned(312, "NO_ROUTE", "", "gone", b"x" * 5000),
        Returned(312, "NO_ROUTE", "", "gone2", b""),
        Committed(),
    ]
    assert proto.state is State.READY


def test_trailing_bytes_wait_for_the_rest_of_their_frame() -> None:
    proto = ready()
    proto.commit([])
    commit_ok = method(commands.Tx.CommitOk(), 1)
    blocked = method(commands.Connection.Blocked("low on memory"))
    assert proto.receive_data(commit_ok + blocked[:5]) == [Committed()]
    assert proto.receive_data(blocked[5:] + method(commands.Connection.Unblocked())) == [
        Blocked("low on memory"), Unblocked()]


def test_a_channel_closed_by_the_broker_is_answered_and_opens_again() -> None:
    proto = ready()
    proto.commit([Publish("nope", "k", b"\x00\x00", b"", False)])
    proto.data_to_send()
    close = commands.Channel.Close(404, "NOT_FOUND - no exchange 'nope'", 60, 40)
    assert feed(proto, method(close, 1)) == [ChannelClosed(404, "NOT_FOUND - no exchange 'nope'")]
    assert [type(v) for _, v in frames(proto.data_to_send())] == [commands.Channel.CloseOk]
    assert proto.state is State.CHANNEL_CLOSED
    with pytest.raises(RuntimeError):
        proto.commit([])
    proto.open_channel()
    assert [type(v) for _, v in frames(proto.data_to_send())] == [commands.Channel.Open]
    assert feed(proto, method(commands.Channel.OpenOk(), 1)) == []
    assert [type(v) for _, v in frames(proto.data_to_send())] == [commands.Tx.Select]
    assert feed(proto, method(commands.Tx.SelectOk(), 1)) == [Ready()]


def test_a_connection_closed_by_the_broker_is_answered() -> None:
    proto = ready()
    close = commands.Connection.Close(320, "CONNECTION_FORCED - shutdown", 0, 0)
    assert feed(proto, method(close)) == [ConnectionClosed(320, "CONNECTION_FORCED - shutdown")]
    assert [type(v) for _, v in frames(proto.data_to_send())] == [commands.Connection.CloseOk]
    assert proto.closed
    assert feed(proto, method(commands.Tx.CommitOk(), 1)) == []  # nothing after it counts


def test_our_close_ends_at_its_close_ok() -> None:
    proto = ready()
    proto.close()
    assert [type(v) for _, v in frames(proto.data_to_send())] == [commands.Connection.Close]
    assert feed(proto, method(commands.Tx.CommitOk(), 1)) == []  # in flight: dropped
    assert feed(proto, method(commands.Connection.CloseOk())) == [
        ConnectionClosed(200, "closed by the client")]
    assert proto.closed


def test_an_authentication_failure_is_the_brokers_close() -> None:
    proto = ClientChannel(virtual_host="/", mechanism="PLAIN", response="\0u\0bad",
                          client_properties={}, frame_max=0)
    refused = commands.Connection.Close(403, "ACCESS_REFUSED - Login was refused", 0, 0)
    assert feed(proto, method(commands.Connection.Start(mechanisms="PLAIN"))
                + method(refused)) == [ConnectionClosed(403, "ACCESS_REFUSED - Login was refused")]


@pytest.mark.parametrize(("data", "code"), [
    (method(commands.Basic.GetOk(1, False, "", "q", 0), 1), 505),  # no Get asked
    (method(commands.Basic.QosOk(), 1), 505),  # nothing asked
    (method(commands.Tx.CommitOk(), 1), 505),  # nothing to commit
    (method(commands.Tx.SelectOk(), 2), 505),  # another channel
    (content_header(1, 3), 505),  # content without a Basic.Return
    (raw_frame(1, 1, b"\x00\x5a\x00\x15", end=0x00), 501),  # no frame-end octet
    (raw_frame(1, 0, b"\x00" * (FRAME_MAX + 1)), 501),  # over the frame size agreed
    (raw_frame(1, 1, b"\x00\x5a\x00"), 501),  # does not decode
    (method(commands.Basic.Return(312, "NO_ROUTE", "", "k"), 1) + method(
        commands.Tx.CommitOk(), 1), 505),  # a return cut short
    (method(commands.Basic.Return(312, "NO_ROUTE", "", "k"), 1) + content_header(1, 1)
     + body(1, b"ab"), 501),  # longer than its header said
])
def test_frames_this_client_cannot_take_are_protocol_errors(data: bytes, code: int) -> None:
    proto = ready()
    with pytest.raises(ClientProtocolError) as error:
        feed(proto, data)
    assert error.value.reply_code == code


def pika_method(channel: int, value: Any) -> bytes:
    return pika.frame.Method(channel, value).marshal()


def test_requests_are_the_bytes_pika_writes() -> None:
    proto = ready()
    odd = "a/b é:x"  # a name pamqp would refuse and RabbitMQ takes
    for call, expected in [
        (lambda: proto.declare_passive(odd), pika.spec.Queue.Declare(queue=odd, passive=True)),
        (lambda: proto.qos(65535, global_qos=True),
         pika.spec.Basic.Qos(prefetch_count=65535, global_qos=True)),
        (lambda: proto.consume(odd), pika.spec.Basic.Consume(queue=odd)),
        (lambda: proto.cancel("ctag-1"), pika.spec.Basic.Cancel(consumer_tag="ctag-1")),
        (lambda: proto.get(odd), pika.spec.Basic.Get(queue=odd)),
    ]:
        proto.state = State.READY  # each answered below, in its own test
        call()
        assert proto.data_to_send() == pika_method(1, expected)
        assert proto.state is State.WAITING
        with pytest.raises(RuntimeError, match="awaiting the answer"):
            proto.get(odd)


PROPS = pika.BasicProperties(message_id="m", headers={"x-death": [{"count": 2, "queue": "q"}],
                                                      "n": 1})


def deliver(tag: int, data: bytes, pieces: int = 1) -> bytes:
    step = max(1, -(-len(data) // pieces))
    return (method(commands.Basic.Deliver("ctag", tag, False, "", "q"), 1)
            + pika.frame.Header(1, len(data), PROPS).marshal()
            + b"".join(body(1, data[i:i + step]) for i in range(0, len(data), step)))


@pytest.mark.parametrize("mode", ["whole", "bytewise"])
def test_a_consumers_deliveries_come_with_the_answers_awaited(mode: str) -> None:
    proto = ready()
    proto.declare_passive("q")
    proto.data_to_send()
    assert feed(proto, method(commands.Queue.DeclareOk("q", 5, 0), 1), mode) == [
        DeclareOk("q", 5, 0)]
    proto.consume("q")
    assert feed(proto, method(commands.Basic.ConsumeOk("ctag"), 1) + deliver(1, b"a"),
                mode) == [ConsumeOk("ctag"), Delivery(1, False, "", "q", encoded(PROPS), b"a",
                                                      "ctag")]
    proto.commit([], acks=[1])
    got = feed(proto, deliver(2, b"b" * 9000, pieces=3) + method(commands.Tx.CommitOk(), 1)
               + deliver(3, b""), mode)
    assert [type(e) for e in got] == [Delivery, Committed, Delivery]
    assert got[0].body == b"b" * 9000 and got[2].body == b"" and got[2].delivery_tag == 3
    props = decoded(got[0].properties)
    assert (props.message_id, props.headers) == ("m", PROPS.headers)
    proto.qos(2000, global_qos=True)
    assert feed(proto, method(commands.Basic.QosOk(), 1), mode) == [QosOk()]
    proto.cancel("ctag")
    assert feed(proto, deliver(4, b"d") + method(commands.Basic.CancelOk("ctag"), 1),
                mode)[1:] == [CancelOk("ctag")]
    proto.get("q")
    get_ok = (method(commands.Basic.GetOk(5, True, "", "q", 0), 1)
              + pika.frame.Header(1, 1, PROPS).marshal() + body(1, b"e"))
    assert feed(proto, get_ok, mode) == [Got(5, True, "", "q", encoded(PROPS), b"e")]
    assert proto.state is State.READY
    proto.get("q")
    assert feed(proto, method(commands.Basic.GetEmpty(), 1), mode) == [GetEmpty()]
    assert proto.state is State.READY


def test_a_channel_without_transactions_is_ready_when_open() -> None:
    proto = ready(transactional=False)
    assert proto.state is State.READY and not proto.transactional


def test_garbage_is_parsed_or_a_protocol_error() -> None:
    rng = random.Random(7)
    good = (returned(312, "k", b"abc") + method(commands.Tx.CommitOk(), 1)
            + method(commands.Connection.Blocked("x")))
    for _ in range(2000):
        data = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        proto = ready()
        proto.commit([])
        try:
            feed(proto, bytes(data[:rng.randint(0, len(data))]))
        except ClientProtocolError:
            pass


def test_garbage_methods_are_parsed_or_a_protocol_error() -> None:
    rng = random.Random(3)
    ids = [(10, 10), (10, 30), (10, 50), (10, 60), (20, 40), (20, 41), (90, 21), (60, 50),
           (60, 60), (99, 99)]
    for _ in range(3000):
        payload = struct.pack(">HH", *rng.choice(ids)) + rng.randbytes(rng.randint(0, 60))
        proto = ready()
        proto.commit([])
        try:
            feed(proto, raw_frame(1, rng.choice([0, 1]), payload))
        except ClientProtocolError:
            pass


def test_a_content_header_decodes_as_pamqp_reads_it() -> None:
    props = pika.BasicProperties(content_type="a/b", headers={"k": "v", "n": 7})
    head = struct.pack(">HHQ", 60, 0, 3) + encoded(props)
    value = pheader.ContentHeader()
    value.unmarshal(head)
    assert value.properties.content_type == "a/b"
    assert value.properties.headers == {"k": "v", "n": 7}


@pytest.mark.parametrize("args", [("ctag", 1, False, "", "q"),
                                  ("amq.ctag-\u00e9x", 2**64 - 1, True, "amq.topic", "a.b\u00e9"),
                                  ("", 7, True, "x" * 255, "k" * 255)])
def test_a_deliver_reads_as_pika_writes_it(args: tuple[Any, ...]) -> None:
    proto = ready()
    head = pika.frame.Header(1, 1, PROPS).marshal() + body(1, b"z")
    deliver = pika.frame.Method(1, pika.spec.Basic.Deliver(*args)).marshal()
    (got,) = feed(proto, deliver + head)
    tag, delivery_tag, redelivered, exchange, key = args
    assert got == Delivery(delivery_tag, redelivered, exchange, key, encoded(PROPS), b"z", tag)


@pytest.mark.parametrize("cut", [1, 5, 13])
def test_a_deliver_whose_arguments_do_not_fit_its_frame_is_a_protocol_error(cut: int) -> None:
    payload = method(commands.Basic.Deliver("ctag", 1, False, "ex", "q"), 1)[7:-1]
    for bad in (payload[:-cut], payload + b"\x00" * cut):
        proto = ready()
        with pytest.raises(ClientProtocolError, match="Basic.Deliver"):
            feed(proto, raw_frame(1, 1, bad))


def test_acks_and_nacks_are_written_as_pika_writes_them() -> None:
    proto = ready(transactional=False)
    proto.ack(5)
    proto.ack(9, multiple=True)
    proto.nack(7)
    proto.nack(8, requeue=False)
    assert proto.data_to_send() == b"".join(
        pika.frame.Method(1, m).marshal() for m in (
            pika.spec.Basic.Ack(5), pika.spec.Basic.Ack(9, multiple=True),
            pika.spec.Basic.Nack(7, requeue=True), pika.spec.Basic.Nack(8, requeue=False)))


def channel_deliver(channel: int, tag: int, data: bytes) -> list[bytes]:
    """A Basic.Deliver on ``channel``: its method, header and body frames, apart."""
    return [method(commands.Basic.Deliver(f"ctag{channel}", tag, False, "", "q"), channel),
            pika.frame.Header(channel, len(data), PROPS).marshal(), body(channel, data)]


@pytest.mark.parametrize("mode", ["whole", "bytewise"])
def test_consumers_on_channels_of_their_own_take_deliveries_interleaved(mode: str) -> None:
    proto = ready(transactional=False)
    two = proto.add_channel()
    assert two == 2 and kinds(proto.data_to_send()) == [(2, commands.Channel.Open)]
    with pytest.raises(RuntimeError, match="cannot consume"):
        proto.consume("q", channel=2)
    assert feed(proto, method(commands.Channel.OpenOk(), 2), mode) == [Ready()]
    proto.qos(10, channel=2)
    [(channel, qos)] = frames(proto.data_to_send())
    assert (channel, qos.prefetch_count, qos.global_) == (2, 10, False)
    with pytest.raises(ClientProtocolError):  # the answer on another channel
        feed(copy_of(proto), method(commands.Basic.QosOk(), 1))
    assert feed(proto, method(commands.Basic.QosOk(), 2), mode) == [QosOk()]
    assert proto.add_channel() == 3
    assert feed(proto, method(commands.Channel.OpenOk(), 3), mode) == [Ready()]
    # Frames of deliveries on two channels interleaved (the protocol allows it between
    # channels): each message is whole, with the channel it came on.
    on2, on3 = channel_deliver(2, 1, b"two"), channel_deliver(3, 1, b"three")
    got = feed(proto, b"".join(f for pair in zip(on2, on3, strict=True) for f in pair), mode)
    assert [(e.channel, e.delivery_tag, e.body, e.consumer_tag) for e in got] == [
        (2, 1, b"two", "ctag2"), (3, 1, b"three", "ctag3")]
    proto.data_to_send()
    proto.ack(1, channel=3, multiple=True)
    proto.nack(1, channel=2)
    assert proto.data_to_send() == b"".join((
        pika.frame.Method(3, pika.spec.Basic.Ack(1, multiple=True)).marshal(),
        pika.frame.Method(2, pika.spec.Basic.Nack(1, requeue=True)).marshal()))
    with pytest.raises(RuntimeError, match="channel 4"):
        proto.ack(1, channel=4)


def test_a_consumers_channel_closed_leaves_the_others_open() -> None:
    proto = ready(transactional=False)
    proto.add_channel()
    feed(proto, method(commands.Channel.OpenOk(), 2))
    proto.data_to_send()
    close = commands.Channel.Close(406, "PRECONDITION_FAILED - unknown delivery tag 9", 60, 80)
    assert feed(proto, method(close, 2)) == [
        ChannelClosed(406, "PRECONDITION_FAILED - unknown delivery tag 9", 2)]
    assert kinds(proto.data_to_send()) == [(2, commands.Channel.CloseOk)]
    assert proto.state is State.READY  # channel 1 is still open for requests
    with pytest.raises(ClientProtocolError):  # a delivery on the closed channel
        feed(copy_of(proto), b"".join(channel_deliver(2, 2, b"x")))
    assert proto.add_channel() == 2  # its number is free again


def test_a_channel_opened_in_transaction_mode_is_selected_first() -> None:
    proto = ready()
    proto.add_channel()
    proto.data_to_send()
    assert feed(proto, method(commands.Channel.OpenOk(), 2)) == []
    assert kinds(proto.data_to_send()) == [(2, commands.Tx.Select)]
    assert feed(proto, method(commands.Tx.SelectOk(), 2)) == [Ready()]


def test_no_channel_is_opened_past_the_channel_max() -> None:
    proto = ClientChannel(virtual_host="/", mechanism="PLAIN", response="\0u\0p",
                          client_properties={}, frame_max=FRAME_MAX, transactional=False)
    feed(proto, method(commands.Connection.Start(mechanisms="PLAIN"))
         + method(commands.Connection.Tune(2, FRAME_MAX, 0))
         + method(commands.Connection.OpenOk()) + method(commands.Channel.OpenOk(), 1))
    assert proto.add_channel() == 2
    feed(proto, method(commands.Channel.OpenOk(), 2))
    with pytest.raises(RuntimeError, match="all 2 are open"):
        proto.add_channel()


def kinds(data: bytes) -> list[tuple[int, type]]:
    return [(channel, type(value)) for channel, value in frames(data)]


def copy_of(proto: ClientChannel) -> ClientChannel:
    """The protocol as it is, to try a frame on without changing ``proto``."""
    return copy.deepcopy(proto)

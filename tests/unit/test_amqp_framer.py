"""The AMQP framer: vectors whole, byte by byte and with trailing data; original bytes kept."""

from __future__ import annotations

import struct

import pytest
from pamqp import commands
from pamqp import frame as pframe

from bridge.frontends.amqp import NEED_DATA, PROTOCOL_HEADER, AmqpProtocolError, Frame, Framer
from bridge.frontends.amqp.errors import ReplyCode
from policies.errors import ProtocolError
from tests.unit.amqp_wire import (
    HEADER,
    HEARTBEAT,
    body,
    chunked,
    content_header,
    method,
    publish,
    raw_frame,
    run,
)

START_OK = method(commands.Connection.StartOk(
    client_properties={"product": "t"}, mechanism="PLAIN", response="\0guest\0guest"))
TUNE_OK = method(commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=60))
OPEN = method(commands.Connection.Open(virtual_host="/"))
CH_OPEN = method(commands.Channel.Open(), 1)
PUB = publish(1, b"hello", commands.Basic.Properties(content_type="text/plain"))

# (id, stream after the header, frame boundaries expected (as raw bytes))
VECTORS = [
    ("handshake", START_OK + TUNE_OK + OPEN, [START_OK, TUNE_OK, OPEN]),
    ("heartbeat", HEARTBEAT + HEARTBEAT, [HEARTBEAT, HEARTBEAT]),
    ("channel-open", CH_OPEN, [CH_OPEN]),
    ("publish", PUB, None),
    ("empty-body-frame", raw_frame(3, 1, b""), [raw_frame(3, 1, b"")]),
]


@pytest.mark.parametrize("mode", ["whole", "bytewise"])
@pytest.mark.parametrize(("name", "stream", "frames"), VECTORS, ids=[v[0] for v in VECTORS])
def test_vectors(name: str, stream: bytes, frames: list[bytes] | None, mode: str) -> None:
    events = run(Framer(), chunked(HEADER + stream, mode))
    assert events[0] == HEADER
    assert b"".join(events[1:]) == stream  # every byte, as sent
    if frames is not None:
        assert events[1:] == frames


@pytest.mark.parametrize("mode", ["whole", "bytewise"])
def test_trailing_data_waits(mode: str) -> None:
    framer = Framer()
    tail = START_OK[:9]
    events = run(framer, chunked(HEADER + START_OK + tail, mode))
    assert events == [HEADER, START_OK]
    assert framer.buffered == len(tail)
    assert framer.next_event() is NEED_DATA
    framer.receive_data(START_OK[9:])
    frame = framer.next_event()
    assert isinstance(frame, Frame) and frame.raw == START_OK


def test_feed_returns_every_complete_frame() -> None:
    framer = Framer()
    events = framer.feed(HEADER + PUB + HEARTBEAT)
    assert [e.raw for e in events] == [HEADER, *split(PUB), HEARTBEAT]


def split(stream: bytes) -> list[bytes]:
    out = []
    while stream:
        size = struct.unpack(">I", stream[3:7])[0] + 8
        out.append(stream[:size])
        stream = stream[size:]
    return out


def test_original_bytes_not_pamqp_reencoding() -> None:
    # A table with a 64-bit int ("l") for 1 and keys in non-alphabetical order: pamqp decodes it
    # and would narrow the integer when encoding, so only the original bytes are the frame sent.
    table = b"\x01z" + b"l" + struct.pack(">q", 1) + b"\x01a" + b"S" + struct.pack(">I", 1) + b"x"
    args = (
        struct.pack(">H", 0) + b"\x01q" + b"\x00"  # ticket, queue "q", bits
        + struct.pack(">I", len(table)) + table
    )
    payload = struct.pack(">HH", 50, 10) + args  # Queue.Declare
    raw = raw_frame(1, 1, payload)
    framer = Framer(expect_header=False)
    frame = framer.feed(raw)[0]
    assert isinstance(frame, Frame)
    decoded = frame.method
    assert isinstance(decoded, commands.Queue.Declare)
    assert decoded.arguments == {"z": 1, "a": "x"}
    assert frame.raw == raw
    assert pframe.marshal(decoded, 1) != raw  # why the relay forwards raw


def test_method_decoded_by_pamqp() -> None:
    frame = Framer(expect_header=False).feed(TUNE_OK)[0]
    assert isinstance(frame, Frame)
    assert isinstance(frame.method, commands.Connection.TuneOk)
    assert frame.method.frame_max == 131072
    assert frame.method_index == commands.Connection.TuneOk.index


# -- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "opening",
    [b"AMQP\x00\x00\x09\x00", b"AMQP\x01\x01\x00\x09", b"AMQP\x00\x00\x08\x00",
     b"GET / HTTP/1.1\r\n", b"\x01\x00\x00\x00"],
)
@pytest.mark.parametrize("mode", ["whole", "bytewise"])
def test_bad_protocol_header_answered_with_ours(opening: bytes, mode: str) -> None:
    framer = Framer()
    with pytest.raises(AmqpProtocolError) as info:
        for chunk in chunked(opening, mode):
            framer.receive_data(chunk)
            framer.next_event()
    assert info.value.bad_header
    assert info.value.reply() == PROTOCOL_HEADER
    assert isinstance(info.value, ProtocolError)


def test_non_amqp_refused_before_eight_bytes() -> None:
    framer = Framer()
    framer.receive_data(b"HI\n")
    with pytest.raises(AmqpProtocolError):
        framer.next_event()


def close_of(reply: bytes) -> commands.Connection.Close:
    _, channel, value = pframe.unmarshal(reply)
    assert channel == 0 and isinstance(value, commands.Connection.Close)
    return value


BAD = [
    ("bad-frame-end", raw_frame(1, 0, START_OK[7:-1], end=0x00), ReplyCode.FRAME_ERROR),
    ("unknown-type", raw_frame(5, 0, b"abc"), ReplyCode.FRAME_ERROR),
    ("amqp-as-frame", b"AMQP\x00\x00\x09\x01", ReplyCode.FRAME_ERROR),
    ("oversize-before-tune", raw_frame(3, 1, b"x" * 4089), ReplyCode.FRAME_ERROR),
    ("heartbeat-on-channel", raw_frame(8, 1, b""), ReplyCode.FRAME_ERROR),
    ("heartbeat-with-payload", raw_frame(8, 0, b"x"), ReplyCode.FRAME_ERROR),
    ("unknown-method", raw_frame(1, 0, b"\x00\x63\x00\x01"), ReplyCode.SYNTAX_ERROR),
    ("short-method", raw_frame(1, 0, b"\x00\x0a"), ReplyCode.SYNTAX_ERROR),
    ("truncated-args", raw_frame(1, 0, TUNE_OK[7:12]), ReplyCode.SYNTAX_ERROR),
    ("bad-table", raw_frame(1, 0, b"\x00\x0a\x00\x0b" + b"\x00\x00\x00\x05\x01aZzz"),
     ReplyCode.SYNTAX_ERROR),
    ("short-content-header", raw_frame(2, 1, b"\x00\x3c\x00\x00"), ReplyCode.SYNTAX_ERROR),
]


@pytest.mark.parametrize("mode", ["whole", "bytewise"])
@pytest.mark.parametrize(("name", "stream", "code"), BAD, ids=[b[0] for b in BAD])
def test_errors(name: str, stream: bytes, code: int, mode: str) -> None:
    framer = Framer()
    events = run(framer, chunked(HEADER + START_OK + stream + HEARTBEAT, mode))
    assert events == [HEADER, START_OK, ("error", code)]
    with pytest.raises(AmqpProtocolError) as info:  # and it stays failed
        framer.next_event()
    close = close_of(info.value.reply())
    assert close.reply_code == code
    assert close.reply_text.startswith(ReplyCode(code).name + " - ")


def test_syntax_error_names_the_method() -> None:
    bad = raw_frame(1, 0, TUNE_OK[7:12])
    with pytest.raises(AmqpProtocolError) as info:
        Framer(expect_header=False).feed(bad)
    assert (info.value.class_id, info.value.method_id) == (10, 31)
    assert "Connection.TuneOk" in info.value.reply_text
    close = close_of(info.value.close_frame())
    assert (close.class_id, close.method_id) == (10, 31)


def test_oversize_refused_from_its_frame_header_alone() -> None:
    framer = Framer(expect_header=False)
    framer.receive_data(struct.pack(">BHI", 3, 1, 10_000_000))  # nothing of the payload sent
    with pytest.raises(AmqpProtocolError) as info:
        framer.next_event()
    assert info.value.reply_code == ReplyCode.FRAME_ERROR


def test_feed_error_carries_frames_before_it() -> None:
    framer = Framer()
    with pytest.raises(AmqpProtocolError) as info:
        framer.feed(HEADER + START_OK + raw_frame(9, 0, b""))
    assert [e.raw for e in info.value.events] == [HEADER, START_OK]


# -- limits -------------------------------------------------------------------------------------


def test_frame_max_is_enforced_exactly() -> None:
    framer = Framer(expect_header=False, frame_max=1000)
    fits = body(1, b"x" * 992)  # 992 + 8 = 1000
    assert framer.feed(fits)[0].raw == fits
    with pytest.raises(AmqpProtocolError) as info:
        framer.feed(body(1, b"x" * 993))
    assert info.value.reply_code == ReplyCode.FRAME_ERROR
    assert "exceeds frame_max 1000" in info.value.reply_text


def test_frame_max_raised_after_tune() -> None:
    framer = Framer(expect_header=False)
    framer.frame_max = 131072
    big = body(1, b"y" * 100_000)
    assert framer.feed(big)[0].raw == big


def test_frame_max_zero_means_the_cap() -> None:
    framer = Framer(expect_header=False, frame_max=0, max_frame_cap=5000)
    assert framer.frame_max == 0
    framer.feed(body(1, b"x" * 4992))
    with pytest.raises(AmqpProtocolError):
        framer.feed(body(1, b"x" * 4993))


def test_large_frame_in_small_pieces() -> None:
    framer = Framer(expect_header=False, frame_max=0)
    big = body(1, bytes(range(256)) * 4000)
    out = []
    for i in range(0, len(big), 1000):
        out += framer.feed(big[i : i + 1000])
    assert [e.raw for e in out] == [big]
    assert framer.buffered == 0


def test_content_header_fields_without_decoding() -> None:
    frame = Framer(expect_header=False).feed(content_header(3, 12345))[0]
    assert isinstance(frame, Frame)
    assert (frame.content_class, frame.body_size, frame.channel) == (60, 12345, 3)


# -- tables: checked before pamqp reads them ------------------------------------------------------


def declare_with(table: bytes) -> bytes:
    args = struct.pack(">H", 0) + b"\x01q" + b"\x00" + struct.pack(">I", len(table)) + table
    return raw_frame(1, 1, struct.pack(">HH", 50, 10) + args)


@pytest.mark.parametrize(
    "table",
    [
        b"\x01a" + b"A" + struct.pack(">I", 100),  # pamqp alone loops forever on this one
        b"\x01a" + b"S" + struct.pack(">I", 100) + b"xy",
        b"\x01a" + b"Z" + b"\x00",
        b"\x01a",
        b"\x05ab",
        b"\x01a" + b"F" + struct.pack(">I", 3) + b"\x01b",
        b"".join(b"\x01k" + b"V" for _ in range(1001)),
        b"\x01a" + (b"A" + struct.pack(">I", 0)) * 0 + b"A" + struct.pack(">I", 5 * 40)
        + b"A" + struct.pack(">I", 5 * 39) + b"",  # nested arrays cut short
    ],
    ids=["array-overrun", "longstr-overrun", "unknown-type", "key-without-value",
         "key-overrun", "nested-table-cut", "too-many-fields", "nested-overrun"],
)
def test_bad_tables_are_syntax_errors(table: bytes) -> None:
    with pytest.raises(AmqpProtocolError) as info:
        Framer(expect_header=False).feed(declare_with(table))
    assert info.value.reply_code == ReplyCode.SYNTAX_ERROR
    assert (info.value.class_id, info.value.method_id) == (50, 10)


def test_deep_tables_refused() -> None:
    table = b""
    for _ in range(40):
        table = b"\x01n" + b"F" + struct.pack(">I", len(table)) + table
    with pytest.raises(AmqpProtocolError) as info:
        Framer(expect_header=False).feed(declare_with(table))
    assert "nested deeper" in info.value.reply_text


def test_every_field_type_accepted() -> None:
    table = (
        b"\x01t" + b"t\x01" + b"\x01b" + b"b\xff" + b"\x01B" + b"B\x01" + b"\x01s" + b"s\x00\x01"
        + b"\x01u" + b"u\x00\x01" + b"\x01I" + b"I" + bytes(4) + b"\x01i" + b"i" + bytes(4)
        + b"\x01l" + b"l" + bytes(8) + b"\x01L" + b"L" + bytes(8) + b"\x01f" + b"f" + bytes(4)
        + b"\x01d" + b"d" + bytes(8) + b"\x01D" + b"D" + bytes(5) + b"\x01T" + b"T" + bytes(8)
        + b"\x01V" + b"V" + b"\x01S" + b"S" + struct.pack(">I", 2) + b"hi"
        + b"\x01x" + b"x" + struct.pack(">I", 1) + b"\x00"
        + b"\x01A" + b"A" + struct.pack(">I", 2) + b"t\x00"
        + b"\x01F" + b"F" + struct.pack(">I", 4) + b"\x01kt\x01"
    )
    frame = Framer(expect_header=False).feed(declare_with(table))[0]
    assert isinstance(frame, Frame)
    assert isinstance(frame.method, commands.Queue.Declare)
    assert frame.method.arguments["S"] == "hi" and frame.method.arguments["F"] == {"k": True}


def test_properties_overrun_is_a_syntax_error() -> None:
    # headers flag set, a table announcing 50 bytes with 2 there
    payload = struct.pack(">HHQH", 60, 0, 1, 0x2000) + struct.pack(">I", 50) + b"\x01a"
    # A client's (validated) content header is decoded on arrival...
    with pytest.raises(AmqpProtocolError) as info:
        Framer(expect_header=False).feed(raw_frame(2, 1, payload))
    assert info.value.reply_code == ReplyCode.SYNTAX_ERROR
    # ...a broker's when it is read.
    frame = Framer(expect_header=False, validate=False).feed(raw_frame(2, 1, payload))[0]
    assert isinstance(frame, Frame)
    with pytest.raises(AmqpProtocolError) as info:
        frame.content_header  # noqa: B018
    assert info.value.reply_code == ReplyCode.SYNTAX_ERROR

"""The content header writer and reader (``properties``), which replaced pamqp's: pamqp reads
back every property the writer writes, its bytes are pamqp's own where pamqp writes a value
right, a staged copy's properties are the ones RabbitMQ's STOMP plugin would give its headers
(``amqp_properties``), and the reader reads what pamqp reads, or fails where pamqp fails."""

from __future__ import annotations

import datetime as dt
import math
import struct
from typing import Any

import pika
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader

from adapters import amqp_types
from adapters.amqp_properties import header_frame, read_content_header, read_values
from adapters.amqp_tables import check_properties
from adapters.rabbitmq_stomp import amqp_properties, headers_of, stomp_headers
from bridge.frontends.amqp.assembler import Message
from bridge.frontends.amqp.builders import content_frames, content_frames_of
from bridge.frontends.amqp.errors import AmqpProtocolError
from bridge.frontends.amqp.framer import FRAME_HEADER, FRAME_METHOD, Frame
from bridge.frontends.amqp.translate import property_values, publish_fields

SHORT = st.text(max_size=40)
# Table values pamqp itself writes as RabbitMQ reads them (no negative integers below 32 bits,
# no floats: pamqp 3.3 writes those wrong, which is one reason the writer is ours).
TABLE = st.dictionaries(
    st.text(min_size=1, max_size=20),
    st.one_of(st.text(max_size=30), st.integers(0, 2**31 - 1), st.booleans()),
    max_size=6,
)
PROPERTIES = st.builds(
    commands.Basic.Properties,
    content_type=st.none() | SHORT,
    content_encoding=st.none() | SHORT,
    headers=st.none() | TABLE,
    delivery_mode=st.none() | st.sampled_from([1, 2]),
    priority=st.none() | st.integers(0, 255),
    correlation_id=st.none() | SHORT,
    reply_to=st.none() | SHORT,
    expiration=st.none() | st.integers(0, 10**9).map(str),
    message_id=st.none() | SHORT,
    # (pamqp reads a timestamp past 2106 as milliseconds)
    timestamp=st.none() | st.integers(0, 2**32 - 1).map(
        lambda s: dt.datetime.fromtimestamp(s, dt.UTC)),
    message_type=st.none() | SHORT,
    user_id=st.none() | SHORT,
    app_id=st.none() | SHORT,
)


def decoded(raw: bytes) -> commands.Basic.Properties:
    consumed, channel, frame = pframe.unmarshal(raw)
    assert consumed == len(raw)
    assert isinstance(frame, pheader.ContentHeader)
    return frame.properties


@settings(max_examples=400, deadline=None)
@given(PROPERTIES, st.integers(1, 2047), st.binary(max_size=300), st.integers(40, 200))
def test_pamqp_reads_back_what_the_writer_writes(
    props: commands.Basic.Properties, channel: int, body: bytes, frame_max: int
) -> None:
    ours = content_frames(channel, props, body, frame_max)
    size = int.from_bytes(ours[3:7], "big") + 8
    left_out = {n: None if getattr(props, n) == "" else getattr(props, n)
                for n in props.__slots__ if n != "cluster_id"}
    assert decoded(ours[:size]) == commands.Basic.Properties(**left_out)  # "" is left out
    if props.headers is None:  # pamqp writes a table in its own order and types, not RabbitMQ's
        assert ours[:size] == pframe.marshal(pheader.ContentHeader(0, len(body), props), channel)
    assert ours[size:] == b"".join(  # then the body, in frames within frame_max
        b"\x03" + channel.to_bytes(2, "big") + len(part).to_bytes(4, "big") + part + b"\xce"
        for part in (body[i:i + frame_max - 8] for i in range(0, len(body), frame_max - 8)))


def test_negative_integers_and_floats_in_a_table_are_written_as_rabbitmq_reads_them() -> None:
    table: dict[str, Any] = {"small": -5, "big": -(2**40), "ratio": 0.1, "nested": {"n": -1}}
    raw = header_frame(1, 0, [None, None, table, *[None] * 11])
    assert decoded(raw).headers == table


def test_an_empty_string_is_left_out_as_pamqp_leaves_it_out() -> None:
    raw = header_frame(1, 3, ["", None, None, 2, None, "", None, None, None, None, None,
                              None, None, None])
    props = decoded(raw)
    assert props.content_type is None and props.correlation_id is None
    assert props.delivery_mode == 2


def test_values_that_do_not_fit_are_refused() -> None:
    with pytest.raises(ValueError, match="255 bytes"):
        header_frame(1, 0, ["x" * 256, *[None] * 13])
    with pytest.raises(ValueError):
        header_frame(1, 0, [None, None, None, None, 256, *[None] * 9])


HEADER_NAMES = st.sampled_from([
    "content-type", "content-encoding", "persistent", "priority", "correlation-id",
    "reply-to", "expiration", "amqp-message-id", "timestamp", "type", "user-id", "app-id",
    "jms-bridge-target", "x-custom", "JMSType",
])


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(HEADER_NAMES, st.one_of(st.text(max_size=20), st.integers(0, 300).map(str),
                                                st.sampled_from(["true", "True", "false"])),
                       max_size=10),
       st.binary(max_size=50))
def test_a_staged_copy_has_the_properties_the_stomp_plugin_gives_its_headers(
    headers: dict[str, str], body: bytes
) -> None:
    try:
        expected = amqp_properties(headers)
    except ValueError:
        with pytest.raises(ValueError):
            content_frames_of(1, property_values(headers), body, 4096)
        return
    raw = content_frames_of(1, property_values(headers), body, 4096)
    props = decoded(raw[:int.from_bytes(raw[3:7], "big") + 8])
    for ours, pikas in (("content_type", "content_type"), ("content_encoding", "content_encoding"),
                        ("priority", "priority"), ("correlation_id", "correlation_id"),
                        ("reply_to", "reply_to"), ("expiration", "expiration"),
                        ("message_id", "message_id"), ("message_type", "type"),
                        ("user_id", "user_id"), ("app_id", "app_id")):
        want = getattr(expected, pikas)
        assert getattr(props, ours) == (None if want == "" else want), ours
    assert props.delivery_mode == expected.delivery_mode
    assert (props.headers or None) == (expected.headers or None)
    stamp = props.timestamp
    assert (None if stamp is None else int(stamp.timestamp())) == expected.timestamp


# Tables as pamqp writes them (its own types), for the reader.
PAMQP_TABLE = st.dictionaries(
    st.text(min_size=1, max_size=10),
    # (pamqp writes an integer from -128 to -1 wrong: none below 0 here)
    st.one_of(st.text(max_size=20), st.integers(0, 2**63 - 1), st.booleans(),
              st.none(),
              st.lists(st.one_of(st.integers(0, 100), st.text(max_size=5)), max_size=3)),
    max_size=5,
)


def pika_values(props: commands.Basic.Properties) -> dict[str, Any]:
    """pamqp's reading of properties as pika's: ``type`` for ``message_type``, a timestamp
    in epoch seconds."""
    out: dict[str, Any] = {}
    for name in props.__slots__:
        value = getattr(props, name)
        if isinstance(value, dt.datetime):
            value = int(value.timestamp())
        out["type" if name == "message_type" else name] = value
    return out


def pamqp_read(raw: bytes) -> Any:
    return pframe.unmarshal(raw)[2]


@settings(max_examples=400, deadline=None)
@given(PROPERTIES, st.none() | PAMQP_TABLE, st.integers(0, 2**40), st.booleans())
def test_the_reader_reads_what_pamqp_reads(
    props: commands.Basic.Properties, table: dict[str, Any] | None, size: int, ours: bool
) -> None:
    props.headers = table if not ours else props.headers
    if ours:  # our writer's bytes (RabbitMQ's table types)
        raw = content_frames(1, props, b"", 4096)
        raw = raw[:int.from_bytes(raw[3:7], "big") + 8]
    else:  # pamqp's (its own table types)
        raw = pframe.marshal(pheader.ContentHeader(0, size, props), 1)
    theirs = pamqp_read(raw)
    check_properties(raw[7:-1])
    mine = read_content_header(raw[7:-1])
    assert mine.properties == theirs.properties
    assert (mine.class_id, mine.weight, mine.body_size) == (
        theirs.class_id, theirs.weight, theirs.body_size)


@settings(max_examples=600, deadline=None)
@given(st.integers(0, 0xFFFE).map(lambda f: f & ~1), st.binary(max_size=80))
def test_the_reader_fails_where_pamqp_fails(flags: int, rest: bytes) -> None:
    payload = b"\x00\x3c\x00\x00" + (7).to_bytes(8, "big") + flags.to_bytes(2, "big") + rest
    try:
        check_properties(payload)
    except ValueError:
        return  # out of bounds: neither reader is asked
    raw = b"\x02\x00\x01" + len(payload).to_bytes(4, "big") + payload + b"\xce"
    try:
        theirs = pamqp_read(raw)
    except Exception:  # noqa: BLE001 - pamqp raises many kinds; ours must raise too
        with pytest.raises(Exception):  # noqa: B017
            read_content_header(payload)
        return
    assert read_content_header(payload).properties == theirs.properties


@settings(max_examples=400, deadline=None)
@given(PROPERTIES, st.none() | PAMQP_TABLE, st.none() | st.integers(0, 2**34))
def test_the_publish_screen_reads_the_headers_pamqps_reading_gives(
    props: commands.Basic.Properties, table: dict[str, Any] | None, stamp: int | None
) -> None:
    """The screen reads a publish's values off its bytes (``read_values``, no pamqp or pika
    objects): the same STOMP headers and types as from pamqp's reading (past the year 2106 a
    timestamp is read as milliseconds, as pamqp reads it)."""
    props.headers = table
    if stamp is not None:
        props.timestamp = dt.datetime.fromtimestamp(stamp, dt.UTC)
    raw = pframe.marshal(pheader.ContentHeader(0, 5, props), 1)
    theirs = pamqp_read(raw).properties
    values = read_values(raw[7:-1])
    # (In the same order too: the staged copy's table keeps it.)
    plugins = stomp_headers(pika.BasicProperties(**pika_values(theirs)))
    assert list(headers_of(values).items()) == list(plugins.items())
    assert list(headers_of(values, "/amq/queue/q").items()) == [
        ("destination", "/amq/queue/q"), *plugins.items()]
    assert (amqp_types.encode(values[2], values[3], drop={"x-delay"})
            == amqp_types.encode(theirs.headers, theirs.delivery_mode, drop={"x-delay"}))


NAMES = st.text(max_size=20) | st.binary(max_size=20)


@settings(max_examples=400, deadline=None)
@given(NAMES, NAMES, st.integers(0, 255), st.binary(max_size=3))
def test_the_screen_reads_a_publishs_fields_as_pamqp_does(
    exchange: str | bytes, key: str | bytes, bits: int, extra: bytes
) -> None:
    """``publish_fields`` reads exchange, routing key and mandatory off a Basic.Publish's bytes
    when they have the plain layout: what pamqp decodes, for names that are not UTF-8 and for
    bytes after the bits too (those are decoded, or refused, by pamqp)."""
    def short(value: str | bytes) -> bytes:
        raw = value.encode() if isinstance(value, str) else value
        return bytes((len(raw),)) + raw

    args = b"\x00\x00" + short(exchange) + short(key) + bytes((bits,)) + extra
    payload = commands.Basic.Publish.index.to_bytes(4, "big") + args
    raw = b"\x01\x00\x01" + len(payload).to_bytes(4, "big") + payload + b"\xce"
    frame = Frame(FRAME_METHOD, 1, raw)
    message = Message(1, frame, Frame(FRAME_HEADER, 1, b""), [])
    try:
        decoded = frame.method
    except AmqpProtocolError:
        decoded = None
    try:
        ours: tuple[str, str, bool] | None = publish_fields(message)
    except AmqpProtocolError:
        ours = None
    if decoded is None:
        assert ours is None
    else:
        assert isinstance(decoded, commands.Basic.Publish)
        assert ours == (decoded.exchange, decoded.routing_key, bool(decoded.mandatory))


# -- tables: read as pamqp reads them --------------------------------------------------------------
def _nan(layout: str, raw: bytes) -> bool:
    return math.isnan(struct.unpack(layout, raw)[0])


_LONGSTR = st.binary(max_size=12).map(lambda b: len(b).to_bytes(4, "big") + b)
# Every field type pamqp reads, as raw bytes: negative and top values, strings that are not
# UTF-8, void both ways, and nested tables and arrays.
_SCALARS = st.one_of(
    st.binary(min_size=1, max_size=1).map(lambda b: b"t" + b),
    st.binary(min_size=1, max_size=1).map(lambda b: b"b" + b),
    st.binary(min_size=1, max_size=1).map(lambda b: b"B" + b),
    st.binary(min_size=2, max_size=2).map(lambda b: b"s" + b),
    st.binary(min_size=2, max_size=2).map(lambda b: b"u" + b),
    st.binary(min_size=4, max_size=4).map(lambda b: b"I" + b),
    st.binary(min_size=4, max_size=4).map(lambda b: b"i" + b),
    st.binary(min_size=8, max_size=8).map(lambda b: b"l" + b),
    st.binary(min_size=8, max_size=8).map(lambda b: b"L" + b),
    st.binary(min_size=4, max_size=4).filter(lambda b: not _nan(">f", b)).map(
        lambda b: b"f" + b),
    st.binary(min_size=8, max_size=8).filter(lambda b: not _nan(">d", b)).map(
        lambda b: b"d" + b),
    st.integers(0, 2**32 - 1).map(lambda n: b"T" + n.to_bytes(8, "big")),
    st.integers(0, 9).map(lambda n: b"D" + bytes((n,)) + b"\x00\x00\x30\x39"),
    st.just(b"V"), st.just(b"\x00"),
    _LONGSTR.map(lambda b: b"S" + b), _LONGSTR.map(lambda b: b"x" + b),
    st.text(max_size=8).map(lambda t: b"S" + len(t.encode()).to_bytes(4, "big") + t.encode()),
)
_KEYS = st.binary(max_size=6).filter(lambda b: b.decode("utf-8", "ignore").encode() == b)


def _table_bytes(entries: list[tuple[bytes, bytes]]) -> bytes:
    body = b"".join(bytes((len(k),)) + k + v for k, v in entries)
    return len(body).to_bytes(4, "big") + body


_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(st.tuples(_KEYS, inner), max_size=4).map(lambda e: b"F" + _table_bytes(e)),
        st.lists(inner, max_size=4).map(
            lambda vs: b"A" + len(b"".join(vs)).to_bytes(4, "big") + b"".join(vs)),
    ),
    max_leaves=12,
)


@settings(max_examples=600, deadline=None)
@given(st.lists(st.tuples(_KEYS, _VALUES), max_size=8), st.binary(max_size=4))
def test_a_table_is_read_as_pamqp_reads_it(entries: list[tuple[bytes, bytes]],
                                           before: bytes) -> None:
    """``decode_table`` (which ``read_values`` uses for a publish's header table) gives what
    pamqp's ``field_table`` gives, value for value and type for type, and where it ends."""
    from pamqp import decode as pdecode

    from adapters.amqp_tables import decode_table

    table = _table_bytes(entries)
    used, theirs = pdecode.field_table(table + b"rest")
    end, ours = decode_table(before + table + b"rest", len(before))
    assert end - len(before) == used
    assert _typed(ours) == _typed(theirs)


def _typed(value: Any) -> Any:
    """A decoded value with the type of each part shown (True == 1, but a bool is not an int
    here)."""
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    return (type(value).__name__, value)

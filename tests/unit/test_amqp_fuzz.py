"""Property tests: bytes after a valid protocol header parse or raise AmqpProtocolError,
never anything else; how the bytes are cut never changes the result."""

from __future__ import annotations

import struct
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands

from bridge.frontends.amqp import AmqpProtocolError, Frame, Framer, ProxyConnection
from tests.unit.amqp_wire import HEADER, HEARTBEAT, body, content_header, method, publish

VALID = st.sampled_from([
    HEARTBEAT,
    method(commands.Connection.StartOk(client_properties={"a": 1}, response="\0g\0g")),
    method(commands.Connection.TuneOk(0, 131072, 0)),
    method(commands.Connection.Open()),
    method(commands.Channel.Open(), 1),
    publish(1, b"abc"),
    method(commands.Basic.Publish(), 1),
    content_header(1, 3),
    body(1, b"abc"),
])


@st.composite
def frameish(draw: Any) -> bytes:
    """A frame header with a plausible type, channel and size around a random payload."""
    payload = draw(st.one_of(
        st.binary(max_size=40),
        st.builds(lambda i, rest: struct.pack(">I", i) + rest,
                  st.sampled_from([0x000A000B, 0x000A001F, 0x003C0028, 0x00140028, 0x00320014]),
                  st.binary(max_size=30)),
    ))
    kind = draw(st.sampled_from([1, 2, 3, 8, 0, 0xCE]))
    channel = draw(st.sampled_from([0, 1, 2, 65535]))
    size = draw(st.one_of(st.just(len(payload)), st.integers(0, 2**32 - 1)))
    end = draw(st.sampled_from([b"\xce", b"\xce", b"\x00", b""]))
    return bytes(struct.pack(">BHI", kind, channel, size) + payload + end)


STREAMS = st.lists(st.one_of(VALID, frameish(), st.binary(max_size=16)), max_size=8).map(b"".join)


def outcome(feed: Any, chunks: list[bytes]) -> list[Any]:
    out: list[Any] = []
    try:
        for chunk in chunks:
            out += [getattr(e, "raw", e) for e in feed(chunk)]
    except AmqpProtocolError as exc:  # anything else fails the test
        out += [getattr(e, "raw", e) for e in exc.events]
        out.append(("error", exc.reply_code))
    return out


def cuts(data: bytes, points: list[int]) -> list[bytes]:
    marks = sorted({p % (len(data) + 1) for p in points})
    edges = [0, *marks, len(data)]
    return [data[a:b] for a, b in zip(edges, edges[1:], strict=False)]


@given(STREAMS, st.lists(st.integers(0, 10_000), max_size=6))
def test_framer_parses_or_raises_protocol_error(stream: bytes, points: list[int]) -> None:
    whole = outcome(Framer().feed, [HEADER + stream])
    cut = outcome(Framer().feed, cuts(HEADER + stream, points))
    assert whole == cut
    if whole and not isinstance(whole[-1], tuple):
        assert b"".join(whole) == HEADER + stream[: len(b"".join(whole)) - 8]


@given(STREAMS)
def test_connection_parses_or_raises_protocol_error(stream: bytes) -> None:
    conn = ProxyConnection(max_body_size=1000)
    outcome(conn.client_data, [HEADER + stream])


@given(st.binary(max_size=64))
def test_any_opening_parses_or_raises(opening: bytes) -> None:
    outcome(Framer().feed, [opening])


@given(STREAMS)
def test_decoding_every_frame_never_escapes(stream: bytes) -> None:
    framer = Framer(expect_header=False, validate=False, frame_max=0)
    for event in outcome(framer.feed, [stream]):
        if isinstance(event, bytes) and event[:1] in (b"\x01", b"\x02"):
            frame = Frame(event[0], 0, event)
            try:
                if event[0] == 1:
                    frame.method  # noqa: B018
                else:
                    frame.content_header  # noqa: B018
            except AmqpProtocolError:
                pass

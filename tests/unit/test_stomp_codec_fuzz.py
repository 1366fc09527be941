"""Property tests: garbage parses or raises StompProtocolError, chunking never changes the
result, and serialize() -> FrameParser round-trips what 1.1 and 1.2 can carry."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.frontends.stomp import (
    CLIENT_COMMANDS,
    HEARTBEAT,
    NEED_DATA,
    Frame,
    FrameParser,
    Limits,
    StompProtocolError,
    serialize,
)

SMALL = Limits(max_frame_bytes=300, max_headers=3, max_header_bytes=120)
VERSIONS = st.sampled_from([None, "1.0", "1.1", "1.2"])

# Pieces that make garbage look like STOMP often enough to reach the deeper branches.
TOKENS = st.sampled_from(
    [
        b"SEND", b"MESSAGE", b"CONNECT", b"CONNECTED", b"ACK", b"FOO", b"\n", b"\r\n", b"\r",
        b"\x00", b":", b"\\", b"\\c", b"\\n", b"\\r", b"\\t", b"content-length:",
        b"content-length:3", b"content-length:0", b"content-length:999", b"a:b", b"\xff", b"x",
        "é".encode(),
    ]
)  # fmt: skip
PIECES = st.lists(st.one_of(TOKENS, st.binary(max_size=4)), max_size=4).map(b"".join)
EOLS = st.sampled_from([b"\n", b"\r\n", b"\r"])
HEADER_LINES = st.one_of(
    st.builds(lambda name, value: name + b":" + value, st.sampled_from([b"a", b"x-y"]), PIECES),
    st.sampled_from([b"content-length:0", b"content-length:2", b"content-length:9"]),
    PIECES,
)
FRAMEISH = st.builds(
    lambda command, eol, lines, blank, body, end: (
        command + eol + b"".join(line + eol for line in lines) + blank + body + end
    ),
    st.sampled_from([b"SEND", b"MESSAGE", b"CONNECT", b"CONNECTED", b"ACK", b"FOO", b""]),
    EOLS,
    st.lists(HEADER_LINES, max_size=5),
    EOLS,
    st.binary(max_size=12),
    st.sampled_from([b"\x00", b"", b"x\x00", b"\x00\x00"]),
)
STREAMS = st.one_of(
    st.binary(max_size=400),
    st.lists(st.one_of(TOKENS, st.binary(max_size=8)), max_size=60).map(b"".join),
    st.lists(st.one_of(FRAMEISH, EOLS), max_size=6).map(b"".join),
)


def cuts(data: bytes, points: list[int]) -> list[bytes]:
    marks = sorted({p % (len(data) + 1) for p in points})
    edges = [0, *marks, len(data)]
    return [data[a:b] for a, b in zip(edges, edges[1:], strict=False) if b > a]


def run(parser: FrameParser, chunks: list[bytes]) -> list[Any]:
    """Events (normalised) then ('error', kind) if one was raised; any other exception escapes."""
    out: list[Any] = []
    try:
        for chunk in chunks:
            out += map(normal, parser.feed(chunk))
        assert parser.next_event() is NEED_DATA
    except StompProtocolError as exc:
        out += map(normal, exc.events)  # what feed() parsed before the bad frame
        out.append(("error", exc.kind))
        try:
            parser.next_event()
        except StompProtocolError as again:
            assert again is exc
        else:  # pragma: no cover - the parser must stay dead
            raise AssertionError("parser used after an error did not raise")
    return out


def normal(event: Any) -> Any:
    if event is HEARTBEAT:
        return "HB"
    assert isinstance(event, Frame)
    return (event.command, event.raw, event.body, headers_or_error(event))


def headers_or_error(frame: Frame) -> Any:
    try:
        return frame.headers
    except StompProtocolError as exc:  # lazily decoded headers of an unvalidated frame
        return ("bad headers", exc.kind)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=STREAMS,
    points=st.lists(st.integers(min_value=0), max_size=12),
    version=VERSIONS,
    role=st.sampled_from(["server", "client"]),
    validate=st.booleans(),
    small=st.booleans(),
)
def test_garbage_parses_or_raises_the_protocol_error_alike_in_any_chunking(
    data: bytes, points: list[int], version: str | None, role: str, validate: bool, small: bool
) -> None:
    def parser() -> FrameParser:
        limits = SMALL if small else Limits()
        return FrameParser(role=role, version=version, validate=validate, limits=limits)

    whole = run(parser(), [data])
    assert run(parser(), cuts(data, points)) == whole
    assert run(parser(), [data[i : i + 1] for i in range(len(data))]) == whole
    for event in whole:
        if isinstance(event, tuple) and event[0] != "error":
            assert event[1].endswith(b"\x00")
            assert event[2] in event[1]


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(data=STREAMS, points=st.lists(st.integers(min_value=0), max_size=12),
       version=VERSIONS)
def test_relayed_unknown_commands_change_nothing_else(
    data: bytes, points: list[int], version: str | None
) -> None:
    """relay_unknown turns only an unknown-command error into a frame, one with a plain
    command and a single NUL (a NUL-free head) that the broker frames as the bridge did."""
    strict = run(FrameParser(version=version), [data])
    relayed = run(FrameParser(version=version, relay_unknown=True), cuts(data, points))
    if not strict or strict[-1] != ("error", "unknown-command") or relayed == strict:
        assert relayed == strict
    else:
        assert relayed[: len(strict) - 1] == strict[:-1]
        if len(relayed) < len(strict):  # the unknown frame is not complete yet
            return
        odd = relayed[len(strict) - 1]
        if odd[0] == "error":  # its headers or body were wrong in another way
            return
        assert odd[0] not in CLIENT_COMMANDS and odd[0].isascii() and odd[0].isprintable()
        assert b"\x00" not in odd[1][: odd[1].index(b"\n")]


NAMES = st.text(min_size=1, max_size=12).filter(lambda s: "\0" not in s)
VALUES = st.text(max_size=20).filter(lambda s: "\0" not in s)
COMMANDS = st.sampled_from(["SEND", "SUBSCRIBE", "ACK", "NACK", "BEGIN", "DISCONNECT"])


@settings(max_examples=300)
@given(
    command=COMMANDS,
    headers=st.lists(st.tuples(NAMES, VALUES), max_size=8),
    body=st.binary(max_size=64),
    version=st.sampled_from(["1.1", "1.2"]),
    points=st.lists(st.integers(min_value=0), max_size=6),
    crlf_heartbeats=st.booleans(),
)
def test_serialize_then_parse_round_trips(
    command: str,
    headers: list[tuple[str, str]],
    body: bytes,
    version: str,
    points: list[int],
    crlf_heartbeats: bool,
) -> None:
    headers = [(n, v) for n, v in headers if n != "content-length"]
    headers.append(("content-length", str(len(body))))
    raw = serialize(command, headers, body, version=version)
    eol = b"\r\n" if crlf_heartbeats and version == "1.2" else b"\n"
    stream = eol + raw + eol + raw
    for validate in (True, False):
        parser = FrameParser(version=version, validate=validate)
        events: list[Any] = []
        for chunk in cuts(stream, points):
            events += parser.feed(chunk)
        assert events[0] is HEARTBEAT and events[2] is HEARTBEAT
        for frame in (events[1], events[3]):
            assert isinstance(frame, Frame)
            assert (frame.command, frame.headers, frame.body, frame.raw) == (
                command,
                headers,
                body,
                raw,
            )


HEADER_TEXT = st.text(alphabet=st.sampled_from(list("ab:\\\n\r\x00é -")), max_size=5)


@given(
    st.sampled_from(["SEND", "MESSAGE", "ERROR", "ACK"]),
    st.lists(st.tuples(HEADER_TEXT, HEADER_TEXT), max_size=5),
    st.sampled_from([None, "1.1", "1.2"]),
)
def test_serialize_escapes_each_header_as_escape_does(
    command: str, headers: list[tuple[str, str]], version: str | None
) -> None:
    """serialize escapes all headers at once; the result is escape() of each, or the same
    ValueError."""
    from bridge.frontends.stomp.escaping import escape

    try:
        expected: bytes | None = "".join(
            [f"{command}\n"]
            + [f"{escape(n, version, name=True)}:{escape(v, version)}\n" for n, v in headers
               if n or _raise_empty()]
            + ["\n"]
        ).encode() + b"\x00"
    except ValueError:
        expected = None
    try:
        got: bytes | None = serialize(command, headers, version=version)
    except ValueError:
        got = None
    assert got == expected


def _raise_empty() -> bool:
    raise ValueError("empty name")

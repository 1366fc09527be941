"""The STOMP codec: vectors fed whole, byte by byte and with trailing data (h11's style)."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.frontends.stomp import (
    CLIENT_COMMANDS,
    HEARTBEAT,
    NEED_DATA,
    SERVER_COMMANDS,
    Frame,
    FrameParser,
    Limits,
    StompProtocolError,
    error_frame,
    serialize,
)
from policies.errors import ProtocolError

HB = "HB"


def events_of(parser: FrameParser, chunks: list[bytes]) -> list[Any]:
    """Feed chunks via receive_data/next_event; an error's kind ends the list if one is raised."""
    out: list[Any] = []
    try:
        for chunk in chunks:
            parser.receive_data(chunk)
            while True:
                event = parser.next_event()
                if event is NEED_DATA:
                    break
                out.append(normal(event))
    except StompProtocolError as exc:
        out.append(("error", exc.kind))
    return out


def fed(parser: FrameParser, data: bytes) -> list[Any]:
    """The same through feed(), the relay's path."""
    try:
        return [normal(e) for e in parser.feed(data)]
    except StompProtocolError as exc:
        return [normal(e) for e in exc.events] + [("error", exc.kind)]


def normal(event: Any) -> Any:
    if event is HEARTBEAT:
        return HB
    assert isinstance(event, Frame)
    return (event.command, event.headers, event.body, event.raw)


def frame(command: str, headers: list[tuple[str, str]], body: bytes, raw: bytes) -> Any:
    return (command, headers, body, raw)


# (id, version, role, input, expected events; an ("error", kind) entry ends the list)
S = "server"
C = "client"
VECTORS: list[tuple[str, str | None, str, bytes, list[Any]]] = [
    (
        "send-lf",
        "1.2",
        S,
        b"SEND\ndestination:/queue/a\n\nhello\x00",
        [
            frame(
                "SEND",
                [("destination", "/queue/a")],
                b"hello",
                b"SEND\ndestination:/queue/a\n\nhello\x00",
            )
        ],
    ),
    (
        "send-crlf",
        "1.2",
        S,
        b"SEND\r\ndestination:/queue/a\r\nx:1\r\n\r\nhi\x00",
        [
            frame(
                "SEND",
                [("destination", "/queue/a"), ("x", "1")],
                b"hi",
                b"SEND\r\ndestination:/queue/a\r\nx:1\r\n\r\nhi\x00",
            )
        ],
    ),
    (
        "crlf-before-negotiation",
        None,
        S,
        b"CONNECT\r\naccept-version:1.2\r\nhost:/\r\n\r\n\x00",
        [
            frame(
                "CONNECT",
                [("accept-version", "1.2"), ("host", "/")],
                b"",
                b"CONNECT\r\naccept-version:1.2\r\nhost:/\r\n\r\n\x00",
            )
        ],
    ),
    (
        "nul-in-body-with-content-length",
        "1.2",
        S,
        b"SEND\ncontent-length:5\n\na\x00b\x00c\x00",
        [
            frame(
                "SEND",
                [("content-length", "5")],
                b"a\x00b\x00c",
                b"SEND\ncontent-length:5\n\na\x00b\x00c\x00",
            )
        ],
    ),
    (
        "content-length-zero",
        "1.2",
        S,
        b"SEND\ncontent-length:0\n\n\x00",
        [frame("SEND", [("content-length", "0")], b"", b"SEND\ncontent-length:0\n\n\x00")],
    ),
    (
        "heartbeats-lf-and-crlf",
        "1.2",
        S,
        b"\n\r\n\nDISCONNECT\n\n\x00\r\n\n",
        [HB, HB, HB, frame("DISCONNECT", [], b"", b"DISCONNECT\n\n\x00"), HB, HB],
    ),
    (
        "repeated-headers-kept",
        "1.2",
        S,
        b"SEND\nfoo:1\nfoo:2\n\n\x00",
        [frame("SEND", [("foo", "1"), ("foo", "2")], b"", b"SEND\nfoo:1\nfoo:2\n\n\x00")],
    ),
    (
        "split-at-first-colon-empty-value",
        "1.2",
        S,
        b"SEND\na:b:c\nempty:\n\n\x00",
        [frame("SEND", [("a", "b:c"), ("empty", "")], b"", b"SEND\na:b:c\nempty:\n\n\x00")],
    ),
    (
        "escapes-1.2",
        "1.2",
        S,
        b"SEND\nk\\cey:a\\\\b\\nc\\rd\\ce\n\n\x00",
        [
            frame(
                "SEND", [("k:ey", "a\\b\nc\rd:e")], b"", b"SEND\nk\\cey:a\\\\b\\nc\\rd\\ce\n\n\x00"
            )
        ],
    ),
    (
        # stomp.py escapes every ':' of a 1.1/1.2 value; ActiveMQ's message ids are full of them.
        "escaped-ack-as-stomp.py-writes-it",
        "1.1",
        S,
        b"ACK\nid:ID\\chost-4345-1\\c1\\c1\nsubscription:1\n\n\x00",
        [
            frame(
                "ACK",
                [("id", "ID:host-4345-1:1:1"), ("subscription", "1")],
                b"",
                b"ACK\nid:ID\\chost-4345-1\\c1\\c1\nsubscription:1\n\n\x00",
            )
        ],
    ),
    (
        "escapes-1.1-raw-cr-kept",
        "1.1",
        S,
        b"SEND\na:x\\ny\\c\\\\\nb:cr\r\n\n\x00",
        [
            frame(
                "SEND",
                [("a", "x\ny:\\"), ("b", "cr\r")],
                b"",
                b"SEND\na:x\\ny\\c\\\\\nb:cr\r\n\n\x00",
            )
        ],
    ),
    (
        "no-escaping-1.0-space-kept",
        "1.0",
        S,
        b"SEND\ndestination: /queue/a\\b\\c\n\n\x00",
        [
            frame(
                "SEND",
                [("destination", " /queue/a\\b\\c")],
                b"",
                b"SEND\ndestination: /queue/a\\b\\c\n\n\x00",
            )
        ],
    ),
    (
        "1.0-command-line-cr-tolerated",
        "1.0",
        S,
        b"SEND\r\na:b\n\nx\x00",
        [frame("SEND", [("a", "b")], b"x", b"SEND\r\na:b\n\nx\x00")],
    ),
    (
        "connect-never-unescaped",
        "1.2",
        S,
        b"CONNECT\nlogin:a\\c\npasscode:p\\w\n\n\x00",
        [
            frame(
                "CONNECT",
                [("login", "a\\c"), ("passcode", "p\\w")],
                b"",
                b"CONNECT\nlogin:a\\c\npasscode:p\\w\n\n\x00",
            )
        ],
    ),
    (
        "stomp-never-unescaped",
        None,
        S,
        b"STOMP\nlogin:a\\x\n\n\x00",
        [frame("STOMP", [("login", "a\\x")], b"", b"STOMP\nlogin:a\\x\n\n\x00")],
    ),
    (
        "connected-never-unescaped",
        "1.2",
        C,
        b"CONNECTED\nserver:Broker\\1\nversion:1.2\n\n\x00",
        [
            frame(
                "CONNECTED",
                [("server", "Broker\\1"), ("version", "1.2")],
                b"",
                b"CONNECTED\nserver:Broker\\1\nversion:1.2\n\n\x00",
            )
        ],
    ),
    (
        "message-utf8",
        "1.2",
        C,
        "MESSAGE\nsubscription:0\nnom:café ☕\n\nbody\x00".encode(),
        [
            frame(
                "MESSAGE",
                [("subscription", "0"), ("nom", "café ☕")],
                b"body",
                "MESSAGE\nsubscription:0\nnom:café ☕\n\nbody\x00".encode(),
            )
        ],
    ),
    (
        "two-frames-back-to-back",
        "1.2",
        S,
        b"BEGIN\ntransaction:t\n\n\x00COMMIT\ntransaction:t\n\n\x00",
        [
            frame("BEGIN", [("transaction", "t")], b"", b"BEGIN\ntransaction:t\n\n\x00"),
            frame("COMMIT", [("transaction", "t")], b"", b"COMMIT\ntransaction:t\n\n\x00"),
        ],
    ),
    (
        "stray-nuls-between-frames",
        "1.2",
        S,
        b"\x00\x00BEGIN\ntransaction:t\n\n\x00\x00\n\x00COMMIT\ntransaction:t\n\n\x00\x00",
        [
            frame("BEGIN", [("transaction", "t")], b"", b"BEGIN\ntransaction:t\n\n\x00"),
            HB,
            frame("COMMIT", [("transaction", "t")], b"", b"COMMIT\ntransaction:t\n\n\x00"),
        ],
    ),
    ("unknown-command", "1.2", S, b"FOO\n\n\x00", [("error", "unknown-command")]),
    ("lowercase-command", "1.2", S, b"send\n\n\x00", [("error", "unknown-command")]),
    ("server-frame-from-client", "1.2", S, b"MESSAGE\n\n\x00", [("error", "unknown-command")]),
    ("client-frame-from-broker", "1.2", C, b"SEND\n\n\x00", [("error", "unknown-command")]),
    (
        "http-request",
        None,
        S,
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        [("error", "unknown-command")],
    ),
    (
        "good-then-bad",
        "1.2",
        S,
        b"\nACK\nid:1\n\n\x00NOPE\n\n\x00",
        [HB, frame("ACK", [("id", "1")], b"", b"ACK\nid:1\n\n\x00"), ("error", "unknown-command")],
    ),
    ("header-without-colon", "1.2", S, b"SEND\nnocolon\n\n\x00", [("error", "bad-header")]),
    ("empty-header-name", "1.2", S, b"SEND\n:value\n\n\x00", [("error", "bad-header")]),
    ("nul-in-header", "1.2", S, b"SEND\na:b\x00c\n\nx\x00", [("error", "bad-header")]),
    (
        "crlf-blank-line-in-1.1",
        "1.1",
        S,
        b"SEND\r\na:b\r\n\r\n\x00",
        [("error", "bad-header")],
    ),
    ("bad-escape-1.2", "1.2", S, b"SEND\na:b\\tc\n\n\x00", [("error", "bad-escape")]),
    ("trailing-backslash", "1.2", S, b"SEND\na:bc\\\n\n\x00", [("error", "bad-escape")]),
    ("cr-escape-in-1.1", "1.1", S, b"SEND\na:b\\rc\n\n\x00", [("error", "bad-escape")]),
    ("escape-in-name", "1.2", S, b"SEND\na\\x:b\n\n\x00", [("error", "bad-escape")]),
    *[
        (
            f"bad-content-length-{value!r}",
            "1.2",
            S,
            b"SEND\ncontent-length:" + value + b"\n\nabc\x00",
            [("error", "bad-content-length")],
        )
        for value in (b"abc", b"-1", b"", b" 3", b"+3", b"3 ", b"0x3", b"\xd9\xa3")
    ],
    (
        "content-length-too-short",
        "1.2",
        S,
        b"SEND\ncontent-length:2\n\nabc\x00",
        [("error", "missing-nul")],
    ),
    (
        "bad-utf8-header",
        "1.2",
        S,
        b"SEND\na:\xff\xfe\n\n\x00",
        [("error", "bad-encoding")],
    ),
    ("bad-utf8-command", "1.2", S, b"\xffSEND\n\n\x00", [("error", "bad-encoding")]),
]

TRAILING = {S: b"SEND\ndestination:/queue/b\n", C: b"MESSAGE\nsubscription:1\n"}


def _ids(vectors: list[tuple[Any, ...]]) -> list[str]:
    return [v[0] for v in vectors]


@pytest.mark.parametrize(
    ("name", "version", "role", "data", "expected"), VECTORS, ids=_ids(VECTORS)
)
def test_vector_whole(name: str, version: str | None, role: str, data: bytes, expected: list[Any]):
    assert events_of(FrameParser(role=role, version=version), [data]) == expected
    assert fed(FrameParser(role=role, version=version), data) == expected


@pytest.mark.parametrize(
    ("name", "version", "role", "data", "expected"), VECTORS, ids=_ids(VECTORS)
)
def test_vector_byte_at_a_time(
    name: str, version: str | None, role: str, data: bytes, expected: list[Any]
):
    chunks = [data[i : i + 1] for i in range(len(data))]
    assert events_of(FrameParser(role=role, version=version), chunks) == expected
    parser = FrameParser(role=role, version=version)
    got: list[Any] = []
    for chunk in chunks:
        got += fed(parser, chunk)
        if got and got[-1][0] == "error":
            break
    assert got == expected


@pytest.mark.parametrize(
    ("name", "version", "role", "data", "expected"), VECTORS, ids=_ids(VECTORS)
)
def test_vector_with_trailing_data(
    name: str, version: str | None, role: str, data: bytes, expected: list[Any]
):
    parser = FrameParser(role=role, version=version)
    assert fed(parser, data + TRAILING[role]) == expected
    if expected[-1][0] != "error":
        assert parser.next_event() is NEED_DATA


VALID = [v for v in VECTORS if v[4][-1][0] != "error"]


@pytest.mark.parametrize(("name", "version", "role", "data", "expected"), VALID, ids=_ids(VALID))
def test_vector_unvalidated_finds_the_same_frames(
    name: str, version: str | None, role: str, data: bytes, expected: list[Any]
):
    chunks = [data[i : i + 1] for i in range(len(data))]
    assert events_of(FrameParser(role=role, version=version, validate=False), chunks) == expected
    assert fed(FrameParser(role=role, version=version, validate=False), data) == expected


# -- escaping ------------------------------------------------------------------------------------

AWKWARD = [("k:ey\\", "v:a\\l\nue"), ("plain", "x"), ("dup", "1"), ("dup", "2")]


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_escaping_round_trip(version: str) -> None:
    headers = AWKWARD + ([("cr", "a\rb")] if version == "1.2" else [])
    raw = serialize("SEND", headers, b"body", version=version)
    (parsed,) = FrameParser(version=version).feed(raw)
    assert isinstance(parsed, Frame)
    assert parsed.headers == headers
    assert parsed.raw == raw


def test_escaped_forms_per_version() -> None:
    assert serialize("SEND", [("a", "x:y\\z\n\r")], version="1.2") == (
        b"SEND\na:x\\cy\\\\z\\n\\r\n\n\x00"
    )
    assert serialize("SEND", [("a", "x:y\\z\n\r")], version="1.1") == (
        b"SEND\na:x\\cy\\\\z\\n\r\n\n\x00"
    )
    assert serialize("SEND", [("a", "x:y\\z")], version="1.0") == b"SEND\na:x:y\\z\n\n\x00"


def test_version_1_0_cannot_carry_newlines() -> None:
    with pytest.raises(ValueError):
        serialize("SEND", [("a", "x\ny")], version="1.0")
    with pytest.raises(ValueError):
        serialize("SEND", [("a:b", "x")], version="1.0")


@pytest.mark.parametrize("command", ["CONNECT", "STOMP", "CONNECTED"])
def test_connect_frames_are_never_escaped(command: str) -> None:
    raw = serialize(command, [("passcode", "a\\b:c")], version="1.2")
    assert raw == command.encode() + b"\npasscode:a\\b:c\n\n\x00"
    role = "client" if command == "CONNECTED" else "server"
    (parsed,) = FrameParser(role=role, version="1.2").feed(raw)
    assert parsed.get("passcode") == "a\\b:c"  # type: ignore[union-attr]
    with pytest.raises(ValueError):
        serialize(command, [("passcode", "a\nb")], version="1.2")


def test_serialize_accepts_a_mapping_and_refuses_unframeable_bodies() -> None:
    assert serialize("SEND", {"a": "1"}, b"x") == b"SEND\na:1\n\nx\x00"
    with pytest.raises(ValueError):
        serialize("SEND", {"a": "1"}, b"x\x00y")
    assert serialize("SEND", {"content-length": "3"}, b"x\x00y").endswith(b"x\x00y\x00")
    with pytest.raises(ValueError):
        serialize("SEND", {"": "1"})
    with pytest.raises(ValueError):
        serialize("SEND", {"a": "nul\x00"})


# -- frames --------------------------------------------------------------------------------------


def test_first_header_wins() -> None:
    (parsed,) = FrameParser().feed(b"SEND\nfoo:1\nfoo:2\nbar:\n\n\x00")
    assert isinstance(parsed, Frame)
    assert parsed.get("foo") == "1"
    assert parsed.get("bar") == ""
    assert parsed.get("nope") is None
    assert parsed.get("nope", "d") == "d"
    assert "foo" in parsed and "nope" not in parsed
    assert parsed.headers == [("foo", "1"), ("foo", "2"), ("bar", "")]


def test_first_content_length_wins() -> None:
    (parsed,) = FrameParser().feed(b"SEND\ncontent-length:1\ncontent-length:x\n\na\x00")
    assert parsed.body == b"a"  # type: ignore[union-attr]
    (parsed,) = FrameParser(validate=False).feed(
        b"SEND\ncontent-length:1\ncontent-length:x\n\na\x00"
    )
    assert parsed.body == b"a"  # type: ignore[union-attr]


def test_content_length_must_be_at_a_line_start_when_unvalidated() -> None:
    data = b"MESSAGE\nx-content-length:1\ncontent-length:3\n\na\x00b\x00"
    (parsed,) = FrameParser(role="client", validate=False).feed(data)
    assert parsed.body == b"a\x00b"  # type: ignore[union-attr]


def test_frame_built_for_sending() -> None:
    f = Frame("SEND", {"destination": "/q/a:b"}, b"x")
    assert f.raw == b"SEND\ndestination:/q/a\\cb\n\nx\x00"
    assert f.get("destination") == "/q/a:b"
    assert f == Frame("SEND", [("destination", "/q/a:b")], b"x")
    assert Frame("SEND", {"a": "b:c"}, version="1.0").raw == b"SEND\na:b:c\n\n\x00"


def test_lazy_headers_decode_on_first_use() -> None:
    parser = FrameParser(role="client", version="1.2", validate=False)
    (parsed,) = parser.feed(b"MESSAGE\na:x\\cy\n\nz\x00")
    assert isinstance(parsed, Frame)
    assert parsed._headers is None
    assert parsed.get("a") == "x:y"
    (bad,) = parser.feed(b"MESSAGE\na:x\\qy\n\nz\x00")
    with pytest.raises(StompProtocolError) as info:
        _ = bad.headers  # type: ignore[union-attr]
    assert info.value.kind == "bad-escape"


def test_unvalidated_parser_passes_unknown_commands() -> None:
    (parsed,) = FrameParser(role="client", validate=False).feed(b"FUTURE\nnocolon\n\n\x00")
    assert parsed.command == "FUTURE"  # type: ignore[union-attr]


def test_relay_unknown_passes_plain_unknown_commands_with_checked_headers() -> None:
    def parse(data: bytes) -> list[Any]:
        return fed(FrameParser(role="server", version="1.2", relay_unknown=True), data)

    assert parse(b"FOO\nreceipt:1\n\n\x00") == [
        frame("FOO", [("receipt", "1")], b"", b"FOO\nreceipt:1\n\n\x00")
    ]
    assert parse(b"MESSAGE\n\n\x00")[0][0] == "MESSAGE"
    assert parse(b"FOO\nnocolon\n\n\x00") == [("error", "bad-header")]
    # a command the broker might read as something else is still refused here
    assert parse(b"X\x01SEND\n\n\x00") == [("error", "unknown-command")]
    assert parse(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n") == [("error", "unknown-command")]


def test_command_sets() -> None:
    assert "SEND" in CLIENT_COMMANDS and "MESSAGE" not in CLIENT_COMMANDS
    assert SERVER_COMMANDS == {"CONNECTED", "MESSAGE", "RECEIPT", "ERROR"}


# -- limits --------------------------------------------------------------------------------------


def kind_of(parser: FrameParser, *chunks: bytes) -> str | None:
    try:
        for chunk in chunks:
            parser.feed(chunk)
    except StompProtocolError as exc:
        return exc.kind
    return None


def test_frame_too_large_without_content_length() -> None:
    limits = Limits(max_frame_bytes=100)
    head = b"SEND\na:b\n\n"
    ok = head + b"x" * (99 - len(head)) + b"\x00"
    assert len(ok) == 100
    assert kind_of(FrameParser(limits=limits), ok) is None
    assert kind_of(FrameParser(limits=limits), ok[:-1] + b"y\x00") == "frame-too-large"
    # and without waiting for a NUL that never comes
    assert kind_of(FrameParser(limits=limits), head, b"x" * 95) == "frame-too-large"
    assert kind_of(FrameParser(limits=limits), head + b"x" * 95) == "frame-too-large"


def test_declared_content_length_too_large_is_refused_at_once() -> None:
    parser = FrameParser(limits=Limits(max_frame_bytes=1000))
    assert kind_of(parser, b"SEND\ncontent-length:100000\n\n") == "frame-too-large"
    parser = FrameParser(role="client", validate=False, limits=Limits(max_frame_bytes=1000))
    assert kind_of(parser, b"MESSAGE\ncontent-length:99999999999999999999\n\n") == "frame-too-large"


def test_too_many_headers() -> None:
    limits = Limits(max_headers=3)
    three = b"SEND\na:1\nb:2\nc:3\n\n\x00"
    assert kind_of(FrameParser(limits=limits), three) is None
    four = b"SEND\na:1\nb:2\nc:3\nd:4\n\n\x00"
    assert kind_of(FrameParser(limits=limits), four) == "too-many-headers"


def test_header_section_too_large_complete_and_incomplete() -> None:
    limits = Limits(max_header_bytes=32)
    ok = b"SEND\n" + b"a:" + b"x" * 23 + b"\n\n"
    assert len(ok) == 32
    assert kind_of(FrameParser(limits=limits), ok + b"\x00") is None
    assert kind_of(FrameParser(limits=limits), ok[:-2] + b"y\n\n\x00") == "header-too-large"
    # Never buffer forever waiting for a blank line (nor for the end of the command line).
    assert kind_of(FrameParser(limits=limits), b"SEND\na:" + b"x" * 40) == "header-too-large"
    assert kind_of(FrameParser(limits=limits), b"S" * 40) == "header-too-large"
    parser = FrameParser(limits=limits)
    assert kind_of(parser, *[b"x"] * 40) == "header-too-large"


def test_buffer_overflow_when_the_caller_does_not_drain() -> None:
    parser = FrameParser(limits=Limits(max_frame_bytes=100, max_buffer_bytes=150))
    with pytest.raises(StompProtocolError) as info:
        for _ in range(20):
            parser.receive_data(b"SEND\n\nabc\x00")
    assert info.value.kind == "buffer-overflow"


def test_limits_default_buffer_follows_frame_limit() -> None:
    assert Limits(max_frame_bytes=10).max_buffer_bytes > 10
    assert Limits().max_buffer_bytes >= Limits().max_frame_bytes


# -- errors --------------------------------------------------------------------------------------


def test_parser_is_dead_after_an_error() -> None:
    parser = FrameParser()
    with pytest.raises(StompProtocolError) as first:
        parser.feed(b"BOGUS\n\n\x00")
    for call in (
        parser.next_event,
        lambda: parser.feed(b"SEND\n\n\x00"),
        lambda: parser.receive_data(b"x"),
    ):
        with pytest.raises(StompProtocolError) as again:
            call()
        assert again.value is first.value


def test_error_is_a_protocol_error_carrying_an_error_frame() -> None:
    parser = FrameParser(version="1.2")
    with pytest.raises(ProtocolError) as info:
        parser.feed(b"SEND\na:b\\t\n\n\x00")
    err = info.value
    assert isinstance(err, StompProtocolError)
    (reply,) = FrameParser(role="client", version="1.2").feed(err.error_frame)
    assert isinstance(reply, Frame)
    assert reply.command == "ERROR"
    assert reply.get("message") == str(err)
    assert "\n" not in str(err)
    assert reply.get("content-type") == "text/plain"
    assert reply.get("content-length") == str(len(reply.body))
    assert reply.body.decode() == err.detail


def test_feed_error_keeps_the_good_events_before_it() -> None:
    with pytest.raises(StompProtocolError) as info:
        FrameParser().feed(b"\nSEND\n\nok\x00SEND\nbad\n\n\x00")
    assert [normal(e) for e in info.value.events] == [HB, ("SEND", [], b"ok", b"SEND\n\nok\x00")]


def test_error_frame_contents() -> None:
    raw = error_frame(
        "bad\nthing: here",
        detail="long\nexplanation",
        receipt_id="r-1",
        headers=[("x-extra", "1")],
    )
    (reply,) = FrameParser(role="client", version="1.2").feed(raw)
    assert isinstance(reply, Frame)
    assert reply.headers == [
        ("message", "bad thing: here"),
        ("receipt-id", "r-1"),
        ("x-extra", "1"),
        ("content-type", "text/plain"),
        ("content-length", "16"),
    ]
    assert reply.body == b"long\nexplanation"
    assert b"message:bad thing\\c here\n" in raw
    assert error_frame("x", version="1.0").startswith(b"ERROR\nmessage:x\n")
    assert b"receipt-id" not in error_frame("x")


# -- the parser object ---------------------------------------------------------------------------


def test_version_is_settable_and_checked() -> None:
    parser = FrameParser()
    assert parser.version is None
    (connect,) = parser.feed(b"CONNECT\naccept-version:1.0,1.1\n\n\x00")
    parser.version = "1.0"
    (send,) = parser.feed(b"SEND\na:b\\c\n\n\x00")
    assert send.get("a") == "b\\c"  # type: ignore[union-attr]
    parser.version = "1.2"
    (send,) = parser.feed(b"SEND\na:b\\c\n\n\x00")
    assert send.get("a") == "b:"  # type: ignore[union-attr]
    with pytest.raises(ValueError):
        parser.version = "2.0"
    with pytest.raises(ValueError):
        FrameParser(role="proxy")


def test_version_change_rereads_a_half_received_frame() -> None:
    parser = FrameParser(version="1.0")
    assert parser.feed(b"SEND\na:b\\c\n\nbo") == []
    parser.version = "1.2"
    (send,) = parser.feed(b"dy\x00")
    assert send.get("a") == "b:"  # type: ignore[union-attr]
    assert send.body == b"body"  # type: ignore[union-attr]


def test_lone_cr_waits_then_joins_the_command() -> None:
    parser = FrameParser()
    assert parser.feed(b"\r") == []
    assert parser.feed(b"\n") == [HEARTBEAT]
    assert parser.feed(b"\r") == []
    assert kind_of(parser, b"SEND\n\n\x00") == "unknown-command"


def test_accepts_bytearray_and_memoryview_and_ignores_empty() -> None:
    parser = FrameParser()
    assert parser.feed(b"") == []
    parser.receive_data(bytearray(b"SEND\n\n"))
    parser.receive_data(memoryview(b"x\x00"))
    event = parser.next_event()
    assert isinstance(event, Frame) and event.raw == b"SEND\n\nx\x00"
    assert isinstance(event.raw, bytes) and isinstance(event.body, bytes)
    assert parser.next_event() is NEED_DATA


def test_large_frame_in_small_chunks_is_linear_enough() -> None:
    body = b"x" * (2 * 1024 * 1024)
    data = serialize("SEND", {"content-length": str(len(body))}, body)
    parser = FrameParser()
    got = []
    for i in range(0, len(data), 1024):
        got += parser.feed(data[i : i + 1024])
    assert len(got) == 1 and got[0].body == body  # type: ignore[union-attr]
    data = serialize("SEND", {}, body)  # NUL-terminated, no content-length
    parser = FrameParser()
    got = []
    for i in range(0, len(data), 1024):
        got += parser.feed(data[i : i + 1024])
    assert len(got) == 1 and got[0].body == body  # type: ignore[union-attr]

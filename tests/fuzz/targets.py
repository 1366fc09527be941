"""Fuzz targets: one function per target, taking one input's bytes.

Each returns normally when the code under test behaved: it parsed, or it raised the one error
its protocol allows (StompProtocolError, AmqpProtocolError, InvalidSelector). Anything else,
an AssertionError on a broken invariant included, escapes and is a finding. No fuzzer is
imported here, so the same functions run under atheris (tests/fuzz/run.py), under pytest on
the seed corpus, and as regression tests.

An input starts with option bytes the harness reads (which STOMP version, small limits,
where to cut the stream...); the rest is what the peer sends.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from pamqp import commands

from adapters import rabbitmq
from bridge.frontends.amqp import AmqpProtocolError, Framer, ProxyConnection
from bridge.frontends.amqp.assembler import Message
from bridge.frontends.amqp.builders import PROTOCOL_HEADER
from bridge.frontends.amqp.connection import Answer, Forward, PlainRun
from bridge.frontends.amqp.framer import Frame as AmqpFrame
from bridge.frontends.amqp.framer import ProtocolHeader
from bridge.frontends.amqp.translate import PublishScreen
from bridge.frontends.stomp import (
    HEARTBEAT,
    Frame,
    FrameParser,
    Limits,
    StompProtocolError,
    serialize,
)
from bridge.frontends.stomp.session import Output, Session
from bridge.intercept.chain import Chain
from bridge.intercept.delay import DelayInterceptor
from bridge.intercept.guard import StagingGuard
from bridge.intercept.redelivery import RedeliveryInterceptor
from bridge.staging.levels import Layout
from policies.delay import DelayConfig
from policies.errors import InvalidSelector, Refused
from policies.redelivery import compile_table
from policies.selector import ACTIVEMQ, RABBITMQ, compile_selector, parse

NOW = 1_800_000_000_000
SMALL = Limits(max_frame_bytes=300, max_headers=3, max_header_bytes=120)
LIMITS = (Limits(), SMALL)
VERSIONS = (None, "1.0", "1.1", "1.2")


def _chain() -> Chain:
    """The interceptors ``jms-bridge run`` puts in front of a STOMP client, on a fixed clock."""
    layout = Layout()
    table = compile_table({"/queue/orders": "2:1000; 3:move(queue:dlq$error)",
                           "/queue/gone": "delete"})
    return Chain([
        StagingGuard(layout),
        DelayInterceptor(fmt=rabbitmq.FORMAT, config=DelayConfig(), layout=layout,
                         clock=lambda: NOW),
        RedeliveryInterceptor(table=table, fmt=rabbitmq.FORMAT, layout=layout,
                              undelivered="/queue/jms-bridge.undelivered",
                              clock=lambda: NOW, rand=lambda: 0.5),
    ])


_CHAIN = _chain()  # shared by every session, as in the bridge


def _cuts(data: bytes, step: int) -> list[bytes]:
    """``data`` in pieces of ``step`` bytes (0: in two halves)."""
    if step == 0:
        return [data[: len(data) // 2], data[len(data) // 2 :]]
    return [data[i : i + step] for i in range(0, len(data), step)] or [b""]


def _connect(version: str | None) -> bytes:
    headers = [("login", "u"), ("passcode", "p"), ("host", "/")]
    if version is not None:
        headers.insert(0, ("accept-version", version))
    return serialize("CONNECT", headers, b"")


# -- STOMP -------------------------------------------------------------------------------------

def _stomp_events(chunks: list[bytes], version: str | None, limits: Limits,
                  role: str) -> list[object]:
    """What a parser makes of the chunks: each event, then the error kind if one ended it."""
    parser = FrameParser(role=role, version=version, limits=limits, validate=role == "server")
    out: list[object] = []
    for chunk in chunks:
        try:
            events = parser.feed(chunk)
        except StompProtocolError as exc:
            out += [_stomp_event(e) for e in exc.events]
            out.append(("error", exc.kind))
            assert exc.error_frame.startswith(b"ERROR\n") and exc.error_frame.endswith(b"\0")
            return out
        out += [_stomp_event(e) for e in events]
    return out


def _stomp_event(event: object) -> object:
    if event is HEARTBEAT:
        return "heartbeat"
    assert isinstance(event, Frame), event
    assert event.raw.endswith(b"\0"), event.raw
    try:
        headers = event.headers  # decoded now if the parser left it for later
    except StompProtocolError as exc:  # only an unvalidated (broker-side) frame may fail here
        headers = [("error", exc.kind)]
    assert all(type(n) is str and type(v) is str for n, v in headers)
    return (event.command, event.raw, event.body, tuple(headers))


def _check_output(out: Output) -> None:
    assert all(type(b) is bytes for b in out.to_broker), out
    assert all(type(b) is bytes for b in out.to_client), out


def stomp(data: bytes) -> None:
    """A client (or broker) sends ``data`` after a valid CONNECT; options in the first 2 bytes.

    byte 0: bits 0-1 the CONNECT's accept-version, bit 2 small limits, bit 3 the broker has
    answered CONNECTED, bit 4 the bytes come from the broker instead; byte 1: piece size
    (0: two halves).
    """
    if len(data) < 2:
        return
    options, step, payload = data[0], data[1] % 64, data[2:]
    version = VERSIONS[options & 3]
    limits = LIMITS[options >> 2 & 1]
    connected = bool(options & 8)
    from_broker = bool(options & 16)
    # The codec alone: how the bytes are cut never changes what is parsed.
    role = "client" if from_broker else "server"
    stream = payload if from_broker else _connect(version) + payload
    whole = _stomp_events([stream], version, limits, role)
    pieces = _stomp_events(_cuts(stream, step), version, limits, role)
    assert whole == pieces, (whole, pieces)
    # The session: every outcome is Output, a protocol error included.
    session = Session(chain=_CHAIN, limits=limits)
    _check_output(session.from_client(_connect(version)))
    if connected or from_broker:
        answer = serialize("CONNECTED", [("version", version or "1.0"), ("heart-beat", "0,0")],
                           b"")
        _check_output(session.from_broker(answer))
    for piece in _cuts(payload, step):
        out = session.from_broker(piece) if from_broker else session.from_client(piece)
        _check_output(out)
        while out.check is not None:  # no target checks here: resume at once
            out = session.resume()
            _check_output(out)
        if out.close is not None:
            break
    _check_output(session.client_lost())


# -- AMQP 0-9-1 --------------------------------------------------------------------------------

def method(value: Any, channel: int = 0) -> bytes:
    from pamqp import frame

    return bytes(frame.marshal(value, channel))


HANDSHAKE = (
    method(commands.Connection.StartOk(client_properties={}, mechanism="PLAIN",
                                       response="\0u\0p"))
    + method(commands.Connection.TuneOk(2047, 131072, 0))
    + method(commands.Connection.Open(virtual_host="/"))
    + method(commands.Channel.Open(), 1)
)
_SCREEN = PublishScreen(Chain([StagingGuard(Layout()),
                               DelayInterceptor(fmt=rabbitmq.FORMAT, config=DelayConfig(),
                                                layout=Layout(), clock=lambda: NOW)]))


def _run(coroutine: Coroutine[Any, Any, Any] | bytes | None) -> Any:
    """The publish screen's answer: a coroutine (when it holds) that never waits (no target
    checks here) run to its end."""
    if coroutine is None or isinstance(coroutine, bytes):
        return coroutine
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise AssertionError("the publish screen waited with no check to wait for")


def _amqp_frames(chunks: list[bytes]) -> list[object]:
    framer = Framer(expect_header=True, validate=True)
    out: list[object] = []
    for chunk in chunks:
        try:
            events = framer.feed(chunk)
        except AmqpProtocolError as exc:
            out += [e.raw for e in exc.events]
            out.append(("error", exc.reply_code, exc.bad_header))
            assert exc.reply()
            return out
        for event in events:
            assert isinstance(event, AmqpFrame | ProtocolHeader), event
            out.append(event.raw)
    return out


def amqp(data: bytes) -> None:
    """A client sends ``data`` after AMQP 0-9-1's protocol header; options in 2 bytes.

    byte 0: bit 0 a handshake (Start-Ok, Tune-Ok, Open, Channel.Open 1) goes first, bit 1
    publishes are offered to the delay interceptor, bit 2 plain publishes take the fast path
    (``fastpath``: what the relay does); byte 1: piece size (0: two halves).
    """
    if len(data) < 2:
        return
    options, step, payload = data[0], data[1] % 64, data[2:]
    stream = PROTOCOL_HEADER + (HANDSHAKE if options & 1 else b"") + payload
    whole = _amqp_frames([stream])
    pieces = _amqp_frames(_cuts(stream, step))
    assert whole == pieces, (whole, pieces)
    conn = ProxyConnection(max_body_size=1024)
    if options & 4:
        conn.screen_needles = _SCREEN.needles
    for piece in _cuts(stream, step):
        try:
            events = conn.client_data(piece)
        except AmqpProtocolError as exc:
            assert exc.reply()
            return
        for event in events:
            assert isinstance(event, AmqpFrame | ProtocolHeader | Message | Forward | Answer
                              | PlainRun)
            if type(event) is Message and options & 2:
                try:
                    replaced = _run(_SCREEN(event, conn))
                except Refused:
                    conn.refuse(event.channel, "refused")
                    continue
                except AmqpProtocolError as exc:  # properties pamqp cannot read, when read:
                    assert exc.reply()  # the relay closes the connection with this
                    return
                assert replaced is None or type(replaced) is bytes


# -- selectors ---------------------------------------------------------------------------------

HEADER_NAMES = ("a", "b", "priority", "type", "redelivered", "destination", "timestamp",
                "amqp-message-id", "x")


def selector(data: bytes) -> None:
    """A JMS selector: the text up to the first NUL; each NUL-separated part after it is
    the value of one header (``HEADER_NAMES`` in turn) of the message it is evaluated on."""
    text, *values = data.decode("utf-8", "replace").split("\0")
    headers = dict(zip(HEADER_NAMES, values, strict=False))
    try:
        tree = parse(text)
    except InvalidSelector as error:
        assert 1 <= error.column <= len(text) + 1, (error.column, len(text))
        return
    for mapping in (ACTIVEMQ, RABBITMQ):
        compiled = compile_selector(tree, mapping)
        result = compiled.evaluate(headers)
        assert result in (True, False, None), result
        assert compiled.matches(headers) is (result is True)


TARGETS: dict[str, Callable[[bytes], None]] = {"stomp": stomp, "amqp": amqp, "selector": selector}

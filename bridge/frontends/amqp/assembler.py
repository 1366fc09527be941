"""Frames -> messages: a content-bearing method, its content header and its body frames, per
channel, assembled into one ``Message`` that keeps the original bytes of all its frames.

Frames of other channels may arrive in between (AMQP interleaves channels, never the frames
of one message). Content in any other sequence is 505 UNEXPECTED_FRAME, as RabbitMQ answers.
"""

from __future__ import annotations

from typing import Any, Final

from pamqp import base, commands

from bridge.frontends.amqp.errors import AmqpProtocolError, ReplyCode
from bridge.frontends.amqp.framer import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_METHOD,
    MAX_BODY_SIZE,
    Frame,
    Framer,
    method_name,
)

# Method indexes ((class id << 16) | method id) of the methods followed by content.
PUBLISH: Final = commands.Basic.Publish.index
DELIVER: Final = commands.Basic.Deliver.index
GET_OK: Final = commands.Basic.GetOk.index
RETURN: Final = commands.Basic.Return.index
CLIENT_CONTENT: Final = frozenset({PUBLISH})
BROKER_CONTENT: Final = frozenset({DELIVER, GET_OK, RETURN})


class Message:
    """One whole message: its method frame, content header frame and body frames, as sent."""

    __slots__ = ("channel", "method_frame", "header_frame", "body_frames")

    def __init__(
        self, channel: int, method_frame: Frame, header_frame: Frame, body_frames: list[Frame]
    ) -> None:
        self.channel = channel
        self.method_frame = method_frame
        self.header_frame = header_frame
        self.body_frames = body_frames

    def __repr__(self) -> str:
        return (
            f"<Message {method_name(self.method_frame.method_index)} channel={self.channel} "
            f"body={self.header_frame.body_size}B frames={2 + len(self.body_frames)}>"
        )

    @property
    def method(self) -> base.Frame:
        """The decoded method: Basic.Publish, Basic.Deliver, Basic.GetOk or Basic.Return."""
        return self.method_frame.method

    @property
    def frames(self) -> list[Frame]:
        return [self.method_frame, self.header_frame, *self.body_frames]

    @property
    def raw(self) -> bytes:
        """Every frame's original bytes, in order: what the relay forwards unchanged."""
        return b"".join(frame.raw for frame in self.frames)

    @property
    def body(self) -> bytes:
        return b"".join(frame.raw[7:-1] for frame in self.body_frames)

    @property
    def body_size(self) -> int:
        return self.header_frame.body_size

    @property
    def properties(self) -> commands.Basic.Properties:
        """The properties, decoded by pamqp on first use (502 SYNTAX_ERROR if they cannot be)."""
        props = self.header_frame.content_header.properties
        assert isinstance(props, commands.Basic.Properties)
        return props

    @property
    def headers(self) -> dict[str, Any]:
        """The application headers table (empty when there is none)."""
        return dict(self.properties.headers or {})


class _Pending:
    __slots__ = ("method", "header", "bodies", "received")

    def __init__(self, method: Frame) -> None:
        self.method = method
        self.header: Frame | None = None
        self.bodies: list[Frame] = []
        self.received = 0


class Assembler:
    """Assembles the messages of one direction of a connection.

    ``receive(frame)`` returns the frame itself when it is not part of a message, ``None``
    while a message is incomplete, and the ``Message`` with its last frame. ``content``
    names the methods that carry content in this direction (CLIENT_CONTENT or BROKER_CONTENT).
    A content header announcing more than ``max_body_size`` bytes is refused with 406
    PRECONDITION_FAILED on its channel (RabbitMQ's answer to a message above its maximum).
    """

    __slots__ = ("_content", "_max_body", "_pending")

    def __init__(
        self, content: frozenset[int] = CLIENT_CONTENT, *, max_body_size: int = MAX_BODY_SIZE
    ) -> None:
        self._content = content
        self._max_body = max_body_size
        self._pending: dict[int, _Pending] = {}

    @property
    def idle(self) -> bool:
        """No message is waiting for more frames."""
        return not self._pending

    @property
    def held(self) -> int:
        """Body bytes of messages received in part and held until they are complete."""
        return sum(waiting.received for waiting in self._pending.values())

    def pending(self, channel: int) -> bool:
        """Whether a message on ``channel`` is waiting for more frames."""
        return channel in self._pending

    def forget(self, channel: int) -> None:
        """Drop a half-received message, e.g. when its channel is closed."""
        self._pending.pop(channel, None)

    def receive(self, frame: Frame) -> Frame | Message | None:
        kind = frame.type
        channel = frame.channel
        if kind == FRAME_METHOD:
            waiting = self._pending.get(channel)
            if waiting is not None:
                expected = "content header" if waiting.header is None else "content body"
                raise _unexpected(
                    f"expected {expected} for {method_name(waiting.method.method_index)} "
                    f"on channel {channel}, got {method_name(frame.method_index)}",
                    frame,
                )
            if frame.method_index in self._content:
                if channel == 0:
                    raise _unexpected(f"{method_name(frame.method_index)} on channel 0", frame)
                self._pending[channel] = _Pending(frame)
                return None
            return frame
        if kind != FRAME_HEADER and kind != FRAME_BODY:
            return frame  # a heartbeat
        what = "content header" if kind == FRAME_HEADER else "content body"
        if channel == 0:
            raise _unexpected(f"{what} frame on channel 0", frame)
        waiting = self._pending.get(channel)
        if waiting is None:
            raise _unexpected(f"{what} frame on channel {channel} without a method before it")
        if kind == FRAME_HEADER:
            if waiting.header is not None:
                raise _unexpected(f"second content header on channel {channel}")
            content_class = frame.content_class
            method_class = waiting.method.method_index >> 16
            if content_class != method_class:
                raise _unexpected(
                    f"content header for class {content_class} on channel {channel}, "
                    f"expected class {method_class}"
                )
            size = frame.body_size
            if size > self._max_body:
                del self._pending[channel]
                raise AmqpProtocolError(
                    ReplyCode.PRECONDITION_FAILED,
                    f"message size {size} is larger than configured max size {self._max_body}",
                    class_id=method_class,
                    method_id=waiting.method.method_index & 0xFFFF,
                    channel=channel,
                )
            waiting.header = frame
            if size == 0:
                return self._complete(channel, waiting)
            return None
        if waiting.header is None:
            raise _unexpected(f"content body frame on channel {channel} before its header")
        waiting.received += len(frame.raw) - 8
        if waiting.received > waiting.header.body_size:
            raise _unexpected(
                f"content body on channel {channel} is {waiting.received} bytes or more, "
                f"its header announced {waiting.header.body_size}"
            )
        waiting.bodies.append(frame)
        if waiting.received == waiting.header.body_size:
            return self._complete(channel, waiting)
        return None

    def _complete(self, channel: int, waiting: _Pending) -> Message:
        del self._pending[channel]
        assert waiting.header is not None
        return Message(channel, waiting.method, waiting.header, waiting.bodies)


def _unexpected(text: str, frame: Frame | None = None) -> AmqpProtocolError:
    class_id = method_id = 0
    if frame is not None and frame.type == FRAME_METHOD:
        class_id, method_id = divmod(frame.method_index, 0x10000)
    return AmqpProtocolError(
        ReplyCode.UNEXPECTED_FRAME, text, class_id=class_id, method_id=method_id
    )


def whole_message(raw: bytes) -> Message:
    """A message from the broker made again from all of its frames' bytes (as a fast path
    kept them)."""
    assembler = Assembler(BROKER_CONTENT, max_body_size=1 << 62)
    for frame in Framer(expect_header=False, validate=False, frame_max=0).feed(raw):
        assert isinstance(frame, Frame)
        made = assembler.receive(frame)
        if isinstance(made, Message):
            return made
    raise ValueError("not a whole message")

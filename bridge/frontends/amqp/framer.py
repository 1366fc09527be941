"""Bytes -> AMQP 0-9-1 frames with limits, h11 style: receive_data(), next_event(), no I/O.

Frame boundaries are read here (type, channel, size, frame-end octet); what is inside a frame
is decoded by pamqp, on demand. Every frame keeps its original bytes (``raw``): the relay
forwards those, because pamqp re-encodes tables in another order and narrows integers, so a
decoded-then-encoded frame is not the frame the peer sent.

Chunks are kept aside until they can complete the frame being waited for, and only then
joined, so a large frame arriving in small pieces costs linear time, not quadratic.
"""

from __future__ import annotations

from typing import Any, Final

from pamqp import base, commands
from pamqp import frame as pframe
from pamqp import header as pheader

from adapters.amqp_octets import u16, u32, u64
from adapters.amqp_properties import read_content_header, read_values
from adapters.amqp_tables import check_method, check_properties
from bridge.frontends.amqp.builders import FRAME_OVERHEAD, PROTOCOL_HEADER
from bridge.frontends.amqp.errors import AmqpProtocolError, ReplyCode

FRAME_METHOD: Final = 1
FRAME_HEADER: Final = 2
FRAME_BODY: Final = 3
FRAME_HEARTBEAT: Final = 8
FRAME_END: Final = 0xCE
FRAME_TYPES: Final = frozenset({FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT})
# The largest frame a peer may send before Connection.Tune-Ok agrees on frame_max (the
# spec's frame-min-size; RabbitMQ enforces it during the handshake too).
FRAME_MIN_SIZE: Final = 4096
# The cap on a frame when frame_max is agreed as 0 ("no limit"): RabbitMQ's largest message.
MAX_BODY_SIZE: Final = 128 * 1024 * 1024



class NeedData:
    """The NEED_DATA sentinel's type: no complete frame yet."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = NeedData()


class ProtocolHeader:
    """The 8-byte protocol header a client opens with."""

    __slots__ = ("raw",)

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def __repr__(self) -> str:
        return f"ProtocolHeader({self.raw!r})"


def method_name(index: int) -> str:
    """pamqp's name of a method index, e.g. ``Basic.Publish``; hex when unknown."""
    cls = commands.INDEX_MAPPING.get(index)
    return str(getattr(cls, "name", f"method 0x{index:08x}"))


class Frame:
    """One frame as it came: ``raw`` is every byte of it, frame-end octet included."""

    __slots__ = ("type", "channel", "raw", "_decoded", "_values", "checked")

    def __init__(self, frame_type: int, channel: int, raw: bytes) -> None:
        self.type = frame_type
        self.channel = channel
        self.raw = raw
        self._decoded: object = None
        self._values: list[Any] | None = None
        self.checked = False  # a content header whose properties ``check_frame`` walked

    def __repr__(self) -> str:
        kind = {1: "method", 2: "header", 3: "body", 8: "heartbeat"}.get(self.type, "?")
        what = f" {method_name(self.method_index)}" if self.type == FRAME_METHOD else ""
        return f"<Frame {kind}{what} channel={self.channel} size={len(self.raw)}>"

    @property
    def payload(self) -> bytes:
        return self.raw[7:-1]

    @property
    def method_index(self) -> int:
        """(class id << 16) | method id of a method frame, without decoding its arguments."""
        return u32(self.raw, 7)

    @property
    def method(self) -> base.Frame:
        """The decoded method (pamqp), decoded once; AmqpProtocolError 502 if it cannot be."""
        if self._decoded is None:
            if self.type != FRAME_METHOD:
                raise TypeError(f"{self!r} is not a method frame")
            self._decoded = _decode(self, "method")
        assert isinstance(self._decoded, base.Frame)
        return self._decoded

    @property
    def body_size(self) -> int:
        """A content header's declared body size, read without decoding the properties."""
        return u64(self.raw, 11)

    @property
    def content_class(self) -> int:
        return u16(self.raw, 7)

    @property
    def content_header(self) -> pheader.ContentHeader:
        """The decoded content header (pamqp), decoded once; AmqpProtocolError 502 if not."""
        if self._decoded is None:
            if self.type != FRAME_HEADER:
                raise TypeError(f"{self!r} is not a content header frame")
            self._decoded = _decode(self, "content header")
        assert isinstance(self._decoded, pheader.ContentHeader)
        return self._decoded

    @property
    def values(self) -> list[Any]:
        """A content header's 14 property values in wire order (``properties.read_values``),
        read once, without building pamqp's objects; AmqpProtocolError 502 if they cannot be."""
        if self._values is None:
            if self.type != FRAME_HEADER:
                raise TypeError(f"{self!r} is not a content header frame")
            found = _decode(self, "content header", values=True)
            assert isinstance(found, list)
            self._values = found
        return self._values


def _decode(frame: Frame, what: str, *, values: bool = False) -> object:
    """pamqp's reading of one whole frame (a content header's by ``properties``, to pamqp's
    values), after ``tables`` has checked its bounds (pamqp would loop forever on some). Its
    errors are translated here, the one edge where a frame is decoded, into 502 SYNTAX_ERROR:
    pamqp raises many kinds (its own, struct.error, ValueError, IndexError,
    UnicodeDecodeError) for bytes it cannot read."""
    try:
        if frame.type == FRAME_METHOD:
            method_class = commands.INDEX_MAPPING.get(frame.method_index)
            if method_class is None:
                raise ValueError("unknown method")
            check_method(method_class, frame.raw[11:-1])
            return pframe.unmarshal(frame.raw)[2]
        payload = frame.raw[7:-1]
        if not frame.checked:
            check_properties(payload)
            frame.checked = True
        return read_values(payload) if values else read_content_header(payload)
    except Exception as exc:  # noqa: BLE001 - see the docstring
        class_id = method_id = 0
        if frame.type == FRAME_METHOD and len(frame.raw) >= 11:
            class_id, method_id = divmod(frame.method_index, 0x10000)
            what = method_name(frame.method_index)
        raise AmqpProtocolError(
            ReplyCode.SYNTAX_ERROR,
            f"cannot decode {what} on channel {frame.channel}: {exc}"[:200],
            class_id=class_id,
            method_id=method_id,
        ) from None


Event = Frame | ProtocolHeader


class Framer:
    """Frames from one direction of a connection.

    ``expect_header=True`` reads a client: its first 8 bytes must be AMQP 0-9-1's protocol
    header exactly, else the error's reply is the header RabbitMQ answers with. ``validate``
    decodes every method frame on arrival (502 when pamqp cannot), checks heartbeats and
    content headers; without it (the trusted broker side) only frame boundaries are checked.
    ``frame_max`` is the largest frame accepted, including its 8 bytes of overhead; 0 means
    "no limit", capped at ``max_frame_cap``.
    """

    __slots__ = (
        "_expect_header", "_validate", "_frame_max", "_limit", "_cap",
        "_data", "_pos", "_more", "_more_len", "_need", "_error",
    )  # fmt: skip

    def __init__(
        self,
        *,
        expect_header: bool = True,
        validate: bool = True,
        frame_max: int = FRAME_MIN_SIZE,
        max_frame_cap: int = MAX_BODY_SIZE + FRAME_OVERHEAD,
    ) -> None:
        self._expect_header = expect_header
        self._validate = validate
        self._cap = max_frame_cap
        self._frame_max = frame_max
        self._limit = min(frame_max, max_frame_cap) if frame_max else max_frame_cap
        self._data = b""
        self._pos = 0
        self._more: list[bytes] = []
        self._more_len = 0
        self._need = 1  # bytes needed from _pos before parsing is worth trying
        self._error: AmqpProtocolError | None = None

    @property
    def frame_max(self) -> int:
        """The agreed frame_max (0: no limit agreed); settable when Tune-Ok is seen."""
        return self._frame_max

    @frame_max.setter
    def frame_max(self, value: int) -> None:
        self._frame_max = value
        self._limit = min(value, self._cap) if value else self._cap

    @property
    def idle(self) -> bool:
        """At a frame boundary: past the protocol header, nothing buffered, no error."""
        return (self._error is None and not self._expect_header and not self._more
                and self._pos >= len(self._data))

    @property
    def limit(self) -> int:
        """The largest frame accepted now, its 8 bytes of overhead included."""
        return self._limit

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as a frame."""
        return len(self._data) - self._pos + self._more_len

    def receive_data(self, data: bytes) -> None:
        """Buffer bytes from the peer; nothing is parsed until next_event()."""
        if self._error is not None:
            raise self._error
        if data:
            self._more.append(bytes(data))
            self._more_len += len(data)

    def next_event(self) -> Event | NeedData:
        """The next frame (or the protocol header), or NEED_DATA.

        Raises AmqpProtocolError, and then the same error on every later call.
        """
        if self._error is not None:
            raise self._error
        if self.buffered < self._need:
            return NEED_DATA
        if self._more:
            self._join()
        try:
            return self._parse()
        except AmqpProtocolError as exc:
            self._error = exc
            raise

    def feed(self, data: bytes) -> list[Event]:
        """receive_data(data), then every complete event; on an error the events parsed
        from this call before it are in the error's ``events``."""
        self.receive_data(data)
        events: list[Event] = []
        while True:
            try:
                event = self.next_event()
            except AmqpProtocolError as exc:
                exc.events = list(events)
                raise
            if event is NEED_DATA:
                return events
            events.append(event)  # type: ignore[arg-type]

    def _join(self) -> None:
        more = self._more
        if self._pos >= len(self._data) and len(more) == 1:
            self._data = more[0]
        else:
            more.insert(0, self._data[self._pos :])
            self._data = b"".join(more)
        self._pos = 0
        more.clear()
        self._more_len = 0

    def _parse(self) -> Event | NeedData:
        data, pos = self._data, self._pos
        avail = len(data) - pos
        if self._expect_header:
            seen = data[pos : pos + 8]
            if not PROTOCOL_HEADER.startswith(seen):
                raise AmqpProtocolError(
                    ReplyCode.FRAME_ERROR,
                    f"bad protocol header {seen!r}: AMQP 0-9-1 only",
                    bad_header=True,
                )
            if avail < 8:
                self._need = 8
                return NEED_DATA
            self._expect_header = False
            self._advance(8)
            return ProtocolHeader(seen)
        if avail < 7:
            self._need = 7
            return NEED_DATA
        frame_type, channel, size = data[pos], u16(data, pos + 1), u32(data, pos + 3)
        if frame_type not in FRAME_TYPES:
            raise AmqpProtocolError(
                ReplyCode.FRAME_ERROR,
                f"unknown frame type {frame_type}, first octets {data[pos:pos + 7]!r}",
            )
        total = size + FRAME_OVERHEAD
        if total > self._limit:
            raise AmqpProtocolError(
                ReplyCode.FRAME_ERROR,
                f"frame of {total} bytes on channel {channel} exceeds frame_max {self._limit}",
            )
        if avail < total:
            self._need = total
            return NEED_DATA
        end = pos + total
        if data[end - 1] != FRAME_END:
            raise AmqpProtocolError(
                ReplyCode.FRAME_ERROR,
                f"frame end octet 0x{data[end - 1]:02x} on channel {channel}, not 0xce",
            )
        frame = Frame(frame_type, channel, data[pos:end])
        self._advance(total)
        if self._validate:
            check_frame(frame)
        return frame

    def _advance(self, count: int) -> None:
        self._pos += count
        self._need = 1
        if self._pos >= len(self._data):
            self._data = b""
            self._pos = 0


def check_frame(frame: Frame) -> None:
    """What a frame must be on its own (the assembler checks frames in their sequence)."""
    size = len(frame.raw) - 8
    if frame.type == FRAME_METHOD:
        if size < 4:
            raise AmqpProtocolError(
                ReplyCode.SYNTAX_ERROR, f"method frame of {size} bytes on channel {frame.channel}"
            )
        if frame.method_index != _PUBLISH or not plain_publish(frame.raw):
            frame.method  # noqa: B018 - decoded now, so that a bad one is refused now
    elif frame.type == FRAME_HEARTBEAT:
        if frame.channel != 0 or size != 0:
            raise AmqpProtocolError(
                ReplyCode.FRAME_ERROR,
                f"heartbeat frame on channel {frame.channel} with {size} payload bytes",
            )
    elif frame.type == FRAME_HEADER:
        if size < 14:
            raise AmqpProtocolError(
                ReplyCode.SYNTAX_ERROR,
                f"content header frame of {size} bytes on channel {frame.channel}",
            )
        # Walked now, so that properties out of bounds (on which pamqp would loop or fail)
        # are refused here, as a connection error. pamqp decodes them when someone reads
        # them (the publish screen, only for a publish that may ask for a delay); what it
        # cannot read then is the same 502 (``_decode``).
        try:
            check_properties(frame.raw[7:-1])
            frame.checked = True
        except ValueError as exc:
            raise AmqpProtocolError(
                ReplyCode.SYNTAX_ERROR,
                f"cannot decode content header on channel {frame.channel}: {exc}"[:200],
            ) from None


_PUBLISH: Final = commands.Basic.Publish.index


def plain_publish(raw: bytes) -> bool:
    """Whether a Basic.Publish frame is exactly what pamqp reads without fault: ticket,
    exchange and routing key (UTF-8 short strings), one octet of bits, nothing more. Checked
    on the bytes, as pamqp's decoding of every publish is the relay's largest cost; anything
    else is decoded (and refused) the slow way."""
    return plain_publish_fields(raw) is not None


def plain_publish_fields(raw: bytes) -> tuple[str, str, bool] | None:
    """(exchange, routing key, mandatory) of a Basic.Publish frame of the plain layout
    (``plain_publish``), read off its bytes; None for any other."""
    end = len(raw) - 1
    if 13 >= end:  # the frame header, class, method and ticket come first
        return None
    key_at = 14 + raw[13]
    if key_at >= end:
        return None
    bits_at = key_at + 1 + raw[key_at]
    if bits_at + 1 != end:
        return None
    try:
        return (raw[14:key_at].decode(), raw[key_at + 1:bits_at].decode(),
                bool(raw[bits_at] & 1))
    except UnicodeDecodeError:
        return None

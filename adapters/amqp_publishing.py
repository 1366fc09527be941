"""Publishing in AMQP 0-9-1 transactions, without I/O: the client side of one connection with
one channel in transaction mode. Bytes from the broker go in (``receive_data``) and events come
out; a batch of publishes goes in (``commit``) and bytes to write come out (``data_to_send``).
``adapters.rabbitmq_publisher`` is the socket around it.

A batch is its publishes and a ``Tx.Commit`` written at once; the broker answers with a
``Returned`` for each mandatory publish it could not route, then ``Committed``. A publish's
method and content frames are built here; its properties come encoded by the caller (the
adapter encodes ``pika.BasicProperties`` as pika writes them, so a header table keeps the types
it has on every other path).

Every transition is in ``_NEXT``: (state, method received) -> next state. Connection.Close,
Channel.Close, Connection.Blocked/Unblocked and heart-beats are taken in any open state; any
other frame not in the table is a ``PublishingProtocolError`` carrying the reply code to close
the connection with.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from pamqp import commands
from pamqp import exceptions as pexceptions
from pamqp import frame as pframe

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
FRAME_END = 0xCE
_FRAME_HEAD = struct.Struct(">BHI")
_HEADER_HEAD = struct.Struct(">HHQ")
_PUBLISH = struct.pack(">HHH", 60, 40, 0)  # Basic.Publish, reserved ticket
_OVERHEAD = _FRAME_HEAD.size + 1
FRAME_MIN = 4096  # what either side may send before Tune (AMQP 0-9-1 frame-min-size)
CHANNEL = 1

# Reply codes a client closes the connection with when the broker breaks the protocol.
FRAME_ERROR = 501
UNEXPECTED_FRAME = 505


class PublishingProtocolError(Exception):
    """The broker sent what this client cannot take. ``reply_code``: what to close with."""

    def __init__(self, text: str, reply_code: int = UNEXPECTED_FRAME) -> None:
        super().__init__(text)
        self.reply_code = reply_code


# -- events ---------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Ready:
    """The channel is open in transaction mode: publish, then commit."""


@dataclass(frozen=True, slots=True)
class Committed:
    """Tx.Commit-Ok: every publish of the batch not returned is on its queues."""


@dataclass(frozen=True, slots=True)
class Returned:
    """A mandatory publish the broker could not route (Basic.Return and its content)."""

    reply_code: int
    reply_text: str
    exchange: str
    routing_key: str
    body: bytes


@dataclass(frozen=True, slots=True)
class ChannelClosed:
    """The broker closed the channel: nothing of an uncommitted batch was put. Close-Ok is
    queued; ``open_channel`` opens it again."""

    reply_code: int
    reply_text: str


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """The broker closed the connection (Close-Ok is queued) or answered our Close."""

    reply_code: int
    reply_text: str


@dataclass(frozen=True, slots=True)
class Blocked:
    """The broker holds our publishes back (a resource alarm) until ``Unblocked``."""

    reason: str


@dataclass(frozen=True, slots=True)
class Unblocked:
    pass


Event = Ready | Committed | Returned | ChannelClosed | ConnectionClosed | Blocked | Unblocked


class State(enum.Enum):
    START = "awaiting Connection.Start"
    TUNE = "awaiting Connection.Tune"
    OPENING = "awaiting Connection.Open-Ok"
    CHANNEL = "awaiting Channel.Open-Ok"
    SELECT = "awaiting Tx.Select-Ok"
    READY = "ready"
    COMMITTING = "awaiting Tx.Commit-Ok"
    CHANNEL_CLOSED = "channel closed by the broker"
    CLOSING = "awaiting Connection.Close-Ok"
    CLOSED = "closed"


# Every method the broker may send in each state, and the state it leads to.
_NEXT: dict[tuple[State, type], State] = {
    (State.START, commands.Connection.Start): State.TUNE,
    (State.TUNE, commands.Connection.Tune): State.OPENING,
    (State.OPENING, commands.Connection.OpenOk): State.CHANNEL,
    (State.CHANNEL, commands.Channel.OpenOk): State.SELECT,
    (State.SELECT, commands.Tx.SelectOk): State.READY,
    (State.READY, commands.Basic.Return): State.READY,
    (State.COMMITTING, commands.Basic.Return): State.COMMITTING,
    (State.COMMITTING, commands.Tx.CommitOk): State.READY,
}
# Connection.Close (answered with Close-Ok) and, after our Close, its Close-Ok lead to CLOSED
# from any state; Blocked and Unblocked come at any time; Channel.Close while the channel is
# open leads to CHANNEL_CLOSED.
_HANDSHAKE = (State.START, State.TUNE, State.OPENING)
_OPEN_CHANNEL = (State.CHANNEL, State.SELECT, State.READY, State.COMMITTING)
_CLOSE_OK = commands.Connection.CloseOk


class Publish(NamedTuple):
    exchange: str
    routing_key: str
    properties: bytes  # the content header's property flags and list, encoded
    body: bytes
    mandatory: bool


def short_string(text: str) -> bytes:
    raw = text.encode()
    if len(raw) > 255:
        raise ValueError(f"longer than 255 bytes: {text[:40]!r}...")
    return bytes((len(raw),)) + raw


def publish_frames(channel: int, exchange: str, routing_key: str, properties: bytes,
                   body: bytes, *, mandatory: bool, frame_max: int) -> list[bytes]:
    """Basic.Publish, its content header (``properties``: the property flags and list as
    encoded) and its body in frames of at most ``frame_max`` bytes (0: one frame)."""
    method = b"".join((_PUBLISH, short_string(exchange), short_string(routing_key),
                       b"\x01" if mandatory else b"\x00"))
    head = _HEADER_HEAD.pack(60, 0, len(body)) + properties
    if frame_max and len(head) + _OVERHEAD > frame_max:
        raise ValueError(f"the message's properties take more than a frame of {frame_max} bytes")
    end = b"\xce"
    out = [_FRAME_HEAD.pack(FRAME_METHOD, channel, len(method)), method, end,
           _FRAME_HEAD.pack(FRAME_HEADER, channel, len(head)), head, end]
    step = frame_max - _OVERHEAD if frame_max else max(len(body), 1)
    for at in range(0, len(body), step):
        piece = body[at:at + step]
        out += (_FRAME_HEAD.pack(FRAME_BODY, channel, len(piece)), piece, end)
    return out


class Publishing:
    """One connection, channel ``CHANNEL`` in transaction mode. The handshake runs by itself
    from the protocol header on: ``Ready`` says it is done. No heart-beats are asked for (the
    socket around it waits for each answer with a deadline of its own)."""

    def __init__(
        self,
        *,
        virtual_host: str,
        mechanism: str,
        response: str,
        client_properties: dict[str, Any],
        frame_max: int,
        channel_max: int = 0,
    ) -> None:
        self.state = State.START
        self.frame_max = frame_max  # what we ask for; Tune settles it
        self._virtual_host = virtual_host
        self._mechanism = mechanism
        self._response = response
        self._client_properties = client_properties
        self._channel_max = channel_max
        self._out: list[bytes] = [PROTOCOL_HEADER]
        self._in = bytearray()
        self._limit = FRAME_MIN
        # A Basic.Return whose content is still coming: the method, the body size, the body.
        self._returning: tuple[commands.Basic.Return, int, bytearray] | None = None

    # -- calls in, bytes out ----------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self.state is State.CLOSED

    def data_to_send(self) -> bytes:
        out = b"".join(self._out)
        self._out.clear()
        return out

    def commit(self, publishes: Iterable[Publish]) -> None:
        """Queue the publishes and a Tx.Commit after them. ValueError for a publish that
        cannot be written: nothing is queued then."""
        self._expect(State.READY, "commit")
        frames: list[bytes] = []
        for p in publishes:
            frames += publish_frames(CHANNEL, p.exchange, p.routing_key, p.properties, p.body,
                                     mandatory=p.mandatory, frame_max=self.frame_max)
        self._out += frames
        self._send(commands.Tx.Commit(), CHANNEL)
        self.state = State.COMMITTING

    def open_channel(self) -> None:
        """Open the channel again after the broker closed it; ``Ready`` when done."""
        self._expect(State.CHANNEL_CLOSED, "open the channel")
        self._send(commands.Channel.Open(), CHANNEL)
        self.state = State.CHANNEL

    def close(self, reply_code: int = 200, reply_text: str = "Normal shutdown") -> None:
        """Connection.Close; ``ConnectionClosed`` when the broker answers."""
        if self.state in (State.CLOSING, State.CLOSED):
            return
        self._send(commands.Connection.Close(reply_code, reply_text[:255], 0, 0), 0)
        self.state = State.CLOSING

    def _expect(self, state: State, what: str) -> None:
        if self.state is not state:
            raise RuntimeError(f"cannot {what}: {self.state.value}")

    def _send(self, method: Any, channel: int) -> None:
        self._out.append(pframe.marshal(method, channel))

    # -- bytes in, events out ---------------------------------------------------------------

    def receive_data(self, data: bytes) -> list[Event]:
        """The events the bytes complete. PublishingProtocolError for a frame this client
        cannot take (the connection is unusable then: close it with its reply code)."""
        self._in += data
        events: list[Event] = []
        buf = self._in
        at = 0
        while len(buf) - at >= _FRAME_HEAD.size:
            kind, channel, size = _FRAME_HEAD.unpack_from(buf, at)
            if size + _OVERHEAD > self._limit:
                raise PublishingProtocolError(
                    f"a frame of {size + _OVERHEAD} bytes, over the {self._limit} agreed",
                    FRAME_ERROR)
            end = at + _FRAME_HEAD.size + size
            if len(buf) <= end:
                break
            if buf[end] != FRAME_END:
                raise PublishingProtocolError("a frame without its frame-end octet", FRAME_ERROR)
            frame = bytes(buf[at:end + 1])
            at = end + 1
            event = self._frame(kind, channel, frame)
            if event is not None:
                events.append(event)
        del buf[:at]
        return events

    def _frame(self, kind: int, channel: int, frame: bytes) -> Event | None:
        if self.state is State.CLOSED or kind == FRAME_HEARTBEAT:
            return None  # nothing after the close is of use; heart-beats were not asked for
        if self._returning is not None:
            return self._content(kind, channel, frame[_FRAME_HEAD.size:-1])
        if kind != FRAME_METHOD or channel not in (0, CHANNEL):
            raise PublishingProtocolError(f"an unexpected frame of type {kind} on channel "
                                          f"{channel} ({self.state.value})")
        try:
            _, _, value = pframe.unmarshal(frame)
        except (pexceptions.UnmarshalingException, ValueError, struct.error) as bad:
            raise PublishingProtocolError(f"a method frame that does not decode: {bad}",
                                          FRAME_ERROR) from None
        if channel == 0 and isinstance(value, commands.Connection.Close | _CLOSE_OK):
            if self.state is not State.CLOSING and isinstance(value, commands.Connection.Close):
                self._send(commands.Connection.CloseOk(), 0)
            elif self.state is not State.CLOSING:
                raise PublishingProtocolError("Connection.Close-Ok without a Close")
            self.state = State.CLOSED
            if isinstance(value, _CLOSE_OK):
                return ConnectionClosed(200, "closed by the client")
            return ConnectionClosed(value.reply_code or 0, value.reply_text)
        if channel == 0 and isinstance(value, commands.Connection.Blocked):
            return Blocked(value.reason)
        if channel == 0 and isinstance(value, commands.Connection.Unblocked):
            return Unblocked()
        if self.state is State.CLOSING:
            return None  # sent before the broker saw our Close
        if channel == CHANNEL and self.state in _OPEN_CHANNEL and isinstance(
                value, commands.Channel.Close):
            self._send(commands.Channel.CloseOk(), CHANNEL)
            self.state = State.CHANNEL_CLOSED
            return ChannelClosed(value.reply_code or 0, value.reply_text)
        after = _NEXT.get((self.state, type(value)))
        if after is None or channel != (0 if self.state in _HANDSHAKE else CHANNEL):
            raise PublishingProtocolError(
                f"{getattr(value, 'name', type(value).__name__)} on channel {channel} "
                f"({self.state.value})")
        self.state = after
        return self._method(value)

    def _method(self, value: Any) -> Event | None:
        if isinstance(value, commands.Connection.Start):
            mechanisms = (value.mechanisms or "").split()
            if self._mechanism not in mechanisms:
                raise PublishingProtocolError(
                    f"the broker does not offer {self._mechanism} (it offers "
                    f"{' '.join(mechanisms) or 'none'})", 530)
            self._send(commands.Connection.StartOk(
                client_properties=self._client_properties, mechanism=self._mechanism,
                response=self._response), 0)
        elif isinstance(value, commands.Connection.Tune):
            self.frame_max = _least(self.frame_max, value.frame_max)
            self._limit = self.frame_max or 1 << 31
            channel_max = _least(self._channel_max, value.channel_max)
            self._send(commands.Connection.TuneOk(channel_max, self.frame_max, 0), 0)
            self._send(commands.Connection.Open(self._virtual_host), 0)
        elif isinstance(value, commands.Connection.OpenOk):
            self._send(commands.Channel.Open(), CHANNEL)
        elif isinstance(value, commands.Channel.OpenOk):
            self._send(commands.Tx.Select(), CHANNEL)
        elif isinstance(value, commands.Tx.SelectOk):
            return Ready()
        elif isinstance(value, commands.Tx.CommitOk):
            return Committed()
        elif isinstance(value, commands.Basic.Return):
            self._returning = (value, -1, bytearray())
        return None

    def _content(self, kind: int, channel: int, payload: bytes) -> Event | None:
        """A returned message's content header (only its body size is of use) and body."""
        assert self._returning is not None
        method, size, content = self._returning
        if channel != CHANNEL:
            raise PublishingProtocolError(f"a frame on channel {channel} inside a returned "
                                          "message's content")
        if size < 0:
            if kind != FRAME_HEADER or len(payload) < _HEADER_HEAD.size + 2:
                raise PublishingProtocolError("Basic.Return without its content header")
            size = _HEADER_HEAD.unpack_from(payload)[2]
        elif kind == FRAME_BODY:
            content += payload
            if len(content) > size:
                raise PublishingProtocolError("a returned message longer than its header said",
                                              FRAME_ERROR)
        else:
            raise PublishingProtocolError("a returned message's content cut short")
        if len(content) < size:
            self._returning = (method, size, content)
            return None
        self._returning = None
        return Returned(method.reply_code or 0, method.reply_text, method.exchange,
                        method.routing_key or "", bytes(content))


def _least(ours: int, theirs: int) -> int:
    """A negotiated limit: the smaller one, where 0 is no limit."""
    return min(ours, theirs) if ours and theirs else ours or theirs

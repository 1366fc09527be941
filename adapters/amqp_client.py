"""The client side of AMQP 0-9-1 for one connection, without I/O: bytes from the broker go in
(``receive_data``) and events (``adapters.amqp_events``) come out; requests go in and bytes to
write come out (``data_to_send``). ``adapters.rabbitmq_client`` is the socket around it.
Requests go to channel ``CHANNEL`` unless they name another one opened with ``add_channel`` (a
consumer each: RabbitMQ finds an ack among its channel's unacked deliveries in the order
delivered, so consumers whose acks come in different orders are kept apart); one request is
awaited at a time.

What the RabbitMQ adapter needs where pika's BlockingChannel costs too much (it writes and polls
after every publish and ack): a batch of publishes and acks and its Tx.Commit written at once
(``commit``; the broker answers with a ``Returned`` for each mandatory publish it could not
route, then ``Committed``), and queues consumed for the staging engine and the dead-letter
tools (``declare_passive``, ``qos``, ``consume``, ``get``, ``cancel``: each answered by one
event; deliveries come as ``Delivery`` events at any time; ``ack`` and ``nack`` have no
answer). A message's properties stay encoded both ways (the property flags and list of its
content header): the adapter decodes them as the AMQP front-end does
(``adapters.amqp_properties``), so a header table keeps the types it has on every other path,
and a message sent on as it came is sent with the bytes it came with.

Every transition is in ``_NEXT`` (the handshake and the closes) and ``_REPLIES`` (a request's
answer): anything else is a ``ClientProtocolError`` carrying the reply code to close the
connection with. Connection.Close, Channel.Close, Connection.Blocked/Unblocked, heart-beats and,
on an open channel, Basic.Deliver and Basic.Return are taken at any time.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable
from typing import Any, NamedTuple

from pamqp import commands
from pamqp import exceptions as pexceptions
from pamqp import frame as pframe

from adapters.amqp_events import (
    CHANNEL,
    Blocked,
    CancelOk,
    ChannelClosed,
    Committed,
    ConnectionClosed,
    ConsumeOk,
    DeclareOk,
    Delivery,
    Event,
    GetEmpty,
    Got,
    Publish,
    QosOk,
    Ready,
    Returned,
    Unblocked,
)

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
FRAME_END = 0xCE
_FRAME_HEAD = struct.Struct(">BHI")
_HEADER_HEAD = struct.Struct(">HHQ")
_PUBLISH = struct.pack(">HHH", 60, 40, 0)  # Basic.Publish, reserved ticket
_ACK = struct.Struct(">BHIHHQB")  # a whole Basic.Ack frame but its frame-end
_OVERHEAD = _FRAME_HEAD.size + 1
FRAME_MIN = 4096  # what either side may send before Tune (AMQP 0-9-1 frame-min-size)

# Reply codes a client closes the connection with when the broker breaks the protocol.
FRAME_ERROR = 501
UNEXPECTED_FRAME = 505


class ClientProtocolError(Exception):
    """The broker sent what this client cannot take. ``reply_code``: what to close with."""

    def __init__(self, text: str, reply_code: int = UNEXPECTED_FRAME) -> None:
        super().__init__(text)
        self.reply_code = reply_code


class State(enum.Enum):
    START = "awaiting Connection.Start"
    TUNE = "awaiting Connection.Tune"
    OPENING = "awaiting Connection.Open-Ok"
    CHANNEL = "awaiting Channel.Open-Ok"
    SELECT = "awaiting Tx.Select-Ok"
    READY = "ready"
    WAITING = "awaiting the answer to a request"
    CHANNEL_CLOSED = "channel closed by the broker"
    CLOSING = "awaiting Connection.Close-Ok"
    CLOSED = "closed"


# The handshake: the method the broker sends in each state, and the state it leads to.
_NEXT: dict[tuple[State, type], State] = {
    (State.START, commands.Connection.Start): State.TUNE,
    (State.TUNE, commands.Connection.Tune): State.OPENING,
    (State.OPENING, commands.Connection.OpenOk): State.CHANNEL,
    (State.CHANNEL, commands.Channel.OpenOk): State.READY,  # SELECT first when transactional
    (State.SELECT, commands.Tx.SelectOk): State.READY,
}
# A request in READY (class and method id) leads to WAITING for its answer (a Get: either),
# then READY again.
TX_COMMIT, QUEUE_DECLARE, BASIC_QOS = (90, 20), (50, 10), (60, 10)
BASIC_CONSUME, BASIC_CANCEL, BASIC_GET = (60, 20), (60, 30), (60, 70)
_REPLIES: dict[tuple[int, int], tuple[type, ...]] = {
    TX_COMMIT: (commands.Tx.CommitOk,),
    QUEUE_DECLARE: (commands.Queue.DeclareOk,),
    BASIC_QOS: (commands.Basic.QosOk,),
    BASIC_CONSUME: (commands.Basic.ConsumeOk,),
    BASIC_CANCEL: (commands.Basic.CancelOk,),
    BASIC_GET: (commands.Basic.GetOk, commands.Basic.GetEmpty),
}
_TICKET = b"\x00\x00"
_NO_TABLE = b"\x00\x00\x00\x00"
# Connection.Close (answered with Close-Ok) and, after our Close, its Close-Ok lead to CLOSED
# from any state; Channel.Close on CHANNEL, or on the channel a request awaits its answer on,
# to CHANNEL_CLOSED.
_HANDSHAKE = (State.START, State.TUNE, State.OPENING)
_CONTENT = (commands.Basic.Deliver, commands.Basic.GetOk, commands.Basic.Return)


def short_string(text: str) -> bytes:
    raw = text.encode()
    if len(raw) > 255:
        raise ValueError(f"longer than 255 bytes: {text[:40]!r}...")
    return bytes((len(raw),)) + raw


def publish_method(channel: int, exchange: str, routing_key: str, mandatory: bool) -> bytes:
    """A Basic.Publish method frame (the bridge's AMQP front-end writes its rewritten publishes
    with it too). ValueError for a name longer than a shortstr."""
    method = b"".join((_PUBLISH, short_string(exchange), short_string(routing_key),
                       b"\x01" if mandatory else b"\x00"))
    return _FRAME_HEAD.pack(FRAME_METHOD, channel, len(method)) + method + b"\xce"


def publish_frames(channel: int, exchange: str, routing_key: str, properties: bytes,
                   body: bytes, *, mandatory: bool, frame_max: int) -> list[bytes]:
    """Basic.Publish, its content header (``properties``: the property flags and list as
    encoded) and its body in frames of at most ``frame_max`` bytes (0: one frame)."""
    head = _HEADER_HEAD.pack(60, 0, len(body)) + properties
    if frame_max and len(head) + _OVERHEAD > frame_max:
        raise ValueError(f"the message's properties take more than a frame of {frame_max} bytes")
    end = b"\xce"
    out = [publish_method(channel, exchange, routing_key, mandatory),
           _FRAME_HEAD.pack(FRAME_HEADER, channel, len(head)), head, end]
    step = frame_max - _OVERHEAD if frame_max else max(len(body), 1)
    for at in range(0, len(body), step):
        piece = body[at:at + step]
        out += (_FRAME_HEAD.pack(FRAME_BODY, channel, len(piece)), piece, end)
    return out


def ack_frame(channel: int, delivery_tag: int, *, multiple: bool = False) -> bytes:
    return _ACK.pack(FRAME_METHOD, channel, 13, 60, 80, delivery_tag, multiple) + b"\xce"


def nack_frame(channel: int, delivery_tag: int, *, requeue: bool = True) -> bytes:
    """Basic.Nack of one delivery (bits: multiple off, requeue)."""
    return _ACK.pack(FRAME_METHOD, channel, 13, 60, 120, delivery_tag, requeue << 1) + b"\xce"


class ClientChannel:
    """One connection and its channels: ``CHANNEL`` (in transaction mode when
    ``transactional``) opened by the handshake, which runs by itself from the protocol header
    on (``Ready`` says it is done), and the ones ``add_channel`` opens. No heart-beats are
    asked for (the socket around it waits for each answer with a deadline of its own)."""

    def __init__(
        self,
        *,
        virtual_host: str,
        mechanism: str,
        response: str,
        client_properties: dict[str, Any],
        frame_max: int,
        channel_max: int = 0,
        transactional: bool = True,
    ) -> None:
        self.state = State.START
        self.frame_max = frame_max  # what we ask for; Tune settles it
        self.transactional = transactional
        self._virtual_host = virtual_host
        self._mechanism = mechanism
        self._response = response
        self._client_properties = client_properties
        self._channel_max = channel_max
        self._out: list[bytes] = [PROTOCOL_HEADER]
        self._in = bytearray()
        self._limit = FRAME_MIN
        self._replies: tuple[type, ...] = ()  # what ends WAITING
        self._open: set[int] = set()  # the channels open
        # The channel being opened (states CHANNEL and SELECT), a request awaits an answer on
        # (WAITING), or the broker closed under a request (CHANNEL_CLOSED).
        self._at = CHANNEL
        # A message whose content is still coming, by channel: its method, properties, body
        # size, body.
        self._content: dict[int, tuple[Any, bytes, int, bytearray]] = {}

    @property
    def closed(self) -> bool:
        return self.state is State.CLOSED

    # -- requests in, bytes out -------------------------------------------------------------

    def data_to_send(self) -> bytes:
        out = b"".join(self._out)
        self._out.clear()
        return out

    def commit(self, publishes: Iterable[Publish], acks: Iterable[int] = ()) -> None:
        """Queue the publishes, the acks (one each) and a Tx.Commit after them, on
        ``CHANNEL``. ValueError for a publish that cannot be written: nothing is queued then."""
        self.commit_frames(self.frames(publishes) + [ack_frame(CHANNEL, t) for t in acks])

    def frames(self, publishes: Iterable[Publish]) -> list[bytes]:
        """The frames of ``publishes`` on ``CHANNEL``, for ``commit_frames``. ValueError for
        one that cannot be written."""
        frames: list[bytes] = []
        for p in publishes:
            frames += publish_frames(CHANNEL, p.exchange, p.routing_key, p.properties, p.body,
                                     mandatory=p.mandatory, frame_max=self.frame_max)
        return frames

    def commit_frames(self, frames: list[bytes]) -> None:
        """Queue ``frames`` and a Tx.Commit after them. Not while a commit awaits its answer:
        RabbitMQ closes the connection over a command sent then (504 CHANNEL_ERROR)."""
        self._ready("commit", CHANNEL, transaction=True)
        self._out += frames
        self._request(TX_COMMIT, b"", CHANNEL)

    def ack(self, delivery_tag: int, *, multiple: bool = False, channel: int = CHANNEL) -> None:
        """Basic.Ack, which has no answer (on a channel in transaction mode, done at the next
        commit)."""
        self._settling("ack", channel)
        self._out.append(ack_frame(channel, delivery_tag, multiple=multiple))

    def nack(self, delivery_tag: int, *, requeue: bool = True, channel: int = CHANNEL) -> None:
        """Basic.Nack of one delivery, which has no answer: back on its queue (``requeue``),
        where a classic queue puts it at its old place."""
        self._settling("nack", channel)
        self._out.append(nack_frame(channel, delivery_tag, requeue=requeue))

    # Requests with a queue name are written here: pamqp refuses names RabbitMQ takes ("a/b").
    def declare_passive(self, queue: str) -> None:
        """``DeclareOk`` for a queue the broker has; ``ChannelClosed`` (404) when it has not."""
        self._ready("declare", CHANNEL)
        self._request(QUEUE_DECLARE, _TICKET + short_string(queue) + b"\x01" + _NO_TABLE,
                      CHANNEL)

    def qos(self, prefetch_count: int, *, global_qos: bool = False,
            channel: int = CHANNEL) -> None:
        self._ready("set the prefetch", channel)
        self._request(BASIC_QOS, struct.pack(">IH?", 0, prefetch_count, global_qos), channel)

    def consume(self, queue: str, *, channel: int = CHANNEL) -> None:
        """``ConsumeOk``, then a ``Delivery`` for each message, acknowledged by ``commit``
        (``CHANNEL`` in transaction mode) or ``ack``."""
        self._ready("consume", channel)
        self._request(BASIC_CONSUME,
                      _TICKET + short_string(queue) + b"\x00\x00" + _NO_TABLE, channel)

    def cancel(self, consumer_tag: str, *, channel: int = CHANNEL) -> None:
        """``CancelOk``; deliveries sent before the broker saw it may still come."""
        self._ready("cancel", channel)
        self._request(BASIC_CANCEL, short_string(consumer_tag) + b"\x00", channel)

    def get(self, queue: str) -> None:
        """A ``Delivery`` without a consumer tag, or ``GetEmpty``."""
        self._ready("get", CHANNEL)
        self._request(BASIC_GET, _TICKET + short_string(queue) + b"\x00", CHANNEL)

    def add_channel(self) -> int:
        """Open another channel (in transaction mode when ``transactional``); its number.
        ``Ready`` when done. RuntimeError when the connection has no channel number left."""
        self._ready("open a channel", CHANNEL)
        limit = self._channel_max or 0xFFFF
        free = next((n for n in range(CHANNEL + 1, limit + 1) if n not in self._open), None)
        if free is None:
            raise RuntimeError(f"cannot open a channel: all {limit} are open")
        self._opening(free)
        return free

    def open_channel(self) -> None:
        """Open the channel again that the broker closed (state CHANNEL_CLOSED); ``Ready``
        when done."""
        if self.state is not State.CHANNEL_CLOSED:
            raise RuntimeError(f"cannot open the channel: {self.state.value}")
        self._opening(self._at)

    def close(self, reply_code: int = 200, reply_text: str = "Normal shutdown") -> None:
        """Connection.Close; ``ConnectionClosed`` when the broker answers."""
        if self.state in (State.CLOSING, State.CLOSED):
            return
        self._send(commands.Connection.Close(reply_code, reply_text[:255], 0, 0), 0)
        self.state = State.CLOSING

    def _opening(self, channel: int) -> None:
        self._send(commands.Channel.Open(), channel)
        self._at = channel
        self.state = State.CHANNEL

    def _settling(self, what: str, channel: int) -> None:
        """A delivery is settled on an open channel, an answer awaited or not."""
        if channel not in self._open or self.state in (State.CLOSING, State.CLOSED):
            raise RuntimeError(f"cannot {what} on channel {channel}: {self.state.value}")

    def _ready(self, what: str, channel: int, *, transaction: bool = False) -> None:
        if self.state is not State.READY:
            raise RuntimeError(f"cannot {what}: {self.state.value}")
        if channel not in self._open:
            raise RuntimeError(f"cannot {what}: channel {channel} is not open")
        if transaction and not self.transactional:
            raise RuntimeError(f"cannot {what}: the channel is not in transaction mode")

    def _request(self, method: tuple[int, int], arguments: bytes, channel: int) -> None:
        payload = struct.pack(">HH", *method) + arguments
        self._out += (_FRAME_HEAD.pack(FRAME_METHOD, channel, len(payload)), payload, b"\xce")
        self._replies = _REPLIES[method]
        self._at = channel
        self.state = State.WAITING

    def _send(self, method: Any, channel: int) -> None:
        self._out.append(pframe.marshal(method, channel))

    # -- bytes in, events out ---------------------------------------------------------------

    def receive_data(self, data: bytes) -> list[Event]:
        """The events the bytes complete. ClientProtocolError for a frame this client cannot
        take (the connection is unusable then: close it with its reply code)."""
        self._in += data
        events: list[Event] = []
        buf = self._in
        at = 0
        while len(buf) - at >= _FRAME_HEAD.size:
            kind, channel, size = _FRAME_HEAD.unpack_from(buf, at)
            if size + _OVERHEAD > self._limit:
                raise ClientProtocolError(
                    f"a frame of {size + _OVERHEAD} bytes, over the {self._limit} agreed",
                    FRAME_ERROR)
            end = at + _FRAME_HEAD.size + size
            if len(buf) <= end:
                break
            if buf[end] != FRAME_END:
                raise ClientProtocolError("a frame without its frame-end octet", FRAME_ERROR)
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
        if channel in self._content:
            return self._content_frame(kind, channel, frame[_FRAME_HEAD.size:-1])
        opening = self.state in (State.CHANNEL, State.SELECT) and channel == self._at
        if kind != FRAME_METHOD or not (channel == 0 or channel in self._open or opening):
            raise ClientProtocolError(f"an unexpected frame of type {kind} on channel "
                                      f"{channel} ({self.state.value})")
        if frame[7:11] == _DELIVER_IDS and channel in self._open:
            self._content[channel] = (_deliver(frame), b"", -1, bytearray())
            return None
        try:
            _, _, value = pframe.unmarshal(frame)
        except (pexceptions.UnmarshalingException, ValueError, struct.error) as bad:
            raise ClientProtocolError(f"a method frame that does not decode: {bad}",
                                      FRAME_ERROR) from None
        if channel == 0:
            return self._connection_method(value)
        if self.state is State.CLOSING:
            return None  # sent before the broker saw our Close
        if isinstance(value, commands.Channel.Close):
            return self._channel_closed(value, channel)
        if channel in self._open and isinstance(value, _CONTENT):
            if isinstance(value, commands.Basic.GetOk) and not self._awaited(value, channel):
                raise self._unexpected(value, channel)
            self._content[channel] = (value, b"", -1, bytearray())
            return None
        if self._awaited(value, channel):
            self.state = State.READY
            return _answer(value)
        after = _NEXT.get((self.state, type(value))) if opening else None
        if after is None:
            raise self._unexpected(value, channel)
        if after is State.READY and self.state is State.CHANNEL and self.transactional:
            self._send(commands.Tx.Select(), channel)
            self.state = State.SELECT
            return None
        self.state = after
        self._open.add(channel)
        return Ready()

    def _awaited(self, value: Any, channel: int) -> bool:
        """Whether ``value`` answers the request awaited."""
        return (self.state is State.WAITING and channel == self._at
                and isinstance(value, self._replies))

    def _channel_closed(self, value: Any, channel: int) -> Event:
        """The broker closed ``channel``: Close-Ok, and the state CHANNEL_CLOSED when it was
        ``CHANNEL`` or the one a request awaited an answer on."""
        self._send(commands.Channel.CloseOk(), channel)
        self._open.discard(channel)
        self._content.pop(channel, None)
        if channel == CHANNEL or (self.state is not State.READY and channel == self._at):
            self._at = channel
            self.state = State.CHANNEL_CLOSED
        return ChannelClosed(value.reply_code or 0, value.reply_text, channel)

    def _connection_method(self, value: Any) -> Event | None:
        if isinstance(value, commands.Connection.Close):
            if self.state is not State.CLOSING:
                self._send(commands.Connection.CloseOk(), 0)
            self.state = State.CLOSED
            return ConnectionClosed(value.reply_code or 0, value.reply_text)
        if isinstance(value, commands.Connection.CloseOk) and self.state is State.CLOSING:
            self.state = State.CLOSED
            return ConnectionClosed(200, "closed by the client")
        if isinstance(value, commands.Connection.Blocked):
            return Blocked(value.reason)
        if isinstance(value, commands.Connection.Unblocked):
            return Unblocked()
        if self.state is State.CLOSING:
            return None
        after = _NEXT.get((self.state, type(value)))
        if after is None or self.state not in _HANDSHAKE:
            raise self._unexpected(value, 0)
        self.state = after
        if isinstance(value, commands.Connection.Start):
            mechanisms = (value.mechanisms or "").split()
            if self._mechanism not in mechanisms:
                raise ClientProtocolError(
                    f"the broker does not offer {self._mechanism} (it offers "
                    f"{' '.join(mechanisms) or 'none'})")
            self._send(commands.Connection.StartOk(
                client_properties=self._client_properties, mechanism=self._mechanism,
                response=self._response), 0)
        elif isinstance(value, commands.Connection.Tune):
            self.frame_max = _least(self.frame_max, value.frame_max)
            self._limit = self.frame_max or 1 << 31
            self._channel_max = _least(self._channel_max, value.channel_max)
            self._send(commands.Connection.TuneOk(self._channel_max, self.frame_max, 0), 0)
            self._send(commands.Connection.Open(self._virtual_host), 0)
        else:  # Open-Ok
            self._opening(CHANNEL)
        return None

    def _unexpected(self, value: Any, channel: int) -> ClientProtocolError:
        return ClientProtocolError(f"{getattr(value, 'name', type(value).__name__)} on channel "
                                   f"{channel} ({self.state.value})")

    def _content_frame(self, kind: int, channel: int, payload: bytes) -> Event | None:
        """A message's content header and body frames, after its method on ``channel``."""
        method, properties, size, content = self._content[channel]
        if size < 0:
            if kind != FRAME_HEADER or len(payload) < _HEADER_HEAD.size + 2:
                raise ClientProtocolError(f"{method.name} without its content header")
            size = _HEADER_HEAD.unpack_from(payload)[2]
            properties = payload[_HEADER_HEAD.size:]
        elif kind == FRAME_BODY:
            content += payload
            if len(content) > size:
                raise ClientProtocolError("a message's body longer than its header said",
                                          FRAME_ERROR)
        else:
            raise ClientProtocolError("a message's content cut short")
        if len(content) < size:
            self._content[channel] = (method, properties, size, content)
            return None
        del self._content[channel]
        body = bytes(content)
        if isinstance(method, commands.Basic.Return):
            return Returned(method.reply_code or 0, method.reply_text, method.exchange,
                            method.routing_key or "", body)
        if isinstance(method, commands.Basic.GetOk):
            self.state = State.READY
            return Got(method.delivery_tag or 0, bool(method.redelivered), method.exchange,
                       method.routing_key or "", properties, body, None, channel)
        return Delivery(method.delivery_tag or 0, bool(method.redelivered), method.exchange,
                        method.routing_key or "", properties, body, method.consumer_tag,
                        channel)


class _Deliver(NamedTuple):
    """Basic.Deliver's arguments, read here: pamqp's reader was a third of a consumer's work."""

    consumer_tag: str
    delivery_tag: int
    redelivered: bool
    exchange: str
    routing_key: str
    name: str = "Basic.Deliver"


_DELIVER_IDS = struct.pack(">HH", 60, 60)
_U64 = struct.Struct(">Q")


def _deliver(frame: bytes) -> _Deliver:
    """A whole Basic.Deliver method frame's arguments. ClientProtocolError when they do not
    fit in it."""
    try:
        at = 11
        n = frame[at]
        consumer_tag = frame[at + 1:at + 1 + n].decode()
        at += 1 + n
        (delivery_tag,) = _U64.unpack_from(frame, at)
        redelivered = bool(frame[at + 8] & 1)
        at += 9
        n = frame[at]
        exchange = frame[at + 1:at + 1 + n].decode()
        at += 1 + n
        n = frame[at]
        routing_key = frame[at + 1:at + 1 + n].decode()
        if at + 1 + n != len(frame) - 1:
            raise ValueError(f"{len(frame) - 2 - at - n} bytes left over")
    except (IndexError, ValueError, struct.error) as bad:
        raise ClientProtocolError(f"a Basic.Deliver that does not decode: {bad}",
                                  FRAME_ERROR) from None
    return _Deliver(consumer_tag, delivery_tag, redelivered, exchange, routing_key)


def _answer(value: Any) -> Event:
    if isinstance(value, commands.Tx.CommitOk):
        return Committed()
    if isinstance(value, commands.Queue.DeclareOk):
        return DeclareOk(value.queue or "", value.message_count or 0, value.consumer_count or 0)
    if isinstance(value, commands.Basic.QosOk):
        return QosOk()
    if isinstance(value, commands.Basic.ConsumeOk):
        return ConsumeOk(value.consumer_tag or "")
    if isinstance(value, commands.Basic.CancelOk):
        return CancelOk(value.consumer_tag or "")
    return GetEmpty()


def _least(ours: int, theirs: int) -> int:
    """A negotiated limit: the smaller one, where 0 is no limit."""
    return min(ours, theirs) if ours and theirs else ours or theirs

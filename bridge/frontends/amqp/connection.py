"""One proxied AMQP 0-9-1 connection, sans I/O: client bytes and broker bytes in, events out.

Every transition of the connection's state is in ``CLIENT_TRANSITIONS``: a Connection-class
method the client sends in a state not listed there is 503 COMMAND_INVALID. The broker's
side is trusted (RabbitMQ checks its own protocol) and only observed.

Events, in the order the bytes must go out:

- ``Frame`` / ``ProtocolHeader``: forward its ``raw`` bytes on, unchanged;
- ``Message``: a whole content-bearing method (from the client: a Basic.Publish for the
  interception hook; from the broker, when assembled: a delivery) to forward, or replace;
- ``Forward(raw)``: bytes the bridge made, going the same way (to the broker for client data);
- ``Answer(raw)``: bytes the bridge made, going back to whoever sent the data;
- ``PlainRun(raw, publishes)``: client publishes nobody needs to see (``fastpath``), to
  forward unchanged;
- ``DeliveryRun(raw, deliveries)``: plain deliveries from the broker (``fastpath``), for the
  consumer side to stamp and remember.

A refused publish (``refuse()``, or a body above ``max_body_size``) closes its channel on
both sides: the client gets Channel.Close with the reason, the broker a Channel.Close of its
own; until each side's Channel.Close-Ok, that side's frames on the channel are dropped (the
spec's rule for a closing channel) and the two Close-Oks are swallowed. The client cannot
reopen the channel before the broker has the bridge's Close, since that went first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from enum import Enum
from typing import Final

from pamqp import commands
from pamqp import frame as pframe

from bridge.frontends.amqp.assembler import BROKER_CONTENT, CLIENT_CONTENT, Assembler, Message
from bridge.frontends.amqp.builders import channel_close, channel_close_ok
from bridge.frontends.amqp.errors import AmqpProtocolError, ReplyCode
from bridge.frontends.amqp.fastpath import (
    Found,
    Needles,
    Screened,
    delivery_run,
    plain_run,
    without_channels,
)
from bridge.frontends.amqp.framer import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_METHOD,
    MAX_BODY_SIZE,
    Frame,
    Framer,
    ProtocolHeader,
    check_frame,
    method_name,
)
from bridge.intercept.views import Principal


class State(Enum):
    HANDSHAKE = "handshake"  # protocol header sent; Start, Secure, Tune and Open exchanged
    OPEN = "open"  # Connection.Open sent: channels may be used
    CLOSING = "closing"  # one side sent Connection.Close
    CLOSED = "closed"  # Connection.Close-Ok sent or received: nothing more is relayed


_C = commands.Connection
START_OK: Final = _C.StartOk.index
SECURE_OK: Final = _C.SecureOk.index
TUNE_OK: Final = _C.TuneOk.index
OPEN: Final = _C.Open.index
CLOSE: Final = _C.Close.index
CLOSE_OK: Final = _C.CloseOk.index
UPDATE_SECRET: Final = _C.UpdateSecret.index
TUNE: Final = _C.Tune.index
CHANNEL_CLOSE: Final = commands.Channel.Close.index
CHANNEL_CLOSE_OK: Final = commands.Channel.CloseOk.index

# (state, Connection method the client sends) -> next state. Nothing else is allowed.
CLIENT_TRANSITIONS: Final[dict[tuple[State, int], State]] = {
    (State.HANDSHAKE, START_OK): State.HANDSHAKE,
    (State.HANDSHAKE, SECURE_OK): State.HANDSHAKE,
    (State.HANDSHAKE, TUNE_OK): State.HANDSHAKE,
    (State.HANDSHAKE, OPEN): State.OPEN,
    (State.HANDSHAKE, CLOSE): State.CLOSING,
    (State.OPEN, UPDATE_SECRET): State.OPEN,
    (State.OPEN, CLOSE): State.CLOSING,
    (State.CLOSING, CLOSE): State.CLOSING,
    (State.CLOSING, CLOSE_OK): State.CLOSED,
}
# The most of a message the fast paths (``fastpath``) hold while they wait for its rest: a
# larger one goes to the framer, which keeps its frames without copying them again and again.
TAIL_MAX: Final = 256 * 1024
# The broker's Connection methods that move the state (any state not CLOSED).
BROKER_TRANSITIONS: Final[dict[int, State]] = {CLOSE: State.CLOSING, CLOSE_OK: State.CLOSED}


class Forward:
    """Bytes the bridge made, going the same way as the data that caused them."""

    __slots__ = ("raw",)

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def __repr__(self) -> str:
        return f"Forward({self.raw!r})"


class PlainRun:
    """Whole publishes from the client, found on the bytes (``fastpath``) and relayed as they
    came: ``publishes`` Basic.Publish methods with their content."""

    __slots__ = ("raw", "publishes")

    def __init__(self, raw: bytes, publishes: int) -> None:
        self.raw = raw
        self.publishes = publishes

    def __repr__(self) -> str:
        return f"PlainRun({self.publishes} publishes, {len(self.raw)} bytes)"


class DeliveryRun:
    """Whole plain deliveries and publisher confirms from the broker, found on the bytes
    (``fastpath.delivery_run``): ``deliveries`` holds each delivery's offsets in ``raw`` and
    its fields; ``confirms`` counts the Basic.Acks between them, relayed as they came."""

    __slots__ = ("raw", "deliveries", "confirms")

    def __init__(self, raw: bytes, deliveries: list[Found], confirms: int = 0) -> None:
        self.raw = raw
        self.deliveries = deliveries
        self.confirms = confirms

    def __repr__(self) -> str:
        return (f"DeliveryRun({len(self.deliveries)} deliveries, {self.confirms} confirms, "
                f"{len(self.raw)} bytes)")


class Answer:
    """Bytes the bridge made, going back to the side whose data caused them."""

    __slots__ = ("raw",)

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def __repr__(self) -> str:
        return f"Answer({self.raw!r})"


Event = Frame | ProtocolHeader | Message | Forward | Answer | PlainRun | DeliveryRun


def credentials(start_ok: object) -> tuple[str | None, str | None]:
    """The user and password of a Connection.Start-Ok (PLAIN or AMQPLAIN); None when another
    mechanism or an unreadable response."""
    mechanism = getattr(start_ok, "mechanism", "")
    response = getattr(start_ok, "response", "") or ""
    if isinstance(response, bytes):
        response = response.decode("utf-8", "replace")
    if mechanism == "PLAIN":
        parts = response.split("\0")
        if len(parts) == 3:
            return parts[1], parts[2]
    elif mechanism == "AMQPLAIN":
        from pamqp import decode

        from adapters.amqp_tables import table_entries

        try:
            raw = response.encode("latin-1") if isinstance(response, str) else response
            table_entries(raw)  # bounds first: pamqp loops for ever on an array that overruns
            _, table = decode.field_table(len(raw).to_bytes(4, "big") + raw)
        except Exception:  # noqa: BLE001 - an unreadable response: no principal, the broker judges
            return None, None
        login, password = table.get("LOGIN"), table.get("PASSWORD")
        return (str(login) if login is not None else None,
                str(password) if password is not None else None)
    return None, None


class _Closing:
    """A channel the bridge closed: which side still owes its Channel.Close-Ok."""

    __slots__ = ("client", "broker", "held")

    def __init__(self) -> None:
        self.client = True
        self.broker = True
        # The client's frames on the channel it reopened before the broker confirmed our
        # Close: RabbitMQ takes a Channel.Open on a channel still closing for a second one.
        self.held: list[bytes] = []


class ProxyConnection:
    """The protocol state of one client connection and its upstream connection."""

    def __init__(
        self, *, max_body_size: int = MAX_BODY_SIZE, assemble_broker: bool = False,
        reserve_channel: bool = False,
    ) -> None:
        self.state = State.HANDSHAKE
        self.frame_max = 0  # agreed by Connection.Tune-Ok; 0 until then (or "no limit")
        self.heartbeat = 0
        # Who the client said it is (the broker authenticates it): for checks made as it.
        self.login: str | None = None
        self.passcode: str | None = None
        self.vhost: str | None = None
        self._principal: Principal | None = None
        self.max_body_size = max_body_size
        self._client = Framer(expect_header=True, validate=True)
        self._broker = Framer(expect_header=False, validate=False, frame_max=0)
        self._publishes = Assembler(CLIENT_CONTENT, max_body_size=max_body_size)
        self._deliveries = (
            Assembler(BROKER_CONTENT, max_body_size=1 << 62) if assemble_broker else None
        )
        self._closing: dict[int, _Closing] = {}
        # The bridge's own channel (``reserve_channel``): the broker's highest, kept from the
        # client by telling it a channel_max one lower. None until Tune-Ok, or when the broker
        # allows a single channel.
        self.reserve_channel = reserve_channel
        self.own_channel: int | None = None
        self._offered_channel_max = 0
        # Told of every channel the bridge closes (its frames from the broker are dropped
        # until the broker's Close-Ok): whoever tracks the channel's deliveries forgets them.
        self.on_refused: Callable[[int], None] | None = None
        # What makes the interception layer look at a publish, as bytes (header-table keys as
        # on the wire, mentions of destinations: ``fastpath.Needles``): the leading whole
        # publishes of a chunk that hold none of them are relayed without being framed
        # (``fastpath``). None: every publish is framed.
        self.screen_needles: Needles | None = None
        # And the properties that make it look (a mask of a content header's property flags).
        self.screen_flags = 0
        # The same for deliveries (with ``assemble_broker``): header-table keys as on the wire
        # (length octet, name); a plain delivery whose table holds none of them is given in a
        # ``DeliveryRun``.
        self.delivery_needles: tuple[bytes, ...] | None = None
        # The start of a plain publish (delivery) cut short by the end of a chunk.
        self._client_tail = b""
        self._broker_tail = b""

    @property
    def principal(self) -> Principal:
        """Who the client said it is, as the interception core's views name it (made once the
        handshake has told it)."""
        if self._principal is None:
            self._principal = Principal(self.login, self.passcode, self.vhost)
        return self._principal

    @property
    def client_buffered(self) -> int:
        """Bytes of the client's held until they are complete: a frame's, the bodies of
        messages received in part, and a publish the fast path waits for the rest of (what
        ``--max-buffered-bytes`` counts)."""
        return self._client.buffered + self._publishes.held + len(self._client_tail)

    # -- client -> broker -------------------------------------------------------------------
    def client_data(self, data: bytes) -> list[Event]:
        """Events for bytes from the client; AmqpProtocolError (with ``events`` set to those
        before the fault) when they break the protocol: send ``error.reply()`` and close."""
        needles = self.screen_needles
        if (needles is not None and self.state is State.OPEN and not self._closing
                and self._client.idle and self._publishes.idle):
            if self._client_tail:
                data, self._client_tail = self._client_tail + data, b""
            # (Each publish's method and content header frames are searched for the needles:
            # a search of the whole chunk, bodies included, cost more.)
            done, publishes, short, screened = plain_run(
                data, self._client.limit, self.max_body_size, self.own_channel, needles,
                False, self.screen_flags)
            out = self._run_events(data, done, publishes, screened) if done else []
            if short and len(data) - done <= TAIL_MAX:  # the rest begins a plain publish:
                self._client_tail = data[done:]  # its rest is waited for here, so that the
                return out  # framer is still idle then
            if done:
                if done == len(data):
                    return out
                try:
                    return [*out, *self._framed(data[done:])]
                except AmqpProtocolError as exc:
                    exc.events = [*out, *exc.events]
                    raise
        elif self._client_tail:
            data, self._client_tail = self._client_tail + data, b""
        return self._framed(data)

    def client_plain(self, data: bytes) -> int:
        """How many publishes ``data`` is, when it is nothing but whole publishes the fast path
        relays as they came (none holding a needle) and nothing is held from before: what
        ``client_data`` would give as one ``PlainRun`` of all of it, for the caller to send up
        as it is. 0, with nothing changed, otherwise: give ``data`` to ``client_data``."""
        needles = self.screen_needles
        if (needles is None or self.state is not State.OPEN or self._closing
                or self._client_tail or not self._client.idle or not self._publishes.idle):
            return 0
        done, publishes, _, screened = plain_run(
            data, self._client.limit, self.max_body_size, self.own_channel, needles, True,
            self.screen_flags)
        return publishes if done == len(data) and not screened else 0

    def _run_events(self, data: bytes, done: int, publishes: int,
                    screened: list[Screened]) -> list[Event]:
        """A run's publishes as events: those that hold a needle as Messages (framed from their
        bytes and checked as the framer checks frames), the ones between as PlainRuns."""
        if not screened:
            return [PlainRun(data[:done] if done < len(data) else data, publishes)]
        out: list[Event] = []
        at = ordinal = 0
        for place, start, header_at, bodies, end in screened:
            if start > at:
                out.append(PlainRun(data[at:start], place - ordinal))
            channel = int.from_bytes(data[start + 1:start + 3], "big")
            frames = [Frame(FRAME_METHOD, channel, data[start:header_at]),
                      Frame(FRAME_HEADER, channel, data[header_at:bodies[0][0] if bodies else end])]
            frames += [Frame(FRAME_BODY, channel, data[a:b]) for a, b in bodies]
            for frame in frames:
                try:
                    check_frame(frame)
                except AmqpProtocolError as exc:
                    exc.events = out
                    raise
            out.append(Message(channel, frames[0], frames[1], frames[2:]))
            at, ordinal = end, place + 1
        if done > at:
            out.append(PlainRun(data[at:done], publishes - ordinal))
        return out

    def _framed(self, data: bytes) -> list[Event]:
        framing: AmqpProtocolError | None = None
        try:
            frames = self._client.feed(data)
        except AmqpProtocolError as exc:  # the frames before the bad one still count
            framing, frames = exc, exc.events
        out: list[Event] = []
        try:
            for frame in frames:
                self._from_client(frame, out)
        except AmqpProtocolError as exc:
            exc.events = out
            raise
        if framing is not None:
            framing.events = out
            raise framing
        return out

    def _from_client(self, frame: Frame | ProtocolHeader, out: list[Event]) -> None:
        if type(frame) is ProtocolHeader:
            out.append(frame)
            return
        assert isinstance(frame, Frame)
        channel = frame.channel
        if self.state is State.CLOSED:
            return  # after Connection.Close-Ok nothing more counts
        if channel in self._closing and self._closing_client(frame, out):
            return
        if channel == 0 and frame.type == FRAME_METHOD:
            index = frame.method_index
            if index >> 16 == _C.frame_id:
                out.append(self._connection_method(frame, index))
                return
            if index not in CLIENT_CONTENT:
                raise AmqpProtocolError(
                    ReplyCode.COMMAND_INVALID,
                    f"{method_name(index)} on channel 0",
                    class_id=index >> 16,
                    method_id=index & 0xFFFF,
                )
        elif channel != 0 and self.state is State.HANDSHAKE:
            raise AmqpProtocolError(
                ReplyCode.UNEXPECTED_FRAME,
                f"frame on channel {channel} before Connection.Open",
            )
        elif channel == self.own_channel:
            raise AmqpProtocolError(
                ReplyCode.CHANNEL_ERROR,
                f"channel {channel} is above the channel_max of {channel - 1} agreed",
            )
        try:
            event = self._publishes.receive(frame)
        except AmqpProtocolError as exc:
            if exc.channel == 0:
                raise
            out.extend(self.refuse(exc.channel, exc.reply_text, reply_code=exc.reply_code,
                                   class_id=exc.class_id, method_id=exc.method_id))
            return
        if event is not None:
            out.append(event)

    def _connection_method(self, frame: Frame, index: int) -> Frame:
        following = CLIENT_TRANSITIONS.get((self.state, index))
        if following is None:
            raise AmqpProtocolError(
                ReplyCode.COMMAND_INVALID,
                f"{method_name(index)} in connection state {self.state.value}",
                class_id=index >> 16,
                method_id=index & 0xFFFF,
            )
        if index == START_OK:
            self.login, self.passcode = credentials(frame.method)
            self._principal = None
        elif index == OPEN:
            self.vhost = getattr(frame.method, "virtual_host", None) or "/"
            self._principal = None
        if index == TUNE_OK:
            tune = frame.method
            assert isinstance(tune, _C.TuneOk)
            self.frame_max = tune.frame_max
            self.heartbeat = tune.heartbeat
            self._client.frame_max = tune.frame_max
            self._broker.frame_max = tune.frame_max
            if self._offered_channel_max:
                frame = self._reserve(tune)
        self.state = following
        return frame

    def close_upstream(self, reply_text: str) -> bytes | None:
        """Connection.Close for the broker, the client having gone without one; None when the
        connection is not open (still in its handshake, or already closing)."""
        if self.state is not State.OPEN:
            return None
        self.state = State.CLOSING
        return bytes(pframe.marshal(_C.Close(200, reply_text, 0, 0), 0))

    def _reserve(self, tune: _C.TuneOk) -> Frame:
        """The client's Tune-Ok with the channel it may not use added back for the broker."""
        agreed = tune.channel_max or self._offered_channel_max
        self.own_channel = agreed + 1
        raw = pframe.marshal(_C.TuneOk(agreed + 1, tune.frame_max, tune.heartbeat), 0)
        return Frame(FRAME_METHOD, 0, raw)

    def _tuned(self, frame: Frame) -> Frame:
        """The broker's Connection.Tune with one channel fewer for the client."""
        tune = frame.method
        assert isinstance(tune, _C.Tune)
        top = tune.channel_max or 0xFFFF
        if top < 2:
            return frame  # a single channel: none to spare, the bridge has no channel
        self._offered_channel_max = top - 1
        raw = pframe.marshal(_C.Tune(top - 1, tune.frame_max, tune.heartbeat), 0)
        return Frame(FRAME_METHOD, 0, raw)

    def _closing_client(self, frame: Frame, out: list[Event]) -> bool:
        """Whether a client frame on a channel the bridge closed is consumed here."""
        closing = self._closing[frame.channel]
        if not closing.client:  # the client has closed its side: the channel is its again,
            closing.held.append(frame.raw)  # once the broker has closed its side too
            return True
        if frame.type == FRAME_METHOD:
            index = frame.method_index
            if index == CHANNEL_CLOSE_OK:
                self._client_closed(frame.channel, closing)
            elif index == CHANNEL_CLOSE:  # both closed at once: it still gets its Close-Ok
                out.append(Answer(channel_close_ok(frame.channel)))
                self._client_closed(frame.channel, closing)
        return True

    def _client_closed(self, channel: int, closing: _Closing) -> None:
        closing.client = False
        if not closing.broker:
            del self._closing[channel]

    # -- broker -> client -------------------------------------------------------------------
    def broker_data(self, data: bytes) -> list[Event]:
        """Events for bytes from the broker (trusted: only its framing is checked)."""
        needles = self.delivery_needles
        if (needles is not None and self.state is State.OPEN and not self._closing
                and self._deliveries is not None and self._deliveries.idle
                and self._broker.idle):
            if self._broker_tail:
                data, self._broker_tail = self._broker_tail + data, b""
            done, found, confirms, short = delivery_run(data, self.own_channel, needles)
            out: list[Event] = []
            if done:
                out.append(DeliveryRun(data[:done] if done < len(data) else data, found,
                                       confirms))
            if short and len(data) - done <= TAIL_MAX:  # the same for a delivery
                self._broker_tail = data[done:]
                return out
            if done:
                return out + self._broker_framed(data[done:]) if done < len(data) else out
        elif self._broker_tail:
            data, self._broker_tail = self._broker_tail + data, b""
        return self._broker_framed(data)

    def _broker_framed(self, data: bytes) -> list[Event]:
        out: list[Event] = []
        for frame in self._broker.feed(data):
            assert isinstance(frame, Frame)
            channel = frame.channel
            if channel in self._closing and self._closing_broker(frame, out):
                continue
            if channel == 0 and frame.type == FRAME_METHOD:
                following = BROKER_TRANSITIONS.get(frame.method_index)
                if following is not None and self.state is not State.CLOSED:
                    self.state = following
                elif (frame.method_index == TUNE and self.reserve_channel
                      and self.state is State.HANDSHAKE):
                    frame = self._tuned(frame)
            if self._deliveries is not None:
                event = self._deliveries.receive(frame)
                if event is not None:
                    out.append(event)
            else:
                out.append(frame)
        return out

    def _closing_broker(self, frame: Frame, out: list[Event]) -> bool:
        closing = self._closing[frame.channel]
        if not closing.broker:
            return False
        if frame.type == FRAME_METHOD:
            index = frame.method_index
            if index == CHANNEL_CLOSE_OK:
                closing.broker = False
                if not closing.client:
                    del self._closing[frame.channel]
                    out += [Answer(raw) for raw in closing.held]
            elif index == CHANNEL_CLOSE:  # it closed the channel too: it gets its Close-Ok
                out.append(Answer(channel_close_ok(frame.channel)))
        if self._deliveries is not None:
            self._deliveries.forget(frame.channel)
        return True

    # -- decisions of the interception layer ----------------------------------------------
    def refuse(
        self,
        channel: int,
        reply_text: str,
        *,
        reply_code: int = ReplyCode.PRECONDITION_FAILED,
        class_id: int = commands.Basic.frame_id,
        method_id: int = commands.Basic.Publish.frame_id,
    ) -> list[Event]:
        """Close ``channel`` on both sides because of a publish the bridge refuses.

        Returns, in client-data direction: ``Answer`` (Channel.Close to the client, with
        the reply code and text) and ``Forward`` (a Channel.Close to the broker).
        """
        if channel <= 0:
            raise ValueError("only a channel above 0 can be refused")
        self._publishes.forget(channel)
        if channel in self._closing:
            return []  # already closing: one Close per side
        self._closing[channel] = _Closing()
        if self.on_refused is not None:
            self.on_refused(channel)
        return [
            Answer(channel_close(channel, reply_code, reply_text, class_id, method_id)),
            Forward(channel_close(channel, ReplyCode.REPLY_SUCCESS, "closed by jms-bridge")),
        ]

    def recheck(self, events: Iterable[Event]) -> list[Event]:
        """Client-data events made before the bridge closed a channel, as they would have been
        made after it: the closing channel's frames and messages dropped (the spec's rule; its
        Close and Close-Ok still count), a run's publishes on it taken out."""
        if not self._closing:
            return list(events)
        out: list[Event] = []
        for event in events:
            kind = type(event)
            if kind is Frame:
                assert isinstance(event, Frame)
                if event.channel in self._closing and self._closing_client(event, out):
                    continue
            elif kind is Message:
                assert isinstance(event, Message)
                if event.channel in self._closing:
                    continue
            elif kind is PlainRun:
                assert isinstance(event, PlainRun)
                raw, publishes = without_channels(event.raw, self._closing)
                if publishes:
                    out.append(PlainRun(raw, publishes))
                continue
            out.append(event)
        return out

    def closing(self, channel: int) -> bool:
        """Whether the bridge closed ``channel`` and still waits for a Close-Ok on it."""
        return channel in self._closing

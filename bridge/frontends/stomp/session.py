"""One client's STOMP session through the bridge, without I/O.

The session sits between two byte streams: the client's and the broker's. It frames both,
keeps the connection state in one transition table, negotiates version and heart-beats the
way the two peers do, and decides, frame by frame, what goes where. Frames it does not need
to change are forwarded as the bytes that came in.

Frames are offered to the interception core (``bridge.intercept``) as protocol-neutral views,
and only the frames its chain asked to see (``translate.Screen``): a SEND it wants, a SUBSCRIBE,
a MESSAGE, an ACK / NACK / COMMIT / ABORT, a lost connection. Its decisions come back as values
and are turned into bytes here. A ``Hold`` (may this user write to that target?) makes the
session hold the frame, and everything the client sends after it, until the glue has run the
check and calls ``resume()``: frames still reach the broker in the order the client sent them.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable

from bridge.frontends.relay_stats import RelayStats
from bridge.frontends.stomp import (
    CLIENT_COMMANDS,
    HEARTBEAT,
    Event,
    Frame,
    FrameParser,
    Limits,
    StompProtocolError,
    error_frame,
)
from bridge.frontends.stomp.translate import (
    Consumers,
    Screen,
    ack_frame,
    copy_frame,
    decision_bytes,
    delivery_view,
    send_view,
    stamped,
    subscribe_view,
)
from bridge.intercept.chain import Chain
from bridge.intercept.decisions import RELAY, Decision, Hold, Refuse, Replace, Stamp
from bridge.intercept.views import Principal, Settlement
from policies.errors import Refused
from policies.reasons import MQRC_CONNECTION_BROKEN, MQRC_HOST_NOT_AVAILABLE, Reason

SUPPORTED_VERSIONS = ("1.0", "1.1", "1.2")
_receipts = itertools.count(1)
# The receipt a copy's SEND asks for. RabbitMQ's STOMP plugin keeps a SEND's receipt header in
# the message (as it keeps every header it does not know), so a copy would reach its consumer
# with the bridge's receipt: a delivery carrying one of these has it taken off.
COPY_RECEIPT = "jms-bridge-copy-"
_COPY_RECEIPT_LINE = b"\nreceipt:" + COPY_RECEIPT.encode()


class _Copies:
    """Copies put in place of failed deliveries by one decision: the receipts still awaited,
    and the ACKs of the originals that go up when the last one is in."""

    __slots__ = ("receipts", "acks")

    def __init__(self) -> None:
        self.receipts: set[str] = set()
        self.acks: list[bytes] = []
DEFAULT_LIMITS = Limits()


def _reason_frame(reason: Reason, message: str, detail: str, version: str | None) -> bytes:
    """An ERROR frame whose message starts with the MQRC reason, as refusals' do."""
    return error_frame(f"{reason}: {message}", detail=detail, version=version,
                       headers=[("reason-code", str(reason.code)), ("reason", reason.name)])


class State(enum.Enum):
    AWAIT_CONNECT = "await-connect"  # nothing received yet
    CONNECTING = "connecting"  # CONNECT relayed, waiting for the broker's CONNECTED
    CONNECTED = "connected"
    # The broker sent ERROR: it closes the connection, or goes on (RabbitMQ after "Bad command").
    ERRORED = "errored"
    DISCONNECTING = "disconnecting"  # client sent DISCONNECT
    CLOSED = "closed"  # ERROR seen or sent: the connection is ending


# (state, frame sent by the client) -> next state. A client frame not in the table is a
# protocol error. Frames pipelined behind CONNECT are relayed; the broker judges them.
# OTHER stands for a command STOMP does not give clients: once connected the broker answers it
# (RabbitMQ with "Bad command", going on; ActiveMQ with "Unknown STOMP action", closing).
OTHER = "other"
_PIPELINED = ("SEND", "SUBSCRIBE", "UNSUBSCRIBE", "ACK", "NACK", "BEGIN", "COMMIT", "ABORT", OTHER)
CLIENT_TRANSITIONS: dict[tuple[State, str], State] = {
    (State.AWAIT_CONNECT, "CONNECT"): State.CONNECTING,
    (State.AWAIT_CONNECT, "STOMP"): State.CONNECTING,
    (State.CONNECTING, "DISCONNECT"): State.DISCONNECTING,
    (State.CONNECTED, "DISCONNECT"): State.DISCONNECTING,
    (State.ERRORED, "DISCONNECT"): State.DISCONNECTING,
    **{(State.CONNECTING, c): State.CONNECTING for c in _PIPELINED},
    **{(State.CONNECTED, c): State.CONNECTED for c in _PIPELINED},
    **{(State.ERRORED, c): State.ERRORED for c in _PIPELINED},
}

# (state, frame sent by the broker) -> next state. Broker frames outside the table are
# relayed without a change of state: the broker is trusted to speak STOMP.
BROKER_TRANSITIONS: dict[tuple[State, str], State] = {
    (State.CONNECTING, "CONNECTED"): State.CONNECTED,
    (State.CONNECTING, "ERROR"): State.CLOSED,
    (State.CONNECTED, "ERROR"): State.ERRORED,
    (State.ERRORED, "MESSAGE"): State.CONNECTED,  # the broker went on after its ERROR
    (State.ERRORED, "RECEIPT"): State.CONNECTED,
    (State.DISCONNECTING, "ERROR"): State.CLOSED,
}


def _by_state(table: dict[tuple[State, str], State]) -> dict[State, dict[str, State]]:
    """The table regrouped per state, so the per-frame lookup hashes only a str."""
    out: dict[State, dict[str, State]] = {state: {} for state in State}
    for (state, command), nxt in table.items():
        out[state][command] = nxt
    return out


_CLIENT_MOVES = _by_state(CLIENT_TRANSITIONS)
_BROKER_MOVES = _by_state(BROKER_TRANSITIONS)


class Output:
    """What one call of the session asks the glue to do."""

    __slots__ = ("to_broker", "to_client", "close", "check", "hold", "unhold")

    def __init__(
        self,
        to_broker: list[bytes] | None = None,
        to_client: list[bytes] | None = None,
        close: str | None = None,
    ) -> None:
        self.to_broker: list[bytes] = [] if to_broker is None else to_broker
        self.to_client: list[bytes] = [] if to_client is None else to_client
        # Set: flush what is above, then close both sides; the reason.
        self.close = close
        # Set: run this check, then call resume(); the client's later frames are held
        # meanwhile (stop reading from it).
        self.check: Hold | None = None
        # Set: stop reading the client; the session holds its frames until the broker has
        # confirmed the copies that replace a settlement. ``unhold``: read it again.
        self.hold = False
        self.unhold = False

    def extend(self, more: Output) -> None:
        self.to_broker += more.to_broker
        self.to_client += more.to_client
        self.close = more.close
        self.check = more.check
        self.hold = more.hold
        self.unhold = self.unhold or more.unhold

    def __repr__(self) -> str:
        return (
            f"Output(to_broker={self.to_broker!r}, to_client={self.to_client!r}, "
            f"close={self.close!r}, check={self.check!r})"
        )


def parse_heartbeat(value: str | None) -> tuple[int, int]:
    """``"cx,cy"`` -> (cx, cy) in ms; absent or unreadable -> (0, 0), as STOMP 1.0 had none."""
    if not value:
        return (0, 0)
    a, _, b = value.partition(",")
    try:
        x, y = int(a.strip()), int(b.strip())
    except ValueError:
        return (0, 0)
    return (max(x, 0), max(y, 0))


def negotiate_heartbeat(client: tuple[int, int], server: tuple[int, int]) -> tuple[int, int]:
    """(client-to-broker interval, broker-to-client interval) in ms, 0 = none (STOMP 1.1 s.6)."""
    cx, cy = client
    sx, sy = server
    up = max(cx, sy) if cx and sy else 0
    down = max(sx, cy) if sx and cy else 0
    return (up, down)


def _highest_common(accept: str | None) -> str:
    if not accept:
        return "1.0"
    offered = {v.strip() for v in accept.split(",")}
    for v in reversed(SUPPORTED_VERSIONS):
        if v in offered:
            return v
    return "1.0"


class Session:
    """A client connection's protocol state; the glue feeds it bytes and carries out Output."""

    def __init__(
        self,
        *,
        chain: Chain | None = None,
        stats: RelayStats | None = None,
        limits: Limits = DEFAULT_LIMITS,
        broker_limits: Limits | None = None,
        requeues: Callable[[str | None], bool] | None = None,
    ) -> None:
        """``requeues``: how the broker reads a NACK's ``requeue`` header (RabbitMQ's
        ``adapters.rabbitmq_stomp.nack_requeues``); a NACK it does not requeue is the broker's
        own (its dead-lettering) and goes up as sent. None: every NACK is a failure."""
        self._state = State.AWAIT_CONNECT
        self._client_moves = _CLIENT_MOVES[self._state]
        self._broker_moves = _BROKER_MOVES[self._state]
        self.version: str | None = None
        self.login: str | None = None
        self.passcode: str | None = None
        self.host: str | None = None  # the CONNECT host header: RabbitMQ's virtual host
        self.client_heartbeat = (0, 0)
        # Negotiated intervals in ms (0 = none): client->broker and broker->client.
        self.heartbeat_up = 0
        self.heartbeat_down = 0
        self.chain = chain or Chain()
        self.screen = Screen(self.chain.interest)
        self.principal = Principal()
        # Deliveries not yet settled, followed only when an interceptor asked for settlements.
        self._consumers = Consumers(requeues) if self.chain.interest.settlements else None
        self.stats = stats or RelayStats()
        self._client = FrameParser(role="server", limits=limits, relay_unknown=True)
        self._broker = FrameParser(role="client", limits=broker_limits or limits,
                                   validate=False)
        # While a check runs: the parsed events from the frame that asked for it on, the
        # protocol error that ended their chunk (if one did), and client bytes received since.
        self._held: list[Event] | None = None
        self._held_error: StompProtocolError | None = None
        self._held_data: list[bytes] = []
        # Receipts of copies that replace settlements, each to the group of copies it belongs
        # to: a group's ACKs of the originals go up when all its receipts are in.
        self._awaiting: dict[str, _Copies] = {}
        self._client_gone = False
        # The client's leaving (DISCONNECT, or its connection lost) was offered to the chain:
        # what it left unsettled fails once, however the two follow each other.
        self._left = False
        # A broker frame kept from the client (the receipt of a copy) takes the EOL after it
        # along: EOLs piled up before a frame make stomp.py 8 drop that frame.
        self._eat_eol = False

    @property
    def state(self) -> State:
        return self._state

    @state.setter
    def state(self, state: State) -> None:
        self._state = state
        self._client_moves = _CLIENT_MOVES[state]
        self._broker_moves = _BROKER_MOVES[state]

    # -- client -> broker ------------------------------------------------------------------
    def from_client(self, data: bytes, *, counted: bool = False) -> Output:
        if not counted:
            self.stats.bytes["upstream"] += len(data)
        if self._held is not None:
            self._held_data.append(data)
            return Output()
        try:
            events, error = self._client.feed(data), None
        except StompProtocolError as exc:  # frames before the bad one are still relayed
            events, error = exc.events, exc
        return self._relay(events, error, Output())

    @property
    def client_buffered(self) -> int:
        """Bytes of the client's kept here: a frame not yet complete, and what arrived while
        frames were held for a check."""
        held = self._client.buffered
        for data in self._held_data:
            held += len(data)
        return held

    @property
    def checking(self) -> bool:
        """Whether client frames are held for a check (see ``resume``)."""
        return self._held is not None

    def resume(self) -> Output:
        """The check asked for has been run: go on with the held frames, then the held bytes."""
        events, error, pending = self._held or [], self._held_error, self._held_data
        self._held, self._held_error, self._held_data = None, None, []
        out = self._relay(events, error, Output())
        for i, data in enumerate(pending):
            if out.close is not None:
                break
            if self._held is not None:  # held again: what is left waits for the next resume
                self._held_data = pending[i:]
                break
            out.extend(self.from_client(data, counted=True))
        return out

    def _relay(
        self, events: list[Event], error: StompProtocolError | None, out: Output
    ) -> Output:
        stats = self.stats
        watched = self.screen.client_commands
        frames = stats.frames_up
        for event in events:
            if event is HEARTBEAT:
                stats.heartbeats["upstream"] += 1
                out.to_broker.append(b"\n")
                continue
            assert isinstance(event, Frame)
            if self._awaiting and not self._pipelines(event):
                # copies are not confirmed yet: this frame and the rest wait for their receipts
                at = next(i for i, e in enumerate(events) if e is event)
                self._held, self._held_error = events[at:], error
                out.hold = True
                return out
            command = event.command
            nxt = self._client_moves.get(command)
            if nxt is None:
                if command in CLIENT_COMMANDS or (nxt := self._client_moves.get(OTHER)) is None:
                    return self._refuse_state(command, event, out)
                command = OTHER
            if nxt is State.CONNECTING and self._state is State.AWAIT_CONNECT:
                self._on_connect(event)
            frames[command] += 1
            if command in watched:
                decision = self._decide(event)
                if isinstance(decision, Hold):
                    frames[command] -= 1  # counted when it is offered again
                    at = next(i for i, e in enumerate(events) if e is event)
                    self._held, self._held_error = events[at:], error
                    out.check = decision
                    return out
                if isinstance(decision, Replace):
                    self._replace(decision, event, out)
                    if command != "DISCONNECT" and command != "UNSUBSCRIBE":
                        continue
                    if self._awaiting:  # it goes up once the copies are confirmed
                        frames[command] -= 1  # counted when it is offered again
                        at = next(i for i, e in enumerate(events) if e is event)
                        self._held, self._held_error = events[at:], error
                        out.hold = True
                        return out
                    if command == "UNSUBSCRIBE":
                        assert self._consumers is not None
                        self._consumers.unsubscribed(event)
                    decision = RELAY
                if isinstance(decision, Refuse):
                    refusal = decision.refusal
                    stats.refusals[refusal.reason.name] += 1
                    out.to_client.append(self._refusal_frame(refusal, event))
                    out.close = f"refused {command}: {refusal}"
                    self.state = State.CLOSED
                    return out
                if isinstance(decision, Stamp):  # a SEND with headers added
                    out.to_broker.append(stamped(event, decision.headers, self.version))
                else:
                    out.to_broker.append(decision_bytes(decision, event, self.version))
            else:
                out.to_broker.append(event.raw)
            if nxt is not self._state:
                self.state = nxt
        if error is not None:
            return self._protocol_error(error, out)
        return out

    def _decide(self, frame: Frame) -> Decision:
        """The chain's decision on a client frame it asked to see."""
        command, chain = frame.command, self.chain
        if command == "SEND":
            if self.screen.wants_send(frame):
                return chain.on_send(send_view(frame, self.principal))
            return RELAY
        consumers = self._consumers
        if command == "SUBSCRIBE":
            if consumers is not None:
                consumers.subscribed(frame)
            if self.screen.interest.subscribes:
                return chain.on_subscribe(subscribe_view(frame, self.principal))
            return RELAY
        if consumers is None:
            return RELAY
        if command == "UNSUBSCRIBE":  # its subscription's unsettled deliveries fail first
            left = consumers.unsubscribing(frame, self.principal)
            decision = RELAY if left is None else chain.on_settle(left)
            if not isinstance(decision, Replace | Hold):
                consumers.unsubscribed(frame)
            return decision
        if command == "DISCONNECT":  # leaving with deliveries unsettled fails them
            if self._left:  # offered already: it comes again once the copies are confirmed
                return RELAY
            lost = consumers.lost(self.principal)
            decision = RELAY if lost is None else chain.on_settle(lost)
            self._left = not isinstance(decision, Hold)  # held: offered again after the look
            return decision
        settle = consumers.settle(frame, self.version, self.principal)
        if settle is None:
            return RELAY
        decision = chain.on_settle(settle)
        if not isinstance(decision, Replace | Hold) and settle.outcome is Settlement.NACK:
            consumers.forget(settle.deliveries)  # the broker has them back
        return decision

    def _on_connect(self, frame: Frame) -> None:
        self.login = frame.get("login")
        self.passcode = frame.get("passcode")
        self.host = frame.get("host")
        self.principal = Principal(self.login, self.passcode, self.host)
        self.client_heartbeat = parse_heartbeat(frame.get("heart-beat"))
        # Frames pipelined behind CONNECT are parsed as the version the broker will most
        # likely choose; CONNECTED settles it.
        tentative = _highest_common(frame.get("accept-version"))
        self._client.version = tentative

    def _refuse_state(self, command: str, frame: Frame, out: Output) -> Output:
        if self.state is State.AWAIT_CONNECT:
            problem = f"expected CONNECT or STOMP as the first frame, got {command}"
        elif command in ("CONNECT", "STOMP"):
            problem = f"{command} received on a connection that is already connected"
        else:
            problem = f"{command} not allowed while the session is {self.state.value}"
        self.stats.protocol_errors["unexpected-frame"] += 1
        out.to_client.append(
            error_frame(problem, version=self.version, receipt_id=frame.get("receipt"))
        )
        out.close = problem
        self.state = State.CLOSED
        return out

    def _refusal_frame(self, refusal: Refused, frame: Frame) -> bytes:
        return error_frame(
            str(refusal),
            detail=refusal.detail,
            version=self.version,
            receipt_id=frame.get("receipt"),
            headers=[("reason-code", str(refusal.reason.code)), ("reason", refusal.reason.name)],
        )

    def _protocol_error(self, exc: StompProtocolError, out: Output) -> Output:
        self.stats.protocol_errors[exc.kind] += 1
        out.to_client.append(exc.error_frame)
        out.close = f"protocol error from client: {exc}"
        self.state = State.CLOSED
        return out

    # -- broker -> client ------------------------------------------------------------------
    def from_broker(self, data: bytes) -> Output:
        out = Output()
        stats = self.stats
        stats.bytes["downstream"] += len(data)
        try:
            events = self._broker.feed(data)
            self._relay_down(events, out)
        except StompProtocolError as exc:  # framing, or headers the parser left undecoded
            self.stats.protocol_errors["broker-" + exc.kind] += 1
            out.to_client.append(error_frame("the broker sent an invalid frame", detail=str(exc),
                                             version=self.version))
            out.close = f"protocol error from broker: {exc}"
            self.state = State.CLOSED
        return out

    def _relay_down(self, events: list[Event], out: Output) -> None:
        """Broker events into ``out``; StompProtocolError when a frame's headers, decoded
        here for the first time, are not STOMP (the frames before it are in ``out``)."""
        stats = self.stats
        frames = stats.frames_down
        for event in events:
            if event is HEARTBEAT:
                stats.heartbeats["downstream"] += 1
                if self._eat_eol:
                    self._eat_eol = False
                    continue
                out.to_client.append(b"\n")
                continue
            assert isinstance(event, Frame)
            self._eat_eol = False
            command = event.command
            frames[command] += 1
            nxt = self._broker_moves.get(command)
            if nxt is not None:
                if command == "CONNECTED":
                    self._on_connected(event)
                self.state = nxt
            if command == "RECEIPT" and self._awaiting:
                receipt_id = event.get("receipt-id") or ""
                if receipt_id in self._awaiting:
                    self._receipted(receipt_id, out)
                    self._eat_eol = True
                    continue
            if command == "MESSAGE" and self.screen.deliveries:
                out.to_client.append(self._delivered(event))
            else:
                out.to_client.append(event.raw)

    def _delivered(self, frame: Frame) -> bytes:
        """Offer a MESSAGE to the chain; a delivery can be relayed or rewritten only."""
        if frame.raw.find(_COPY_RECEIPT_LINE, 0, frame.body_at) >= 0:  # (no copy of the head)
            frame = Frame("MESSAGE", [
                (n, v) for n, v in frame.headers
                if not (n == "receipt" and v.startswith(COPY_RECEIPT))
            ], frame.body, version=self.version)
        view = delivery_view(frame, self.version)
        if self._consumers is not None:
            self._consumers.delivered(view, frame)
        decision = self.chain.on_delivery(view) if self.screen.interest.deliveries else RELAY
        if isinstance(decision, Stamp):
            return stamped(frame, decision.headers, self.version)
        if isinstance(decision, Hold | Refuse | Replace):
            raise TypeError(f"a delivery can be relayed, stamped or rewritten, not {decision!r}")
        return decision_bytes(decision, frame, self.version)

    # -- settlements replaced by copies ---------------------------------------------------
    def _pipelines(self, frame: Frame) -> bool:
        """Whether a client frame may go on while copies wait for their receipts: an ACK or a
        NACK of one ``client-individual`` delivery outside a transaction settles nothing a
        pending copy replaces, so a consumer that fails many messages is not held at one
        broker round trip per failure. Anything else waits."""
        if frame.command not in ("ACK", "NACK") or frame.get("transaction") is not None:
            return False
        consumers = self._consumers
        return consumers is not None and consumers.individual(frame, self.version)

    def _replace(self, decision: Replace, frame: Frame | None, out: Output) -> None:
        """Put each copy with a receipt; acknowledge the originals when every receipt is in.
        An ABORT goes up first (it undoes the transaction's own acknowledgements); a NACK is
        not sent at all: its receipt, if it asked for one, comes with the last ACK."""
        consumers = self._consumers
        assert consumers is not None
        if frame is not None and frame.command == "ABORT":
            out.to_broker.append(frame.raw)
        group = _Copies()
        for copy in decision.copies:
            original = consumers.take(copy.ack_id)
            if original is None:
                continue
            if copy.destination is not None:
                receipt = f"{COPY_RECEIPT}{next(_receipts)}"
                group.receipts.add(receipt)
                self._awaiting[receipt] = group
                out.to_broker.append(copy_frame(copy, original, receipt, self.version))
            group.acks.append(ack_frame(original, self.version))
        if group.acks and frame is not None and frame.command == "NACK":
            asked = frame.get("receipt")
            if asked is not None:
                group.acks[-1] = ack_frame(consumers.last_taken, self.version, asked)
        if not group.receipts:
            out.to_broker += group.acks

    def _receipted(self, receipt_id: str, out: Output) -> None:
        """A receipt for a copy: once all are in, the originals are acknowledged and the
        client's held frames go on."""
        group = self._awaiting.pop(receipt_id)
        group.receipts.discard(receipt_id)
        if not group.receipts:
            out.to_broker += group.acks
        if self._awaiting:
            return
        if self._client_gone:
            # What the client sent behind the copies goes up (an ACK in it is honoured), then
            # what it still leaves unsettled fails.
            more = self.resume()
            out.to_broker += more.to_broker
            out.close, out.check = more.close, more.check
            if more.close is not None or more.check is not None or self._awaiting:
                return
            last = self._leave()
            out.to_broker += last.to_broker
            out.close = last.close
            return
        out.unhold = True
        more = self.resume()
        out.to_broker += more.to_broker
        out.to_client += more.to_client
        out.close, out.check, out.hold = more.close, more.check, more.hold

    def _on_connected(self, frame: Frame) -> None:
        version = frame.get("version") or "1.0"
        self.version = version if version in SUPPORTED_VERSIONS else "1.2"
        self._client.version = self.version
        self._broker.version = self.version
        self.heartbeat_up, self.heartbeat_down = negotiate_heartbeat(
            self.client_heartbeat, parse_heartbeat(frame.get("heart-beat"))
        )

    # -- endings ---------------------------------------------------------------------------
    def client_lost(self) -> Output:
        """The client's connection ended: what it was handed and did not settle is offered to
        the chain as lost. Output.close set: close the upstream connection now (the broker
        gets back what is unsettled). Otherwise keep it open and feed the broker's answers to
        the copies that replace those deliveries: ``close`` comes when they are settled."""
        self._client_gone = True
        if self._awaiting:  # copies in flight: their receipts go on (``_receipted``)
            return Output()
        return self._leave()

    def _leave(self) -> Output:
        """The client is gone and nothing is awaited: fail what it left unsettled, once."""
        settle = None
        if (self._consumers is not None and self.state in (State.CONNECTED, State.ERRORED)
                and not self._left):
            self._left = True
            settle = self._consumers.lost(self.principal)
        if settle is None:
            return Output(close="the client went away")
        decision = self.chain.on_settle(settle)
        if isinstance(decision, Hold):
            # The client is gone, nothing can wait for a look at the broker: its deliveries are
            # left to the broker, which requeues them when the upstream connection closes.
            decision = RELAY
        out = Output()
        if isinstance(decision, Replace):
            self._replace(decision, None, out)
        if not self._awaiting:
            out.close = "the client went away"
        return out

    def broker_lost(self, why: str) -> Output:
        """The upstream connection ended: tell the client unless the session was ending."""
        out = Output(close=f"broker connection closed: {why}")
        if self.state not in (State.DISCONNECTING, State.CLOSED, State.ERRORED):
            out.to_client.append(_reason_frame(MQRC_CONNECTION_BROKEN,
                                               "the broker closed the connection", why,
                                               self.version))
        self.state = State.CLOSED
        return out

    def broker_unreachable(self, why: str) -> Output:
        """The upstream connection for the client's CONNECT could not be opened."""
        out = Output(close=f"broker not reachable: {why}")
        if self.state not in (State.DISCONNECTING, State.CLOSED):
            out.to_client.append(_reason_frame(MQRC_HOST_NOT_AVAILABLE, why, why, self.version))
        self.state = State.CLOSED
        return out

    def client_silent(self, silent_ms: float) -> Output:
        self.stats.protocol_errors["heartbeat-timeout"] += 1
        why = (
            f"no data from the client for {silent_ms:.0f} ms "
            f"(heart-beat every {self.heartbeat_up} ms was agreed)"
        )
        self.state = State.CLOSED
        return Output(to_client=[error_frame("heart-beat timeout", detail=why,
                                             version=self.version)], close=why)

    def broker_silent(self, silent_ms: float) -> Output:
        why = (
            f"no data from the broker for {silent_ms:.0f} ms "
            f"(heart-beat every {self.heartbeat_down} ms was agreed)"
        )
        return self.broker_lost(why)

    def shutting_down(self) -> Output:
        out = Output(close="bridge shutting down")
        if self.state not in (State.DISCONNECTING, State.CLOSED):
            out.to_client.append(
                error_frame("the bridge is shutting down", version=self.version)
            )
        self.state = State.CLOSED
        return out

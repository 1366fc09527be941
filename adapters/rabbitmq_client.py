"""The RabbitMQ adapter's own AMQP connections beside pika's, where pika's BlockingChannel costs
too much (it writes to the socket and polls after every publish and ack: docs/benchmarks.md,
"Measurements behind design choices"): ``adapters.amqp_client`` over a socket.

``Wire`` is one connection with one channel, made on first use to the node the adapter's pika
connection reached (its address, credentials, virtual host, TLS and frame size) and again on
the next use after a failure. It asks for no heart-beats, as it speaks only while it waits for
an answer: each wait is at most REPLY_S (the blocked-connection timeout once the broker says it
holds publishes back), and before each request it reads what came while it was idle (a Close
from the broker: it connects again). ``Publisher`` puts the staging engine's batches, each in one
transaction; ``Consumer`` carries its subscriptions to the staging queues; the dead-letter
tools' sweeps consume, publish and ack on a ``Wire`` of their own
(``adapters.queues_rabbitmq``).

Errors: ``BrokerUnavailable`` when the connection cannot be made or is lost (a batch lost while
its commit was out may or may not have been done); ``ChannelRefused`` when the broker closed the
channel (nothing of an uncommitted batch was done; the channel opens again on the next use).
"""

from __future__ import annotations

import collections
import contextlib
import select
import socket
import ssl
import time
from collections.abc import Callable, Sequence

import pika
import pika.credentials
from structlog.typing import FilteringBoundLogger

from adapters.amqp_client import ClientChannel, ClientProtocolError, State
from adapters.amqp_events import (
    Blocked,
    ChannelClosed,
    Committed,
    ConnectionClosed,
    ConsumeOk,
    Delivery,
    Event,
    Got,
    Publish,
    QosOk,
    Ready,
    Returned,
    Unblocked,
)
from policies.errors import BrokerUnavailable
from policies.reasons import MQRC_HOST_NOT_AVAILABLE, MQRC_NOT_AUTHORIZED

REPLY_S = 60.0  # an answer not come by then: the connection is taken for lost
CLOSE_S = 1.0  # how long a close waits for the broker's Close-Ok
MEANWHILE_S = 0.0005  # a wait with other work to do looks for the answer this often
HANDSHAKE_S = 15.0  # pika's default stack timeout, where the parameters set none


class ChannelRefused(Exception):
    """The broker closed the channel over a request or a batch (none of the batch was done)."""

    def __init__(self, closed: ChannelClosed) -> None:
        super().__init__(f"({closed.reply_code}) {closed.reply_text}")
        self.reply_code = closed.reply_code
        self.reply_text = closed.reply_text


def encoded(props: pika.BasicProperties) -> bytes:
    """A content header's property flags and list, as pika writes them."""
    return b"".join(props.encode())


def decoded(properties: bytes) -> pika.BasicProperties:
    """A content header's property flags and list, as pika reads them."""
    props = pika.BasicProperties()
    props.decode(properties)
    return props


class Wire:
    """One connection with one channel (in transaction mode when ``transactional``) to the
    node of ``params``. ``channel()`` gives the protocol, ready for a request; ``until`` writes
    what the request queued and reads up to its answer. A channel the broker closed is opened
    again by the next ``channel()`` when ``reopen``; otherwise that raises ChannelRefused (what
    the channel held went back to its queues)."""

    def __init__(self, params: pika.ConnectionParameters, where: str,
                 log: FilteringBoundLogger, *, transactional: bool = True,
                 reopen: bool = True) -> None:
        self._params = params
        self._where = where
        self._log = log
        self._transactional = transactional
        self._reopen = reopen
        self._sock: socket.socket | None = None
        self._proto: ClientChannel | None = None
        self._events: collections.deque[Event] = collections.deque()  # read, not yet asked for
        # A consumer's deliveries, read while other answers were awaited too.
        self.delivered: collections.deque[Delivery] = collections.deque()

    def channel(self) -> ClientChannel:
        """The protocol, ready: what came while idle is read first, the channel opened again
        after the broker closed it, the connection made again after it was lost."""
        if self._proto is not None and not self._events:
            self._read_idle()
        proto = self._proto
        if proto is not None and proto.state is State.CHANNEL_CLOSED:
            closed = next((e for e in self._events if isinstance(e, ChannelClosed)),
                          ChannelClosed(0, "closed by the broker"))
            self._events.clear()  # the closed channel's
            self.delivered.clear()
            if not self._reopen:
                raise ChannelRefused(closed)
            proto.open_channel()
            self.until(Ready)
        if proto is None or proto.state is not State.READY:
            self._drop()
            proto = self._connect()
        return proto

    def until(self, done: type[Event] | tuple[type[Event], ...],
              wait_s: float = REPLY_S, meanwhile: Callable[[], bool] | None = None,
              ) -> list[Event]:
        """Write what is queued, then read until an event of type ``done``: every event up to
        it, that one last (those after it wait for the next call). ChannelRefused for a channel
        the broker closed; BrokerUnavailable for a connection lost, closed by the broker, or
        silent for ``wait_s`` (while the broker says it holds publishes back: for its
        blocked-connection timeout). ``meanwhile`` is called while the answer has not come,
        until it returns False: other work done during the broker's round trip."""
        out: list[Event] = []
        deadline = time.monotonic() + wait_s
        blocked = self._params.blocked_connection_timeout
        self._flush()
        while True:
            while self._events:
                event = self._events.popleft()
                if isinstance(event, Blocked) and blocked:
                    self._log.warning("the broker holds publishes back", reason=event.reason)
                    deadline = min(deadline, time.monotonic() + blocked)
                    wait_s = blocked
                elif isinstance(event, Unblocked):
                    deadline = time.monotonic() + wait_s
                elif isinstance(event, Delivery) and not isinstance(event, Got):
                    self.delivered.append(event)
                else:
                    self._check(event)
                    out.append(event)
                    if isinstance(event, done):
                        return out
            left = deadline - time.monotonic()
            if meanwhile is not None and left > 0:
                if not meanwhile():
                    meanwhile = None
                self._pump(min(left, MEANWHILE_S))
                continue
            if left <= 0 or not self._pump(left):
                raise self._lost(f"no answer within {wait_s:g} s", TimeoutError())

    def poll(self, wait_s: float) -> None:
        """Read what has come (a consumer's deliveries go to ``delivered``), waiting up to
        ``wait_s`` for something when nothing has."""
        if not self._events:
            self._flush()
            self._pump(wait_s)
        events, self._events = self._events, collections.deque()
        for event in events:
            self._check(event)
            if isinstance(event, Delivery) and not isinstance(event, Got):
                self.delivered.append(event)

    def close(self) -> None:
        """Connection.Close, its Close-Ok awaited briefly; quiet about a connection gone."""
        sock, proto = self._sock, self._proto
        self._sock = self._proto = None
        self._events.clear()
        self.delivered.clear()
        if sock is None:
            return
        with contextlib.suppress(OSError, ClientProtocolError):
            if proto is not None and not proto.closed:
                proto.close()
                sock.settimeout(CLOSE_S)
                sock.sendall(proto.data_to_send())
                deadline = time.monotonic() + CLOSE_S
                while not proto.closed and time.monotonic() < deadline:
                    data = sock.recv(1 << 16)
                    if not data:
                        break
                    proto.receive_data(data)
        with contextlib.suppress(OSError):
            sock.close()

    # -- the connection ---------------------------------------------------------------------

    def _connect(self) -> ClientChannel:
        p = self._params
        creds = p.credentials
        if isinstance(creds, pika.credentials.PlainCredentials):
            mechanism, response = "PLAIN", f"\0{creds.username}\0{creds.password}"
        else:
            mechanism, response = "EXTERNAL", ""
        name = dict(p.client_properties or {}).get("connection_name", "jms-bridge")
        proto = ClientChannel(
            virtual_host=p.virtual_host, mechanism=mechanism, response=response,
            client_properties={
                "product": "jms-bridge", "connection_name": f"{name} (own client)",
                "capabilities": {"authentication_failure_close": True,
                                 "connection.blocked": True},
            },
            frame_max=p.frame_max, channel_max=p.channel_max,
            transactional=self._transactional,
        )
        try:
            sock = socket.create_connection((p.host, p.port), timeout=p.socket_timeout or 10.0)
        except OSError as exc:
            raise BrokerUnavailable(f"{self._where}: {exc}") from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if p.ssl_options is not None:
                sock = p.ssl_options.context.wrap_socket(
                    sock, server_hostname=p.ssl_options.server_hostname)
        except OSError as exc:
            sock.close()
            raise BrokerUnavailable(f"{self._where}: {exc}") from exc
        self._sock, self._proto = sock, proto
        self.until(Ready, p.stack_timeout or HANDSHAKE_S)
        self._log.debug("own AMQP connection open", frame_max=proto.frame_max)
        return proto

    def _read_idle(self) -> None:
        """Whatever the broker sent since the last answer: nothing most often; a Close, or the
        end of the connection, when it went away meanwhile."""
        sock = self._sock
        assert sock is not None
        pending = isinstance(sock, ssl.SSLSocket) and sock.pending()
        if not pending and not select.select([sock], [], [], 0)[0]:
            return
        try:
            self._pump(0.0)
        except BrokerUnavailable as gone:
            self._log.debug("own AMQP connection gone while idle", error=str(gone))
            return
        if any(isinstance(e, ConnectionClosed) for e in self._events):
            self._log.debug("own AMQP connection closed by the broker while idle")
            self._drop()

    def _pump(self, wait_s: float) -> bool:
        """One read of at most ``wait_s``: its events queued, the answers they call for (the
        handshake's, a Close-Ok) written. False when nothing came in time."""
        sock, proto = self._sock, self._proto
        assert sock is not None and proto is not None
        try:
            sock.settimeout(wait_s)
            data = sock.recv(1 << 16)
        except (TimeoutError, BlockingIOError, ssl.SSLWantReadError):
            return False
        except OSError as exc:
            raise self._lost(str(exc) or type(exc).__name__, exc) from exc
        if not data:
            raise self._lost("the broker closed the connection", EOFError())
        try:
            self._events += proto.receive_data(data)
            self._flush()
        except ClientProtocolError as exc:
            with contextlib.suppress(OSError):
                proto.close(exc.reply_code, str(exc))
                self._flush()
            raise self._lost(f"protocol error: {exc}", exc) from exc
        return True

    def _flush(self) -> None:
        proto, sock = self._proto, self._sock
        assert proto is not None and sock is not None
        data = proto.data_to_send()
        if data:
            try:
                sock.settimeout(REPLY_S)
                sock.sendall(data)
            except OSError as exc:
                raise self._lost(str(exc) or type(exc).__name__, exc) from exc

    def _check(self, event: Event) -> None:
        if isinstance(event, ConnectionClosed):
            self._drop()
            refused = event.reply_code in (403, 530)
            raise BrokerUnavailable(
                f"{self._where}: connection closed by the broker: "
                f"({event.reply_code}) {event.reply_text}",
                MQRC_NOT_AUTHORIZED if refused else MQRC_HOST_NOT_AVAILABLE)
        if isinstance(event, ChannelClosed):
            raise ChannelRefused(event)

    def _lost(self, text: str, cause: BaseException) -> BrokerUnavailable:
        self._drop()
        error = BrokerUnavailable(f"{self._where}: {text}")
        error.__cause__ = cause
        return error

    def _drop(self) -> None:
        sock = self._sock
        self._sock = self._proto = None
        self._events.clear()
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()


class Publisher(Wire):
    """The staging engine's batches of puts, in transactions."""

    def commit(self, publishes: Sequence[Publish],
               meanwhile: Callable[[], bool] | None = None) -> list[Returned]:
        """Put ``publishes`` in one transaction; the ones the broker returned unroutable, in
        the order published. ValueError: one cannot be written (nothing was sent).
        ``meanwhile``: as for ``until``."""
        committed: list[list[Returned]] = []
        self.commit_parts([publishes], committed, meanwhile)
        return committed[0]

    def commit_parts(self, parts: Sequence[Sequence[Publish]], committed: list[list[Returned]],
                     meanwhile: Callable[[], bool] | None = None) -> None:
        """Put each part in a transaction of its own, one after the other (RabbitMQ takes no
        command on a channel while it commits): for each part committed, the ones the broker
        returned unroutable are appended to ``committed`` as it is answered, so that after a
        failure midway it holds the parts done. A part with a return is the last committed.
        ValueError: a publish cannot be written (checked before any is sent: nothing was)."""
        proto = self.channel()
        encoded = [proto.frames(part) for part in parts]
        for i, frames in enumerate(encoded):
            self.channel().commit_frames(frames)
            encoded[i] = []  # (not kept once written)
            committed.append([e for e in self.until(Committed, meanwhile=meanwhile)
                              if isinstance(e, Returned)])
            if committed[-1]:
                return


class Consumer(Wire):
    """The staging engine's subscriptions, on a connection of their own, each on a channel of
    its own (not in transaction mode): their deliveries read without pika's work on each
    frame, their acks and nacks written without a round trip. RabbitMQ looks an ack up among
    its channel's unacked deliveries in the order delivered, so on one channel for all, a
    burst's acks (each level's in its own order) were 170,262 single ones against 46 multiple,
    and RabbitMQ's channel was the bottleneck (docs/benchmarks.md). Its subscriptions die with
    its connection or any of its channels: every use after that raises BrokerUnavailable (the
    broker has put back what it held), and the adapter subscribes again on a new one."""

    def __init__(self, params: pika.ConnectionParameters, where: str,
                 log: FilteringBoundLogger) -> None:
        super().__init__(params, where, log, transactional=False, reopen=False)
        self.queues: dict[str, str] = {}  # consumer tag -> its queue
        self.channels: dict[str, int] = {}  # a queue -> the channel it is consumed on
        self._gone = False

    @property
    def open(self) -> bool:
        return not self._gone and self._proto is not None and self._proto.state in (
            State.READY, State.WAITING)

    def close(self) -> None:
        self._gone = True
        super().close()

    def subscribe(self, queue: str, prefetch: int) -> None:
        """Consume ``queue`` on a channel of its own, at most ``prefetch`` of its deliveries
        unacked."""
        proto = self._live().channel()
        try:
            channel = proto.add_channel()
        except RuntimeError as exc:  # no channel number left
            raise self._ended(exc) from exc
        self._guard(Ready)
        proto.qos(prefetch, channel=channel)
        self._guard(QosOk)
        proto.consume(queue, channel=channel)
        ok = self._guard(ConsumeOk)[-1]
        assert isinstance(ok, ConsumeOk)
        self.queues[ok.consumer_tag] = queue
        self.channels[queue] = channel

    def read(self, wait_s: float) -> list[Delivery]:
        """The deliveries that have come, waiting up to ``wait_s`` for some when none has."""
        self._live()
        if not self.delivered:
            try:
                self.poll(wait_s)
            except (BrokerUnavailable, ChannelRefused) as exc:
                raise self._ended(exc) from exc
        out = list(self.delivered)
        self.delivered.clear()
        return out

    def settle(self, acks: Sequence[tuple[str, int, bool]] = (),
               requeue: Sequence[tuple[str, int]] = ()) -> None:
        """Write the acks ((queue, delivery tag, multiple) each) and the nacks that put
        deliveries back ((queue, delivery tag) each), on their queues' channels; none is
        answered."""
        proto = self._live()._proto
        assert proto is not None
        for queue, tag, multiple in acks:
            proto.ack(tag, multiple=multiple, channel=self.channels[queue])
        for queue, tag in requeue:
            proto.nack(tag, channel=self.channels[queue])
        try:
            self._flush()
        except BrokerUnavailable as exc:
            raise self._ended(exc) from exc

    def _live(self) -> Consumer:
        if self._gone or (self._proto is not None and not self.open):
            raise self._ended(None)
        return self

    def _guard(self, done: type[Event]) -> list[Event]:
        try:
            return self.until(done)
        except (BrokerUnavailable, ChannelRefused) as exc:
            raise self._ended(exc) from exc

    def _ended(self, cause: BaseException | None) -> BrokerUnavailable:
        """The subscriptions are gone with their channel or connection."""
        self._gone = True
        self._drop()
        why = f": {cause}" if cause is not None else ""
        return BrokerUnavailable(f"{self._where}: the staging subscriptions' connection "
                                 f"ended{why}")

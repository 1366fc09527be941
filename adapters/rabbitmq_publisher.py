"""The RabbitMQ adapter's batches of publishes in one transaction: a connection of its own
beside pika's, speaking ``adapters.amqp_publishing`` over a socket.

pika's BlockingChannel writes to the socket and polls after every publish, most of a batch's
cost (docs/benchmarks.md, "Measurements behind design choices"); here a batch and its Tx.Commit
go out in one ``sendall`` and the answer is read once. It connects on first use to the node the
adapter's pika connection reached, with its address, credentials, virtual host, TLS and frame
size, and again on the next use after a failure. It asks for no heart-beats, as it speaks only
while a batch is out: it waits for an answer at most REPLY_S (the blocked-connection timeout
once the broker says it holds publishes back), and before each batch it reads what came while
it was idle (a Close from the broker: it connects again).

Errors: ``BrokerUnavailable`` when the connection cannot be made or is lost (a batch lost
while its commit was out may or may not have been put); ``ChannelRefused`` when the broker
closed the channel over the batch (none of it was put; the channel opens again next time).
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import time
from collections.abc import Sequence

import pika
import pika.credentials
from structlog.typing import FilteringBoundLogger

from adapters.amqp_publishing import (
    Blocked,
    ChannelClosed,
    Committed,
    ConnectionClosed,
    Event,
    Publish,
    Publishing,
    PublishingProtocolError,
    Ready,
    Returned,
    State,
    Unblocked,
)
from policies.errors import BrokerUnavailable
from policies.reasons import MQRC_HOST_NOT_AVAILABLE, MQRC_NOT_AUTHORIZED

REPLY_S = 60.0  # an answer not come by then: the connection is taken for lost
CLOSE_S = 1.0  # how long a close waits for the broker's Close-Ok
HANDSHAKE_S = 15.0  # pika's default stack timeout, where the parameters set none


class ChannelRefused(Exception):
    """The broker closed the channel over a batch: none of it was put."""

    def __init__(self, closed: ChannelClosed) -> None:
        super().__init__(f"({closed.reply_code}) {closed.reply_text}")
        self.reply_code = closed.reply_code
        self.reply_text = closed.reply_text


def encoded(props: pika.BasicProperties) -> bytes:
    """A content header's property flags and list, as pika writes them."""
    return b"".join(props.encode())


class Publisher:
    """One connection with one channel in transaction mode, to the node of ``params``."""

    def __init__(self, params: pika.ConnectionParameters, where: str,
                 log: FilteringBoundLogger) -> None:
        self._params = params
        self._where = where
        self._log = log
        self._sock: socket.socket | None = None
        self._proto: Publishing | None = None

    def commit(self, publishes: Sequence[Publish]) -> list[Returned]:
        """Put ``publishes`` in one transaction; the ones the broker returned unroutable, in
        the order published. ValueError: one cannot be written (nothing was sent)."""
        proto = self._ready()
        proto.commit(publishes)
        return [e for e in self._until(proto, Committed) if isinstance(e, Returned)]

    def close(self) -> None:
        """Connection.Close, its Close-Ok awaited briefly; quiet about a connection gone."""
        sock, proto = self._sock, self._proto
        self._sock = self._proto = None
        if sock is None:
            return
        with contextlib.suppress(OSError, PublishingProtocolError):
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

    def _ready(self) -> Publishing:
        """The protocol, READY: what came while idle is read first, the channel opened again
        after the broker closed it, the connection made again after it was lost."""
        if self._proto is not None:
            self._read_idle()
        proto = self._proto
        if proto is not None and proto.state is State.CHANNEL_CLOSED:
            proto.open_channel()
            self._until(proto, Ready)
        if proto is None or proto.state is not State.READY:
            self._drop()
            proto = self._connect()
        return proto

    def _connect(self) -> Publishing:
        p = self._params
        creds = p.credentials
        if isinstance(creds, pika.credentials.PlainCredentials):
            mechanism, response = "PLAIN", f"\0{creds.username}\0{creds.password}"
        else:
            mechanism, response = "EXTERNAL", ""
        name = dict(p.client_properties or {}).get("connection_name", "jms-bridge")
        proto = Publishing(
            virtual_host=p.virtual_host, mechanism=mechanism, response=response,
            client_properties={
                "product": "jms-bridge", "connection_name": f"{name} (transactions)",
                "capabilities": {"authentication_failure_close": True,
                                 "connection.blocked": True},
            },
            frame_max=p.frame_max, channel_max=p.channel_max,
        )
        try:
            sock = socket.create_connection((p.host, p.port), timeout=p.socket_timeout or 10.0)
        except OSError as exc:
            raise BrokerUnavailable(f"{self._where}: transactions' connection: {exc}") from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if p.ssl_options is not None:
                sock = p.ssl_options.context.wrap_socket(
                    sock, server_hostname=p.ssl_options.server_hostname)
        except OSError as exc:
            sock.close()
            raise BrokerUnavailable(f"{self._where}: transactions' connection: {exc}") from exc
        self._sock, self._proto = sock, proto
        self._until(proto, Ready, p.stack_timeout or HANDSHAKE_S)
        self._log.debug("transactions' connection open", frame_max=proto.frame_max)
        return proto

    def _read_idle(self) -> None:
        """Whatever the broker sent since the last answer: nothing most often; a Close, or the
        end of the connection, when it went away meanwhile."""
        sock, proto = self._sock, self._proto
        assert sock is not None and proto is not None
        pending = isinstance(sock, ssl.SSLSocket) and sock.pending()
        while pending or select.select([sock], [], [], 0)[0]:
            pending = False
            try:
                sock.settimeout(0)
                data = sock.recv(1 << 16)
            except (BlockingIOError, ssl.SSLWantReadError):
                return  # a TLS record with no data in it
            except OSError as exc:
                self._log.debug("transactions' connection lost while idle", error=str(exc))
                self._drop()
                return
            if not data:
                self._log.debug("transactions' connection closed by the broker while idle")
                self._drop()
                return
            try:
                events = proto.receive_data(data)
                self._write(proto)
            except (OSError, PublishingProtocolError) as exc:
                self._log.debug("transactions' connection unusable", error=str(exc))
                self._drop()
                return
            for event in events:
                if isinstance(event, ConnectionClosed):
                    self._log.debug("transactions' connection closed by the broker",
                                    reply_code=event.reply_code, reply_text=event.reply_text)

    def _until(self, proto: Publishing, done: type[Event],
               wait_s: float = REPLY_S) -> list[Event]:
        """Write what is queued, then read until an event of type ``done``: every event up to
        it. ChannelRefused for a channel the broker closed; BrokerUnavailable for a connection
        lost, closed by the broker, or silent for ``wait_s`` (while the broker says it holds
        publishes back: for its blocked-connection timeout)."""
        sock = self._sock
        assert sock is not None
        deadline = time.monotonic() + wait_s
        blocked = self._params.blocked_connection_timeout
        events: list[Event] = []
        try:
            sock.settimeout(wait_s)
            self._write(proto)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._lost(f"no answer within {wait_s:g} s", TimeoutError())
                sock.settimeout(left)
                data = sock.recv(1 << 16)
                if not data:
                    raise self._lost("the broker closed the connection", EOFError())
                got = proto.receive_data(data)
                self._write(proto)  # the handshake's answers, a Close-Ok
                for event in got:
                    events.append(event)
                    if isinstance(event, Blocked) and blocked:
                        self._log.warning("the broker holds publishes back",
                                          reason=event.reason)
                        deadline = min(deadline, time.monotonic() + blocked)
                        wait_s = blocked
                    elif isinstance(event, Unblocked):
                        deadline = time.monotonic() + wait_s
                    elif isinstance(event, ConnectionClosed):
                        raise self._closed(event)
                    elif isinstance(event, ChannelClosed):
                        raise ChannelRefused(event)
                    elif isinstance(event, done):
                        return events
        except PublishingProtocolError as exc:
            with contextlib.suppress(OSError):
                proto.close(exc.reply_code, str(exc))
                self._write(proto)
            raise self._lost(f"protocol error: {exc}", exc) from exc
        except OSError as exc:
            raise self._lost(str(exc) or type(exc).__name__, exc) from exc

    def _write(self, proto: Publishing) -> None:
        data = proto.data_to_send()
        if data:
            assert self._sock is not None
            self._sock.sendall(data)

    def _closed(self, event: ConnectionClosed) -> BrokerUnavailable:
        self._drop()
        refused = event.reply_code in (403, 530)
        return BrokerUnavailable(
            f"{self._where}: transactions' connection closed by the broker: "
            f"({event.reply_code}) {event.reply_text}",
            MQRC_NOT_AUTHORIZED if refused else MQRC_HOST_NOT_AVAILABLE)

    def _lost(self, text: str, cause: BaseException) -> BrokerUnavailable:
        self._drop()
        error = BrokerUnavailable(f"{self._where}: transactions' connection: {text}")
        error.__cause__ = cause
        return error

    def _drop(self) -> None:
        sock = self._sock
        self._sock = self._proto = None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

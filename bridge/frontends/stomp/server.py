"""asyncio glue for the STOMP front-end: sockets in, ``Session`` decides, sockets out.

Each accepted client gets its own upstream connection to the broker's STOMP port; the client's
CONNECT (with its own credentials) is relayed on it, so the broker authenticates every client.
Back-pressure is passed through: when one side cannot take more, the other stops being read.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable

import structlog

from bridge.frontends.checks import CheckRunner
from bridge.frontends.stats import RelayStats
from bridge.frontends.stomp.session import Output, Session, State
from bridge.intercept.chain import Chain
from policies.endpoints import Endpoint

# A peer that agreed to heart-beat every N ms is declared dead after N * this of silence.
# Brokers check whether they wrote anything once per interval, so their gaps can approach
# twice the interval (ActiveMQ's do); STOMP asks receivers to allow for that.
HEARTBEAT_TOLERANCE = 3.0
# How long a client's upstream connection stays open after it went away, for the broker to
# confirm the copies that replace its unsettled deliveries (then the broker gets back the rest).
SETTLE_LOST_S = 10.0
_ids = itertools.count(1)


class _Upstream(asyncio.Protocol):
    def __init__(self, link: ClientLink) -> None:
        self.link = link
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.set_write_buffer_limits(high=1 << 20)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.link.broker_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.link.broker_closed(exc)

    def pause_writing(self) -> None:
        self.link.pause_client()

    def resume_writing(self) -> None:
        self.link.resume_client()


class ClientLink(asyncio.Protocol):
    """One client connection and the upstream connection opened for it."""

    def __init__(self, server: StompServer) -> None:
        self.server = server
        self.id = next(_ids)
        self.session = Session(chain=server.chain, stats=server.stats)
        self.log = structlog.get_logger("stomp").bind(conn=self.id)
        self.client: asyncio.Transport | None = None
        self.upstream: asyncio.Transport | None = None
        self._pending: list[bytes] = []  # client bytes that arrived before upstream was up
        self._closing = False
        self._client_paused = False
        self._checking: asyncio.Task[None] | None = None
        self._last_client = self._last_broker = time.monotonic()
        self._watchdog: asyncio.TimerHandle | None = None

    # -- client side -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.client = transport
        transport.set_write_buffer_limits(high=1 << 20)
        peer = transport.get_extra_info("peername")
        self.log = self.log.bind(peer=f"{peer[0]}:{peer[1]}" if peer else "?")
        self.server.opened(self)
        self.server.loop.create_task(self._connect_upstream())

    async def _connect_upstream(self) -> None:
        target = self.server.upstream
        try:
            _, proto = await asyncio.wait_for(
                self.server.loop.create_connection(
                    lambda: _Upstream(self), target.host, target.port
                ),
                timeout=self.server.connect_timeout,
            )
        except (TimeoutError, OSError) as exc:
            reason = str(exc) or type(exc).__name__
            self.log.warning("upstream unreachable", upstream=str(target), error=reason)
            self._apply(self.session.broker_lost(
                f"{self.server.broker} at {target} is not reachable: {reason}"))
            return
        assert proto.transport is not None
        if self._closing:  # the client left while we were connecting
            proto.transport.close()
            return
        self.upstream = proto.transport
        pending, self._pending = self._pending, []
        for chunk in pending:
            self._apply(self.session.from_client(chunk))

    def data_received(self, data: bytes) -> None:
        self._last_client = time.monotonic()
        if self.upstream is None:
            self._pending.append(data)
            return
        self._apply(self.session.from_client(data))

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        if self._watchdog is not None:
            self._watchdog.cancel()
        out = self.session.client_lost()
        if out.close is None and self.upstream is not None:
            # Copies replace the deliveries it left unsettled: the upstream connection stays
            # until the broker has confirmed them and the originals are acknowledged.
            self.upstream.write(b"".join(out.to_broker))
            upstream = self.upstream
            self.server.loop.call_later(SETTLE_LOST_S, upstream.close)
        elif self._checking is None and self.upstream is not None:
            self.upstream.close()  # else the check relays what the client sent, then closes
        self.server.closed(self)

    def pause_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.pause_reading()

    def resume_writing(self) -> None:
        if self.upstream is not None and not self._closing:
            self.upstream.resume_reading()

    def pause_client(self) -> None:
        if self.client is not None and not self._client_paused:
            self._client_paused = True
            self.client.pause_reading()

    def resume_client(self) -> None:
        if self.client is not None and self._client_paused and not self._closing:
            self._client_paused = False
            if not self.session.checking:
                self.client.resume_reading()

    # -- broker side -------------------------------------------------------------------
    def broker_data(self, data: bytes) -> None:
        self._last_broker = time.monotonic()
        was_connecting = self.session.state is State.CONNECTING
        self._apply(self.session.from_broker(data))
        if was_connecting and self.session.state is State.CONNECTED:
            self._arm_watchdog()

    def broker_closed(self, exc: Exception | None) -> None:
        if self._closing:
            return
        why = str(exc) if exc else "end of stream"
        self._apply(self.session.broker_lost(why))

    # -- carrying out ------------------------------------------------------------------
    def _apply(self, out: Output) -> None:
        if out.to_broker and self.upstream is not None:
            self.upstream.write(b"".join(out.to_broker))
        if out.to_client and self.client is not None and not self.client.is_closing():
            self.client.write(b"".join(out.to_client))
        if out.close is not None:
            if self._closing and self.upstream is not None:  # the client is gone already
                self.upstream.close()
            self.close(out.close)
        elif out.check is not None:
            self._checking = self.server.checks.start(out.check, self)
        elif out.hold:
            self.hold_client()
        if out.unhold and not self.session.checking and not self._client_paused:
            if self.client is not None and not self._closing:
                self.client.resume_reading()

    def hold_client(self) -> None:
        """Stop reading the client until the check is done (the session holds its frames)."""
        if self.client is not None and not self._client_paused:
            self.client.pause_reading()

    def checked(self) -> None:
        self._checking = None
        gone = self._closing
        self._apply(self.session.resume())
        if gone:  # the client left while its frames were held: they went up, now close
            if self._checking is None and self.upstream is not None:
                self.upstream.close()
        elif (self._checking is None and not self.session.checking and not self._client_paused
              and self.client is not None):
            self.client.resume_reading()

    def close(self, why: str) -> None:
        if self._closing:
            return
        self._closing = True
        self.log.info("closing", why=why)
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self.upstream is not None:
            self.upstream.close()
        if self.client is not None:
            self.client.close()

    def shutdown(self) -> None:
        self._apply(self.session.shutting_down())

    # -- heart-beats -------------------------------------------------------------------
    def _arm_watchdog(self) -> None:
        intervals = [i for i in (self.session.heartbeat_up, self.session.heartbeat_down) if i]
        if intervals:
            self._watchdog = self.server.loop.call_later(min(intervals) / 1000, self._check)

    def _check(self) -> None:
        if self._closing:
            return
        now = time.monotonic()
        up, down = self.session.heartbeat_up, self.session.heartbeat_down
        silent_client = (now - self._last_client) * 1000
        silent_broker = (now - self._last_broker) * 1000
        if up and silent_client > up * HEARTBEAT_TOLERANCE:
            self.log.info("client heart-beat missed", silent_ms=round(silent_client))
            self._apply(self.session.client_silent(silent_client))
            return
        if down and silent_broker > down * HEARTBEAT_TOLERANCE:
            self.log.info("broker heart-beat missed", silent_ms=round(silent_broker))
            self._apply(self.session.broker_silent(silent_broker))
            return
        self._arm_watchdog()


class StompServer:
    """Accepts STOMP clients and links each one to its own upstream connection."""

    def __init__(
        self,
        *,
        broker: str,
        upstream: Endpoint,
        chain: Chain | None,
        stats: RelayStats,
        connect_timeout: float = 10.0,
    ) -> None:
        self.broker = broker
        self.upstream = upstream
        self.chain = chain
        self.stats = stats
        self.checks = CheckRunner()
        self.connect_timeout = connect_timeout
        self.links: set[ClientLink] = set()
        self.loop = asyncio.get_running_loop()
        self._server: asyncio.base_events.Server | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self.log = structlog.get_logger("stomp")

    def factory(self) -> Callable[[], ClientLink]:
        return lambda: ClientLink(self)

    async def listen(self, where: Endpoint) -> None:
        self._server = await self.loop.create_server(
            self.factory(), where.host, where.port, reuse_address=True, backlog=512
        )

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    def opened(self, link: ClientLink) -> None:
        self.links.add(link)
        self._idle.clear()
        self.stats.connections_open += 1
        self.stats.connections_total += 1

    def closed(self, link: ClientLink) -> None:
        if link in self.links:
            self.links.discard(link)
            self.stats.connections_open -= 1
        if not self.links:
            self._idle.set()

    async def shutdown(self, grace: float = 5.0) -> None:
        """Stop accepting, end every session with what it already read relayed, close."""
        if self._server is not None:
            self._server.close()
        for link in list(self.links):
            link.shutdown()
        try:
            await asyncio.wait_for(self._idle.wait(), grace)
        except TimeoutError:
            self.log.warning("connections still open at shutdown", open=len(self.links))
            for link in list(self.links):
                if link.client is not None:
                    link.client.abort()
                if link.upstream is not None:
                    link.upstream.abort()

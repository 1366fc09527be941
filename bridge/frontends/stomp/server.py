"""asyncio glue for the STOMP front-end: sockets in, ``Session`` decides, sockets out.

Each accepted client gets its own upstream connection to the broker's STOMP port; the client's
CONNECT (with its own credentials) is relayed on it, so the broker authenticates every client.
Back-pressure is passed through: when one side cannot take more, the other stops being read.
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
import time
from collections.abc import Awaitable, Callable

import structlog

from adapters.rabbitmq_stomp import nack_requeues
from bridge.frontends.budget import Budget
from bridge.frontends.checks import CheckRunner, always_ready
from bridge.frontends.peers import tls_subject
from bridge.frontends.relay_stats import RelayStats
from bridge.frontends.stomp import Limits, error_frame
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


def _max(a: Limits, b: Limits) -> Limits:
    return a if a.max_frame_bytes >= b.max_frame_bytes else b


class ClientLink(asyncio.Protocol):
    """One client connection and the upstream connection opened for it."""

    def __init__(self, server: StompServer) -> None:
        self.server = server
        self.id = next(_ids)
        self.address = "?"
        self.session = Session(chain=server.chain, stats=server.stats, limits=server.limits,
                               broker_limits=_max(server.limits, Limits()),
                               requeues=nack_requeues if server.broker == "rabbitmq" else None)
        self.log = structlog.get_logger("stomp").bind(conn=self.id)
        self.client: asyncio.Transport | None = None
        self.upstream: asyncio.Transport | None = None
        # What the session sends the broker before the upstream connection is up: it is opened
        # only once a whole, valid CONNECT has arrived, so garbage never reaches the broker.
        self._pending: list[bytes] = []
        self._connecting = False
        self._handshake: asyncio.TimerHandle | None = None
        self._closing = False
        self._client_paused = False
        self._budget_paused = False  # the bytes held for all clients are at the budget
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
        if transport.get_extra_info("ssl_object") is not None:
            who = tls_subject(transport.get_extra_info("peercert"))
            self.log = self.log.bind(tls=True, client_subject=who)
            self.log.info("tls client", client_subject=who)
        refusal = self.server.opened(self, peer[0] if peer else "?")
        if refusal is not None:
            self.log.warning("connection refused", why=refusal)
            transport.write(error_frame(refusal))
            self._closing = True
            transport.close()
            return
        self._handshake = self.server.loop.call_later(self.server.handshake_timeout,
                                                      self._handshake_expired)

    def _handshake_expired(self) -> None:
        if self._connecting or self._closing or self.client is None:
            return
        why = f"no CONNECT within {self.server.handshake_timeout:g} s"
        self.server.stats.protocol_errors["handshake-timeout"] += 1
        self.log.info("closing", why=why)
        self.client.write(error_frame("handshake timeout", detail=why))
        self._closing = True
        self.client.close()

    def _connect_once_connected(self) -> None:
        """The client has sent its CONNECT: open its upstream connection now."""
        if self._connecting or self.session.state in (State.AWAIT_CONNECT, State.CLOSED):
            return
        self._connecting = True
        if self._handshake is not None:
            self._handshake.cancel()
        if self.client is not None and not self._client_paused:
            self.client.pause_reading()  # until the broker is there to take what follows
        self.server.loop.create_task(self._connect_upstream())

    async def _connect_upstream(self) -> None:
        # A bridge that has not yet tried its broker (it is starting) answers once it has.
        not_ready = await self.server.settled(self.server.handshake_timeout)
        if self._closing:
            return
        if not_ready is not None:  # the broker not yet set up: nothing may be staged yet
            self.server.stats.protocol_errors["broker-unreachable"] += 1
            self.log.info("refused: not ready", why=not_ready)
            self._apply(self.session.broker_unreachable(not_ready))
            return
        # The broker's nodes (one, or a cluster's), from the one that answered last.
        nodes = self.server.upstream.every()
        at = self.server.upstream_at % len(nodes)
        reason = ""
        for i in (*range(at, len(nodes)), *range(at)):
            target = nodes[i]
            try:
                _, proto = await asyncio.wait_for(
                    self.server.loop.create_connection(
                        lambda: _Upstream(self), target.host, target.port,
                        ssl=self.server.upstream_ssl,
                        server_hostname=target.host if self.server.upstream_ssl else None,
                    ),
                    timeout=self.server.connect_timeout,
                )
            except (TimeoutError, OSError) as exc:  # ssl.SSLError is an OSError
                reason = str(exc) or type(exc).__name__
                self.log.warning("upstream unreachable", upstream=str(target), error=reason)
                continue
            self.server.upstream_at = i
            break
        else:
            self.server.stats.protocol_errors["broker-unreachable"] += 1
            self._apply(self.session.broker_unreachable(
                f"{self.server.broker} STOMP at {self.server.upstream} is not reachable: "
                f"{reason}"))
            return
        assert proto.transport is not None
        if self._closing:  # the client left while we were connecting
            proto.transport.close()
            return
        self.upstream = proto.transport
        pending, self._pending = self._pending, []
        if pending:
            self.upstream.write(b"".join(pending))
        if self._may_read():
            self.client.resume_reading()  # type: ignore[union-attr]
        self._account()

    def _may_read(self) -> bool:
        """Whether nothing holds the client's reading: back-pressure, a check, the budget."""
        return (self.client is not None and not self._client_paused and not self._closing
                and not self._budget_paused and not self.session.checking
                and (self.upstream is not None or not self._connecting))

    def _account(self) -> None:
        """Tell the budget what this client holds now: its frame not yet complete and what the
        broker has not yet taken; stop reading it, or read it again, as the budget says."""
        if self._closing:
            return
        held = self.session.client_buffered
        if self._client_paused and self.upstream is not None:
            # Over its high-water mark (then resume_writing comes when it drains); below it,
            # at most 1 MiB a client, not counted, so nothing counted can go stale.
            held += self.upstream.get_write_buffer_size()
        budget = self.server.budget
        before = budget.total
        pause = budget.update(self, held)
        self.server.stats.buffered_bytes += budget.total - before
        if pause and not self._budget_paused:
            self._budget_paused = True
            self.server.stats.budget_pauses += 1
            if self.client is not None:
                self.client.pause_reading()
        elif not pause and self._budget_paused:
            self.budget_resume()

    def budget_resume(self) -> None:
        self._budget_paused = False
        if self._may_read():
            self.client.resume_reading()  # type: ignore[union-attr]

    def data_received(self, data: bytes) -> None:
        self._last_client = time.monotonic()
        self._apply(self.session.from_client(data))
        if self.upstream is None:
            self._connect_once_connected()
        self._account()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._handshake is not None:
            self._handshake.cancel()
        self._forget_budget()
        if self.client is None or self not in self.server.links:
            return  # refused at accept: it was never counted
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
            if self._may_read():
                self.client.resume_reading()
        self._account()  # the broker took what was waiting for it

    def _forget_budget(self) -> None:
        budget = self.server.budget
        before = budget.total
        budget.forget(self)
        self.server.stats.buffered_bytes += budget.total - before

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
        if out.to_broker:
            if self.upstream is not None:
                self.upstream.write(b"".join(out.to_broker))
            else:
                self._pending += out.to_broker
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
        if out.unhold and self._may_read():
            self.client.resume_reading()  # type: ignore[union-attr]

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
        elif self._checking is None and self._may_read():
            self.client.resume_reading()  # type: ignore[union-attr]

    def close(self, why: str) -> None:
        if self._closing:
            return
        self._closing = True
        self._forget_budget()
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
        handshake_timeout: float = 10.0,
        max_connections: int = 10_000,
        max_per_address: int = 1_000,
        limits: Limits = Limits(),  # noqa: B008 - frozen
        max_buffered_bytes: int = 128 * 1024 * 1024,
        upstream_ssl: ssl.SSLContext | None = None,
        settled: Callable[[float], Awaitable[str | None]] = always_ready,
    ) -> None:
        # Why clients cannot be carried yet (the staging queues not yet declared), or None;
        # awaited, as the first check of the broker may not have ended yet.
        self.settled = settled
        self.upstream_ssl = upstream_ssl
        self.limits = limits
        self.budget = Budget(max_buffered_bytes)
        self.handshake_timeout = handshake_timeout
        self.max_connections = max_connections
        self.max_per_address = max_per_address
        self._by_address: dict[str, int] = {}
        self.broker = broker
        self.upstream = upstream
        self.upstream_at = 0  # which of upstream.every() answered last
        self.chain = chain
        self.stats = stats
        self.checks = CheckRunner()
        self.connect_timeout = connect_timeout
        self.links: set[ClientLink] = set()
        self.loop = asyncio.get_running_loop()
        self._server: asyncio.base_events.Server | None = None
        self._tls_server: asyncio.base_events.Server | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self.log = structlog.get_logger("stomp")

    def factory(self) -> Callable[[], ClientLink]:
        return lambda: ClientLink(self)

    async def listen(self, where: Endpoint) -> None:
        self._server = await self.loop.create_server(
            self.factory(), where.host, where.port, reuse_address=True, backlog=512
        )

    async def listen_tls(self, where: Endpoint, context: ssl.SSLContext) -> None:
        """The same clients over TLS. A TLS handshake must end within the handshake timeout
        (a plain-text client fails it at its first bytes and is closed at once); the CONNECT
        timeout then starts."""
        self._tls_server = await self.loop.create_server(
            self.factory(), where.host, where.port, reuse_address=True, backlog=512,
            ssl=context, ssl_handshake_timeout=self.handshake_timeout,
        )

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    def opened(self, link: ClientLink, address: str) -> str | None:
        """Count a new client, or say why it is refused (a connection limit)."""
        if len(self.links) >= self.max_connections:
            self.stats.protocol_errors["connection-limit"] += 1
            return f"the bridge has {len(self.links)} connections, its limit (--max-connections)"
        if self._by_address.get(address, 0) >= self.max_per_address:
            self.stats.protocol_errors["connection-limit"] += 1
            return (f"{address} has {self.max_per_address} connections, the limit per client "
                    "address (--max-connections-per-address)")
        link.address = address
        self._by_address[address] = self._by_address.get(address, 0) + 1
        self.links.add(link)
        self._idle.clear()
        self.stats.connections_open += 1
        self.stats.connections_total += 1
        return None

    def closed(self, link: ClientLink) -> None:
        if link in self.links:
            self.links.discard(link)
            self.stats.connections_open -= 1
            left = self._by_address.get(link.address, 1) - 1
            if left:
                self._by_address[link.address] = left
            else:
                self._by_address.pop(link.address, None)
        if not self.links:
            self._idle.set()

    async def shutdown(self, grace: float = 5.0) -> None:
        """Stop accepting, end every session with what it already read relayed, close."""
        for server in (self._server, self._tls_server):
            if server is not None:
                server.close()
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

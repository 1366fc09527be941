"""asyncio glue for the AMQP 0-9-1 front-end: sockets in, ``ProxyConnection`` decides, out.

Each accepted client gets its own TCP connection to the broker's AMQP port, opened once the
client has sent AMQP 0-9-1's protocol header (so idle sockets and other protocols never reach
the broker: a client that sends no header within the handshake timeout is closed, one that
sends another protocol's bytes gets the header RabbitMQ answers with); the client's own
handshake (protocol header, Start-Ok with PLAIN or AMQPLAIN, Tune-Ok, Open) is relayed on it
unchanged, so the broker authenticates every client and answers it in its own words. Frames
go both ways as their original bytes. A client publish is offered to the one hook point,
``PublishHook``; a malformed client frame closes that client with the Connection.Close the
core names. Each client's link (``link.Link``) handles the broker's bytes as they arrive
(``upstream.Upstream``, a protocol), the client's through a stream, since a publish may wait on
its hook. A side is not read while the other side's socket holds more than its high-water mark
(back-pressure).
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import structlog

from bridge.frontends.amqp.framer import MAX_BODY_SIZE
from bridge.frontends.amqp.link import Link, PublishHook
from bridge.frontends.amqp.reading import READ_SIZE, ClientReader
from bridge.frontends.amqp.refusal import refuse
from bridge.frontends.amqp.translate import PublishScreen
from bridge.frontends.amqp.upstream import Upstream
from bridge.frontends.budget import Budget
from bridge.frontends.checks import always_ready
from bridge.frontends.relay_stats import AmqpStats
from bridge.intercept.chain import Chain


def _consumer_side(chain: Chain) -> bool:
    interest = chain.interest
    return interest.deliveries or interest.settlements or interest.subscribes


class AmqpRelay:
    """Accepts AMQP clients and relays each to its own upstream connection."""

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        *,
        hook: PublishHook | None = None,
        chain: Chain | None = None,
        max_body_size: int = MAX_BODY_SIZE,
        connect_timeout: float = 10.0,
        stats: AmqpStats | None = None,
        max_connections: int = 10_000,
        max_per_address: int = 1_000,
        settled: Callable[[float], Awaitable[str | None]] = always_ready,
        handshake_timeout: float = 10.0,
        budget: Budget | None = None,
        alternates: Sequence[tuple[str, int]] = (),
        upstream_ssl: ssl.SSLContext | None = None,
    ) -> None:
        # Bytes held for clients, process-wide (shared with the STOMP listener): past it, a
        # client holding part of a message is not read until others have passed theirs on.
        self.budget = budget or Budget(128 * 1024 * 1024)
        self.settled = settled  # why clients cannot be carried yet, or None (awaited)
        self.handshake_timeout = handshake_timeout
        self.max_connections = max_connections
        self.max_per_address = max_per_address
        self._by_address: dict[str, int] = {}
        # The broker's nodes (one, or a cluster's), each client's tried in turn from the one
        # that answered last; over TLS with ``upstream_ssl`` (amqps://).
        self.nodes = ((upstream_host, upstream_port), *alternates)
        self.node_at = 0
        self.upstream_ssl = upstream_ssl
        self.stats = stats or AmqpStats()
        # With a chain: its publishes screened (unless a hook is given), and its consumer
        # side (deliveries stamped, failures replaced, consumes guarded) when it asks for it.
        if chain is not None and hook is None and chain.interest.sends:
            hook = PublishScreen(chain)
        self.chain = chain if chain is not None and _consumer_side(chain) else None
        self.hook = hook
        # Delayed-message exchanges are declared as the bridge keeps them (``exchanges``)
        # where its chain screens publishes, which stages their delayed ones.
        self.delayed_exchanges = isinstance(hook, PublishScreen)
        self.max_body_size = max_body_size
        self.connect_timeout = connect_timeout
        self.protocol_errors = 0
        self.log = structlog.get_logger("amqp")
        self._server: asyncio.Server | None = None
        self._tls_server: asyncio.Server | None = None
        self._links: set[asyncio.Task[None]] = set()

    async def listen(self, host: str, port: int) -> None:
        self._server = await self._start_server(host, port)

    async def listen_tls(self, host: str, port: int, context: ssl.SSLContext) -> None:
        """The same clients over TLS, as RabbitMQ's amqps port takes them. The TLS handshake
        must end within the handshake timeout (a plain-text client fails it at its first bytes
        and is closed at once); the wait for the protocol header then starts."""
        self._tls_server = await self._start_server(
            host, port, ssl=context, ssl_handshake_timeout=self.handshake_timeout)

    async def _start_server(self, host: str, port: int, **tls: Any) -> asyncio.Server:
        """``asyncio.start_server`` with a ``ClientReader`` as each client's stream."""
        loop = asyncio.get_running_loop()

        def protocol() -> asyncio.StreamReaderProtocol:
            return asyncio.StreamReaderProtocol(ClientReader(limit=READ_SIZE, loop=loop),
                                                self._accept, loop=loop)

        return await loop.create_server(protocol, host, port, reuse_address=True, backlog=512,
                                        **tls)

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        """Stop accepting and drop every link."""
        for server in (self._server, self._tls_server):
            if server is not None:
                server.close()
                await server.wait_closed()
        for task in list(self._links):
            task.cancel()
        await asyncio.gather(*self._links, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        peer = writer.get_extra_info("peername")
        address = peer[0] if peer else "?"
        refusal = self._limit(address)
        if refusal is not None:
            self.stats.protocol_errors["connection-limit"] += 1
            self.log.warning("connection refused", why=refusal, peer=address)
            await refuse(reader, writer, refusal)
            return
        self._links.add(task)
        self._by_address[address] = self._by_address.get(address, 0) + 1
        self.stats.connections_open += 1
        self.stats.connections_total += 1
        try:
            await Link(self, reader, writer).run()
        except asyncio.CancelledError:
            pass  # close(): the link is dropped (asyncio would log the cancelled task)
        finally:
            self._links.discard(task)
            left = self._by_address.get(address, 1) - 1
            if left:
                self._by_address[address] = left
            else:
                self._by_address.pop(address, None)
            self.stats.connections_open -= 1

    async def connect(self, protocol: Callable[[], Upstream], reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter, log: Any) -> Upstream | None:
        """A link's upstream connection, to the first of the broker's nodes that answers (from
        the one that answered last); None once the client has been refused, when none does."""
        nodes = self.nodes
        at = self.node_at % len(nodes)
        tls = self.upstream_ssl
        loop = asyncio.get_running_loop()
        reason = ""
        for i in (*range(at, len(nodes)), *range(at)):
            host, port = nodes[i]
            try:
                _, upstream = await asyncio.wait_for(
                    loop.create_connection(protocol, host, port,
                                           ssl=tls, server_hostname=host if tls else None),
                    self.connect_timeout,
                )
            except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
                reason = str(exc) or type(exc).__name__
                log.warning("upstream unreachable", upstream=f"{host}:{port}", error=reason)
                continue
            self.node_at = i
            return upstream
        self.stats.protocol_errors["broker-unreachable"] += 1
        where = ",".join(f"{host}:{port}" for host, port in nodes)
        await refuse(reader, writer,
                     f"MQRC_HOST_NOT_AVAILABLE (2538): RabbitMQ AMQP at {where} is not "
                     f"reachable: {reason}", header_read=True)
        return None

    def _limit(self, address: str) -> str | None:
        """Why a new connection from ``address`` is refused (a connection limit), or None."""
        if len(self._links) >= self.max_connections:
            return (f"the bridge has {len(self._links)} AMQP connections, its limit "
                    "(--max-connections)")
        if self._by_address.get(address, 0) >= self.max_per_address:
            return (f"{address} has {self.max_per_address} AMQP connections, the limit per "
                    "client address (--max-connections-per-address)")
        return None


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


async def _serve(listen: tuple[str, int], upstream: tuple[str, int]) -> None:
    relay = AmqpRelay(*upstream)
    await relay.listen(*listen)
    relay.log.info("amqp relay listening", listen=f"{listen[0]}:{relay.port}",
                   upstream=f"{upstream[0]}:{upstream[1]}")
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    """``python -m bridge.frontends.amqp.server``: the relay alone, with no interception."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--listen", default="127.0.0.1:5695")
    parser.add_argument("--upstream", default="127.0.0.1:5672")
    args = parser.parse_args(argv)
    try:
        asyncio.run(_serve(_address(args.listen), _address(args.upstream)))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()

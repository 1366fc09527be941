"""asyncio glue for the AMQP 0-9-1 front-end: sockets in, ``ProxyConnection`` decides, out.

Each accepted client gets its own TCP connection to the broker's AMQP port, opened once the
client has sent AMQP 0-9-1's protocol header (so idle sockets and other protocols never reach
the broker: a client that sends no header within the handshake timeout is closed, one that
sends another protocol's bytes gets the header RabbitMQ answers with); the client's own
handshake (protocol header, Start-Ok with PLAIN or AMQPLAIN, Tune-Ok, Open) is relayed on it
unchanged, so the broker authenticates every client and answers it in its own words. Frames
go both ways as their original bytes. A client publish is offered to the one hook point,
``PublishHook``; a malformed client frame closes that client with the Connection.Close the
core names. The broker's bytes are handled as they arrive (``upstream.Upstream``, a protocol);
the client's through a stream, since a publish may wait on its hook. A side is not read while
the other side's socket holds more than its high-water mark (back-pressure).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import ssl
from collections import Counter as Tally
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, SupportsIndex

import structlog
from pamqp import commands

from bridge.frontends.amqp.assembler import Message
from bridge.frontends.amqp.builders import PROTOCOL_HEADER
from bridge.frontends.amqp.connection import (
    Answer,
    DeliveryRun,
    Event,
    Forward,
    PlainRun,
    ProxyConnection,
)
from bridge.frontends.amqp.consumers import DROP, Failure
from bridge.frontends.amqp.errors import AmqpProtocolError
from bridge.frontends.amqp.exchanges import DECLARE, declare
from bridge.frontends.amqp.framer import FRAME_HEARTBEAT, FRAME_METHOD, MAX_BODY_SIZE, Frame
from bridge.frontends.amqp.refusal import refuse
from bridge.frontends.amqp.settling import ConsumerSide
from bridge.frontends.amqp.translate import PublishScreen
from bridge.frontends.amqp.upstream import Upstream
from bridge.frontends.budget import Budget
from bridge.frontends.checks import always_ready
from bridge.frontends.peers import tls_subject
from bridge.frontends.relay_stats import AmqpStats
from bridge.intercept.chain import Chain
from policies.errors import Refused

# The interception layer's hook: called with each whole client Basic.Publish and its
# connection (its frame_max for building replacement frames, and who the client is). It returns
# None to relay the original bytes, replacement bytes to send upstream instead, or raises
# Refused to close the channel with 406 PRECONDITION_FAILED whose reply text starts with the
# reason name. It may be async.
PublishHook = Callable[
    [Message, ProxyConnection], bytes | None | Awaitable[bytes | None]
]

READ_SIZE = 256 * 1024
# Rewritten publishes (staged copies) cost the relay far more than relayed ones: a chunk's are
# written up this many at a time, so the broker confirms the first while the rest are made, and
# the event loop is let run between them, so those confirms reach the client, which publishes
# more, while the chunk is still being worked through (delayed publishes with a window of 100
# confirms outstanding, faster with that turn: docs/benchmarks.md).
FLUSH_EVERY = 16
_ids = itertools.count(1)


class _ClientReader(asyncio.StreamReader):
    """A client's stream whose bytes its link may take where they arrive (``take``, called with
    them; True when taken), instead of their waiting in the buffer for the link's task to read
    them: a publisher's reads of plain publishes then go up with no task woken and no copy in
    and out of the buffer."""

    take: Callable[[bytes], bool] | None = None

    def feed_data(self, data: Iterable[SupportsIndex]) -> None:
        take = self.take
        if take is None or type(data) is not bytes or not take(data):
            super().feed_data(data)


CHANNEL_OPEN_OK = commands.Channel.OpenOk.index
BASIC_PUBLISH = commands.Basic.Publish.index
BASIC_DELIVER = commands.Basic.Deliver.index
BASIC_ACK = commands.Basic.Ack.index
CHANNEL_CLOSE_OK = commands.Channel.CloseOk.index


class _GiveUp(Exception):
    """The link cannot go on: close both sides."""


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
        """``asyncio.start_server`` with a ``_ClientReader`` as each client's stream."""
        loop = asyncio.get_running_loop()

        def protocol() -> asyncio.StreamReaderProtocol:
            return asyncio.StreamReaderProtocol(_ClientReader(limit=READ_SIZE, loop=loop),
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
            await _Link(self, reader, writer).run()
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

    def _limit(self, address: str) -> str | None:
        """Why a new connection from ``address`` is refused (a connection limit), or None."""
        if len(self._links) >= self.max_connections:
            return (f"the bridge has {len(self._links)} AMQP connections, its limit "
                    "(--max-connections)")
        if self._by_address.get(address, 0) >= self.max_per_address:
            return (f"{address} has {self.max_per_address} AMQP connections, the limit per "
                    "client address (--max-connections-per-address)")
        return None


class _Link:
    """One client connection and the upstream connection opened for it."""

    def __init__(
        self, relay: AmqpRelay, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.relay = relay
        chain = relay.chain
        self.conn = ProxyConnection(max_body_size=relay.max_body_size,
                                    assemble_broker=chain is not None,
                                    reserve_channel=chain is not None)
        # Publishes the hook would not look at are relayed without being framed: with no
        # hook, all of them; with the chain's screen, those whose bytes hold none of its
        # needles; another hook sees every publish.
        hook = relay.hook
        if hook is None:
            self.conn.screen_needles = ((), ())
        elif isinstance(hook, PublishScreen):
            self.conn.screen_needles = hook.needles
            self.conn.screen_flags = hook.flags
        self.client_r, self.client_w = reader, writer
        self.up: Upstream | None = None
        self._drained: asyncio.Task[None] | None = None  # while the broker is not read
        # Past it (the client socket's high-water mark) the client's writer would wait to drain.
        self._client_high = writer.transport.get_write_buffer_limits()[1]
        peer = writer.get_extra_info("peername")
        self.log = relay.log.bind(conn=next(_ids), peer=f"{peer[0]}:{peer[1]}" if peer else "?")
        if writer.get_extra_info("ssl_object") is not None:
            who = tls_subject(writer.get_extra_info("peercert"))
            self.log = self.log.bind(tls=True, client_subject=who)
            self.log.info("tls client", client_subject=who)
        self.side = (ConsumerSide(chain, self.conn, relay.stats, self.log)
                     if chain is not None else None)
        self.client_gone = False
        self.channels = 0  # open (Channel.Open-Ok seen, Close-Ok not yet)
        self._may_read = asyncio.Event()  # cleared while the budget holds the client's reading
        self._may_read.set()
        # While the link's task waits in a read (so nothing of the client's is in the stream's
        # buffer), a read that is only publishes to relay as they came is taken where it
        # arrives (``_take``); anything else is left to the task, and so is all that follows.
        self._taking = False
        if isinstance(reader, _ClientReader):
            reader.take = self._take

    def budget_resume(self) -> None:
        self._may_read.set()

    def _take(self, data: bytes) -> bool:
        """The client's bytes where they arrive: True when they were only publishes to relay
        as they came and went up; False (and the task takes them, and what follows, from the
        stream) otherwise, or when the link must wait (the broker's socket full, the budget
        holding the client)."""
        up = self.up
        if not self._taking or up is None or not up.writable:
            return False
        publishes = self.conn.client_plain(data)
        if not publishes:
            self._taking = False
            return False
        stats = self.relay.stats
        stats.bytes["upstream"] += len(data)
        stats.methods_up[BASIC_PUBLISH] += publishes
        up.write(data)
        if self._account():
            self._taking = False  # the task waits for the budget once it has read again
        return True

    def _account(self) -> bool:
        """Tell the budget what the client holds now; True while it says not to read more
        (wait for ``_may_read`` then)."""
        budget, stats = self.relay.budget, self.relay.stats
        before = budget.total
        if budget.update(self, self.conn.client_buffered) and self._may_read.is_set():
            self._may_read.clear()
            stats.budget_pauses += 1
        stats.buffered_bytes += budget.total - before
        return not self._may_read.is_set()

    def _forget_budget(self) -> None:
        budget = self.relay.budget
        before = budget.total
        budget.forget(self)
        self.relay.stats.buffered_bytes += budget.total - before

    async def _protocol_header(self) -> bytes | None:
        """The client's protocol header, read before anything goes to the broker; None when
        there is none to carry (the client left, sent no header in time, or sent another
        protocol's bytes: answered with AMQP 0-9-1's header, as RabbitMQ answers them)."""
        timeout = self.relay.handshake_timeout
        deadline = asyncio.get_running_loop().time() + timeout
        seen = b""
        while len(seen) < len(PROTOCOL_HEADER):
            left = deadline - asyncio.get_running_loop().time()
            try:
                chunk = await asyncio.wait_for(
                    self.client_r.read(len(PROTOCOL_HEADER) - len(seen)), max(left, 0.0))
            except TimeoutError:
                self.relay.stats.protocol_errors["handshake-timeout"] += 1
                self.log.info("closing", why=f"no protocol header within {timeout:g} s")
                return None
            except OSError:
                return None
            if not chunk:
                return None
            seen += chunk
            if not PROTOCOL_HEADER.startswith(seen):
                self.relay.stats.protocol_errors["bad-header"] += 1
                self.log.info("closing", why="not AMQP 0-9-1", first_octets=repr(seen))
                self.client_w.write(PROTOCOL_HEADER)
                return None
        return seen

    async def run(self) -> None:
        header = await self._protocol_header()
        if header is None:
            self.client_w.close()
            return
        not_ready = await self.relay.settled(self.relay.handshake_timeout)
        if not_ready is not None:  # the staging queues not yet declared: a publish would be lost
            self.relay.stats.protocol_errors["broker-unreachable"] += 1
            await refuse(self.client_r, self.client_w, f"MQRC_HOST_NOT_AVAILABLE (2538): "
                         f"{not_ready}", header_read=True)
            return
        upstream = await self._connect()
        if upstream is None:
            return
        self.up = upstream
        if self.side is not None:
            self.side.attach(upstream.write)
        up = asyncio.create_task(self._client_to_broker(header))
        down = asyncio.create_task(self._broker_to_client())
        try:
            done, _ = await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if not task.cancelled() and task.exception() is not None:
                    self.log.error("link failed", error=repr(task.exception()))
        finally:
            tasks = [up, down] + ([self._drained] if self._drained is not None else [])
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.relay.stats.channels_open -= self.channels
            self.channels = 0
            self._forget_budget()
            self.client_w.close()
            if self.up is not None:
                self.up.close()

    async def _connect(self) -> Upstream | None:
        """The upstream connection, to the first of the broker's nodes that answers (from the
        one that answered last); None once the client has been refused, when none does."""
        relay = self.relay
        nodes = relay.nodes
        at = relay.node_at % len(nodes)
        tls = relay.upstream_ssl
        loop = asyncio.get_running_loop()
        reason = ""
        for i in (*range(at, len(nodes)), *range(at)):
            host, port = nodes[i]
            try:
                _, upstream = await asyncio.wait_for(
                    loop.create_connection(lambda: Upstream(self._broker_data), host, port,
                                           ssl=tls, server_hostname=host if tls else None),
                    relay.connect_timeout,
                )
            except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
                reason = str(exc) or type(exc).__name__
                self.log.warning("upstream unreachable", upstream=f"{host}:{port}", error=reason)
                continue
            relay.node_at = i
            return upstream
        relay.stats.protocol_errors["broker-unreachable"] += 1
        where = ",".join(f"{host}:{port}" for host, port in nodes)
        await refuse(self.client_r, self.client_w,
                     f"MQRC_HOST_NOT_AVAILABLE (2538): RabbitMQ AMQP at {where} is not "
                     f"reachable: {reason}", header_read=True)
        return None

    async def _client_to_broker(self, first: bytes) -> None:
        assert self.up is not None
        read = self.client_r.read
        stats = self.relay.stats
        while True:
            if first:  # the protocol header, read before the upstream connection was opened
                data, first = first, b""
            else:
                self._taking = True
                try:
                    data = await read(READ_SIZE)
                except OSError:
                    data = b""
                finally:
                    self._taking = False
            if not data:
                self.client_gone = True
                if self.side is not None:  # its unsettled deliveries are failures
                    await self._settle_lost()
                return  # client gone: the link closes both sides
            stats.bytes["upstream"] += len(data)
            try:
                events = self.conn.client_data(data)
            except AmqpProtocolError as exc:
                self.relay.protocol_errors += 1
                stats.protocol_errors[exc.kind] += 1
                self._count(exc.events, stats.methods_up)
                self.log.info("client protocol error", code=exc.reply_code, text=exc.reply_text)
                await self._carry(exc.events)
                self.client_w.write(exc.reply())
                await self.client_w.drain()
                return
            self._count(events, stats.methods_up)
            try:
                await self._carry(events)
            except _GiveUp:
                return
            except AmqpProtocolError as exc:  # properties pamqp cannot read, found when read
                stats.protocol_errors[exc.kind] += 1
                self.log.info("client protocol error", code=exc.reply_code, text=exc.reply_text)
                self.client_w.write(exc.reply())
                await self.client_w.drain()
                return
            if self._account():
                await self._may_read.wait()

    def _count(self, events: list[Event], tally: Tally[int]) -> None:
        """Method frames by method, heartbeats, and the channels a client opens and closes."""
        stats = self.relay.stats
        own = self.conn.own_channel
        for event in events:
            kind = type(event)
            if kind is Frame:
                if event.channel == own:  # type: ignore[union-attr]
                    continue  # the bridge's own channel: not the client's traffic
                if event.type == FRAME_METHOD:  # type: ignore[union-attr]
                    index = event.method_index  # type: ignore[union-attr]
                    tally[index] += 1
                    if index == CHANNEL_OPEN_OK:
                        stats.channels_open += 1
                        stats.channels_total += 1
                        self.channels += 1
                    elif index == CHANNEL_CLOSE_OK and self.channels:
                        stats.channels_open -= 1
                        self.channels -= 1
                elif event.type == FRAME_HEARTBEAT:  # type: ignore[union-attr]
                    stats.heartbeats["upstream" if tally is stats.methods_up
                                     else "downstream"] += 1
            elif kind is Message and event.channel != own:  # type: ignore[union-attr]
                tally[event.method_frame.method_index] += 1  # type: ignore[union-attr]
            elif kind is PlainRun:
                tally[BASIC_PUBLISH] += event.publishes  # type: ignore[union-attr]
            elif kind is DeliveryRun:
                tally[BASIC_DELIVER] += len(event.deliveries)  # type: ignore[union-attr]
                tally[BASIC_ACK] += event.confirms  # type: ignore[union-attr]

    async def _carry(self, events: list[Event]) -> None:
        """Write client-data events out: frames and messages upstream, answers to the client."""
        assert self.up is not None
        up: list[bytes] = []
        back: list[bytes] = []
        side = self.side
        rewritten = 0
        pending = deque(events)
        while pending:
            event = pending.popleft()
            if type(event) is PlainRun:  # publishes nobody needs to see: as they came
                up.append(event.raw)
                continue
            if (type(event) is Frame and event.type == FRAME_METHOD
                    and event.method_index == DECLARE and self.relay.delayed_exchanges):
                try:
                    instead = declare(event)
                except Refused as exc:
                    self.relay.stats.refusals[exc.reason.name] += 1
                    self.log.info("exchange declare refused", channel=event.channel,
                                  reason=exc.reason.name)
                    for closing in self.conn.refuse(event.channel, str(exc),
                                                    class_id=DECLARE >> 16,
                                                    method_id=DECLARE & 0xFFFF):
                        (back if type(closing) is Answer else up).append(closing.raw)
                    pending = deque(self.conn.recheck(pending))
                    continue
                up.append(event.raw if instead is None else instead)
                continue
            if side is not None and type(event) is Frame:
                found = side.client_frame(event)
                if found is DROP:
                    continue
                if isinstance(found, Failure):
                    self._flush(up, back)
                    up, back = [], []
                    await self._settle(found)
                    continue
                if found is not None:  # a refusal's Channel.Close both ways
                    for made in found:  # type: ignore[union-attr]
                        (back if type(made) is Answer else up).append(made.raw)
                    pending = deque(self.conn.recheck(pending))
                    continue
            if type(event) is Message:
                out = self._offer(event)
                if out is not None and type(out) is not bytes and type(out) is not list:
                    out = await out  # type: ignore[misc]
                if out is None:
                    up.append(event.raw)
                elif isinstance(out, bytes):
                    rewritten += 1
                    up.append(out)
                else:  # refused: what followed on its channel is dropped, as after its Close
                    for made in out:
                        (back if type(made) is Answer else up).append(made.raw)
                    pending = deque(self.conn.recheck(pending))
                if rewritten >= FLUSH_EVERY:  # the broker starts on them while we go on
                    self._flush(up, back)
                    up, back, rewritten = [], [], 0
                    # and the broker's confirms of the ones before go back to the client,
                    # which sends more meanwhile, instead of waiting for the whole chunk.
                    await asyncio.sleep(0)
            elif type(event) is Answer:
                back.append(event.raw)
            else:
                up.append(event.raw)
        self._flush(up, back)
        await self.up.drain()

    def _flush(self, up: list[bytes], back: list[bytes]) -> None:
        assert self.up is not None
        if back:
            self.client_w.write(b"".join(back))
        if up:
            self.up.write(b"".join(up))

    async def _settle(self, failure: Failure) -> None:
        """A consumer's failure: the chain's replacement, carried out before anything else the
        client sent goes up. A broker that does not confirm the copies in time ends the link
        (the broker then has every unsettled delivery back)."""
        assert self.side is not None
        try:
            answer = await self.side.settle(failure)
        except TimeoutError:
            self.log.error("copies not confirmed in time: closing the upstream connection, "
                           "which gives the broker its deliveries back")
            raise _GiveUp from None
        if answer:
            self.client_w.write(answer)

    async def _settle_lost(self) -> None:
        assert self.side is not None
        try:
            await self.side.client_lost()
        except TimeoutError:
            self.log.error("copies of a lost client's deliveries not confirmed in time")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the upstream closes: the broker has them
            self.log.error("settling a lost client's deliveries failed", error=repr(exc))

    def _offer(self, message: Message
               ) -> bytes | list[Event] | None | Awaitable[bytes | list[Event] | None]:
        """The hook's answer for one publish: None to relay it as it came, bytes to send up
        instead, or the refusal's events; an awaitable of them when the hook waits (a held
        publish)."""
        hook = self.relay.hook
        if hook is None:
            return None
        try:
            result = hook(message, self.conn)
        except Refused as exc:
            return self._refused(message, exc)
        if result is None or type(result) is bytes:
            return result
        return self._awaited(message, result)  # type: ignore[arg-type]

    async def _awaited(self, message: Message,
                       result: Awaitable[bytes | None]) -> bytes | list[Event] | None:
        try:
            return await result
        except Refused as exc:
            return self._refused(message, exc)

    def _refused(self, message: Message, exc: Refused) -> list[Event]:
        self.log.info("publish refused", channel=message.channel, reason=exc.reason.name)
        self.relay.stats.refusals[exc.reason.name] += 1
        return self.conn.refuse(message.channel, str(exc))

    async def _broker_to_client(self) -> None:
        """Wait for the broker's end (its bytes are handled as they arrive, by
        ``_broker_data``); then the client has what was written for it, and the link closes."""
        assert self.up is not None
        await self.up.finished  # raises what handling the broker's bytes raised
        if self.side is not None:
            self.side.broker_lost("the broker closed the connection")
        if not self.client_gone:
            await self.client_w.drain()

    def _broker_data(self, data: bytes) -> None:
        """The broker's bytes, as they arrive: answers back up, the rest to the client. While
        the client's socket holds more than its high-water mark, the broker is not read."""
        up = self.up
        assert up is not None
        stats = self.relay.stats
        stats.bytes["downstream"] += len(data)
        events = self.conn.broker_data(data)
        self._count(events, stats.methods_down)
        down: list[bytes] = []
        back: list[bytes] = []
        side = self.side
        for event in events:
            if type(event) is Answer:
                back.append(event.raw)
            elif type(event) is Forward:
                continue
            elif side is not None:
                out = side.broker_event(event)
                if out is not None:
                    down.append(out)
            else:
                down.append(event.raw)
        if back:
            up.write(b"".join(back))
        if down and not self.client_gone:
            self.client_w.write(b"".join(down))
            if self.client_w.transport.get_write_buffer_size() > self._client_high:
                up.pause_reading()
                self._drained = asyncio.ensure_future(self._client_drained())

    async def _client_drained(self) -> None:
        """The broker read again once the client's socket has drained (or the client left)."""
        assert self.up is not None
        try:
            await self.client_w.drain()
        except OSError:
            self.client_gone = True
        self._drained = None
        self.up.resume_reading()

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

"""One AMQP client's link: its connection, the upstream connection opened for it, and what
``ProxyConnection`` makes of the bytes of each, carried out.

The link is a protocol object: one method per kind of event the connection gives, for each
direction (``client_frame``, ``client_message``, ... for the client's bytes; ``broker_frame``,
``broker_message``, ... for the broker's), found by the event's type in a table made once per
link. The client's bytes are read through a stream (``ClientReader``), since a publish may wait
on its hook; the broker's are handled as they arrive (``upstream.Upstream``).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter as Tally
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from bridge.frontends.amqp.assembler import Message
from bridge.frontends.amqp.connection import (
    Answer,
    DeliveryRun,
    Event,
    Forward,
    PlainRun,
    ProxyConnection,
    State,
)
from bridge.frontends.amqp.consumers import Failure
from bridge.frontends.amqp.errors import AmqpProtocolError
from bridge.frontends.amqp.exchanges import DECLARE, declare
from bridge.frontends.amqp.framer import FRAME_METHOD, Frame, ProtocolHeader
from bridge.frontends.amqp.reading import READ_SIZE, ClientReader, ReadBudget, protocol_header
from bridge.frontends.amqp.refusal import refuse
from bridge.frontends.amqp.settling import ConsumerSide
from bridge.frontends.amqp.tally import BASIC_PUBLISH, count
from bridge.frontends.amqp.translate import PublishScreen
from bridge.frontends.amqp.upstream import Upstream
from bridge.frontends.peers import tls_subject
from policies.errors import Refused

if TYPE_CHECKING:
    from bridge.frontends.budget import Budget
    from bridge.frontends.relay_stats import AmqpStats
    from bridge.intercept.chain import Chain

# The interception layer's hook: called with each whole client Basic.Publish and its
# connection (its frame_max for building replacement frames, and who the client is). It returns
# None to relay the original bytes, replacement bytes to send upstream instead, or raises
# Refused to close the channel with 406 PRECONDITION_FAILED whose reply text starts with the
# reason name. It may be async.
PublishHook = Callable[
    [Message, ProxyConnection], bytes | None | Awaitable[bytes | None]
]

# Rewritten publishes (staged copies) cost the relay far more than relayed ones: a chunk's are
# written up this many at a time, so the broker confirms the first while the rest are made, and
# the event loop is let run between them, so those confirms reach the client, which publishes
# more, while the chunk is still being worked through (delayed publishes with a window of 100
# confirms outstanding, faster with that turn: docs/benchmarks.md).
FLUSH_EVERY = 16
# How long a link whose client went away waits for the broker's Connection.Close-Ok.
CLOSE_TIMEOUT = 5.0
_ids = itertools.count(1)

# What a client-data event's method gives back: None when it is carried, or what the link
# waits for before the next event (a held publish, a consumer's failure being replaced).
Waits = Awaitable[None] | None
Offered = bytes | list[Event] | None


class Relay(Protocol):
    """What a link needs of the relay that accepted it (``server.AmqpRelay``)."""

    chain: Chain | None  # with a consumer side
    hook: PublishHook | None
    delayed_exchanges: bool
    max_body_size: int
    handshake_timeout: float
    settled: Callable[[float], Awaitable[str | None]]
    budget: Budget
    stats: AmqpStats
    protocol_errors: int
    log: Any

    async def connect(self, protocol: Callable[[], Upstream], reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter, log: Any) -> Upstream | None: ...


class _GiveUp(Exception):
    """The link cannot go on: close both sides."""


class Link:
    """One client connection and the upstream connection opened for it."""

    def __init__(
        self, relay: Relay, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
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
        self.side = side = (ConsumerSide(chain, self.conn, relay.stats, self.log)
                            if chain is not None else None)
        self.client_gone = False
        self.channels = 0  # open (Channel.Open-Ok seen, Close-Ok not yet)
        self.budget = ReadBudget(relay.budget, relay.stats)
        # While the link's task waits in a read (so nothing of the client's is in the stream's
        # buffer), a read that is only publishes to relay as they came is taken where it
        # arrives (``_take``); anything else is left to the task, and so is all that follows.
        self._taking = False
        if isinstance(reader, ClientReader):
            reader.take = self._take
        # The events of the client's bytes being carried (``_carry``): what goes up, what goes
        # back, those not yet carried, and the rewritten publishes not yet written.
        self._up_out: list[bytes] = []
        self._client_answers: list[bytes] = []
        self._pending: deque[Event] = deque()
        self._rewritten = 0
        # And of the broker's (``_broker_data``, which may run while the client's wait).
        self._down_out: list[bytes] = []
        self._broker_answers: list[bytes] = []
        self._close_ok: asyncio.Future[None] | None = None  # set at the broker's Close-Ok
        # The method for each kind of event, in each direction, bound once here: frames only go
        # through (as they came) when no consumer side and no exchange declare looks at them.
        looked_at = side is not None or relay.delayed_exchanges
        self._from_client: dict[type, Callable[[Any], Waits]] = {
            Frame: self.client_frame if looked_at else self.client_forward,
            Message: self.client_message,
            PlainRun: self.client_publishes,
            Answer: self.client_answer,
            Forward: self.client_forward,
            ProtocolHeader: self.client_forward,
        }
        self._from_broker: dict[type, Callable[[Any], None]] = {
            Frame: self.broker_as_is,
            Answer: self.broker_answer,
            Forward: self.broker_forward,
        }
        if side is not None:  # (the connection assembles messages and finds runs only then)
            self._consumers = side
            self._from_broker.update({Frame: self.broker_frame, Message: self.broker_message,
                                      DeliveryRun: self.broker_deliveries})

    # -- the link's life ------------------------------------------------------------------------
    async def run(self) -> None:
        relay = self.relay
        header = await protocol_header(self.client_r, self.client_w, relay.handshake_timeout,
                                       relay.stats, self.log)
        if header is None:
            self.client_w.close()
            return
        not_ready = await relay.settled(relay.handshake_timeout)
        if not_ready is not None:  # the staging queues not yet declared: a publish would be lost
            relay.stats.protocol_errors["broker-unreachable"] += 1
            await refuse(self.client_r, self.client_w, f"MQRC_HOST_NOT_AVAILABLE (2538): "
                         f"{not_ready}", header_read=True)
            return
        upstream = await relay.connect(lambda: Upstream(self._broker_data), self.client_r,
                                       self.client_w, self.log)
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
            relay.stats.channels_open -= self.channels
            self.channels = 0
            self.budget.forget()
            self.client_w.close()
            if self.up is not None:
                self.up.close()

    def _count(self, events: list[Event], tally: Tally[int]) -> None:
        self.channels = count(events, tally, self.relay.stats, self.conn.own_channel,
                              self.channels)

    # -- client -> broker -----------------------------------------------------------------------
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
        if self.budget.account(self.conn.client_buffered):
            self._taking = False  # the task waits for the budget once it has read again
        return True

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
                await self._close_upstream()
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
            if self.budget.account(self.conn.client_buffered):
                await self.budget.wait()

    async def _carry(self, events: list[Event]) -> None:
        """Write client-data events out, each by its method: frames and messages upstream,
        answers to the client."""
        assert self.up is not None
        self._up_out, self._client_answers, self._rewritten = [], [], 0
        self._pending = pending = deque(events)
        on = self._from_client
        while pending:
            event = pending.popleft()
            waits = on[type(event)](event)
            if waits is not None:
                await waits
        self._flush()
        await self.up.drain()

    def client_publishes(self, run: PlainRun) -> Waits:
        """Publishes nobody needs to see: up as they came."""
        self._up_out.append(run.raw)
        return None

    def client_answer(self, answer: Answer) -> Waits:
        self._client_answers.append(answer.raw)
        return None

    def client_forward(self, event: Forward | ProtocolHeader) -> Waits:
        self._up_out.append(event.raw)
        return None

    def client_frame(self, frame: Frame) -> Waits:
        """A frame up as it came, unless the bridge declares its exchange or the consumer
        side keeps it back, refuses it, or replaces the deliveries it fails first."""
        if (self.relay.delayed_exchanges and frame.type == FRAME_METHOD
                and frame.method_index == DECLARE):
            self._declare(frame)
            return None
        side = self.side
        if side is not None:
            found = side.client_frame(frame)
            if found is not None:
                if isinstance(found, Failure):
                    self._flush()
                    return self._settle(found)
                if isinstance(found, list):  # a refusal's Channel.Close both ways
                    self._refusal(found)
                return None  # or DROP
        self._up_out.append(frame.raw)
        return None

    def _declare(self, frame: Frame) -> None:
        try:
            instead = declare(frame)
        except Refused as exc:
            self.relay.stats.refusals[exc.reason.name] += 1
            self.log.info("exchange declare refused", channel=frame.channel,
                          reason=exc.reason.name)
            self._refusal(self.conn.refuse(frame.channel, str(exc), class_id=DECLARE >> 16,
                                           method_id=DECLARE & 0xFFFF))
            return
        self._up_out.append(frame.raw if instead is None else instead)

    def _refusal(self, events: list[Event]) -> None:
        """A refusal's Channel.Close both ways (carried as any other events); what followed on
        its channel is dropped, as after its Close."""
        on = self._from_client
        for made in events:
            on[type(made)](made)
        pending = self._pending
        rest = self.conn.recheck(pending)
        pending.clear()
        pending.extend(rest)

    def client_message(self, message: Message) -> Waits:
        """A publish, with the hook's answer: as it came, bytes to send up instead, or a
        refusal; waited for when the hook waits (a held publish)."""
        hook = self.relay.hook
        try:
            result = None if hook is None else hook(message, self.conn)
        except Refused as exc:
            return self._offered(message, self._refused(message, exc))
        if result is None:  # as it came (nothing rewritten: nothing to flush)
            self._up_out.append(message.raw)
            return None
        if isinstance(result, bytes):
            return self._offered(message, result)
        return self._held(message, result)

    async def _held(self, message: Message, result: Awaitable[bytes | None]) -> None:
        out: Offered
        try:
            out = await result
        except Refused as exc:
            out = self._refused(message, exc)
        waits = self._offered(message, out)
        if waits is not None:
            await waits

    def _refused(self, message: Message, exc: Refused) -> list[Event]:
        self.log.info("publish refused", channel=message.channel, reason=exc.reason.name)
        self.relay.stats.refusals[exc.reason.name] += 1
        return self.conn.refuse(message.channel, str(exc))

    def _offered(self, message: Message, out: Offered) -> Waits:
        if out is None:
            self._up_out.append(message.raw)
        elif isinstance(out, bytes):
            self._rewritten += 1
            self._up_out.append(out)
        else:
            self._refusal(out)
        if self._rewritten >= FLUSH_EVERY:  # the broker starts on them while we go on
            self._flush()
            self._rewritten = 0
            # and the broker's confirms of the ones before go back to the client, which
            # sends more meanwhile, instead of waiting for the whole chunk.
            return asyncio.sleep(0)
        return None

    def _flush(self) -> None:
        assert self.up is not None
        if self._client_answers:
            self.client_w.write(b"".join(self._client_answers))
            self._client_answers = []
        if self._up_out:
            self.up.write(b"".join(self._up_out))
            self._up_out = []

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

    async def _close_upstream(self) -> None:
        """Close the upstream connection of a client that went away as a client closes one,
        and wait for the broker's Close-Ok: the broker then has applied everything sent before
        (the acknowledgements of replaced deliveries among it). On a socket that just closes,
        RabbitMQ stops a channel ahead of the frames it has not worked through yet, and would
        deliver a replaced original again beside its copy."""
        up = self.up
        close = self.conn.close_upstream("the client went away")
        if up is None or close is None:
            return
        self._close_ok = asyncio.get_running_loop().create_future()
        up.write(close)
        done, _ = await asyncio.wait({self._close_ok, up.finished}, timeout=CLOSE_TIMEOUT,
                                     return_when=asyncio.FIRST_COMPLETED)
        if not done:
            self.log.warning("no Close-Ok from the broker in time: closing the connection",
                             timeout_s=CLOSE_TIMEOUT)

    # -- broker -> client -----------------------------------------------------------------------
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
        self._down_out = down = list[bytes]()
        self._broker_answers = back = list[bytes]()
        on = self._from_broker
        for event in events:
            on[type(event)](event)
        if back:
            up.write(b"".join(back))
        if self._close_ok is not None and self.conn.state is State.CLOSED:
            if not self._close_ok.done():
                self._close_ok.set_result(None)
        if down and not self.client_gone:
            self.client_w.write(b"".join(down))
            if self.client_w.transport.get_write_buffer_size() > self._client_high:
                up.pause_reading()
                self._drained = asyncio.ensure_future(self._client_drained())

    def broker_as_is(self, event: Frame) -> None:
        """To the client as it came (with no consumer side)."""
        self._down_out.append(event.raw)

    def broker_frame(self, frame: Frame) -> None:
        out = self._consumers.broker_frame(frame)
        if out is not None:
            self._down_out.append(out)

    def broker_message(self, message: Message) -> None:
        out = self._consumers.broker_message(message)
        if out is not None:
            self._down_out.append(out)

    def broker_deliveries(self, run: DeliveryRun) -> None:
        self._down_out.append(self._consumers.broker_run(run))

    def broker_answer(self, answer: Answer) -> None:
        self._broker_answers.append(answer.raw)

    def broker_forward(self, forward: Forward) -> None:
        """Dropped: not the broker's bytes to relay (the connection makes none for them)."""

    async def _client_drained(self) -> None:
        """The broker read again once the client's socket has drained (or the client left)."""
        assert self.up is not None
        try:
            await self.client_w.drain()
        except OSError:
            self.client_gone = True
        self._drained = None
        self.up.resume_reading()

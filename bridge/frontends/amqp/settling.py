"""The consumer side of the AMQP front-end: deliveries stamped and tracked, failures offered to
the interception chain, and its ``Replace`` decisions carried out on the client's own upstream
connection.

The STOMP front-end's design, in AMQP's terms: every Basic.Deliver and Basic.GetOk is offered
as a ``Delivery`` view and relayed with the chain's ``Stamp`` (``JMSXDeliveryCount``) in its
header table; a failure (``consumers``) is offered as a ``Settle`` view. For a ``Replace`` the
client's frames are held (the relay reads nothing more from it), each copy is published on the
bridge's own channel and confirmed by the broker (``copies``), and only then are the originals
acknowledged upstream on the client's channel, followed by what the client sent (its Commit,
Recover or Close). A copy the broker does not take leaves its original to the broker: it is
nacked with requeue, never acknowledged. Delivery tags stay the client's: no delivery is added
to or hidden from a channel.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Final

import structlog
from pamqp import commands
from pamqp import frame as pframe

from adapters.amqp_tables import wire_keys
from bridge.frontends.amqp.assembler import DELIVER, GET_OK, Message
from bridge.frontends.amqp.connection import DeliveryRun, Event, ProxyConnection
from bridge.frontends.amqp.consumers import (
    BROKER_METHODS,
    CLIENT_METHODS,
    CONSUME,
    DROP,
    GET,
    TX_COMMIT,
    TX_ROLLBACK,
    Consumers,
    Drop,
    Failure,
)
from bridge.frontends.amqp.copies import CopyChannel, CopyFailed
from bridge.frontends.amqp.deliveries import delivery_fields, delivery_view, stamped
from bridge.frontends.amqp.errors import ReplyCode
from bridge.frontends.amqp.framer import FRAME_METHOD, Frame
from bridge.frontends.amqp.stamping import Stamper
from bridge.frontends.relay_stats import RelayStats
from bridge.intercept.chain import Chain
from bridge.intercept.decisions import RELAY, Hold, Refuse, Replace, Stamp
from bridge.intercept.views import Principal, Subscribe

# How long a replacement may take (copies confirmed) before the link gives up and closes the
# upstream connection, which gives every unsettled original back to the broker.
REPLACE_TIMEOUT: Final = 30.0


def _method(channel: int, method: Any) -> bytes:
    return bytes(pframe.marshal(method, channel))


class ConsumerSide:
    """The chain's view of one link's consumers."""

    def __init__(self, chain: Chain, conn: ProxyConnection, stats: RelayStats,
                 log: Any = None) -> None:
        self.chain = chain
        self.conn = conn
        self.stats = stats
        self.log = log or structlog.get_logger("amqp")
        interest = chain.interest
        self.stamps = interest.deliveries
        self.guards = interest.subscribes
        self.settles = interest.settlements
        self.consumers = Consumers()
        conn.on_refused = self.consumers.drop  # the broker takes the channel's deliveries back
        # Deliveries not redelivered and carrying none of the headers the chain names get
        # its one decision for them, found once; the connection gives them as a DeliveryRun.
        self._plain_stamp: Stamper | None = None
        plain = chain.plain_delivery() if self.stamps else RELAY
        if isinstance(plain, Stamp):
            self._plain_stamp = Stamper(plain.headers)
        if plain is RELAY or isinstance(plain, Stamp):
            conn.delivery_needles = wire_keys(interest.delivery_headers)
        self.copies: CopyChannel | None = None
        self._write: Callable[[bytes], None] | None = None

    def attach(self, write_up: Callable[[bytes], None]) -> None:
        """The upstream connection is open: ``write_up`` sends bytes to the broker."""
        self._write = write_up

    @property
    def principal(self) -> Principal:
        return self.conn.principal

    # -- client -> broker ---------------------------------------------------------------------
    def client_frame(self, frame: Frame) -> Failure | Drop | list[Event] | None:
        """A client method frame: None relays it, ``DROP`` keeps it back, a list holds the
        events of a refusal (Basic.Consume or Basic.Get on a staging queue), a ``Failure``
        is for ``settle``."""
        if frame.type != FRAME_METHOD:
            return None
        index = frame.method_index
        if index not in CLIENT_METHODS:
            return None
        if self.guards and (index == CONSUME or index == GET):
            refused = self._guard(frame)
            if refused is not None:
                return refused
        if not self.settles:
            return None
        found = self.consumers.client_frame(frame, self.principal)
        if found is None and (index == TX_COMMIT or index == TX_ROLLBACK):
            self.consumers.tx_sent(frame.channel, own=False)
        return found

    def _guard(self, frame: Frame) -> list[Event] | None:
        method: Any = frame.method
        queue = self.consumers.queue_of(frame.channel, method)
        decision = self.chain.on_subscribe(Subscribe("/amq/queue/" + queue, self.principal))
        if not isinstance(decision, Refuse):
            return None
        refusal = decision.refusal
        self.stats.refusals[refusal.reason.name] += 1
        self.log.info("consume refused", channel=frame.channel, queue=queue,
                      reason=refusal.reason.name)
        return self.conn.refuse(frame.channel, str(refusal), reply_code=ReplyCode.ACCESS_REFUSED,
                                class_id=frame.method_index >> 16,
                                method_id=frame.method_index & 0xFFFF)

    async def settle(self, failure: Failure) -> bytes:
        """Offer a failure to the chain and carry out its decision (awaited: the client's
        later frames wait); returns what goes to the client then. TimeoutError when the
        broker did not confirm in time."""
        decision = self.chain.on_settle(failure.settle)
        while isinstance(decision, Hold):  # a look at the broker first (a queue's arguments)
            await decision.check()
            decision = self.chain.on_settle(failure.settle)
        if isinstance(decision, Replace) and self.conn.own_channel is None:
            # A broker that allows one channel leaves none for the copies: the broker's own
            # redelivery applies, as without the bridge.
            self.log.warning("no channel of its own on this connection: the broker redelivers")
            decision = RELAY
        if not isinstance(decision, Replace):
            self.consumers.not_replaced(failure)
            self._send(failure.relay)
            self._client_tx(failure.relay)
            return b""
        await asyncio.wait_for(self._replace(failure, decision), REPLACE_TIMEOUT)
        return failure.answer

    async def _replace(self, failure: Failure, decision: Replace) -> None:
        write = self._send
        if failure.before:
            write(failure.before)
            self._client_tx(failure.before)
        for on, consumer in failure.cancel:
            write(_method(on, commands.Basic.Cancel(consumer_tag=consumer, nowait=True)))
        for channel in sorted(failure.rollback):  # the client's uncommitted work is undone
            write(_method(channel, commands.Tx.Rollback()))
            self.consumers.tx_sent(channel, own=True)
        settled: dict[int, list[bytes]] = {}
        for copy in decision.copies:
            taken = self.consumers.take(copy.ack_id)
            if taken is None:
                continue
            channel, tag, message = taken
            ok = True
            if copy.destination is not None:
                ok = await self._put(copy.destination, dict(copy.headers), message)
            frame = (commands.Basic.Ack(delivery_tag=tag) if ok else
                     commands.Basic.Nack(delivery_tag=tag, requeue=True))
            settled.setdefault(channel, []).append(_method(channel, frame))
        then_commits = failure.then and _is_commit(failure.then)
        for channel, frames in settled.items():
            write(b"".join(frames))
            if channel in failure.commit and not then_commits:
                write(_method(channel, commands.Tx.Commit()))
                self.consumers.tx_sent(channel, own=True)
        if failure.then:
            write(failure.then)
            self._client_tx(failure.then)

    async def _put(self, destination: str, headers: dict[str, str], message: Message) -> bool:
        copies = self.copies
        if copies is None:
            own = self.conn.own_channel
            assert own is not None
            copies = self.copies = CopyChannel(own, self._send, lambda: self.conn.frame_max)
        try:
            await copies.put(destination, headers, message.body)
        except CopyFailed as exc:
            self.log.warning("copy refused: the delivery goes back to the broker",
                             destination=destination, error=str(exc))
            return False
        return True

    def _send(self, data: bytes) -> None:
        assert self._write is not None
        if data:
            self._write(data)

    def _client_tx(self, data: bytes) -> None:
        """Note the client's Tx.Commit and Tx.Rollback among frames sent up."""
        pos = 0
        while pos + 11 <= len(data):
            if data[pos] == FRAME_METHOD:
                index = int.from_bytes(data[pos + 7:pos + 11], "big")
                if index == TX_COMMIT or index == TX_ROLLBACK:
                    self.consumers.tx_sent(int.from_bytes(data[pos + 1:pos + 3], "big"),
                                           own=False)
            pos += 8 + int.from_bytes(data[pos + 3:pos + 7], "big")

    async def client_lost(self) -> None:
        """The client went away: its unsettled deliveries are failures; returns when they are
        replaced (the upstream connection may close then)."""
        if not self.settles or self._write is None:
            return
        failure = self.consumers.lost(self.principal)
        if failure is not None:
            await self.settle(failure)

    # -- broker -> client ---------------------------------------------------------------------
    def broker_event(self, event: Event) -> bytes | None:
        """What goes to the client for one broker event (None: nothing); the bridge's channel
        and the answers to its own frames stay here."""
        if type(event) is DeliveryRun:
            return self.broker_run(event)
        if type(event) is Message:
            return self.broker_message(event)
        if type(event) is Frame:
            return self.broker_frame(event)
        return event.raw

    def broker_message(self, message: Message) -> bytes | None:
        if message.channel == self.conn.own_channel:
            self._own(message)
            return None
        index = message.method_frame.method_index
        if index == DELIVER or index == GET_OK:
            return self._delivered(message)
        return message.raw

    def broker_frame(self, frame: Frame) -> bytes | None:
        own = self.conn.own_channel
        if frame.channel == own and own is not None:
            self._own(frame)
            return None
        if frame.type == FRAME_METHOD and frame.method_index in BROKER_METHODS:
            if not self.consumers.broker_frame(frame):
                return None
        return frame.raw

    def _own(self, event: Frame | Message) -> None:
        copies = self.copies
        if copies is None:
            return
        answer = copies.receive(event)
        if answer is not None:
            self._send(answer)

    def _delivered(self, message: Message) -> bytes:
        if self.settles:
            view = self.consumers.delivered(message)
        elif self.stamps:
            tag, redelivered = delivery_fields(message)
            view = delivery_view(message, message.channel, "", tag, redelivered)
        else:
            return message.raw
        decision = self.chain.on_delivery(view) if self.stamps else None
        if isinstance(decision, Stamp):
            return stamped(message, decision.headers)
        return message.raw

    def broker_run(self, run: DeliveryRun) -> bytes:
        """A run of plain deliveries and confirms: each delivery remembered (when it must be
        settled) and stamped with the chain's decision for plain deliveries, the rest of its
        bytes as they came."""
        raw = run.raw
        if self.settles:
            self.consumers.delivered_run(raw, run.deliveries)
        stamp = self._plain_stamp
        if stamp is None:
            return raw
        return stamp.run(raw, run.deliveries)

    def broker_lost(self, why: str) -> None:
        if self.copies is not None:
            self.copies.lost(why)


def _is_commit(data: bytes) -> bool:
    return len(data) >= 11 and data[0] == FRAME_METHOD and int.from_bytes(
        data[7:11], "big") == TX_COMMIT


__all__ = ["DROP", "ConsumerSide", "REPLACE_TIMEOUT"]

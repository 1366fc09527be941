"""What each channel of an AMQP connection was handed and has not settled, so that a consumer's
failures can be offered to the interception core as ``Settle`` views (sans I/O).

A failure is, as for STOMP:

- Basic.Nack or Basic.Reject with requeue (``NACK``); with ``multiple``, every delivery of the
  channel up to the tag. Without requeue they are the broker's own business (its
  dead-lettering) and go up as sent;
- Basic.Recover: every delivery of the channel not yet acknowledged (``NACK``);
- Tx.Rollback of a transaction that acknowledged or rejected deliveries (``ROLLBACK``);
- Channel.Close, Connection.Close or a lost client with deliveries unsettled (``LOST``).

In a transaction (``tx.select``), an Ack or a Reject without requeue goes up at once (the broker
applies it on commit); a Nack or Reject with requeue is kept back and becomes a failure on
Tx.Commit, so that the commit is what settles it. Basic.Ack is never offered as a view: no
interceptor asks what succeeded, and acks are the hot path.

Deliveries are never hidden from or added to a channel: a ``Failure`` says what the client sent
(``relay``, when no interceptor replaces anything) and what must follow once the broker has
confirmed every copy (``then``); the glue acknowledges the originals upstream in between.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from pamqp import commands
from pamqp import frame as pframe

from bridge.frontends.amqp.assembler import DELIVER, Message, whole_message
from bridge.frontends.amqp.deliveries import delivery_view
from bridge.frontends.amqp.fastpath import Found
from bridge.frontends.amqp.framer import Frame
from bridge.intercept.views import Delivery, Principal, Settle, Settlement

_B = commands.Basic
ACK: Final = _B.Ack.index
NACK: Final = _B.Nack.index
REJECT: Final = _B.Reject.index
RECOVER: Final = _B.Recover.index
RECOVER_ASYNC: Final = _B.RecoverAsync.index
CONSUME: Final = _B.Consume.index
CONSUME_OK: Final = _B.ConsumeOk.index
CANCEL: Final = _B.Cancel.index
CANCEL_OK: Final = _B.CancelOk.index
GET: Final = _B.Get.index
GET_EMPTY: Final = _B.GetEmpty.index
TX_SELECT: Final = commands.Tx.Select.index
TX_COMMIT: Final = commands.Tx.Commit.index
TX_ROLLBACK: Final = commands.Tx.Rollback.index
TX_COMMIT_OK: Final = commands.Tx.CommitOk.index
TX_ROLLBACK_OK: Final = commands.Tx.RollbackOk.index
DECLARE_OK: Final = commands.Queue.DeclareOk.index
CHANNEL_CLOSE: Final = commands.Channel.Close.index
CHANNEL_CLOSE_OK: Final = commands.Channel.CloseOk.index
CONNECTION_CLOSE: Final = commands.Connection.Close.index

# Client methods the tracker reads, and broker methods it reads.
CLIENT_METHODS: Final = frozenset({
    ACK, NACK, REJECT, RECOVER, RECOVER_ASYNC, CONSUME, GET, TX_SELECT, TX_COMMIT,
    TX_ROLLBACK, CHANNEL_CLOSE, CONNECTION_CLOSE,
})
BROKER_METHODS: Final = frozenset({
    CONSUME_OK, CANCEL, CANCEL_OK, GET_EMPTY, DECLARE_OK, TX_COMMIT_OK, TX_ROLLBACK_OK,
    CHANNEL_CLOSE, CHANNEL_CLOSE_OK,
})
_LONGLONG = struct.Struct(">Q")
_DELIVER_BYTES = DELIVER.to_bytes(4, "big")


class Drop:
    """The client's frame is kept back (a requeue inside a transaction, until it commits)."""

    __slots__ = ()


DROP: Final = Drop()


class Held:
    """An unsettled delivery: its view and its message. One taken by the fast path
    (``delivered_run``) is kept as its bytes, and its view and message made only when a
    failure asks for them: most deliveries are acknowledged and never need either."""

    __slots__ = ("_view", "_message", "_raw", "_channel", "_queue", "_tag", "_subscription")

    def __init__(self, view: Delivery | None, message: Message | None, raw: bytes = b"",
                 channel: int = 0, queue: str = "", tag: int = 0, subscription: str = "") -> None:
        self._view = view
        self._message = message
        self._raw = raw
        self._channel = channel
        self._queue = queue
        self._tag = tag
        self._subscription = subscription

    @property
    def message(self) -> Message:
        if self._message is None:
            self._message = whole_message(self._raw)
        return self._message

    @property
    def view(self) -> Delivery:
        if self._view is None:  # the fast path takes only deliveries not redelivered
            self._view = delivery_view(self.message, self._channel, self._queue, self._tag,
                                       False, self._subscription)
        return self._view


@dataclass(slots=True)
class Failure:
    """Deliveries a client failed, and the client's frames around their settlement."""

    settle: Settle
    relay: bytes  # what goes up when nothing replaces them: the client's frames as sent
    before: bytes = b""  # goes up before the copies (a Tx.Rollback: undoes the acks first)
    then: bytes = b""  # goes up after the originals are settled (Commit, Recover, a Close)
    # Channels in a transaction where the bridge's acknowledgements need a commit of their
    # own, and those to roll back first (the client's uncommitted work must not be committed).
    commit: set[int] = field(default_factory=set)
    rollback: set[int] = field(default_factory=set)
    # Consumers to cancel first (channel, consumer tag): a lost client's consumers, so that the
    # copies are not handed to them again on the way out.
    cancel: list[tuple[int, str]] = field(default_factory=list)
    # What the client gets when the failure is replaced (a Basic.Recover's Recover-Ok: the
    # Recover itself never goes up, it would take back the copies just delivered).
    answer: bytes = b""


class _Channel:
    __slots__ = ("consumers", "consuming", "getting", "last_queue", "unacked", "tx",
                 "tx_done", "tx_failed", "tx_held", "tx_replies")

    def __init__(self) -> None:
        self.consumers: dict[str, tuple[str, bool]] = {}  # consumer tag -> (queue, no_ack)
        self.consuming: deque[tuple[str, bool]] = deque()  # Consume sent, Consume-Ok not yet
        self.getting: deque[tuple[str, bool]] = deque()  # Get sent, no answer yet
        self.last_queue = ""  # what an empty queue name means on this channel
        # delivery tag -> the delivery, in delivery order
        self.unacked: dict[int, Held] = {}
        self.tx = False
        self.tx_done: list[int] = []  # acked or rejected in the open transaction
        self.tx_failed: list[int] = []  # nacked with requeue in the open transaction
        self.tx_held: list[bytes] = []  # the client's frames for tx_failed, kept back
        self.tx_replies: deque[bool] = deque()  # Commit/Rollback sent: True when the bridge's


class Consumers:
    """The unsettled deliveries of one connection, per channel."""

    def __init__(self) -> None:
        self._channels: dict[int, _Channel] = {}

    def _chan(self, channel: int) -> _Channel:
        chan = self._channels.get(channel)
        if chan is None:
            chan = self._channels[channel] = _Channel()
        return chan

    def unsettled(self) -> int:
        return sum(len(c.unacked) for c in self._channels.values())

    # -- client -> broker ---------------------------------------------------------------------
    def queue_of(self, channel: int, method: Any) -> str:
        """The queue a Basic.Consume or Basic.Get names (an empty name: the channel's last
        declared queue)."""
        return str(method.queue or self._chan(channel).last_queue)

    def client_frame(self, frame: Frame, principal: Principal) -> Failure | Drop | None:
        """What a client method on a channel means for its deliveries: None to relay it,
        ``DROP`` to keep it back, or a ``Failure`` to offer to the chain."""
        index = frame.method_index
        channel = frame.channel
        raw = frame.raw
        if index == ACK:
            tag, multiple = _LONGLONG.unpack_from(raw, 11)[0], bool(raw[19] & 1)
            chan = self._chan(channel)
            if chan.tx:
                chan.tx_done += [d for d in _covered(chan, tag, multiple)]
            else:
                for t in list(_covered(chan, tag, multiple)):
                    del chan.unacked[t]
            return None
        if index == NACK or index == REJECT:
            tag = _LONGLONG.unpack_from(raw, 11)[0]
            bits = raw[19]
            multiple = bool(bits & 1) if index == NACK else False
            requeue = bool(bits & 2) if index == NACK else bool(bits & 1)
            return self._failed(channel, tag, multiple, requeue, raw, principal)
        if index == RECOVER or index == RECOVER_ASYNC:
            chan = self._chan(channel)
            if chan.tx or not chan.unacked:
                chan.unacked.clear()  # the broker hands them all out again
                return None
            deliveries = tuple(held.view for held in chan.unacked.values())
            answer = (pframe.marshal(_B.RecoverOk(), channel) if index == RECOVER else b"")
            return Failure(Settle(Settlement.NACK, deliveries, None, principal), relay=raw,
                           answer=answer)
        if index == CONSUME:
            method: Any = frame.method
            queue = self.queue_of(channel, method)
            chan = self._chan(channel)
            if method.nowait:
                chan.consumers[method.consumer_tag] = (queue, bool(method.no_ack))
            else:
                chan.consuming.append((queue, bool(method.no_ack)))
            return None
        if index == GET:
            method = frame.method
            self._chan(channel).getting.append((self.queue_of(channel, method),
                                                bool(method.no_ack)))
            return None
        if index == TX_SELECT:
            self._chan(channel).tx = True
            return None
        if index == TX_COMMIT:
            return self._commit(channel, raw, principal)
        if index == TX_ROLLBACK:
            return self._rollback(channel, raw, principal)
        if index == CHANNEL_CLOSE:
            return self._lost([channel], principal, raw)
        if index == CONNECTION_CLOSE:
            return self._lost(list(self._channels), principal, raw)
        return None

    def _failed(self, channel: int, tag: int, multiple: bool, requeue: bool, raw: bytes,
                principal: Principal) -> Failure | Drop | None:
        chan = self._chan(channel)
        covered = list(_covered(chan, tag, multiple))
        if chan.tx:
            if requeue and covered:
                chan.tx_failed += covered
                chan.tx_held.append(raw)
                return DROP
            chan.tx_done += covered
            return None
        if not requeue or not covered:
            for t in covered:  # the broker's own dead-lettering, or its own error
                del chan.unacked[t]
            return None
        deliveries = tuple(chan.unacked[t].view for t in covered)
        return Failure(Settle(Settlement.NACK, deliveries, None, principal), relay=raw)

    def _commit(self, channel: int, raw: bytes, principal: Principal) -> Failure | None:
        chan = self._chan(channel)
        for t in chan.tx_done:
            chan.unacked.pop(t, None)
        failed = [t for t in chan.tx_failed if t in chan.unacked]
        held = b"".join(chan.tx_held)
        chan.tx_done, chan.tx_failed, chan.tx_held = [], [], []
        if not failed:
            return None
        deliveries = tuple(chan.unacked[t].view for t in failed)
        return Failure(Settle(Settlement.NACK, deliveries, str(channel), principal),
                       relay=held + raw, then=raw)

    def _rollback(self, channel: int, raw: bytes, principal: Principal) -> Failure | None:
        chan = self._chan(channel)
        settled = [t for t in dict.fromkeys(chan.tx_done + chan.tx_failed) if t in chan.unacked]
        chan.tx_done, chan.tx_failed, chan.tx_held = [], [], []
        if not settled:
            return None
        deliveries = tuple(chan.unacked[t].view for t in settled)
        return Failure(Settle(Settlement.ROLLBACK, deliveries, str(channel), principal),
                       relay=raw, before=raw, commit={channel})

    def _lost(self, channels: list[int], principal: Principal, raw: bytes) -> Failure | None:
        deliveries: list[Delivery] = []
        commit: set[int] = set()
        cancel: list[tuple[int, str]] = []
        for channel in channels:
            chan = self._channels.get(channel)
            if chan is None or not chan.unacked:
                continue
            deliveries += [held.view for held in chan.unacked.values()]
            cancel += [(channel, tag) for tag in chan.consumers]
            chan.tx_done, chan.tx_failed, chan.tx_held = [], [], []
            if chan.tx:
                commit.add(channel)
        if not deliveries:
            return None
        return Failure(Settle(Settlement.LOST, tuple(deliveries), None, principal), relay=raw,
                       then=raw, commit=commit, rollback=set(commit), cancel=cancel)

    def lost(self, principal: Principal) -> Failure | None:
        """The client went away without closing: everything unsettled is lost."""
        return self._lost(list(self._channels), principal, b"")

    def not_replaced(self, failure: Failure) -> None:
        """Nothing replaced the failed deliveries: what was nacked is the broker's again."""
        if failure.settle.outcome is Settlement.NACK:
            self.forget(failure.settle.deliveries)

    def take(self, ack_id: str) -> tuple[int, int, Message] | None:
        """(channel, delivery tag, message) of the unsettled delivery ``ack_id``, forgotten: a
        copy replaces it."""
        channel, _, tag = ack_id.partition("/")
        chan = self._channels.get(int(channel))
        if chan is None:
            return None
        entry = chan.unacked.pop(int(tag), None)
        return None if entry is None else (int(channel), int(tag), entry.message)

    def forget(self, deliveries: tuple[Delivery, ...]) -> None:
        for d in deliveries:
            self.take(d.ack_id)

    def drop(self, channel: int) -> None:
        """The channel is closed: the broker has its unacknowledged deliveries back."""
        self._channels.pop(channel, None)

    def tx_sent(self, channel: int, own: bool) -> None:
        """A Tx.Commit or Tx.Rollback went up on ``channel``; ``own``: the bridge's."""
        self._chan(channel).tx_replies.append(own)

    # -- broker -> client ---------------------------------------------------------------------
    def delivered(self, message: Message) -> Delivery:
        """The view of a Basic.Deliver or Basic.GetOk, remembered when it must be settled (one
        the tracker cannot place, with no Consume or Get seen for it, is not)."""
        channel = message.channel
        chan = self._channels.get(channel) or self._chan(channel)
        found: tuple[str, bool] | None = None
        raw = message.method_frame.raw
        subscription = ""
        if raw[7:11] == _DELIVER_BYTES:
            subscription = raw[12:12 + raw[11]].decode("utf-8", "replace")
            found = chan.consumers.get(subscription)
            pos = 12 + raw[11]
        else:
            if chan.getting:
                found = chan.getting.popleft()
            pos = 11
        tag = _LONGLONG.unpack_from(raw, pos)[0]
        queue, no_ack = found if found is not None else ("", True)
        view = delivery_view(message, channel, queue, tag, bool(raw[pos + 8] & 1), subscription)
        if not no_ack:
            chan.unacked[tag] = Held(view, message)
        return view

    def delivered_run(self, raw: bytes, deliveries: list[Found]) -> None:
        """``delivered`` for the deliveries of a ``DeliveryRun`` (each a Basic.Deliver not
        redelivered, found in ``raw``): each remembered, as its bytes, when it must be settled.
        (Its consumer is looked up once for the deliveries in a row that share it: most of a
        run's do.)"""
        channels = self._channels
        last_channel, last_consumer = -1, b""
        unacked: dict[int, Held] | None = None
        queue = subscription = ""
        for start, _, _, end, channel, consumer, tag in deliveries:
            if channel != last_channel or consumer != last_consumer:
                last_channel, last_consumer, unacked = channel, consumer, None
                chan = channels.get(channel)
                if chan is not None:  # (none: no Consume seen on it, nothing to place it by)
                    subscription = consumer.decode("utf-8", "replace")
                    found = chan.consumers.get(subscription)
                    if found is not None and not found[1]:
                        unacked, queue = chan.unacked, found[0]
            if unacked is not None:
                unacked[tag] = Held(None, None, raw[start:end], channel, queue, tag,
                                    subscription)

    def broker_frame(self, frame: Frame) -> bool:
        """Note a broker method; False when the client must not see it (the answer to the
        bridge's own Tx.Commit or Tx.Rollback)."""
        index = frame.method_index
        channel = frame.channel
        method: Any = frame.method
        if index == CONSUME_OK:
            chan = self._chan(channel)
            if chan.consuming:
                chan.consumers[method.consumer_tag] = chan.consuming.popleft()
        elif index == GET_EMPTY:
            chan = self._chan(channel)
            if chan.getting:
                chan.getting.popleft()
        elif index == DECLARE_OK:
            self._chan(channel).last_queue = str(method.queue)
        elif index == CANCEL or index == CANCEL_OK:
            self._chan(channel).consumers.pop(method.consumer_tag, None)
        elif index == TX_COMMIT_OK or index == TX_ROLLBACK_OK:
            chan = self._chan(channel)
            if chan.tx_replies and chan.tx_replies.popleft():
                return False
        elif index == CHANNEL_CLOSE or index == CHANNEL_CLOSE_OK:
            self.drop(channel)
        return True


def _covered(chan: _Channel, tag: int, multiple: bool) -> Iterator[int]:
    """The delivery tags one Ack, Nack or Reject settles: with ``multiple`` every unsettled one
    up to ``tag`` (all of them for tag 0), else just ``tag``."""
    if not multiple:
        if tag in chan.unacked:
            yield tag
        return
    for t in chan.unacked:
        if tag and t > tag:
            return
        yield t

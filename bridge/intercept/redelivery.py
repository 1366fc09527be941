"""Redelivery policies on the consumer side: what becomes of a delivery a consumer failed.

A NACK, the rollback of a transaction that settled deliveries, or a connection lost with
deliveries unsettled: for each such delivery from a queue, the destination's policy
(``policies.redelivery``) decides by its delivery count. The answer is a ``Replace``: a copy of
the message goes where the policy says (back to its queue at once, through the staging queues
after a delay, to a dead-letter destination, to the undelivered queue) or nowhere (deleted),
and the original is acknowledged upstream only after the broker confirmed the copy.

The delivery count travels with the message: every copy carries ``jms-bridge-delivery-count``
(the deliveries before it), and every delivery the consumer gets is stamped with
``JMSXDeliveryCount``. Where the broker redelivered on its own (the bridge went away holding
the upstream connection), its signals are added: RabbitMQ quorum queues' ``x-delivery-count``,
else the ``redelivered`` flag as one more.

A queue that declares its own schedule (RabbitMQ 4.3 / LavinMQ ``x-delayed-retry-*``
arguments, ``policies.redelivery.queue_args``) gets it from ``queue_policies``, over any
configured pattern: the application declared it for that very queue. A queue whose arguments
were never read holds the failure (``Hold``) while they are.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Final, Protocol

from adapters.base import PER_DELIVERY, StagedFormat
from bridge.intercept.chain import Interceptor, Interest
from bridge.intercept.clock import wall_ms_ceil
from bridge.intercept.decisions import RELAY, Copy, Decision, Hold, Replace, Stamp
from bridge.intercept.views import Delivery, Principal, Settle, Settlement, Subscribe
from bridge.staging import envelope
from bridge.staging.levels import Layout
from bridge.staging.outcomes import Kind, MessageOutcome, Sink
from policies.delay import matches
from policies.naming import QUEUE, is_queue, named
from policies.reasons import MQRC_BACKOUT_THRESHOLD_REACHED
from policies.redelivery import (
    Delete,
    Move,
    Policy,
    PolicyTable,
    Redeliver,
    Undelivered,
    decide,
)

JMSX_DELIVERY_COUNT = "JMSXDeliveryCount"
UNDELIVERED_QUEUE = "jms-bridge.undelivered"  # the bridge's $sys.undelivered
# Headers of one delivery, or that the copy gets anew, not copied from the delivery.
_NOT_COPIED = PER_DELIVERY | {"x-delivery-count", JMSX_DELIVERY_COUNT, "receipt", "transaction"}


# The stamps of the first delivery counts, made once (a Stamp is a frozen value).
_STAMPS: dict[int, Stamp] = {}


def delivery_count(headers: Mapping[str, str]) -> int:
    """JMSXDeliveryCount of a delivery: 1 on the first, counted from the copy's own header and
    the broker's redelivery signals."""
    own = headers.get(envelope.DELIVERY_COUNT, "0")
    before = int(own) if own.isascii() and own.isdigit() else 0
    by_broker = headers.get("x-delivery-count", "")
    if by_broker.isascii() and by_broker.isdigit():
        return before + 1 + int(by_broker)
    return before + 1 + (headers.get("redelivered") == "true")


def consumed_from(delivery: Delivery, broker: str) -> str | None:
    """The queue a delivery came from, as a destination a copy can go back to: the message's
    own destination when it names a queue, else the queue its subscription reads (a message
    sent through an exchange to a queue); None from a topic or an exchange's subscription,
    where a copy would reach every subscriber."""
    if is_queue(delivery.destination, broker):
        return delivery.destination
    if delivery.source and is_queue(delivery.source, broker):
        return delivery.source
    return None


def back_to(delivery: Delivery, queue: str, broker: str) -> str:
    """Where a copy redelivered at once is sent: on RabbitMQ, the queue the subscription reads
    when it names it ``/amq/queue/X`` (a SEND to ``/queue/X`` declares X again, which RabbitMQ
    refuses for a queue declared with other arguments, closing the connection); else
    ``queue``, where the delivery came from."""
    if broker == "rabbitmq" and delivery.source.startswith("/amq/queue/"):
        return delivery.source
    return queue


class Pending:
    def __repr__(self) -> str:
        return "PENDING"


PENDING: Final = Pending()  # a queue whose arguments were never read


class QueuePolicySource(Protocol):
    """Policies queues declare in their arguments (``bridge.app.queue_policies``)."""

    def policy_of(self, vhost: str | None, queue: str) -> Policy | None | Pending:
        """Never blocks: PENDING when the queue's arguments are not known yet."""

    def check(self, vhost: str | None, queue: str) -> Awaitable[None]:
        """Read the queue's arguments, so that ``policy_of`` knows them."""

    def warm(self, vhost: str | None, queue: str) -> None:
        """Start reading them in the background unless they are known (a consumer came)."""


# TIBCO's form of a destination (Queue[orders]): kept here under its old name.
jms_destination = envelope.jms_destination


class RedeliveryInterceptor(Interceptor):
    # A delivery's count comes from these headers and the redelivered flag (delivery_count).
    interest = Interest(deliveries=True, settlements=True,
                        delivery_headers=frozenset({envelope.DELIVERY_COUNT, "x-delivery-count"}))

    def __init__(
        self,
        *,
        table: PolicyTable,
        fmt: StagedFormat,
        layout: Layout,
        undelivered: str = "/queue/" + UNDELIVERED_QUEUE,
        clock: Callable[[], int] = wall_ms_ceil,
        rand: Callable[[], float] = random.random,
        sinks: Sequence[Sink] = (),
        count_first: Sequence[str] = (),
        queue_policies: QueuePolicySource | None = None,
    ) -> None:
        self.table = table
        self.queue_policies = queue_policies
        if queue_policies is not None:  # a consumer's arrival starts the look at its queue
            self.interest = replace(self.interest, subscribes=True)
        # Destination patterns whose first deliveries carry JMSXDeliveryCount 1 too; any other
        # first delivery goes out as the broker's bytes.
        self.count_first = tuple(count_first)
        if self.count_first:
            self.interest = replace(self.interest, delivery_destinations=True)
        self.fmt = fmt
        self.layout = layout
        self.undelivered = undelivered
        self.clock = clock
        self.rand = rand
        self.sinks = tuple(sinks)

    def on_delivery(self, delivery: Delivery) -> Decision:
        count = delivery_count(delivery.headers)
        if count == 1 and not (self.count_first and self._counts_first(delivery)):
            return RELAY
        stamp = _STAMPS.get(count)
        if stamp is None:
            stamp = Stamp(((JMSX_DELIVERY_COUNT, str(count)),))
            if count < 64:
                _STAMPS[count] = stamp
        return stamp

    def on_subscribe(self, subscribe: Subscribe) -> Decision:
        source = self.queue_policies
        if source is not None:
            name = _queue_name(subscribe.destination, self.table.broker)
            if name is not None:
                source.warm(subscribe.principal.vhost, name)
        return RELAY

    def _counts_first(self, delivery: Delivery) -> bool:
        broker = self.table.broker
        where = consumed_from(delivery, broker) or delivery.destination
        return any(matches(p, where, broker) for p in self.count_first)

    def on_settle(self, settle: Settle) -> Decision:
        if settle.outcome is Settlement.ACK:
            return RELAY
        broker = self.table.broker
        failed = [(d, queue) for d in settle.deliveries
                  if (queue := consumed_from(d, broker)) is not None]
        if not failed or len(failed) < len(settle.deliveries):
            return RELAY  # a topic's delivery: the broker's own redelivery applies
        source = self.queue_policies
        if source is not None:
            vhost = settle.principal.vhost
            for _, queue in failed:
                name = _queue_name(queue, broker)
                # A rolled-back STOMP transaction cannot be offered again: it takes the
                # configured policy if the look its consumer's arrival started is not done.
                if (name is not None and settle.outcome is not Settlement.ROLLBACK
                        and source.policy_of(vhost, name) is PENDING):
                    return Hold(("queue arguments", vhost, name),
                                functools.partial(source.check, vhost, name))
        now = self.clock()
        outcomes: list[MessageOutcome] = []
        copies = tuple(c for d, queue in failed
                       if (c := self._copy(d, queue, settle, now, outcomes)) is not None)
        for sink in self.sinks:
            sink(outcomes)
        return Replace(copies) if copies else RELAY

    def _copy(
        self, d: Delivery, queue: str, settle: Settle, now: int, outcomes: list[MessageOutcome]
    ) -> Copy | None:
        """``queue``: where ``d`` was consumed from (:func:`consumed_from`)."""
        failures = delivery_count(d.headers)
        policy = self.policy(queue, settle.principal)
        action = decide(policy, failures, queue, d.headers, self.rand())
        headers = {n: v for n, v in d.headers.items() if n not in _NOT_COPIED}
        original_id = (headers.get(envelope.MESSAGE_ID) or headers.get("amqp-message-id")
                       or d.headers.get("message-id", ""))
        headers[envelope.MESSAGE_ID] = original_id
        headers[envelope.DELIVERY_COUNT] = str(failures)
        policy_text = f"{policy.dialect}: {policy.text}"
        expires_ms = envelope.expiry_ms(headers, now)
        if expires_ms is not None and not isinstance(action, Delete):
            if expires_ms <= now:
                # Its time is up: no copy goes out. Staged due now, it takes the path of an
                # expired staged message (a report, the undelivered queue, or discarded).
                return self._staged(d, queue, headers, now, now, expires_ms)
            # The copy's TTL counts from the original send, not from this failure.
            headers[envelope.EXPIRES] = str(expires_ms)
        if isinstance(action, Redeliver):
            outcomes.append(MessageOutcome(Kind.REDELIVERED, now, original_id, queue,
                                           now + action.delay_ms, detail=policy_text,
                                           count=failures, size=d.body_size, headers=headers))
            if action.delay_ms <= 0:
                if settle.outcome is Settlement.LOST:
                    # The consumer is leaving: left unsettled, the broker requeues it when the
                    # upstream connection closes, flagged redelivered (one more delivery). A
                    # copy put now could be dispatched to the departing subscription itself.
                    return None
                return Copy(d.ack_id, back_to(d, queue, self.table.broker),
                            _left(headers, expires_ms, now))
            return self._staged(d, queue, headers, now + action.delay_ms, now, expires_ms)
        if isinstance(action, Delete):
            outcomes.append(MessageOutcome(Kind.DELETED, now, original_id, queue,
                                           reason=action.reason, detail=policy_text, count=failures,
                                           size=d.body_size))
            return Copy(d.ack_id, None)
        where = action.destination if isinstance(action, Move) else self.undelivered
        assert isinstance(action, Move | Undelivered)
        envelope.mark_failed(
            headers, reason=action.reason,
            text=(f"delivered {failures} times: the redelivery limit of {policy_text}"
                  if action.reason is MQRC_BACKOUT_THRESHOLD_REACHED else policy_text),
            destination=queue, now_ms=now, delivery_count=failures, policy=policy_text,
        )
        kind = Kind.DEAD_LETTERED if isinstance(action, Move) else Kind.UNDELIVERED
        outcomes.append(MessageOutcome(kind, now, original_id, queue, reason=action.reason,
                                       detail=policy_text, queue=where, count=failures,
                                       size=d.body_size))
        return Copy(d.ack_id, where, _left(headers, expires_ms, now))

    def policy(self, queue: str, principal: Principal) -> Policy:
        """``queue``'s policy: the one its arguments declare, else the configured table's."""
        source = self.queue_policies
        if source is not None:
            name = _queue_name(queue, self.table.broker)
            if name is not None:
                declared = source.policy_of(principal.vhost, name)
                if isinstance(declared, Policy):
                    return declared
        return self.table.lookup(queue, principal.login)[1]

    def _staged(self, d: Delivery, queue: str, headers: dict[str, str], due_ms: int, now: int,
                expires_ms: int | None) -> Copy:
        """A delayed redelivery: staged exactly like a delayed send, back to its queue, with
        the expiry of the original send (one that comes first is an expired staged
        message's)."""
        staging = self.fmt.client_destination(self.layout.queue_for(due_ms - now))
        staged = envelope.staged_headers(
            headers.items(), self.fmt, target=queue, staging_destination=staging,
            due_ms=due_ms, sent_ms=now, expires_ms=expires_ms, drop=(),
        )
        staged.append((envelope.DELIVERY_COUNT, headers[envelope.DELIVERY_COUNT]))
        return Copy(d.ack_id, staging, tuple(staged))


def _queue_name(destination: str, broker: str) -> str | None:
    """The broker's name of the queue ``destination`` names (None: not a plain queue)."""
    found = named(destination, broker)
    if found is None or found.kind != QUEUE or found.scope:
        return None
    return found.name


def _left(headers: dict[str, str], expires_ms: int | None, now: int) -> tuple[tuple[str, str], ...]:
    """A copy's headers, its relative TTL (``expiration``) cut to what is left of it; an
    absolute one (``expires``) stays as it was."""
    ttl = headers.get("expiration", "")
    if expires_ms is not None and ttl.isascii() and ttl.isdigit() and int(ttl) > 0:
        headers["expiration"] = str(max(expires_ms - now, 1))
    return tuple(headers.items())

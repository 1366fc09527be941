"""``adapters.queues.QueueTools`` on RabbitMQ: the staging adapter's connection, and a connection
of its own for each look at a queue.

A look (``inspect``, ``sweep``) consumes the queue on a connection of its own with one channel
(``adapters.rabbitmq_client``: a commit's publishes and acks go out at once, where pika's
BlockingChannel writes and polls after each) and acknowledges only the messages it removes; the
others stay unacknowledged until the channel closes, when the broker puts them back at their old
places (a classic queue keeps a requeued message's position), so kept messages keep their order.
Credit is raised as messages are kept (basic.qos is a 16-bit count): past 65,535 kept messages
the rest are fetched one by one with basic.get, which no credit limits. A sweep's channel is in
transaction mode: each batch's puts (published mandatory to a queue that was checked to exist
first) and acks are one commit. A sweep holds at most ``HOLD`` kept messages that way; later
kept ones are published again, properties and body as they came, to the queue's tail in the
commit that acks them, and the sweep then goes round the whole queue, so after it the kept
messages are in their old order (the held ones back at the head, the others behind them), as on
ActiveMQ.

A broker-native dead letter's ``x-death`` (an array, which STOMP headers cannot carry) is read
into plain headers: ``x-death-count``, ``x-death-reason``, ``x-death-queue`` and
``x-death-time`` (epoch ms) of its latest death.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pika
import pika.exceptions

from adapters.amqp_events import (
    CancelOk,
    Committed,
    ConsumeOk,
    DeclareOk,
    Delivery,
    GetEmpty,
    Got,
    Publish,
    QosOk,
    Returned,
)
from adapters.base import Message
from adapters.queues import KEEP, Drop, Found, Keep, Put, SweepAction, SweepReport, Visit
from adapters.rabbitmq import RabbitMQ
from adapters.rabbitmq_client import ChannelRefused, Wire, decoded, encoded
from adapters.rabbitmq_connection import refusal_reason
from adapters.rabbitmq_management import queue_counts
from adapters.rabbitmq_stomp import amqp_properties, route, stomp_headers
from policies.errors import BrokerUnavailable, PutRefused
from policies.reasons import (
    MQRC_OBJECT_IN_USE,
    MQRC_PROPERTY_VALUE_BAD,
    MQRC_UNKNOWN_OBJECT_NAME,
)

PREFETCH = 1000
MAX_CREDIT = 65535
IDLE_S = 1.0  # no delivery for this long: the queue has no more for us (others hold the rest)
# Kept messages held unacknowledged, at most: RabbitMQ 3.10 looks an ack's tag up through the
# channel's unacknowledged messages in order, so each ack costs as many steps as there are held
# ahead of it (a sweep holding 20,000 slowed from 5,400 to 480 messages a second). Past this,
# kept messages go round to the tail instead.
HOLD = 1000
# Headers read from x-death: never put back on a message the tools put.
DEATH_HEADERS = ("x-death-count", "x-death-reason", "x-death-queue", "x-death-time")


def death_headers(props: pika.BasicProperties) -> dict[str, str]:
    """The latest ``x-death`` entry as plain headers (empty for a message that never died)."""
    deaths = (props.headers or {}).get("x-death")
    if not isinstance(deaths, list) or not deaths or not isinstance(deaths[0], dict):
        return {}
    latest: dict[str, Any] = deaths[0]
    out = {}
    if isinstance(latest.get("count"), int):
        out["x-death-count"] = str(latest["count"])
    for key in ("reason", "queue"):
        if isinstance(latest.get(key), str | bytes):
            value = latest[key]
            out[f"x-death-{key}"] = value.decode() if isinstance(value, bytes) else value
    when = latest.get("time")
    if isinstance(when, dt.datetime):
        out["x-death-time"] = str(int(when.timestamp() * 1000))
    return out


def found_message(props: pika.BasicProperties, body: bytes) -> Message:
    headers = stomp_headers(props)
    for name, value in death_headers(props).items():
        headers.setdefault(name, value)
    return Message(headers, body)


# A delivery waiting for its batch's commit: its tag, what becomes of it, and for a kept message
# sent round to the tail, the delivery as it came.
_Pending = tuple[int, Visit, Delivery | None]


class RabbitMQQueues(RabbitMQ):
    """The staging adapter plus the dead-letter tools' port."""

    # -- sizes ---------------------------------------------------------------------------------

    def queue_sizes(self, matching: str | None = None) -> dict[str, int]:
        if self._management is None:
            raise BrokerUnavailable(
                f"{self._where()}: listing queues needs RabbitMQ's management API "
                "(--upstream-management http://USER:PASS@HOST:15672)")
        return queue_counts(self._management, self.endpoint.vhost, matching,
                            self._http_timeout)

    def size(self, queue: str) -> int | None:
        try:
            ok = self._declared_ok(queue)
        except BrokerUnavailable as exc:
            cause = exc.__cause__
            if (isinstance(cause, pika.exceptions.ChannelClosedByBroker)
                    and cause.reply_code == 405 and self._main_open()):
                raise PutRefused(0, MQRC_OBJECT_IN_USE, f"{queue!r} is another connection's "
                                 "exclusive queue: only it can look at it", queue) from None
            raise
        return None if ok is None else int(ok.method.message_count or 0)

    # -- looking -------------------------------------------------------------------------------

    def _open(self, queue: str, *, tx: bool) -> tuple[Wire, int]:
        """A connection of the look's own (``adapters.rabbitmq_client``: pika writes and polls
        after every publish and ack of a commit), its channel checked to have ``queue``."""
        self._channel()
        wire = Wire(self._params, self._where(), self._log, transactional=tx, reopen=False)
        try:
            wire.channel().declare_passive(queue)
            (*_, ok) = wire.until(DeclareOk)
        except ChannelRefused as exc:
            wire.close()
            if exc.reply_code == 404:
                raise PutRefused(0, MQRC_UNKNOWN_OBJECT_NAME, f"no queue {queue!r}",
                                 queue) from None
            raise BrokerUnavailable(f"{self._where()}: {queue!r}: {exc}") from None
        except BrokerUnavailable:
            wire.close()
            raise
        assert isinstance(ok, DeclareOk)
        return wire, ok.message_count

    def _deliveries(
        self, wire: Wire, queue: str, count: int, held: Callable[[], int]
    ) -> Iterator[Delivery]:
        """The first ``count`` messages of ``queue``, unacknowledged; ``held()`` says how many
        the caller still holds (the credit grows with it). Deliveries read while the wire waits
        for another answer (a commit's) are in ``wire.delivered`` and come from here too."""
        got = wire.delivered
        credit = min(PREFETCH, max(count, 1))
        # The channel's limit (global): a consumer's own is fixed when it starts.
        wire.channel().qos(credit, global_qos=True)
        wire.until(QosOk)
        wire.channel().consume(queue)
        (*_, ok) = wire.until(ConsumeOk)
        assert isinstance(ok, ConsumeOk)
        tag: str | None = ok.consumer_tag
        seen = 0
        while seen < count:
            if not got and tag is not None:
                wire.poll(0)
                if not got:
                    wire.poll(IDLE_S)
                if not got:
                    return
            if not got:  # past the credit limit: one at a time
                wire.channel().get(queue)
                (*_, answer) = wire.until((Got, GetEmpty))
                if isinstance(answer, GetEmpty):
                    if not got:
                        return
                else:
                    assert isinstance(answer, Got)
                    got.append(answer)
            seen += 1
            yield got.popleft()
            if tag is None:
                continue
            want = held() + PREFETCH
            if want > MAX_CREDIT:
                wire.channel().cancel(tag)
                wire.until(CancelOk)  # what was sent before it is held as the rest
                tag = None
            elif want - credit >= PREFETCH // 2:
                credit = want
                wire.channel().qos(credit, global_qos=True)
                wire.until(QosOk)

    def inspect(self, queue: str) -> Iterator[Found]:
        wire, count = self._open(queue, tx=False)
        seen = [0]  # every message seen is held until the channel closes
        try:
            for d in self._deliveries(wire, queue, count, lambda: seen[0]):
                seen[0] += 1
                props = decoded(d.properties)
                yield Found(found_message(props, d.body), props.message_id or "", seen[0] - 1)
        finally:
            wire.close()  # everything goes back to its place

    # -- sweeping ------------------------------------------------------------------------------

    def sweep(
        self,
        queue: str,
        decide: Callable[[Found], SweepAction],
        *,
        limit: int | None = None,
        batch: int = 500,
        before_commit: Callable[[Sequence[Visit]], None] | None = None,
        after_commit: Callable[[Sequence[Visit]], None] | None = None,
    ) -> SweepReport:
        report = SweepReport()
        wire, count = self._open(queue, tx=True)
        pending: list[_Pending] = []
        held = 0  # kept messages held unacknowledged (they go back to their places)
        acted = 0
        try:
            for d in self._deliveries(
                wire, queue, count, lambda: held + len(pending)  # noqa: B023 - as it is now
            ):
                props = decoded(d.properties)
                found = Found(found_message(props, d.body), props.message_id or "", report.seen)
                report.seen += 1
                action = decide(found) if limit is None or acted < limit else KEEP
                if isinstance(action, Keep):
                    if held < HOLD:
                        held += 1
                        report.kept += 1
                        continue
                    pending.append((d.delivery_tag, Visit(found, action), d))  # to the tail
                else:
                    acted += 1
                    pending.append((d.delivery_tag, Visit(found, action), None))
                if len(pending) >= batch:
                    self._commit(wire, queue, pending, before_commit, after_commit, report)
                if limit is not None and acted >= limit and report.kept == held:
                    break  # nothing sent round to the tail: the rest can stay where it is
            self._commit(wire, queue, pending, before_commit, after_commit, report)
        finally:
            wire.close()  # kept (and anything uncommitted) go back to their places
        return report

    def _commit(
        self,
        wire: Wire,
        queue: str,
        pending: list[_Pending],
        before_commit: Callable[[Sequence[Visit]], None] | None,
        after_commit: Callable[[Sequence[Visit]], None] | None,
        report: SweepReport,
    ) -> None:
        """The batch's puts and acks in one transaction on the channel that consumed them."""
        if not pending:
            return
        puts: list[Publish] = []
        for _, visit, raw in pending:
            if isinstance(visit.action, Put):
                where, props, body = self._prepared(visit.action)
                try:
                    puts.append(Publish(where.exchange, where.routing_key, encoded(props),
                                        body, where.queue))
                except (ValueError, TypeError, pika.exceptions.AMQPError) as bad:
                    raise PutRefused(0, MQRC_PROPERTY_VALUE_BAD, f"{bad}: nothing of this "
                                     "batch was done", visit.action.destination) from None
            elif raw is not None:  # kept, sent round to the tail with the bytes it came with
                puts.append(Publish("", queue, raw.properties, raw.body, False))
        acting = [v for _, v, _ in pending if not isinstance(v.action, Keep)]
        if before_commit is not None and acting:
            before_commit(acting)
        try:
            wire.channel().commit(puts, [tag for tag, _, _ in pending])
            answer = wire.until(Committed)
        except ValueError as bad:
            raise PutRefused(0, MQRC_PROPERTY_VALUE_BAD, f"{bad}: nothing of this batch was "
                             "done", "") from None
        except ChannelRefused as exc:
            if self._conn is None or not self._conn.is_open or not self._main_open():
                self.close()
                raise BrokerUnavailable(f"{self._where()}: {exc}") from None
            raise PutRefused(0, refusal_reason(exc.reply_code, exc.reply_text),
                             f"{exc}: nothing of this batch was done", "") from None
        returned = [e.routing_key for e in answer if isinstance(e, Returned)]
        if returned:
            # Only when a queue checked a moment ago was deleted since: say so loudly.
            self._log.error("a put was returned unroutable after its commit",
                            queues=sorted(set(returned)))
            raise BrokerUnavailable(
                f"{self._where()}: queue {returned[0]!r} disappeared during the sweep "
                "(a message put to it was returned)")
        for _, visit, _ in pending:
            if isinstance(visit.action, Keep):
                report.kept += 1
            elif isinstance(visit.action, Drop):
                report.dropped += 1
            else:
                report.put += 1
        if after_commit is not None and acting:
            after_commit(acting)
        pending.clear()

    def put_all(self, puts: Sequence[Put], *, text: bool = False) -> None:
        prepared = [self._prepared(put) for put in puts]
        try:
            publishes = [Publish(where.exchange, where.routing_key, encoded(props), body, False)
                         for where, props, body in prepared]
            # RabbitMQ answers the commit once the persistent messages are on disk.
            self._transactions().commit(publishes)
        except (ValueError, TypeError, pika.exceptions.AMQPError) as bad:
            raise PutRefused(0, MQRC_PROPERTY_VALUE_BAD, f"{bad}: none of them was put",
                             "") from None
        except ChannelRefused as exc:
            raise PutRefused(0, refusal_reason(exc.reply_code, exc.reply_text),
                             f"{exc}: none of them was put", "") from None
        except BrokerUnavailable:
            if self._conn is None or not self._conn.is_open or not self._main_open():
                self.close()
            raise

    def _prepared(self, put: Put) -> tuple[Any, pika.BasicProperties, bytes]:
        """Route and properties of a put, its target declared (a /queue/) or checked to exist
        (an /amq/queue/); PutRefused when it cannot be put there."""
        try:
            where = route(put.destination)
        except ValueError as bad:
            raise PutRefused(0, MQRC_UNKNOWN_OBJECT_NAME, str(bad), put.destination) from None
        try:
            props = amqp_properties(put.message.headers)
        except ValueError as bad:
            raise PutRefused(0, MQRC_PROPERTY_VALUE_BAD, str(bad), put.destination) from None
        if where.queue and where.routing_key not in self._declared:
            if where.declare:
                self._declare_target(where.routing_key, put.message.headers, put.destination)
            elif self._declared_ok(where.routing_key) is None:
                raise PutRefused(0, MQRC_UNKNOWN_OBJECT_NAME,
                                 f"no queue {where.routing_key!r}", put.destination)
            else:
                self._declared.add(where.routing_key)
        return where, props, put.message.body


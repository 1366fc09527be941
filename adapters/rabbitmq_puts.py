"""Putting on RabbitMQ: ``settle`` (a batch's puts in one transaction, or a confirmed publish
each) and ``publish``, with the declare a STOMP SEND to ``/queue/<name>`` makes.

A publish the broker refuses (a channel error such as 404 NOT_FOUND or 403 ACCESS_REFUSED, a
mandatory publish to a missing queue returned unroutable, a nack) raises PutRefused: it closes at
most ``confirm``, so everything held on ``main`` stays held, and ``confirm`` is reopened by the
next publish.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

import pika
import pika.exceptions

from adapters.amqp_events import Delivery, Publish, Returned
from adapters.base import Held, Message, Move
from adapters.rabbitmq_client import ChannelRefused, Consumer, encoded
from adapters.rabbitmq_connection import Connection, describe, refusal_reason
from adapters.rabbitmq_stomp import Route, amqp_properties, queue_arguments, routable, route
from policies.errors import BrokerUnavailable, PutRefused
from policies.reasons import MQRC_PROPERTY_VALUE_BAD, MQRC_Q_FULL, MQRC_UNKNOWN_OBJECT_NAME

REFUSING_S = 60.0  # how long a queue that nacked a publish is put to one message at a time
# A batch's puts are committed this many at a time, and the batch's acks written once the last
# commit is in. One commit for a burst's whole batch (16,000 held when 100,000 fall due at
# once) put none on its target until the last was written, 0.8-1 s after the due time. Acks
# after each commit instead were out of delivery order, one at a time: RabbitMQ's channel looks
# each up among all it holds unacked, and that stopped deliveries for 5-9 s.
COMMIT_EVERY = 500


class Puts(Connection):
    """``settle`` and ``publish`` of ``adapters.rabbitmq.RabbitMQ``."""

    _refusing: dict[str, float]
    _delivered: list[Held]
    _told_fallback: float = 0.0  # (a warning at most every REFUSING_S)
    _take_own: Callable[[Consumer, list[Delivery]], None]

    def settle(self, moves: Sequence[Move]) -> None:
        """Publish every move's message, then ack. A held message from a lost connection stops
        the whole batch before anything is published (the broker has requeued it already). A
        refused publish stops it at that move (PutRefused): the moves before it are done, and
        those after it that its transaction put (``also_done``); it and the rest stay held. A
        transaction's connection lost after some commits leaves the batch to be put one by
        one from the commit that was out, which can duplicate, never lose. RabbitMQ fails a
        transaction with a put to a full reject-publish queue ("partial tx completion") after
        putting the others, so a queue that nacked a put is left out of transactions for
        REFUSING_S: the engine tries it again and again (message-retry), and only its first
        refusal can duplicate."""
        self._channel()
        for move in moves:
            if not self._live(self._tag(move.held)):
                raise BrokerUnavailable(
                    f"{self._where()}: a held message of {move.held.queue} belongs to a lost "
                    "connection and is back on its queue"
                )
        puts = [m for m in moves if m.destination is not None]
        done = 0
        if len(puts) > 1 and not self._any_refusing(puts):
            done = self._settle_batch(moves)
        self._settle_each(moves, done)

    def _read_main(self) -> bool:
        """While a batch's transaction commits on its own connection, the subscriptions'
        deliveries coming in are read (most of the engine's own work on them). False once none
        came (the wait for the commit then blocks, as it does with nothing to read), or there
        is nothing to read them on. A failure of their connection is met at its next use."""
        consumer = self._consumer
        if consumer is None or not consumer.open:
            return False
        before = len(self._delivered)
        try:
            self._take_own(consumer, consumer.read(0.0))
        except BrokerUnavailable:
            return False
        return len(self._delivered) > before

    def _any_refusing(self, puts: Sequence[Move]) -> bool:
        if not self._refusing:
            return False
        now = time.monotonic()
        self._refusing = {q: until for q, until in self._refusing.items() if until > now}
        return any(route(m.destination or "").routing_key in self._refusing for m in puts
                   if routable(m.destination))

    def _settle_batch(self, moves: Sequence[Move]) -> int:
        """All puts in transactions (``adapters.rabbitmq_client``), then the acks; how many
        of the first moves are settled. Fewer than all when the batch could not be put that
        way (a target that refuses its declare, a message that cannot be written, a channel
        error, the transaction's connection lost while ``main``'s is up): the moves of the
        commits done are acked, the rest are for one by one."""
        publishes: list[Publish] = []
        move_of: list[int] = []  # a publish's move
        for i, move in enumerate(moves):
            if move.destination is None:
                continue
            if move.message is None:
                return 0  # _settle_each says what is wrong with it
            where = route(move.destination)
            if where.declare and where.routing_key not in self._declared:
                # Declared on its own first (as a SEND to it would), so that a burst of
                # releases to a queue not met before still goes in one transaction.
                try:
                    self._declare_target(where.routing_key, move.message.headers,
                                         move.destination)
                except PutRefused:
                    return 0  # _settle_each says which move it refuses
            try:
                props = encoded(amqp_properties(move.message.headers))
            except (ValueError, TypeError, pika.exceptions.AMQPError):
                return 0  # one by one, where that move is refused on its own
            body = move.message.body
            publishes.append(Publish(where.exchange, where.routing_key, props, body,
                                     where.queue or move.mandatory))
            move_of.append(i)
        parts: list[list[Returned]] = []  # the commits done
        try:
            self._transactions().commit_parts(
                [publishes[at:at + COMMIT_EVERY] for at in range(0, len(publishes), COMMIT_EVERY)],
                parts, meanwhile=self._read_main)
        except ValueError:
            return 0  # a message no frame can carry: refused on its own
        except ChannelRefused as exc:
            self._log.debug("a batch's transaction refused: put one by one", error=str(exc))
            return self._ack_committed(moves, move_of, len(parts))
        except BrokerUnavailable as exc:
            if not self._main_open() or self._conn is None or not self._conn.is_open:
                self.close()
                raise
            now = time.monotonic()
            if now >= self._told_fallback:
                self._told_fallback = now + REFUSING_S
                self._log.warning("batches put one by one: their transactions' connection "
                                  "failed", error=str(exc))
            # The commit out when it failed may or may not be done: put again, it can
            # duplicate, never lose.
            return self._ack_committed(moves, move_of, len(parts))
        returned = _returned(publishes, parts, move_of)
        if not returned:
            self._ack_all(self._tag(move.held) for move in moves)
            return len(moves)
        refused = min(returned)
        committed = min(len(parts) * COMMIT_EVERY, len(publishes))
        also = tuple(sorted(i for i in move_of[:committed] if i > refused and i not in returned))
        self._ack_all(self._tag(moves[i].held) for i in (*range(refused), *also))
        move = moves[refused]
        raise PutRefused(refused, MQRC_UNKNOWN_OBJECT_NAME, _unroutable(
            route(move.destination or "")), move.destination or "", also_done=also)

    def _ack_committed(self, moves: Sequence[Move], move_of: Sequence[int], parts: int) -> int:
        """Ack the moves before the first publish of a commit not done (``parts`` were); how
        many."""
        first = parts * COMMIT_EVERY
        done = move_of[first] if first < len(move_of) else len(moves)
        self._ack_all(self._tag(move.held) for move in moves[:done])
        return done

    def _settle_each(self, moves: Sequence[Move], start: int = 0) -> None:
        """Per move from ``start``: publish (confirmed), then ack."""
        for i in range(start, len(moves)):
            move = moves[i]
            if move.destination is not None:
                if move.message is None:
                    raise ValueError("a move with a destination needs a message")
                try:
                    self._put(move.destination, move.message, mandatory=move.mandatory)
                except PutRefused as refused:
                    raise refused.at(i) from None
            self._settle_one(self._tag(move.held))

    def publish(self, destination: str, message: Message, *, mandatory: bool = False) -> None:
        self._put(destination, message, mandatory=mandatory)

    def _put(self, destination: str, message: Message, *, mandatory: bool = False) -> None:
        where = route(destination)
        if mandatory and not where.queue:
            where = Route(where.exchange, where.routing_key, where.declare, queue=True)
        try:
            props = amqp_properties(message.headers)
        except ValueError as bad:
            # This message cannot be put anywhere as it is: its refusal, not an outage.
            raise PutRefused(0, MQRC_PROPERTY_VALUE_BAD, str(bad), destination) from None
        if where.declare and where.routing_key not in self._declared:
            self._declare_target(where.routing_key, message.headers, destination)
        try:
            self._publish(where, props, message.body, destination)
        except pika.exceptions.UnroutableError:
            if not where.declare:
                raise PutRefused(0, MQRC_UNKNOWN_OBJECT_NAME, _unroutable(where),
                                 destination) from None
            self._declared.discard(where.routing_key)  # deleted since we declared it
            self._declare_target(where.routing_key, message.headers, destination)
            self._publish_or_fail(where, props, message.body, destination)

    def _publish(
        self, where: Route, props: pika.BasicProperties, body: bytes, destination: str
    ) -> None:
        ch = self._confirm_channel()
        try:
            ch.basic_publish(
                where.exchange, where.routing_key, body, props, mandatory=where.queue
            )
        except pika.exceptions.UnroutableError:
            raise
        except pika.exceptions.NackError:
            # RabbitMQ nacks a publish to a full queue with overflow reject-publish(-dlx).
            self._refusing[where.routing_key] = time.monotonic() + REFUSING_S
            raise PutRefused(
                0, MQRC_Q_FULL, "the broker nacked the message (a full queue that rejects "
                "publishes?)", destination,
            ) from None
        except pika.exceptions.ChannelClosedByBroker as exc:
            self._refused(exc, destination)
        except (pika.exceptions.AMQPError, OSError):
            with self._translate():
                raise

    def _refused(self, exc: pika.exceptions.ChannelClosedByBroker, destination: str) -> None:
        """A side channel closed by the broker over one message: PutRefused while the
        connection and ``main`` are up, BrokerUnavailable otherwise."""
        if self._conn is None or not self._conn.is_open or not self._main_open():
            with self._translate():
                raise exc
        self._drop_side_channels()
        self._log.debug("put refused", destination=destination, error=describe(exc))
        raise PutRefused(
            0, refusal_reason(exc.reply_code, exc.reply_text),
            f"({exc.reply_code}) {exc.reply_text}", destination,
        ) from None

    def _publish_or_fail(
        self, where: Route, props: pika.BasicProperties, body: bytes, destination: str
    ) -> None:
        try:
            self._publish(where, props, body, destination)
        except pika.exceptions.UnroutableError:
            raise PutRefused(
                0, MQRC_UNKNOWN_OBJECT_NAME, "the message was returned unroutable", destination
            ) from None

    def _declare_target(self, queue: str, headers: Mapping[str, str], destination: str) -> None:
        """Declare a /queue/ target as the plugin does on SEND (durable, the message's
        x-arguments, its auto-delete header; never exclusive to this connection). A queue that
        exists with other arguments is used as it is, where the plugin would refuse the SEND:
        a release must not fail for a target that is there."""
        arguments = queue_arguments(headers)
        auto_delete = headers.get("auto-delete") in ("true", "True")
        ch = self._scratch_channel()
        try:
            ch.queue_declare(queue, durable=True, auto_delete=auto_delete, arguments=arguments)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code == 403:
                self._refused(exc, destination)
            if exc.reply_code != 406:
                with self._translate():
                    raise
            self._scratch = None
            ch = self._scratch_channel()
            with self._translate():
                ch.queue_declare(queue, passive=True)
        except (pika.exceptions.AMQPError, OSError):
            with self._translate():
                raise
        self._declared.add(queue)


def _returned(publishes: Sequence[Publish], parts: Sequence[Sequence[Returned]],
              move_of: Sequence[int]) -> set[int]:
    """The moves whose publishes the broker returned, each return matched within its own
    commit (publishes of the same exchange, key and body: the first not matched yet). A
    return that matches none counts its whole commit as returned: held, not lost."""
    out: set[int] = set()
    for p, backs in enumerate(parts):
        free = list(range(p * COMMIT_EVERY, min((p + 1) * COMMIT_EVERY, len(publishes))))
        whole = list(free)
        for back in backs:
            i = next((i for i in free if publishes[i].exchange == back.exchange
                      and publishes[i].routing_key == back.routing_key
                      and publishes[i].body == back.body), None)
            if i is None:
                out.update(move_of[j] for j in whole)
                break
            free.remove(i)
            out.add(move_of[i])
    return out


def _unroutable(where: Route) -> str:
    """Why the broker returned a mandatory publish."""
    if where.exchange:
        return (f"no queue bound to exchange {where.exchange!r} takes routing key "
                f"{where.routing_key!r} (the broker returned the message unroutable)")
    return f"no queue {where.routing_key!r} (the broker returned the message unroutable)"

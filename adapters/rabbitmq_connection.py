"""The RabbitMQ adapter's connection, its channels, and the one place pika's and the socket's
errors are translated: what ``adapters.rabbitmq.RabbitMQ`` and its parts build on.

Channels: ``main`` stands for the connection; each subscription consumes on a channel of its own,
where its deliveries are acked (a channel's held deliveries are then of one queue, in its order,
so a settle's acks of them go mostly in one multiple ack); ``confirm`` publishes in confirm
mode; ``scratch`` declares. Errors on ``confirm``/``scratch`` close only that channel; an error
on ``main``, on a subscription's channel or on the connection closes the adapter (everything
held returns to its queue) and the next call raises BrokerUnavailable until ``connect`` is
called again. Batches of publishes in one transaction go through a connection of their own to
the same node (``adapters.rabbitmq_client``), closed with the adapter.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel
from structlog.typing import FilteringBoundLogger

from adapters.base import Held, connect_with_retries
from adapters.rabbitmq_client import Consumer, Publisher
from policies.endpoints import Endpoint
from policies.errors import BrokerUnavailable
from policies.reasons import (
    MQRC_HOST_NOT_AVAILABLE,
    MQRC_MSG_TOO_BIG_FOR_Q,
    MQRC_NOT_AUTHORIZED,
    MQRC_UNEXPECTED_ERROR,
    MQRC_UNKNOWN_OBJECT_NAME,
    Reason,
)


@dataclass(frozen=True, slots=True)
class Tag:
    generation: int  # of the channel that delivered it: the connection's, or the peek channel's
    delivery_tag: int
    peeked: bool = False  # got by a peek, on the peek channel
    queue: str = ""  # else delivered to the subscription to this queue, on its channel
    own: bool = False  # on the subscriptions' own connection (``Consumer``), not pika's


def refusal_reason(reply_code: int, reply_text: str) -> Reason:
    """The MQRC reason of a channel error the broker closed a publish (or declare) with."""
    if reply_code == 404:
        return MQRC_UNKNOWN_OBJECT_NAME
    if reply_code == 403:
        return MQRC_NOT_AUTHORIZED
    if reply_code == 406 and "max size" in reply_text:  # "message size N is larger than max size M"
        return MQRC_MSG_TOO_BIG_FOR_Q
    return MQRC_UNEXPECTED_ERROR


def parameters(ep: Endpoint, heartbeat: int, blocked_timeout: float) -> pika.ConnectionParameters:
    params = pika.ConnectionParameters(
        host=ep.host,
        port=ep.port,
        virtual_host=ep.vhost or "/",
        credentials=pika.PlainCredentials(ep.user or "guest", ep.password or "guest"),
        heartbeat=heartbeat,
        connection_attempts=1,
        socket_timeout=5.0,
        blocked_connection_timeout=blocked_timeout,
        client_properties={"connection_name": "jms-bridge staging"},
    )
    if ep.tls:
        params.ssl_options = _tls(ep)
    return params


def _tls(ep: Endpoint) -> pika.SSLOptions:
    """amqps://: TLS 1.2 or later, the broker's certificate verified against the named CA file
    (else the system's) and its host name checked."""
    ctx = ssl.create_default_context(cafile=ep.ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return pika.SSLOptions(ctx, server_hostname=ep.host)


class Connection:
    """The connection and its channels; the state is ``RabbitMQ.__init__``'s."""

    name: str
    endpoint: Endpoint
    _nodes: list[pika.ConnectionParameters]
    _params: pika.ConnectionParameters
    _attempts: int
    _retry_wait: float
    _conn: pika.BlockingConnection | None
    _main: BlockingChannel | None
    _subs: dict[str, BlockingChannel]
    _confirm: BlockingChannel | None
    _scratch: BlockingChannel | None
    _publisher: Publisher | None
    _consumer: Consumer | None
    _listening: BlockingChannel | None
    _peeker: BlockingChannel | None
    _peek_generation: int
    _generation: int
    _declared: set[str]
    _delivered: list[Held]
    _holding: dict[str, dict[int, None]]
    _peek_holding: dict[int, str]
    _log: FilteringBoundLogger

    def connect(self) -> None:
        """Open the connection (``connect_attempts`` tries); BrokerUnavailable names the address."""
        if self._conn is not None and self._conn.is_open:
            return
        connect_with_retries(self._connect_once, self._attempts, self._retry_wait)

    def _connect_once(self) -> None:
        """The node that answered last first, then the others in turn (a cluster's)."""
        if self._publisher is not None:  # to follow ``main`` to the node it reaches
            self._publisher.close()
            self._publisher = None
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        at = self._nodes.index(self._params)
        failed: BaseException | None = None
        for params in self._nodes[at:] + self._nodes[:at]:
            try:
                conn = pika.BlockingConnection(params)
            except (pika.exceptions.AMQPError, OSError) as exc:
                failed = exc
                continue
            self._conn, self._params = conn, params
            break
        else:
            assert failed is not None
            with self._translate(fatal=True):
                raise failed
        with self._translate(fatal=True):
            assert self._conn is not None
            self._main = self._conn.channel()
        self._generation += 1
        self._declared.clear()
        self._delivered.clear()
        self._subs.clear()
        self._holding.clear()
        self._peek_holding.clear()
        self._log.debug("connected")

    def close(self) -> None:
        """Close the connection; the broker returns everything held to its queue."""
        conn, self._conn = self._conn, None
        self._main = self._confirm = self._scratch = self._listening = None
        self._peeker = None
        self._subs.clear()
        publisher, self._publisher = self._publisher, None
        if publisher is not None:
            publisher.close()
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()
        self._delivered.clear()
        self._holding.clear()
        self._peek_holding.clear()
        if conn is not None and conn.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                conn.close()

    @contextlib.contextmanager
    def _translate(self, *, fatal: bool = False) -> Iterator[None]:
        """The one place pika's and the socket's errors become BrokerUnavailable."""
        try:
            yield
        except (pika.exceptions.AMQPError, OSError) as exc:
            lost = fatal or self._conn is None or not self._conn.is_open or not self._main_open()
            if lost:
                self.close()
            else:
                self._drop_side_channels()
            self._log.debug("broker error", error=describe(exc), connection_lost=lost)
            refused = isinstance(exc, pika.exceptions.ProbableAuthenticationError |
                                 pika.exceptions.ProbableAccessDeniedError)
            raise BrokerUnavailable(f"{self._where()}: {describe(exc)}",
                                    MQRC_NOT_AUTHORIZED if refused else MQRC_HOST_NOT_AVAILABLE,
                                    ) from exc

    def _where(self) -> str:
        return f"{self.name} AMQP at {self.endpoint}"

    def _main_open(self) -> bool:
        """``main`` and every subscription's channel open."""
        return (self._main is not None and self._main.is_open
                and all(ch.is_open for ch in self._subs.values()))

    def _drop_side_channels(self) -> None:
        for attr in ("_confirm", "_scratch", "_listening", "_peeker"):
            ch: BlockingChannel | None = getattr(self, attr)
            if ch is not None and not ch.is_open:
                setattr(self, attr, None)

    def _channel(self) -> BlockingChannel:
        if self._conn is None or not self._conn.is_open or not self._main_open():
            self.close()
            raise BrokerUnavailable(f"{self._where()}: not connected")
        assert self._main is not None
        return self._main

    def _confirm_channel(self) -> BlockingChannel:
        self._channel()
        if self._confirm is None or not self._confirm.is_open:
            assert self._conn is not None
            with self._translate():
                ch = self._conn.channel()
                ch.confirm_delivery()
            self._confirm = ch
        return self._confirm

    def _transactions(self) -> Publisher:
        """The connection that puts a batch in one transaction (a round trip, the commit,
        instead of one confirm each), to the node ``main``'s connection reached."""
        self._channel()
        if self._publisher is None:
            self._publisher = Publisher(self._params, self._where(), self._log)
        return self._publisher

    def _subscriptions(self) -> Consumer:
        """The connection the subscriptions to staging queues are consumed on, to the node
        ``main``'s connection reached."""
        self._channel()
        if self._consumer is None:
            self._consumer = Consumer(self._params, self._where(), self._log)
        return self._consumer

    def _consumer_channel(self, queue: str, prefetch: int) -> BlockingChannel:
        """The channel of the subscription to ``queue``, opened with its prefetch."""
        self._channel()
        ch = self._subs.get(queue)
        if ch is None:
            assert self._conn is not None
            with self._translate():
                ch = self._conn.channel()
                ch.basic_qos(prefetch_count=prefetch)
            self._subs[queue] = ch
        return ch

    def _scratch_channel(self) -> BlockingChannel:
        self._channel()
        if self._scratch is None or not self._scratch.is_open:
            assert self._conn is not None
            with self._translate():
                self._scratch = self._conn.channel()
        return self._scratch

    # -- held messages' channels ---------------------------------------------------------------

    def _live(self, tag: Tag) -> bool:
        """Whether the channel that delivered ``tag`` is still the one open."""
        if tag.peeked:
            return (tag.generation == self._peek_generation and self._peeker is not None
                    and self._peeker.is_open)
        if tag.own:
            return (tag.generation == self._generation and self._consumer is not None
                    and self._consumer.open)
        return tag.generation == self._generation

    def _settle_one(self, tag: Tag, *, requeue: bool = False) -> None:
        """Ack ``tag`` (it is live), or put it back on its queue (``requeue``)."""
        if tag.own:
            self._forget_own(tag)
            with self._ended_consumer():
                assert self._consumer is not None
                if requeue:
                    self._consumer.settle(requeue=[(tag.queue, tag.delivery_tag)])
                else:
                    self._consumer.settle([(tag.queue, tag.delivery_tag, False)])
            return
        ch = self._ack_channel(tag)
        with self._translate():
            if requeue:
                ch.basic_nack(tag.delivery_tag, multiple=False, requeue=True)
            else:
                ch.basic_ack(tag.delivery_tag, multiple=False)

    def _forget_own(self, tag: Tag) -> None:
        self._holding.get(tag.queue, {}).pop(tag.delivery_tag, None)

    @contextlib.contextmanager
    def _ended_consumer(self) -> Iterator[None]:
        """The subscriptions' connection ended: so does the adapter's (everything it holds is
        back on its queue), to be connected and subscribed again."""
        try:
            yield
        except BrokerUnavailable:
            self.close()
            raise

    def _ack_channel(self, tag: Tag) -> BlockingChannel:
        """The channel to settle ``tag`` on (it is live), and forget it there."""
        if tag.peeked:
            self._peek_holding.pop(tag.delivery_tag, None)
            assert self._peeker is not None
            return self._peeker
        self._holding.get(tag.queue, {}).pop(tag.delivery_tag, None)
        self._channel()
        return self._subs[tag.queue]

    def _ack_all(self, tags: Iterable[Tag]) -> None:
        """Ack ``tags`` (each live). pika's BlockingChannel writes each ack on its own, so on
        each channel the run of its oldest held tags that are all acked here goes in one
        ``basic_ack(multiple=True)``, the rest one by one."""
        acking: dict[str | None, set[int]] = {}  # a subscription's queue, None: peeked
        own: dict[str, set[int]] = {}
        for tag in tags:
            if tag.own:
                own.setdefault(tag.queue, set()).add(tag.delivery_tag)
            else:
                acking.setdefault(None if tag.peeked else tag.queue, set()).add(
                    tag.delivery_tag)
        self._channel()
        if own:
            self._ack_own(own)
        with self._translate():
            for queue, mine in acking.items():
                holding: dict[int, Any] = (self._peek_holding if queue is None
                                           else self._holding.get(queue, {}))
                ch = self._peeker if queue is None else self._subs.get(queue)
                assert ch is not None
                for delivery_tag, multiple in _acks(holding, mine):
                    ch.basic_ack(delivery_tag, multiple=multiple)

    def _ack_own(self, acking: dict[str, set[int]]) -> None:
        """Ack deliveries of the subscriptions' own connection, all in one write, each
        subscription's on its own channel."""
        acks = [(queue, delivery_tag, multiple) for queue, mine in acking.items()
                for delivery_tag, multiple in _acks(self._holding.get(queue, {}), mine)]
        with self._ended_consumer():
            assert self._consumer is not None
            self._consumer.settle(acks)

    @staticmethod
    def _tag(held: Held) -> Tag:
        if not isinstance(held.token, Tag):
            raise TypeError("not a message held by a RabbitMQ adapter")
        return held.token


def _acks(holding: dict[int, Any], mine: set[int]) -> list[tuple[int, bool]]:
    """The acks ((delivery tag, multiple) each) of the tags ``mine`` of one channel, which
    ``holding`` holds in the order delivered (they are forgotten there): the run of the oldest
    held that are all in ``mine`` in one multiple ack, the rest one each."""
    run: list[int] = []
    for delivery_tag in holding:
        if delivery_tag not in mine:
            break
        run.append(delivery_tag)
    acks = [(run[-1], True)] if run else []
    for delivery_tag in run:
        del holding[delivery_tag]
    rest = sorted(mine.difference(run))
    for delivery_tag in rest:
        holding.pop(delivery_tag, None)
    return acks + [(delivery_tag, False) for delivery_tag in rest]


def close_quietly(ch: BlockingChannel) -> None:
    with contextlib.suppress(pika.exceptions.AMQPError, OSError):
        if ch.is_open:
            ch.close()


def describe(exc: BaseException) -> str:
    """One line for a pika error, naming the innermost cause (pika nests them in args)."""
    inner: BaseException = exc
    for _ in range(5):
        nested = getattr(inner, "exception", None)
        if not isinstance(nested, BaseException) and inner.args:
            nested = inner.args[0] if isinstance(inner.args[0], BaseException) else None
        if nested is None:
            break
        inner = nested
    text = str(inner) or repr(inner)
    if isinstance(inner, pika.exceptions.ChannelClosed | pika.exceptions.ConnectionClosed):
        text = f"({inner.reply_code}) {inner.reply_text}"
    return f"{type(inner).__name__}: {text}"

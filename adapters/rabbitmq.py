"""RabbitMQ through pika (AMQP 0-9-1, publisher confirms), speaking STOMP-shaped messages.

Headers are mapped to and from AMQP properties as RabbitMQ's STOMP plugin does it
(``adapters.rabbitmq_stomp``). The connection, its channels and the translation of pika's errors
are ``adapters.rabbitmq_connection``'s; settling and publishing ``adapters.rabbitmq_puts``'s (a
batch's puts in one transaction through ``adapters.rabbitmq_client``, whose own connection
also carries the subscriptions to staging queues: their deliveries read without pika's work on
each frame, their acks written without a round trip); ``check_put`` (the
management API) ``adapters.rabbitmq_checks``'s; the messages RabbitMQ expires
(``watch_expiries``) ``adapters.rabbitmq_expiry``'s.

Nothing is held longer than the caller holds it: mind RabbitMQ's consumer_timeout (30 min).
``poll`` or any other call keeps pika's heart-beats going; call one at least every ``heartbeat``
seconds.
"""

from __future__ import annotations

import functools
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pika
import pika.exceptions
import structlog
from pamqp import exceptions as pexceptions
from pika.adapters.blocking_connection import BlockingChannel

from adapters.amqp_events import Delivery
from adapters.amqp_properties import read_values
from adapters.base import Held, Message, StagedFormat
from adapters.rabbitmq_checks import Checks
from adapters.rabbitmq_client import Consumer, Publisher
from adapters.rabbitmq_connection import Tag, close_quietly, parameters, refusal_reason
from adapters.rabbitmq_expiry import Expiries
from adapters.rabbitmq_puts import Puts
from adapters.rabbitmq_stomp import escape_queue, headers_of, stomp_headers
from policies.endpoints import Endpoint
from policies.errors import BrokerUnavailable, Refused, StagingQueueMismatch

# The staging queues' type (--staging-queue-type). Classic ones are declared lazy and of classic
# queue version 2 (CLASSIC_ARGUMENTS): RabbitMQ 3.10 and 3.11 then keep a staged copy on disk,
# not on the queue process's heap, and take one for about a plain message's CPU (held in memory
# a staged copy costs it more, with confirm gaps that leave a core idle: docs/benchmarks.md,
# "Staging queues lazy and of version 2"). RabbitMQ 3.12 and
# later ignore the mode (their classic queues keep messages on disk already), and from 3.13
# version 2 is the default. A classic staging queue an earlier bridge declared with no arguments
# is used as it is (RabbitMQ will not declare it again with others; a policy can give it them).
# Quorum queues (replicated with Raft, RabbitMQ 3.8+) keep a
# message given back (basic.nack with requeue, or a channel closed while it was held) at its old
# place only when they have a delivery limit: without one, RabbitMQ 3.10 enqueues it again at the
# back, and a level queue given back its head (the engine peeks the long levels, and a lost
# connection gives back every prefetched message) would no longer be in exit order. So they get
# a limit no message ever reaches (a head peeked every second for the longest dwell, 49.7 days,
# is given back about 4.3 million times). They add an ``x-delivery-count`` header to every
# delivery; the adapter drops it (it is the broker's, not the application's).
QUEUE_TYPES = ("classic", "quorum")
# While the subscriptions' connection is waited on, pika's is read this often (the control
# topic's orders come there).
PIKA_EVERY_S = 0.05
# What reading a delivery's properties off the wire may raise, for bytes that are not any.
_UNDECODABLE = (IndexError, ValueError, struct.error, pexceptions.PAMQPException)
QUORUM_DELIVERY_LIMIT = 2_000_000_000
QUORUM_ARGUMENTS: dict[str, Any] = {
    "x-queue-type": "quorum", "x-delivery-limit": QUORUM_DELIVERY_LIMIT,
}
CLASSIC_ARGUMENTS: dict[str, Any] = {"x-queue-mode": "lazy", "x-queue-version": 2}
DELIVERY_COUNT = "x-delivery-count"

# ``/amq/queue/<queue>``: a client SEND there does not declare the queue again. RabbitMQ maps
# ``amqp-message-id`` to the AMQP message-id property (and refuses ``message-id``); its AMQP side
# carries these headers as short strings: it stores a longer one, then closes every AMQP
# connection it tries to deliver the message to (content_properties_shortstr_overflow).
FORMAT = StagedFormat(
    broker="rabbitmq",
    staging_destination="/amq/queue/{}",
    message_id_header="amqp-message-id",
    short_string_headers=("amqp-message-id", "correlation-id", "reply-to", "content-type",
                          "content-encoding", "type", "user-id", "app-id", "expiration"),
    temporary_prefixes=("/temp-queue/", "/temp-topic/", "/reply-queue/"),
    second_levels=True,
    peek_advances=True,
    escape=escape_queue,
)


class RabbitMQ(Puts, Checks, Expiries):
    """The staging interface on RabbitMQ through one pika BlockingConnection."""

    name = "rabbitmq"
    format = FORMAT
    sees_held = False

    def __init__(
        self,
        amqp: Endpoint,
        *,
        heartbeat: int = 30,
        connect_attempts: int = 1,
        retry_wait: float = 0.2,
        blocked_timeout: float = 30.0,
        management: Endpoint | None = None,
        http_timeout: float = 5.0,
        queue_type: str = "classic",
        expiry_policy: str | None = None,
    ) -> None:
        """``expiry_policy``: a pattern of the queues whose expired messages a policy the
        bridge applies brings to ``watch_expiries`` (``adapters.rabbitmq_expiry``); None:
        none applied."""
        if queue_type not in QUEUE_TYPES:
            raise ValueError(f"queue_type: expected one of {', '.join(QUEUE_TYPES)}, "
                             f"got {queue_type!r}")
        self.endpoint = amqp
        self.queue_type = queue_type
        self._quorum = queue_type == "quorum"
        self._told_as_it_is = False  # (the warning for queues an earlier bridge declared)
        self._management = management
        self._expiry_policy = expiry_policy
        self._http_timeout = http_timeout
        # One set for each node (the endpoint's alternates: a cluster's other nodes), tried in
        # turn from the one that answered last.
        self._nodes = [parameters(ep, heartbeat, blocked_timeout) for ep in amqp.every()]
        self._params = self._nodes[0]
        self._attempts = connect_attempts
        self._retry_wait = retry_wait
        self._conn: pika.BlockingConnection | None = None
        self._main: BlockingChannel | None = None
        self._subs: dict[str, BlockingChannel] = {}  # a subscription's queue -> its channel
        self._confirm: BlockingChannel | None = None
        self._scratch: BlockingChannel | None = None
        self._publisher: Publisher | None = None  # batches in one transaction
        self._consumer: Consumer | None = None  # the subscriptions to staging queues
        self._listening: BlockingChannel | None = None  # listen's subscriptions
        # Peeks (basic.get) go on a channel of their own: on a subscription's channel a get
        # waits in the broker's channel process behind every ack and delivery there, seconds
        # when a burst of releases has just been acked (a peek of an empty level took 9.5 s).
        self._peeker: BlockingChannel | None = None
        self._peek_generation = 0
        self._generation = 0
        self._declared: set[str] = set()
        # Queues that refused a publish lately (full: a nack): settles that put to one go one
        # move at a time, never in a transaction, whose failure ("partial tx completion") would
        # not say which of its puts went through (retrying all of them would duplicate).
        self._refusing: dict[str, float] = {}
        self._delivered: list[Held] = []
        # A subscription's queue -> the delivery tags it holds on its channel, in their order.
        self._holding: dict[str, dict[int, None]] = {}
        self._peek_holding: dict[int, str] = {}  # delivery tag on the peek channel -> its queue
        self._log = structlog.get_logger("adapters.rabbitmq").bind(
            broker=self.name, address=str(amqp))

    # -- queues --------------------------------------------------------------------------------

    def ensure_queues(self, names: Sequence[str]) -> None:
        """Declare durable queues of ``queue_type``: classic ones with CLASSIC_ARGUMENTS (or, one
        an earlier bridge declared with none, as it is), quorum ones with QUORUM_ARGUMENTS.
        StagingQueueMismatch names a queue the broker already has with other arguments (of the
        other type, most often), which it refuses to declare again."""
        arguments = QUORUM_ARGUMENTS if self._quorum else CLASSIC_ARGUMENTS
        for name in names:
            said = self._declare(name, arguments)
            if said is not None and not self._quorum and self._declare(name, None) is None:
                said = None  # an earlier bridge's classic queue: used as it is
                if not self._told_as_it_is:
                    self._told_as_it_is = True
                    self._log.warning(
                        "classic staging queues declared with no arguments by an earlier "
                        "bridge: used as they are; on RabbitMQ 3.10 and 3.11 a policy makes them "
                        "lazy and of version 2, which holds staged copies for less of the "
                        "broker's memory and CPU (docs/delivery-delay.md, \"How a delayed "
                        "message waits\")", queue=name)
            if said is not None:
                raise StagingQueueMismatch(
                    f"{self._where()}: staging queue {name!r} exists already and is not what "
                    f"--staging-queue-type {self.queue_type} declares (the broker said: "
                    f"{said}). Give this bridge another "
                    "--staging-prefix, or drain the old staging queues (stop the bridges, "
                    "move their messages) and delete them; see docs/delivery-delay.md, "
                    "\"Staging that survives the loss of a node\""
                )
            self._declared.add(name)

    def _declare(self, name: str, arguments: dict[str, Any] | None) -> str | None:
        """Declare ``name`` durable with ``arguments``: None when done, what the broker said
        when it has the queue with other arguments (its 406 closes only the scratch channel)."""
        ch = self._scratch_channel()
        try:
            with self._translate():
                ch.queue_declare(name, durable=True, arguments=arguments)
        except BrokerUnavailable as exc:
            cause = exc.__cause__
            if not (isinstance(cause, pika.exceptions.ChannelClosedByBroker)
                    and cause.reply_code == 406 and self._main_open()):
                raise
            return f"({cause.reply_code}) {cause.reply_text}"
        return None

    def depth(self, queue: str) -> int:
        """A passive queue.declare's message count (ready messages) plus those this adapter
        holds unacked; messages other connections hold are not counted. 0 for a queue the
        broker does not have (its 404 closes only the scratch channel)."""
        ok = self._declared_ok(queue)
        ready = 0 if ok is None else ok.method.message_count or 0
        return ready + len(self._holding.get(queue, ())) + sum(
            1 for q in self._peek_holding.values() if q == queue)

    def consumers(self, queue: str) -> int:
        """A passive queue.declare's consumer count."""
        ok = self._declared_ok(queue)
        return 0 if ok is None else ok.method.consumer_count or 0

    def _declared_ok(self, queue: str) -> Any:
        """A passive queue.declare's answer; None for a queue the broker does not have (one
        whose name is longer than AMQP's 255 bytes cannot be there, and pika cannot ask)."""
        if len(queue) > 63 and len(queue.encode()) > 255:
            return None
        ch = self._scratch_channel()
        try:
            with self._translate():
                return ch.queue_declare(queue, passive=True)
        except BrokerUnavailable as exc:
            cause = exc.__cause__
            missing = isinstance(cause, pika.exceptions.ChannelClosedByBroker) and (
                cause.reply_code == 404
            )
            if not missing or not self._main_open():
                raise
            return None

    def depths(
        self, queues: Sequence[str], *, wait_s: float | None = None
    ) -> dict[str, int]:
        """One passive queue.declare each: a round trip of a fraction of a millisecond, so
        ``wait_s`` is not needed."""
        return {queue: self.depth(queue) for queue in queues}

    # -- holding -------------------------------------------------------------------------------

    def peek(self, queue: str) -> Held | None:
        """basic.get without ack; each peek holds the next message (RabbitMQ has no 'same head')."""
        got = self._get(self._peek_channel(), queue)
        if got is None:
            return None
        tag, props, body = got
        self._peek_holding[tag] = queue
        return Held(queue, self._message(props, body), Tag(self._peek_generation, tag, True))

    def _peek_channel(self) -> BlockingChannel:
        """The peek channel, opened again (a new generation) when it was closed: what it held
        is back on its queues then."""
        self._channel()
        if self._peeker is None or not self._peeker.is_open:
            assert self._conn is not None
            with self._translate():
                self._peeker = self._conn.channel()
            self._peek_generation += 1
            self._peek_holding.clear()
        return self._peeker
    def _get(
        self, ch: BlockingChannel, queue: str
    ) -> tuple[int, pika.BasicProperties, bytes] | None:
        """basic.get without ack: (delivery tag, properties, body), None when empty."""
        with self._translate():
            method, props, body = ch.basic_get(queue, auto_ack=False)
        if method is None or method.delivery_tag is None:
            return None
        data = body if isinstance(body, bytes) else (body or "").encode()
        return method.delivery_tag, props or pika.BasicProperties(), data

    def _message(self, props: pika.BasicProperties, body: bytes) -> Message:
        """A message read from a queue, without the header a quorum queue adds to it."""
        headers = stomp_headers(props)
        if self._quorum:
            headers.pop(DELIVERY_COUNT, None)
        return Message(headers, body)

    def put_back(self, held: Held) -> None:
        """basic.nack with requeue: a classic queue puts it back at its old position, the head."""
        tag = self._tag(held)
        if not self._live(tag):
            return  # its channel is gone, so the broker has put it back already
        self._settle_one(tag, requeue=True)

    def subscribe(self, queue: str, prefetch: int) -> None:
        """Consume ``queue`` on the subscriptions' own connection, ``prefetch`` unacked at
        most."""
        with self._ended_consumer():
            self._subscriptions().subscribe(queue, prefetch)

    def _read_own(self, wait_s: float) -> None:
        """The subscriptions' deliveries that have come (up to ``wait_s`` for the first), as
        held messages. Their properties are read off the wire as the AMQP front-end reads
        them; a delivery whose properties do not decode ends the connection."""
        consumer = self._consumer
        assert consumer is not None
        with self._ended_consumer():
            self._take_own(consumer, consumer.read(wait_s))

    def _take_own(self, consumer: Consumer, deliveries: list[Delivery]) -> None:
        """The subscriptions' deliveries as held messages. BrokerUnavailable for one whose
        properties do not decode (the subscriptions' connection is ended)."""
        for d in deliveries:
            queue = consumer.queues.get(d.consumer_tag or "", "")
            try:
                headers = headers_of(read_values(d.properties, 0))
            except _UNDECODABLE as bad:
                consumer.close()
                raise BrokerUnavailable(f"{self._where()}: a delivery from {queue} whose "
                                        f"properties do not decode ({bad!r})") from None
            if self._quorum:
                headers.pop(DELIVERY_COUNT, None)
            self._holding.setdefault(queue, {})[d.delivery_tag] = None
            self._delivered.append(Held(queue, Message(headers, d.body), Tag(
                self._generation, d.delivery_tag, queue=queue, own=True)))

    def listen(self, topic: str) -> None:
        """A server-named exclusive queue bound to ``amq.topic`` with ``topic`` as its key (what
        the STOMP plugin does for a SUBSCRIBE to ``/topic/<topic>``), consumed with automatic
        acks on a channel of its own: a refusal closes only that channel."""
        self._channel()
        assert self._conn is not None
        with self._translate():
            if self._listening is None or not self._listening.is_open:
                self._listening = self._conn.channel()
            ch = self._listening
        try:
            ok = ch.queue_declare("", exclusive=True, auto_delete=True)
            name = ok.method.queue or ""
            ch.queue_bind(name, "amq.topic", routing_key=topic)
            ch.basic_consume(name, functools.partial(self._on_heard, topic), auto_ack=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if self._conn is None or not self._conn.is_open or not self._main_open():
                with self._translate():
                    raise
            self._listening = None
            raise Refused(
                refusal_reason(exc.reply_code, exc.reply_text),
                f"subscribing to /topic/{topic}: ({exc.reply_code}) {exc.reply_text}",
            ) from None
        except (pika.exceptions.AMQPError, OSError):
            with self._translate():
                raise

    def _on_heard(
        self,
        topic: str,
        _ch: BlockingChannel,
        _method: pika.spec.Basic.Deliver,
        props: pika.BasicProperties,
        body: bytes,
    ) -> None:
        self._delivered.append(Held(topic, Message(stomp_headers(props), body), None))

    def poll(self, timeout: float) -> list[Held]:
        """Deliveries since the last call; waits up to ``timeout`` s for the first. With
        subscriptions, the wait is on their connection, and pika's (the control topic's
        orders, heart-beats) is read at least every PIKA_EVERY_S."""
        self._channel()
        conn = self._conn
        assert conn is not None
        with self._translate():
            conn.process_data_events(time_limit=0)
        if self._consumer is None:
            if not self._delivered and timeout > 0:
                with self._translate():
                    # pika takes float seconds (types-pika 1.2 says int)
                    conn.process_data_events(time_limit=timeout)  # type: ignore[arg-type]
        else:
            deadline = time.monotonic() + timeout
            self._read_own(0.0)
            while not self._delivered and (left := deadline - time.monotonic()) > 0:
                self._read_own(min(left, PIKA_EVERY_S))
                with self._translate():
                    conn.process_data_events(time_limit=0)
        out, self._delivered = self._delivered, []
        return out

    # -- tools ---------------------------------------------------------------------------------

    def browse(self, queue: str) -> Iterator[Message]:
        """Gets every ready message on a channel of its own and closes it, so all return to
        their places. Messages held unacked (by anyone, this adapter included) are not seen."""
        ch, count = self._tool_channel(queue)
        try:
            for _ in range(count):
                got = self._get(ch, queue)
                if got is None:
                    return
                yield self._message(got[1], got[2])
        finally:
            close_quietly(ch)

    def take(
        self, queue: str, header: str, value: str, then: Callable[[Message], None] | None = None
    ) -> Message | None:
        """Gets through ``queue`` on a channel of its own, acks the first match (after
        ``then``) and closes the channel, which returns every other message to its place."""
        ch, count = self._tool_channel(queue)
        try:
            for _ in range(count):
                got = self._get(ch, queue)
                if got is None:
                    return None
                tag, props, body = got
                message = self._message(props, body)
                if message.headers.get(header) == value:
                    if then is not None:
                        then(message)
                    with self._translate():
                        ch.basic_ack(tag)
                    return message
            return None
        finally:
            close_quietly(ch)

    def _tool_channel(self, queue: str) -> tuple[BlockingChannel, int]:
        self._channel()
        assert self._conn is not None
        with self._translate():
            ch = self._conn.channel()
        try:
            ok = ch.queue_declare(queue, passive=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code != 404:
                with self._translate():
                    raise
            return ch, 0  # no such queue holds nothing (the broker closed this channel)
        except (pika.exceptions.AMQPError, OSError):
            with self._translate():
                raise
        return ch, ok.method.message_count or 0

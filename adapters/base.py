"""The one interface the staging engine and the tools use to talk to a broker.

Implementations: ``adapters.rabbitmq`` (pika, AMQP 0-9-1) and ``adapters.activemq`` (stomp.py,
STOMP). Both are blocking and single-threaded: one adapter object per thread. Every error of the
underlying library is translated into ``policies.errors.BrokerUnavailable`` inside the adapter.

Messages cross this interface as STOMP-shaped values, ``headers`` named as a STOMP client would
see them, so that a message put by the engine is the message a STOMP client sent: an adapter that
speaks another protocol maps properties to and from STOMP headers the way the broker's own STOMP
support does.

Delivery contract (what makes staging crash-safe):
- ``peek`` and ``poll`` hand out ``Held`` messages: delivered, not yet acknowledged. A held message
  that the adapter's connection loses goes back to its queue (the broker redelivers it).
- ``settle`` publishes each replacement and waits for the broker to confirm it BEFORE it
  acknowledges the held original. A crash between the two duplicates a message; it never loses one.
- A broker that refuses one message (no such queue or exchange, not authorized, queue full,
  message too big) is not an outage: ``settle`` raises ``policies.errors.PutRefused`` naming that
  move and the MQRC reason, with the connection and everything still held intact.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import tenacity

from policies.errors import BrokerUnavailable, Refused

# Headers that belong to one delivery, not to the message: never part of ``Message.headers``.
PER_DELIVERY = frozenset(
    {"message-id", "subscription", "ack", "destination", "redelivered", "content-length"}
)


def connect_with_retries(connect_once: Callable[[], None], attempts: int, wait_s: float) -> None:
    """Call ``connect_once`` up to ``attempts`` times while it raises BrokerUnavailable; the
    last BrokerUnavailable (naming broker and address) is raised as it is."""
    tenacity.Retrying(
        stop=tenacity.stop_after_attempt(max(attempts, 1)),
        wait=tenacity.wait_fixed(wait_s),
        retry=tenacity.retry_if_exception_type(BrokerUnavailable),
        reraise=True,
    )(connect_once)


@dataclass(slots=True)
class Message:
    """A message as a STOMP client sees it: header name -> value (first wins), and the body."""

    headers: dict[str, str]
    body: bytes


@dataclass(slots=True)
class Held:
    """A message delivered to us and not yet acknowledged."""

    queue: str
    message: Message
    token: object = field(repr=False)  # adapter-specific: delivery tag, ack id, ...


@dataclass(slots=True)
class Move:
    """Settle one held message: put ``message`` to ``destination`` (if any), then ack ``held``."""

    held: Held
    destination: str | None = None  # a STOMP destination ("/queue/a", "/topic/b", ...)
    message: Message | None = None
    # An exchange that routes the message to no queue refuses it (a delayed-message
    # exchange's release), as a queue that is not there does.
    mandatory: bool = False


@dataclass(frozen=True, slots=True)
class StagedFormat:
    """What a staged copy and the staging layout look like on one broker: stated by its adapter,
    read by the interception core, the staging engine and the tools (no table keyed by the
    broker's name anywhere else)."""

    broker: str  # "rabbitmq" | "activemq"
    # The STOMP destination a client connection sends to for staging queue ``{}``.
    staging_destination: str
    # The STOMP header that carries a message id a producer may set; None when the broker
    # always assigns its own (the original id then travels in the bridge's own header only).
    message_id_header: str | None
    # Headers the broker takes at any length over STOMP but stores where a longer value makes
    # the message undeliverable (RabbitMQ's AMQP short strings), and their limit in bytes.
    short_string_headers: tuple[str, ...] = ()
    short_string_bytes: int = 255
    # Destinations whose messages cannot wait on a shared staging queue and come back.
    temporary_prefixes: tuple[str, ...] = ("/temp-queue/", "/temp-topic/")
    # A level for every whole second below 16 s (see ``bridge.staging.levels``).
    second_levels: bool = False
    # Whether a second ``peek`` of a queue whose head is held gives the next message.
    peek_advances: bool = True
    # Escapes a queue name for ``staging_destination``.
    escape: Callable[[str], str] = field(default=lambda name: name, repr=False)

    def client_destination(self, queue: str) -> str:
        return self.staging_destination.format(self.escape(queue))


@dataclass(frozen=True, slots=True)
class PutCheck:
    """What the broker lets us see, before a put, of whether it would take the message."""

    refused: Refused | None = None  # it would not, and why
    max_body_bytes: int | None = None  # it refuses a larger body (MQRC_MSG_TOO_BIG_FOR_Q)
    changing: bool = False  # the answer depends on how full the target is now: ask again soon
    # The target is a delayed-message exchange (``adapters.rabbitmq_delayed``): a delayed
    # message to it is released mandatory and carries the plugin's ``x-delay`` back.
    delayed_exchange: bool = False


@dataclass(frozen=True, slots=True)
class BrokerExpiry:
    """A message the broker expired on one of its own queues, as its dead letter tells it."""

    destination: str  # where it expired, as a STOMP destination
    expired_ms: int  # when it expired (epoch ms), as near as the broker says
    message: Message  # the application's message, without the broker's dead-letter headers
    message_id: str | None = None  # its own id, where the broker keeps it


class StagingBroker(Protocol):
    name: str  # "rabbitmq" | "activemq"
    format: StagedFormat  # what staged copies look like on this broker
    # Whether ``browse`` shows the messages consumers hold (ActiveMQ), or only the others
    # (RabbitMQ: a get does not see unacknowledged messages).
    sees_held: bool

    def connect(self) -> None:
        """Open the connection; raise BrokerUnavailable naming the broker and address."""

    def close(self) -> None:
        """Close; everything still held goes back to its queue."""

    def ensure_queues(self, names: Sequence[str]) -> None:
        """Create these durable queues if they do not exist."""

    def peek(self, queue: str) -> Held | None:
        """The message at the head of ``queue``, held; None when the queue is empty.

        Repeated peeks of a queue whose head is held and not yet put back return the same head
        (ActiveMQ) or the next message (RabbitMQ); callers put back or settle before peeking again.
        """

    def put_back(self, held: Held) -> None:
        """Give up a held message unchanged; it stays (or returns to) the head of its queue."""

    def subscribe(self, queue: str, prefetch: int) -> None:
        """Start receiving ``queue``'s messages into ``poll``, at most ``prefetch`` held at once."""

    def listen(self, topic: str) -> None:
        """Start receiving what is published to ``topic`` (a topic name: ``/topic/<topic>``)
        from now on into ``poll``, as Held messages whose ``queue`` is ``topic`` and whose
        ``token`` is None: acknowledged on delivery, never settled or put back. The
        subscription is this connection's own and goes with it. Refused when the broker does
        not let this user subscribe (the connection stays usable)."""

    def watch_expiries(self, queue: str) -> str | None:
        """Start receiving into ``poll`` the messages this broker expires on its own queues and
        dead-letters where the bridge can take them (RabbitMQ: a dead-letter exchange and queue
        named ``queue``; ActiveMQ: its dead-letter queue, only the expired messages that asked
        to be kept), to be acknowledged by ``settle`` like a subscription's. Returns the
        ``Held.queue`` of these deliveries; None when this adapter is set to take none."""

    def expiry_of(self, message: Message) -> BrokerExpiry | None:
        """What a delivery of ``watch_expiries`` was: None when the broker dead-lettered it
        for another reason than its expiry (nothing the bridge keeps)."""

    def poll(self, timeout: float) -> list[Held]:
        """Messages delivered by subscriptions since the last call; waits up to ``timeout``
        seconds for the first one. Also services the connection (heart-beats)."""

    def settle(self, moves: Sequence[Move]) -> None:
        """For each move: publish its message (confirmed), then acknowledge its held message.

        On BrokerUnavailable some prefix of the moves may have been done; nothing was
        acknowledged whose replacement was not confirmed.

        On PutRefused(index, reason, text) the broker refused to put ``moves[index]``'s message:
        ``moves[:index]`` are done (published and acknowledged), ``moves[index:]`` are not and
        their messages are still held by this adapter (RabbitMQ: only the publishing channel was
        closed, and is reopened), except the moves after ``index`` listed in its ``also_done``,
        which are done too (ActiveMQ: every SEND has its own receipt, and only the refused ones
        are not acknowledged)."""

    def depth(self, queue: str) -> int:
        """How many messages ``queue`` has, those held by consumers (this adapter included)
        counted, 0 when the broker has no such queue; cheap (no browsing). BrokerUnavailable
        when the broker cannot say."""

    def consumers(self, queue: str) -> int:
        """How many consumers ``queue`` has now, 0 when the broker has no such queue.
        BrokerUnavailable when the broker cannot say."""

    def depths(
        self, queues: Sequence[str], *, wait_s: float | None = None
    ) -> dict[str, int]:
        """``depth`` of each of ``queues`` (0 for one the broker does not have), asked at once
        where the broker allows. BrokerUnavailable when the broker cannot say within ``wait_s``
        (None: the adapter's own patience, which a loaded broker is given). The staging engine
        counts its pending messages this way while releases wait, so it passes a short
        ``wait_s``; an adapter whose answer is a local round trip may ignore it."""

    def publish(self, destination: str, message: Message, *, mandatory: bool = False) -> None:
        """Put one message to a STOMP destination and wait for the broker to confirm it;
        ``mandatory``: an exchange that routes it to no queue refuses it (PutRefused)."""

    def check_put(self, destination: str) -> PutCheck:
        """Whether the broker would take a message from this connection's user for
        ``destination``, asked without putting anything (an empty message in a transaction that
        is rolled back), with what else the broker lets us see of the target (length limits).
        BrokerUnavailable when it cannot tell. A destination the adapter cannot name passes:
        the release reports it."""

    def staging_checks(self, destination: str) -> bool:
        """Whether the broker's checks of a send to a staging queue already cover a send to
        ``destination`` (then ``check_put`` has nothing to add)."""

    def browse(self, queue: str) -> Iterator[Message]:
        """Every message of ``queue`` now, head first, without consuming any (tools only)."""

    def take(
        self, queue: str, header: str, value: str, then: Callable[[Message], None] | None = None
    ) -> Message | None:
        """Remove and return the first message of ``queue`` whose ``header`` equals ``value``;
        None if there is none, or if another consumer holds it now (tools: cancel and release
        now). ``then`` is called with the message while it is held and before it is
        acknowledged: if it raises, the message stays on the queue."""

"""What the RabbitMQ adapter's own AMQP client (``adapters.amqp_client``) takes and hands out:
a publish to put, and the events the broker's bytes complete (an answer to a request, a
delivery, a return, a close)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

CHANNEL = 1  # the channel requests go to, unless they name one ``add_channel`` opened


class Publish(NamedTuple):
    exchange: str
    routing_key: str
    properties: bytes  # the content header's property flags and list, encoded
    body: bytes
    mandatory: bool


# -- events ---------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Ready:
    """The channel is open (in transaction mode, when asked)."""


@dataclass(frozen=True, slots=True)
class Committed:
    """Tx.Commit-Ok: the batch's publishes not returned are on their queues, its acks done."""


@dataclass(frozen=True, slots=True)
class Returned:
    """A mandatory publish the broker could not route (Basic.Return and its content)."""

    reply_code: int
    reply_text: str
    exchange: str
    routing_key: str
    body: bytes


@dataclass(frozen=True, slots=True)
class Delivery:
    """A message consumed (Basic.Deliver), or got (``Got``: ``consumer_tag`` None), on
    ``channel`` (its delivery tag counts on that channel)."""

    delivery_tag: int
    redelivered: bool
    exchange: str
    routing_key: str
    properties: bytes
    body: bytes
    consumer_tag: str | None = None
    channel: int = CHANNEL


@dataclass(frozen=True, slots=True)
class Got(Delivery):
    """The answer to a Basic.Get that found a message (Basic.Get-Ok)."""


@dataclass(frozen=True, slots=True)
class GetEmpty:
    pass


@dataclass(frozen=True, slots=True)
class DeclareOk:
    queue: str
    message_count: int
    consumer_count: int


@dataclass(frozen=True, slots=True)
class QosOk:
    pass


@dataclass(frozen=True, slots=True)
class ConsumeOk:
    consumer_tag: str


@dataclass(frozen=True, slots=True)
class CancelOk:
    consumer_tag: str


@dataclass(frozen=True, slots=True)
class ChannelClosed:
    """The broker closed ``channel``: nothing of an uncommitted batch was done. Close-Ok is
    queued; ``open_channel`` opens it again when it was ``CHANNEL`` or the one a request was
    awaited on (state CHANNEL_CLOSED)."""

    reply_code: int
    reply_text: str
    channel: int = CHANNEL


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """The broker closed the connection (Close-Ok is queued) or answered our Close."""

    reply_code: int
    reply_text: str


@dataclass(frozen=True, slots=True)
class Blocked:
    """The broker holds our publishes back (a resource alarm) until ``Unblocked``."""

    reason: str


@dataclass(frozen=True, slots=True)
class Unblocked:
    pass


Event = (Ready | Committed | Returned | Delivery | Got | GetEmpty | DeclareOk | QosOk
         | ConsumeOk | CancelOk | ChannelClosed | ConnectionClosed | Blocked | Unblocked)

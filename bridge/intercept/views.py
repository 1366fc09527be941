"""Protocol-neutral views of what flows through the bridge.

A front-end fills these in from its own wire (a STOMP frame, an AMQP method with its content)
and offers them to the interceptor chain; interceptors see nothing else. Header values are
strings, as STOMP carries them and as the AMQP front-end renders its header table; a header
that occurs twice counts with its first value (STOMP 1.2, section "Repeated Header Entries").
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a client connection is, as it told the broker (the broker authenticated it)."""

    login: str | None = None
    passcode: str | None = field(default=None, repr=False)
    vhost: str | None = None  # RabbitMQ's virtual host (STOMP ``host``, AMQP Connection.Open)


ANONYMOUS = Principal()


class Send(NamedTuple):
    """A message a client sends (STOMP SEND, AMQP Basic.Publish). (A NamedTuple, immutable as
    the other views are, at a quarter of a frozen dataclass's cost to make: one a screened
    send.)"""

    destination: str  # as a STOMP client names it: /queue/a, /topic/b, /exchange/x/key, ...
    headers: Mapping[str, str]
    body_size: int
    principal: Principal = ANONYMOUS
    transaction: str | None = None


@dataclass(frozen=True, slots=True)
class Subscribe:
    """A client starts consuming from a destination (STOMP SUBSCRIBE, AMQP Basic.Consume)."""

    destination: str
    principal: Principal = ANONYMOUS


@dataclass(frozen=True, slots=True)
class Delivery:
    """A message the broker hands a consumer (STOMP MESSAGE, AMQP Basic.Deliver)."""

    destination: str
    subscription: str
    ack_id: str  # what the client names it by when it settles it
    headers: Mapping[str, str]
    body_size: int
    redelivered: bool = False
    # What the consumer consumes from, where it is not ``destination`` (where the message was
    # sent): a STOMP subscription's own destination (``/amq/queue/q`` for a message sent
    # through ``/exchange/x/key``); "" when the front-end does not know or it is the same.
    source: str = ""


class Settlement(enum.Enum):
    """How a consumer settled deliveries."""

    ACK = "ack"  # processed
    NACK = "nack"  # failed (STOMP NACK, AMQP Basic.Nack / Basic.Reject with requeue)
    ROLLBACK = "rollback"  # the transaction that acked or nacked them was rolled back
    LOST = "lost"  # the connection ended with these deliveries unsettled


@dataclass(frozen=True, slots=True)
class Settle:
    """A consumer settles deliveries it was handed, or loses them."""

    outcome: Settlement
    deliveries: tuple[Delivery, ...]
    transaction: str | None = None
    principal: Principal = ANONYMOUS

"""The port the dead-letter tools use on any queue: see it, count it, and go through it once,
message by message, keeping, removing or moving each, with every move confirmed before the
message it replaces is removed.

Implementations: ``adapters.queues_rabbitmq`` and ``adapters.queues_activemq``, each a
subclass of its broker's ``StagingBroker`` (one connection, the same error translation).

``sweep`` is the one way the tools change a queue. It visits the messages the queue had when
it began, head first, and asks ``decide`` what to do with each:

- ``KEEP``: the message stays, and the kept messages stay in their order;
- ``DROP``: it is removed;
- ``Put(destination, message)``: ``message`` is put to ``destination`` and the visited one is
  removed, in one broker transaction with the removal: a sweep killed at any moment leaves
  every message either moved (once) or where it was, never both and never neither.

Work is committed in batches of ``batch`` messages; ``before_commit`` (if given) is called with
each batch's visits just before its commit, and may raise to stop the sweep with that batch
undone (the archive writer uses it: a message leaves the queue only after its file is on disk);
``after_commit`` is called with each batch's visits once the broker has committed it.
``limit`` stops the sweep after that many messages were dropped or put.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from adapters.base import Message


@dataclass(frozen=True, slots=True)
class Keep:
    pass


@dataclass(frozen=True, slots=True)
class Drop:
    pass


@dataclass(frozen=True, slots=True)
class Put:
    destination: str  # a STOMP destination
    message: Message


KEEP = Keep()
DROP = Drop()
SweepAction = Keep | Drop | Put


@dataclass(frozen=True, slots=True)
class Found:
    """A message seen on a queue: its headers and body, the broker's own id of it (ActiveMQ's
    JMSMessageID, RabbitMQ's message id property or ''), and its place from the head (0-based)."""

    message: Message
    broker_id: str
    position: int


@dataclass(frozen=True, slots=True)
class Visit:
    found: Found
    action: SweepAction


@dataclass(slots=True)
class SweepReport:
    seen: int = 0
    kept: int = 0
    dropped: int = 0
    put: int = 0


class QueueTools(Protocol):
    name: str  # "rabbitmq" | "activemq"

    def connect(self) -> None: ...

    def close(self) -> None: ...

    def queue_sizes(self, matching: str | None = None) -> dict[str, int]:
        """The queues the broker shows whose names contain a match of ``matching`` (a regular
        expression; None: every queue), with their message counts. The broker filters where it
        can: RabbitMQ reads the expression as a PCRE and always caseless, so keep to what
        Python's re reads alike and say ``(?i)``. Raises BrokerUnavailable when the broker
        does not list its queues (RabbitMQ without its management API, or that API not
        answering)."""

    def size(self, queue: str) -> int | None:
        """How many messages ``queue`` has; None when the broker has no such queue; PutRefused
        (MQRC_OBJECT_IN_USE) for a queue only another connection may look at (RabbitMQ's
        exclusive queues)."""

    def inspect(self, queue: str) -> Iterator[Found]:
        """Every message of ``queue``, head first, none removed (a generator: close it to stop
        early)."""

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
        """Go through ``queue`` once as the module says."""

    def put_all(self, puts: Sequence[Put], *, text: bool = False) -> None:
        """Put every message in one broker transaction: all of them are on the broker when this
        returns, and none when it raises (PutRefused naming the refusal, BrokerUnavailable).
        ``text``: ActiveMQ text messages rather than bytes messages."""

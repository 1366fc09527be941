"""What an interceptor decides about a view, as a value the front-end turns into its own bytes.

- ``RELAY``: send the original bytes on, untouched;
- ``Rewrite``: send a message with these headers to this destination instead (same body);
- ``Refuse``: refuse it for an MQRC reason (STOMP: an ERROR frame; AMQP: Channel.Close 406);
- ``Stamp``: relay a delivery with these headers added (``JMSXDeliveryCount``);
- ``Replace``: instead of a consumer's settlement, put a copy of each delivery where the policy
  says (a staged copy, a dead letter), wait for the broker to confirm every copy, and only then
  acknowledge the originals upstream: a crash in between duplicates, never loses;
- ``Hold``: the answer needs a look at the broker first. The front-end holds this frame and
  everything the client sends after it, runs ``check`` (``bridge.frontends.checks``), then
  offers the frame again: frames still reach the broker in the order the client sent them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from policies.errors import Refused


class Relay:
    __slots__ = ()

    def __repr__(self) -> str:
        return "RELAY"


RELAY: Final = Relay()


class Rewrite(NamedTuple):  # (immutable, and cheaper to make than a frozen dataclass)
    destination: str
    headers: list[tuple[str, str]]  # every header of the new message, destination included


@dataclass(frozen=True, slots=True)
class Refuse:
    refusal: Refused


@dataclass(frozen=True, slots=True)
class Hold:
    key: Hashable  # what is checked: equal keys share one check
    check: Callable[[], Awaitable[None]] = field(compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Stamp:
    headers: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Copy:
    """What becomes of one delivery: a copy put to ``destination`` (with these headers and the
    delivery's body), or nothing put when ``destination`` is None (deleted). Then it is
    acknowledged upstream."""

    ack_id: str
    destination: str | None
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Replace:
    copies: tuple[Copy, ...]


Decision = Relay | Rewrite | Refuse | Hold | Stamp | Replace

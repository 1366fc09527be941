"""What an interceptor decides about a view, as a value the front-end turns into its own bytes.

- ``RELAY``: send the original bytes on, untouched;
- ``Rewrite``: send a message with these headers to this destination instead (same body);
- ``Refuse``: refuse it for an MQRC reason (STOMP: an ERROR frame; AMQP: Channel.Close 406);
- ``Hold``: the answer needs a look at the broker first. The front-end holds this frame and
  everything the client sends after it, runs ``check`` (``bridge.frontends.checks``), then
  offers the frame again: frames still reach the broker in the order the client sent them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Final

from policies.errors import Refused


class Relay:
    __slots__ = ()

    def __repr__(self) -> str:
        return "RELAY"


RELAY: Final = Relay()


@dataclass(frozen=True, slots=True)
class Rewrite:
    destination: str
    headers: list[tuple[str, str]]  # every header of the new message, destination included


@dataclass(frozen=True, slots=True)
class Refuse:
    refusal: Refused


@dataclass(frozen=True, slots=True)
class Hold:
    key: Hashable  # what is checked: equal keys share one check
    check: Callable[[], Awaitable[None]] = field(compare=False, repr=False)


Decision = Relay | Rewrite | Refuse | Hold

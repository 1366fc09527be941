"""Where a staged message waits: constant-dwell level queues, then the ready queue.

Every message in a level queue waits the same time (the level's dwell) from when it entered, so
each level queue is ordered by exit time and only its head needs looking at. A message with
``r`` ms to go enters the level with the largest dwell that is at most ``r``; when it leaves,
less than that dwell is left and it goes down to a smaller level. When less than
``2**MIN_LEVEL`` ms remain it goes to the ready queue, whose messages the engine holds in memory
(at most one horizon's worth) and releases at their exact due time.

The dwells are the powers of two from ``2**MIN_LEVEL`` to ``2**MAX_LEVEL`` ms: a message takes
one hop per set bit of its delay. With ``second_levels`` there is also a level for every whole
multiple of the horizon below ``2**SECOND_LEVELS_BELOW`` (1 to 15 s): a delay of up to 16 s
enters its level and leaves it with less than the horizon to go, with no hop at all, and a longer
one takes one hop per set bit above ``SECOND_LEVELS_BELOW`` and one into the seconds. Level
``L<k>`` waits 2**k ms; level ``L10x<m>`` waits m * 2**10 ms.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from adapters.base import StagedFormat

MIN_LEVEL = 10  # 1.024 s: the horizon held in memory
SECOND_LEVELS_BELOW = 14  # 16.4 s
MAX_LEVEL = 32  # 49.7 days; longer delays take several hops at the top level
DEFAULT_PREFIX = "jms-bridge.staging"


def _dwells(second_levels: bool) -> tuple[int, ...]:
    """Every level's dwell in ms, shortest first."""
    if not second_levels:
        return tuple(1 << k for k in range(MIN_LEVEL, MAX_LEVEL + 1))
    seconds = range(1 << MIN_LEVEL, 1 << SECOND_LEVELS_BELOW, 1 << MIN_LEVEL)
    return (*seconds, *(1 << k for k in range(SECOND_LEVELS_BELOW, MAX_LEVEL + 1)))


@dataclass(frozen=True, slots=True)
class Layout:
    prefix: str = DEFAULT_PREFIX
    second_levels: bool = False
    dwells: tuple[int, ...] = field(init=False, repr=False, compare=False)
    # Every level's queue name by its k (0 to MAX_LEVEL), made once: one is named for each
    # delayed send.
    _names: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dwells", _dwells(self.second_levels))
        object.__setattr__(self, "_names",
                           tuple(f"{self.prefix}.L{k:02d}" for k in range(MAX_LEVEL + 1)))

    @property
    def ready(self) -> str:
        return f"{self.prefix}.ready"

    def level(self, k: int) -> str:
        """The level of dwell 2**k ms."""
        if 0 <= k <= MAX_LEVEL:
            return self._names[k]
        return f"{self.prefix}.L{k:02d}"

    def level_of(self, dwell_ms: int) -> str:
        """The level queue of one of ``dwells``."""
        if dwell_ms & (dwell_ms - 1) == 0:
            return self.level(dwell_ms.bit_length() - 1)
        return f"{self.prefix}.L{MIN_LEVEL:02d}x{dwell_ms >> MIN_LEVEL:02d}"

    @property
    def levels(self) -> tuple[tuple[int, str], ...]:
        """(dwell in ms, queue) of every level, shortest first."""
        return tuple((dwell, self.level_of(dwell)) for dwell in self.dwells)

    @property
    def queues(self) -> tuple[str, ...]:
        return (*(q for _, q in self.levels), self.ready)

    def dwell_of(self, queue: str) -> int | None:
        """The dwell in ms of a level queue; None for the ready queue or a foreign name."""
        head, _, name = queue.rpartition(".L")
        k, _, m = name.partition("x")
        if (head != self.prefix or not name.isascii() or not k.isdigit()
                or not (m.isdigit() or name == k)):
            return None
        dwell = (int(m) if m else 1) << int(k)
        return dwell if dwell in self.dwells and self.level_of(dwell) == queue else None

    def queue_for(self, remaining_ms: int) -> str:
        """The queue a message with ``remaining_ms`` to wait enters now."""
        if remaining_ms < (1 << MIN_LEVEL):
            return self.ready
        if self.second_levels and remaining_ms < 1 << SECOND_LEVELS_BELOW:
            return self.level_of(remaining_ms >> MIN_LEVEL << MIN_LEVEL)
        return self.level(min(remaining_ms.bit_length() - 1, MAX_LEVEL))

    @property
    def control(self) -> str:
        """The topic on which operators' tools give orders to the running engines."""
        return f"{self.prefix}.control"

    def owns(self, name: str) -> bool:
        """Whether a destination (``/amq/queue/x``, ``/queue/x``, ``/exchange/e/x``...) or a
        queue name addresses one of the staging queues or the control topic: its last segment
        is the prefix or starts with the prefix and a dot. Each part of an ActiveMQ composite
        destination (``/queue/a,b``) counts, and so does a queue wildcard (ActiveMQ's ``*`` and
        ``>``) that matches a staging queue: a consumer of ``/queue/>`` would take staged
        messages. (A topic wildcard only sees the control topic's orders go by.)"""
        for part in name.split(","):
            last = part.rsplit("/", 1)[-1]
            if last == self.prefix or last.startswith(self.prefix + "."):
                return True
            if ("*" in last or ">" in last) and not part.startswith(_TOPICS):
                pattern = _queue_wildcard(last)
                if any(pattern.fullmatch(queue) for queue in self.all_queues):
                    return True
        return False

    @property
    def invalid(self) -> str:
        """Where the engine moves what it cannot read as a staged message."""
        return f"{self.prefix}.invalid"

    @property
    def undeliverable(self) -> str:
        """Where the engine moves a release its target refused."""
        return f"{self.prefix}.undeliverable"

    @property
    def expired(self) -> str:
        """Where RabbitMQ dead-letters the messages it expires, for the engine to keep those
        that asked to be kept (``adapters.rabbitmq_expiry``): a queue, and an exchange."""
        return f"{self.prefix}.expired"

    @property
    def all_queues(self) -> tuple[str, ...]:
        """The level and ready queues, those the engine moves messages aside to, and the one
        it takes the broker's expired messages from."""
        return (*self.queues, self.invalid, self.undeliverable, self.expired)


_TOPICS = ("/topic/", "topic://", "/exchange/", "/temp-topic/")


def _queue_wildcard(name: str) -> re.Pattern[str]:
    """ActiveMQ's wildcard: ``*`` one dot-separated segment, ``>`` the rest."""
    return re.compile(
        r"\.".join(
            "[^.]+" if segment == "*" else ".+" if segment == ">" else re.escape(segment)
            for segment in name.split(".")
        )
    )


def layout_for(fmt: StagedFormat, prefix: str = DEFAULT_PREFIX) -> Layout:
    """The staging layout on ``broker``. On RabbitMQ the second levels: a hop is a put and an
    acknowledgement, and the broker's CPU is what runs out first under a burst. On ActiveMQ
    binary levels: each streamed level is a subscription whose prefetch the broker fills at
    once, and fifteen of them took a whole burst in the same second as the burst itself, while
    its first releases were due."""
    return Layout(prefix, second_levels=fmt.second_levels)

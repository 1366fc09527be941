"""Where a staged message waits: constant-dwell level queues, then the ready queue.

Every message in level queue ``k`` waits the same time, 2**k ms, from when it entered, so
each level queue is ordered by exit time and only its head needs looking at. A message with
``r`` ms to go enters the largest level whose dwell is at most ``r``; when it leaves, fewer
than 2**k ms remain and it goes down to a smaller level, one hop per set bit of ``r``. When
less than ``2**MIN_LEVEL`` ms remain it goes to the ready queue, whose messages the engine holds
in memory (at most one horizon's worth) and releases at their exact due time.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_LEVEL = 10  # 1.024 s: the horizon held in memory
MAX_LEVEL = 32  # 49.7 days; longer delays take several hops at the top level


@dataclass(frozen=True, slots=True)
class Layout:
    prefix: str = "jms-bridge.staging"

    @property
    def ready(self) -> str:
        return f"{self.prefix}.ready"

    def level(self, k: int) -> str:
        return f"{self.prefix}.L{k:02d}"

    @property
    def levels(self) -> tuple[tuple[int, str], ...]:
        return tuple((k, self.level(k)) for k in range(MIN_LEVEL, MAX_LEVEL + 1))

    @property
    def queues(self) -> tuple[str, ...]:
        return (*(q for _, q in self.levels), self.ready)

    def dwell_of(self, queue: str) -> int | None:
        """The dwell in ms of a level queue; None for the ready queue or a foreign name."""
        head, _, k = queue.rpartition(".L")
        if head != self.prefix or not k.isdigit():
            return None
        return 1 << int(k)

    def queue_for(self, remaining_ms: int) -> str:
        """The queue a message with ``remaining_ms`` to wait enters now."""
        if remaining_ms < (1 << MIN_LEVEL):
            return self.ready
        return self.level(min(remaining_ms.bit_length() - 1, MAX_LEVEL))

    def owns(self, name: str) -> bool:
        """Whether a destination (``/amq/queue/x``, ``/queue/x``, ``/exchange/e/x``...) or a
        queue name addresses one of the staging queues: its last segment is the prefix or
        starts with the prefix and a dot."""
        queue = name.rsplit("/", 1)[-1]
        return queue == self.prefix or queue.startswith(self.prefix + ".")

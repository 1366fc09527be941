"""Counters of the dead-letter tools: plain tallies, exported by ``bridge.app.metrics``."""

from __future__ import annotations

from collections import Counter as Tally
from dataclasses import dataclass, field


@dataclass(slots=True)
class DeadLetterStats:
    # (operation, reason) -> messages: purge / replay / move / export, and the rules handler's
    # actions as handle-RETRY, handle-FWD, handle-DISCARD, handle-IGNORE.
    actions: Tally[tuple[str, str]] = field(default_factory=Tally)

    def count(self, operation: str, reason: str, n: int = 1) -> None:
        self.actions[(operation, reason)] += n

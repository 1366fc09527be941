"""One process-wide budget of bytes held for clients: frames not yet complete, and frames passed
on that the broker has not yet taken (the upstream write buffer).

Each connection's limit (``--max-frame-bytes``) bounds one frame; this bounds their sum, so that
fifty clients streaming large frames at once cost the budget, not fifty frames. Past it, a
connection that holds bytes and asks for more is told to stop reading (back-pressure: TCP tells
its client to wait) until others have passed theirs on. The connection that began holding first
is never stopped, so one frame always makes progress and the budget cannot deadlock: at most
it is exceeded by that one frame (each frame is within its own limit). No I/O here: the glue
pauses and resumes reading.
"""

from __future__ import annotations

from typing import Protocol


class Holder(Protocol):
    def budget_resume(self) -> None:
        """Read the client again."""


class Budget:
    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("the budget must be at least one byte")
        self.limit = limit
        self.total = 0
        # Connections holding bytes, in the order they began to (the first is never paused).
        self._held: dict[Holder, int] = {}
        self._waiting: dict[Holder, None] = {}  # paused, in the order they were

    def update(self, holder: Holder, held: int) -> bool:
        """``holder`` now holds ``held`` bytes; True when it must stop reading (it will be
        told ``budget_resume`` when it may go on)."""
        old = self._held.get(holder, 0)
        if held:
            self._held[holder] = held
        else:
            self._waiting.pop(holder, None)  # holding nothing, it holds nothing up
            if old:
                del self._held[holder]
        self.total += held - old
        if held < old:
            self._wake()
        if (held and held >= old and self.total > self.limit and holder not in self._waiting
                and next(iter(self._held)) is not holder):
            self._waiting[holder] = None
            return True
        return holder in self._waiting

    def forget(self, holder: Holder) -> None:
        """The connection is gone: whatever it held is freed."""
        self._waiting.pop(holder, None)
        self.update(holder, 0)

    def _wake(self) -> None:
        first = next(iter(self._held), None)
        if first is not None and first in self._waiting:  # progress before anything else
            del self._waiting[first]
            first.budget_resume()
        while self._waiting and self.total < self.limit:
            holder = next(iter(self._waiting))
            del self._waiting[holder]
            holder.budget_resume()

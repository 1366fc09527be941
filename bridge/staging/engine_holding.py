"""What the staging engine keeps in memory between steps: the staged copies it holds (level
buffers, hops to settle, the release heap, moves found by poll), when to look at each peeked
level again, and what it let go of onto a staging queue lately (for the listings).

The level mover fills and empties it, an operator's order takes copies out of it, the settler
notes what it put back on a level, and the engine gives it all back when the connection goes.
"""

from __future__ import annotations

import collections
import heapq
import itertools
from collections.abc import Iterable, Iterator, Mapping

from adapters.base import Held
from bridge.staging.engine_work import Work
from bridge.staging.envelope import MESSAGE_ID, Staged

# How long, and how many, of the messages an engine let go of onto a staging queue it
# remembers for the listings (``Holding.let_go``): a listing reading the queues for longer
# than that is told the engine has forgotten some.
MOVED_KEEP_MS = 120_000
MOVED_MAX = 50_000


class Holding:
    """The engine's held copies and level timing; one per engine, shared by its parts."""

    def __init__(self, streamed: Iterable[str]) -> None:
        # Streamed level -> its delivered messages in queue order, with when to take each:
        # its exit time less the lead.
        self.buffers: dict[str, collections.deque[tuple[int, Held]]] = {
            q: collections.deque() for q in streamed
        }
        self.heap: list[tuple[int, int, Held, Staged]] = []  # (due, seq, held, staged)
        self._seq = itertools.count()
        # Streamed heads to hop, in the order taken; their next queue is chosen when settled.
        self.hops: collections.deque[tuple[Held, Staged]] = collections.deque()
        self.pending: list[Work] = []  # found by poll, settled with the next releases
        self.next_look: dict[str, int] = {}  # peeked level queue -> epoch ms; absent = look now
        # (when, queue, headers, body size) of each staged copy let go of onto a staging queue,
        # oldest first; and when the newest one forgotten for room was let go of.
        self.moved: collections.deque[tuple[int, str, Mapping[str, str], int]] = (
            collections.deque())
        self.moved_forgotten_ms = -1
        self._moved_ids: collections.Counter[str] = collections.Counter()  # entries in ``moved``
        # When a message with entries in ``moved`` left the staging queues (released,
        # cancelled, ...): its earlier entries are not where a listing may find it now.
        self.left: dict[str, int] = {}

    def hold(self, held: Held, staged: Staged) -> None:
        """Keep ``held`` for release at its due time."""
        heapq.heappush(self.heap, (staged.due_ms, next(self._seq), held, staged))

    def held(self) -> Iterator[Held]:
        """Every staged message the engine holds between steps."""
        for buffer in self.buffers.values():
            for _, held in buffer:
                yield held
        for held, _ in self.hops:
            yield held
        for entry in self.heap:
            yield entry[2]

    def unhold(self, message_id: str) -> list[tuple[Held, Staged]]:
        """Take every held copy of ``message_id`` out of the level buffers, the hops to settle
        and the release heap. (One in ``pending`` is being settled already.)"""
        found: list[tuple[Held, Staged]] = []

        def match(held: Held) -> bool:
            return held.message.headers.get(MESSAGE_ID) == message_id

        for queue, buffer in self.buffers.items():
            if any(match(held) for _, held in buffer):
                keep = collections.deque[tuple[int, Held]]()
                for entry in buffer:
                    if match(entry[1]):
                        found.append((entry[1], Staged.of(entry[1].message.headers)))
                    else:
                        keep.append(entry)
                self.buffers[queue] = keep
        if any(match(held) for held, _ in self.hops):
            found += [(h, s) for h, s in self.hops if match(h)]
            self.hops = collections.deque((h, s) for h, s in self.hops if not match(h))
        if any(match(entry[2]) for entry in self.heap):
            found += [(e[2], e[3]) for e in self.heap if match(e[2])]
            self.heap = [e for e in self.heap if not match(e[2])]
            heapq.heapify(self.heap)
        return found

    def let_go(self, queue: str, headers: Mapping[str, str], size: int, now_ms: int) -> None:
        """Remember a staged copy this engine let go of onto a staging queue (a hop, a retry,
        a head put back, a copy given back as the connection went), for the listings: one
        that read that queue before the copy came would not see it otherwise."""
        moved = self.moved
        moved.append((now_ms, queue, headers, size))
        message_id = headers.get(MESSAGE_ID)
        if message_id is not None:
            self._moved_ids[message_id] += 1
        while moved and (len(moved) > MOVED_MAX or moved[0][0] < now_ms - MOVED_KEEP_MS):
            at, _, old, _ = moved.popleft()
            self.moved_forgotten_ms = at
            old_id = old.get(MESSAGE_ID)
            if old_id is not None:
                if self._moved_ids[old_id] > 1:
                    self._moved_ids[old_id] -= 1
                else:
                    del self._moved_ids[old_id]
                    self.left.pop(old_id, None)

    def gone(self, message_id: str, now_ms: int) -> None:
        """``message_id`` left the staging queues: what this engine let go of it before is no
        longer listed (a listing right after its release showed it on its level)."""
        if message_id in self._moved_ids:
            self.left[message_id] = now_ms

    def listed_moved(self, since_ms: int) -> Iterator[tuple[str, Mapping[str, str], int]]:
        """(queue, headers, body size) of what was let go of from ``since_ms`` on and has not
        left the staging queues since, newest first."""
        left = self.left
        for at, queue, headers, size in reversed(self.moved):
            if at >= since_ms and (not left or left.get(headers.get(MESSAGE_ID, ""), -1) < at):
                yield queue, headers, size

    def forget_moved(self, message_id: str) -> None:
        """What this engine let go of ``message_id`` earlier is not where a listing may find it
        now: an operator's order (or a tool) moved it since."""
        if any(headers.get(MESSAGE_ID) == message_id for _, _, headers, _ in self.moved):
            self.moved = collections.deque(
                m for m in self.moved if m[2].get(MESSAGE_ID) != message_id)
            self._moved_ids.pop(message_id, None)
            self.left.pop(message_id, None)

    def give_back(self, now_ms: int) -> None:
        """Forget everything held: the broker gives it back to its queue when the connection
        goes (and a listing may have read that queue already: it is remembered as let go)."""
        for held in (*self.held(), *(w.move.held for w in self.pending)):
            self.let_go(held.queue, held.message.headers, len(held.message.body), now_ms)
        self.heap.clear()
        self.pending.clear()
        self.hops.clear()
        self.next_look.clear()
        for buffer in self.buffers.values():
            buffer.clear()

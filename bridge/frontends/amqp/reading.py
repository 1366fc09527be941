"""How a link reads its client: through a stream its link may take bytes from where they arrive
(``ClientReader``), the protocol header first (before anything goes to the broker), and no more
than the process-wide budget allows (``ReadBudget``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any, SupportsIndex

from bridge.frontends.amqp.builders import PROTOCOL_HEADER
from bridge.frontends.budget import Budget
from bridge.frontends.relay_stats import AmqpStats

READ_SIZE = 256 * 1024


class ClientReader(asyncio.StreamReader):
    """A client's stream whose bytes its link may take where they arrive (``take``, called with
    them; True when taken), instead of their waiting in the buffer for the link's task to read
    them: a publisher's reads of plain publishes then go up with no task woken and no copy in
    and out of the buffer."""

    take: Callable[[bytes], bool] | None = None

    def feed_data(self, data: Iterable[SupportsIndex]) -> None:
        take = self.take
        if take is None or type(data) is not bytes or not take(data):
            super().feed_data(data)


async def protocol_header(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                          timeout: float, stats: AmqpStats, log: Any) -> bytes | None:
    """The client's protocol header, read before anything goes to the broker; None when
    there is none to carry (the client left, sent no header in time, or sent another
    protocol's bytes: answered with AMQP 0-9-1's header, as RabbitMQ answers them)."""
    deadline = asyncio.get_running_loop().time() + timeout
    seen = b""
    while len(seen) < len(PROTOCOL_HEADER):
        left = deadline - asyncio.get_running_loop().time()
        try:
            chunk = await asyncio.wait_for(
                reader.read(len(PROTOCOL_HEADER) - len(seen)), max(left, 0.0))
        except TimeoutError:
            stats.protocol_errors["handshake-timeout"] += 1
            log.info("closing", why=f"no protocol header within {timeout:g} s")
            return None
        except OSError:
            return None
        if not chunk:
            return None
        seen += chunk
        if not PROTOCOL_HEADER.startswith(seen):
            stats.protocol_errors["bad-header"] += 1
            log.info("closing", why="not AMQP 0-9-1", first_octets=repr(seen))
            writer.write(PROTOCOL_HEADER)
            return None
    return seen


class ReadBudget:
    """One client's part of the budget: bytes held for it (frames not yet whole) count against
    the process-wide limit, past which it is not read until others have passed theirs on."""

    def __init__(self, budget: Budget, stats: AmqpStats) -> None:
        self.budget = budget
        self.stats = stats
        self._may_read = asyncio.Event()  # cleared while the budget holds the client's reading
        self._may_read.set()

    def budget_resume(self) -> None:
        self._may_read.set()

    def account(self, held: int) -> bool:
        """Tell the budget what the client holds now; True while it says not to read more
        (``wait`` then)."""
        budget, stats = self.budget, self.stats
        before = budget.total
        if budget.update(self, held) and self._may_read.is_set():
            self._may_read.clear()
            stats.budget_pauses += 1
        stats.buffered_bytes += budget.total - before
        return not self._may_read.is_set()

    async def wait(self) -> None:
        await self._may_read.wait()

    def forget(self) -> None:
        budget = self.budget
        before = budget.total
        budget.forget(self)
        self.stats.buffered_bytes += budget.total - before

"""The one check-then-resume runner every front-end uses for a ``Hold`` decision.

A decision that needs a look at the broker (may this user write to that target?) holds the
client's frame and everything it sends after it. The runner stops reading the client, runs the
check off the hot path, and then has the front-end offer the held frames again, in the order
the client sent them. A check that fails never leaves a client's frames held.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

import structlog

from bridge.intercept.decisions import Hold


class Holder(Protocol):
    """The front-end's side of a held connection."""

    def hold_client(self) -> None:
        """Stop reading the client while its frames are held."""

    def checked(self) -> None:
        """The check is done: offer the held frames again, then read the client again."""


class CheckRunner:
    """Starts the check of a ``Hold`` and resumes its holder when it ends."""

    def __init__(self) -> None:
        self._log = structlog.get_logger("checks")

    def start(self, hold: Hold, holder: Holder) -> asyncio.Task[None]:
        holder.hold_client()
        return asyncio.get_running_loop().create_task(self._run(hold, holder))

    async def _run(self, hold: Hold, holder: Holder) -> None:
        try:
            await hold.check()
        except Exception as exc:  # the check's own fallback failed: never hold frames forever
            self._log.error("check failed", key=repr(hold.key), error=repr(exc))
        holder.checked()


async def always_ready(timeout: float) -> str | None:
    """A listener's ``settled`` when nothing has to be waited for: never a reason to refuse."""
    return None

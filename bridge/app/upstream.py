"""The broker as the bridge sees it: reachable or not, and set up (staging queues declared).

A bridge starts whatever the broker does (a sidecar often starts before its broker). It listens
at once; ``BrokerWatch.run`` then waits for the broker in the background, with a backoff that
has jitter and a low cap (several bridges must not knock in step, and the first try after the
broker is back comes within ``RETRY_MAX_S``), and declares the staging queues once it answers.
Until then ``/readyz`` says why not. A client that connects before the first try has ended
waits for it (``settled``), so an application started beside its bridge is served; after a
failed try, a client's CONNECT gets an ERROR frame naming the broker. ``--upstream-wait
SECONDS`` asks for the old behaviour: ``wait`` gives up after that long, and the bridge exits
naming the broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from tenacity import (
    AsyncRetrying,
    retry_if_result,
    stop_after_delay,
    stop_never,
    wait_random_exponential,
)

from bridge.app import logs
from bridge.app.probes import probe
from policies.endpoints import Endpoint
from policies.errors import BridgeError, BrokerUnavailable, StagingQueueMismatch

RETRY_FIRST_S = 0.05
RETRY_MAX_S = 0.5


class BrokerWatch:
    """Waits for the broker and prepares it; says whether the bridge is ready and why not."""

    def __init__(self, name: str, target: Endpoint, prepare: Callable[[], None]) -> None:
        self.name = name
        self.target = target
        self._prepare = prepare  # blocking (the adapters are): run in a worker thread
        self.problem: str | None = "not yet checked"
        self.prepared = False
        self.ready_at: float | None = None  # monotonic time the broker was set up
        self._tried = asyncio.Event()  # set when the first try has ended, either way
        self._log = logs.get("bridge")

    def readiness(self) -> str | None:
        """None once the broker has been set up; else why the bridge is not ready."""
        if self.prepared:
            return None
        return f"{self.name} STOMP at {self.target} is not reachable: {self.problem}"

    async def settled(self, timeout: float) -> str | None:
        """``readiness()`` once the broker has been tried at least once (waiting at most
        ``timeout`` s for that first try)."""
        if not self._tried.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._tried.wait(), timeout)
        return self.readiness()

    async def _attempt(self, quiet: bool = False) -> str | None:
        """One try: None when the broker answered and the staging queues are declared.
        StagingQueueMismatch is not retried: waiting would not mend it."""
        problem = await probe(self.target)
        if problem is None:
            try:
                await asyncio.get_running_loop().run_in_executor(None, self._prepare)
            except StagingQueueMismatch:
                raise
            except BridgeError as exc:
                problem = str(exc)
        if problem != self.problem and problem is not None and not quiet:
            self._log.warning("broker not reachable; retrying", broker=self.name,
                              upstream=str(self.target), problem=problem)
        self.problem = problem
        if problem is None and not self.prepared:
            self.prepared = True
            self.ready_at = time.monotonic()
        self._tried.set()
        return problem

    async def wait(self, patience: float | None = None, *, quiet: bool = False) -> None:
        """Until the broker answers and is set up; with ``patience`` (s), BrokerUnavailable
        after that long. ``quiet``: no log line for a failed try (the error says it all)."""
        retrying = AsyncRetrying(
            stop=stop_never if patience is None else stop_after_delay(patience),
            wait=wait_random_exponential(multiplier=RETRY_FIRST_S, max=RETRY_MAX_S),
            retry=retry_if_result(lambda problem: problem is not None),
            retry_error_callback=lambda state: state.outcome.result() if state.outcome else "?",
        )
        started = time.monotonic()
        if await retrying(self._attempt, quiet) is not None:
            raise BrokerUnavailable(self.readiness() or "")
        assert self.ready_at is not None
        self._log.info("broker reachable; staging queues declared", broker=self.name,
                       upstream=str(self.target), waited_s=round(self.ready_at - started, 3))

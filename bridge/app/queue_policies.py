"""Redelivery policies that queues declare themselves (``x-delayed-retry-*`` arguments, see
``policies.redelivery.queue_args``), read from the broker and remembered.

The redelivery interceptor asks ``policy_of`` synchronously. A queue not looked at yet is
``PENDING``: the interceptor holds that failure (the front-end's check-then-resume) while
``check`` reads the queue's arguments through RabbitMQ's management API in a worker thread,
then offers it again. A known answer is used for ``TTL_S`` seconds, and after that too while
a fresh look runs in the background, so only a queue's first failure in a bridge's life waits
for the broker. A look that cannot tell (the API is away) counts as "no arguments" for
``UNSURE_TTL_S``: the configured table applies meanwhile.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

from adapters.rabbitmq_management import queue_arguments
from bridge.intercept.redelivery import PENDING, Pending
from policies.endpoints import Endpoint
from policies.errors import BrokerUnavailable, ConfigError
from policies.redelivery import Policy
from policies.redelivery.queue_args import parse_queue_args

if TYPE_CHECKING:
    from bridge.app.config import Settings

TTL_S = 30.0
UNSURE_TTL_S = 5.0

# (vhost, queue) -> the queue's arguments, None for no such queue; BrokerUnavailable when it
# cannot tell. Blocking: run off the event loop.
Fetch = Callable[[str | None, str], dict[str, object] | None]
Key = tuple[str | None, str]


class QueuePolicies:
    def __init__(self, fetch: Fetch, *, ttl_s: float = TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.fetch = fetch
        self.ttl_s = ttl_s
        self.clock = clock
        self._known: dict[Key, tuple[float, Policy | None]] = {}
        self._running: dict[Key, asyncio.Future[None]] = {}
        self._background: set[asyncio.Task[None]] = set()  # kept: a bare task can be collected
        self._log = structlog.get_logger("redelivery.queue_arguments")

    def policy_of(self, vhost: str | None, queue: str) -> Policy | None | Pending:
        """The policy ``queue``'s arguments declare, None when they declare none, PENDING when
        they were never read."""
        key = (vhost, queue)
        entry = self._known.get(key)
        if entry is None:
            return PENDING
        until, policy = entry
        if self.clock() >= until and key not in self._running:
            self._start(vhost, queue)
        return policy

    def warm(self, vhost: str | None, queue: str) -> None:
        """Start a look at ``queue`` in the background unless it is known or under way."""
        key = (vhost, queue)
        if key not in self._known and key not in self._running:
            self._start(vhost, queue)

    def _start(self, vhost: str | None, queue: str) -> None:
        task = asyncio.get_running_loop().create_task(self.check(vhost, queue))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def remember(self, key: Key, policy: Policy | None, ttl_s: float) -> None:
        self._known[key] = (self.clock() + ttl_s, policy)
        if len(self._known) > 10_000:  # queues come and go: drop the stale answers
            now = self.clock()
            self._known = {k: v for k, v in self._known.items() if v[0] > now}

    def judge(self, vhost: str | None, queue: str) -> Policy | None:
        """Read ``queue``'s arguments (blocking) and remember the policy they declare."""
        key = (vhost, queue)
        try:
            arguments = self.fetch(vhost, queue)
        except BrokerUnavailable as exc:
            self._log.warning("queue arguments not read: the configured policies apply",
                              queue=queue, vhost=vhost, error=str(exc))
            self.remember(key, None, UNSURE_TTL_S)
            return None
        try:
            policy = parse_queue_args(arguments or {}, queue)
        except ConfigError as exc:
            self._log.warning("queue arguments not taken: the configured policies apply",
                              queue=queue, vhost=vhost, error=str(exc))
            policy = None
        self.remember(key, policy, self.ttl_s)
        return policy

    async def check(self, vhost: str | None, queue: str) -> None:
        """``judge`` in a worker thread; concurrent checks of one queue share one look. Never
        raises: a look that fails unexpectedly leaves the configured policies for a while."""
        key = (vhost, queue)
        running = self._running.get(key)
        if running is not None:
            await asyncio.shield(running)
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._running[key] = future
        try:
            await loop.run_in_executor(None, self.judge, vhost, queue)
        except Exception as exc:  # never leave a consumer's failure held
            self._log.error("queue arguments check failed", queue=queue, error=repr(exc))
            self.remember(key, None, UNSURE_TTL_S)
        finally:
            del self._running[key]
            future.set_result(None)


def from_management(management: Endpoint, default_vhost: str | None,
                    timeout: float = 5.0) -> QueuePolicies:
    """Queue arguments read through RabbitMQ's management API (``--upstream-management``); a
    client that named no vhost is in the bridge's upstream one."""
    return QueuePolicies(lambda vhost, queue: queue_arguments(
        management, vhost or default_vhost, queue, timeout))


def declared_policies(settings: Settings) -> Callable[[str], Policy | None] | None:
    """For ``policy show``: the policy a queue's arguments declare, read now (None when the
    bridge cannot read them: not RabbitMQ, or no ``--upstream-management``). A queue whose
    arguments cannot be read or taken is said so on stderr, and the configuration applies."""
    from bridge.app.config import bridge_amqp

    management = settings.upstream_management
    if settings.broker != "rabbitmq" or management is None:
        return None
    vhost = bridge_amqp(settings).vhost

    def declared(queue: str) -> Policy | None:
        try:
            return parse_queue_args(queue_arguments(management, vhost, queue) or {}, queue)
        except (BrokerUnavailable, ConfigError) as exc:
            print(f"queue {queue}: its arguments not taken: {exc}", file=sys.stderr)
            return None

    return declared

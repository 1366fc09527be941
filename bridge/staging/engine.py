"""The staging engine: walks staged messages down the level queues and releases them when due.

Each level queue holds messages that all wait the same time, so only its head matters: the engine
peeks the head, and either puts it back and remembers when it exits (no look at that level again
until then) or moves it on. A head that exits goes to the queue for the time it still has to
wait (a lower level, or the ready queue); one that is due goes to its target. The ready queue
(less than ``2**MIN_LEVEL`` ms to go) is consumed with a prefetch into an in-memory heap, and each
message is released when ``now >= due``, never before. So the engine holds in memory at most the
ready prefetch plus one batch of level heads, however many messages are pending.

Crash safety is the adapter's ``settle``: every replacement is confirmed before its original is
acknowledged, and the engine never acknowledges a message without its replacement in the same
``settle`` call (or, for an expired one, on purpose). Anything held when the connection is lost
goes back to its queue and is met again after the reconnect: a crash may duplicate a hop or a
release, never lose a message.

Settling, and what becomes of a move the broker refuses, are ``bridge.staging.engine_settling``'s;
carrying out operators' orders ``bridge.staging.engine_orders``'s.

``step(now_ms)`` is one iteration without blocking, so tests drive the engine with their own
clock; ``run(stop)`` is the thread's loop around it, waiting in ``poll`` (which also services the
connection) until the next thing is due.
"""

from __future__ import annotations

import collections
import concurrent.futures
import heapq
import itertools
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import structlog
from structlog.typing import FilteringBoundLogger

from adapters.base import Held, Message, Move, StagingBroker
from bridge.staging import series
from bridge.staging.catalogue import Catalogue
from bridge.staging.engine_orders import OperatorOrders
from bridge.staging.engine_settling import Settling
from bridge.staging.engine_work import Work, WorkKind
from bridge.staging.envelope import (
    DUE,
    EXPIRED_ON,
    FAILED_AT,
    MESSAGE_ID,
    REASON,
    REASON_CODE,
    REASON_TEXT,
    Staged,
    hop_headers,
    released_headers,
    staged_headers,
)
from bridge.staging.failures import FailurePath, FailureSettings
from bridge.staging.levels import MIN_LEVEL, Layout
from bridge.staging.orders import NOTE, Orders
from bridge.staging.outcomes import LogSink, Sink, StatsSink
from bridge.staging.staging_stats import StagingStats
from policies.backoff import backoff_ms
from policies.errors import BrokerUnavailable, PutRefused, Refused

__all__ = ["FAILED_AT", "REASON", "REASON_CODE", "REASON_TEXT", "Engine"]

HORIZON_MS = 1 << MIN_LEVEL
# Levels whose dwell is at most this are consumed with a prefetch, their heads held in memory
# (no round trip per head, held far less than RabbitMQ's 30 min consumer timeout); longer
# levels are peeked and their heads put back.
STREAM_MAX_MS = 1 << 16
# A streamed level's head is taken up to this long before it exits. Messages sent in a burst
# leave their levels in a burst too (a 10,000-message burst of 1-10 s delays had 4,600 exits
# from the 4 s level within a second, more than the engine settles in that time); taken early,
# that work spreads over the time before the exits. A head taken early goes to the queue for the
# time it has left then, or is held for release when that is under HORIZON_MS + LEAD_MS.
LEAD_MS = 1 << (MIN_LEVEL - 1)
# Streamed heads are taken off their buffers (no I/O) and sorted at once: those to hold go to the
# release heap, those to hop wait in a queue of their own, and the hops are settled with the
# releases, SLICE of them when a release is due within SOON_MS, else up to the batch. A hop's
# next queue is chosen when it is settled, from the time left then: one that waited so long
# that it is due within the horizon is held instead. So a burst of exits never keeps a release
# waiting, and the longer hops wait, the fewer of them are needed.
SLICE = 16
SOON_MS = 5
# Heads taken between two looks at whether a held message has come due.
CHECK_EVERY = 64
PENDING_EVERY_MS = 5_000  # how often the pending gauge is refreshed
# The long levels and the failure queues are declared after the connect once something was
# released, or this long after it.
DECLARE_LATER_MS = 200
# Counting is a round trip or more (5-17 ms on this machine) that releases would wait for: it
# waits for a gap of COUNT_GAP_MS before the next release or level exit, up to PENDING_LATE_MS
# (under a steady 1,000 releases a second there is no such gap).
COUNT_GAP_MS = 25
PENDING_LATE_MS = 60_000
COUNT_WAIT_S = 0.5  # how long a count may hold up the release loop
# After the broker could not say (no statistics plugin, or too busy to answer in COUNT_WAIT_S):
# again after PENDING_RETRY_MS, doubling each time up to PENDING_RETRY_MAX_MS.
PENDING_RETRY_MS = 5_000
PENDING_RETRY_MAX_MS = 3_600_000
# Copies of scheduler series remembered as released (``Engine._released_copy``): many more than
# are released within the time a duplicate copy can take to come due after its twin.
SERIES_MEMORY = 65_536


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class Stop(Protocol):
    """What ``run`` needs of its stop signal (a threading or multiprocessing Event)."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class Engine(Settling, OperatorOrders):
    """Moves and releases staged messages; one per thread, owning its adapter."""

    def __init__(
        self,
        broker: StagingBroker,
        layout: Layout,
        *,
        clock: Callable[[], int] = _wall_ms,
        stats: StagingStats,
        log: FilteringBoundLogger | None = None,
        ready_prefetch: int = 5000,
        idle_poll_s: float = 0.2,
        batch: int = 500,
        recheck_s: float = 5.0,
        backoff_s: tuple[float, float] = (0.5, 10.0),
        backoff_jitter: float = 0.0,
        level_prefetch: int = 1000,
        lead_ms: int = LEAD_MS,
        sinks: Sequence[Sink] = (),
        failures: FailureSettings | None = None,
        catalogue: Catalogue | None = None,
    ) -> None:
        """``sinks`` get the outcomes of what the broker confirmed, after the engine's own
        counters and log lines (``StatsSink``, ``LogSink``). ``catalogue``: the bridge's staged
        catalogue, read to answer the tools' list orders (one of ``sinks`` keeps it)."""
        if batch < 1 or ready_prefetch < 1:
            raise ValueError("batch and ready_prefetch must be at least 1")
        if not 0 <= lead_ms <= HORIZON_MS // 2:
            # A longer lead could take a head out of the smallest level before it has gone
            # down at all, and hop it into that level again.
            raise ValueError(f"lead_ms must be from 0 to {HORIZON_MS // 2}")
        self.broker = broker
        self.layout = layout
        self.clock = clock
        self.stats = stats
        self.log = (log or structlog.get_logger("staging")).bind(broker=broker.name,
                                                                prefix=layout.prefix)
        self.sinks: tuple[Sink, ...] = (StatsSink(stats), LogSink(self.log), *sinks)
        self.failures = FailurePath(broker, failures or FailureSettings(), emit=self._emit,
                                    clock=clock)
        self._blocked: set[str] = set()  # message ids kept: their dead-letter home refused
        self.ready_prefetch = ready_prefetch
        self.batch = batch
        self.invalid_queue = layout.invalid
        # Not released by the engine: an operator looks at it (IBM MQ: the dead-letter queue).
        self.undeliverable_queue = layout.undeliverable
        self._idle_ms = max(1, round(idle_poll_s * 1000))
        # A put-back head is looked at again at its exit time, and at least this often in case
        # an operator took it away and the level is now empty or headed by another.
        self._recheck_ms = max(self._idle_ms, round(recheck_s * 1000))
        self._backoff_first_ms, self._backoff_max_ms = (round(s * 1000) for s in backoff_s)
        self.backoff_jitter = backoff_jitter
        # ActiveMQ gives the same head to repeated peeks until it is settled, so a level yields
        # one head per settle there; RabbitMQ (basic.get) gives the next one.
        self._peek_advances = broker.format.peek_advances
        self._dwell = {queue: dwell for dwell, queue in layout.levels}
        self.level_prefetch = level_prefetch
        self.lead_ms = lead_ms
        self._streamed = [q for q, dwell in self._dwell.items() if dwell <= STREAM_MAX_MS]
        self._peeked = [q for q in self._dwell if q not in self._streamed]
        # Streamed level -> its delivered messages in queue order, with when to take each:
        # its exit time less the lead.
        self._buffers: dict[str, collections.deque[tuple[int, Held]]] = {
            q: collections.deque() for q in self._streamed
        }
        # An empty level is looked at again after an eighth of its dwell (within the idle poll
        # and the recheck): a message entering it is then seen long before it can exit, and an
        # idle engine peeks the slow levels rarely (an empty peek costs a wait on ActiveMQ).
        self._empty_ms = {
            queue: min(max(dwell // 8, self._idle_ms), self._recheck_ms)
            for queue, dwell in self._dwell.items()
        }
        self._ready_dest = ""
        self._invalid_dest = ""
        self._undeliverable_dest = ""
        self._pending_at = 0  # when to count again
        self._pending_failed = 0
        self._heap: list[tuple[int, int, Held, Staged]] = []  # (due, seq, held, staged)
        self._seq = itertools.count()
        self._pending: list[Work] = []  # found by poll, settled with the next releases
        # Streamed heads to hop, in the order taken; their next queue is chosen when settled.
        self._hops: collections.deque[tuple[Held, Staged]] = collections.deque()
        self._next_look: dict[str, int] = {}  # level queue -> epoch ms; absent = look now
        # Operators' orders (cancel, release now) heard on the control topic, by message id:
        # carried out on the held copy at once, and on any copy met while they stand.
        self._orders = Orders()
        self._series: collections.OrderedDict[tuple[str, str], bool] = (
            collections.OrderedDict())
        self._series_batch: set[tuple[str, str]] = set()  # continued by the work being built
        self._answers: list[tuple[str, Message]] = []  # (reply topic, answer) to publish
        self.catalogue = catalogue
        # List orders the catalogue's reader thread is answering: (reply topic, answer).
        self._listings: list[tuple[str, concurrent.futures.Future[Message]]] = []
        self._moved: collections.deque[tuple[int, str, Mapping[str, str], int]] = (
            collections.deque())
        self._moved_forgotten_ms = -1
        self._restore_orders(clock())
        self._connected = False
        self._connected_at = 0
        self._undeclared: list[str] = []  # staging queues to declare after the connect
        # The ``Held.queue`` of the messages the broker expired on its own (``watch_expiries``).
        self._expiries: str | None = None
        self._settled_since_connect = False
        self._reconnect_at = 0
        self._failures = 0

    # -- the loop ---------------------------------------------------------------------------

    def run(self, stop: Stop) -> None:
        """Move and release until ``stop`` is set; survives the broker going away."""
        self.log.info("staging engine started", ready_prefetch=self.ready_prefetch,
                      batch=self.batch)
        try:
            while not stop.is_set():
                try:
                    wait = self.step(self.clock())
                    if wait > 0:
                        self._wait(wait, stop)
                except BrokerUnavailable as error:  # from _wait's poll
                    self._lost(error, self.clock())
                except Exception as error:  # a bug: give everything back and start over
                    self.log.exception("staging engine step failed")
                    self._lost(error, self.clock())
        finally:
            self.close()
            self.log.info("staging engine stopped")

    def step(self, now_ms: int) -> float:
        """One iteration at ``now_ms``, without blocking: take what the ready subscription
        delivered, release what is due, move the level heads that exit, release again. Returns
        the seconds until there is more to do (0 when a batch limit left work behind)."""
        if not self._connected:
            if now_ms < self._reconnect_at:
                return (self._reconnect_at - now_ms) / 1000
            try:
                self._connect(now_ms)
            except BrokerUnavailable as error:
                return self._lost(error, now_ms)
        try:
            # What is due goes in the same settle call as the level moves (one round trip),
            # and again after them: a held message coming due meanwhile cuts them short. The
            # second poll takes what the hops just put on the ready queue.
            self._absorb(self.broker.poll(0), now_ms)
            more = self._move_levels(now_ms, self._due(now_ms))
            now_ms = max(now_ms, self.clock())
            self._absorb(self.broker.poll(0), now_ms)
            self._release(now_ms)
            self._declare_rest(now_ms)
            if self._listings:
                self._listed()
            if self._answers:
                self._answer()
            if not more and self._count_due(now_ms):
                self._count_pending(now_ms)
        except BrokerUnavailable as error:
            return self._lost(error, now_ms)
        if now_ms - self._connected_at >= self._backoff_max_ms:
            self._failures = 0
        return 0.0 if more else self._until_next_ms(now_ms) / 1000

    def pending(self) -> int | None:
        """Messages on the staging queues (levels and ready) as last counted; None until
        counted or when the broker could not say. Safe from any thread."""
        return self.stats.pending_count

    def _count_due(self, now_ms: int) -> bool:
        """Whether to count the pending messages now: PENDING_EVERY_MS after the last count, in
        a gap of COUNT_GAP_MS before anything else is due, or PENDING_LATE_MS late without."""
        if now_ms < self._pending_at:
            return False
        if now_ms >= self._pending_at + PENDING_LATE_MS:
            return True
        return self._until_next_ms(max(now_ms, self.clock())) >= COUNT_GAP_MS

    def _count_pending(self, now_ms: int) -> None:
        """Ask the broker for the staging queues' depths, at most every PENDING_EVERY_MS."""
        try:
            counted = self.broker.depths(self.layout.queues, wait_s=COUNT_WAIT_S)
            self.stats.pending_count = sum(counted.values())
        except BrokerUnavailable as error:
            # A broker that cannot say costs the release loop a wait each time: ask ever less
            # often, from 5 s (a broker busy for a moment) up to an hour (one without the
            # statistics plugin).
            self.stats.pending_count = None
            retry_ms = min(PENDING_RETRY_MAX_MS, PENDING_RETRY_MS << self._pending_failed)
            self._pending_at = now_ms + retry_ms
            if not self._pending_failed:
                self.log.warning("cannot count pending messages", error=str(error),
                                 retry_in_s=retry_ms / 1000)
            self._pending_failed = min(self._pending_failed + 1, 10)
            return
        self._pending_failed = 0
        self._pending_at = now_ms + PENDING_EVERY_MS

    def close(self) -> None:
        """Close the adapter; whatever the engine held goes back to its queue."""
        self._forget()
        try:
            self.broker.close()
        except BrokerUnavailable:
            pass

    # -- connection -------------------------------------------------------------------------

    def _connect(self, now_ms: int) -> None:
        started = time.monotonic()
        self.broker.connect()
        connected = time.monotonic()
        # The queues it subscribes to first; the long levels (the deep ones: RabbitMQ answers a
        # declare of one slowly for a second or two after a bridge was killed) and the failure
        # queues once the first releases are out (``_declare_rest``).
        first = [self.layout.ready, *self._streamed]
        self.broker.ensure_queues(first)
        self._undeclared = [q for q in (*self.layout.queues, self.invalid_queue,
                                        self.undeliverable_queue) if q not in first]
        declared = time.monotonic()
        self._ready_dest = self.broker.format.client_destination(self.layout.ready)
        self._invalid_dest = self.broker.format.client_destination(self.invalid_queue)
        self._undeliverable_dest = self.broker.format.client_destination(self.undeliverable_queue)
        self.failures.undeliverable = self._undeliverable_dest
        self.broker.subscribe(self.layout.ready, self.ready_prefetch)
        for queue in self._streamed:
            self.broker.subscribe(queue, self.level_prefetch)
        try:
            self.broker.listen(self.layout.control)
        except Refused as refused:
            self.log.warning(
                "cannot listen to the control topic: staged cancel and release will not reach "
                "the messages this engine holds (those due within about two minutes)",
                topic=self.layout.control, error=str(refused),
            )
        self._connected = True
        self._connected_at = now_ms
        self._settled_since_connect = False
        done = time.monotonic()
        self.log.info("staging engine connected", connect_s=round(connected - started, 3),
                      declare_s=round(declared - connected, 3),
                      subscribe_s=round(done - declared, 3))

    def _declare_rest(self, now_ms: int) -> None:
        """Declare the queues ``_connect`` left, once something was released since it or
        DECLARE_LATER_MS after it. Until then the long levels are not peeked."""
        if not self._undeclared or (
            not self._settled_since_connect and now_ms < self._connected_at + DECLARE_LATER_MS
        ):
            return
        started = time.monotonic()
        self.broker.ensure_queues(self._undeclared)
        self._expiries = self.broker.watch_expiries(self.layout.expired)
        self.log.debug("staging queues declared", queues=len(self._undeclared),
                       seconds=round(time.monotonic() - started, 3), expiries=self._expiries)
        self._undeclared = []

    def _lost(self, error: Exception, now_ms: int) -> float:
        """Close, forget what was held (the broker redelivers it), and schedule a reconnect
        with a capped exponential backoff. Returns the wait in seconds."""
        self._failures += 1
        self.stats.reconnects += 1
        # Jittered, so that the engines of several bridges do not knock in step.
        wait_ms = backoff_ms(self._failures, initial_ms=self._backoff_first_ms,
                             max_ms=self._backoff_max_ms, jitter=self.backoff_jitter,
                             rand=random.random())
        # Retries come every half second at most: a line for the first and then every 100th.
        say = self.log.warning if self._failures % 100 == 1 else self.log.debug
        say("broker unavailable, reconnecting", error=str(error), retry_in_s=wait_ms / 1000,
            failures=self._failures)
        self.close()
        self._reconnect_at = now_ms + wait_ms
        return wait_ms / 1000

    def _forget(self) -> None:
        # What was held goes back to its queue: a listing may have read that queue already.
        now_ms = self.clock()
        for held in (*self._held(), *(w.move.held for w in self._pending)):
            self._let_go(held.queue, held.message.headers, len(held.message.body), now_ms)
        self._connected = False
        self._expiries = None
        self._heap.clear()
        self._pending.clear()
        self._hops.clear()
        self._next_look.clear()
        for buffer in self._buffers.values():
            buffer.clear()

    def _wait(self, seconds: float, stop: Stop) -> None:
        """Wait in ``poll`` while connected: it returns early when a ready message arrives and
        keeps the connection serviced."""
        if self._connected:
            self._absorb(self.broker.poll(seconds), self.clock())
        else:
            stop.wait(seconds)

    def _until_next_ms(self, now_ms: int) -> int:
        soonest = now_ms + self._idle_ms
        if self._pending or self._hops:
            return 0
        if self._heap:
            soonest = min(soonest, self._heap[0][0])
        for buffer in self._buffers.values():
            if buffer:
                soonest = min(soonest, buffer[0][0])
        if self._undeclared:  # the long levels wait for their declare (``_declare_rest``)
            soonest = min(soonest, self._connected_at + DECLARE_LATER_MS)
        elif len(self._next_look) < len(self._peeked):
            return 0
        if self._next_look:
            soonest = min(soonest, min(self._next_look.values()))
        return max(0, soonest - now_ms)

    # -- level queues -----------------------------------------------------------------------

    def _move_levels(self, now_ms: int, work: list[Work]) -> bool:
        """Take every level head that may exit by now; settle the moves, after ``work`` (the
        releases that are due), in one call, or two when a level is peeked (a round trip each,
        so the releases are settled first). Returns whether the batch limit left exits behind."""
        looks = self._next_look
        due_levels = [] if self._undeclared else sorted(
            (looks.get(queue, -1), queue) for queue in self._peeked
            if looks.get(queue, -1) <= now_ms
        )
        releasing = bool(work)
        taken = 0  # level messages held by this call: moves and holds
        more = False
        for queue, buffer in self._buffers.items():  # heads in memory: no round trip
            dwell = self._dwell[queue]
            while buffer and buffer[0][0] <= now_ms:
                if taken >= self.batch or (
                    taken % CHECK_EVERY == CHECK_EVERY - 1 and self._ready_due()
                ):
                    more = True
                    break
                _, head = buffer.popleft()
                item = self._exit(head, dwell, now_ms, lead_ms=self.lead_ms, streamed=True)
                assert not isinstance(item, int)
                taken += 1
                if item.kind is WorkKind.HOLD:
                    assert item.staged is not None
                    heapq.heappush(self._heap, (item.staged.due_ms, next(self._seq), head,
                                                item.staged))
                elif item.kind is WorkKind.HOP:
                    assert item.staged is not None
                    self._hops.append((head, item.staged))
                else:
                    work.append(item)
        work += self._take_hops()
        more = more or bool(self._hops)
        for i, (_, queue) in enumerate(due_levels):
            # Peeks take time (a wait, on ActiveMQ, when a level is empty): once one level is
            # done, a ready message come due meanwhile goes first and the rest wait a step.
            if taken >= self.batch or (i and self._ready_due()):
                more = True
                break
            if releasing:  # a peek is a round trip: the releases go first
                self._settle(work, now_ms)
                work, releasing = [], False
            dwell = self._dwell[queue]
            while taken < self.batch:  # at most ``batch`` level messages taken at once
                held = self.broker.peek(queue)
                if held is None:
                    looks[queue] = now_ms + self._empty_ms[queue]
                    break
                item = self._exit(held, dwell, now_ms)
                if isinstance(item, int):
                    self.broker.put_back(held)
                    self._let_go(queue, held.message.headers, len(held.message.body), now_ms)
                    looks[queue] = min(item, now_ms + self._recheck_ms)
                    break
                taken += 1
                if item.kind is WorkKind.HOLD:
                    assert item.staged is not None
                    heapq.heappush(self._heap, (item.staged.due_ms, next(self._seq), held,
                                                item.staged))
                    continue
                work.append(item)
                if not self._peek_advances:
                    looks[queue] = now_ms
                    more = True
                    break
            else:
                looks[queue] = now_ms
                more = True
        self._settle(work, now_ms)
        return more

    def _take_hops(self) -> list[Work]:
        """The hop moves to settle now, their queues chosen for the time left now: SLICE of
        them when a release is due within SOON_MS, else up to the batch. A head with less than
        the horizon (and the lead) left by now is held instead."""
        hops = self._hops
        if not hops:
            return []
        now_ms = self.clock()
        heap = self._heap
        limit = SLICE if heap and heap[0][0] - now_ms <= SOON_MS else self.batch
        out: list[Work] = []
        hold_under = HORIZON_MS + self.lead_ms
        while hops and len(out) < limit:
            held, staged = hops.popleft()
            if staged.due_ms - now_ms < hold_under:
                heapq.heappush(heap, (staged.due_ms, next(self._seq), held, staged))
            else:
                out.append(self._hop(held, staged, now_ms))
        return out

    def _ready_due(self) -> bool:
        """Whether a held ready message has come due while the levels were being looked at."""
        return bool(self._heap) and self._heap[0][0] <= self.clock()

    def _exit(
        self, held: Held, dwell: int, now_ms: int, *, lead_ms: int = 0, streamed: bool = False
    ) -> Work | int:
        """What to do with a level head: a move, or (when it is still waiting) when to look again:
        its exit time, less ``lead_ms`` (a head may be taken that much early). A ``streamed``
        head (delivered by a subscription) can always be held for release, and its HOP is only
        named: ``_take_hops`` builds it when it is settled."""
        try:
            staged = Staged.of(held.message.headers)
        except (KeyError, ValueError) as error:
            return self._invalid(held, error)
        if self._orders and (order := self._order_for(held, staged.message_id, now_ms)):
            return self._carry_out(order, held, staged, now_ms)
        if staged.expires_ms is not None and staged.expires_ms <= now_ms:
            return Work(WorkKind.EXPIRE, Move(held), staged)
        if staged.due_ms <= now_ms:  # late (the engine was away): straight to the target
            return self._released(held, staged, now_ms)
        exit_ms = staged.entered_ms + dwell - lead_ms
        if exit_ms > now_ms:
            return exit_ms
        if (streamed or self._peek_advances) and staged.due_ms - now_ms < HORIZON_MS + lead_ms:
            # Due within the horizon: hold it for release as a ready message would be held,
            # instead of putting it to the ready queue first. One put instead of two; held
            # for under a second, and given back if the connection goes.
            return Work(WorkKind.HOLD, Move(held), staged)
        if streamed:
            return Work(WorkKind.HOP, Move(held), staged)
        return self._hop(held, staged, now_ms)

    def _hop(self, held: Held, staged: Staged, now_ms: int) -> Work:
        queue = self.layout.queue_for(staged.due_ms - now_ms)
        destination = (
            self._ready_dest if queue == self.layout.ready
            else self.broker.format.client_destination(queue)
        )
        message = Message(hop_headers(held.message.headers, now_ms=now_ms), held.message.body)
        return Work(WorkKind.HOP, Move(held, destination, message), staged, queue=queue)

    # -- the ready queue --------------------------------------------------------------------

    def _absorb(self, delivered: Sequence[Held], now_ms: int) -> None:
        """Take the ready subscription's deliveries into the heap."""
        control, orders = self.layout.control, self._orders
        for held in delivered:
            if held.queue == control:
                self._take_order(held.message, now_ms)
                continue
            if held.queue == self._expiries:
                self._pending.append(self._broker_expired(held, now_ms))
                continue
            if NOTE in held.message.headers:
                self._pending.append(self._noted(held, now_ms))
                continue
            buffer = self._buffers.get(held.queue)
            try:
                staged = Staged.of(held.message.headers)
            except (KeyError, ValueError) as error:
                self._pending.append(self._invalid(held, error))
                continue
            if orders and (order := self._order_for(held, staged.message_id, now_ms)):
                self._pending.append(self._carry_out(order, held, staged, now_ms))
                continue
            if buffer is not None:
                buffer.append((staged.entered_ms + self._dwell[held.queue] - self.lead_ms, held))
                continue
            if staged.due_ms - now_ms >= 2 * HORIZON_MS:
                # Not ours to hold (a clock step, a tool): back to the level it belongs in,
                # so the prefetch is kept for what is due soon.
                self._pending.append(self._hop(held, staged, now_ms))
                continue
            heapq.heappush(self._heap, (staged.due_ms, next(self._seq), held, staged))

    def _broker_expired(self, held: Held, now_ms: int) -> Work:
        """A message the broker expired on its own: dropped unless it asked for a report or to
        be kept, or its destination's policy names an expiry destination; then, read as a
        staged copy that expired, it takes the staged expiry's path (``_expired``), its move to
        the undelivered queue kept on the staging queues if that queue refuses it."""
        expiry = self.broker.expiry_of(held.message)
        if expiry is None or self.failures.routine_expiry(expiry.message.headers,
                                                          expiry.destination):
            return Work(WorkKind.DROP, Move(held))
        headers = expiry.message.headers
        id_header = self.broker.format.message_id_header
        if expiry.message_id and MESSAGE_ID not in headers and not (
            id_header and headers.get(id_header)
        ):  # ActiveMQ's own id: the application's message id
            headers = {**headers, MESSAGE_ID: expiry.message_id}
        sent = headers.get("timestamp", "")
        sent_ms = int(sent) if sent.isdigit() else expiry.expired_ms
        staged = dict(staged_headers(
            headers, self.broker.format, target=expiry.destination,
            staging_destination=self._ready_dest, due_ms=expiry.expired_ms, sent_ms=sent_ms,
            expires_ms=expiry.expired_ms, drop=()))
        staged[EXPIRED_ON] = expiry.destination
        copy = Held(held.queue, Message(staged, held.message.body), held.token)
        return Work(WorkKind.EXPIRE, Move(copy), Staged.of(staged))

    def _release(self, now_ms: int) -> None:
        """Release every held message that is due, in one settle call."""
        self._settle(self._due(now_ms), now_ms)

    def _due(self, now_ms: int) -> list[Work]:
        """The releases (and expiries) of the held messages that are due, with the moves
        ``poll`` found."""
        work, self._pending = self._pending, []
        heap = self._heap
        while heap and heap[0][0] <= now_ms:
            _, _, held, staged = heapq.heappop(heap)
            if staged.expires_ms is not None and staged.expires_ms <= now_ms:
                work.append(Work(WorkKind.EXPIRE, Move(held), staged))
            else:
                work.append(self._released(held, staged, now_ms))
        return work

    def _released(
        self, held: Held, staged: Staged, now_ms: int, *, go_on: bool = True
    ) -> Work:
        """The release of a held staged copy; one of a scheduler series stages the next copy
        too, unless not ``go_on`` (released on an operator's order: the series ends)."""
        headers = released_headers(held.message.headers, self.broker.format, now_ms=now_ms)
        if series.is_series(held.message.headers):
            if go_on:
                return self._released_copy(held, staged, headers, now_ms)
            headers = series.as_copy(headers, held.message.headers,
                                     self.broker.format.message_id_header)
        move = Move(held, staged.target, Message(headers, held.message.body),
                    mandatory=staged.mandatory)
        return Work(WorkKind.RELEASE, move, staged)

    def _released_copy(
        self, held: Held, staged: Staged, headers: dict[str, str], now_ms: int
    ) -> Work:
        """A copy of a scheduler series: put to its target (confirmed) now, then its staged
        copy is replaced by the next one (or acknowledged, the series over) in the settle.
        A crash before that settle puts this copy again (it was in flight) and may stage the
        next one twice: both copies are one occurrence (``series.key_of``), and once one of
        them is settled here the other is dropped when it is met."""
        staged_headers_ = held.message.headers
        key = series.key_of(staged_headers_)
        done = self._series.get(key)
        if done or key in self._series_batch:  # its next copy is staged (or being staged)
            return Work(WorkKind.DROP, Move(held), staged)
        fmt = self.broker.format
        message = Message(series.as_copy(headers, staged_headers_, fmt.message_id_header),
                          held.message.body)
        if done is None:
            try:
                self.broker.publish(staged.target, message, mandatory=staged.mandatory)
            except PutRefused as refused:
                # As any release refused: message-retry or the failure path; the series goes
                # on from the copy that is eventually released.
                return self._refused(Work(WorkKind.RELEASE, Move(
                    held, staged.target, message, mandatory=staged.mandatory), staged),
                    refused, now_ms)
            self._remember(key, False)
        self._series_batch.add(key)
        following = series.next_copy(staged_headers_, now_ms)
        if following is None:
            return Work(WorkKind.SERIES, Move(held), staged, series_key=key)
        due = int(following[DUE])
        queue = self.layout.queue_for(due - now_ms)
        destination = (self._ready_dest if queue == self.layout.ready
                       else fmt.client_destination(queue))
        move = Move(held, destination, Message(following, held.message.body))
        return Work(WorkKind.SERIES, move, staged, queue=queue, series_key=key)

    def _remember(self, key: tuple[str, str], continued: bool) -> None:
        """Which copies of series this engine released (False) and replaced by their next
        copy (True): a bounded memory, oldest first out."""
        self._series[key] = continued
        self._series.move_to_end(key)
        if len(self._series) > SERIES_MEMORY:
            self._series.popitem(last=False)

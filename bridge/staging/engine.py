"""The staging engine: walks staged messages down the level queues and releases them when due.

A small loop around the parts it owns, each in a file of its own: ``Holding`` (what it holds
in memory between steps), ``LevelMover`` (the level heads that exit, and the deliveries),
``Releaser`` (the move that releases a due copy), ``Settler`` (settles moves with the broker and
tells what it did) and ``OperatorOrders`` (the orders heard on the control topic).

A delayed publish: the front-end puts a staged copy (``bridge.staging.envelope``) on the level
queue for its delay (``bridge.staging.levels``). Each ``step``, ``LevelMover.absorb`` takes what
the subscriptions delivered (a short level's copies wait in its buffer in ``Holding``), and
``LevelMover.move`` takes each level head that exits (off its buffer, or peeked off a long
level): it hops to the queue for the time it has left, in a ``Settler.settle`` that confirms
the copy before it acknowledges the original, or, due within the horizon, is held in
``Holding``'s release heap (as is what arrives on the ready queue).

A release: ``LevelMover.due`` pops each held copy that is due, ``Releaser.released`` makes its
move to the target, and ``Settler.settle`` puts it and acknowledges the staged copy (a refused
put is retried later or takes the failure path), then hands the outcomes to the sinks and the
answers to the tools whose orders it carried out (``OperatorOrders.take`` carried an order out on
every held copy of its message).

The engine holds at most the ready prefetch plus one batch of level heads, however many messages
are pending. Nothing is acknowledged without its replacement confirmed in the same ``settle``
(or, for an expired one, on purpose), and anything held when the connection is lost goes back
to its queue: a crash may duplicate a hop or a release, never lose a message.

``step(now_ms)`` is one iteration without blocking, so tests drive the engine with their own
clock; ``run(stop)`` is the thread's loop around it, waiting in ``poll`` (which also services the
connection) until the next thing is due.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import structlog
from structlog.typing import FilteringBoundLogger

from adapters.base import Message, StagingBroker
from bridge.staging.catalogue import Catalogue
from bridge.staging.engine_holding import Holding
from bridge.staging.engine_levels import (
    HORIZON_MS,
    LEAD_MS,
    STREAM_MAX_MS,
    LevelMover,
    streamed_levels,
)
from bridge.staging.engine_orders import OperatorOrders
from bridge.staging.engine_release import Releaser
from bridge.staging.engine_settling import Settler
from bridge.staging.engine_work import Destinations
from bridge.staging.envelope import FAILED_AT, REASON, REASON_CODE, REASON_TEXT
from bridge.staging.failures import FailurePath, FailureSettings
from bridge.staging.levels import Layout
from bridge.staging.orders import Orders
from bridge.staging.outcomes import LogSink, MessageOutcome, Sink, StatsSink
from bridge.staging.series import SeriesMemory
from bridge.staging.staging_stats import StagingStats
from policies.backoff import backoff_ms
from policies.errors import BrokerUnavailable, Refused

__all__ = ["FAILED_AT", "HORIZON_MS", "LEAD_MS", "REASON", "REASON_CODE", "REASON_TEXT",
           "STREAM_MAX_MS", "Engine"]

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


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class Stop(Protocol):
    """What ``run`` needs of its stop signal (a threading or multiprocessing Event)."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class Engine:
    """Moves and releases staged messages; one per thread, owning its adapter and its parts."""

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
        self.catalogue = catalogue
        self.ready_prefetch = ready_prefetch
        self.level_prefetch = level_prefetch
        self.batch = batch
        self._idle_ms = max(1, round(idle_poll_s * 1000))
        # A put-back head is looked at again at its exit time, and at least this often in case
        # an operator took it away and the level is now empty or headed by another.
        recheck_ms = max(self._idle_ms, round(recheck_s * 1000))
        self._backoff_first_ms, self._backoff_max_ms = (round(s * 1000) for s in backoff_s)
        self.backoff_jitter = backoff_jitter

        # The parts, and the state two of them share.
        self.destinations = Destinations(layout, broker.format)
        self.holding = Holding(streamed_levels(layout))
        standing = Orders()
        answers: list[tuple[str, Message]] = []  # (reply topic, answer) to publish
        series = SeriesMemory()
        self.settler = Settler(
            broker, layout, clock=clock, stats=stats, emit=self._emit, failures=self.failures,
            destinations=self.destinations, holding=self.holding, standing=standing,
            answers=answers, series=series, settled=self._settled)
        self.releaser = Releaser(broker, layout, destinations=self.destinations, series=series,
                                 settler=self.settler)
        self.orders = OperatorOrders(
            broker, layout, log=self.log, catalogue=catalogue, standing=standing,
            answers=answers, holding=self.holding, destinations=self.destinations,
            releaser=self.releaser)
        self.mover = LevelMover(
            broker, layout, clock=clock, holding=self.holding, destinations=self.destinations,
            failures=self.failures, settler=self.settler, releaser=self.releaser,
            orders=self.orders, batch=batch, lead_ms=lead_ms, idle_ms=self._idle_ms,
            recheck_ms=recheck_ms)
        self.orders.restore(clock())

        self._pending_at = 0  # when to count again
        self._pending_failed = 0
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
            # second poll takes what the hops just put on the ready queue. Until the long
            # levels are declared (``_declare_rest``) they are not peeked.
            mover = self.mover
            mover.absorb(self.broker.poll(0), now_ms, expiries=self._expiries)
            more = mover.move(now_ms, mover.due(now_ms), peek=not self._undeclared)
            now_ms = max(now_ms, self.clock())
            mover.absorb(self.broker.poll(0), now_ms, expiries=self._expiries)
            mover.release(now_ms)
            self._declare_rest(now_ms)
            self.orders.answer()
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
        first = [self.layout.ready, *self.mover.streamed]
        self.broker.ensure_queues(first)
        self._undeclared = [q for q in (*self.layout.queues, self.layout.invalid,
                                        self.layout.undeliverable) if q not in first]
        declared = time.monotonic()
        self.destinations.name()
        self.failures.undeliverable = self.destinations.undeliverable
        # The tools count the running engines by the ready queue's consumers and wait for an
        # answer from each: an engine counted must already hear the control topic.
        try:
            self.broker.listen(self.layout.control)
        except Refused as refused:
            self.log.warning(
                "cannot listen to the control topic: staged cancel and release will not reach "
                "the messages this engine holds (those due within about two minutes)",
                topic=self.layout.control, error=str(refused),
            )
        self.broker.subscribe(self.layout.ready, self.ready_prefetch)
        for queue in self.mover.streamed:
            self.broker.subscribe(queue, self.level_prefetch)
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
        """What was held goes back to its queue (the broker redelivers it)."""
        self.holding.give_back(self.clock())
        self._connected = False
        self._expiries = None

    def _wait(self, seconds: float, stop: Stop) -> None:
        """Wait in ``poll`` while connected: it returns early when a ready message arrives and
        keeps the connection serviced."""
        if self._connected:
            self.mover.absorb(self.broker.poll(seconds), self.clock(), expiries=self._expiries)
        else:
            stop.wait(seconds)

    def _until_next_ms(self, now_ms: int) -> int:
        holding = self.holding
        soonest = now_ms + self._idle_ms
        if holding.pending or holding.hops:
            return 0
        if holding.heap:
            soonest = min(soonest, holding.heap[0][0])
        for buffer in holding.buffers.values():
            if buffer:
                soonest = min(soonest, buffer[0][0])
        if self._undeclared:  # the long levels wait for their declare (``_declare_rest``)
            soonest = min(soonest, self._connected_at + DECLARE_LATER_MS)
        elif len(holding.next_look) < len(self.mover.peeked):
            return 0
        if holding.next_look:
            soonest = min(soonest, min(holding.next_look.values()))
        return max(0, soonest - now_ms)

    # -- what the parts call back -----------------------------------------------------------

    def _emit(self, outcomes: Sequence[MessageOutcome]) -> None:
        for sink in self.sinks:
            sink(outcomes)

    def _settled(self) -> None:
        """The broker confirmed a settle: the connection works (the backoff starts over)."""
        self._failures = 0
        self._settled_since_connect = True

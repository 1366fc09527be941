"""Counters of the staging engine, exposed to Prometheus by a collector.

The engine bumps plain ints (a labelled prometheus counter takes a lock per ``inc()``); the
collector turns them into metric families when ``/metrics`` is scraped, as ``bridge.app.metrics``
does for the relay. Lateness is kept in ms, the unit the engine works in, and exposed in
seconds, Prometheus's base unit.

The engine runs in a process of its own (``bridge.app.engine_process``), so what it counts lives in
``slots``: a list, or a block of shared memory (``shared_slots()``) that the engine process
writes and the bridge's collector reads. Each slot has one writer.
"""

from __future__ import annotations

import bisect
import multiprocessing.sharedctypes
from collections.abc import Callable, Iterator, MutableSequence
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector

# Release time minus due time, ms. A healthy engine releases in the first buckets; the tail to
# 10 s shows a backlog, a stall or a reconnect.
LATENESS_BUCKETS_MS: tuple[int, ...] = (
    0, 1, 2, 5, 10, 20, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000,
)

Metric = CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily


# The engine's numbers, in this order in ``slots``; then the lateness bucket counts.
ENGINE_FIELDS = (
    "released", "expired", "invalid", "undeliverable", "hops", "reconnects", "lateness_sum_ms",
    "cancelled",  # by the engine, on an operator's order
    "pending_count",  # pending messages as last counted by the engine; -1 = unknown
)
LATENESS_SLOT = len(ENGINE_FIELDS)
SLOTS = LATENESS_SLOT + len(LATENESS_BUCKETS_MS) + 1  # the last bucket: above the top bound


def shared_slots() -> MutableSequence[int]:
    """Slots in shared memory, as a new engine starts them: handed to the engine process."""
    return _fresh(multiprocessing.sharedctypes.RawArray("q", SLOTS))


def _fresh(slots: MutableSequence[int]) -> MutableSequence[int]:
    """Zeroed slots with the pending count unknown (-1)."""
    slots[ENGINE_FIELDS.index("pending_count")] = -1
    return slots


class _Slot:
    """An int attribute kept in the owner's ``slots``, at its name's place in ENGINE_FIELDS."""

    def __init__(self, field: str) -> None:
        self.index = ENGINE_FIELDS.index(field)

    def __get__(self, owner: Any, _type: type | None = None) -> int:
        return int(owner.slots[self.index])

    def __set__(self, owner: Any, value: int) -> None:
        owner.slots[self.index] = value


class StagingStats:
    """What happened to staged messages; each field has a single writer."""

    released = _Slot("released")  # by the engine, on time or on an operator's order
    cancelled = _Slot("cancelled")
    expired = _Slot("expired")
    invalid = _Slot("invalid")
    undeliverable = _Slot("undeliverable")  # releases the broker refused (undeliverable queue)
    hops = _Slot("hops")
    reconnects = _Slot("reconnects")
    lateness_sum_ms = _Slot("lateness_sum_ms")
    _pending_count = _Slot("pending_count")

    def __init__(
        self,
        pending: Callable[[], int | None] | None = None,
        *,
        slots: MutableSequence[int] | None = None,
    ) -> None:
        if slots is None:
            slots = _fresh([0] * SLOTS)
        if len(slots) != SLOTS:
            raise ValueError(f"staging stats need {SLOTS} slots, not {len(slots)}")
        self.slots = slots
        self.staged = 0  # by the interceptor (``on_staged``), not by the engine
        # By the admin endpoints, on the staging queues (in the bridge's process).
        self.tools_cancelled = 0
        self.tools_released = 0
        # Pending messages as the scrape sees them: a hook that only reads a number (the engine
        # counts every few seconds), or None for no gauge at all (no engine).
        self.pending = pending

    @property
    def pending_count(self) -> int | None:
        """Pending messages as the engine last counted them; None = unknown."""
        value = self._pending_count
        return None if value < 0 else value

    @pending_count.setter
    def pending_count(self, value: int | None) -> None:
        self._pending_count = -1 if value is None else value

    def on_staged(self, queue: str) -> None:
        """The interceptor's ``on_staged`` hook."""
        self.staged += 1

    def observe_lateness(self, late_ms: int) -> None:
        self.slots[LATENESS_SLOT + bisect.bisect_left(LATENESS_BUCKETS_MS, late_ms)] += 1
        self.lateness_sum_ms += late_ms

    @property
    def lateness_counts(self) -> list[int]:
        """A snapshot of the lateness bucket counts, the last one above the top bound."""
        return list(self.slots[LATENESS_SLOT:SLOTS])

    @property
    def lateness_count(self) -> int:
        return sum(self.lateness_counts)

    def register(self, registry: CollectorRegistry) -> None:
        registry.register(_StagingCollector(self))


class _StagingCollector(Collector):
    def __init__(self, stats: StagingStats) -> None:
        self.stats = stats

    def describe(self) -> Iterator[Metric]:
        """Names only: registering must not call the pending hook (it talks to the broker)."""
        return self._families(pending=None)

    def collect(self) -> Iterator[Metric]:
        pending: int | None = None
        if self.stats.pending is not None:
            try:
                pending = self.stats.pending()
            except Exception:  # noqa: BLE001 -- a scrape must not fail because the broker is away
                pending = None
        return self._families(pending=pending)

    def _families(self, *, pending: int | None) -> Iterator[Metric]:
        s = self.stats
        for name, doc, value in (
            ("jms_bridge_staged", "Delayed sends staged.", s.staged),
            ("jms_bridge_staging_released", "Staged messages released to their target.",
             s.released + s.tools_released),
            ("jms_bridge_staging_expired",
             "Staged messages that expired before release (MQFB_EXPIRATION), not delivered.",
             s.expired),
            ("jms_bridge_staging_cancelled", "Staged messages cancelled by an operator.",
             s.cancelled + s.tools_cancelled),
            ("jms_bridge_staging_invalid",
             "Unreadable messages found on staging queues and moved to the invalid queue.",
             s.invalid),
            ("jms_bridge_staging_undeliverable",
             "Staged messages whose target refused them when due, moved to the undeliverable "
             "queue.", s.undeliverable),
            ("jms_bridge_staging_hops", "Moves of a staged message from one level queue down.",
             s.hops),
            ("jms_bridge_staging_reconnects", "Times the engine lost the broker and reconnected.",
             s.reconnects),
        ):
            yield CounterMetricFamily(name, doc, value=value)
        counts = s.lateness_counts  # a snapshot: the engine keeps counting
        cumulative = 0
        buckets: list[tuple[str, float]] = []
        for bound, n in zip((*LATENESS_BUCKETS_MS, None), counts, strict=True):
            cumulative += n
            buckets.append(("+Inf" if bound is None else repr(bound / 1000), cumulative))
        yield HistogramMetricFamily(
            "jms_bridge_staging_release_lateness_seconds",
            "Release time minus due time of released messages.",
            buckets=buckets,
            sum_value=s.lateness_sum_ms / 1000,
        )
        if s.pending is not None:
            yield GaugeMetricFamily(
                "jms_bridge_staging_pending", "Messages waiting on the staging queues.",
                value=float("nan") if pending is None else pending,
            )

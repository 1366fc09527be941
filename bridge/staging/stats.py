"""Counters of the staging engine, exposed to Prometheus by a collector.

The engine bumps plain ints from its one thread (a labelled prometheus counter takes a lock per
``inc()``); the collector turns them into metric families when ``/metrics`` is scraped, as
``bridge.metrics`` does for the relay. Lateness is kept in ms, the unit the engine works in, and
exposed in seconds, Prometheus's base unit.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator

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


class StagingStats:
    """What happened to staged messages; each field has a single writer."""

    def __init__(self, pending: Callable[[], int | None] | None = None) -> None:
        self.staged = 0  # by the interceptor (``on_staged``), not by the engine
        self.released = 0
        self.expired = 0
        self.cancelled = 0  # by the operator tools
        self.invalid = 0
        self.undeliverable = 0  # releases the broker refused, moved to <prefix>.undeliverable
        self.hops = 0
        self.reconnects = 0
        # Pending messages as last counted by whoever owns the broker connection (the engine
        # thread, every few seconds): a scrape only reads the number. None = unknown.
        self.pending = pending
        self.lateness_counts = [0] * (len(LATENESS_BUCKETS_MS) + 1)  # last = above the top
        self.lateness_sum_ms = 0

    def on_staged(self, queue: str) -> None:
        """The interceptor's ``on_staged`` hook."""
        self.staged += 1

    def observe_lateness(self, late_ms: int) -> None:
        self.lateness_counts[bisect.bisect_left(LATENESS_BUCKETS_MS, late_ms)] += 1
        self.lateness_sum_ms += late_ms

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
             s.released),
            ("jms_bridge_staging_expired",
             "Staged messages that expired before release (MQFB_EXPIRATION), not delivered.",
             s.expired),
            ("jms_bridge_staging_cancelled", "Staged messages cancelled by an operator.",
             s.cancelled),
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
        counts = list(s.lateness_counts)  # a snapshot: the engine thread keeps counting
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

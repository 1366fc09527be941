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

from policies.reasons import BY_NAME

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
    "retries",  # refused releases put back on the staging queues to be tried again
    "reports_exception", "reports_expiration",  # reports put to a reply-to
    "reports_refused",  # reports the reply-to refused (sent to the dead-letter home instead)
    "kept",  # times a dead-letter destination refused a message, kept on the staging queues
    "blocked",  # messages kept that way now (a gauge)
)
LATENESS_SLOT = len(ENGINE_FIELDS)
# Then the dead-letter moves of the engine by reason and home: one slot per pair.
DEAD_LETTER_REASONS: tuple[str, ...] = (*sorted(BY_NAME), "other")
DEAD_LETTER_HOMES: tuple[str, ...] = ("undeliverable", "undelivered", "dead-letter", "discard")
DEAD_LETTER_SLOT = LATENESS_SLOT + len(LATENESS_BUCKETS_MS) + 1  # last bucket: above the top
SLOTS = DEAD_LETTER_SLOT + len(DEAD_LETTER_REASONS) * len(DEAD_LETTER_HOMES)


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
    retries = _Slot("retries")
    reports_exception = _Slot("reports_exception")
    reports_expiration = _Slot("reports_expiration")
    reports_refused = _Slot("reports_refused")
    kept = _Slot("kept")
    blocked = _Slot("blocked")
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

    def on_dead_letter(self, reason: str, home: str) -> None:
        """One message moved (or discarded) by the engine because it could not be delivered."""
        r = DEAD_LETTER_REASONS.index(reason if reason in BY_NAME else "other")
        self.slots[DEAD_LETTER_SLOT + r * len(DEAD_LETTER_HOMES)
                   + DEAD_LETTER_HOMES.index(home)] += 1

    def dead_letters(self) -> dict[tuple[str, str], int]:
        """(reason, home) -> moves so far, the pairs that happened."""
        out: dict[tuple[str, str], int] = {}
        for r, reason in enumerate(DEAD_LETTER_REASONS):
            for h, home in enumerate(DEAD_LETTER_HOMES):
                n = self.slots[DEAD_LETTER_SLOT + r * len(DEAD_LETTER_HOMES) + h]
                if n:
                    out[reason, home] = int(n)
        return out

    @property
    def lateness_counts(self) -> list[int]:
        """A snapshot of the lateness bucket counts, the last one above the top bound."""
        return list(self.slots[LATENESS_SLOT:DEAD_LETTER_SLOT])

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
            ("jms_bridge_staging_retries",
             "Releases refused for a reason that can pass (queue full, put-inhibited), put back "
             "to be tried again (message-retry).", s.retries),
            ("jms_bridge_staging_reports_refused",
             "Report messages the reply-to refused: sent to the dead-letter destination with "
             "the original instead.", s.reports_refused),
            ("jms_bridge_staging_dead_letter_refused",
             "Times a dead-letter, undelivered or undeliverable destination refused a message, "
             "which was kept on the staging queues to be tried again.", s.kept),
        ):
            yield CounterMetricFamily(name, doc, value=value)
        reports = CounterMetricFamily(
            "jms_bridge_staging_reports", "IBM MQ report messages put to a reply-to, by kind.",
            labels=["kind"])
        reports.add_metric(["exception"], s.reports_exception)
        reports.add_metric(["expiration"], s.reports_expiration)
        yield reports
        moves = CounterMetricFamily(
            "jms_bridge_staging_dead_letters",
            "Staged messages that could not be delivered (refused when due, or expired), by "
            "reason and where they went: the undeliverable, undelivered or a policy's "
            "dead-letter destination, or discarded.", labels=["reason", "to"])
        for (reason, home), n in s.dead_letters().items():
            moves.add_metric([reason, home], n)
        yield moves
        yield GaugeMetricFamily(
            "jms_bridge_staging_dead_letter_blocked",
            "Messages kept on the staging queues because their dead-letter destination refused "
            "them (IBM MQ stops the channel rather than lose one).", value=s.blocked)
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

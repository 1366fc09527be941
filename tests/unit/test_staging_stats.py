"""The staging counters: what the engine process counts is what the bridge's /metrics shows."""

from __future__ import annotations

import multiprocessing
from collections.abc import MutableSequence

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from bridge.staging.staging_stats import SLOTS, StagingStats, shared_slots


def _engine_side(slots: MutableSequence[int]) -> None:
    stats = StagingStats(slots=slots)
    for late in (0, 3, 70, 60_000):
        stats.released += 1
        stats.observe_lateness(late)
    stats.hops += 5
    stats.pending_count = 42


def test_counts_made_in_another_process_are_scraped_here() -> None:
    stats = StagingStats(slots=shared_slots())
    stats.pending = lambda: stats.pending_count
    assert stats.pending_count is None
    child = multiprocessing.get_context("spawn").Process(target=_engine_side, args=(stats.slots,))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    assert stats.released == 4 and stats.hops == 5 and stats.pending_count == 42
    assert sum(stats.lateness_counts) == 4 and stats.lateness_sum_ms == 60_073
    registry = CollectorRegistry()
    stats.register(registry)
    text = generate_latest(registry).decode()
    assert "jms_bridge_staging_released_total 4.0" in text
    assert "jms_bridge_staging_pending 42.0" in text
    assert 'jms_bridge_staging_release_lateness_seconds_bucket{le="0.005"} 2.0' in text
    assert 'jms_bridge_staging_release_lateness_seconds_bucket{le="+Inf"} 4.0' in text


def test_unknown_pending_is_not_a_number() -> None:
    stats = StagingStats()
    stats.pending = lambda: stats.pending_count
    stats.pending_count = 7
    stats.pending_count = None
    registry = CollectorRegistry()
    stats.register(registry)
    assert "jms_bridge_staging_pending NaN" in generate_latest(registry).decode()


def test_slots_of_the_wrong_size_are_refused() -> None:
    with pytest.raises(ValueError, match=f"need {SLOTS} slots"):
        StagingStats(slots=[0] * (SLOTS - 1))

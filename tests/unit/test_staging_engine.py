"""The staging engine against an in-memory broker, driven step by step with a test clock.

The driver advances the clock by exactly what ``step`` asks to wait, so a correct engine releases
every message at its due time to the millisecond, and never before.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter

import pytest
import structlog
from structlog.testing import CapturingLogger
from structlog.typing import FilteringBoundLogger

from adapters.base import Held, Message
from bridge.staging import envelope
from bridge.staging.engine import (
    COUNT_WAIT_S,
    DECLARE_LATER_MS,
    HORIZON_MS,
    LEAD_MS,
    STREAM_MAX_MS,
    Engine,
)
from bridge.staging.engine_settling import INVALID_QUEUE, INVALID_REASON
from bridge.staging.levels import MAX_LEVEL, Layout
from bridge.staging.outcomes import Kind, MessageOutcome
from bridge.staging.staging_stats import StagingStats
from policies.reasons import MQFB_EXPIRATION
from tests.unit.memory_broker import MemoryBroker

T0 = 1_800_000_000_000
DAY = 24 * 3600 * 1000
TARGET = "/queue/orders"
LAYOUT = Layout()
SECONDS = Layout(second_levels=True)  # RabbitMQ's


class Clock:
    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def quiet_log(level: int = logging.INFO) -> tuple[FilteringBoundLogger, CapturingLogger]:
    sink = CapturingLogger()
    log = structlog.wrap_logger(
        sink, wrapper_class=structlog.make_filtering_bound_logger(level), processors=[],
    )
    return log, sink


def engine_for(
    broker: MemoryBroker, clock: Clock, *, quick: bool = True, layout: Layout = LAYOUT,
    **options: object,
) -> tuple[Engine, StagingStats, CapturingLogger]:
    """``quick``: look at empty levels and put-back heads only when the engine knows something
    can be there, so a test can jump over days; the defaults are tested separately."""
    stats = StagingStats()
    log, sink = quiet_log()
    timing: dict[str, object] = {"idle_poll_s": 3600.0, "recheck_s": 3600.0} if quick else {}
    engine = Engine(broker, layout, clock=clock, stats=stats, log=log,
                    **{**timing, **options})  # type: ignore[arg-type]
    return engine, stats, sink


def stage(
    broker: MemoryBroker, *, delay_ms: int, now: int, target: str = TARGET,
    ttl_ms: int | None = None, body: bytes = b"body", layout: Layout = LAYOUT,
) -> str:
    """Put a staged copy where the interceptor would; returns the original message id."""
    original = [("destination", target), ("x-app", "kept"), ("x-delay", str(delay_ms))]
    if ttl_ms is not None:
        original.append(("expiration", str(ttl_ms)))
    headers = envelope.staged_headers(
        original, broker.format, target=target,
        staging_destination=broker.format.client_destination(layout.queue_for(delay_ms)),
        due_ms=now + delay_ms, sent_ms=now,
        expires_ms=None if ttl_ms is None else now + ttl_ms, drop=("x-delay",),
    )
    message = Message({n: v for n, v in headers if n != "destination"}, body)
    broker.put(layout.queue_for(delay_ms), message)
    return message.headers[envelope.MESSAGE_ID]


def drive(
    engine: Engine, clock: Clock, until: int, *, max_steps: int = 2_000_000,
    events: dict[int, list[tuple[int, str]]] | None = None,
) -> int:
    """Step until ``until``, advancing the clock by what each step asks. ``events``: time ->
    things to stage then, the clock stopping there as a ``poll`` woken by an arrival would."""
    steps = 0
    pending = sorted(events or {})
    while clock.now <= until:
        wait_ms = round(engine.step(clock.now) * 1000)
        steps += 1
        assert steps < max_steps, "the engine does not get anywhere"
        nxt = clock.now + wait_ms
        if pending and pending[0] <= nxt:
            nxt = pending.pop(0)
            clock.now = nxt
            for delay_ms, _ in events[nxt]:  # type: ignore[index]
                stage(engine.broker, delay_ms=delay_ms, now=nxt,  # type: ignore[arg-type]
                      layout=engine.layout)
            continue
        clock.now = nxt
    return steps


def releases(broker: MemoryBroker, target: str = TARGET) -> dict[str, list[int]]:
    """Original message id -> times it was released."""
    out: dict[str, list[int]] = {}
    for t, message in broker.delivered(target):
        out.setdefault(message.headers[envelope.MESSAGE_ID], []).append(t)
    return out


def hops_of(broker: MemoryBroker, layout: Layout = LAYOUT) -> Counter[str]:
    staging = tuple(broker.format.client_destination(q) for q in layout.queues)
    return Counter(m.headers[envelope.MESSAGE_ID] for _, d, m in broker.published if d in staging)


LEVEL_PREFETCH = 100


def expected_hops(
    delay_ms: int, broker_name: str = "rabbitmq", layout: Layout = LAYOUT
) -> int:
    """Hops of a message staged with ``delay_ms`` when every head is taken on time: at its exit,
    or LEAD_MS before it on a streamed level, down to the queue for the time it has left then.
    A head is not hopped but held for release when less than the horizon is left (plus the
    lead, on a streamed level). A peeked head is held only where a peek gives the next message
    (RabbitMQ); on ActiveMQ it goes to the ready queue, one hop more."""
    remaining, hops = delay_ms, 0
    queue = layout.queue_for(remaining)
    while queue != layout.ready:
        dwell = layout.dwell_of(queue) or 0
        streamed = dwell <= STREAM_MAX_MS
        lead = LEAD_MS if streamed else 0
        remaining -= dwell - lead
        if (streamed or broker_name != "activemq") and remaining < HORIZON_MS + lead:
            break
        queue = layout.queue_for(remaining)
        hops += 1
    return hops


def popcount_hops(delay_ms: int) -> int:
    """Level-to-level hops: one per set bit above the horizon, less the level it starts on."""
    if delay_ms < 1024:
        return 0
    return (delay_ms >> 10).bit_count() - 1


# -- single messages --------------------------------------------------------------------------


def test_one_ms_delay_is_released_at_due_as_the_application_sent_it() -> None:
    clock = Clock()
    broker = MemoryBroker(clock=clock)
    engine, stats, _ = engine_for(broker, clock)
    message_id = stage(broker, delay_ms=1, now=T0, ttl_ms=60_000, body=b"\x00payload")

    assert engine.step(T0) == pytest.approx(0.001)
    assert broker.delivered(TARGET) == []
    clock.now = T0 + 1
    engine.step(clock.now)

    [(t, released)] = broker.delivered(TARGET)
    assert t == T0 + 1
    assert released.body == b"\x00payload"
    assert released.headers["amqp-message-id"] == message_id
    assert released.headers["x-app"] == "kept"
    assert released.headers["expiration"] == str(60_000 - 1)
    assert "x-delay" not in released.headers
    assert released.headers[envelope.DELIVERY_TIME] == str(T0 + 1)
    assert not {n for n in released.headers if n.startswith("jms-bridge-")} - {
        envelope.MESSAGE_ID, envelope.DELIVERY_TIME, envelope.EXPIRES}
    assert stats.released == 1 and stats.hops == 0 and stats.lateness_counts[0] == 1
    assert broker.held_count == 0 and broker.depth(LAYOUT.ready) == 0


def test_streamed_level_head_is_taken_the_lead_early_and_held_to_its_due_time() -> None:
    """5 s waits on the 4,096 ms level; 512 ms before it exits, 1,416 ms are left: under the
    horizon plus the lead, so it is held, not hopped, and released at exactly its due time."""
    clock = Clock()
    broker = MemoryBroker(clock=clock)
    engine, stats, _ = engine_for(broker, clock, lead_ms=512)
    message_id = stage(broker, delay_ms=5_000, now=T0)
    assert LAYOUT.queue_for(5_000) == LAYOUT.level(12)

    engine.step(T0 + 4_096 - 513)
    assert not engine.holding.heap, "not taken before its exit less the lead"
    engine.step(T0 + 4_096 - 512)
    assert [due for due, *_ in engine.holding.heap] == [T0 + 5_000] and stats.hops == 0

    drive(engine, clock, T0 + 6_000)
    assert releases(broker) == {message_id: [T0 + 5_000]}
    assert stats.hops == 0 and broker.held_count == 0


def test_streamed_head_taken_early_with_more_than_the_horizon_left_hops_down() -> None:
    """8 s + 3 s: taken from the 8,192 ms level 512 ms early, 3,512 ms are left: it goes to
    the 2,048 ms level (the largest dwell that fits), and is still released on time."""
    clock = Clock()
    broker = MemoryBroker(clock=clock)
    engine, stats, _ = engine_for(broker, clock, lead_ms=512)
    message_id = stage(broker, delay_ms=11_192, now=T0)

    drive(engine, clock, T0 + 8_192 - 512)
    assert stats.hops == 1
    [(_, destination, _)] = [p for p in broker.published if p[1] != TARGET]
    assert destination == broker.format.client_destination(LAYOUT.level(11))
    drive(engine, clock, T0 + 12_000)
    assert releases(broker) == {message_id: [T0 + 11_192]}


def test_a_lead_longer_than_half_the_horizon_is_refused() -> None:
    clock = Clock()
    with pytest.raises(ValueError, match="lead_ms"):
        engine_for(MemoryBroker(clock=clock), clock, lead_ms=513)


@pytest.mark.parametrize(
    ("delay_ms", "hops"),
    # 30 days: a head taken LEAD_MS before its exit can have its remainder cross a power of
    # two, one hop more than the set bits.
    [(1_000, 0), (10_000, 1), (3_600_000, 8), (30 * DAY, popcount_hops(30 * DAY) + 1)],
    ids=["1s", "10s", "1h", "30d"],
)
def test_delay_released_exactly_at_due_after_one_hop_per_set_bit(delay_ms: int, hops: int) -> None:
    clock = Clock()
    broker = MemoryBroker(clock=clock)
    engine, stats, _ = engine_for(broker, clock)
    message_id = stage(broker, delay_ms=delay_ms, now=T0)

    drive(engine, clock, T0 + delay_ms - 1)
    assert broker.delivered(TARGET) == []
    drive(engine, clock, T0 + delay_ms + 5_000)

    assert releases(broker) == {message_id: [T0 + delay_ms]}
    assert stats.hops == hops == expected_hops(delay_ms) == hops_of(broker)[message_id]
    assert stats.released == 1 and stats.lateness_counts[0] == 1


@pytest.mark.parametrize(
    ("delay_ms", "hops"),
    # Up to 16 s: the level of its whole seconds, then held. 20 s: 16,384 ms, then 3,072.
    # 1 h: the six set bits of 3,600,000 >> 14, then 11 s. 30 days: eleven, then 15 s.
    [(1_000, 0), (10_000, 0), (16_000, 0), (20_000, 1), (3_600_000, 6), (30 * DAY, 12)],
    ids=["1s", "10s", "16s", "20s", "1h", "30d"],
)
def test_second_levels_release_exactly_at_due_after_one_hop_per_level(
    delay_ms: int, hops: int
) -> None:
    clock = Clock()
    broker = MemoryBroker(clock=clock)
    engine, stats, _ = engine_for(broker, clock, layout=SECONDS)
    message_id = stage(broker, delay_ms=delay_ms, now=T0, layout=SECONDS)

    drive(engine, clock, T0 + delay_ms - 1)
    assert broker.delivered(TARGET) == []
    drive(engine, clock, T0 + delay_ms + 5_000)

    assert releases(broker) == {message_id: [T0 + delay_ms]}
    assert stats.hops == hops == expected_hops(delay_ms, layout=SECONDS)
    assert hops == hops_of(broker, SECONDS)[message_id]
    assert stats.released == 1 and stats.lateness_counts[0] == 1


def test_second_levels_head_taken_early_goes_to_the_level_of_its_seconds() -> None:
    """16 s + 3 s: taken from the 16,384 ms level 512 ms early, 3,512 ms are left: it goes to
    the 3,072 ms level, leaves it with 440 ms to go, and is released on time."""
    clock = Clock()
    broker = MemoryBroker(clock=clock)
    engine, stats, _ = engine_for(broker, clock, lead_ms=512, layout=SECONDS)
    message_id = stage(broker, delay_ms=19_384, now=T0, layout=SECONDS)
    assert SECONDS.queue_for(19_384) == SECONDS.level(14)

    drive(engine, clock, T0 + 16_384 - 512)
    assert stats.hops == 1
    [(_, destination, _)] = [p for p in broker.published if p[1] != TARGET]
    assert destination == broker.format.client_destination("jms-bridge.staging.L10x03")
    drive(engine, clock, T0 + 20_000)
    assert releases(broker) == {message_id: [T0 + 19_384]} and stats.hops == 1


def test_delay_beyond_the_top_level_waits_there_more_than_once() -> None:
    clock = Clock()
    broker = MemoryBroker(clock=clock)
    engine, stats, _ = engine_for(broker, clock)
    delay_ms = 120 * DAY  # the top level dwells 49.7 days
    message_id = stage(broker, delay_ms=delay_ms, now=T0)
    drive(engine, clock, T0 + delay_ms)
    assert releases(broker) == {message_id: [T0 + delay_ms]}
    top = broker.format.client_destination(LAYOUT.level(MAX_LEVEL))
    assert sum(1 for _, d, _ in broker.published if d == top) == 1  # staged there, then again
    assert stats.hops == expected_hops(delay_ms)


def test_a_waiting_head_is_not_looked_at_again_before_it_exits() -> None:
    clock = Clock()
    broker = MemoryBroker(clock=clock)
    engine, _, _ = engine_for(broker, clock, quick=False)
    stage(broker, delay_ms=3_600_000, now=T0)  # L21's head exits after 35 minutes
    drive(engine, clock, T0 + 60_000)
    level = LAYOUT.queue_for(3_600_000)
    # every 5 s recheck, not every 0.2 s idle poll
    assert broker.peeks[level] <= 60_000 // 5_000 + 1
    first_peeked = LAYOUT.level(STREAM_MAX_MS.bit_length())  # the shortest level not streamed
    assert broker.peeks[first_peeked] >= 60_000 // 5_000  # empty: looked at every 5 s at most
    assert broker.peeks[LAYOUT.level(10)] == 0  # streamed: consumed, never peeked
    assert broker.held_count == 0


class SlowEmptyPeeks(MemoryBroker):
    """ActiveMQ's adapter waits a little before it calls a level empty."""

    def __init__(self, clock: Clock, cost_ms: int) -> None:
        super().__init__("activemq", clock=clock)
        self.test_clock, self.cost_ms = clock, cost_ms

    def peek(self, queue: str) -> Held | None:
        held = super().peek(queue)
        if held is None:
            self.test_clock.now += self.cost_ms
        return held


def test_a_due_ready_message_does_not_wait_for_a_round_of_slow_level_peeks() -> None:
    clock = Clock()
    broker = SlowEmptyPeeks(clock, cost_ms=50)
    engine, stats, _ = engine_for(broker, clock, quick=False)
    # Connected first: the long levels are declared (and looked at) DECLARE_LATER_MS after.
    engine.step(T0 - DECLARE_LATER_MS)
    assert not any(broker.peeks.values())
    engine.step(T0)
    engine.step(T0)  # every level empty: each looked at again at T0 + its idle interval
    peeked = [q for _, q in LAYOUT.levels if (LAYOUT.dwell_of(q) or 0) > STREAM_MAX_MS]
    assert clock.now == T0 + 50 * len(peeked)
    clock.now = T0 + 4_990
    stage(broker, delay_ms=30, now=clock.now)
    while not broker.delivered(TARGET):
        wait = engine.step(clock.now)  # the peeks move the clock on
        clock.now += round(wait * 1000)
    # Six levels are due for a look at 4.99 s and the slow ones at 5 s: over a second of empty
    # peeks, but the message due at 5.02 s goes out after the first that ends after that.
    [(t, _)] = broker.delivered(TARGET)
    assert T0 + 5_020 <= t <= T0 + 5_020 + 50
    while clock.now < T0 + 7_000:
        wait = engine.step(clock.now)
        clock.now += round(wait * 1000)
    assert broker.peeks[LAYOUT.level(MAX_LEVEL)] == 2, "the rest are looked at right after"
    assert stats.released == 1


# -- many messages ----------------------------------------------------------------------------


@pytest.mark.parametrize(("broker_name", "layout"),
                         [("rabbitmq", LAYOUT), ("activemq", LAYOUT), ("rabbitmq", SECONDS)],
                         ids=["rabbitmq", "activemq", "rabbitmq-seconds"])
def test_random_delays_up_to_40_days_all_released_once_on_time(
    broker_name: str, layout: Layout
) -> None:
    rnd = random.Random(20240601)
    clock = Clock()
    broker = MemoryBroker(broker_name, clock=clock)
    engine, stats, _ = engine_for(broker, clock, batch=50, layout=layout)
    delays = [rnd.randint(1, 40 * DAY) for _ in range(990)]
    delays += [rnd.randint(1, 20_000) for _ in range(10)]
    rnd.shuffle(delays)
    due = {stage(broker, delay_ms=d, now=T0, layout=layout): T0 + d for d in delays}

    drive(engine, clock, T0 + 40 * DAY + 1)

    got = releases(broker)
    assert got.keys() == due.keys()
    assert all(len(times) == 1 for times in got.values()), "released twice"
    assert all(times[0] == due[mid] for mid, times in got.items()), "early or late"
    assert stats.released == 1000 and stats.lateness_counts[0] == 1000
    assert stats.hops == sum(expected_hops(d, broker_name, layout) for d in delays)
    assert all(broker.depth(q) == 0 for q in layout.queues) and broker.held_count == 0


def test_messages_staged_while_running_are_found_by_the_idle_poll_and_released_on_time() -> None:
    """Default timings: a message entering an empty level is seen within the idle poll, well
    before its first exit (1.024 s at least), so nothing is late."""
    rnd = random.Random(7)
    clock = Clock()
    broker = MemoryBroker(clock=clock)
    engine, stats, _ = engine_for(broker, clock, quick=False)
    events: dict[int, list[tuple[int, str]]] = {}
    for _ in range(300):
        events.setdefault(T0 + rnd.randint(0, 10_000), []).append((rnd.randint(1, 30_000), ""))
    drive(engine, clock, T0 + 45_000, events=events)

    got = releases(broker)
    assert len(got) == 300 and all(len(times) == 1 for times in got.values())
    assert stats.lateness_counts[0] == 300, "every one exactly at its due time"


@pytest.mark.parametrize("batch", [500, len(LAYOUT.levels)])
def test_memory_is_bounded_with_100k_pending(batch: int) -> None:
    """The engine holds at most its prefetches (ready, and each streamed level) plus one batch
    of peeked level heads, however many messages are pending."""
    rnd = random.Random(100_000)
    clock = Clock()
    broker = MemoryBroker(clock=clock)
    prefetch = 1_000
    engine, stats, _ = engine_for(broker, clock, batch=batch, ready_prefetch=prefetch,
                                  level_prefetch=LEVEL_PREFETCH)
    for d in sorted(rnd.randint(1_024, 3_600_000) for _ in range(100_000)):
        stage(broker, delay_ms=d, now=T0)

    streamed = sum(1 for _, q in LAYOUT.levels if (LAYOUT.dwell_of(q) or 0) <= STREAM_MAX_MS)
    bound = prefetch + streamed * LEVEL_PREFETCH + batch
    engine.step(T0)
    assert broker.max_held <= streamed * LEVEL_PREFETCH + 1, "prefetches and one peeked head"
    drive(engine, clock, T0 + 10 * 60_000)

    assert stats.released > 10_000  # the window saw plenty of exits and releases
    assert broker.max_held <= bound, f"{broker.max_held} held with 100,000 pending"
    late = sum(stats.lateness_counts) - stats.lateness_counts[0]
    assert late == 0


# -- expiry and bad messages ------------------------------------------------------------------


def test_expired_while_staged_is_not_delivered_and_is_counted() -> None:
    clock = Clock()
    broker = MemoryBroker(clock=clock)
    engine, stats, sink = engine_for(broker, clock)
    stage(broker, delay_ms=5_000, now=T0, ttl_ms=5_000)  # expires the moment it is due
    kept = stage(broker, delay_ms=5_000, now=T0, ttl_ms=60_000)
    drive(engine, clock, T0 + 10_000)

    assert list(releases(broker)) == [kept]
    assert stats.expired == 1 and stats.released == 1
    [call] = [c for c in sink.calls if c.kwargs["event"] == "expired while staged, not delivered"]
    assert call.kwargs["reason"] == MQFB_EXPIRATION.name
    assert call.kwargs["target"] == TARGET
    assert broker.held_count == 0 and all(broker.depth(q) == 0 for q in LAYOUT.queues)


def test_engine_back_after_an_outage_expires_or_releases_level_heads_straight_away() -> None:
    clock = Clock(T0 + 60_000)  # the engine was away for the first minute
    broker = MemoryBroker(clock=clock)
    engine, stats, _ = engine_for(broker, clock)
    stage(broker, delay_ms=10_000, now=T0, ttl_ms=12_000)
    late = stage(broker, delay_ms=10_000, now=T0)
    engine.step(clock.now)

    assert releases(broker) == {late: [T0 + 60_000]}  # from its level, not via ready
    assert stats.expired == 1 and stats.hops == 0
    assert stats.lateness_counts[-1] == 1  # 50 s late: beyond the top bucket


def test_unreadable_staged_messages_go_to_the_invalid_queue() -> None:
    clock = Clock()
    broker = MemoryBroker(clock=clock)
    engine, stats, sink = engine_for(broker, clock)
    broker.put(LAYOUT.level(12), Message({"x": "no envelope"}, b"a"))
    broker.put(LAYOUT.ready, Message({envelope.TARGET: TARGET, envelope.DUE: "soon"}, b"b"))
    good = stage(broker, delay_ms=5_000, now=T0)
    drive(engine, clock, T0 + 6_000)

    invalid = f"{LAYOUT.prefix}.invalid"
    assert invalid in broker.declared
    moved = broker.queues[invalid]
    assert sorted(e.message.body for e in moved) == [b"a", b"b"]
    assert {e.message.headers[INVALID_QUEUE] for e in moved} == {LAYOUT.level(12), LAYOUT.ready}
    assert all(INVALID_REASON in e.message.headers for e in moved)
    assert stats.invalid == 2 and list(releases(broker)) == [good]
    unreadable = [c for c in sink.calls if c.kwargs["event"] == "unreadable staged message moved"]
    assert len(unreadable) == 2


def test_a_message_on_the_ready_queue_far_from_due_goes_back_to_its_level() -> None:
    """The ready prefetch is kept for what is due within the horizon (a clock step on another
    replica, or an operator's move, can put a far-off message there)."""
    clock = Clock()
    broker = MemoryBroker(clock=clock)
    engine, stats, _ = engine_for(broker, clock)
    stage(broker, delay_ms=3_600_000, now=T0)
    broker.put(LAYOUT.ready, broker.queues[LAYOUT.queue_for(3_600_000)].pop().message)
    engine.step(T0)
    assert broker.depth(LAYOUT.ready) == 0 and broker.depth(LAYOUT.queue_for(3_600_000)) == 1
    drive(engine, clock, T0 + 3_600_000)
    assert [t for t, _ in broker.delivered(TARGET)] == [T0 + 3_600_000]
    assert stats.hops == 1 + expected_hops(3_600_000)


# -- the broker going away --------------------------------------------------------------------


def test_survives_broker_loss_in_settle_and_duplicates_only_what_was_in_flight() -> None:
    rnd = random.Random(3)
    clock = Clock()
    broker = MemoryBroker(clock=clock)
    engine, stats, _ = engine_for(broker, clock)
    due = {stage(broker, delay_ms=d, now=T0): T0 + d
           for d in [rnd.randint(1, 100_000) for _ in range(200)] + [40_000] * 20}

    drive(engine, clock, T0 + 39_999)
    before = len(broker.published)
    broker.fail_next_settle(after=7)  # the 20 due at 40 s: 7 done, the 8th published, not acked
    clock.now += 1
    assert engine.step(clock.now) == pytest.approx(0.5) and not broker.connected
    clock.now += 100
    assert engine.step(clock.now) == pytest.approx(0.4), "waits out the backoff"
    assert broker.connects == 1
    in_flight = broker.published[before + 7][2].headers[envelope.MESSAGE_ID]
    clock.now += 400
    drive(engine, clock, T0 + 200_000)

    got = releases(broker)
    assert got.keys() == due.keys()
    assert all(t >= due[mid] for mid, times in got.items() for t in times), "early"
    assert {mid for mid, times in got.items() if len(times) > 1} == {in_flight}
    assert broker.connects == 2 and stats.reconnects == 1
    assert broker.held_count == 0 and all(broker.depth(q) == 0 for q in LAYOUT.queues)


def test_survives_broker_loss_in_a_hop_and_in_poll() -> None:
    clock = Clock()
    broker = MemoryBroker(clock=clock)
    engine, stats, _ = engine_for(broker, clock)
    ids = {stage(broker, delay_ms=d, now=T0): T0 + d for d in (3_000, 3_000, 70_000)}
    drive(engine, clock, T0 + 1_999)
    broker.fail_next_settle(after=0, published=False)  # the hop at 2 s: nothing done
    drive(engine, clock, T0 + 2_000)
    broker.fail_next_poll()
    drive(engine, clock, T0 + 100_000)
    got = releases(broker)
    assert got.keys() == ids.keys()
    assert all(len(times) == 1 and times[0] >= ids[mid] for mid, times in got.items())
    assert got[max(ids, key=ids.__getitem__)] == [T0 + 70_000]  # after both outages, on time
    assert stats.reconnects == 2


def test_reconnect_backs_off_exponentially_to_a_cap_and_never_busy_loops() -> None:
    clock = Clock()
    broker = MemoryBroker(clock=clock)
    engine, _, _ = engine_for(broker, clock)
    broker.fail_connects = 8
    waits = []
    for _ in range(9):
        wait = engine.step(clock.now)
        waits.append(wait)
        clock.now += round(wait * 1000)
    assert waits[:8] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]
    assert broker.connected and broker.connects == 9
    mid = stage(broker, delay_ms=1, now=clock.now)
    drive(engine, clock, clock.now + 1)
    assert mid in releases(broker)


# -- the thread -------------------------------------------------------------------------------


def test_run_releases_in_real_time_and_stops() -> None:
    broker = MemoryBroker(realtime=True, clock=lambda: time.time_ns() // 1_000_000)
    broker.fail_connects = 1
    stats = StagingStats()
    log, _ = quiet_log()
    engine = Engine(broker, LAYOUT, stats=stats, log=log, backoff_s=(0.05, 0.1))
    stop = threading.Event()
    thread = threading.Thread(target=engine.run, args=(stop,), daemon=True)
    thread.start()
    now = time.time_ns() // 1_000_000
    due = {stage(broker, delay_ms=d, now=now): now + d for d in (20, 300, 1_500)}
    deadline = time.monotonic() + 5
    while len(releases(broker)) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    stop.set()
    thread.join(timeout=2)

    assert not thread.is_alive()
    got = releases(broker)
    assert got.keys() == due.keys()
    assert all(times[0] >= due[mid] for mid, times in got.items())
    assert stats.reconnects == 1 and not broker.connected


def test_stats_render_as_prometheus_metrics() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    stats = StagingStats(pending=lambda: 42)
    stats.on_staged(LAYOUT.ready)
    stats.observe_lateness(0)
    stats.observe_lateness(3)
    stats.observe_lateness(20_000)
    registry = CollectorRegistry()
    stats.register(registry)
    text = generate_latest(registry).decode()
    assert "jms_bridge_staged_total 1.0" in text
    assert 'jms_bridge_staging_release_lateness_seconds_bucket{le="0.0"} 1.0' in text
    assert 'jms_bridge_staging_release_lateness_seconds_bucket{le="0.005"} 2.0' in text
    assert 'jms_bridge_staging_release_lateness_seconds_bucket{le="+Inf"} 3.0' in text
    assert "jms_bridge_staging_pending 42.0" in text


# -- targets the broker refuses ---------------------------------------------------------------


@pytest.mark.parametrize("broker_name", ["rabbitmq", "activemq"])
def test_a_refused_target_goes_to_the_undeliverable_queue_and_the_batch_goes_on(
    broker_name: str,
) -> None:
    from bridge.staging.engine import FAILED_AT, REASON, REASON_CODE, REASON_TEXT
    from policies.reasons import MQRC_UNKNOWN_OBJECT_NAME

    clock = Clock()
    broker = MemoryBroker(broker_name, clock=clock)
    engine, stats, sink = engine_for(broker, clock)
    gone = "/amq/queue/gone"
    broker.refuse(gone, MQRC_UNKNOWN_OBJECT_NAME, "NOT_FOUND - no queue 'gone'")
    before = [stage(broker, delay_ms=5_000, now=T0) for _ in range(3)]
    bad = stage(broker, delay_ms=5_000, now=T0, target=gone)
    after = [stage(broker, delay_ms=5_000, now=T0) for _ in range(3)]
    drive(engine, clock, T0 + 6_000)

    assert releases(broker) == {mid: [T0 + 5_000] for mid in before + after}
    undeliverable = f"{LAYOUT.prefix}.undeliverable"
    assert undeliverable in broker.declared
    [entry] = broker.queues[undeliverable]
    headers = entry.message.headers
    assert headers[envelope.MESSAGE_ID] == bad and headers[envelope.TARGET] == gone
    assert headers[REASON] == "MQRC_UNKNOWN_OBJECT_NAME" and headers[REASON_CODE] == "2085"
    assert headers[REASON_TEXT] == "NOT_FOUND - no queue 'gone'"
    assert headers[FAILED_AT] == str(T0 + 5_000)
    assert stats.undeliverable == 1 and stats.released == 6
    assert stats.reconnects == 0 and broker.connects == 1
    [call] = [c for c in sink.calls if c.kwargs["event"].startswith("staged message could not")]
    assert call.method_name == "warning" and call.kwargs["target"] == gone
    assert call.kwargs["reason"] == "MQRC_UNKNOWN_OBJECT_NAME"
    assert broker.held_count == 0 and all(broker.depth(q) == 0 for q in LAYOUT.queues)


def test_a_refused_hop_is_taken_for_a_missing_staging_queue_and_reconnects() -> None:
    from policies.reasons import MQRC_UNKNOWN_OBJECT_NAME

    clock = Clock()
    broker = MemoryBroker(clock=clock)
    engine, stats, _ = engine_for(broker, clock)
    mid = stage(broker, delay_ms=3_600_000, now=T0)
    level = broker.format.client_destination(LAYOUT.queue_for(3_600_000 - (1 << 21)))
    broker.refuse(level, MQRC_UNKNOWN_OBJECT_NAME)
    drive(engine, clock, T0 + (1 << 21))
    assert stats.reconnects >= 1 and stats.undeliverable == 0
    del broker.refusals[level]
    drive(engine, clock, T0 + 3_600_000)
    assert releases(broker) == {mid: [T0 + 3_600_000]}


# -- the pending gauge ------------------------------------------------------------------------


def test_pending_counts_the_staging_queues_at_most_every_5_s() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    clock = Clock()
    broker = MemoryBroker(clock=clock)
    engine, stats, _ = engine_for(broker, clock, quick=False)
    stats.pending = engine.pending
    assert engine.pending() is None
    for d in (3_600_000, 7_200_000, 2_000):
        stage(broker, delay_ms=d, now=T0)
    broker.put(f"{LAYOUT.prefix}.invalid", Message({}, b"not counted"))
    engine.step(T0)
    assert engine.pending() == 3
    calls = broker.counts
    drive(engine, clock, T0 + 4_000)
    assert engine.pending() == 3 and broker.counts == calls  # released at 2 s, not counted yet
    drive(engine, clock, T0 + 6_000)
    assert engine.pending() == 2
    assert broker.counts == calls + 1  # once more, at 5 s
    # each count may hold up the release loop only briefly; the tools wait longer
    assert set(broker.count_waits) == {COUNT_WAIT_S} and COUNT_WAIT_S <= 0.5
    registry = CollectorRegistry()
    stats.register(registry)
    assert "jms_bridge_staging_pending 2.0" in generate_latest(registry).decode()


def test_a_count_the_broker_did_not_answer_is_asked_again_ever_later() -> None:
    """A broker busy for a moment (ActiveMQ's statistics past COUNT_WAIT_S) leaves the gauge
    empty for 5 s, not a minute; one that keeps failing is asked ever less often."""
    clock = Clock()
    broker = MemoryBroker(clock=clock)
    engine, _, _ = engine_for(broker, clock, quick=False)
    stage(broker, delay_ms=3_600_000, now=T0)
    broker.count_failures = 1
    engine.step(T0)
    assert engine.pending() is None and broker.counts == 1
    drive(engine, clock, T0 + 4_900)
    assert broker.counts == 1
    drive(engine, clock, T0 + 5_100)
    assert broker.counts == 2 and engine.pending() == 1

    broker.count_failures = 4  # the next four counts: at 10.1 s, then 5, 10 and 20 s later
    asked_at = []
    while clock.now < T0 + 100_000:
        counts = broker.counts
        drive(engine, clock, clock.now + 100)
        if broker.counts > counts:
            asked_at.append(round((clock.now - T0) / 1000))
    gaps = [b - a for a, b in zip(asked_at, asked_at[1:], strict=False)]
    assert gaps[:5] == [5, 10, 20, 40, 5], asked_at  # counted at 85 s, then every 5 s
    assert engine.pending() == 1


def test_pending_is_counted_in_a_gap_between_releases_or_late(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A count is a round trip the releases would wait for: with a release due every 10 ms
    it waits for the gap after them, and with no gap it is done PENDING_LATE_MS late."""
    from bridge.staging import engine as engine_module

    monkeypatch.setattr(engine_module, "PENDING_LATE_MS", 3_000)
    clock = Clock()
    broker = MemoryBroker(clock=clock)
    engine, _, _ = engine_for(broker, clock, quick=False)
    for i in range(300):  # due every 10 ms from 4 s to 6.99 s
        stage(broker, delay_ms=4_000 + 10 * i, now=T0)
    stage(broker, delay_ms=3_600_000, now=T0)
    engine.step(T0)
    counted = broker.counts  # at 0 s; the next from 5 s
    drive(engine, clock, T0 + 6_980)
    assert broker.counts == counted
    drive(engine, clock, T0 + 7_100)
    assert broker.counts == counted + 1 and engine.pending() == 1  # after the last release

    now = clock.now
    for i in range(1_000):  # due every 10 ms from 11 s to 20.99 s: no gap after 11.99 s
        stage(broker, delay_ms=T0 + 11_000 + 10 * i - now, now=now)
    drive(engine, clock, T0 + 6_990 + 5_000 + 3_000 - 20)
    assert broker.counts == counted + 1
    drive(engine, clock, T0 + 6_990 + 5_000 + 3_000 + 20)
    assert broker.counts == counted + 2  # 3 s late, between releases


def test_a_message_refused_for_a_property_value_is_kept_with_plain_headers() -> None:
    """Release refused for the message itself: on the undeliverable queue, its property headers
    turned plain (the same headers would be refused there too); a hop refused that way: on the
    invalid queue. Neither stalls the engine or costs a reconnect."""
    from policies.reasons import MQRC_PROPERTY_VALUE_BAD

    clock = Clock()
    broker = MemoryBroker(clock=clock)
    engine, stats, _ = engine_for(broker, clock)
    bad_target = "/queue/picky"
    broker.refuse(bad_target, MQRC_PROPERTY_VALUE_BAD, "type is longer than 255 bytes")
    refused = stage(broker, delay_ms=2_000, now=T0, target=bad_target)
    level = broker.format.client_destination(LAYOUT.queue_for(1_500))
    broker.refuse(level, MQRC_PROPERTY_VALUE_BAD, "content-type is longer than 255 bytes")
    stuck = stage(broker, delay_ms=3_500, now=T0)  # L11, then a hop to L10: refused
    good = stage(broker, delay_ms=2_500, now=T0)  # L11, then held for release: no hop
    drive(engine, clock, T0 + 4_000)

    assert releases(broker) == {good: [T0 + 2_500]}
    [dead] = broker.queues[f"{LAYOUT.prefix}.undeliverable"]
    assert dead.message.headers[envelope.MESSAGE_ID] == refused
    assert dead.message.headers["jms-bridge-reason"] == "MQRC_PROPERTY_VALUE_BAD"
    # The message as it would have been released: its original id in amqp-message-id.
    assert dead.message.headers["jms-bridge-original-amqp-message-id"] == refused
    assert not {"amqp-message-id", "correlation-id"} & set(dead.message.headers)
    [invalid] = broker.queues[f"{LAYOUT.prefix}.invalid"]
    assert invalid.message.headers[envelope.MESSAGE_ID] == stuck
    assert "MQRC_PROPERTY_VALUE_BAD" in invalid.message.headers[INVALID_REASON]
    assert stats.reconnects == 0 and broker.connects == 1
    assert stats.undeliverable == 1 and stats.invalid == 1 and stats.released == 1


def test_what_the_broker_confirmed_reaches_the_sinks_as_outcomes() -> None:
    clock = Clock()
    broker = MemoryBroker(clock=clock)
    seen: list[MessageOutcome] = []
    engine, stats, _ = engine_for(broker, clock, sinks=[seen.extend])
    released_id = stage(broker, delay_ms=40_000, now=T0)
    expired_id = stage(broker, delay_ms=40_000, now=T0, ttl_ms=40_000)
    for t in range(T0, T0 + 40_001, 250):
        clock.now = t
        engine.step(t)
    kinds = {o.kind: o for o in seen}
    assert kinds[Kind.RELEASED].message_id == released_id
    assert kinds[Kind.RELEASED].late_ms == 0 and kinds[Kind.RELEASED].target == TARGET
    assert kinds[Kind.EXPIRED].message_id == expired_id
    assert kinds[Kind.EXPIRED].reason is MQFB_EXPIRATION
    assert sum(o.count for o in seen if o.kind is Kind.HOPPED) == stats.hops > 0
    assert stats.released == 1 and stats.expired == 1  # the engine's own counters too


class CountsWhenSubscribed(MemoryBroker):
    """Notes whether the control topic was heard by the time each queue got its consumer."""

    def __init__(self, clock: Clock) -> None:
        super().__init__("rabbitmq", clock=clock)
        self.listening_when_subscribed: dict[str, bool] = {}

    def subscribe(self, queue: str, prefetch: int) -> None:
        self.listening_when_subscribed[queue] = LAYOUT.control in self.listening
        super().subscribe(queue, prefetch)


def test_an_engine_counted_as_running_already_hears_the_control_topic() -> None:
    """The tools count the running engines by the ready queue's consumers and wait for an
    answer from each (5 s): an engine that consumed the ready queue before it listened to
    the control topic missed an order given meanwhile, and a listing then showed none of
    what it held."""
    clock = Clock()
    broker = CountsWhenSubscribed(clock)
    engine, _, _ = engine_for(broker, clock)
    engine.step(T0)
    assert broker.listening_when_subscribed[LAYOUT.ready] is True
    assert all(broker.listening_when_subscribed.values())

"""ActiveMQ's scheduler series: the pure rules, and the staging engine continuing a series
against the in-memory broker (crash in the middle of a step included)."""

from __future__ import annotations

import pytest

from adapters.base import Message
from bridge.staging import envelope, series
from bridge.staging.levels import Layout
from policies.errors import Refused
from policies.reasons import MQRC_NOT_AUTHORIZED
from policies.scheduler import (
    Occurrence,
    Series,
    first_occurrence,
    next_occurrence,
    series_of,
)
from tests.unit.memory_broker import MemoryBroker
from tests.unit.test_staging_engine import T0, Clock, drive, engine_for

TARGET = "/queue/ticks"
MINUTE = 60_000


def test_repeat_or_cron_makes_a_series_and_a_period_alone_does_not() -> None:
    check = series.check_cron
    assert series_of({"x": "1"}, 0, check) is None
    assert series_of({"AMQ_SCHEDULED_PERIOD": "500"}, 1000, check) is None
    assert series_of({"AMQ_SCHEDULED_PERIOD": "700", "AMQ_SCHEDULED_REPEAT": "2"}, 1000,
                     check) == Series(1000, 700, 2, None)
    assert series_of({"AMQ_SCHEDULED_CRON": " */5 * * * * "}, 0, check) == Series(
        0, 0, 0, "*/5 * * * *")


@pytest.mark.parametrize(("headers", "words"), [
    ({"AMQ_SCHEDULED_PERIOD": "soon", "AMQ_SCHEDULED_REPEAT": "1"},
     "AMQ_SCHEDULED_PERIOD='soon' is not a decimal integer"),
    ({"AMQ_SCHEDULED_REPEAT": "-1"}, "AMQ_SCHEDULED_REPEAT='-1' is negative"),
    ({"AMQ_SCHEDULED_REPEAT": "99999999999999"}, "AMQ_SCHEDULED_REPEAT='99999999999999' is more"),
    ({"AMQ_SCHEDULED_CRON": "61 * * * *"}, "AMQ_SCHEDULED_CRON='61 * * * *' is not a cron"),
    ({"AMQ_SCHEDULED_CRON": "* * * *"}, "needs 5 fields"),
    ({"AMQ_SCHEDULED_CRON": ""}, "it is empty"),
])
def test_bad_values_are_refused_naming_the_header(headers: dict[str, str], words: str) -> None:
    with pytest.raises(Refused) as refused:
        series_of(headers, 0, series.check_cron)
    assert refused.value.reason.code == 2046
    assert words in refused.value.detail


def test_a_run_is_delay_then_repeat_copies_a_period_apart() -> None:
    s = Series(1000, 700, 2, None)
    first = first_occurrence(s, T0, series.cron_next)
    assert first == Occurrence(T0 + 1000, 2, None)
    second = next_occurrence(s, first, T0 + 5000, series.cron_next)  # released late
    assert second == Occurrence(T0 + 1700, 1, None)  # the series keeps its times
    third = next_occurrence(s, second, T0, series.cron_next)
    assert third == Occurrence(T0 + 2400, 0, None)
    assert next_occurrence(s, third, T0, series.cron_next) is None


def test_cron_starts_a_run_at_each_firing_and_alone_never_ends() -> None:
    start = T0 - T0 % MINUTE + 10_000  # 10 s into a minute
    s = Series(1000, 500, 1, "* * * * *")
    first = first_occurrence(s, start, series.cron_next)
    fired = start - 10_000 + MINUTE
    assert first == Occurrence(fired + 1000, 1, fired)
    second = next_occurrence(s, first, fired + 1000, series.cron_next)
    assert second == Occurrence(fired + 1500, 0, fired)
    third = next_occurrence(s, second, fired + 1500, series.cron_next)
    assert third == Occurrence(fired + MINUTE + 1000, 1, fired + MINUTE)
    alone = Series(0, 0, 0, "*/2 * * * *")
    occurrence = first_occurrence(alone, start, series.cron_next)
    for _ in range(5):
        following = next_occurrence(alone, occurrence, occurrence.due_ms, series.cron_next)
        assert following is not None and following.due_ms - occurrence.due_ms == 2 * MINUTE
        occurrence = following


def test_a_cron_series_missed_while_away_starts_again_from_now() -> None:
    s = Series(0, 0, 0, "* * * * *")
    fired = T0 - T0 % MINUTE
    later = next_occurrence(s, Occurrence(fired, 0, fired), fired + 10 * MINUTE + 1,
                            series.cron_next)
    assert later == Occurrence(fired + 11 * MINUTE, 0, fired + 11 * MINUTE)


def stage_series(broker: MemoryBroker, *, delay_ms: int, period_ms: int, repeat: int,
                 layout: Layout) -> str:
    """A first staged copy as the delay interceptor makes it; returns its job id."""
    s = Series(delay_ms, period_ms, repeat, None)
    first = first_occurrence(s, T0, series.cron_next)
    headers = envelope.staged_headers(
        [("x-app", "kept")], broker.format, target=TARGET,
        staging_destination=broker.format.client_destination(layout.queue_for(delay_ms)),
        due_ms=first.due_ms, sent_ms=T0, expires_ms=None, drop=())
    job = dict(headers)[envelope.MESSAGE_ID]
    headers += series.series_headers(s, job, first)
    broker.put(layout.queue_for(delay_ms),
               Message({n: v for n, v in headers if n != "destination"}, b"tick"))
    return job


def copies(broker: MemoryBroker) -> list[tuple[int, Message]]:
    return broker.delivered(TARGET)


def test_the_engine_releases_each_copy_and_stages_the_next() -> None:
    clock = Clock()
    broker = MemoryBroker(clock=clock)
    engine, stats, _ = engine_for(broker, clock)
    job = stage_series(broker, delay_ms=1000, period_ms=700, repeat=2, layout=engine.layout)
    drive(engine, clock, T0 + 10_000)
    got = copies(broker)
    assert [t for t, _ in got] == [T0 + 1000, T0 + 1700, T0 + 2400]
    assert {m.headers["scheduledJobId"] for _, m in got} == {job}
    ids = [m.headers[envelope.MESSAGE_ID] for _, m in got]
    assert len(set(ids)) == 3 and job not in ids
    assert all(m.headers["x-app"] == "kept" and m.body == b"tick" for _, m in got)
    assert not [n for _, m in got for n in m.headers if n.startswith(series.SERIES)]
    assert broker.held_count == 0 and all(broker.depth(q) == 0 for q in engine.layout.queues)
    assert stats.released == 3


@pytest.mark.parametrize("restart", [False, True])
def test_a_crash_in_the_settle_loses_no_copy_and_doubles_no_series(restart: bool) -> None:
    """The next copy is confirmed, the released one not acknowledged: it comes back, and its
    next copy is staged twice. Each occurrence still goes out once (twice at most for the one
    in flight when the engine itself was lost), and the series does not double."""
    clock = Clock()
    broker = MemoryBroker(clock=clock)
    engine, _, _ = engine_for(broker, clock)
    stage_series(broker, delay_ms=1000, period_ms=700, repeat=3, layout=engine.layout)
    drive(engine, clock, T0 + 999)
    broker.fail_next_settle(after=0, published=True)  # the first copy's settle
    drive(engine, clock, T0 + 1000)
    if restart:  # a new bridge: nothing remembered
        engine, _, _ = engine_for(broker, clock)
    drive(engine, clock, T0 + 20_000)
    times = [t for t, _ in copies(broker)]
    due = [T0 + 1000, T0 + 1700, T0 + 2400, T0 + 3100]
    if restart:
        assert times[0] == T0 + 1000 and times[2:] == due[1:], times
        assert len({m.headers[envelope.MESSAGE_ID] for _, m in copies(broker)[:2]}) == 1
    else:
        assert times == due
    assert broker.held_count == 0 and all(broker.depth(q) == 0 for q in engine.layout.queues)
    staged = [m.headers[series.NUMBER] for _, d, m in broker.published
              if d != TARGET and series.NUMBER in m.headers]
    assert staged.count("1") == 2, "the copy after the one in flight is staged twice"
    assert staged.count("2") == staged.count("3") == 1, "the duplicate goes no further"


def test_passthrough_leaves_the_scheduler_headers_to_activemq() -> None:
    from bridge.app.config import resolve
    from bridge.app.serve import delay_config

    taken = resolve({"broker": "activemq"}, environ={})
    assert taken.activemq_scheduler == "take"
    assert "AMQ_SCHEDULED_DELAY" in delay_config(taken).relative_headers
    passed = resolve({"broker": "activemq", "activemq-scheduler": "passthrough"}, environ={})
    assert "AMQ_SCHEDULED_DELAY" not in delay_config(passed).relative_headers


def test_the_management_interceptor_holds_acts_then_relays() -> None:
    import asyncio

    from bridge.intercept.decisions import RELAY, Hold, Refuse
    from bridge.intercept.scheduler import ManagementInterceptor, Request
    from bridge.intercept.views import Principal, Send

    done: list[Request] = []

    async def act(request: Request) -> None:
        done.append(request)
        if request.action == "REMOVE":
            raise Refused(MQRC_NOT_AUTHORIZED, "no")

    icpt = ManagementInterceptor(act)
    who = Principal("app", "pw")
    topic = "/topic/ActiveMQ.Scheduler.Management"
    browse = Send(topic, {"AMQ_SCHEDULER_ACTION": "browse", "reply-to": "/queue/r",
                          "AMQ_SCHEDULER_ACTION_END_TIME": "5"}, 0, who)
    held = icpt.on_send(browse)
    assert isinstance(held, Hold)
    asyncio.run(held.check())  # type: ignore[arg-type]
    assert done == [Request("BROWSE", who, "/queue/r", None, None, 5)]
    assert icpt.on_send(browse) is RELAY  # offered again after the check: on to the broker
    assert isinstance(icpt.on_send(browse), Hold)  # the same send again is a new action
    remove = Send(topic, {"AMQ_SCHEDULER_ACTION": "REMOVE", "scheduledJobId": "J"}, 0, who)
    held = icpt.on_send(remove)
    assert isinstance(held, Hold)
    asyncio.run(held.check())  # type: ignore[arg-type]
    refused = icpt.on_send(remove)
    assert isinstance(refused, Refuse) and refused.refusal.reason is MQRC_NOT_AUTHORIZED
    assert icpt.on_send(Send("/queue/q", {"AMQ_SCHEDULER_ACTION": "BROWSE"}, 0)) is RELAY
    for headers, words in [({"AMQ_SCHEDULER_ACTION": "PURGE"}, "is not BROWSE"),
                           ({"AMQ_SCHEDULER_ACTION": "BROWSE"}, "needs a reply-to"),
                           ({"AMQ_SCHEDULER_ACTION": "REMOVE"}, "needs scheduledJobId"),
                           ({"AMQ_SCHEDULER_ACTION": "REMOVEALL",
                             "AMQ_SCHEDULER_ACTION_START_TIME": "soon"}, "START_TIME='soon'")]:
        bad = icpt.on_send(Send(topic, headers, 0, who))
        assert isinstance(bad, Refuse) and bad.refusal.reason.code == 2046
        assert words in bad.refusal.detail


def test_an_operators_release_now_delivers_the_next_copy_and_ends_the_series() -> None:
    from bridge.staging.orders import Order, OrderAction

    clock = Clock()
    broker = MemoryBroker(clock=clock)
    engine, _, _ = engine_for(broker, clock)
    job = stage_series(broker, delay_ms=1000, period_ms=5000, repeat=3, layout=engine.layout)
    drive(engine, clock, T0 + 999)
    assert clock.now == T0 + 1000
    engine.step(clock.now)  # the first copy released, the second staged for 6 s
    clock.now += 10
    engine.orders.take(Order.new(OrderAction.RELEASE, job, "").message(), clock.now)
    drive(engine, clock, T0 + 60_000)
    got = copies(broker)
    assert [t for t, _ in got] == [T0 + 1000, T0 + 1010]
    assert got[1][1].headers["scheduledJobId"] == job
    assert broker.held_count == 0 and all(broker.depth(q) == 0 for q in engine.layout.queues)

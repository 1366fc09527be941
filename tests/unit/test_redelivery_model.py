"""The canonical model: counting, the terminal rule, move targets, and properties of decide()."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.errors import ConfigError
from policies.reasons import MQRC_BACKOUT_THRESHOLD_REACHED
from policies.redelivery import (
    PRESERVE_UNDELIVERED_HEADER,
    Delete,
    Move,
    Policy,
    Redeliver,
    Undelivered,
    decide,
    parse_jmsjca,
)
from policies.redelivery.destinations import kind_and_name, parse_destination, resolve_move
from policies.redelivery.model import MAX_WAIT_MS, Backoff, MoveTo, Step

PRESERVE = {PRESERVE_UNDELIVERED_HEADER: "true"}


def test_before_the_first_step_a_failure_is_redelivered_at_once() -> None:
    policy = Policy("test", "t", (Step(2, Backoff(100)),))
    assert [decide(policy, n, "/queue/a", {}, 0.5) for n in (1, 2, 3, 4)] == [
        Redeliver(0), Redeliver(0), Redeliver(100), Redeliver(100)
    ]


def test_a_step_counts_its_backoff_from_where_it_starts() -> None:
    policy = Policy("test", "t", (Step(3, Backoff(100, multiplier=2, max_ms=350)),))
    delays = [decide(policy, n, "/queue/a", {}, 0.5) for n in range(4, 8)]
    assert delays == [Redeliver(100), Redeliver(200), Redeliver(350), Redeliver(350)]


def test_failures_count_from_one() -> None:
    with pytest.raises(ValueError):
        decide(parse_jmsjca("5:1000"), 0, "/queue/a", {}, 0.5)


def test_terminal_actions_carry_the_backout_reason() -> None:
    action = decide(parse_jmsjca("2:delete"), 3, "/queue/a", {}, 0.5)
    assert action == Delete()
    assert action.reason is MQRC_BACKOUT_THRESHOLD_REACHED
    assert MQRC_BACKOUT_THRESHOLD_REACHED.code == 2362


@pytest.mark.parametrize("text", ["2:delete", "2:move(queue:dlq)"])
def test_a_message_that_asks_to_be_preserved_goes_to_the_undelivered_queue(text: str) -> None:
    policy = parse_jmsjca(text)
    assert decide(policy, 3, "/queue/a", PRESERVE, 0.5) == Undelivered()
    # TIBCO's property is a boolean: true or 1 in any form (an AMQP boolean shows as "true")
    for value in ("TRUE", "True", " true ", "1", "01", "1.0"):
        headers = {PRESERVE_UNDELIVERED_HEADER: value}
        assert decide(policy, 3, "/queue/a", headers, 0.5) == Undelivered(), value


def test_the_preserve_property_changes_nothing_before_the_limit() -> None:
    assert decide(parse_jmsjca("2:delete"), 2, "/queue/a", PRESERVE, 0.5) == Redeliver(0)


def test_without_the_property_the_policy_decides() -> None:
    policy = parse_jmsjca("2:move(queue:dlq)")
    for value in ("false", "0", "", "2", "yes", "1.5"):
        headers = {PRESERVE_UNDELIVERED_HEADER: value}
        assert decide(policy, 3, "/queue/a", headers, 0.5) == Move("/queue/dlq"), value
    assert decide(policy, 3, "/queue/a", {}, 0.5) == Move("/queue/dlq")


def test_steps_must_increase_and_end_with_the_terminal_one() -> None:
    with pytest.raises(ConfigError):
        Policy("test", "t", (Step(5, Backoff(1)), Step(5, Backoff(2))))
    with pytest.raises(ConfigError):
        Policy("test", "t", (Step(1, Delete()), Step(5, Backoff(2))))


def test_limit_is_the_first_terminal_failure() -> None:
    assert parse_jmsjca("5:1000; 50:delete").limit == 51
    assert parse_jmsjca("5:1000").limit is None


@pytest.mark.parametrize(
    ("destination", "expected"),
    [
        ("/queue/Queue1", ("queue", "Queue1")),
        ("/topic/prices", ("topic", "prices")),
        ("/amq/queue/orders", ("queue", "orders")),
        ("/exchange/amq.topic/prices.eu", ("topic", "prices.eu")),
        ("/temp-queue/r1", ("queue", "r1")),
        ("orders", ("queue", "orders")),
    ],
)
def test_kind_and_name_of_a_source(destination: str, expected: tuple[str, str]) -> None:
    assert kind_and_name(destination) == expected


@pytest.mark.parametrize(
    ("kind", "name", "source", "expected"),
    [
        ("queue", "dlq$error", "/queue/Queue1", "/queue/dlqQueue1error"),
        ("queue", "mydlq", "/topic/prices", "/queue/mydlq"),
        ("topic", "x", "/queue/a", "/topic/x"),
        ("same", "x", "/topic/prices", "/topic/x"),
        ("same", "dlq.$", "/queue/orders", "/queue/dlq.orders"),
        ("same", "dlq.$", "/amq/queue/orders", "/queue/dlq.orders"),
        ("same", "$.$", "/exchange/ex/key", "/topic/key.key"),
        ("exact", "/queue/a$b", "/queue/z", "/queue/a$b"),
    ],
)
def test_resolve_move(kind: str, name: str, source: str, expected: str) -> None:
    assert resolve_move(kind, name, source) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("/queue/dlq", "/queue/dlq"),
        ("/amq/queue/dlq", "/amq/queue/dlq"),
        ("/exchange/dead/letters", "/exchange/dead/letters"),
        ("DLQ", "/queue/DLQ"),
        ("queue/DLQ", "/queue/DLQ"),
        ("topic/errors", "/topic/errors"),
        ("jboss.messaging.destination:service=Queue,name=DLQ", "/queue/DLQ"),
        ("jboss.messaging.destination:service=Topic,name=Errors", "/topic/Errors"),
        ("$sys.undelivered", None),
    ],
)
def test_vendor_destinations(value: str, expected: str | None) -> None:
    assert parse_destination(value) == expected


@pytest.mark.parametrize("value", ["", "/foo/x", "/queue/", "jms/ErrorQueue",
                                   "jboss.messaging.destination:service=Bus,name=X"])
def test_bad_vendor_destinations(value: str) -> None:
    with pytest.raises(ConfigError):
        parse_destination(value)


def test_move_rule_needs_a_kind_and_a_name() -> None:
    with pytest.raises(ConfigError):
        MoveTo("bus", "x")


# Properties.

backoffs = st.builds(
    Backoff,
    initial_ms=st.integers(0, 10**7),
    multiplier=st.floats(1.0, 100.0),
    max_ms=st.one_of(st.none(), st.integers(0, 10**8)),
    jitter=st.floats(0.0, 1.0),
)


@st.composite
def policies(draw: st.DrawFn) -> Policy:
    starts = sorted(draw(st.sets(st.integers(0, 200), max_size=5)))
    steps = [Step(after, draw(backoffs)) for after in starts]
    if draw(st.booleans()):
        terminal = draw(st.sampled_from([Delete(), Undelivered(), MoveTo("same", "dlq.$")]))
        steps.append(Step((starts[-1] + 1) if starts else 0, terminal))
    return Policy("test", "generated", tuple(steps))


@given(policies(), st.integers(1, 10**6), st.floats(0.0, 1.0, exclude_max=True), st.booleans())
def test_decide_never_waits_a_negative_time_and_always_answers(
    policy: Policy, failures: int, rand: float, preserve: bool
) -> None:
    headers = PRESERVE if preserve else {}
    action = decide(policy, failures, "/queue/orders", headers, rand)
    assert isinstance(action, Redeliver | Move | Delete | Undelivered)
    if isinstance(action, Redeliver):
        assert action.delay_ms >= 0
    if isinstance(action, Move):
        assert action.destination == "/queue/dlq.orders"


@given(backoffs, st.integers(0, 50), st.integers(1, 10**6), st.floats(0.0, 1.0, exclude_max=True))
def test_a_delay_never_exceeds_its_cap(
    backoff: Backoff, after: int, failures: int, rand: float
) -> None:
    policy = Policy("test", "t", (Step(after, backoff),))
    action = decide(policy, failures, "/queue/a", {}, rand)
    assert isinstance(action, Redeliver)
    assert 0 <= action.delay_ms <= MAX_WAIT_MS
    if backoff.max_ms is not None:
        assert action.delay_ms <= backoff.max_ms


@given(st.integers(0, 5000), st.floats(1.0, 10.0), st.integers(1, 60))
def test_without_jitter_delays_never_shrink(initial: int, multiplier: float, failures: int) -> None:
    policy = Policy("test", "t", (Step(0, Backoff(initial, multiplier, 100_000)),))
    first = decide(policy, failures, "/queue/a", {}, 0.5)
    second = decide(policy, failures + 1, "/queue/a", {}, 0.5)
    assert isinstance(first, Redeliver) and isinstance(second, Redeliver)
    assert first.delay_ms <= second.delay_ms

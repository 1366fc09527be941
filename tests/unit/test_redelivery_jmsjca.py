"""JMSJCA redelivery strings: the Java CAPS JMS Reference's examples, default and limits."""

import pytest

from policies.errors import ConfigError
from policies.redelivery import (
    DEFAULT_POLICY,
    DEFAULT_TEXT,
    Delete,
    Move,
    Policy,
    Redeliver,
    decide,
    parse_jmsjca,
)


def actions(policy: Policy, source: str, upto: int) -> list[object]:
    return [decide(policy, n, source, {}, 0.5) for n in range(1, upto + 1)]


def test_5_1000_is_no_delay_for_the_first_five_redeliveries_then_one_second() -> None:
    # "no delay for the first five attempts at redelivery, then a one-second delay for each
    # subsequent attempt": failures 1-5 (JMSXDeliveryCount 1-5) are redelivered at once, the
    # sixth failed delivery waits 1000 ms before redelivery 6.
    policy = parse_jmsjca("5:1000")
    assert actions(policy, "/queue/Queue1", 8) == [Redeliver(0)] * 5 + [Redeliver(1000)] * 3
    assert decide(policy, 10_000, "/queue/Queue1", {}, 0.5) == Redeliver(1000)


def test_cascaded_delays() -> None:
    policy = parse_jmsjca("5:1000; 10:5000")
    got = actions(policy, "/queue/Queue1", 12)
    assert got == [Redeliver(0)] * 5 + [Redeliver(1000)] * 5 + [Redeliver(5000)] * 2


def test_delay_then_move_to_a_dead_letter_queue_after_50() -> None:
    policy = parse_jmsjca("5:1000; 10:5000; 50:move(queue:mydlq)")
    assert decide(policy, 50, "/queue/Queue1", {}, 0.5) == Redeliver(5000)
    assert decide(policy, 51, "/queue/Queue1", {}, 0.5) == Move("/queue/mydlq")
    assert policy.limit == 51


def test_dollar_is_the_source_destination_name() -> None:
    policy = parse_jmsjca("5:1000; 10:5000; 50:move(queue:dlq$error)")
    assert decide(policy, 51, "/queue/Queue1", {}, 0.5) == Move("/queue/dlqQueue1error")


def test_move_without_retries_applies_from_the_first_failure() -> None:
    assert decide(parse_jmsjca("move(topic:x)"), 1, "/queue/a", {}, 0.5) == Move("/topic/x")


def test_same_keeps_the_kind_of_the_source() -> None:
    policy = parse_jmsjca("move(same:x)")
    assert decide(policy, 1, "/topic/prices", {}, 0.5) == Move("/topic/x")
    assert decide(policy, 1, "/queue/orders", {}, 0.5) == Move("/queue/x")


def test_delete_after_50() -> None:
    policy = parse_jmsjca("50:delete")
    assert decide(policy, 50, "/queue/a", {}, 0.5) == Redeliver(0)
    assert decide(policy, 51, "/queue/a", {}, 0.5) == Delete()
    full = parse_jmsjca("5:1000; 10:5000; 50:delete")
    assert decide(full, 51, "/queue/a", {}, 0.5) == Delete()


def test_the_default_is_jmsjcas_table() -> None:
    assert DEFAULT_TEXT == "3:25; 5:50; 10:100; 20:1000; 50:5000"
    assert DEFAULT_POLICY.dialect == "jmsjca"
    assert DEFAULT_POLICY.text == DEFAULT_TEXT
    delays = {n: decide(DEFAULT_POLICY, n, "/queue/a", {}, 0.5) for n in
              (1, 3, 4, 5, 6, 10, 11, 20, 21, 50, 51, 1000)}
    assert delays == {
        1: Redeliver(0), 3: Redeliver(0), 4: Redeliver(25), 5: Redeliver(25), 6: Redeliver(50),
        10: Redeliver(50), 11: Redeliver(100), 20: Redeliver(100), 21: Redeliver(1000),
        50: Redeliver(1000), 51: Redeliver(5000), 1000: Redeliver(5000),
    }
    assert DEFAULT_POLICY.limit is None


def test_policy_keeps_dialect_and_text() -> None:
    policy = parse_jmsjca("  5:1000; 50:delete ")
    assert (policy.dialect, policy.text) == ("jmsjca", "5:1000; 50:delete")


def test_spacing_and_case_are_forgiven() -> None:
    assert parse_jmsjca("5:1000;10:5000").steps == parse_jmsjca("5:1000; 10:5000").steps
    assert parse_jmsjca("5 : 1000 ; 50:MOVE(Queue: dlq)").steps[-1].rule == \
        parse_jmsjca("5:1000; 50:move(queue:dlq)").steps[-1].rule


def test_five_seconds_is_the_ceiling() -> None:
    assert decide(parse_jmsjca("1:5000"), 2, "/queue/a", {}, 0.5) == Redeliver(5000)
    with pytest.raises(ConfigError, match=r"'1:5001'.*maximum of 5000 ms"):
        parse_jmsjca("1:5001")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("10:abc", r"'10:abc': delay must be milliseconds"),
        ("5:1000; 10:abc", r"'10:abc': delay must be milliseconds"),
        ("10:-5", r"'10:-5': delay must be milliseconds"),
        ("5:1000, 10:5000", r"separated by '; '"),
        ("x:100", r"'x:100': retries must be a whole number"),
        ("-1:100", r"retries must be a whole number"),
        ("1000", r"'1000': write retries:delay"),
        ("", r"empty"),
        ("5:1000;", r"empty entry"),
        ("10:100; 5:50", r"'5:50': retries must increase"),
        ("5:100; 5:200", r"'5:200': retries must increase"),
        ("50:delete; 60:1000", r"'60:1000': nothing can follow"),
        ("move(queue:a); 5:100", r"nothing can follow"),
        ("5:move(bus:x)", r"'5:move\(bus:x\)': a move names queue:, topic: or same:"),
        ("5:move(queue:)", r"no target"),
        ("5:move(queue:x", r"expected move\(queue:NAME\)"),
        ("5:move(queue:a/b)", r"a move target is a name"),
        ("5:remove", r"'5:remove': delay must be milliseconds"),
        ("5:1234567890123", r"delay must be milliseconds"),
    ],
)
def test_bad_strings_name_the_offending_entry(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_jmsjca(text)

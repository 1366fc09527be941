"""A destination pattern means the queue or topic however a client names it, on each broker; the
redelivery table, message-retry, --delay-disabled and the per-user sections all match that way,
and a pattern that can never match anything the broker has is named at start."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.app.config import resolve
from bridge.app.policy_report import pattern_warnings
from policies.delay import DelayConfig, delay_of, matches
from policies.errors import ConfigError, Refused
from policies.naming import Named, named, pattern_problem, queue_name
from policies.redelivery import compile_table
from policies.retry import compile_retry

QUEUE_X = Named("queue", "", "orders.x")


@pytest.mark.parametrize(("destination", "broker", "expected"), [
    ("/queue/orders.x", "rabbitmq", QUEUE_X),
    ("/amq/queue/orders.x", "rabbitmq", QUEUE_X),
    ("orders.x", "rabbitmq", QUEUE_X),
    ("/topic/orders.x", "rabbitmq", Named("topic", "", "orders.x")),
    ("/exchange/amq.direct/orders.x", "rabbitmq", Named("exchange", "amq.direct", "orders.x")),
    ("/exchange/logs", "rabbitmq", Named("exchange", "logs", "")),
    ("/temp-queue/r", "rabbitmq", Named("temp-queue", "", "r")),
    ("/queues/orders.x", "rabbitmq", None),
    ("queue/orders.x", "rabbitmq", None),
    ("queue://orders.x", "rabbitmq", None),
    ("/queue/a/b", "rabbitmq", None),
    ("/queue/orders.x", "activemq", QUEUE_X),
    ("orders.x", "activemq", QUEUE_X),
    ("/topic/orders.x", "activemq", Named("topic", "", "orders.x")),
    ("/temp-topic/t", "activemq", Named("temp-topic", "", "t")),
    # ActiveMQ takes any other form as the literal name of a queue (as its STOMP does).
    ("/amq/queue/orders.x", "activemq", Named("queue", "", "/amq/queue/orders.x")),
    ("queue://orders.x", "activemq", Named("queue", "", "queue://orders.x")),
])
def test_the_canonical_form_of_a_destination(
    destination: str, broker: str, expected: Named | None,
) -> None:
    assert named(destination, broker) == expected


QUEUE_FORMS = ["/queue/orders.x", "/amq/queue/orders.x", "orders.x"]


@pytest.mark.parametrize("pattern", ["/queue/orders.*", "/amq/queue/orders.*", "orders.*",
                                     "/queue/orders.x", "/amq/queue/orders.>", "orders.x"])
@pytest.mark.parametrize("destination", QUEUE_FORMS)
def test_on_rabbitmq_every_queue_form_matches_every_queue_pattern(
    pattern: str, destination: str,
) -> None:
    assert matches(pattern, destination, "rabbitmq")


@pytest.mark.parametrize(("pattern", "destination", "broker"), [
    ("/queue/orders.*", "/topic/orders.x", "rabbitmq"),
    ("/amq/queue/orders.*", "/topic/orders.x", "rabbitmq"),
    ("/queue/orders.*", "/exchange/amq.direct/orders.x", "rabbitmq"),
    ("/topic/orders.*", "orders.x", "rabbitmq"),
    ("/topic/orders.*", "/amq/queue/orders.x", "rabbitmq"),
    ("/exchange/amq.topic/orders.*", "/topic/orders.x", "rabbitmq"),
    ("/queues/orders.*", "/queue/orders.x", "rabbitmq"),
    ("queue/orders.*", "/queue/orders.x", "rabbitmq"),
    ("/queue/orders.*", "/topic/orders.x", "activemq"),
    ("/amq/queue/orders.*", "/queue/orders.x", "activemq"),
    ("/queue/orders.*", "/amq/queue/orders.x", "activemq"),
])
def test_topics_stay_topics_and_foreign_forms_match_nothing(
    pattern: str, destination: str, broker: str,
) -> None:
    assert not matches(pattern, destination, broker)


def test_on_activemq_a_queue_pattern_covers_the_bare_name() -> None:
    assert matches("/queue/orders.*", "orders.x", "activemq")
    assert matches("orders.*", "/topic/orders.x", "activemq")  # bare: every kind


def test_the_redelivery_table_and_its_user_sections_look_up_by_queue() -> None:
    table = compile_table({
        "/queue/orders.*": "1:move(queue:dlq)",
        "users": {"batch": {"/amq/queue/orders.eu": "delete"}},
    }).on("rabbitmq")
    for destination in QUEUE_FORMS:
        assert table.lookup(destination)[0] == "/queue/orders.*"
    assert table.lookup("/topic/orders.x")[0] is None
    assert table.lookup("/queue/orders.eu", "batch")[0] == "/amq/queue/orders.eu"
    assert table.lookup("orders.eu", "batch")[1].text == "delete"


def test_the_most_specific_pattern_wins_across_forms() -> None:
    table = compile_table({"orders.*": "delete", "/amq/queue/orders.*": "1:move(queue:a)",
                           "/queue/orders.eu": "2:move(queue:b)"}).on("rabbitmq")
    assert table.lookup("/amq/queue/orders.eu")[0] == "/queue/orders.eu"
    assert table.lookup("/queue/orders.us")[0] == "/amq/queue/orders.*"
    assert table.lookup("/topic/orders.us")[0] == "orders.*"


def test_two_forms_of_one_pattern_are_refused_on_the_broker_where_they_are_one() -> None:
    table = compile_table({"/queue/orders.*": "delete", "/amq/queue/orders.*": "1:move(queue:a)"})
    with pytest.raises(ConfigError, match="'/queue/orders.\\*' and '/amq/queue/orders.\\*' are "
                                          "the same pattern on rabbitmq"):
        table.on("rabbitmq")
    assert table.on("activemq").lookup("/queue/orders.x")[0] == "/queue/orders.*"


def test_the_settings_read_patterns_in_their_broker_s_forms(tmp_path: Path) -> None:
    path = tmp_path / "bridge.yaml"
    path.write_text('redelivery:\n  "/queue/orders.*": "delete"\n'
                    'message-retry:\n  "/queue/orders.*": {count: 3}\n')
    rabbit = resolve({}, config_file=str(path), environ={})
    assert rabbit.redelivery.lookup("/amq/queue/orders.x")[0] == "/queue/orders.*"
    assert rabbit.message_retry.lookup("/amq/queue/orders.x").count == 3
    amq = resolve({"broker": "activemq"}, config_file=str(path), environ={})
    assert amq.redelivery.lookup("/amq/queue/orders.x")[0] is None
    assert amq.redelivery.lookup("orders.x")[0] == "/queue/orders.*"


def test_message_retry_looks_up_by_queue() -> None:
    table = compile_retry({"/queue/orders.*": {"count": 3}}).on("rabbitmq")
    assert table.lookup("/amq/queue/orders.x").count == 3
    assert table.lookup("/topic/orders.x").count == 10


def test_delay_disabled_covers_every_form_of_the_queue() -> None:
    config = DelayConfig(disabled_destinations=("/queue/orders.*",), broker="rabbitmq")
    for destination in QUEUE_FORMS:
        with pytest.raises(Refused, match="delivery delay is disabled"):
            delay_of({"x-delay": "1000"}, destination, 0, config)
    assert delay_of({"x-delay": "1000"}, "/topic/orders.x", 0, config) is not None


@pytest.mark.parametrize(("pattern", "broker", "why"), [
    ("/queues/x", "rabbitmq", "RabbitMQ has no destination of this form"),
    ("queue/x", "rabbitmq", "RabbitMQ has no destination of this form"),
    ("/queue/a/b", "rabbitmq", "RabbitMQ has no destination of this form"),
    ("/amq/queue/x", "activemq", "write /queue/x"),
    ("/queues/x", "activemq", "literal name of a queue"),
    ("queue/x", "activemq", "literal name of a queue"),
])
def test_a_pattern_that_can_never_match_says_why(pattern: str, broker: str, why: str) -> None:
    problem = pattern_problem(pattern, broker)
    assert problem is not None and why in problem


@pytest.mark.parametrize(("pattern", "broker"), [
    ("/queue/x.*", "rabbitmq"), ("/amq/queue/x", "rabbitmq"), ("x.>", "rabbitmq"),
    ("/topic/x", "rabbitmq"), ("/exchange/amq.topic/x.*", "rabbitmq"), (">", "activemq"),
    ("/queue/x.*", "activemq"), ("/topic/x", "activemq"),
])
def test_a_pattern_that_can_match_has_no_problem(pattern: str, broker: str) -> None:
    assert pattern_problem(pattern, broker) is None


def test_the_bridge_names_each_pattern_that_can_never_match(tmp_path: Path) -> None:
    path = tmp_path / "bridge.yaml"
    path.write_text('broker: activemq\n'
                    'delay-disabled: "/queue/ok.*,queue/prices"\n'
                    'redelivery:\n  "/amq/queue/orders.*": "delete"\n  "/queue/fine": "delete"\n'
                    '  users: {bob: {"/queues/x": "delete"}}\n'
                    'message-retry:\n  "/amq/queue/audit": {count: 0}\n')
    warnings = pattern_warnings(resolve({}, config_file=str(path), environ={}))
    assert len(warnings) == 4, warnings
    joined = "\n".join(warnings)
    for pattern in ("'/amq/queue/orders.*'", "'queue/prices'", "'/queues/x'",
                    "'/amq/queue/audit'"):
        assert pattern in joined
    assert all(line.count("\n") == 0 and "never match" in line for line in warnings)
    assert "redelivery of user 'bob'" in joined and "delay-disabled" in joined
    assert "message-retry" in joined


@pytest.mark.parametrize(("text", "broker", "expected"), [
    ("orders.x", "rabbitmq", "orders.x"),
    ("/queue/orders.x", "rabbitmq", "orders.x"),
    ("/amq/queue/orders.x", "rabbitmq", "orders.x"),
    ("orders.x", "activemq", "orders.x"),
    ("/queue/orders.x", "activemq", "orders.x"),
    ("ActiveMQ.DLQ", "activemq", "ActiveMQ.DLQ"),
])
def test_a_tool_takes_a_queue_in_every_form_the_bridge_prints(
    text: str, broker: str, expected: str
) -> None:
    assert queue_name(text, broker) == expected


@pytest.mark.parametrize(("text", "broker", "words"), [
    ("/topic/x", "rabbitmq", "names a topic"),
    ("/topic/x", "activemq", "names a topic"),
    ("/exchange/e/k", "rabbitmq", "names an exchange"),
    ("/queues/x", "rabbitmq", "RabbitMQ has no destination of this form"),
    ("/queue/", "activemq", "empty name"),
    ("", "rabbitmq", "not a queue"),
])
def test_what_names_no_queue_is_refused_saying_why(text: str, broker: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        queue_name(text, broker)


def test_a_queues_target_forms_are_every_name_the_bridge_may_have_written() -> None:
    from policies.naming import target_forms

    for given in ("/queue/orders.x", "/amq/queue/orders.x", "orders.x"):
        assert target_forms(given, "rabbitmq") == ("/queue/orders.x", "/amq/queue/orders.x")
    for given in ("/queue/orders.x", "orders.x"):
        assert target_forms(given, "activemq") == ("/queue/orders.x", "orders.x")
    for other in ("/topic/orders.x", "/exchange/amq.direct/k"):
        assert target_forms(other, "rabbitmq") == (other,)

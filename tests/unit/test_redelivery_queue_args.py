"""A queue's own delayed-retry arguments (RabbitMQ 4.3 quorum queues, LavinMQ) compiled into the
canonical policy: names, units, backoff and the end at x-delivery-limit as each broker
documents them."""

import pytest

from policies.errors import ConfigError
from policies.redelivery import Delete, Move, Policy, Redeliver, RedeliveryAction, decide
from policies.redelivery.queue_args import parse_queue_args

QUEUE = "orders"
SOURCE = "/amq/queue/orders"


def run(policy: Policy, upto: int) -> list[RedeliveryAction]:
    return [decide(policy, n, SOURCE, {}, 0.5) for n in range(1, upto + 1)]


def test_no_delayed_retry_arguments_is_no_policy() -> None:
    assert parse_queue_args({}, QUEUE) is None
    assert parse_queue_args({"x-queue-type": "quorum", "x-delivery-limit": 5,
                             "x-dead-letter-exchange": "dlx"}, QUEUE) is None
    assert parse_queue_args({"x-delayed-retry-type": "disabled",
                             "x-delayed-retry-min": 100}, QUEUE) is None


def test_rabbitmq_linear_backoff_capped_then_dead_lettered() -> None:
    # delay = min(min * delivery_count, max); past the limit: the dead-letter exchange
    p = parse_queue_args({"x-queue-type": "quorum", "x-delayed-retry-type": "all",
                          "x-delayed-retry-min": 1000, "x-delayed-retry-max": 2500,
                          "x-delivery-limit": 4, "x-dead-letter-exchange": "dlx",
                          "x-dead-letter-routing-key": "dead"}, QUEUE)
    assert p is not None and p.dialect == "queue arguments"
    assert "x-delayed-retry-min=1000" in p.text and "x-delivery-limit=4" in p.text
    assert run(p, 5) == [Redeliver(1000), Redeliver(2000), Redeliver(2500), Redeliver(2500),
                         Move("/exchange/dlx/dead")]
    assert p.limit == 5


@pytest.mark.parametrize("kind", ["all", "failed", "returned", "ALL"])
def test_every_enabled_type_takes_the_schedule(kind: str) -> None:
    p = parse_queue_args({"x-delayed-retry-type": kind, "x-delayed-retry-min": 300,
                          "x-delivery-limit": 2}, QUEUE)
    assert p is not None
    # no dead-letter exchange: dropped at the limit
    assert run(p, 3) == [Redeliver(300), Redeliver(600), Delete()]


def test_default_exchange_dead_letters_to_the_named_queue_and_the_key_defaults() -> None:
    p = parse_queue_args({"x-delayed-retry-type": "all", "x-delayed-retry-min": 10,
                          "x-delivery-limit": 0, "x-dead-letter-exchange": "",
                          "x-dead-letter-routing-key": "orders.dlq"}, QUEUE)
    assert p is not None and run(p, 1) == [Move("/amq/queue/orders.dlq")]
    # without a routing key RabbitMQ keeps the message's own: a message published to the queue
    # through the default exchange carries the queue's name
    p = parse_queue_args({"x-delayed-retry-type": "all", "x-delayed-retry-min": 10,
                          "x-delivery-limit": 1, "x-dead-letter-exchange": "dlx"}, QUEUE)
    assert p is not None and run(p, 2) == [Redeliver(10), Move("/exchange/dlx/orders")]


def test_the_default_limit_is_twenty_and_minus_one_is_none() -> None:
    p = parse_queue_args({"x-delayed-retry-type": "all", "x-delayed-retry-min": 5}, QUEUE)
    assert p is not None and p.limit == 21
    assert run(p, 21)[-1] == Delete() and run(p, 20)[-1] == Redeliver(100)
    p = parse_queue_args({"x-delayed-retry-type": "all", "x-delayed-retry-min": 5,
                          "x-delayed-retry-max": 20, "x-delivery-limit": -1}, QUEUE)
    assert p is not None and p.limit is None
    assert decide(p, 1000, SOURCE, {}, 0.5) == Redeliver(20)


def test_lavinmq_min_alone_enables_linear_retries() -> None:
    p = parse_queue_args({"x-delayed-retry-min": 200, "x-delivery-limit": 3,
                          "x-dead-letter-exchange": "dlx"}, QUEUE)
    assert p is not None
    assert run(p, 4) == [Redeliver(200), Redeliver(400), Redeliver(600),
                         Move("/exchange/dlx/orders")]


def test_lavinmq_multiplier_one_is_constant_and_two_is_exponential_capped() -> None:
    p = parse_queue_args({"x-delayed-retry-min": 200, "x-delayed-retry-multiplier": 1,
                          "x-delivery-limit": 3}, QUEUE)
    assert p is not None and run(p, 3) == [Redeliver(200)] * 3
    p = parse_queue_args({"x-delayed-retry-min": 100, "x-delayed-retry-multiplier": 2,
                          "x-delayed-retry-max": 500, "x-delivery-limit": 5}, QUEUE)
    assert p is not None
    assert run(p, 6) == [Redeliver(100), Redeliver(200), Redeliver(400), Redeliver(500),
                         Redeliver(500), Delete()]


def test_numbers_may_come_as_text_from_a_management_api() -> None:
    p = parse_queue_args({"x-delayed-retry-type": "all", "x-delayed-retry-min": "250",
                          "x-delivery-limit": "1"}, QUEUE)
    assert p is not None and run(p, 2) == [Redeliver(250), Delete()]


@pytest.mark.parametrize(("args", "named"), [
    ({"x-delayed-retry-type": "sometimes", "x-delayed-retry-min": 1}, "x-delayed-retry-type"),
    ({"x-delayed-retry-type": "all"}, "x-delayed-retry-min"),
    ({"x-delayed-retry-min": 0}, "x-delayed-retry-min"),
    ({"x-delayed-retry-min": "soon"}, "x-delayed-retry-min"),
    ({"x-delayed-retry-min": True}, "x-delayed-retry-min"),
    ({"x-delayed-retry-min": 10, "x-delayed-retry-max": 0}, "x-delayed-retry-max"),
    ({"x-delayed-retry-min": 10, "x-delayed-retry-multiplier": 0},
     "x-delayed-retry-multiplier"),
    ({"x-delayed-retry-min": 10, "x-delivery-limit": -2}, "x-delivery-limit"),
    ({"x-delayed-retry-min": 10, "x-dead-letter-exchange": 7}, "x-dead-letter-exchange"),
])
def test_bad_arguments_are_named(args: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        parse_queue_args(args, QUEUE)

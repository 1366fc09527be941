"""The settings and pure pieces of bringing broker-expired messages to the undelivered queue."""

from __future__ import annotations

import re

import pytest

from adapters.base import Message
from adapters.rabbitmq_expiry import policy_pattern, rabbitmq_expiry
from bridge.app.config import resolve
from policies.errors import ConfigError


def test_expiry_settings() -> None:
    assert resolve({}, environ={}).expiry_policy is None
    assert resolve({}, environ={}).expiry_dead_letter_queue == "ActiveMQ.DLQ"
    assert resolve({"expiry-policy": "^orders\\."}, environ={}).expiry_policy == "^orders\\."
    assert resolve({"broker": "activemq", "expiry-dead-letter-queue": "off"},
                   environ={}).expiry_dead_letter_queue is None
    with pytest.raises(ConfigError,
                       match=r"expiry-policy \(from --expiry-policy\): not a regular expression"):
        resolve({"expiry-policy": "(orders"}, environ={})
    with pytest.raises(ConfigError, match="expiry-policy: a RabbitMQ policy"):
        resolve({"broker": "activemq", "expiry-policy": ".*"}, environ={})


def test_the_policy_never_covers_the_bridges_own_expired_queue() -> None:
    pattern = re.compile(policy_pattern(".*", "jms-bridge.staging.expired"))
    assert pattern.search("orders") and pattern.search("jms-bridge.staging.expired-not")
    assert not pattern.search("jms-bridge.staging.expired")


def test_only_an_expiry_is_read_as_one() -> None:
    dead = {"x-death-reason": "expired", "x-death-queue": "orders", "x-death-time": "1000",
            "x-death-original-expiration": "500", "x-first-death-queue": "orders", "seq": "1"}
    expiry = rabbitmq_expiry(Message(dead, b"b"), now_ms=5)
    assert expiry is not None
    assert (expiry.destination, expiry.expired_ms) == ("/amq/queue/orders", 1000)
    assert expiry.message.headers == {"seq": "1", "expiration": "500"}
    assert rabbitmq_expiry(Message({**dead, "x-death-reason": "rejected"}, b""), 5) is None

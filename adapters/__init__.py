"""Broker adapters: RabbitMQ through pika, ActiveMQ through stomp.py, behind one interface."""

from __future__ import annotations

from typing import Any

from adapters.base import StagingBroker
from bridge.config import Endpoint
from policies.errors import ConfigError

AMQP_PORT = 5672


def open_broker(
    name: str,
    endpoint_stomp: Endpoint,
    endpoint_amqp: Endpoint | None = None,
    *,
    connect: bool = True,
    **options: Any,
) -> StagingBroker:
    """The adapter for broker ``name``, connected unless ``connect`` is False (BrokerUnavailable
    then names the broker and address). RabbitMQ is reached over AMQP: ``endpoint_amqp``, or
    the STOMP endpoint's host and credentials on port 5672. ``options`` go to the adapter."""
    broker: StagingBroker
    if name == "rabbitmq":
        from adapters.rabbitmq import RabbitMQ

        amqp = endpoint_amqp or Endpoint(
            endpoint_stomp.host, AMQP_PORT, endpoint_stomp.user, endpoint_stomp.password,
            endpoint_stomp.vhost,
        )
        broker = RabbitMQ(amqp, **options)
    elif name == "activemq":
        from adapters.activemq import ActiveMQ

        broker = ActiveMQ(endpoint_stomp, **options)
    else:
        raise ConfigError(f"unknown broker {name!r}: rabbitmq or activemq")
    if connect:
        broker.connect()
    return broker

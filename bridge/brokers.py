"""The staging adapter for the configured broker, with the bridge's own credentials."""

from __future__ import annotations

from adapters.base import StagingBroker
from bridge.config import Settings, bridge_amqp, bridge_stomp


def staging_broker(settings: Settings) -> StagingBroker:
    if settings.broker == "rabbitmq":
        from adapters.rabbitmq import RabbitMQ

        return RabbitMQ(bridge_amqp(settings))
    from adapters.activemq import ActiveMQ

    return ActiveMQ(bridge_stomp(settings))

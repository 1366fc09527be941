"""The staging adapter for the configured broker: with the bridge's own credentials, or with a
client's (to ask the broker what that client may do)."""

from __future__ import annotations

from dataclasses import replace

from adapters.base import StagedFormat, StagingBroker
from bridge.app.config import Settings, bridge_amqp, bridge_stomp
from policies.endpoints import Endpoint


def staging_broker(settings: Settings) -> StagingBroker:
    if settings.broker == "rabbitmq":
        from adapters.rabbitmq import RabbitMQ

        return RabbitMQ(bridge_amqp(settings), management=settings.upstream_management,
                        queue_type=settings.staging_queue_type,
                        expiry_policy=settings.expiry_policy)
    from adapters.activemq import ActiveMQ

    return ActiveMQ(bridge_stomp(settings), dead_letter_queue=settings.expiry_dead_letter_queue)


def staged_format(settings: Settings) -> StagedFormat:
    """What staged copies look like on the configured broker, as its adapter states it."""
    if settings.broker == "rabbitmq":
        from adapters import rabbitmq

        return rabbitmq.FORMAT
    from adapters import activemq

    return activemq.FORMAT


def broker_as(
    settings: Settings, login: str | None, passcode: str | None, vhost: str | None,
    *, timeout: float = 5.0,
) -> StagingBroker:
    """An adapter that connects as a client did (RabbitMQ's STOMP ``host`` is the vhost)."""
    if settings.broker == "rabbitmq":
        from adapters.rabbitmq import RabbitMQ

        own = bridge_amqp(settings)
        # RabbitMQ's STOMP plugin takes a CONNECT without login as its default user, guest.
        first, *rest = (Endpoint(e.host, e.port, login or "guest", passcode or "guest",
                                 vhost or "/") for e in own.every())
        user = replace(first, alternates=tuple(rest))
        return RabbitMQ(user, heartbeat=0, blocked_timeout=timeout,
                        management=settings.upstream_management, http_timeout=timeout)
    from adapters.activemq import ActiveMQ

    up = settings.upstream_stomp
    return ActiveMQ(Endpoint(up.host, up.port, login, passcode, tls=up.tls, ca_file=up.ca_file),
                    receipt_timeout=timeout,
                    heartbeats=(0, 0))

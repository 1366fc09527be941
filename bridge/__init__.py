"""jms-bridge: a STOMP / AMQP 0-9-1 sidecar that adds JMS delivery semantics to a broker."""

__version__ = "0.1.0"

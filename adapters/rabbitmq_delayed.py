"""RabbitMQ's delayed-message exchange (``x-delayed-message``, from the community plugin),
kept on a broker that has no such plugin.

An application's exchange ``X`` of type ``x-delayed-message`` is declared upstream as a real
exchange of its ``x-delayed-type`` (its arguments, ``x-delayed-type`` among them, kept as
given). That it is delayed is kept on the broker too, so every bridge replica and a restarted
bridge know it: a marker, the internal exchange ``marker_of(X)``, bound to ``X``. The marker is
auto-delete, so deleting ``X`` (which removes the binding) deletes it too; a binding whose
destination is ``X`` routes nothing published to ``X``.
"""

from __future__ import annotations

import hashlib
from typing import Final

DELAYED_TYPE: Final = "x-delayed-message"
TYPE_ARGUMENT: Final = "x-delayed-type"
DELAY_HEADER: Final = "x-delay"  # the plugin's; the bridge's delay headers include it
# The exchange types a delayed-message exchange may route as (RabbitMQ's built-in ones).
EXCHANGE_TYPES: Final = frozenset({"direct", "fanout", "topic", "headers"})
MARKER_PREFIX: Final = "jms-bridge.delayed-message."
_NAME_MAX = 255  # an AMQP short string


def marker_of(exchange: str) -> str:
    """The name of the marker exchange that says ``exchange`` is a delayed-message exchange
    (a digest of the name when the name would not fit)."""
    name = MARKER_PREFIX + exchange
    if len(name.encode()) <= _NAME_MAX:
        return name
    return MARKER_PREFIX + "sha256." + hashlib.sha256(exchange.encode()).hexdigest()

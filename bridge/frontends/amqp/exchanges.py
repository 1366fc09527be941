"""A client's Exchange.Declare of a delayed-message exchange (``x-delayed-message``), sans I/O.

RabbitMQ without the delayed-message plugin answers that type with 503 COMMAND_INVALID and
closes the connection. The bridge declares instead a real exchange of the ``x-delayed-type``
with the client's own arguments, and, on the same channel, the broker-side marker that says it
is delayed (``adapters.rabbitmq_delayed``), so that queues and other exchanges bind to it as to
any exchange, and its delayed publishes are staged by the bridge and routed through it when
due. The broker answers the client's declare as it answers any declare (Declare-Ok, or 406 for
an inequivalent one); the marker's declare and bind ask for no answer.
"""

from __future__ import annotations

from typing import Final

from pamqp import commands
from pamqp import frame as pframe

from adapters.rabbitmq_delayed import DELAYED_TYPE, EXCHANGE_TYPES, TYPE_ARGUMENT, marker_of
from bridge.frontends.amqp.framer import Frame
from policies.errors import Refused
from policies.reasons import MQRC_OPTIONS_ERROR

DECLARE: Final = commands.Exchange.Declare.index
# The bytes of the type's short string, searched for before the frame is decoded.
_TYPE_BYTES: Final = bytes([len(DELAYED_TYPE)]) + DELAYED_TYPE.encode()


def declare(frame: Frame) -> bytes | None:
    """The frames to send up instead of a client's Exchange.Declare (None: relay it as it
    came); Refused for a delayed-message declare the plugin would refuse too."""
    if _TYPE_BYTES not in frame.raw:
        return None
    method = frame.method
    assert isinstance(method, commands.Exchange.Declare)
    if method.exchange_type != DELAYED_TYPE or method.passive:
        return None  # a passive declare checks the name only, as on a broker with the plugin
    arguments = dict(method.arguments or {})
    kind = arguments.get(TYPE_ARGUMENT)
    if isinstance(kind, bytes | bytearray):
        kind = bytes(kind).decode("utf-8", "replace")
    if kind is None:
        raise Refused(MQRC_OPTIONS_ERROR, f"Invalid argument, '{TYPE_ARGUMENT}' must be an "
                      f"existing exchange type (exchange '{method.exchange}' declared "
                      f"{DELAYED_TYPE} without it)")
    if not isinstance(kind, str) or kind not in EXCHANGE_TYPES:
        raise Refused(MQRC_OPTIONS_ERROR, f"{TYPE_ARGUMENT}={kind!r} is not an exchange type "
                      f"(one of {', '.join(sorted(EXCHANGE_TYPES))}) on exchange "
                      f"'{method.exchange}'")
    channel = frame.channel
    real = commands.Exchange.Declare(
        exchange=method.exchange, exchange_type=kind, durable=method.durable,
        auto_delete=method.auto_delete, internal=method.internal, nowait=method.nowait,
        arguments=arguments)
    marker = marker_of(method.exchange)
    # After the client's declare: when the broker refuses that one, it closes the channel
    # and ignores these.
    mark = commands.Exchange.Declare(
        exchange=marker, exchange_type="fanout", durable=method.durable, auto_delete=True,
        internal=True, nowait=True)
    bind = commands.Exchange.Bind(destination=method.exchange, source=marker, nowait=True)
    return b"".join(pframe.marshal(m, channel) for m in (real, mark, bind))

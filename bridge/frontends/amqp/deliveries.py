"""A broker's Basic.Deliver / Basic.GetOk as a ``Delivery`` view, and its content header with
headers added (``JMSXDeliveryCount``), without re-encoding anything else.

The view's headers are what a STOMP subscriber of RabbitMQ's plugin would see of the same
message (``adapters.rabbitmq_stomp.headers_of``), plus ``destination``
(``/amq/queue/<queue>``, the queue it came from) and ``redelivered``. They are read lazily:
the delivery count the redelivery interceptor asks of every delivery is found by a search of
the content header's bytes, and the properties are decoded only when a header is actually
there, or when a failed delivery's copy needs them all.

A stamped content header is the broker's bytes with one table entry spliced in
(``stamping.Stamper``).
"""

from __future__ import annotations

import struct
from typing import Any

from adapters import amqp_types
from adapters.rabbitmq_stomp import MODE, TABLE, headers_of
from bridge.frontends.amqp.assembler import DELIVER, Message
from bridge.frontends.amqp.stamping import Stamper
from bridge.frontends.lazy_headers import LazyHeaders
from bridge.intercept.views import Delivery

_LONGLONG = struct.Struct(">Q")
# Headers a delivery's view never gets from its table alone (they are properties or the
# delivery's own): asking for one decodes the properties.
_FROM_PROPERTIES = frozenset({
    "content-type", "content-encoding", "persistent", "priority", "correlation-id", "reply-to",
    "expiration", "amqp-message-id", "timestamp", "type", "user-id", "app-id",
})
# Table entries a failed delivery's copy must not carry from it (the broker's and the bridge's
# counts of this delivery): left out of the types a copy keeps.
NOT_COPIED = frozenset({"x-delivery-count", "JMSXDeliveryCount"})


def delivery_fields(message: Message) -> tuple[int, bool]:
    """(delivery tag, redelivered) of a Basic.Deliver or Basic.GetOk, read off its bytes."""
    raw = message.method_frame.raw
    pos = 11
    if message.method_frame.method_index == DELIVER:
        pos += 1 + raw[pos]  # consumer tag
    tag = _LONGLONG.unpack_from(raw, pos)[0]
    return tag, bool(raw[pos + 8] & 1)


def consumer_tag(message: Message) -> str:
    """A Basic.Deliver's consumer tag, read off its bytes."""
    raw = message.method_frame.raw
    return raw[12:12 + raw[11]].decode("utf-8", "replace")


_NEEDLES: dict[str, bytes] = {}


def _needle(name: str) -> bytes:
    """A table key as it is on the wire, to search for; empty for a header that is not
    (only) a table entry, or cannot be one."""
    key = name.encode()
    if name in _FROM_PROPERTIES or len(key) > 255:
        return b""
    return bytes((len(key),)) + key


class DeliveryHeaders(LazyHeaders):
    """A delivery's headers as a STOMP subscriber would see them, decoded only when needed."""

    __slots__ = ("_message", "_destination", "_redelivered")

    def __init__(self, message: Message, destination: str, redelivered: bool) -> None:
        super().__init__()
        self._message = message
        self._destination = destination
        self._redelivered = redelivered

    def get(self, name: str, default: Any = None) -> Any:
        if self._all is None:
            if name == "redelivered":
                return "true" if self._redelivered else "false"
            if name == "destination":
                return self._destination
            needle = _NEEDLES.get(name)
            if needle is None:
                needle = _NEEDLES[name] = _needle(name)
            if needle and needle not in self._message.header_frame.raw:
                return default
        return self._decoded().get(name, default)

    def _decode_all(self) -> dict[str, str]:
        values = self._message.header_frame.values
        out = headers_of(values)
        types = amqp_types.encode(values[TABLE], values[MODE], drop=NOT_COPIED)
        if types is not None:
            out[amqp_types.TYPES_HEADER] = types
        out["destination"] = self._destination
        out["redelivered"] = "true" if self._redelivered else "false"
        return out


def delivery_view(message: Message, channel: int, queue: str, tag: int, redelivered: bool,
                  subscription: str = "") -> Delivery:
    """A Basic.Deliver or Basic.GetOk from ``queue`` as a view (its delivery tag and
    redelivered flag read by ``delivery_fields``); its ``ack_id`` names the channel and the
    delivery tag."""
    destination = "/amq/queue/" + queue
    return Delivery(
        destination,
        subscription,
        f"{channel}/{tag}",
        DeliveryHeaders(message, destination, redelivered),
        message.header_frame.body_size,
        redelivered,
    )


def stamped_header(raw: bytes, headers: tuple[tuple[str, str], ...]) -> bytes:
    """A content header frame's bytes with ``headers`` set in its header table: an entry of
    the same name already there is removed, the rest of the frame is kept byte for byte."""
    return Stamper(headers)(raw)


def stamped(message: Message, headers: tuple[tuple[str, str], ...]) -> bytes:
    """The delivery's bytes with ``headers`` in its content header's table."""
    parts = [message.method_frame.raw, stamped_header(message.header_frame.raw, headers)]
    parts += [frame.raw for frame in message.body_frames]
    return b"".join(parts)

"""Which STOMP header a selector identifier reads, and as what JMS type.

A message is the header map a STOMP MESSAGE frame carries: every value a string. A selector
identifier is either

- a JMS header field (``JMSPriority``...) or JMS-defined property (``JMSXDeliveryCount``...) that
  the broker keeps in a header of its own: a :class:`Field` says which header (the first present
  of several), how its text becomes a typed value, and what it is when absent;
- a header that carries something other than a message property (``destination``,
  ``subscription``...): always NULL, as the broker's own selector engine sees no such property;
- anything else: the header of that name, a string property, as ActiveMQ's STOMP transport makes
  every custom header a String property.

JMSDestination is TIBCO's form on undelivered queues (``Queue[A]``, ``Topic[B7]``), read from
the message's original destination; :meth:`HeaderMap.with_destination` names the headers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from types import MappingProxyType

from policies.selector.nodes import Type
from policies.selector.values import java_bool, java_int, java_long

__all__ = ["ACTIVEMQ", "RABBITMQ", "Field", "FieldKind", "HeaderMap", "tibco_destination"]


class FieldKind(Enum):
    STRING = "string"
    INT = "int"  # a 32-bit decimal; NULL when the text is not one
    LONG = "long"  # a 64-bit decimal; NULL when the text is not one
    BOOLEAN = "boolean"  # "true" in any case is TRUE, anything else FALSE
    DELIVERY_MODE = "delivery-mode"  # persistent: "true" -> 'PERSISTENT', else 'NON_PERSISTENT'
    DESTINATION = "destination"  # /queue/A -> 'Queue[A]' (see tibco_destination)


@dataclass(frozen=True, slots=True)
class Field:
    headers: tuple[str, ...]  # the first of these present is read
    kind: FieldKind = FieldKind.STRING
    default: str | None = None  # header text used when none is present; None: NULL


_QUEUE_PREFIXES = ("/queue/", "/amq/queue/", "/temp-queue/", "/remote-temp-queue/")
_TOPIC_PREFIXES = ("/topic/", "/temp-topic/", "/remote-temp-topic/")


def tibco_destination(destination: str) -> str:
    """A STOMP destination as TIBCO names it in JMSDestination on its undelivered queue:
    ``/queue/A`` -> ``Queue[A]``, ``/topic/B7`` -> ``Topic[B7]``; a name with no prefix is a
    queue (ActiveMQ's reading); any other form (``/exchange/...``) is returned as it is."""
    for prefix in _QUEUE_PREFIXES:
        if destination.startswith(prefix):
            return f"Queue[{destination[len(prefix):]}]"
    for prefix in _TOPIC_PREFIXES:
        if destination.startswith(prefix):
            return f"Topic[{destination[len(prefix):]}]"
    if not destination.startswith("/"):
        return f"Queue[{destination}]"
    return destination


def _delivery_mode(text: str) -> str:
    return "PERSISTENT" if text.lower() == "true" else "NON_PERSISTENT"


_CONVERSIONS: dict[FieldKind, tuple[Type, Callable[[str], object]]] = {
    FieldKind.STRING: (Type.STRING, str),
    FieldKind.INT: (Type.INT, java_int),
    FieldKind.LONG: (Type.LONG, java_long),
    FieldKind.BOOLEAN: (Type.BOOLEAN, java_bool),
    FieldKind.DELIVERY_MODE: (Type.STRING, _delivery_mode),
    FieldKind.DESTINATION: (Type.STRING, tibco_destination),
}


def conversion(kind: FieldKind) -> tuple[Type, Callable[[str], object]]:
    """The JMS type of a field of ``kind`` and the function from header text to its value (which
    gives values.FAILED for text that is not one)."""
    return _CONVERSIONS[kind]


@dataclass(frozen=True, slots=True)
class HeaderMap:
    """How one broker's STOMP headers answer selector identifiers."""

    fields: Mapping[str, Field]
    not_properties: frozenset[str] = field(default_factory=frozenset)

    def with_destination(self, *headers: str) -> HeaderMap:
        """The same map with JMSDestination read from the first present of ``headers``."""
        fields = dict(self.fields)
        fields["JMSDestination"] = Field(tuple(headers), FieldKind.DESTINATION)
        return replace(self, fields=MappingProxyType(fields))

    def with_fields(self, **fields: Field) -> HeaderMap:
        """The same map with more identifiers typed (``amount=Field(("amount",), LONG)``)."""
        return replace(self, fields=MappingProxyType({**self.fields, **fields}))


_STOMP_FRAME_HEADERS = frozenset(
    {"destination", "subscription", "ack", "content-length", "receipt", "transaction",
     "message-id", "redelivered"}
)  # fmt: skip

# ActiveMQ 5.x (FrameTranslator.Helper): these headers set JMS fields, they are not properties.
ACTIVEMQ = HeaderMap(
    fields=MappingProxyType({
        "JMSMessageID": Field(("message-id",)),
        "JMSCorrelationID": Field(("correlation-id",)),
        "JMSType": Field(("type",)),
        "JMSPriority": Field(("priority",), FieldKind.INT, "4"),
        "JMSTimestamp": Field(("timestamp",), FieldKind.LONG),
        "JMSExpiration": Field(("expires",), FieldKind.LONG, "0"),
        "JMSDeliveryMode": Field(("persistent",), FieldKind.DELIVERY_MODE, "false"),
        "JMSRedelivered": Field(("redelivered",), FieldKind.BOOLEAN, "false"),
        "JMSXDeliveryCount": Field(("JMSXDeliveryCount",), FieldKind.INT),
        "JMSXGroupID": Field(("JMSXGroupID",)),
        "JMSXGroupSeq": Field(("JMSXGroupSeq",), FieldKind.INT),
        "JMSXUserID": Field(("JMSXUserID",)),
        "JMSDestination": Field(
            ("jms-bridge-target", "original-destination", "destination"), FieldKind.DESTINATION
        ),
    }),
    not_properties=_STOMP_FRAME_HEADERS | {
        "correlation-id", "expires", "priority", "reply-to", "timestamp", "type", "persistent",
        "original-destination",
    },
)  # fmt: skip

# RabbitMQ's STOMP plugin: AMQP basic properties travel as these headers
# (adapters/rabbitmq_stomp.py); the AMQP message id is amqp-message-id (STOMP's message-id is the
# delivery's own).
RABBITMQ = HeaderMap(
    fields=MappingProxyType({
        "JMSMessageID": Field(("amqp-message-id",)),
        "JMSCorrelationID": Field(("correlation-id",)),
        "JMSType": Field(("type",)),
        "JMSPriority": Field(("priority",), FieldKind.INT, "4"),
        "JMSTimestamp": Field(("timestamp",), FieldKind.LONG),
        "JMSExpiration": Field(("expires",), FieldKind.LONG, "0"),
        "JMSDeliveryMode": Field(("persistent",), FieldKind.DELIVERY_MODE, "false"),
        "JMSRedelivered": Field(("redelivered",), FieldKind.BOOLEAN, "false"),
        "JMSXDeliveryCount": Field(("JMSXDeliveryCount",), FieldKind.INT),
        "JMSXGroupID": Field(("JMSXGroupID",)),
        "JMSXGroupSeq": Field(("JMSXGroupSeq",), FieldKind.INT),
        "JMSXUserID": Field(("user-id",)),
        "JMSXAppID": Field(("app-id",)),
        "JMSDestination": Field(("jms-bridge-target", "destination"), FieldKind.DESTINATION),
    }),
    not_properties=_STOMP_FRAME_HEADERS | {
        "content-type", "content-encoding", "persistent", "priority", "correlation-id",
        "reply-to", "expiration", "amqp-message-id", "timestamp", "type", "user-id", "app-id",
    },
)  # fmt: skip


def for_broker(broker: str) -> HeaderMap:
    """How a broker's STOMP headers answer a selector's identifiers ("rabbitmq" or
    "activemq")."""
    return RABBITMQ if broker == "rabbitmq" else ACTIVEMQ

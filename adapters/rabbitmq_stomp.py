"""RabbitMQ's STOMP plugin mirrored: STOMP headers <-> AMQP properties, destinations -> routes.

Used by the RabbitMQ adapter (``adapters.rabbitmq``) and the AMQP front-end
(``bridge.frontends.amqp``).

Headers are mapped to and from AMQP properties the way RabbitMQ's STOMP plugin does it
(rabbitmq_stomp 3.10: ``rabbit_stomp_util:message_properties/1`` on SEND,
``message_headers/1`` + ``headers_post_process/1`` on MESSAGE, ``rabbit_stomp_frame``'s
``integer_header``/``boolean_header``), so a message a STOMP client sent reads here with the
headers a STOMP subscriber sees, and a message put here reaches a STOMP subscriber with the
headers it was given:

    STOMP header      AMQP property     on SEND (header -> property)    on MESSAGE (-> header)
    content-type      content_type      as is                           as is
    content-encoding  content_encoding  as is                           as is
    persistent        delivery_mode     "true"/"True" -> 2, else unset  2 -> "true", n -> "n"
    priority          priority          integer (spaces stripped)       decimal
    correlation-id    correlation_id    as is                           as is
    reply-to          reply_to          as is (we drop /reply-queue/)   "/reply-queue/" + v when
                                                                        v has no dest. prefix
    expiration        expiration        as is                           as is
    amqp-message-id   message_id        as is                           as is
    timestamp         timestamp         integer                         decimal
    type, user-id,    type, user_id,    as is                           as is
    app-id            app_id
    any other header  headers table     longstr                         longstr as is; signedint
                                                                        and long in decimal;
                                                                        other types dropped
                                                                        (here: bool, float and
                                                                        decimal shown as text)
    destination       -                 not stored                      the delivery's own

On MESSAGE the plugin writes the headers-table entries before the properties and STOMP
readers keep the first of repeated headers, so a table entry shadows a property of the same name;
``stomp_headers`` does the same. The plugin refuses a SEND carrying ``message-id`` and one whose
priority or timestamp is not an integer; ``amqp_properties`` raises ValueError for those.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import pika

from adapters.amqp_properties import PIKA_NAMES, plugin_stamp
from adapters.amqp_types import overlaid
from adapters.base import PER_DELIVERY
from policies.properties import text

# STOMP header -> BasicProperties attribute, in rabbit_stomp_util's order.
STRING_PROPERTIES = (
    ("content-type", "content_type"),
    ("content-encoding", "content_encoding"),
    ("correlation-id", "correlation_id"),
    ("reply-to", "reply_to"),
    ("expiration", "expiration"),
    ("amqp-message-id", "message_id"),
    ("type", "type"),
    ("user-id", "user_id"),
    ("app-id", "app_id"),
)
INTEGER_PROPERTIES = (("priority", "priority", 0xFF), ("timestamp", "timestamp", 2**64 - 1))
PROPERTY_HEADERS = frozenset(
    {h for h, _ in STRING_PROPERTIES} | {h for h, _, _ in INTEGER_PROPERTIES} | {"persistent"}
)
_NOT_IN_TABLE = PROPERTY_HEADERS | {"destination", "content-length"}

# rabbit_routing_util:dest_prefixes/0: a reply-to without one of these gets REPLY_QUEUE.
REPLY_QUEUE = "/reply-queue/"
DEST_PREFIXES = ("/exchange", "/topic", "/queue", "/amq/queue", REPLY_QUEUE)

# rabbit_stomp_util:build_argument/2: SEND to /queue/x declares x with these from the headers.
LONGSTR_ARGUMENTS = frozenset(
    {"x-dead-letter-exchange", "x-dead-letter-routing-key", "x-max-age", "x-queue-type"}
)
LONG_ARGUMENTS = frozenset(
    {
        "x-expires", "x-max-length", "x-max-length-bytes", "x-max-priority", "x-message-ttl",
        "x-stream-max-segment-size-bytes",
    }
)

_ERLANG_INTEGER = re.compile(r"[+-]?[0-9]+")


def amqp_properties(headers: Mapping[str, str]) -> pika.BasicProperties:
    """The properties the STOMP plugin gives a SEND with these headers. ValueError for a SEND
    the plugin refuses."""
    return pika.BasicProperties(**plugin_properties(headers))


def plugin_properties(given: Mapping[str, str]) -> dict[str, Any]:
    """``amqp_properties`` as a dict of the properties set, by pika's attribute names (what the
    AMQP front-end writes without building pika's object)."""
    headers: dict[str, str] = given if type(given) is dict else dict(given)
    if "message-id" in headers:
        raise ValueError("'message-id' is not allowed on a message to RabbitMQ")
    values: dict[str, Any] = {}
    for header, attr in STRING_PROPERTIES:
        value = headers.get(header)
        if value is not None:
            if len(value) > 63 and len(value.encode()) > 255:
                # An AMQP short string: pika would send it, and the broker close the connection
                # (INTERNAL_ERROR, content_properties_shortstr_overflow) over this one message.
                raise ValueError(f"{header} is longer than 255 bytes ({value[:40]!r}...)")
            values[attr] = value
    reply_to = values.get("reply_to")
    if reply_to is not None and reply_to.startswith(REPLY_QUEUE):
        # The plugin prefixes a bare reply queue name on the way out; undo it on the way in
        # so an AMQP consumer still sees the queue name a /temp-queue/ reply-to stored.
        values["reply_to"] = reply_to[len(REPLY_QUEUE):]
    for header, attr, top in INTEGER_PROPERTIES:
        if header in headers:
            values[attr] = _integer(header, headers[header], top)
    if headers.get("persistent") in ("true", "True"):
        values["delivery_mode"] = 2
    table: dict[str, Any] = {}
    for name, value in headers.items():
        if name in _NOT_IN_TABLE:
            continue
        if len(name) > 63 and len(name.encode()) > 255:
            raise ValueError(f"header name longer than 255 bytes: {name[:40]}...")
        table[name] = value
    # An AMQP message's typed header table, where it carries one.
    found, mode = overlaid(table or None, values.get("delivery_mode"), headers)
    if found is not None:
        values["headers"] = found
    if mode is not None:
        values["delivery_mode"] = mode
    return values


def _integer(header: str, value: str, top: int) -> int:
    text = value.strip(" ")
    if not _ERLANG_INTEGER.fullmatch(text) or not 0 <= int(text) <= top:
        raise ValueError(f"{header} must be an integer from 0 to {top}, not {value!r}")
    return int(text)


def stomp_headers(props: pika.BasicProperties) -> dict[str, str]:
    """The message's own headers as a STOMP subscriber of the plugin sees them."""
    return plugin_headers(vars(props))


def plugin_headers(values: Mapping[str, Any]) -> dict[str, str]:
    """``stomp_headers`` of properties given by pika's attribute names (a timestamp as epoch
    seconds): what the AMQP front-end reads off a content header without building pika's
    object."""
    out: dict[str, str] = {}
    table_headers(values.get("headers") or {}, out)
    for header, attr in STRING_PROPERTIES:
        value = values.get(attr)
        if value is not None:
            out.setdefault(header, value)
    for header, attr, _ in INTEGER_PROPERTIES:
        value = values.get(attr)
        if value is not None:
            out.setdefault(header, str(value))
    mode = values.get("delivery_mode")
    if mode is not None:
        out.setdefault("persistent", "true" if mode == 2 else str(mode))
    reply_to = out.get("reply-to")
    if reply_to is not None and not reply_to.startswith(DEST_PREFIXES):
        out["reply-to"] = REPLY_QUEUE + reply_to
    for name in PER_DELIVERY:
        out.pop(name, None)
    return out


def table_headers(table: Mapping[str, Any], out: dict[str, str]) -> None:
    """A header table's entries as headers, into ``out`` (the first of a name kept): strings as
    they are, integers in decimal, as the plugin shows them; and, where the plugin drops them,
    booleans and floats and decimals as their text (``policies.properties.text``), so that the
    bridge reads a property by its meaning whatever type it came in (``true`` and 1 set
    ``JMS_TIBCO_PRESERVE_UNDELIVERED``; 300.0 is a delay). Anything else is dropped, as the
    plugin drops it. Where such a message goes out again, its table's types come back
    (``amqp_types``)."""
    for name, value in table.items():
        kind = type(value)
        if kind is str:
            out.setdefault(name, value)
        elif kind is int:
            out.setdefault(name, str(value))
        else:
            shown = text(value)
            if shown is not None:
                out.setdefault(name, shown)


TABLE = 2  # the header table's and the delivery mode's places in the 14 property values
MODE = 3
# Where each of the plugin's string and integer properties is among the 14 values.
_STRING_AT: Final = tuple((header, PIKA_NAMES.index(attr)) for header, attr in STRING_PROPERTIES)
_PRIORITY: Final = PIKA_NAMES.index("priority")
_TIMESTAMP: Final = PIKA_NAMES.index("timestamp")
_REPLY_TO: Final = "reply-to"
_DESTINATION: Final = "destination"


def headers_of(values: list[Any], destination: str | None = None) -> dict[str, str]:
    """A message's properties and header table as their 14 values in wire order
    (``adapters.amqp_properties.read_values``) as STOMP headers, as the plugin shows them: what
    ``plugin_headers`` gives for the same properties by pika's names, in the same order, read
    off the 14 values without making that dict of names first (the AMQP front-end's screened
    publishes and watched deliveries, the staging engine's deliveries;
    ``tests/unit/test_amqp_properties.py`` holds the two equal). With ``destination``, a
    ``destination`` header first, as a publish's view has it (a table entry of that name is
    dropped, as the plugin drops it)."""
    out: dict[str, str] = {} if destination is None else {_DESTINATION: destination}
    table = values[TABLE]
    if table:
        table_headers(table, out)
    for header, at in _STRING_AT:
        text = values[at]
        if text is not None:
            out.setdefault(header, text)
    priority = values[_PRIORITY]
    if priority is not None:
        out.setdefault("priority", str(priority))
    stamp = values[_TIMESTAMP]
    if stamp is not None:
        out.setdefault("timestamp", str(plugin_stamp(stamp)))
    mode = values[MODE]
    if mode is not None:
        out.setdefault("persistent", "true" if mode == 2 else str(mode))
    reply_to = out.get(_REPLY_TO)
    if reply_to is not None and not reply_to.startswith(DEST_PREFIXES):
        out[_REPLY_TO] = REPLY_QUEUE + reply_to
    for name in PER_DELIVERY:
        if name in out and (destination is None or name != _DESTINATION):
            del out[name]
    return out


def nack_requeues(value: str | None) -> bool:
    """Whether RabbitMQ's plugin requeues a NACK whose ``requeue`` header is ``value``
    (``rabbit_stomp_frame:boolean_header/3``, default true): only ``false`` and ``False`` say
    no, so a NACK with ``FALSE`` is requeued like one without the header."""
    return value not in ("false", "False")


@dataclass(frozen=True, slots=True)
class Route:
    """Where a STOMP destination publishes to, as the plugin routes a SEND."""

    exchange: str
    routing_key: str
    declare: bool = False  # /queue/x: the plugin declares x durable on SEND
    queue: bool = False  # a queue must exist: publish mandatory, an unroutable message fails


def route(destination: str) -> Route:
    """rabbit_routing_util:parse_endpoint/1 + parse_routing/1 for a SEND; ValueError for the
    destinations a staged message cannot target."""
    if "/" not in destination and destination:
        return Route("", _unescape(destination), declare=True, queue=True)
    kind, parts = _split(destination)
    if kind == "queue" and len(parts) == 1 and parts[0]:
        return Route("", parts[0], declare=True, queue=True)
    if kind in ("amq/queue", "reply-queue") and len(parts) == 1 and parts[0]:
        # /reply-queue/<q>: a STOMP client's temporary reply queue, as a reply-to shows it
        # (the engine puts reports there).
        return Route("", parts[0], queue=True)
    if kind == "topic" and len(parts) == 1 and parts[0]:
        return Route("amq.topic", parts[0])
    if kind == "exchange" and len(parts) in (1, 2) and parts[0]:
        return Route(parts[0], parts[1] if len(parts) == 2 else "")
    raise ValueError(f"unsupported destination {destination!r}")


def _split(destination: str) -> tuple[str, list[str]]:
    for kind in ("amq/queue", "reply-queue", "queue", "topic", "exchange"):
        if destination.startswith(f"/{kind}/"):
            return kind, [_unescape(p) for p in destination[len(kind) + 2:].split("/")]
    return "", []


def _unescape(name: str) -> str:
    return name.replace("%2F", "/")


def queue_arguments(headers: Mapping[str, str]) -> dict[str, Any]:
    """rabbit_stomp_util:build_arguments/1: the x-arguments a SEND declares its queue with."""
    args: dict[str, Any] = {}
    for name, value in headers.items():
        if name in LONGSTR_ARGUMENTS:
            args[name] = value.strip()
        elif name in LONG_ARGUMENTS:
            text = value.strip()
            if not _ERLANG_INTEGER.fullmatch(text):
                raise ValueError(f"{name} must be an integer, not {value!r}")
            args[name] = int(text)
    return args


def routable(destination: str | None) -> bool:
    try:
        route(destination or "")
    except ValueError:
        return False
    return True


def escape_queue(name: str) -> str:
    return name.replace("/", "%2F")

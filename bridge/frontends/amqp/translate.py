"""AMQP 0-9-1 publishes <-> the interception core's views and decisions.

A Basic.Publish becomes a ``Send`` view whose destination and headers are what RabbitMQ's STOMP
plugin would show for the same message (``/amq/queue/q`` for the default exchange, ``/topic/k``
for ``amq.topic``, ``/exchange/x/k`` otherwise; properties and header-table entries as STOMP
headers), so the interceptors, the staged copy and the staging engine are the ones STOMP uses:
a message sent delayed over AMQP can be consumed over STOMP and the other way round.

Only publishes some interceptor asked to see become views (``PublishScreen``); the others are
relayed as the bytes that came in.
"""

from __future__ import annotations

import re
from collections.abc import Coroutine, Mapping
from typing import Any

from pamqp import commands

from adapters import amqp_types
from adapters.amqp_properties import PIKA_NAMES, header_frame
from adapters.amqp_tables import wire_keys
from adapters.rabbitmq_stomp import (
    MODE,
    STRING_PROPERTIES,
    TABLE,
    Route,
    headers_of,
    plugin_properties,
    route,
)
from bridge.frontends.amqp.assembler import Message
from bridge.frontends.amqp.builders import publish_method
from bridge.frontends.amqp.connection import ProxyConnection
from bridge.frontends.amqp.framer import plain_publish_fields
from bridge.frontends.amqp.stamping import stamp_header
from bridge.intercept.chain import Chain
from bridge.intercept.decisions import Decision, Hold, Refuse, Rewrite, Stamp
from bridge.intercept.views import Send


def destination_of(exchange: str, routing_key: str) -> str:
    """The STOMP destination RabbitMQ's plugin uses for this exchange and routing key."""
    if not exchange:
        return "/amq/queue/" + routing_key
    if exchange == "amq.topic":
        return "/topic/" + routing_key
    return f"/exchange/{exchange}/{routing_key}" if routing_key else f"/exchange/{exchange}"


def property_values(headers: Mapping[str, str]) -> list[Any]:
    """The AMQP properties RabbitMQ's plugin gives a SEND with these headers, as
    ``builders.header_frame`` writes them (Basic's 14, in wire order). ValueError for a SEND
    the plugin refuses."""
    props = plugin_properties(headers)
    get = props.get
    mode = get("delivery_mode")
    if mode is not None and mode not in (1, 2):
        mode = 1  # RabbitMQ takes any octet here and persists only 2
    return [get("content_type"), get("content_encoding"), get("headers"), mode, get("priority"),
            get("correlation_id"), get("reply_to"), get("expiration"), get("message_id"),
            get("timestamp"), get("type"), get("user_id"), get("app_id"), None]


class PublishScreen:
    """Offers a client's publishes to the chain: the ones it asked to see, as ``Send`` views,
    and turns its decision into bytes (None: relay the original). A ``Hold`` is awaited here:
    the relay reads nothing more from that client meanwhile, so its frames keep their order."""

    def __init__(self, chain: Chain) -> None:
        self.chain = chain
        interest = chain.interest
        self.names = interest.send_headers
        self.mentions = interest.send_mentions
        # A header-table key as it is on the wire (its length octet, then its name), and a
        # mention as it can be in an exchange or routing key: searched in the frames' bytes,
        # so a publish nobody asked to see is never decoded.
        self._keys = wire_keys(self.names)
        self._mentioned = tuple(m.encode() for m in self.mentions)
        # One search for them all (a regular expression of the keys, longest first).
        self._key_search = (re.compile(b"|".join(re.escape(k) for k in sorted(
            self._keys, key=len, reverse=True))).search if self._keys else None)
        # What the fast path (``fastpath.plain_run``) looks for where this screen looks: a
        # publish holding none of them is relayed without being framed.
        self.needles = (self._keys, self._mentioned)
        # A header the interest names that is a property (``expiration``) is not in the table:
        # its publishes are found by the content header's property flags.
        self.flags = 0
        for header, attr in STRING_PROPERTIES:
            if header in self.names:
                self.flags |= 1 << (15 - PIKA_NAMES.index(attr))
        self._routes: dict[str, Route] = {}

    def __call__(self, message: Message,
                 conn: ProxyConnection) -> bytes | None | Coroutine[Any, Any, bytes | None]:
        """The publish's bytes to send up instead (None: relay it as it came); a coroutine
        giving them when the chain holds the publish; ``Refused`` when it refuses it."""
        header = message.header_frame.raw
        routing = message.method_frame.raw
        flagged = self.flags and ((header[19] << 8) | header[20]) & self.flags
        if not flagged and (self._key_search is None or self._key_search(header) is None) and \
                not _mentions(self._mentioned, routing):
            return None
        exchange, routing_key, mandatory = publish_fields(message)
        destination = destination_of(exchange, routing_key)
        values = message.header_frame.values
        if not flagged and not _names_in(self.names, values[TABLE]) and not _mentions(
                self.mentions, destination):
            return None
        headers = headers_of(values, destination)
        types = amqp_types.encode(values[TABLE], values[MODE], drop=self.names)
        if types is not None:  # the staged copy keeps the table's types for the release
            headers[amqp_types.TYPES_HEADER] = types
        view = Send(destination, headers, message.body_size, conn.principal)
        decision = self.chain.on_send(view)
        if isinstance(decision, Hold):
            return self._held(message, conn, view, decision, mandatory)
        return self._bytes(message, conn, decision, mandatory, view.body_size)

    async def _held(self, message: Message, conn: ProxyConnection, view: Send,
                    decision: Decision, mandatory: bool) -> bytes | None:
        while isinstance(decision, Hold):
            await decision.check()
            decision = self.chain.on_send(view)
        return self._bytes(message, conn, decision, mandatory, view.body_size)

    def _bytes(self, message: Message, conn: ProxyConnection, decision: Decision,
               mandatory: bool, body_size: int) -> bytes | None:
        if isinstance(decision, Refuse):
            raise decision.refusal
        if isinstance(decision, Stamp):  # the publish as it came, with table entries added
            return b"".join((message.method_frame.raw, stamp_header(
                message.header_frame.raw, decision.headers),
                *[frame.raw for frame in message.body_frames]))
        if not isinstance(decision, Rewrite):
            return None
        staged = dict(decision.headers)  # first wins was applied when they were made
        where = self._routes.get(decision.destination)
        if where is None:
            where = route(decision.destination)
            if len(self._routes) < 256:  # the staging levels' few destinations
                self._routes[decision.destination] = where
        channel = message.channel
        method = publish_method(channel, where.exchange, where.routing_key, mandatory)
        header = header_frame(channel, body_size, property_values(staged))
        # The body frames go as they came: the same channel, within the same frame_max.
        return b"".join((method, header, *[frame.raw for frame in message.body_frames]))


def _mentions(mentions: tuple[Any, ...], where: Any) -> bool:
    """Whether any of ``mentions`` is in ``where`` (a loop: a generator costs more here)."""
    for mention in mentions:
        if mention in where:
            return True
    return False


def _names_in(names: frozenset[str], table: dict[str, Any] | None) -> bool:
    if table:
        for name in names:
            if name in table:
                return True
    return False


def publish_fields(message: Message) -> tuple[str, str, bool]:
    """(exchange, routing key, mandatory) of a Basic.Publish, read off its bytes when it has
    the plain layout (``framer.plain_publish_fields``), else decoded."""
    fields = plain_publish_fields(message.method_frame.raw)
    if fields is not None:
        return fields
    publish = message.method
    assert isinstance(publish, commands.Basic.Publish)
    return publish.exchange, publish.routing_key, bool(publish.mandatory)

"""RabbitMQ through pika (AMQP 0-9-1, publisher confirms), speaking STOMP-shaped messages.

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
    destination       -                 not stored                      the delivery's own

On MESSAGE the plugin writes the headers-table entries before the properties and STOMP
readers keep the first of repeated headers, so a table entry shadows a property of the same name;
``stomp_headers`` does the same. The plugin refuses a SEND carrying ``message-id`` and one whose
priority or timestamp is not an integer; ``amqp_properties`` raises ValueError for those.

Channels: ``main`` gets, consumes and acks (everything held lives on it); ``confirm`` publishes
in confirm mode; ``scratch`` declares. Errors on ``confirm``/``scratch`` close only that channel;
an error on ``main`` or the connection closes the adapter (everything held returns to its queue)
and the next call raises BrokerUnavailable until ``connect`` is called again. A publish the broker
refuses (a channel error such as 404 NOT_FOUND or 403 ACCESS_REFUSED, a mandatory publish to a
missing queue returned unroutable, a nack) raises PutRefused: it closes at most ``confirm``, so
everything held on ``main`` stays held, and ``confirm`` is reopened by the next publish.

Nothing is held longer than the caller holds it: mind RabbitMQ's consumer_timeout (30 min).
``poll`` or any other call keeps pika's heart-beats going; call one at least every ``heartbeat``
seconds.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import re
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pika
import pika.exceptions
import structlog
from pika.adapters.blocking_connection import BlockingChannel

from adapters.amqp_types import overlay
from adapters.base import (
    PER_DELIVERY,
    Held,
    Message,
    Move,
    PutCheck,
    StagedFormat,
    connect_with_retries,
)
from policies.endpoints import Endpoint
from policies.errors import BrokerUnavailable, PutRefused, Refused, StagingQueueMismatch
from policies.reasons import (
    MQRC_MSG_TOO_BIG_FOR_Q,
    MQRC_NOT_AUTHORIZED,
    MQRC_PROPERTY_VALUE_BAD,
    MQRC_Q_FULL,
    MQRC_UNEXPECTED_ERROR,
    MQRC_UNKNOWN_OBJECT_NAME,
    Reason,
)

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

# The staging queues' type (--staging-queue-type). Classic queues are declared with no arguments,
# as before quorum queues were offered. Quorum queues (replicated with Raft, RabbitMQ 3.8+) keep a
# message given back (basic.nack with requeue, or a channel closed while it was held) at its old
# place only when they have a delivery limit: without one, RabbitMQ 3.10 enqueues it again at the
# back, and a level queue given back its head (the engine peeks the long levels, and a lost
# connection gives back every prefetched message) would no longer be in exit order. So they get
# a limit no message ever reaches (a head peeked every second for the longest dwell, 49.7 days,
# is given back about 4.3 million times). They add an ``x-delivery-count`` header to every
# delivery; the adapter drops it (it is the broker's, not the application's).
QUEUE_TYPES = ("classic", "quorum")
QUORUM_DELIVERY_LIMIT = 2_000_000_000
QUORUM_ARGUMENTS: dict[str, Any] = {
    "x-queue-type": "quorum", "x-delivery-limit": QUORUM_DELIVERY_LIMIT,
}
DELIVERY_COUNT = "x-delivery-count"

_ERLANG_INTEGER = re.compile(r"[+-]?[0-9]+")


def amqp_properties(headers: Mapping[str, str]) -> pika.BasicProperties:
    """The properties the STOMP plugin gives a SEND with these headers. ValueError for a SEND
    the plugin refuses."""
    if "message-id" in headers:
        raise ValueError("'message-id' is not allowed on a message to RabbitMQ")
    props = pika.BasicProperties()
    for header, attr in STRING_PROPERTIES:
        if header in headers:
            value = headers[header]
            if len(value.encode()) > 255:
                # An AMQP short string: pika would send it, and the broker close the connection
                # (INTERNAL_ERROR, content_properties_shortstr_overflow) over this one message.
                raise ValueError(f"{header} is longer than 255 bytes ({value[:40]!r}...)")
            setattr(props, attr, value)
    if props.reply_to is not None and props.reply_to.startswith(REPLY_QUEUE):
        # The plugin prefixes a bare reply queue name on the way out; undo it on the way in
        # so an AMQP consumer still sees the queue name a /temp-queue/ reply-to stored.
        props.reply_to = props.reply_to[len(REPLY_QUEUE):]
    for header, attr, top in INTEGER_PROPERTIES:
        if header in headers:
            setattr(props, attr, _integer(header, headers[header], top))
    if headers.get("persistent") in ("true", "True"):
        props.delivery_mode = 2
    table: dict[str, Any] = {}
    for name, value in headers.items():
        if name in PROPERTY_HEADERS or name in ("destination", "content-length"):
            continue
        if len(name.encode()) > 255:
            raise ValueError(f"header name longer than 255 bytes: {name[:40]}...")
        table[name] = value
    props.headers = table or None
    overlay(props, headers)  # an AMQP message's typed header table, where it carries one
    return props


def _integer(header: str, value: str, top: int) -> int:
    text = value.strip(" ")
    if not _ERLANG_INTEGER.fullmatch(text) or not 0 <= int(text) <= top:
        raise ValueError(f"{header} must be an integer from 0 to {top}, not {value!r}")
    return int(text)


def stomp_headers(props: pika.BasicProperties) -> dict[str, str]:
    """The message's own headers as a STOMP subscriber of the plugin sees them."""
    out: dict[str, str] = {}
    for name, value in (props.headers or {}).items():
        if isinstance(value, bool):
            continue  # a boolean field; the plugin drops it
        if isinstance(value, int):
            out.setdefault(name, str(value))
        elif isinstance(value, str):
            out.setdefault(name, value)
    for header, attr in STRING_PROPERTIES:
        value = getattr(props, attr)
        if value is not None:
            out.setdefault(header, value)
    for header, attr, _ in INTEGER_PROPERTIES:
        if getattr(props, attr) is not None:
            out.setdefault(header, str(getattr(props, attr)))
    if props.delivery_mode is not None:
        mode = props.delivery_mode
        out.setdefault("persistent", "true" if mode == 2 else str(mode))
    reply_to = out.get("reply-to")
    if reply_to is not None and not reply_to.startswith(DEST_PREFIXES):
        out["reply-to"] = REPLY_QUEUE + reply_to
    return {n: v for n, v in out.items() if n not in PER_DELIVERY}


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


def refusal_reason(reply_code: int, reply_text: str) -> Reason:
    """The MQRC reason of a channel error the broker closed a publish (or declare) with."""
    if reply_code == 404:
        return MQRC_UNKNOWN_OBJECT_NAME
    if reply_code == 403:
        return MQRC_NOT_AUTHORIZED
    if reply_code == 406 and "max size" in reply_text:  # "message size N is larger than max size M"
        return MQRC_MSG_TOO_BIG_FOR_Q
    return MQRC_UNEXPECTED_ERROR


# Overflow behaviours under which a queue at its length limit refuses a publish (drop-head,
# the default, makes room by dropping its oldest message instead).
REFUSING_OVERFLOW = ("reject-publish", "reject-publish-dlx")
REFUSING_S = 60.0  # how long a queue that nacked a publish is put to one message at a time


def queue_check(destination: str, info: Mapping[str, Any], ready: int) -> PutCheck:
    """Whether a queue would refuse a publish now, from its management view (``arguments``,
    ``effective_policy_definition``, ``message_bytes_ready``) and its exact ready count. A limit
    set both ways takes the lower value; the argument's overflow beats the policy's."""
    found = info.get("arguments")
    args: Mapping[str, Any] = found if isinstance(found, dict) else {}
    found = info.get("effective_policy_definition")
    policy: Mapping[str, Any] = found if isinstance(found, dict) else {}
    overflow = args.get("x-overflow", policy.get("overflow", "drop-head"))
    if overflow not in REFUSING_OVERFLOW:
        return PutCheck()

    def lowest(argument: str, key: str) -> int | None:
        values = [v for v in (args.get(argument), policy.get(key)) if isinstance(v, int)]
        return min(values) if values else None

    max_length = lowest("x-max-length", "max-length")
    max_bytes = lowest("x-max-length-bytes", "max-length-bytes")
    if max_length is None and max_bytes is None:
        return PutCheck()
    ready_bytes = info.get("message_bytes_ready")
    full = None
    if max_length is not None and ready >= max_length:
        full = f"holds {ready} ready messages, at most {max_length} ({overflow})"
    elif max_bytes is not None and isinstance(ready_bytes, int) and ready_bytes >= max_bytes:
        full = f"holds {ready_bytes} bytes of ready messages, at most {max_bytes} ({overflow})"
    refused = Refused(MQRC_Q_FULL, f"{destination} {full}") if full else None
    return PutCheck(refused, max_body_bytes=max_bytes, changing=True)


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


@dataclass(frozen=True, slots=True)
class _Tag:
    generation: int  # of the main channel that delivered it
    delivery_tag: int


def _routable(destination: str | None) -> bool:
    try:
        route(destination or "")
    except ValueError:
        return False
    return True


def _escape_queue(name: str) -> str:
    return name.replace("/", "%2F")


# ``/amq/queue/<queue>``: a client SEND there does not declare the queue again. RabbitMQ maps
# ``amqp-message-id`` to the AMQP message-id property (and refuses ``message-id``); its AMQP side
# carries these headers as short strings: it stores a longer one, then closes every AMQP
# connection it tries to deliver the message to (content_properties_shortstr_overflow).
FORMAT = StagedFormat(
    broker="rabbitmq",
    staging_destination="/amq/queue/{}",
    message_id_header="amqp-message-id",
    short_string_headers=("amqp-message-id", "correlation-id", "reply-to", "content-type",
                          "content-encoding", "type", "user-id", "app-id", "expiration"),
    temporary_prefixes=("/temp-queue/", "/temp-topic/", "/reply-queue/"),
    second_levels=True,
    peek_advances=True,
    escape=_escape_queue,
)



def _parameters(ep: Endpoint, heartbeat: int, blocked_timeout: float) -> pika.ConnectionParameters:
    params = pika.ConnectionParameters(
        host=ep.host,
        port=ep.port,
        virtual_host=ep.vhost or "/",
        credentials=pika.PlainCredentials(ep.user or "guest", ep.password or "guest"),
        heartbeat=heartbeat,
        connection_attempts=1,
        socket_timeout=5.0,
        blocked_connection_timeout=blocked_timeout,
        client_properties={"connection_name": "jms-bridge staging"},
    )
    if ep.tls:
        params.ssl_options = _tls(ep)
    return params


def _tls(ep: Endpoint) -> pika.SSLOptions:
    """amqps://: TLS 1.2 or later, the broker's certificate verified against the named CA file
    (else the system's) and its host name checked."""
    ctx = ssl.create_default_context(cafile=ep.ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return pika.SSLOptions(ctx, server_hostname=ep.host)

class RabbitMQ:
    """The staging interface on RabbitMQ through one pika BlockingConnection."""

    name = "rabbitmq"
    format = FORMAT
    sees_held = False

    def __init__(
        self,
        amqp: Endpoint,
        *,
        heartbeat: int = 30,
        connect_attempts: int = 1,
        retry_wait: float = 0.2,
        blocked_timeout: float = 30.0,
        management: Endpoint | None = None,
        http_timeout: float = 5.0,
        queue_type: str = "classic",
    ) -> None:
        if queue_type not in QUEUE_TYPES:
            raise ValueError(f"queue_type: expected one of {', '.join(QUEUE_TYPES)}, "
                             f"got {queue_type!r}")
        self.endpoint = amqp
        self.queue_type = queue_type
        self._quorum = queue_type == "quorum"
        self._management = management
        self._http_timeout = http_timeout
        # One set for each node (the endpoint's alternates: a cluster's other nodes), tried in
        # turn from the one that answered last.
        self._nodes = [_parameters(ep, heartbeat, blocked_timeout) for ep in amqp.every()]
        self._params = self._nodes[0]
        self._attempts = connect_attempts
        self._retry_wait = retry_wait
        self._conn: pika.BlockingConnection | None = None
        self._main: BlockingChannel | None = None
        self._confirm: BlockingChannel | None = None
        self._scratch: BlockingChannel | None = None
        self._tx: BlockingChannel | None = None
        self._listening: BlockingChannel | None = None  # listen's subscriptions
        self._returned: list[tuple[str, str, bytes]] = []
        self._generation = 0
        self._declared: set[str] = set()
        # Queues that refused a publish lately (full: a nack): settles that put to one go one
        # move at a time, never in a transaction, whose failure ("partial tx completion") would
        # not say which of its puts went through (retrying all of them would duplicate).
        self._refusing: dict[str, float] = {}
        self._delivered: list[Held] = []
        self._holding: dict[int, str] = {}  # delivery tag on ``main`` -> its queue
        self._log = structlog.get_logger("adapters.rabbitmq").bind(
            broker=self.name, address=str(amqp))

    # -- connection ----------------------------------------------------------------------------

    def connect(self) -> None:
        """Open the connection (``connect_attempts`` tries); BrokerUnavailable names the address."""
        if self._conn is not None and self._conn.is_open:
            return
        connect_with_retries(self._connect_once, self._attempts, self._retry_wait)

    def _connect_once(self) -> None:
        with self._translate(fatal=True):
            if len(self._nodes) == 1:
                self._conn = pika.BlockingConnection(self._params)
            else:
                at = self._nodes.index(self._params)
                self._conn = pika.BlockingConnection(self._nodes[at:] + self._nodes[:at])
                used = getattr(getattr(self._conn, "_impl", None), "params", None)
                self._params = next(
                    (p for p in self._nodes if used is not None and
                     (p.host, p.port) == (used.host, used.port)), self._params)
            self._main = self._conn.channel()
        self._generation += 1
        self._declared.clear()
        self._delivered.clear()
        self._holding.clear()
        self._log.debug("connected")

    def close(self) -> None:
        """Close the connection; the broker returns everything held to its queue."""
        conn, self._conn = self._conn, None
        self._main = self._confirm = self._scratch = self._tx = self._listening = None
        self._delivered.clear()
        self._holding.clear()
        if conn is not None and conn.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                conn.close()

    @contextlib.contextmanager
    def _translate(self, *, fatal: bool = False) -> Iterator[None]:
        """The one place pika's and the socket's errors become BrokerUnavailable."""
        try:
            yield
        except (pika.exceptions.AMQPError, OSError) as exc:
            lost = fatal or self._conn is None or not self._conn.is_open or not self._main_open()
            if lost:
                self.close()
            else:
                self._drop_side_channels()
            self._log.debug("broker error", error=_describe(exc), connection_lost=lost)
            raise BrokerUnavailable(f"{self._where()}: {_describe(exc)}") from exc

    def _where(self) -> str:
        return f"{self.name} AMQP at {self.endpoint}"

    def _main_open(self) -> bool:
        return self._main is not None and self._main.is_open

    def _drop_side_channels(self) -> None:
        for attr in ("_confirm", "_scratch", "_tx", "_listening"):
            ch: BlockingChannel | None = getattr(self, attr)
            if ch is not None and not ch.is_open:
                setattr(self, attr, None)

    def _channel(self) -> BlockingChannel:
        if self._conn is None or not self._conn.is_open or not self._main_open():
            self.close()
            raise BrokerUnavailable(f"{self._where()}: not connected")
        assert self._main is not None
        return self._main

    def _confirm_channel(self) -> BlockingChannel:
        self._channel()
        if self._confirm is None or not self._confirm.is_open:
            assert self._conn is not None
            with self._translate():
                ch = self._conn.channel()
                ch.confirm_delivery()
            self._confirm = ch
        return self._confirm

    def _tx_channel(self) -> BlockingChannel:
        """A side channel in transaction mode: a batch of puts costs one round trip (the
        commit) instead of one confirm each. Returned (unroutable) messages are collected."""
        self._channel()
        if self._tx is None or not self._tx.is_open:
            assert self._conn is not None
            with self._translate():
                ch = self._conn.channel()
                ch.tx_select()
                # pika calls it (channel, method, properties, body); types-pika says otherwise.
                ch.add_on_return_callback(self._on_return)  # type: ignore[arg-type]
            self._tx = ch
            self._returned = []
        return self._tx

    def _on_return(self, _ch: object, method: Any, _props: object, body: bytes) -> None:
        self._returned.append((method.exchange, method.routing_key, body))

    def _scratch_channel(self) -> BlockingChannel:
        self._channel()
        if self._scratch is None or not self._scratch.is_open:
            assert self._conn is not None
            with self._translate():
                self._scratch = self._conn.channel()
        return self._scratch

    # -- queues --------------------------------------------------------------------------------

    def ensure_queues(self, names: Sequence[str]) -> None:
        """Declare durable queues of ``queue_type``: classic ones with no arguments, quorum ones
        with QUORUM_ARGUMENTS. StagingQueueMismatch names a queue the broker already has with
        other arguments (of the other type, most often), which it refuses to declare again."""
        arguments = QUORUM_ARGUMENTS if self._quorum else None
        for name in names:
            ch = self._scratch_channel()
            try:
                with self._translate():
                    ch.queue_declare(name, durable=True, arguments=arguments)
            except BrokerUnavailable as exc:
                cause = exc.__cause__
                if not (isinstance(cause, pika.exceptions.ChannelClosedByBroker)
                        and cause.reply_code == 406 and self._main_open()):
                    raise
                raise StagingQueueMismatch(
                    f"{self._where()}: staging queue {name!r} exists already and is not what "
                    f"--staging-queue-type {self.queue_type} declares (the broker said: "
                    f"({cause.reply_code}) {cause.reply_text}). Give this bridge another "
                    "--staging-prefix, or drain the old staging queues (stop the bridges, "
                    "move their messages) and delete them; see the README, \"Quorum staging\""
                ) from None
            self._declared.add(name)

    def depth(self, queue: str) -> int:
        """A passive queue.declare's message count (ready messages) plus those this adapter
        holds unacked; messages other connections hold are not counted. 0 for a queue the
        broker does not have (its 404 closes only the scratch channel)."""
        ok = self._declared_ok(queue)
        ready = 0 if ok is None else ok.method.message_count or 0
        return ready + sum(1 for q in self._holding.values() if q == queue)

    def consumers(self, queue: str) -> int:
        """A passive queue.declare's consumer count."""
        ok = self._declared_ok(queue)
        return 0 if ok is None else ok.method.consumer_count or 0

    def _declared_ok(self, queue: str) -> Any:
        """A passive queue.declare's answer; None for a queue the broker does not have."""
        ch = self._scratch_channel()
        try:
            with self._translate():
                return ch.queue_declare(queue, passive=True)
        except BrokerUnavailable as exc:
            cause = exc.__cause__
            missing = isinstance(cause, pika.exceptions.ChannelClosedByBroker) and (
                cause.reply_code == 404
            )
            if not missing or not self._main_open():
                raise
            return None

    def depths(self, queues: Sequence[str]) -> dict[str, int]:
        """One passive queue.declare each: a round trip of a fraction of a millisecond."""
        return {queue: self.depth(queue) for queue in queues}

    # -- holding -------------------------------------------------------------------------------

    def peek(self, queue: str) -> Held | None:
        """basic.get without ack; each peek holds the next message (RabbitMQ has no 'same head')."""
        got = self._get(self._channel(), queue)
        if got is None:
            return None
        tag, props, body = got
        return self._held(queue, tag, props, body)

    def _get(
        self, ch: BlockingChannel, queue: str
    ) -> tuple[int, pika.BasicProperties, bytes] | None:
        """basic.get without ack: (delivery tag, properties, body), None when empty."""
        with self._translate():
            method, props, body = ch.basic_get(queue, auto_ack=False)
        if method is None or method.delivery_tag is None:
            return None
        data = body if isinstance(body, bytes) else (body or "").encode()
        return method.delivery_tag, props or pika.BasicProperties(), data

    def _held(
        self, queue: str, tag: int, props: pika.BasicProperties, body: bytes
    ) -> Held:
        self._holding[tag] = queue
        return Held(queue, self._message(props, body), _Tag(self._generation, tag))

    def _message(self, props: pika.BasicProperties, body: bytes) -> Message:
        """A message read from a queue, without the header a quorum queue adds to it."""
        headers = stomp_headers(props)
        if self._quorum:
            headers.pop(DELIVERY_COUNT, None)
        return Message(headers, body)

    def put_back(self, held: Held) -> None:
        """basic.nack with requeue: a classic queue puts it back at its old position, the head."""
        tag = self._tag(held)
        if tag.generation != self._generation:
            return  # its connection is gone, so the broker has put it back already
        ch = self._channel()
        with self._translate():
            ch.basic_nack(tag.delivery_tag, multiple=False, requeue=True)
        self._holding.pop(tag.delivery_tag, None)

    def subscribe(self, queue: str, prefetch: int) -> None:
        ch = self._channel()
        with self._translate():
            ch.basic_qos(prefetch_count=prefetch)
            ch.basic_consume(queue, functools.partial(self._on_delivery, queue), auto_ack=False)

    def _on_delivery(
        self,
        queue: str,
        _ch: BlockingChannel,
        method: pika.spec.Basic.Deliver,
        props: pika.BasicProperties,
        body: bytes,
    ) -> None:
        assert method.delivery_tag is not None
        self._delivered.append(self._held(queue, method.delivery_tag, props, body))

    def listen(self, topic: str) -> None:
        """A server-named exclusive queue bound to ``amq.topic`` with ``topic`` as its key (what
        the STOMP plugin does for a SUBSCRIBE to ``/topic/<topic>``), consumed with automatic
        acks on a channel of its own: a refusal closes only that channel."""
        self._channel()
        assert self._conn is not None
        with self._translate():
            if self._listening is None or not self._listening.is_open:
                self._listening = self._conn.channel()
            ch = self._listening
        try:
            ok = ch.queue_declare("", exclusive=True, auto_delete=True)
            name = ok.method.queue or ""
            ch.queue_bind(name, "amq.topic", routing_key=topic)
            ch.basic_consume(name, functools.partial(self._on_heard, topic), auto_ack=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if self._conn is None or not self._conn.is_open or not self._main_open():
                with self._translate():
                    raise
            self._listening = None
            raise Refused(
                refusal_reason(exc.reply_code, exc.reply_text),
                f"subscribing to /topic/{topic}: ({exc.reply_code}) {exc.reply_text}",
            ) from None
        except (pika.exceptions.AMQPError, OSError):
            with self._translate():
                raise

    def _on_heard(
        self,
        topic: str,
        _ch: BlockingChannel,
        _method: pika.spec.Basic.Deliver,
        props: pika.BasicProperties,
        body: bytes,
    ) -> None:
        self._delivered.append(Held(topic, Message(stomp_headers(props), body), None))

    def poll(self, timeout: float) -> list[Held]:
        """Deliveries since the last call; waits up to ``timeout`` s for the first."""
        self._channel()
        assert self._conn is not None
        with self._translate():
            self._conn.process_data_events(time_limit=0)
            if not self._delivered and timeout > 0:
                # pika takes float seconds (types-pika 1.2 says int)
                self._conn.process_data_events(time_limit=timeout)  # type: ignore[arg-type]
        out, self._delivered = self._delivered, []
        return out

    # -- putting -------------------------------------------------------------------------------

    def settle(self, moves: Sequence[Move]) -> None:
        """Publish every move's message, then ack. A held message from a lost connection stops
        the whole batch before anything is published (the broker has requeued it already). A
        refused publish stops it at that move (PutRefused): the moves before it are done, it
        and the rest stay held (a batch put in one transaction may have put some of the rest
        already: retrying them can duplicate, never lose). RabbitMQ fails a transaction with a
        put to a full reject-publish queue ("partial tx completion") after putting the others,
        so a queue that nacked a put is left out of transactions for REFUSING_S: the engine
        tries it again and again (message-retry), and only its first refusal can duplicate."""
        ch = self._channel()
        for move in moves:
            if self._tag(move.held).generation != self._generation:
                raise BrokerUnavailable(
                    f"{self._where()}: a held message of {move.held.queue} belongs to a lost "
                    "connection and is back on its queue"
                )
        puts = [m for m in moves if m.destination is not None]
        if len(puts) > 1 and not self._any_refusing(puts) and self._settle_batch(ch, moves):
            return
        self._settle_each(ch, moves)

    def _any_refusing(self, puts: Sequence[Move]) -> bool:
        if not self._refusing:
            return False
        now = time.monotonic()
        self._refusing = {q: until for q, until in self._refusing.items() if until > now}
        return any(route(m.destination or "").routing_key in self._refusing for m in puts
                   if _routable(m.destination))

    def _settle_batch(self, ch: BlockingChannel, moves: Sequence[Move]) -> bool:
        """All puts in one transaction, then the acks. False when the batch could not be put
        that way (a target that refuses its declare, a message pika cannot write, a channel
        error): nothing acked, do it one by one."""
        puts: list[tuple[Route, pika.BasicProperties, bytes] | None] = []
        for move in moves:
            if move.destination is None:
                puts.append(None)
                continue
            if move.message is None:
                return False  # _settle_each says what is wrong with it
            where = route(move.destination)
            if where.declare and where.routing_key not in self._declared:
                # Declared on its own first (as a SEND to it would), so that a burst of
                # releases to a queue not met before still goes in one transaction.
                try:
                    self._declare_target(where.routing_key, move.message.headers,
                                         move.destination)
                except PutRefused:
                    return False  # _settle_each says which move it refuses
            try:
                puts.append((where, amqp_properties(move.message.headers), move.message.body))
            except ValueError:
                return False  # one by one, where that move is refused on its own
        try:
            tx = self._tx_channel()
            self._returned.clear()
            sent: list[tuple[str, str, bytes] | None] = []
            publish = _unflushed(tx).basic_publish  # written all at once by tx_commit
            for put in puts:
                if put is None:
                    sent.append(None)
                    continue
                where, props, body = put
                publish(where.exchange, where.routing_key, body, props, mandatory=where.queue)
                sent.append((where.exchange, where.routing_key, body))
            tx.tx_commit()
            assert self._conn is not None
            self._conn.process_data_events(0)  # returns arrive before commit-ok
        except BrokerUnavailable:
            raise
        except (pika.exceptions.AMQPError, OSError, ValueError):
            self._drop_side_channels()
            if self._conn is None or not self._conn.is_open or not self._main_open():
                with self._translate():
                    raise
            return False
        refused = len(moves)
        for returned in self._returned:
            refused = min(refused, next(
                (i for i, key in enumerate(sent) if key == returned), refused))
        ack = _unflushed(ch).basic_ack
        with self._translate():
            for move in moves[:refused]:
                tag = self._tag(move.held).delivery_tag
                ack(tag, multiple=False)
                self._holding.pop(tag, None)
            self._conn.process_data_events(0)  # writes the acks
        if refused < len(moves):
            move = moves[refused]
            raise PutRefused(
                refused, MQRC_UNKNOWN_OBJECT_NAME,
                f"no queue {route(move.destination or '').routing_key!r} (the broker returned "
                "the message unroutable)",
                move.destination or "",
            )
        return True

    def _settle_each(self, ch: BlockingChannel, moves: Sequence[Move]) -> None:
        """Per move: publish (confirmed), then ack."""
        for i, move in enumerate(moves):
            if move.destination is not None:
                if move.message is None:
                    raise ValueError("a move with a destination needs a message")
                try:
                    self._put(move.destination, move.message)
                except PutRefused as refused:
                    raise refused.at(i) from None
            tag = self._tag(move.held).delivery_tag
            with self._translate():
                ch.basic_ack(tag, multiple=False)
            self._holding.pop(tag, None)

    def publish(self, destination: str, message: Message) -> None:
        self._put(destination, message)

    def _put(self, destination: str, message: Message) -> None:
        where = route(destination)
        try:
            props = amqp_properties(message.headers)
        except ValueError as bad:
            # This message cannot be put anywhere as it is: its refusal, not an outage.
            raise PutRefused(0, MQRC_PROPERTY_VALUE_BAD, str(bad), destination) from None
        if where.declare and where.routing_key not in self._declared:
            self._declare_target(where.routing_key, message.headers, destination)
        try:
            self._publish(where, props, message.body, destination)
        except pika.exceptions.UnroutableError:
            if not where.declare:
                raise PutRefused(
                    0, MQRC_UNKNOWN_OBJECT_NAME,
                    f"no queue {where.routing_key!r} (the broker returned the message "
                    "unroutable)",
                    destination,
                ) from None
            self._declared.discard(where.routing_key)  # deleted since we declared it
            self._declare_target(where.routing_key, message.headers, destination)
            self._publish_or_fail(where, props, message.body, destination)

    def _publish(
        self, where: Route, props: pika.BasicProperties, body: bytes, destination: str
    ) -> None:
        ch = self._confirm_channel()
        try:
            ch.basic_publish(
                where.exchange, where.routing_key, body, props, mandatory=where.queue
            )
        except pika.exceptions.UnroutableError:
            raise
        except pika.exceptions.NackError:
            # RabbitMQ nacks a publish to a full queue with overflow reject-publish(-dlx).
            self._refusing[where.routing_key] = time.monotonic() + REFUSING_S
            raise PutRefused(
                0, MQRC_Q_FULL, "the broker nacked the message (a full queue that rejects "
                "publishes?)", destination,
            ) from None
        except pika.exceptions.ChannelClosedByBroker as exc:
            self._refused(exc, destination)
        except (pika.exceptions.AMQPError, OSError):
            with self._translate():
                raise

    def _refused(self, exc: pika.exceptions.ChannelClosedByBroker, destination: str) -> None:
        """A side channel closed by the broker over one message: PutRefused while the
        connection and ``main`` are up, BrokerUnavailable otherwise."""
        if self._conn is None or not self._conn.is_open or not self._main_open():
            with self._translate():
                raise exc
        self._drop_side_channels()
        self._log.debug("put refused", destination=destination, error=_describe(exc))
        raise PutRefused(
            0, refusal_reason(exc.reply_code, exc.reply_text),
            f"({exc.reply_code}) {exc.reply_text}", destination,
        ) from None

    def _publish_or_fail(
        self, where: Route, props: pika.BasicProperties, body: bytes, destination: str
    ) -> None:
        try:
            self._publish(where, props, body, destination)
        except pika.exceptions.UnroutableError:
            raise PutRefused(
                0, MQRC_UNKNOWN_OBJECT_NAME, "the message was returned unroutable", destination
            ) from None

    def _declare_target(self, queue: str, headers: Mapping[str, str], destination: str) -> None:
        """Declare a /queue/ target as the plugin does on SEND (durable, the message's
        x-arguments, its auto-delete header; never exclusive to this connection). A queue that
        exists with other arguments is used as it is, where the plugin would refuse the SEND:
        a release must not fail for a target that is there."""
        arguments = queue_arguments(headers)
        auto_delete = headers.get("auto-delete") in ("true", "True")
        ch = self._scratch_channel()
        try:
            ch.queue_declare(queue, durable=True, auto_delete=auto_delete, arguments=arguments)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code == 403:
                self._refused(exc, destination)
            if exc.reply_code != 406:
                with self._translate():
                    raise
            self._scratch = None
            ch = self._scratch_channel()
            with self._translate():
                ch.queue_declare(queue, passive=True)
        except (pika.exceptions.AMQPError, OSError):
            with self._translate():
                raise
        self._declared.add(queue)

    # -- tools ---------------------------------------------------------------------------------

    def check_put(self, destination: str) -> PutCheck:
        try:
            where = route(destination)
        except ValueError:
            return PutCheck()
        with self._translate():
            assert self._conn is not None
            ch = self._conn.channel()
        limits: Mapping[str, Any] | None = None
        ready = 0
        try:
            if where.queue and self._management is not None:
                limits = self._queue_info(where.routing_key)
            if where.queue and (limits is not None or not where.declare):
                # /amq/queue/ must exist; and how many messages are ready, exactly
                ready = ch.queue_declare(where.routing_key, passive=True).method.message_count or 0
            if where.exchange:  # permissions are checked at the publish, rolled back unseen
                ch.tx_select()
                ch.basic_publish(where.exchange, where.routing_key, b"")
                ch.tx_rollback()
        except pika.exceptions.ChannelClosedByBroker as exc:
            if self._conn is None or not self._conn.is_open or not self._main_open():
                with self._translate():
                    raise
            return PutCheck(Refused(
                refusal_reason(exc.reply_code, exc.reply_text),
                f"{destination}: the broker says ({exc.reply_code}) {exc.reply_text}",
            ))
        except (pika.exceptions.AMQPError, OSError):
            with self._translate():
                raise
        finally:
            _close_quietly(ch)
        return PutCheck() if limits is None else queue_check(destination, limits, ready)

    def staging_checks(self, destination: str) -> bool:
        """A staged copy is published to the default exchange, like a send to any queue; but
        that send says nothing of the queue's length limits."""
        if self._management is not None:
            return False
        try:
            where = route(destination)
        except ValueError:
            return False
        return where.exchange == "" and where.declare

    def _management_url(self, rest: str) -> str:
        """The management API's URL of this vhost's queues, then ``rest``."""
        ep = self._management
        assert ep is not None
        vhost = urllib.parse.quote(self.endpoint.vhost or "/", safe="")
        return f"http://{ep.host}:{ep.port}/api/queues/{vhost}{rest}"

    def _management_json(self, url: str) -> Any:
        """GET ``url`` of the management API with its credentials, as JSON; urllib's errors
        (HTTPError, OSError) and ValueError for a body that is not JSON."""
        ep = self._management
        assert ep is not None
        request = urllib.request.Request(url)
        token = base64.b64encode(f"{ep.user or 'guest'}:{ep.password or 'guest'}".encode())
        request.add_header("Authorization", "Basic " + token.decode())
        with urllib.request.urlopen(request, timeout=self._http_timeout) as answer:
            return json.loads(answer.read())

    def _queue_info(self, queue: str) -> Mapping[str, Any] | None:
        """The management API's view of a queue: arguments, policy, ready bytes; None when it
        does not exist, or the API cannot be asked (logged: the other checks still count)."""
        url = self._management_url(
            f"/{urllib.parse.quote(queue, safe='')}"
            "?columns=arguments,effective_policy_definition,message_bytes_ready")
        try:
            info = self._management_json(url)
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                self._log.warning("queue limits not seen", queue=queue, url=url,
                                  error=f"HTTP {exc.code} {exc.reason}")
            return None
        except (OSError, ValueError) as exc:
            self._log.warning("queue limits not seen", queue=queue, url=url, error=str(exc))
            return None
        return info if isinstance(info, dict) else None

    def browse(self, queue: str) -> Iterator[Message]:
        """Gets every ready message on a channel of its own and closes it, so all return to
        their places. Messages held unacked (by anyone, this adapter included) are not seen."""
        ch, count = self._tool_channel(queue)
        try:
            for _ in range(count):
                got = self._get(ch, queue)
                if got is None:
                    return
                yield self._message(got[1], got[2])
        finally:
            _close_quietly(ch)

    def take(
        self, queue: str, header: str, value: str, then: Callable[[Message], None] | None = None
    ) -> Message | None:
        """Gets through ``queue`` on a channel of its own, acks the first match (after
        ``then``) and closes the channel, which returns every other message to its place."""
        ch, count = self._tool_channel(queue)
        try:
            for _ in range(count):
                got = self._get(ch, queue)
                if got is None:
                    return None
                tag, props, body = got
                message = self._message(props, body)
                if message.headers.get(header) == value:
                    if then is not None:
                        then(message)
                    with self._translate():
                        ch.basic_ack(tag)
                    return message
            return None
        finally:
            _close_quietly(ch)

    def _tool_channel(self, queue: str) -> tuple[BlockingChannel, int]:
        self._channel()
        assert self._conn is not None
        with self._translate():
            ch = self._conn.channel()
        try:
            ok = ch.queue_declare(queue, passive=True)
        except (pika.exceptions.AMQPError, OSError):
            with self._translate():
                raise
        return ch, ok.method.message_count or 0

    @staticmethod
    def _tag(held: Held) -> _Tag:
        if not isinstance(held.token, _Tag):
            raise TypeError("not a message held by a RabbitMQ adapter")
        return held.token


def _unflushed(ch: BlockingChannel) -> pika.channel.Channel:
    """The channel under pika's blocking wrapper, which writes to the socket and polls after
    every publish and ack (most of a batch's cost). Its methods only queue their frames; the
    wrapper's next blocking call (tx_commit, process_data_events) writes them all at once."""
    impl: pika.channel.Channel = ch._impl  # type: ignore[attr-defined]
    return impl


def _close_quietly(ch: BlockingChannel) -> None:
    with contextlib.suppress(pika.exceptions.AMQPError, OSError):
        if ch.is_open:
            ch.close()


def _describe(exc: BaseException) -> str:
    """One line for a pika error, naming the innermost cause (pika nests them in args)."""
    inner: BaseException = exc
    for _ in range(5):
        nested = getattr(inner, "exception", None)
        if not isinstance(nested, BaseException) and inner.args:
            nested = inner.args[0] if isinstance(inner.args[0], BaseException) else None
        if nested is None:
            break
        inner = nested
    text = str(inner) or repr(inner)
    if isinstance(inner, pika.exceptions.ChannelClosed | pika.exceptions.ConnectionClosed):
        text = f"({inner.reply_code}) {inner.reply_text}"
    return f"{type(inner).__name__}: {text}"

"""Destination names in redelivery policies: the source's kind and name, and move targets.

Destinations are STOMP-style strings. Their kind (queue or topic) comes from the prefix:

- queues: ``/queue/x``, ``/amq/queue/x`` (RabbitMQ), ``/temp-queue/x``, ``/reply-queue/x``,
  and a name with no prefix;
- topics: ``/topic/x``, ``/temp-topic/x``, ``/exchange/x/key`` (RabbitMQ: a publication).

A destination's name, what JMSJCA's ``$`` stands for, is the part after the last ``/``, as in
:func:`policies.delay.matches`: ``Queue1`` for ``/queue/Queue1``, ``key`` for
``/exchange/x/key``. A JMSJCA move target ``queue:N`` becomes ``/queue/N``, ``topic:N``
``/topic/N``, ``same:N`` one or the other as the source is a queue or a topic (so ``same:`` from
``/amq/queue/x`` gives ``/queue/...``, where the broker creates the queue if it is missing).
"""

from __future__ import annotations

from policies.errors import ConfigError

__all__ = [
    "UNDELIVERED_NAMES",
    "kind_and_name",
    "parse_destination",
    "resolve_move",
]

QUEUE_PREFIXES = ("/queue/", "/amq/queue/", "/temp-queue/", "/reply-queue/")
TOPIC_PREFIXES = ("/topic/", "/temp-topic/", "/exchange/")
# TIBCO's undelivered queue, as an operator may name it in any dialect's destination setting.
UNDELIVERED_NAMES = ("$sys.undelivered", "/queue/$sys.undelivered")
# JBoss Messaging names destinations by JMX ObjectName: ...:service=Queue,name=DLQ
_JBOSS_SERVICE = {"queue": "/queue/", "topic": "/topic/"}


def kind_and_name(destination: str) -> tuple[str, str]:
    """``("queue" | "topic", name)`` of a source destination."""
    name = destination[destination.rfind("/") + 1 :]
    if destination.startswith(TOPIC_PREFIXES):
        return "topic", name
    return "queue", name


def resolve_move(kind: str, name: str, source: str) -> str:
    """The destination a move rule sends a message from ``source`` to.

    ``kind`` ``exact``: ``name`` is the whole destination. Otherwise ``name`` is a JMSJCA target
    name in which every ``$`` is replaced by the source's name, under ``/queue/`` or
    ``/topic/`` (``same``: the source's own kind)."""
    if kind == "exact":
        return name
    source_kind, source_name = kind_and_name(source)
    if kind == "same":
        kind = source_kind
    return f"/{kind}/{name.replace('$', source_name)}"


def parse_destination(value: str) -> str | None:
    """A dead-letter destination as a vendor dialect's setting names it, as a STOMP
    destination; None for TIBCO's undelivered queue (:data:`UNDELIVERED_NAMES`).

    Accepted: a STOMP destination (``/queue/dlq``, ``/topic/x``, ``/amq/queue/x``,
    ``/exchange/x/key``); a JNDI-style ``queue/dlq`` or ``topic/x``; a JBoss ObjectName
    (``jboss.messaging.destination:service=Queue,name=DLQ``); a plain name, taken as a queue.
    Raises ConfigError for anything else (the message is the detail only)."""
    text = value.strip()
    if not text:
        raise ConfigError("a destination cannot be empty")
    if text in UNDELIVERED_NAMES:
        return None
    if text.startswith("/"):
        if not text.startswith(QUEUE_PREFIXES + TOPIC_PREFIXES):
            raise ConfigError(
                f"destination {text!r} must start with /queue/, /topic/, /amq/queue/ or /exchange/"
            )
        if text.endswith("/"):
            raise ConfigError(f"destination {text!r} has no name")
        return text
    if ":" in text and "name=" in text:
        return _jboss_object_name(text)
    for jndi in ("queue/", "topic/"):
        if text.startswith(jndi) and "/" not in text[len(jndi) :] and text[len(jndi) :]:
            return "/" + text
    if "/" in text:
        raise ConfigError(f"destination {text!r}: write it as /queue/NAME or /topic/NAME")
    return "/queue/" + text


def _jboss_object_name(text: str) -> str:
    """``jboss.messaging.destination:service=Queue,name=DLQ`` -> ``/queue/DLQ``."""
    fields = dict(
        part.split("=", 1) for part in text.split(":", 1)[1].split(",") if "=" in part
    )
    prefix = _JBOSS_SERVICE.get(fields.get("service", "Queue").strip().lower())
    name = fields.get("name", "").strip()
    if prefix is None or not name or "/" in name:
        raise ConfigError(
            f"destination {text!r}: expected service=Queue or service=Topic and a name=NAME"
        )
    return prefix + name

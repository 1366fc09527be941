"""Which queue or topic a destination is, on each broker: one canonical form for every way a
client names it, so that a destination pattern means the queue however a consumer reaches it.

A client names RabbitMQ's queue ``orders.x`` as ``/queue/orders.x``, ``/amq/queue/orders.x``,
the bare ``orders.x`` (STOMP), or just ``orders.x`` (AMQP 0-9-1, which the bridge shows as
``/amq/queue/orders.x``): all are :class:`Named` ``("queue", "", "orders.x")``. Topics stay
topics (``/topic/x`` is not the queue ``x``), and RabbitMQ's ``/exchange/E/KEY`` is a
publication to exchange ``E``, the scope, with routing key ``KEY``, the name. ActiveMQ knows
``/queue/``, ``/topic/``, ``/temp-queue/`` and ``/temp-topic/``; anything else is a queue of
exactly that name (``/amq/queue/x`` there is the queue named ``/amq/queue/x``, and
``queue://x`` the queue named ``queue://x``: ActiveMQ's STOMP takes no ``queue://`` form).

A pattern is a destination whose name may hold wildcards (:func:`match_name`). A pattern with no
``/`` at all covers the name in every form and kind (``orders.*`` covers the queue and the topic
``orders.x``); one with a prefix covers that kind only (``/queue/orders.*`` covers the queue
``orders.x`` however it is named, and no topic). :func:`pattern_problem` says why a pattern
can never match anything the broker has. Pure: stdlib only.
"""

from __future__ import annotations

from typing import NamedTuple

from policies.errors import ConfigError

__all__ = [
    "ANY",
    "BROKERS",
    "QUEUE",
    "TOPIC",
    "Named",
    "Pattern",
    "check_pattern",
    "compile_pattern",
    "match_name",
    "named",
    "pattern_problem",
    "queue_name",
    "target_forms",
]

BROKERS = ("rabbitmq", "activemq")
QUEUE = "queue"
TOPIC = "topic"
EXCHANGE = "exchange"
ANY = ""  # a bare pattern's kind: every kind
_TAIL_WILDCARDS = (">", "#")

# (prefix, kind) in the order a destination is tried against them, per broker.
_PREFIXES: dict[str, tuple[tuple[str, str], ...]] = {
    "rabbitmq": (("/queue/", QUEUE), ("/amq/queue/", QUEUE), ("/topic/", TOPIC),
                 ("/exchange/", EXCHANGE), ("/temp-queue/", "temp-queue"),
                 ("/reply-queue/", "reply-queue")),
    "activemq": (("/queue/", QUEUE), ("/topic/", TOPIC), ("/temp-queue/", "temp-queue"),
                 ("/temp-topic/", "temp-topic"), ("/remote-temp-queue/", "temp-queue"),
                 ("/remote-temp-topic/", "temp-topic")),
}


class Named(NamedTuple):
    """What a destination is on a broker: its kind (``queue``, ``topic``, ``exchange``,
    ``temp-queue``, ...), its scope (the exchange of an ``exchange``, else ``""``) and its
    name, the part wildcards match."""

    kind: str
    scope: str
    name: str


def named(destination: str, broker: str) -> Named | None:
    """The canonical form of ``destination`` on ``broker``; None where the broker refuses the
    form (RabbitMQ: ``/queues/x``, ``queue/x``, ``queue://x``, ``/queue/a/b``)."""
    for prefix, kind in _PREFIXES[_broker(broker)]:
        if destination.startswith(prefix):
            rest = destination[len(prefix):]
            if broker == "activemq":
                return Named(kind, "", rest)
            if kind == EXCHANGE:
                scope, _, key = rest.partition("/")
                return Named(kind, scope, key) if scope else None
            if kind == "reply-queue" or (rest and "/" not in rest):
                return Named(kind, "", rest)
            return None
    if broker == "activemq":
        return Named(QUEUE, "", destination)  # ActiveMQ's fallback: a queue of that name
    if "/" in destination or not destination:
        return None
    return Named(QUEUE, "", destination)


def is_queue(destination: str, broker: str) -> bool:
    """Whether ``destination`` names a (durable, named) queue on ``broker``."""
    found = named(destination, broker)
    return found is not None and found.kind == QUEUE


def queue_name(text: str, broker: str) -> str:
    """The name of the queue ``text`` names on ``broker``, in any form the bridge prints it
    (``/queue/X``, RabbitMQ's ``/amq/queue/X``, or the bare ``X``): what a tool that takes a
    queue works on. ConfigError saying why when ``text`` names no queue there."""
    found = named(text, broker)
    if found is None or not found.name:
        problem = pattern_problem(text, broker) or "no queue has an empty name"
        raise ConfigError(f"{text!r} is not a queue on {broker}: {problem}")
    if found.kind != QUEUE:
        raise ConfigError(f"{text!r} is not a queue on {broker}: it names a {found.kind}"
                          if found.kind != EXCHANGE else
                          f"{text!r} is not a queue on {broker}: it names an exchange")
    return found.name


class Pattern(NamedTuple):
    """A compiled destination pattern: ``kind`` ``ANY`` for a bare one; ``never`` when the
    broker has nothing it could match (see :func:`pattern_problem`)."""

    text: str
    kind: str
    scope: str
    segments: tuple[str, ...]
    never: bool = False

    def matches(self, destination: Named | None) -> bool:
        if self.never or destination is None:
            return False
        if self.kind != ANY and (self.kind != destination.kind
                                 or self.scope != destination.scope):
            return False
        return _match_segments(self.segments, destination.name.split("."))


def check_pattern(pattern: str) -> None:
    """Refuse an empty pattern or a tail wildcard that is not the last segment."""
    if not pattern:
        raise ConfigError("an empty destination pattern")
    segments = pattern[pattern.rfind("/") + 1:].split(".")
    if any(segment in _TAIL_WILDCARDS for segment in segments[:-1]):
        raise ConfigError(
            f"destination pattern {pattern!r}: '>' and '#' are allowed only as the last segment"
        )


def compile_pattern(pattern: str, broker: str) -> Pattern:
    """``pattern`` on ``broker``; raises ConfigError for a malformed one (:func:`check_pattern`)."""
    check_pattern(pattern)
    if "/" not in pattern:
        return Pattern(pattern, ANY, "", tuple(pattern.split(".")))
    found = named(pattern, broker)
    if found is None:
        return Pattern(pattern, ANY, "", (), never=True)
    return Pattern(pattern, found.kind, found.scope, tuple(found.name.split(".")))


def pattern_problem(pattern: str, broker: str) -> str | None:
    """Why ``pattern`` can never match a destination ``broker`` has, in words; None when it
    can. A form the broker does not take, or takes as the literal name of a queue (ActiveMQ's
    ``/amq/queue/x``, ``/queues/x``), is a typo as far as an operator can tell."""
    broker = _broker(broker)
    if "/" not in pattern:
        return None
    forms = ", ".join(prefix for prefix, _ in _PREFIXES[broker])
    if broker == "rabbitmq":
        if named(pattern, broker) is None:
            return (f"RabbitMQ has no destination of this form (its forms: {forms} and a bare "
                    f"queue name)")
        return None
    if any(pattern.startswith(prefix) for prefix, _ in _PREFIXES[broker]):
        return None
    if pattern.startswith("/amq/queue/"):
        return ("/amq/queue/ is RabbitMQ's; ActiveMQ takes it as the literal name of a queue, "
                f"write /queue/{pattern[len('/amq/queue/'):]}")
    return (f"ActiveMQ takes this as the literal name of a queue, not a form it knows "
            f"({forms} or a bare name)")


def match_name(pattern: str, destination: str, broker: str = "rabbitmq") -> bool:
    """Whether ``destination`` (as a client names it) fits ``pattern`` on ``broker``.

    The name's dot-separated segments: a literal segment matches itself (case-sensitive);
    ``*`` matches exactly one segment; ``>`` or ``#`` as the last segment matches one or more
    remaining segments. A wildcard anywhere but a whole segment is literal."""
    return compile_pattern(pattern, broker).matches(named(destination, broker))


def _broker(broker: str) -> str:
    if broker not in _PREFIXES:
        raise ConfigError(f"unknown broker {broker!r} (known: {', '.join(BROKERS)})")
    return broker


def _match_segments(pattern: tuple[str, ...], name: list[str]) -> bool:
    """Segment-wise match; ``pattern`` ends in at most one tail wildcard (checked before)."""
    if pattern and pattern[-1] in _TAIL_WILDCARDS:
        head = pattern[:-1]
        return len(name) > len(head) and _match_segments(head, name[: len(head)])
    if len(pattern) != len(name):
        return False
    return all(p == "*" or p == n for p, n in zip(pattern, name, strict=True))


def target_forms(destination: str, broker: str) -> tuple[str, ...]:
    """Every way the bridge may have written ``destination`` as a staged message's target: on
    RabbitMQ the queue ``X`` is ``/queue/X`` from a STOMP SEND and ``/amq/queue/X`` from an
    AMQP publish, on ActiveMQ ``/queue/X`` or the bare ``X``; a topic or an exchange is only
    itself."""
    found = named(destination, broker)
    if found is None or found.kind != QUEUE or not found.name:
        return (destination,)
    if _broker(broker) == "rabbitmq":
        return (f"/queue/{found.name}", f"/amq/queue/{found.name}")
    return (f"/queue/{found.name}", found.name)  # ActiveMQ: a bare name is a queue too

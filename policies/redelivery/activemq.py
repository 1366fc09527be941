"""ActiveMQ Classic's RedeliveryPolicy, parsed into a Policy.

Properties, with ActiveMQ's defaults:

- ``initialRedeliveryDelay``, 1000: the wait before the first redelivery (after failure 1).
- ``redeliveryDelay``, 1000: the wait before later ones (with exponential back-off: where the
  growth starts when the initial delay is 0).
- ``useExponentialBackOff``, false: multiply each wait by ``backOffMultiplier`` (5; at least 1).
- ``maximumRedeliveryDelay``, -1 (no cap): the cap on an exponential wait.
- ``maximumRedeliveries``, 6: *redeliveries*, so the message ends at failure N + 1; -1: never;
  0: at the first failure.
- ``useCollisionAvoidance``, false, and ``collisionAvoidanceFactor``, 0.15: spread each wait at
  random by up to that fraction either way (the jitter).
- ``deadLetterQueue``, ``ActiveMQ.DLQ`` (the broker's shared dead-letter strategy): where the
  message then goes; ``""`` or ``none``: deleted.

As in ActiveMQ's consumer, with exponential back-off the first wait is ``initialRedeliveryDelay``
and each later one the previous times the multiplier; when the initial delay is 0 the first
redelivery is immediate and the growth starts from ``redeliveryDelay``; a cap below
``redeliveryDelay`` is lifted to it, as ActiveMQ does. Two differences: the cap
also bounds the first wait and a jittered one (ActiveMQ caps before it jitters), and a jittered
wait does not compound into the next.
"""

from __future__ import annotations

from collections.abc import Mapping

from policies.redelivery.model import Backoff, Delete, Policy, bounded
from policies.redelivery.settings import Settings, render

__all__ = ["parse_activemq"]

DIALECT = "activemq"
KNOWN: dict[str, tuple[str, ...]] = {
    name: () for name in (
        "initialRedeliveryDelay", "redeliveryDelay", "useExponentialBackOff", "backOffMultiplier",
        "maximumRedeliveryDelay", "maximumRedeliveries", "useCollisionAvoidance",
        "collisionAvoidanceFactor", "deadLetterQueue",
    )
}
_MAX_MULTIPLIER = 1e6


def parse_activemq(values: Mapping[object, object]) -> Policy:
    settings = Settings(DIALECT, values, KNOWN)
    initial = settings.integer("initialRedeliveryDelay", 1000, minimum=0)
    later = settings.integer("redeliveryDelay", 1000, minimum=0)
    exponential = settings.boolean("useExponentialBackOff", False)
    multiplier = settings.number("backOffMultiplier", 5.0, minimum=1.0, maximum=_MAX_MULTIPLIER)
    cap = settings.integer("maximumRedeliveryDelay", -1, minimum=-1)
    redeliveries = settings.integer("maximumRedeliveries", 6, minimum=-1)
    collision = settings.boolean("useCollisionAvoidance", False)
    factor = settings.number("collisionAvoidanceFactor", 0.15, minimum=0.0, maximum=1.0)
    end = settings.destination("deadLetterQueue", "ActiveMQ.DLQ") or Delete()

    jitter = factor if collision else 0.0
    waits: list[tuple[int, Backoff]]
    if exponential:
        max_ms = None if cap < 0 else max(cap, later)
        if initial > 0:
            waits = [(0, Backoff(initial, multiplier, max_ms, jitter))]
        else:
            waits = [(1, Backoff(later, multiplier, max_ms, jitter))]
    elif initial == later:
        waits = [(0, Backoff(initial, jitter=jitter))]
    else:
        waits = [(0, Backoff(initial, jitter=jitter)), (1, Backoff(later, jitter=jitter))]
    limit = None if redeliveries < 0 else redeliveries + 1
    return Policy(DIALECT, render(values), bounded(waits, limit, end))

"""ActiveMQ Artemis address settings (also JBoss EAP 7's messaging subsystem), parsed into a
Policy.

Settings, with Artemis's defaults:

- ``redelivery-delay``, 0: the wait before the first redelivery.
- ``redelivery-delay-multiplier`` (JBoss EAP: ``redelivery-multiplier``), 1.0: each later wait
  is the previous one times this (at least 1).
- ``max-redelivery-delay``, ``redelivery-delay`` * 10: the cap on a wait.
- ``redelivery-collision-avoidance-factor``, 0.0: the jitter, a fraction from 0 to 1.
- ``max-delivery-attempts``, 10: *deliveries*, so the message ends at failure N; -1: never.
- ``dead-letter-address``, none: where it then goes; without one Artemis deletes it.
- ``expiry-address``, none: ``Policy.expiry``, for expired messages (not redelivery).

The wait for failure n is ``redelivery-delay * multiplier ** (n - 1)``, spread by the jitter
and then capped, as Artemis computes it.
"""

from __future__ import annotations

from collections.abc import Mapping

from policies.redelivery.model import Backoff, Delete, MoveTo, Policy, bounded
from policies.redelivery.settings import Settings, render

__all__ = ["parse_artemis"]

DIALECT = "artemis"
KNOWN: dict[str, tuple[str, ...]] = {
    "redelivery-delay": (),
    "redelivery-delay-multiplier": ("redelivery-multiplier",),
    "max-redelivery-delay": (),
    "redelivery-collision-avoidance-factor": (),
    "max-delivery-attempts": (),
    "dead-letter-address": (),
    "expiry-address": (),
}
_MAX_MULTIPLIER = 1e6


def parse_artemis(values: Mapping[object, object]) -> Policy:
    settings = Settings(DIALECT, values, KNOWN)
    delay = settings.integer("redelivery-delay", 0, minimum=0)
    multiplier = settings.number(
        "redelivery-delay-multiplier", 1.0, minimum=1.0, maximum=_MAX_MULTIPLIER
    )
    cap = settings.integer("max-redelivery-delay", delay * 10, minimum=0)
    jitter = settings.number("redelivery-collision-avoidance-factor", 0.0, minimum=0.0,
                             maximum=1.0)
    attempts = settings.integer("max-delivery-attempts", 10, minimum=-1)
    end = settings.destination("dead-letter-address", None) or Delete()
    expiry = settings.destination("expiry-address", None)
    steps = bounded(
        [(0, Backoff(delay, multiplier, cap, jitter))],
        None if attempts < 0 else max(1, attempts),
        end,
    )
    return Policy(DIALECT, render(values), steps,
                  expiry=expiry.name if isinstance(expiry, MoveTo) else None)

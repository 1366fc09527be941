"""JBoss 5 (JBoss Messaging 1.4) redelivery settings, parsed into a Policy.

The ServerPeer's defaults (``Default...``) and a destination's own attributes can both be
given; as in JBoss, the destination's own value wins, and -1 for ``RedeliveryDelay`` or
``MaxDeliveryAttempts`` means "the server default". With JBoss's defaults:

- ``RedeliveryDelay`` / ``DefaultRedeliveryDelay``, default 0: a fixed wait before every
  redelivery.
- ``MaxDeliveryAttempts`` / ``DefaultMaxDeliveryAttempts``, default 10: *deliveries*, so the
  message ends at failure N.
- ``DLQ`` / ``DefaultDLQ``, default the shipped ``DLQ`` (``/queue/DLQ``): where it then goes;
  ``""`` or ``none``: no DLQ, and JBoss deletes the message.
- ``ExpiryQueue`` / ``DefaultExpiryQueue``, default the shipped ``ExpiryQueue``:
  ``Policy.expiry``, for expired messages (not redelivery).

Destinations may be written as JBoss does: ``jboss.messaging.destination:service=Queue,name=DLQ``
or the JNDI name ``queue/DLQ``.
"""

from __future__ import annotations

from collections.abc import Mapping

from policies.redelivery.model import Backoff, Delete, MoveTo, Policy, bounded
from policies.redelivery.settings import Settings, render

__all__ = ["parse_jboss"]

DIALECT = "jboss"
KNOWN: dict[str, tuple[str, ...]] = {
    name: () for name in (
        "RedeliveryDelay", "DefaultRedeliveryDelay", "MaxDeliveryAttempts",
        "DefaultMaxDeliveryAttempts", "DLQ", "DefaultDLQ", "ExpiryQueue", "DefaultExpiryQueue",
    )
}


def parse_jboss(values: Mapping[object, object]) -> Policy:
    settings = Settings(DIALECT, values, KNOWN)
    delay = settings.integer("RedeliveryDelay", -1, minimum=-1)
    if delay == -1:
        delay = settings.integer("DefaultRedeliveryDelay", 0, minimum=0)
    attempts = settings.integer("MaxDeliveryAttempts", -1, minimum=-1)
    if attempts == -1:
        attempts = settings.integer("DefaultMaxDeliveryAttempts", 10, minimum=1)
    elif attempts == 0:
        attempts = 1
    dlq_name = "DLQ" if "DLQ" in settings else "DefaultDLQ"
    end = settings.destination(dlq_name, "DLQ") or Delete()
    expiry_name = "ExpiryQueue" if "ExpiryQueue" in settings else "DefaultExpiryQueue"
    expiry = settings.destination(expiry_name, "ExpiryQueue")
    steps = bounded([(0, Backoff(delay))], attempts, end)
    return Policy(DIALECT, render(values), steps,
                  expiry=expiry.name if isinstance(expiry, MoveTo) else None)

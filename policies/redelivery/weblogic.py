"""WebLogic Server JMS destination redelivery settings, parsed into a Policy.

Settings (the JMS module descriptor's spelling; the MBean's and console's work too), with
WebLogic's defaults and what they map to:

- ``redelivery-delay`` (``RedeliveryDelayOverride``, "Redelivery Delay Override"); default -1,
  no override, and the connection factory's own default delay is 0: a fixed wait before every
  redelivery (-1 -> 0).
- ``redelivery-limit`` (``RedeliveryLimit``); default -1, no limit: the number of
  *redeliveries*, so the message ends at failure limit + 1 (limit 0: at the first failure).
- ``error-destination`` (``ErrorDestination``); default none: where the message then goes.
  Without one WebLogic deletes it.
"""

from __future__ import annotations

from collections.abc import Mapping

from policies.redelivery.model import Backoff, Delete, Policy, bounded
from policies.redelivery.settings import Settings, render

__all__ = ["parse_weblogic"]

DIALECT = "weblogic"
KNOWN = {
    "redelivery-delay": ("RedeliveryDelayOverride", "redelivery-delay-override"),
    "redelivery-limit": (),
    "error-destination": (),
}


def parse_weblogic(values: Mapping[object, object]) -> Policy:
    settings = Settings(DIALECT, values, KNOWN)
    delay = settings.integer("redelivery-delay", -1, minimum=-1)
    limit = settings.integer("redelivery-limit", -1, minimum=-1)
    end = settings.destination("error-destination", None) or Delete()
    steps = bounded([(0, Backoff(max(0, delay)))], None if limit < 0 else limit + 1, end)
    return Policy(DIALECT, render(values), steps)

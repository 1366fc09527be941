"""WebSphere Application Server 6.1 (service integration bus) destination settings.

Settings (wsadmin spelling; the console's labels work too), with WebSphere's defaults:

- ``maxFailedDeliveries`` ("Maximum failed deliveries per message"), default 5: failed
  deliveries, so the message ends at failure N.
- ``exceptionDestination`` ("Exception destination"), default ``system``: where it then goes.
  ``system`` (also ``$DEFAULT_EXCEPTION_DESTINATION`` or a ``_SYSTEM.Exception.Destination.*``
  name) is the messaging engine's own exception destination, which the bridge's undelivered
  queue stands for; ``none`` (or ``""``) means no exception destination: as WebSphere does, the
  limit is then ignored and the message redelivered for ever; any other value is a destination.

WebSphere 6.1 has no redelivery delay: every redelivery is immediate.
"""

from __future__ import annotations

from collections.abc import Mapping

from policies.redelivery.model import MoveTo, Policy, Undelivered, bounded
from policies.redelivery.settings import NO_DESTINATION, Settings, render

__all__ = ["parse_websphere"]

DIALECT = "websphere"
KNOWN = {
    "maxFailedDeliveries": ("maximum-failed-deliveries", "maximum-failed-deliveries-per-message"),
    "exceptionDestination": (),
}
SYSTEM = ("system", "$default_exception_destination")
SYSTEM_PREFIX = "_system.exception.destination"


def parse_websphere(values: Mapping[object, object]) -> Policy:
    settings = Settings(DIALECT, values, KNOWN)
    limit = settings.integer("maxFailedDeliveries", 5, minimum=1)
    chosen = (settings.text("exceptionDestination", "system") or "").strip().lower()
    if chosen in NO_DESTINATION:
        return Policy(DIALECT, render(values), ())
    end: MoveTo | Undelivered
    if chosen in SYSTEM or chosen.startswith(SYSTEM_PREFIX):
        end = Undelivered()
    else:
        end = settings.destination("exceptionDestination", None) or Undelivered()
    return Policy(DIALECT, render(values), bounded([], limit, end))

"""TIBCO EMS queue properties, parsed into a Policy.

With EMS's defaults:

- ``maxRedelivery``, default 0 (no limit), else 2 to 255: *deliveries*, so the message ends at
  failure N.
- ``redeliveryDelay``, default 0 (none): a fixed wait before every redelivery, written as EMS
  does, ``time[sec|min|hour]`` (seconds when no unit is given), 0 or 15 sec to 8 hour.

At the limit EMS deletes the message, unless the message itself sets
``JMS_TIBCO_PRESERVE_UNDELIVERED`` to true: then it goes to ``$sys.undelivered``, the bridge's
undelivered queue (:func:`policies.redelivery.model.decide` applies that rule to every dialect).
EMS has no per-queue undelivered setting.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from policies.errors import ConfigError
from policies.redelivery.model import Backoff, Delete, Policy, bounded
from policies.redelivery.settings import Settings, render

__all__ = ["parse_tibco"]

DIALECT = "tibco"
KNOWN: dict[str, tuple[str, ...]] = {"maxRedelivery": (), "redeliveryDelay": ()}
_UNITS_MS = {"": 1000, "sec": 1000, "min": 60_000, "hour": 3_600_000}
_DELAY = re.compile(r"([0-9]{1,9})\s*(sec|min|hour)?", re.IGNORECASE)
_MIN_DELAY_MS = 15_000
_MAX_DELAY_MS = 8 * 3_600_000


def parse_tibco(values: Mapping[object, object]) -> Policy:
    settings = Settings(DIALECT, values, KNOWN)
    limit = settings.integer("maxRedelivery", 0, minimum=0, maximum=255)
    if limit == 1:
        raise ConfigError(f"{settings.key('maxRedelivery')}: must be 0 (no limit) or 2 to 255, "
                          f"got 1")
    delay_ms = _delay_ms(settings)
    steps = bounded([(0, Backoff(delay_ms))], limit or None, Delete())
    return Policy(DIALECT, render(values), steps)


def _delay_ms(settings: Settings) -> int:
    text = settings.text("redeliveryDelay", "0") or "0"
    match = _DELAY.fullmatch(text.strip())
    key = settings.key("redeliveryDelay")
    if match is None:
        raise ConfigError(f"{key}: expected time[sec|min|hour], e.g. 30sec or 5min, got {text!r}")
    delay_ms = int(match.group(1)) * _UNITS_MS[(match.group(2) or "").lower()]
    if delay_ms and not _MIN_DELAY_MS <= delay_ms <= _MAX_DELAY_MS:
        raise ConfigError(f"{key}: must be 0 or between 15 sec and 8 hour, got {text!r}")
    return delay_ms

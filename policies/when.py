"""When an operator moves a staged message to: ``--in DURATION`` (``90s``, ``10m``, ``2h``,
``1d``, ``1500ms``) or ``--at TIME`` (ISO 8601, a time without a zone being UTC, or epoch ms).
Pure: the caller gives the clock."""

from __future__ import annotations

import datetime as dt
import re

from policies.errors import ConfigError

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"([0-9]+)(ms|s|m|h|d)")
MAX_MS = 10 * 365 * 86_400_000  # ten years: further is a typing mistake


def due_in(text: str, now_ms: int) -> int:
    """The due time ``text`` (a duration: a whole number and a unit ms, s, m, h or d, or
    several: ``1h30m``) after ``now_ms``; ConfigError naming the text when it is not one."""
    parts = _DURATION.findall(text.strip())
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        raise ConfigError(f"--in {text!r}: expected a duration such as 90s, 10m, 2h or 1d")
    total = sum(int(n) * _UNITS_MS[u] for n, u in parts)
    if total > MAX_MS:
        raise ConfigError(f"--in {text!r}: more than ten years")
    return now_ms + total


def due_at(text: str, now_ms: int) -> int:
    """The epoch ms of ``text``: ISO 8601 (UTC unless it names a zone) or epoch ms;
    ConfigError naming the text when it is neither."""
    raw = text.strip()
    if raw.isascii() and raw.isdigit():
        value = int(raw)
    else:
        try:
            when = dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError(f"--at {text!r}: expected an ISO 8601 time "
                              "(2030-01-31T09:00:00Z) or epoch milliseconds") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
        value = int(when.timestamp() * 1000)
    if value > now_ms + MAX_MS:
        raise ConfigError(f"--at {text!r}: more than ten years ahead")
    return value

"""ActiveMQ's scheduler headers on a send: a series of deliveries, validated and stepped.

ActiveMQ's meaning (its ``ScheduledMessage`` properties, as its scheduler applies them):
``AMQ_SCHEDULED_DELAY`` ms, then the message, then ``AMQ_SCHEDULED_REPEAT`` more copies
``AMQ_SCHEDULED_PERIOD`` ms apart; with ``AMQ_SCHEDULED_CRON`` that whole run starts at each
time the cron entry fires, and a cron entry alone fires until the series is removed. A repeat of
0 (the default) is one delivery: a period alone changes nothing.

Pure: the cron entry is checked and evaluated by functions the caller passes (the library that
parses cron entries lives above this layer).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from policies.errors import Refused
from policies.reasons import MQRC_OPTIONS_ERROR

__all__ = [
    "CRON",
    "DELAY",
    "JOB_ID",
    "PERIOD",
    "REPEAT",
    "SCHEDULE_HEADERS",
    "Occurrence",
    "Series",
    "first_occurrence",
    "next_occurrence",
    "series_of",
]

DELAY = "AMQ_SCHEDULED_DELAY"
PERIOD = "AMQ_SCHEDULED_PERIOD"
REPEAT = "AMQ_SCHEDULED_REPEAT"
CRON = "AMQ_SCHEDULED_CRON"
SCHEDULE_HEADERS = (PERIOD, REPEAT, CRON)
# On each copy ActiveMQ delivers: the id of the series it belongs to (the sent message's id).
JOB_ID = "scheduledJobId"

_MAX_MS = 400 * 24 * 3600 * 1000  # as far ahead as a delay may ask (policies.delay)
_MAX_REPEAT = 2**31 - 1  # ActiveMQ's repeat is a Java int

# Checks a cron entry: None when it parses, else what is wrong with it.
CronCheck = Callable[[str], "str | None"]
# The first time a cron entry fires strictly after the given epoch ms.
CronNext = Callable[[str, int], int]


@dataclass(frozen=True, slots=True)
class Series:
    """What a send asks of the scheduler."""

    delay_ms: int
    period_ms: int
    repeat: int
    cron: str | None

    @property
    def repeats(self) -> bool:
        """Whether more than one copy may come of it."""
        return self.repeat > 0 or self.cron is not None


@dataclass(frozen=True, slots=True)
class Occurrence:
    """One copy of a series to stage: when it is due, the copies left in its run after it, and
    the cron firing its run started at (None without cron)."""

    due_ms: int
    left: int
    fired_ms: int | None


def series_of(
    headers: Mapping[str, str], delay_ms: int, check_cron: CronCheck
) -> Series | None:
    """The series a send asks for, None when it asks for no repeat and no cron (a plain delay,
    if any). ``delay_ms``: the delay the delay headers asked for (0 for none). Raises
    :class:`~policies.errors.Refused` (MQRC_OPTIONS_ERROR) naming a bad header."""
    if not any(name in headers for name in SCHEDULE_HEADERS):
        return None
    period = _number(headers, PERIOD, _MAX_MS)
    repeat = _number(headers, REPEAT, _MAX_REPEAT)
    cron = headers.get(CRON)
    if cron is not None:
        cron = cron.strip()
        problem = check_cron(cron) if cron else "it is empty"
        if problem is not None:
            raise Refused(MQRC_OPTIONS_ERROR,
                          f"{CRON}={_show(cron)} is not a cron entry: {problem}")
    if not repeat and cron is None:
        return None
    return Series(delay_ms=delay_ms, period_ms=period, repeat=repeat, cron=cron)


def first_occurrence(series: Series, now_ms: int, cron_next: CronNext) -> Occurrence:
    """The first copy of a series sent at ``now_ms``."""
    if series.cron is None:
        return Occurrence(now_ms + series.delay_ms, series.repeat, None)
    fired = cron_next(series.cron, now_ms)
    return Occurrence(fired + series.delay_ms, series.repeat, fired)


def next_occurrence(
    series: Series, current: Occurrence, now_ms: int, cron_next: CronNext
) -> Occurrence | None:
    """The copy after ``current``, None when the series is over. The next of a run is due a
    period after the current one (not after its late release: the series keeps its times); a
    cron series starts its next run at the cron entry's next firing after both the last firing
    and ``now_ms`` (a bridge that was away does not deliver every firing it missed)."""
    if current.left > 0:
        return Occurrence(current.due_ms + series.period_ms, current.left - 1, current.fired_ms)
    if series.cron is None:
        return None
    fired = cron_next(series.cron, max(current.fired_ms or now_ms, now_ms))
    return Occurrence(fired + series.delay_ms, series.repeat, fired)


def _number(headers: Mapping[str, str], name: str, maximum: int) -> int:
    value = headers.get(name)
    if value is None or value == "":
        return 0
    text = value.strip()
    if not (text.isascii() and text.isdigit()):
        if text.startswith("-") and text[1:].isascii() and text[1:].isdigit():
            raise Refused(MQRC_OPTIONS_ERROR, f"{name}={_show(value)} is negative")
        raise Refused(MQRC_OPTIONS_ERROR, f"{name}={_show(value)} is not a decimal integer")
    if len(text) > 12 or int(text) > maximum:
        raise Refused(MQRC_OPTIONS_ERROR, f"{name}={_show(value)} is more than {maximum}")
    return int(text)


def _show(value: str) -> str:
    return repr(value[:64]) + ("..." if len(value) > 64 else "")

"""A scheduler series on the staging queues: what its staged copy carries, the next copy, and
which copies an engine released.

Only the next copy of a series is ever staged. It carries the series in headers of its own
(``jms-bridge-series-*``), so a series is state on the broker like every staged message: the
engine that releases a copy stages the one after it in the same settle (``Releaser.released``),
and cancelling the one staged copy ends the series. Cron entries are 5-field Unix cron, read by
``croniter`` and evaluated in UTC.
"""

from __future__ import annotations

import collections
import datetime
from collections.abc import Mapping

from croniter import croniter

from bridge.staging.envelope import (
    DUE,
    ENTERED,
    EXPIRES,
    FRAME_ONLY,
    KEPT,
    MESSAGE_ID,
    PREFIX,
    RETRIES,
    RETRY_AT,
    new_message_id,
)
from policies.scheduler import JOB_ID, Occurrence, Series, next_occurrence

SERIES = PREFIX + "series-"
JOB = SERIES + "job"  # the series' id: the id of the message the application sent
DELAY = SERIES + "delay"
PERIOD = SERIES + "period"
REPEAT = SERIES + "repeat"
CRON = SERIES + "cron"
LEFT = SERIES + "left"  # copies left in this run after this one
FIRED = SERIES + "fired"  # epoch ms of the cron firing this run started at
NUMBER = SERIES + "number"  # which copy of the series this is, from 0
COPY_ID = SERIES + "copy-id"  # this copy's own message id, kept if it is released twice
# Copies remembered as released (``SeriesMemory``): many more than are released within the time a
# duplicate copy can take to come due after its twin.
SERIES_MEMORY = 65_536


def check_cron(entry: str) -> str | None:
    """None when ``entry`` is a 5-field cron entry, else what is wrong with it."""
    if len(entry.split()) != 5:
        return "it needs 5 fields (minute hour day-of-month month day-of-week)"
    try:
        croniter(entry)
    except (ValueError, KeyError) as error:  # croniter's errors are ValueErrors
        return str(error) or type(error).__name__
    return None


def cron_next(entry: str, after_ms: int) -> int:
    """The first time ``entry`` fires strictly after ``after_ms`` (epoch ms, UTC)."""
    start = datetime.datetime.fromtimestamp(after_ms / 1000, tz=datetime.UTC)
    return round(croniter(entry, start).get_next(float) * 1000)


def series_headers(series: Series, job: str, first: Occurrence) -> list[tuple[str, str]]:
    """The headers the first staged copy of a series carries besides its envelope."""
    out = [(JOB, job), (DELAY, str(series.delay_ms)), (PERIOD, str(series.period_ms)),
           (REPEAT, str(series.repeat)), (LEFT, str(first.left)), (NUMBER, "0"),
           (COPY_ID, new_message_id())]
    if series.cron is not None:
        out.append((CRON, series.cron))
    if first.fired_ms is not None:
        out.append((FIRED, str(first.fired_ms)))
    return out


def is_series(headers: Mapping[str, str]) -> bool:
    return JOB in headers


def key_of(headers: Mapping[str, str]) -> tuple[str, str]:
    """Which copy of which series a staged copy is (copies of one key are one occurrence)."""
    return headers[JOB], headers.get(NUMBER, "0")


def _series(headers: Mapping[str, str]) -> tuple[Series, Occurrence]:
    fired = headers.get(FIRED)
    series = Series(int(headers.get(DELAY, "0")), int(headers.get(PERIOD, "0")),
                    int(headers.get(REPEAT, "0")), headers.get(CRON))
    return series, Occurrence(int(headers[DUE]), int(headers.get(LEFT, "0")),
                              int(fired) if fired else None)


def next_copy(headers: Mapping[str, str], now_ms: int) -> dict[str, str] | None:
    """The headers of the staged copy after the one with ``headers``; None when the series is
    over. Its time to live is moved on by as much as its due time."""
    series, current = _series(headers)
    after = next_occurrence(series, current, now_ms, cron_next)
    if after is None:
        return None
    out = {n: v for n, v in headers.items()
           if n not in FRAME_ONLY and n not in (RETRY_AT, RETRIES, KEPT)}
    out[DUE] = str(after.due_ms)
    out[ENTERED] = str(now_ms)
    out[LEFT] = str(after.left)
    if after.fired_ms is not None:
        out[FIRED] = str(after.fired_ms)
    out[NUMBER] = str(int(headers.get(NUMBER, "0")) + 1)
    out[COPY_ID] = new_message_id()
    expires = headers.get(EXPIRES)
    if expires:
        out[EXPIRES] = str(int(expires) + after.due_ms - current.due_ms)
    return out


def as_copy(released: dict[str, str], staged: Mapping[str, str],
            id_header: str | None) -> dict[str, str]:
    """A released copy of a series, as ActiveMQ delivers one: its own message id, and the
    ``scheduledJobId`` of its series."""
    copy_id = staged.get(COPY_ID) or new_message_id()
    released[MESSAGE_ID] = copy_id
    if id_header:
        released[id_header] = copy_id
    released[JOB_ID] = staged[JOB]
    if "expires" in released and staged.get(EXPIRES):  # an absolute TTL, moved on
        released["expires"] = staged[EXPIRES]
    return released


def summary(headers: Mapping[str, str]) -> str:
    """What remains of the series a staged copy belongs to, for ``staged list`` ("" when it is
    not a copy of one): this copy and how many after it, or its cron entry."""
    if JOB not in headers:
        return ""
    left, period, cron = headers.get(LEFT, "0"), headers.get(PERIOD, "0"), headers.get(CRON)
    text = f"copy {int(headers.get(NUMBER, '0')) + 1}, then {left} more"
    if left != "0":
        text += f" every {period} ms"
    if cron:
        text += f", the run again at each firing of cron {cron!r} until removed"
    return text


class SeriesMemory:
    """Which copies of series an engine released (False) and replaced by their next copy
    (True), a bounded memory, oldest first out; and those the work being settled continues."""

    def __init__(self) -> None:
        self.copies: collections.OrderedDict[tuple[str, str], bool] = collections.OrderedDict()
        self.batch: set[tuple[str, str]] = set()  # continued by the work being built

    def remember(self, key: tuple[str, str], continued: bool) -> None:
        self.copies[key] = continued
        self.copies.move_to_end(key)
        if len(self.copies) > SERIES_MEMORY:
            self.copies.popitem(last=False)

"""JMS 2.0 delivery delay on a send, validated with IBM MQ's rules.

A pure policy: the STOMP relay and the AMQP front-end call :func:`delay_of` on every send that
carries a delay header and get back either ``None`` (relay the message unchanged), a
:class:`DelayedSend` (stage it until ``due_ms``), or a :class:`~policies.errors.Refused`
carrying the MQRC reason to report. No I/O and no clock: the caller passes ``now_ms``.

Checks, in this order (DESIGN.md, "Delivery delay contract"):

1. every delay header present is a whole number (``policies.properties.whole_number``: an
   integer, or one with a zero fraction), not negative, at most ``max_delay_ms`` from now,
   and all of them agree                               -> else MQRC_OPTIONS_ERROR (2046);
2. no delay (relative 0, or an absolute time not after now) -> ``None``; no other rule applies;
3. ``JMSXGroupID`` set                                    -> MQRC_OPTIONS_ERROR;
4. ``JMS_IBM_RETAIN`` = 1 (or true: ``properties.flag``)  -> MQRC_OPTIONS_ERROR;
5. destination matches a disabled pattern                 -> MQRC_OPTIONS_ERROR;
6. TTL malformed, or a non-zero TTL expiring at or before the due time -> MQRC_EXPIRY_ERROR (2013)
   (IBM MQ refuses one shorter than the delay; one equal to it could never be delivered).

Destination patterns (:func:`matches`) follow the ActiveMQ/RabbitMQ wildcard conventions over
dot-separated segments, matched against which queue or topic a destination is on the broker
(:mod:`policies.naming`); see that function.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from policies.errors import ConfigError, Refused
from policies.naming import BROKERS, check_pattern, compile_pattern, match_name, named
from policies.properties import flag, whole_number
from policies.reasons import MQRC_EXPIRY_ERROR, MQRC_OPTIONS_ERROR

__all__ = [
    "ABSOLUTE_TTL_HEADER",
    "GROUP_HEADER",
    "MIN_MAX_DELAY_MS",
    "RELATIVE_TTL_HEADER",
    "RETAIN_HEADER",
    "DelayConfig",
    "DelayedSend",
    "delay_of",
    "matches",
]

DAY_MS = 24 * 3600 * 1000
# JMS applications routinely schedule a month ahead; a configuration may not forbid that.
MIN_MAX_DELAY_MS = 30 * DAY_MS

ABSOLUTE_TTL_HEADER = "expires"  # absolute epoch ms, ActiveMQ style; "0" = never
RELATIVE_TTL_HEADER = "expiration"  # relative ms, RabbitMQ style; "0" = never (JMS TTL 0)
GROUP_HEADER = "JMSXGroupID"
RETAIN_HEADER = "JMS_IBM_RETAIN"
RETAIN_PUBLICATION = "1"

_INTEGER = re.compile(r"-?[0-9]+")
# Longer digit strings are far beyond any epoch-ms value; clamp them rather than feed int() a
# string that Python's int-conversion limit would reject.
_MAX_DIGITS = 20
_HUGE = 10**_MAX_DIGITS


@dataclass(frozen=True, slots=True)
class DelayConfig:
    """Which headers ask for a delay, how far ahead, and where delay is switched off."""

    relative_headers: tuple[str, ...] = (
        "x-delay",
        "AMQ_SCHEDULED_DELAY",
    )  # relative ms
    # absolute epoch ms: JMS 2.0's, and Artemis' (what applications leaving Artemis send)
    absolute_headers: tuple[str, ...] = ("JMSDeliveryTime", "_AMQ_SCHED_DELIVERY")
    max_delay_ms: int = 400 * DAY_MS
    disabled_destinations: tuple[str, ...] = ()  # patterns, see matches()
    staging_prefix: str = "jms-bridge.staging"
    broker: str = "rabbitmq"  # whose destination forms the patterns are read in

    def __post_init__(self) -> None:
        names = self.delay_header_names()
        if not names or any(not name for name in names):
            raise ConfigError("delay header names must be non-empty")
        if len(set(names)) != len(names):
            raise ConfigError(f"a delay header is configured twice: {names!r}")
        if self.max_delay_ms < MIN_MAX_DELAY_MS:
            raise ConfigError(
                f"max_delay_ms={self.max_delay_ms} is below the minimum of "
                f"{MIN_MAX_DELAY_MS} ms (30 days)"
            )
        if self.broker not in BROKERS:
            raise ConfigError(f"unknown broker {self.broker!r} (known: {', '.join(BROKERS)})")
        for pattern in self.disabled_destinations:
            check_pattern(pattern)

    def delay_header_names(self) -> tuple[str, ...]:
        """Every header that asks for a delay, for stripping before release."""
        return self.relative_headers + self.absolute_headers


class DelayedSend(NamedTuple):  # (immutable; cheaper to make than a frozen dataclass)
    """A send accepted for staging."""

    delay_ms: int  # > 0
    due_ms: int  # epoch ms when it may first be delivered
    sent_ms: int  # now_ms at the send
    expires_ms: int | None  # absolute epoch ms when it expires; None = never
    header: str  # which header asked for the delay


def delay_of(
    headers: Mapping[str, str], destination: str, now_ms: int, config: DelayConfig,
    *, series_due: tuple[str, int] | None = None,
) -> DelayedSend | None:
    """Decide what to do with a send: ``None`` = relay unchanged, else stage it.

    ``series_due``: the header that asks for a scheduler series (``policies.scheduler``) and
    its first copy's due time: staged then even without a delay (due now), by the same rules.
    Raises :class:`~policies.errors.Refused` when IBM MQ's rules refuse the send.
    """
    if series_due is not None:
        header, due_ms = series_due
        due_ms = max(due_ms, now_ms)
        delay_ms = due_ms - now_ms
    else:
        asked = _requested_delay(headers, now_ms, config)
        if asked is None:
            return None
        header, delay_ms = asked
        due_ms = now_ms + delay_ms
    value = headers[header]

    get = headers.get
    group = get(GROUP_HEADER)
    if group:
        raise Refused(
            MQRC_OPTIONS_ERROR,
            f"delivery delay is not supported for messages in a group "
            f"({GROUP_HEADER}={_show(group)}, {header}={_show(value)})",
        )
    retain = get(RETAIN_HEADER)
    if retain is not None and flag(retain):
        raise Refused(
            MQRC_OPTIONS_ERROR,
            f"delivery delay is not supported for retained publications "
            f"({RETAIN_HEADER}={_show(retain)}, {header}={_show(value)})",
        )
    canonical = named(destination, config.broker) if config.disabled_destinations else None
    for pattern in config.disabled_destinations:
        if compile_pattern(pattern, config.broker).matches(canonical):
            raise Refused(
                MQRC_OPTIONS_ERROR,
                f"delivery delay is disabled for destination {_show(destination)} "
                f"(pattern {pattern!r}, {header}={_show(value)})",
            )

    if ABSOLUTE_TTL_HEADER in headers or RELATIVE_TTL_HEADER in headers:
        expires_ms = _expiry(headers, now_ms, delay_ms, due_ms)
    else:
        expires_ms = None  # (most sends: no TTL to check)
    return DelayedSend(
        delay_ms=delay_ms,
        due_ms=due_ms,
        sent_ms=now_ms,
        expires_ms=expires_ms,
        header=header,
    )


def matches(pattern: str, destination: str, broker: str = "rabbitmq") -> bool:
    """Whether ``destination`` (as the client wrote it, e.g. ``/queue/orders.eu``) fits ``pattern``
    on ``broker``.

    The name (the queue's or topic's, :mod:`policies.naming`) is split into dot-separated
    segments:

    - a literal segment matches itself (case-sensitive);
    - ``*`` matches exactly one segment;
    - ``>`` or ``#`` as the last segment matches one or more remaining segments.

    A pattern with a prefix covers that kind of destination however a client names it
    (``/queue/orders.*`` matches RabbitMQ's ``/amq/queue/orders.eu`` and the bare
    ``orders.eu``, and no topic); a pattern without ``/`` matches the name in every form and
    kind (``orders.*`` matches ``/queue/orders.eu`` and ``/topic/orders.eu``). Wildcards in
    the prefix are literal. A wildcard anywhere but a whole segment is literal; ``>``/``#``
    before the end is a :class:`~policies.errors.ConfigError`.
    """
    return match_name(pattern, destination, broker)


def _requested_delay(
    headers: Mapping[str, str], now_ms: int, config: DelayConfig
) -> tuple[str, int] | None:
    """The header asking for a delay and the delay in ms, or None for no delay."""
    found: list[tuple[str, int]] = []
    for name in config.relative_headers:
        if name in headers:
            found.append((name, _delay_value(name, headers[name], config.max_delay_ms)))
    for name in config.absolute_headers:
        if name in headers:
            at = _delay_value(name, headers[name], None)
            delay = max(0, at - now_ms)  # JMS: a delivery time in the past means now
            if delay > config.max_delay_ms:
                raise Refused(
                    MQRC_OPTIONS_ERROR,
                    f"{name}={_show(headers[name])} is {delay} ms from now, more than the "
                    f"maximum delivery delay of {config.max_delay_ms} ms",
                )
            found.append((name, delay))
    if not found:
        return None
    first_name, first_delay = found[0]
    for name, delay in found[1:]:
        if delay != first_delay:
            raise Refused(
                MQRC_OPTIONS_ERROR,
                f"conflicting delivery delays: {first_name}={_show(headers[first_name])} "
                f"({first_delay} ms) and {name}={_show(headers[name])} ({delay} ms)",
            )
    if first_delay == 0:
        return None
    return first_name, first_delay


def _delay_value(name: str, value: str, max_delay_ms: int | None) -> int:
    """Parse one delay header; refuse it when malformed, negative or too far ahead."""
    number = whole_number(value)
    if number is None:
        raise Refused(MQRC_OPTIONS_ERROR,
                      f"{name}={_show(value)} is not a whole number of milliseconds")
    if number < 0:
        raise Refused(MQRC_OPTIONS_ERROR, f"{name}={_show(value)} is negative")
    if max_delay_ms is not None and number > max_delay_ms:
        raise Refused(
            MQRC_OPTIONS_ERROR,
            f"{name}={_show(value)} is more than the maximum delivery delay of {max_delay_ms} ms",
        )
    return number


def _expiry(headers: Mapping[str, str], now_ms: int, delay_ms: int, due_ms: int) -> int | None:
    """Absolute expiry of a delayed send, or None; refuse a TTL that ends at or before the due
    time (one that ends at it would expire when due, never delivered)."""
    expiries: list[tuple[int, str]] = []
    for name, relative in ((ABSOLUTE_TTL_HEADER, False), (RELATIVE_TTL_HEADER, True)):
        if name not in headers:
            continue
        value = headers[name]
        number = _parse_int(value)
        if number is None or number < 0:
            raise Refused(
                MQRC_EXPIRY_ERROR,
                f"{name}={_show(value)} is not a valid expiry (a non-negative decimal integer)",
            )
        if number == 0:  # never expires
            continue
        expiries.append((now_ms + number if relative else number, name))
    if not expiries:
        return None
    expires_ms, name = min(expiries)
    if expires_ms <= due_ms:
        ttl = expires_ms - now_ms
        shown = f"{name}={_show(headers[name])}"
        if ttl <= 0:
            detail = (
                f"{shown}: the message has already expired, before its delivery delay {delay_ms} ms"
            )
        else:
            detail = (
                f"{shown}: time to live {ttl} ms is not longer than the delivery delay "
                f"{delay_ms} ms"
            )
        raise Refused(MQRC_EXPIRY_ERROR, detail)
    return expires_ms


def _parse_int(value: str) -> int | None:
    """A time to live: a plain ASCII decimal integer (optional leading ``-``), else None;
    clamps huge values. Stricter than a delay: the TTL headers are the brokers' own, and
    RabbitMQ refuses an ``expiration`` with a fraction."""
    if len(value) <= _MAX_DIGITS and value.isdigit() and value.isascii():
        return int(value)  # (most values: no sign, and too short to clamp)
    if not _INTEGER.fullmatch(value):
        return None
    negative = value.startswith("-")
    digits = value.lstrip("-").lstrip("0") or "0"
    number = _HUGE if len(digits) > _MAX_DIGITS else int(digits)
    return -number if negative else number


def _show(value: str) -> str:
    """A header value quoted for an error detail, cut short so a hostile value cannot flood it."""
    if len(value) > 64:
        return repr(value[:64]) + "..."
    return repr(value)

"""Message-retry: how often, and how far apart, a put the broker refused is tried again.

IBM MQ's channels have a message-retry count and interval for an MQPUT refused for a reason
that could pass ("because the queue is full, or is inhibited for puts"); the bridge does the
same for a staged message whose target refuses it when it is due. Configured under
``message-retry:``, per destination pattern like the redelivery policies::

    message-retry:
      count: 10              # the default for every destination (IBM MQ's MRRTY is 10)
      interval-ms: 1000      # (IBM MQ's MRTMR is 1000)
      "/queue/orders.*": {count: 30, interval-ms: 2000}
      "/queue/audit": {count: 0}           # never retried

``count`` and ``interval-ms`` at the top are the default (for a destination literally named
``count``, write its prefix: ``/queue/count``); every other key is a destination pattern with
the wildcards of :func:`policies.delay.matches` (read as which queue or topic it names on the
broker, :mod:`policies.naming`), the most specific winning. The text form
``COUNT:INTERVAL_MS`` (``10:1000``, a flag's or an environment variable's value) sets the
default only. Pure: the engine decides with :func:`can_pass` and the table, and waits by
re-staging the message, so no other release waits for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from policies.errors import ConfigError
from policies.naming import check_pattern, compile_pattern, named
from policies.reasons import MQRC_PUT_INHIBITED, MQRC_Q_FULL, Reason
from policies.redelivery.table import same_patterns, specificity

__all__ = [
    "DEFAULT_RETRY",
    "MAX_COUNT",
    "MAX_INTERVAL_MS",
    "PASSING",
    "MessageRetry",
    "RetryTable",
    "can_pass",
    "compile_retry",
    "parse_retry_text",
]

# Refusals that can pass: the target is full or put-inhibited now, and may not be later.
# Not authorized, unknown object, too big, a bad property: the same put fails every time.
PASSING: frozenset[Reason] = frozenset({MQRC_Q_FULL, MQRC_PUT_INHIBITED})
MAX_COUNT = 999_999_999  # IBM MQ's MRRTY range
MAX_INTERVAL_MS = 999_999_999  # IBM MQ's MRTMR range
_KEYS = ("count", "interval-ms")


@dataclass(frozen=True, slots=True)
class MessageRetry:
    """Try a refused put ``count`` more times, ``interval_ms`` apart."""

    count: int = 10
    interval_ms: int = 1000

    def __str__(self) -> str:
        return f"{self.count}:{self.interval_ms}"


DEFAULT_RETRY = MessageRetry()


def can_pass(reason: Reason) -> bool:
    """Whether a put refused for ``reason`` is worth trying again."""
    return reason in PASSING


@dataclass(frozen=True, slots=True)
class RetryTable:
    default: MessageRetry = DEFAULT_RETRY
    entries: tuple[tuple[str, MessageRetry], ...] = ()
    broker: str = "rabbitmq"  # whose destination forms the patterns are read in

    def lookup(self, destination: str) -> MessageRetry:
        canonical = named(destination, self.broker)
        found = [(p, r) for p, r in self.entries
                 if compile_pattern(p, self.broker).matches(canonical)]
        if not found:
            return self.default
        return max(found, key=lambda entry: specificity(entry[0]))[1]

    def on(self, broker: str, *, source: str = "configuration") -> RetryTable:
        """This table read in ``broker``'s destination forms; a ConfigError when two patterns
        name the same destinations there."""
        clash = same_patterns([p for p, _ in self.entries], broker)
        if clash is not None:
            raise ConfigError(f"{source}: message-retry: {clash[0]!r} and {clash[1]!r} are the "
                              f"same pattern on {broker}")
        return replace(self, broker=broker)


def _whole(value: object, what: str, top: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ConfigError(f"{what}: expected a whole number from 0 to {top}, got {value!r}")
    text = str(value).strip()
    if not (text.isascii() and text.isdigit()) or int(text) > top:
        raise ConfigError(f"{what}: expected a whole number from 0 to {top}, got {value!r}")
    return int(text)


def _retry(value: Mapping[object, object], where: str, base: MessageRetry) -> MessageRetry:
    unknown = [k for k in value if k not in _KEYS]
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (known: count, interval-ms)")
    count = base.count
    interval = base.interval_ms
    if "count" in value:
        count = _whole(value["count"], f"{where}: count", MAX_COUNT)
    if "interval-ms" in value:
        interval = _whole(value["interval-ms"], f"{where}: interval-ms", MAX_INTERVAL_MS)
    return MessageRetry(count, interval)


def parse_retry_text(text: str, what: str) -> MessageRetry:
    """``COUNT:INTERVAL_MS`` (``10:1000``)."""
    count, sep, interval = text.strip().partition(":")
    if not sep:
        raise ConfigError(f"{what}: expected COUNT:INTERVAL_MS (10:1000), got {text!r}")
    return MessageRetry(_whole(count, f"{what}: count", MAX_COUNT),
                        _whole(interval, f"{what}: interval-ms", MAX_INTERVAL_MS))


def compile_retry(value: object, *, source: str = "configuration") -> RetryTable:
    """The ``message-retry:`` value: a mapping (see the module docstring), ``COUNT:INTERVAL_MS``
    text, or None (the defaults). Every error is one line naming ``source``."""
    where = source if "message-retry" in source else f"{source}: message-retry"
    if value is None:
        return RetryTable()
    if isinstance(value, str):
        return RetryTable(parse_retry_text(value, where))
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: expected COUNT:INTERVAL_MS or a mapping of count, "
                          f"interval-ms and destination patterns, got {value!r}")
    default = _retry({k: v for k, v in value.items() if k in _KEYS}, where, DEFAULT_RETRY)
    entries: list[tuple[str, MessageRetry]] = []
    for pattern, item in value.items():
        if pattern in _KEYS:
            continue
        if not isinstance(pattern, str) or not pattern:
            raise ConfigError(f"{where}: a destination pattern must be text, got {pattern!r}")
        try:
            check_pattern(pattern)
        except ConfigError as error:
            raise ConfigError(f"{where}: {pattern!r}: {error}") from None
        if not isinstance(item, Mapping):
            raise ConfigError(f"{where}: {pattern!r}: expected {{count: N, interval-ms: MS}}, "
                              f"got {item!r}")
        entries.append((pattern, _retry(item, f"{where}: {pattern!r}", default)))
    return RetryTable(default, tuple(entries))

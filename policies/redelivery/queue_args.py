"""A queue's own delayed-retry arguments, as RabbitMQ 4.3 quorum queues and LavinMQ take them,
compiled into the canonical :class:`Policy`.

RabbitMQ 4.3 (quorum queues, "Delayed Retry"):

- ``x-delayed-retry-type``: ``disabled`` (the default), ``all``, ``failed`` or ``returned``;
- ``x-delayed-retry-min``: the first wait, in ms (required when enabled);
- ``x-delayed-retry-max``: the longest wait, in ms (optional);
- the wait is ``min(min * delivery_count, max)``: linear.

LavinMQ ("Automatic Retries"): ``x-delayed-retry-min`` alone enables it (ms, at least 1);
``x-delayed-retry-max`` caps a wait; ``x-delayed-retry-multiplier`` shapes it: absent, linear
(``min * attempt``); 1, constant; 2 or more, exponential (``min * multiplier ** (attempt - 1)``).

Both: ``x-delivery-limit`` (default 20; RabbitMQ's -1 is no limit) is how many redeliveries a
message gets: the delivery after ``limit`` failures does not come, the message is dead-lettered
through ``x-dead-letter-exchange`` with ``x-dead-letter-routing-key`` (default: the message's
own routing key, taken here as the queue's name, what a publish to the queue through the
default exchange carries), or dropped when the queue has no dead-letter exchange.

The bridge counts every NACK, reject or rollback as a failed delivery (its
``JMSXDeliveryCount``), so ``failed`` and ``returned`` take the schedule as ``all`` does.
"""

from __future__ import annotations

from collections.abc import Mapping

from policies.errors import ConfigError
from policies.redelivery.model import Backoff, Delete, MoveTo, Policy, Rule, Step

__all__ = ["DEFAULT_DELIVERY_LIMIT", "DIALECT", "RETRY_ARGUMENTS", "parse_queue_args"]

DIALECT = "queue arguments"
DEFAULT_DELIVERY_LIMIT = 20  # RabbitMQ 4.x quorum queues; LavinMQ when retries are enabled
TYPES = ("disabled", "all", "failed", "returned")
# The arguments a policy is made of, in the order its text names them.
RETRY_ARGUMENTS = ("x-delayed-retry-type", "x-delayed-retry-min", "x-delayed-retry-max",
                   "x-delayed-retry-multiplier", "x-delivery-limit", "x-dead-letter-exchange",
                   "x-dead-letter-routing-key")


def _integer(args: Mapping[str, object], name: str, low: int) -> int | None:
    """An integer argument (a management API may give it as text), at least ``low``."""
    value = args.get(name)
    if value is None:
        return None
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
        number = int(value)
    if number is None or number < low:
        raise ConfigError(f"queue argument {name}: expected an integer of at least {low}, got "
                          f"{value!r}")
    return number


def _text(args: Mapping[str, object], name: str) -> str | None:
    value = args.get(name)
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    raise ConfigError(f"queue argument {name}: expected text, got {value!r}")


def parse_queue_args(args: Mapping[str, object], queue: str) -> Policy | None:
    """The policy ``queue``'s arguments declare, or None when they declare no delayed retry. A
    ConfigError names the argument at fault."""
    kind = _text(args, "x-delayed-retry-type")
    if kind is not None:
        kind = kind.strip().lower()
        if kind not in TYPES:
            raise ConfigError(f"queue argument x-delayed-retry-type: expected one of "
                              f"{', '.join(TYPES)}, got {kind!r}")
        if kind == "disabled":
            return None
    minimum = _integer(args, "x-delayed-retry-min", 1)
    if minimum is None:
        if kind is None:
            return None  # neither broker's delayed retry
        raise ConfigError(f"queue argument x-delayed-retry-min: required with "
                          f"x-delayed-retry-type {kind}")
    maximum = _integer(args, "x-delayed-retry-max", 1)
    multiplier = _integer(args, "x-delayed-retry-multiplier", 1)
    limit = _integer(args, "x-delivery-limit", -1)
    if limit is None:
        limit = DEFAULT_DELIVERY_LIMIT
    exchange = _text(args, "x-dead-letter-exchange")
    key = _text(args, "x-dead-letter-routing-key")
    wait = (Backoff(minimum, max_ms=maximum, linear=True) if multiplier is None
            else Backoff(minimum, float(multiplier), max_ms=maximum))
    end: Rule = Delete()
    if exchange is not None:
        key = queue if key is None else key
        end = (MoveTo("exact", f"/amq/queue/{key}") if exchange == ""
               else MoveTo("exact", f"/exchange/{exchange}/{key}"))
    steps: tuple[Step, ...] = ((Step(0, wait),) if limit != 0 else ())
    if limit >= 0:
        steps = (*steps, Step(limit, end))
    text = " ".join(f"{name}={args[name]}" for name in RETRY_ARGUMENTS if name in args)
    return Policy(DIALECT, text, steps)

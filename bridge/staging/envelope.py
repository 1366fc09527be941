"""The staged copy of a delayed message, and how the original is restored from it.

As IBM MQ's SYSTEM.DDELAY.LOCAL.QUEUE does it: the staged copy has a new message id and its
correlation id is the original message id; everything needed to release it travels in headers
of its own, so nothing about a pending message lives only in the bridge's memory.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from adapters.base import StagedFormat
from policies.reasons import Reason

PREFIX = "jms-bridge-"
TARGET = PREFIX + "target"  # the destination the application sent to
DUE = PREFIX + "due"  # epoch ms, the earliest delivery
SENT = PREFIX + "sent"  # epoch ms, when the application sent it
ENTERED = PREFIX + "entered"  # epoch ms, when it entered the queue it is on now
# Epoch ms when it expires, absent = never: on a staged copy, and on a message with a time to live
# that the bridge passed on (stamped on a send with a relative TTL, kept on a released message
# and on every copy), so that a copy's TTL still counts from the original send.
EXPIRES = PREFIX + "expires"
MESSAGE_ID = PREFIX + "message-id"  # the original message id
# On a staged copy: the login of the client that sent it (whose the scheduler's management
# destination lets browse and remove it).
SENDER = PREFIX + "sender"
# On the released message: its due time, epoch ms (what JMS 2.0 calls its JMSDeliveryTime: the
# time the bridge took the SEND plus the delay, or the JMSDeliveryTime it asked for).
DELIVERY_TIME = PREFIX + "delivery-time"
CORRELATION_ID = PREFIX + "correlation-id"  # the application's own correlation id, if it set one
# How many times the message has been delivered to a consumer (JMSXDeliveryCount) before this
# copy: it travels with the message, on its re-staged copy, never only in a bridge's memory.
DELIVERY_COUNT = PREFIX + "delivery-count"
# On a dead letter: how many deliveries were tried before it was dead-lettered. Not its
# delivery-count: the dead-letter destination is a new one (as on WebLogic and ActiveMQ), where
# its first delivery is JMSXDeliveryCount 1 and a policy there counts its own deliveries.
DELIVERIES_TRIED = PREFIX + "deliveries-tried"
# Why a message left the normal path (a dead letter, an undeliverable release), on its copy.
REASON = PREFIX + "reason"  # the MQRC (or MQFB) name
REASON_CODE = PREFIX + "reason-code"
REASON_TEXT = PREFIX + "reason-text"  # the broker's own words, or the policy's
FAILED_AT = PREFIX + "failed-at"  # epoch ms
ORIGINAL_DESTINATION = PREFIX + "original-destination"  # where it was going (STOMP form)
# The same in TIBCO's form, for selectors on the undelivered queue: Queue[orders], Topic[prices].
ORIGINAL_JMS_DESTINATION = PREFIX + "original-jms-destination"
POLICY = PREFIX + "policy"  # the redelivery policy that decided: "<dialect>: <text>"
# Message-retry (``policies.retry``): puts of a due message its target refused so far, and when
# to try again (epoch ms; its due time, and so its JMSDeliveryTime, is kept).
RETRIES = PREFIX + "retries"
RETRY_AT = PREFIX + "retry-at"
# Times its dead-letter destination refused it (it was kept on the staging queues each time).
KEPT = PREFIX + "kept"
# On a message the broker expired on its own: the queue it expired on (STOMP form).
EXPIRED_ON = PREFIX + "expired-on"
# On a report message (``policies.reports``): exception | expiration.
REPORT = PREFIX + "report"
TTL_HEADER = PREFIX + "ttl-header"  # which header carried the TTL: "expires" or "expiration"
ORIGINAL_TTL = PREFIX + "ttl-value"  # its value as sent

# The target is a delayed-message exchange: the release is published mandatory, so that a
# message no queue takes goes to the undeliverable queue instead of nowhere.
MANDATORY = PREFIX + "mandatory"

# Headers that belong to one frame, not to the message: the adapter sets its own.
FRAME_ONLY = frozenset({"receipt", "transaction", "content-length", "destination"})


# STOMP headers that brokers map to message properties of fixed types and sizes (AMQP short
# strings, octets): a value the broker cannot take makes the whole message unputtable.
PROPERTY_HEADERS = frozenset({
    "message-id", "amqp-message-id", "correlation-id", "reply-to", "content-type",
    "content-encoding", "type", "user-id", "app-id", "priority", "expiration", "expires",
    "persistent", "timestamp",
})
ORIGINAL = PREFIX + "original-"  # a property header kept as a plain header, for an operator

def as_plain_headers(headers: dict[str, str]) -> dict[str, str]:
    """A copy whose property headers become plain ones (``jms-bridge-original-<name>``): what a
    message the broker refused for a property value can still be kept as."""
    return {
        (ORIGINAL + name if name in PROPERTY_HEADERS else name): value
        for name, value in headers.items()
    }


class _Ids:
    """Message ids: a random 128-bit prefix per process and a counter, unique as a uuid4 each
    but without its system call per id (two per delayed SEND). A forked child draws its own
    prefix."""

    def __init__(self) -> None:
        self.reset()
        os.register_at_fork(after_in_child=self.reset)

    def reset(self) -> None:
        self.prefix = f"ID:jms-bridge-{uuid.uuid4().hex}-"
        self.count = itertools.count(1)

    def next(self) -> str:
        return f"{self.prefix}{next(self.count)}"


_ids = _Ids()


def new_message_id() -> str:
    return _ids.next()


@dataclass(frozen=True, slots=True)
class Staged:
    """What the engine needs of a staged message, read from its headers."""

    target: str
    due_ms: int
    sent_ms: int
    entered_ms: int
    expires_ms: int | None
    message_id: str
    mandatory: bool = False  # (``MANDATORY``)

    @classmethod
    def of(cls, headers: dict[str, str]) -> Staged:
        """Raises KeyError/ValueError for a message that is not a staged copy. A copy waiting
        to be put again (message-retry) is due at its retry time."""
        expires = headers.get(EXPIRES)
        retry_at = headers.get(RETRY_AT)
        return cls(
            target=headers[TARGET],
            due_ms=int(retry_at) if retry_at else int(headers[DUE]),
            sent_ms=int(headers[SENT]),
            entered_ms=int(headers[ENTERED]),
            expires_ms=int(expires) if expires else None,
            message_id=headers[MESSAGE_ID],
            mandatory=MANDATORY in headers,
        )


_DROPPED: dict[tuple[tuple[str, ...], str | None], frozenset[str]] = {}


def _dropped(drop: tuple[str, ...], id_header: str | None) -> frozenset[str]:
    """The headers a staged copy does not keep, made once for each set of delay headers."""
    found = _DROPPED.get((drop, id_header))
    if found is None:
        found = frozenset({*drop, "destination", "expires", "expiration", "correlation-id",
                           *((id_header,) if id_header else ())})
        if len(_DROPPED) < 64:
            _DROPPED[(drop, id_header)] = found
    return found


def staged_headers(
    headers: Mapping[str, str] | Iterable[tuple[str, str]],
    fmt: StagedFormat,
    *,
    target: str,
    staging_destination: str,
    due_ms: int,
    sent_ms: int,
    expires_ms: int | None,
    drop: Iterable[str],
) -> list[tuple[str, str]]:
    """The headers of the staged copy of a SEND: keeps receipt and transaction (so that the
    broker's RECEIPT confirms the staging and COMMIT/ABORT decide it), drops the delay headers
    named in ``drop`` and the TTL (it is enforced at release, and carried here). ``headers``:
    a mapping, or (name, value) pairs of which the first of a name counts."""
    id_header = fmt.message_id_header
    first: Mapping[str, str]
    if isinstance(headers, dict):  # (a view's headers: no name twice already)
        first = headers
    elif isinstance(headers, Mapping):
        first = dict(headers)
    else:
        pairs: dict[str, str] = {}
        for name, value in headers:
            pairs.setdefault(name, value)  # the first of a repeated header counts
        first = pairs
    # A message the bridge released before (and now stages again) keeps its original id.
    original_id = (
        first.get(MESSAGE_ID) or (first.get(id_header) if id_header else None) or new_message_id()
    )
    dropped = _dropped(tuple(drop), id_header)
    out = [("destination", staging_destination)]
    out += [(n, v) for n, v in first.items() if n not in dropped and not n.startswith(PREFIX)]
    sent = str(sent_ms)
    out += [
        (TARGET, target),
        (DUE, str(due_ms)),
        (SENT, sent),
        (ENTERED, sent),
        (MESSAGE_ID, original_id),
        ("correlation-id", original_id),
    ]
    if id_header:
        out.append((id_header, new_message_id()))
    if "correlation-id" in first:
        out.append((CORRELATION_ID, first["correlation-id"]))
    if expires_ms is not None:
        out.append((EXPIRES, str(expires_ms)))
    for ttl in ("expires", "expiration"):
        if ttl in first:
            out += [(TTL_HEADER, ttl), (ORIGINAL_TTL, first[ttl])]
            break
    return out


def hop_headers(headers: dict[str, str], *, now_ms: int) -> dict[str, str]:
    """The headers of a staged copy moved to its next queue: only the entry time changes."""
    out = {n: v for n, v in headers.items() if n not in FRAME_ONLY}
    out[ENTERED] = str(now_ms)
    return out


def released_headers(headers: dict[str, str], fmt: StagedFormat, *, now_ms: int) -> dict[str, str]:
    """The headers of the message put to its target: the application's message as it sent it,
    with its original message id and correlation id, its delivery time and the TTL that
    remains (and its absolute expiry, for a copy made of it later)."""
    out = {
        n: v for n, v in headers.items()
        if not n.startswith(PREFIX) and n not in FRAME_ONLY and n != "correlation-id"
    }
    id_header = fmt.message_id_header
    out[MESSAGE_ID] = headers[MESSAGE_ID]
    if DELIVERY_COUNT in headers:
        out[DELIVERY_COUNT] = headers[DELIVERY_COUNT]
    out[DELIVERY_TIME] = headers[DUE]
    if id_header:
        out[id_header] = headers[MESSAGE_ID]
    if CORRELATION_ID in headers:
        out["correlation-id"] = headers[CORRELATION_ID]
    ttl_header = headers.get(TTL_HEADER)
    expires = headers.get(EXPIRES)
    if ttl_header == "expires":
        out["expires"] = headers[ORIGINAL_TTL]
    elif ttl_header == "expiration" and expires:
        out["expiration"] = str(max(int(expires) - now_ms, 1))
    if expires:
        out[EXPIRES] = expires
    return out


def expiry_ms(headers: Mapping[str, str], now_ms: int) -> int | None:
    """When a delivered message expires, epoch ms, or None for never: the earliest of its
    absolute expiry (``jms-bridge-expires``, ``expires``) and its relative TTL (``expiration``)
    counted from ``now_ms`` (the best there is for a message the bridge never stamped)."""
    found: int | None = None
    for name, relative in ((EXPIRES, False), ("expires", False), ("expiration", True)):
        value = headers.get(name)
        if not value or len(value) > 18 or not (value.isascii() and value.isdigit()):
            continue  # absent, or not a time (a malformed TTL never expires here)
        number = int(value)
        if number == 0:  # never
            continue
        at = now_ms + number if relative else number
        if found is None or at < found:
            found = at
    return found


def own_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """What a selector over a staged message reads: the application's own headers and
    properties as it sent them (its original message id, its own correlation id), and its
    target, from which JMSDestination is read."""
    out = {
        n: v for n, v in headers.items()
        if not n.startswith(PREFIX) and n not in FRAME_ONLY
        and n not in ("correlation-id", "message-id", "amqp-message-id")
    }
    original = headers.get(MESSAGE_ID)
    if original is not None:
        out["message-id"] = out["amqp-message-id"] = original
    if CORRELATION_ID in headers:
        out["correlation-id"] = headers[CORRELATION_ID]
    if TARGET in headers:
        out[TARGET] = headers[TARGET]
    return out


def jms_destination(destination: str) -> str:
    """TIBCO's form of a destination: ``Queue[orders]``, ``Topic[prices]``."""
    kind, _, name = destination.rpartition("/")
    return f"Topic[{name}]" if "topic" in kind or "exchange" in kind else f"Queue[{name}]"


def mark_failed(
    headers: dict[str, str],
    *,
    reason: Reason,
    text: str,
    destination: str,
    now_ms: int,
    delivery_count: int | str,
    policy: str | None = None,
) -> dict[str, str]:
    """Add to ``headers`` why and where from a message could not be delivered: the headers
    every dead-letter, undelivered or undeliverable copy carries, written by the consumer side
    (a redelivery limit) and the staging engine (a refused release, an expiry) alike."""
    headers.update({
        REASON: reason.name,
        REASON_CODE: str(reason.code),
        REASON_TEXT: text,
        FAILED_AT: str(now_ms),
        ORIGINAL_DESTINATION: destination,
        ORIGINAL_JMS_DESTINATION: jms_destination(destination),
        DELIVERIES_TRIED: str(delivery_count),
    })
    headers.pop(DELIVERY_COUNT, None)  # counted afresh where it goes
    if policy:
        headers[POLICY] = policy
    return headers


def failed_copy_headers(
    headers: dict[str, str], fmt: StagedFormat, *, now_ms: int
) -> dict[str, str]:
    """The headers of a staged message's dead-letter copy, before ``mark_failed``: the message
    the application sent, as it would have been released (its own correlation id, its original
    message id), without a time to live (a dead letter does not expire; the original's stays in
    ``jms-bridge-ttl-*``), with the target, due time and message-retry count kept."""
    out = released_headers(headers, fmt, now_ms=now_ms)
    out.pop("expires", None)
    out.pop("expiration", None)
    for name in (TARGET, DUE, RETRIES, KEPT, TTL_HEADER, ORIGINAL_TTL, EXPIRES):
        if name in headers:
            out[name] = headers[name]
    out.setdefault(DELIVERY_COUNT, "0")
    return out

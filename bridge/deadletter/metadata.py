"""What a dead letter says about itself, whoever dead-lettered it, and the message it was.

Three kinds of dead letter are understood:

- the bridge's own (``jms-bridge-reason``..., see ``bridge.staging.envelope``): a redelivery
  policy's dead-letter or undelivered copy, or a release the broker refused on
  ``<prefix>.undeliverable`` (a staged copy, with ``jms-bridge-target``);
- ActiveMQ's (``ActiveMQ.DLQ``, ``DLQ.<queue>``): ``original-destination``,
  ``dlqDeliveryFailureCause``, ``originalExpiration``;
- RabbitMQ's (a queue's dead-letter exchange): ``x-first-death-queue``/``-reason``/``-exchange``
  and the latest ``x-death`` entry (``adapters.queues_rabbitmq`` reads it into ``x-death-*``).

A replay puts back the application's message: the bridge's and the broker's dead-letter
headers removed, property headers the bridge kept as plain ones (``jms-bridge-original-<name>``)
restored, a staged copy released as the engine would have, and ``jms-bridge-replay-of`` naming
the original message id it replays.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from adapters.base import PER_DELIVERY, StagedFormat
from bridge.staging import envelope
from policies.dlqrules import Facts, destination_name
from policies.selector import HeaderMap

REPLAY_OF = envelope.PREFIX + "replay-of"  # on a replayed message: the original id it replays
RETRIES = envelope.PREFIX + "dlq-retries"  # how many times the rules handler put it back
UNDELIVERED = "jms-bridge.undelivered"

# Dead-letter metadata of the bridge: never on a replayed message.
BRIDGE_HEADERS = frozenset({
    envelope.REASON, envelope.REASON_CODE, envelope.REASON_TEXT, envelope.FAILED_AT,
    envelope.ORIGINAL_DESTINATION, envelope.ORIGINAL_JMS_DESTINATION, envelope.POLICY,
    envelope.DELIVERY_COUNT, envelope.DELIVERIES_TRIED, "jms-bridge-invalid-reason",
})
# The brokers' own dead-letter headers (RabbitMQ's x-death-* are read from its x-death array).
BROKER_HEADERS = frozenset({
    "original-destination", "originalExpiration", "dlqDeliveryFailureCause",
    "x-first-death-queue", "x-first-death-reason", "x-first-death-exchange",
    "x-last-death-queue", "x-last-death-reason", "x-last-death-exchange",
    "x-death-count", "x-death-reason", "x-death-queue", "x-death-time",
})
# RabbitMQ's dead-letter reasons, as IBM MQ would name them.
RABBITMQ_REASONS = {
    "rejected": ("MQRC_BACKOUT_THRESHOLD_REACHED", 2362),
    "expired": ("MQFB_EXPIRATION", 258),
    "maxlen": ("MQRC_Q_FULL", 2053),
    "delivery_limit": ("MQRC_BACKOUT_THRESHOLD_REACHED", 2362),
}


@dataclass(frozen=True, slots=True)
class Info:
    """A dead letter's metadata, as ``dlq browse`` shows it."""

    original_id: str
    kind: str  # "bridge" | "staged" | "activemq" | "rabbitmq" | "plain"
    reason: str | None
    reason_code: int | None
    reason_text: str | None
    original_destination: str | None  # STOMP form
    failed_at_ms: int | None
    delivery_count: int | None
    persistent: bool
    handler_retries: int  # times the rules handler's ACTION(RETRY) put it back (dlq-retries)
    message_retries: int = 0  # puts its target refused before (message-retry: jms-bridge-retries)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def _tried(h: Mapping[str, str]) -> int | None:
    """Deliveries tried before it was dead-lettered (a dead letter written before the bridge
    kept them apart from its delivery count has only the count)."""
    tried = _int(h.get(envelope.DELIVERIES_TRIED))
    return tried if tried is not None else _int(h.get(envelope.DELIVERY_COUNT))


def describe(headers: Mapping[str, str], broker_id: str = "") -> Info:
    h = headers
    original_id = (h.get(envelope.MESSAGE_ID) or h.get("amqp-message-id") or broker_id
                   or h.get("message-id", ""))
    persistent = h.get("persistent", "").lower() == "true"
    retries = _int(h.get(RETRIES)) or 0  # the rules handler's
    refused = _int(h.get(envelope.RETRIES)) or 0  # message-retry's: puts its target refused
    if envelope.REASON in h or envelope.ORIGINAL_DESTINATION in h:
        staged = envelope.TARGET in h
        return Info(
            original_id, "staged" if staged else "bridge", h.get(envelope.REASON),
            _int(h.get(envelope.REASON_CODE)), h.get(envelope.REASON_TEXT),
            h.get(envelope.ORIGINAL_DESTINATION) or h.get(envelope.TARGET),
            _int(h.get(envelope.FAILED_AT)), _tried(h), persistent, retries, refused)
    if "original-destination" in h:
        cause = h.get("dlqDeliveryFailureCause")
        expired = cause is not None and "Expired" in cause
        reason, code = (("MQFB_EXPIRATION", 258) if expired
                        else ("MQRC_BACKOUT_THRESHOLD_REACHED", 2362))
        return Info(original_id, "activemq", reason, code, cause, h["original-destination"],
                    _int(h.get("timestamp")), _int(h.get("JMSXDeliveryCount")), persistent,
                    retries, refused)
    if "x-first-death-queue" in h or "x-death-queue" in h:
        queue = h.get("x-first-death-queue") or h["x-death-queue"]
        word = h.get("x-first-death-reason") or h.get("x-death-reason") or ""
        known = RABBITMQ_REASONS.get(word)
        return Info(original_id, "rabbitmq", known[0] if known else (word or None),
                    known[1] if known else None, word or None,
                    f"/amq/queue/{queue}", _int(h.get("x-death-time")),
                    _int(h.get("x-death-count")), persistent, retries, refused)
    if envelope.TARGET in h:
        return Info(original_id, "staged", None, None, None, h[envelope.TARGET], None,
                    _tried(h), persistent, retries, refused)
    return Info(original_id, "plain", None, None, None, None, None, None, persistent, retries,
                refused)


def facts(info: Info, headers: Mapping[str, str]) -> Facts:
    return Facts(info.reason, info.reason_code, info.original_destination, info.persistent,
                 info.handler_retries, headers)


def replay_headers(
    headers: Mapping[str, str], info: Info, fmt: StagedFormat, *, now_ms: int | None = None
) -> dict[str, str]:
    """The application's message a dead letter came from, marked as the replay of its id."""
    now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    h = dict(headers)
    if envelope.TARGET in h and envelope.DUE in h and envelope.MESSAGE_ID in h:
        h = envelope.released_headers(h, fmt, now_ms=now)
    out: dict[str, str] = {}
    for name, value in h.items():
        if name in BRIDGE_HEADERS or name in BROKER_HEADERS or name in PER_DELIVERY:
            continue
        if name in envelope.FRAME_ONLY or name == REPLAY_OF:
            continue
        if name.startswith(envelope.ORIGINAL) and name != envelope.ORIGINAL_DESTINATION:
            restored = name[len(envelope.ORIGINAL):]
            if restored in envelope.PROPERTY_HEADERS:
                out[restored] = value
                continue
        out.setdefault(name, value)
    if info.original_id:
        out[REPLAY_OF] = info.original_id
        out.setdefault(envelope.MESSAGE_ID, info.original_id)
    return out


def moved_headers(headers: Mapping[str, str], info: Info) -> dict[str, str]:
    """``dlq move``: every header kept (the dead-letter metadata too), the original id named."""
    out = {n: v for n, v in headers.items() if n not in PER_DELIVERY
           and n not in envelope.FRAME_ONLY}
    if info.original_id:
        out.setdefault(envelope.MESSAGE_ID, info.original_id)
    return out


def selector_headers(base: HeaderMap) -> HeaderMap:
    """The broker's selector header map, with JMSDestination read from whichever header names
    a dead letter's original destination (TIBCO's ``JMSDestination='Queue[A]'``)."""
    return base.with_destination(
        envelope.ORIGINAL_DESTINATION, envelope.TARGET, "original-destination",
        "x-first-death-queue", "x-death-queue", "destination")


# The names of queues that hold dead letters, as one regular expression: a name is one when it
# contains a match. Kept to what Python's re and RabbitMQ's management API (PCRE, and always
# caseless) read alike, so the broker can pick the candidates out of its queues by it: the
# bridge's undelivered and undeliverable queues (``undeliver``), ActiveMQ.DLQ and DLQ.<queue>,
# <queue>.dlq, -dlq, _dlq, dlq-..., and any name saying ``dead``.
CANDIDATE_NAMES = r"(?i)(^|\.)dlq(\.|$)|^dlq-|[-_]dlq$|dead|undeliver"
_CANDIDATE = re.compile(CANDIDATE_NAMES)


def is_candidate(name: str) -> bool:
    """Whether a queue's name says it holds dead letters."""
    return _CANDIDATE.search(name) is not None


__all__ = ["BRIDGE_HEADERS", "BROKER_HEADERS", "CANDIDATE_NAMES", "Info", "REPLAY_OF", "RETRIES",
           "describe", "destination_name", "facts", "is_candidate", "moved_headers",
           "replay_headers", "selector_headers"]

"""What happened to a message in the staging area, as values handed to sinks.

The engine (and the delay interceptor, for ``STAGED``) produce ``MessageOutcome`` values; sinks
decide what to make of them: ``StatsSink`` counts them for ``/metrics``, ``LogSink`` writes the log
lines. The event journal is one more sink. A sink must be quick and must not raise: it runs on
the engine's release path.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Mapping, MutableSequence, Sequence
from dataclasses import dataclass
from typing import Protocol

from structlog.typing import FilteringBoundLogger

from bridge.staging.staging_stats import StagingStats
from policies.reasons import MQFB_EXPIRATION, MQRC_BACKOUT_THRESHOLD_REACHED, Reason


class Kind(enum.Enum):
    STAGED = "staged"  # a delayed send was rewritten into its staged copy
    REFUSED = "refused"  # a delayed send refused by IBM MQ's rules or by its target
    RELEASED = "released"  # put to its target when due
    RELEASED_NOW = "released-now"  # put to its target early, on an operator's order
    CANCELLED = "cancelled"  # removed on an operator's order, not delivered
    # Its due time moved on an operator's order (``due_ms``: the new one; ``detail``: the old)
    RESCHEDULED = "rescheduled"
    EXPIRED = "expired"  # its time to live ran out while staged (MQFB_EXPIRATION)
    UNDELIVERABLE = "undeliverable"  # its target refused it: moved to the undeliverable queue
    INVALID = "invalid"  # not readable as a staged copy: moved to the invalid queue
    HOPPED = "hopped"  # moved down to its next level (``count`` of them at once)
    # A consumer failed a delivery (``count``: its delivery count); its policy decided:
    REDELIVERED = "redelivered"  # back to its queue, at once or after a delay (``due_ms``)
    DEAD_LETTERED = "dead-lettered"  # moved to the policy's destination (``queue``)
    UNDELIVERED = "undelivered"  # moved to the undelivered queue (TIBCO's $sys.undelivered)
    DELETED = "deleted"  # the policy deletes it
    # A staged message that could not be delivered (the staging engine, ``policies.failures``);
    # it also ends as UNDELIVERABLE, UNDELIVERED, DEAD_LETTERED, DELETED (MQRO_DISCARD_MSG) or
    # EXPIRED, with the refusal's reason (MQFB_EXPIRATION for an expiry):
    RETRIED = "retried"  # refused for a reason that can pass: tried again later (``count``)
    # An IBM MQ report put to its reply-to (``queue``; ``detail``: exception or expiration), or
    # refused by it (``detail``: "refused: ..."; ``reason``: the refusal's).
    REPORTED = "reported"
    KEPT = "kept"  # its dead-letter destination refused it too: kept on the staging queues


@dataclass(slots=True)  # (not frozen: one is made for each delayed send, and a frozen one
class MessageOutcome:          # cost four times as much to make; nobody changes one once made)
    kind: Kind
    at_ms: int  # when the broker confirmed it
    message_id: str | None = None  # the original message id
    target: str | None = None
    due_ms: int | None = None
    expires_ms: int | None = None
    reason: Reason | None = None
    detail: str = ""
    queue: str | None = None  # the queue it went to (staging level, undeliverable, invalid)
    count: int = 1
    size: int | None = None  # body bytes, where the producer of the outcome has them at hand
    # STAGED, a delayed REDELIVERED, RESCHEDULED: the staged copy's headers (a mapping, or the
    # pairs of a frame), for the staged catalogue's selectors.
    headers: Mapping[str, str] | Sequence[tuple[str, str]] | None = None

    @property
    def late_ms(self) -> int | None:
        return None if self.due_ms is None else self.at_ms - self.due_ms


_FAILURE_KINDS = frozenset({Kind.REDELIVERED, Kind.DEAD_LETTERED, Kind.UNDELIVERED, Kind.DELETED})
# Outcomes counted and logged but not journaled (no event of a message's life of their own).
UNJOURNALED = frozenset({Kind.HOPPED, Kind.RETRIED, Kind.KEPT})
# Where the engine's failures went, as ``StagingStats.on_dead_letter`` names it.
_HOMES = {Kind.UNDELIVERABLE: "undeliverable", Kind.UNDELIVERED: "undelivered",
          Kind.DEAD_LETTERED: "dead-letter", Kind.DELETED: "discard", Kind.EXPIRED: "discard"}


class Sink(Protocol):
    def __call__(self, outcomes: Sequence[MessageOutcome]) -> None: ...


class CountedWriter:
    """The counters of a sink's writer thread (the journal's, the staged catalogue's): written,
    dropped before writing, refused by the store; in shared memory where ``/metrics`` reads them
    from another process (``bridge.app.metrics.WriterCollector``)."""

    counters: MutableSequence[int]

    @property
    def written(self) -> int:
        return int(self.counters[0])

    @property
    def dropped(self) -> int:
        return int(self.counters[1]) + int(self.counters[2])


class StatsSink:
    """Counts the engine's outcomes into its shared counters (read by ``/metrics``)."""

    def __init__(self, stats: StagingStats) -> None:
        self.stats = stats

    def __call__(self, outcomes: Sequence[MessageOutcome]) -> None:
        stats = self.stats
        for o in outcomes:
            kind = o.kind
            if kind is Kind.STAGED:  # the front-end's one kind: first
                if o.queue is not None:
                    stats.on_staged(o.queue)
                continue
            if o.reason is not None and kind in _HOMES:  # (an enum's hash is Python code)
                stats.on_dead_letter(o.reason.name, _HOMES[kind])
                if o.reason is MQFB_EXPIRATION and kind is not Kind.EXPIRED:
                    stats.expired += 1  # expired, and kept somewhere
            if kind is Kind.RELEASED:
                stats.released += 1
                stats.observe_lateness(o.at_ms - (o.due_ms or o.at_ms))
            elif kind is Kind.HOPPED:
                stats.hops += o.count
            elif kind is Kind.RELEASED_NOW:
                stats.released += 1  # early on purpose: not a lateness
            elif kind is Kind.CANCELLED:
                stats.cancelled += 1
            elif kind is Kind.EXPIRED:
                stats.expired += 1
            elif kind is Kind.UNDELIVERABLE:
                stats.undeliverable += 1
            elif kind is Kind.INVALID:
                stats.invalid += 1
            elif kind is Kind.RETRIED:
                stats.retries += 1
            elif kind is Kind.REPORTED:
                if o.detail == "expiration":
                    stats.reports_expiration += 1
                elif o.detail == "exception":
                    stats.reports_exception += 1
                else:
                    stats.reports_refused += 1
            elif kind is Kind.KEPT:
                stats.kept += 1


class FailureTally:
    """Counts consumers' failed deliveries into the relay's counters (read by ``/metrics``)."""

    def __init__(self, redeliveries: Counter[str], dead_letters: Counter[str]) -> None:
        self.redeliveries, self.dead_letters = redeliveries, dead_letters

    def __call__(self, outcomes: Sequence[MessageOutcome]) -> None:
        for o in outcomes:
            if o.kind in _FAILURE_KINDS:
                self.redeliveries[o.kind.value] += 1
                if o.reason is not None:
                    self.dead_letters[o.reason.name] += 1


class LogSink:
    """One log line per outcome, at the level an operator wants it."""

    def __init__(self, log: FilteringBoundLogger) -> None:
        self.log = log

    def __call__(self, outcomes: Sequence[MessageOutcome]) -> None:
        log = self.log
        for o in outcomes:
            kind = o.kind
            if kind is Kind.RELEASED:
                log.debug("released", message_id=o.message_id, target=o.target,
                          late_ms=o.late_ms)
            elif kind is Kind.HOPPED:
                log.debug("hopped", count=o.count)
            elif kind is Kind.CANCELLED:
                log.info("cancelled by an operator, not delivered", message_id=o.message_id,
                         target=o.target, due_ms=o.due_ms)
            elif kind is Kind.RESCHEDULED:
                log.info("rescheduled by an operator", message_id=o.message_id,
                         target=o.target, due_ms=o.due_ms, before=o.detail)
            elif kind is Kind.RELEASED_NOW:
                log.info("released by an operator", message_id=o.message_id, target=o.target,
                         early_ms=-(o.late_ms or 0))
            elif kind is Kind.EXPIRED:
                log.info("expired while staged, not delivered", message_id=o.message_id,
                         target=o.target, reason=MQFB_EXPIRATION.name,
                         feedback=MQFB_EXPIRATION.code, due_ms=o.due_ms,
                         expires_ms=o.expires_ms, late_ms=o.late_ms)
            elif kind is Kind.UNDELIVERABLE:
                assert o.reason is not None
                log.warning("staged message could not be put to its target, moved to the "
                            "undeliverable queue", message_id=o.message_id, target=o.target,
                            reason=o.reason.name, reason_code=o.reason.code,
                            reason_text=o.detail, queue=o.queue, late_ms=o.late_ms)
            elif kind is Kind.REDELIVERED:
                log.debug("redelivery", message_id=o.message_id, destination=o.target,
                          delivery_count=o.count, delay_ms=(o.due_ms or o.at_ms) - o.at_ms,
                          policy=o.detail)
            elif kind in (Kind.DEAD_LETTERED, Kind.UNDELIVERED, Kind.DELETED):
                assert o.reason is not None
                if o.reason is MQRC_BACKOUT_THRESHOLD_REACHED:
                    log.info(f"redelivery limit: {kind.value}", message_id=o.message_id,
                             destination=o.target, delivery_count=o.count, to=o.queue,
                             reason=o.reason.name, reason_code=o.reason.code, policy=o.detail)
                else:
                    log.warning(f"staged message could not be delivered: {kind.value}",
                                message_id=o.message_id, target=o.target, to=o.queue,
                                reason=o.reason.name, reason_code=o.reason.code, why=o.detail)
            elif kind is Kind.RETRIED:
                assert o.reason is not None
                log.info("staged message refused by its target, to be tried again",
                         message_id=o.message_id, target=o.target, reason=o.reason.name,
                         reason_code=o.reason.code, retry=o.count, retry_at=o.due_ms,
                         detail=o.detail)
            elif kind is Kind.REPORTED:
                assert o.reason is not None
                if o.detail in ("exception", "expiration"):
                    log.info(f"{o.detail} report sent", message_id=o.message_id,
                             target=o.target, reply_to=o.queue, feedback=o.reason.code,
                             reason=o.reason.name)
                else:
                    log.warning("the reply-to refused the report: it goes to the dead-letter "
                                "destination with the original", message_id=o.message_id,
                                target=o.target, reply_to=o.queue, reason=o.reason.name,
                                reason_code=o.reason.code, detail=o.detail)
            elif kind is Kind.KEPT:
                assert o.reason is not None
                # Tried again every message-retry interval: say it loud the 1st, 2nd, 4th... time.
                if o.count & (o.count - 1) == 0:
                    log.warning("dead-letter destination refused the message: kept on the "
                                "staging queues, to be tried again", message_id=o.message_id,
                                target=o.target, reason=o.reason.name,
                                reason_code=o.reason.code, detail=o.detail, times=o.count)
                else:
                    log.debug("dead-letter destination still refuses the message",
                              message_id=o.message_id, detail=o.detail, times=o.count)
            elif kind is Kind.INVALID:
                log.error("unreadable staged message moved", message_id=o.message_id,
                          target=o.target, invalid_queue=o.queue, error=o.detail)

"""What the staging engine does with a staged message it cannot deliver: the I/O around
``policies.retry``, ``policies.reports`` and ``policies.failures``.

- Message-retry: a release refused for a reason that can pass is tried again; tenacity's retry,
  stop and wait strategies decide whether and when (``retry_wait_ms``), and the engine waits by
  putting the message back on the staging queues, due again then, so no other release waits
  for it and a crash loses neither the message nor its count (``jms-bridge-retries``).
- Otherwise (retries exhausted, a refusal that cannot pass, an expiry): ``FailurePath.fail``
  puts the report the message asked for to its reply-to, then says where the original goes:
  its dead-letter copy (``mark_failed`` headers, the same as the consumer side writes) for the
  undelivered queue, a policy's destination or the undeliverable queue, or nowhere.
- The engine settles that move like any other: the original is acknowledged only once its copy
  is confirmed, and a dead-letter destination that refuses it leaves it on the staging queues.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import tenacity

from adapters.base import Held, Message, StagedFormat, StagingBroker
from bridge.staging.envelope import (
    DELIVERY_COUNT,
    MESSAGE_ID,
    REPORT,
    RETRIES,
    Staged,
    as_plain_headers,
    failed_copy_headers,
    mark_failed,
    new_message_id,
)
from bridge.staging.outcomes import Kind, MessageOutcome
from policies.errors import PutRefused
from policies.failures import Cause, Home, Route, route
from policies.reasons import MQRC_PROPERTY_VALUE_BAD, MQRC_UNKNOWN_OBJECT_NAME, Reason
from policies.redelivery import PRESERVE_UNDELIVERED_HEADER, PolicyTable
from policies.reports import REPORT_EXPIRATION, Data, Report, report_body
from policies.retry import MessageRetry, RetryTable, can_pass

UNDELIVERED_QUEUE = "jms-bridge.undelivered"
# Headers of the original a report keeps (IBM MQ: the report's persistence and priority are
# the original's; its format, when it carries the original's data).
_REPORT_KEEPS = ("persistent", "priority")
_REPORT_KEEPS_WITH_DATA = ("content-type", "content-encoding")


@dataclass(frozen=True, slots=True)
class FailureSettings:
    """The settings the failure paths need (picklable: handed to the engine process)."""

    retry: RetryTable = field(default_factory=RetryTable)
    redelivery: PolicyTable = field(default_factory=PolicyTable)
    undelivered_queue: str = UNDELIVERED_QUEUE


_PASSING = tenacity.retry_if_exception(lambda e: isinstance(e, PutRefused) and can_pass(e.reason))


def retry_wait_ms(retry: MessageRetry, refused: PutRefused, attempts: int) -> int | None:
    """How long to wait before the next put of a message whose put ``attempts`` (1 = the release
    itself) all failed, the last with ``refused``; None: no more tries (the refusal cannot pass,
    or ``retry.count`` retries are done). Decided by tenacity's strategies, as a ``Retrying``
    with ``retry_if_exception``, ``stop_after_attempt(count + 1)`` and ``wait_fixed`` would
    decide, without its sleep: the engine waits on the staging queues instead."""
    state = tenacity.RetryCallState(None, None, (), {})  # type: ignore[arg-type]
    state.attempt_number = attempts
    state.set_exception((PutRefused, refused, None))
    if not _PASSING(state) or tenacity.stop_after_attempt(retry.count + 1)(state):
        return None
    return round(tenacity.wait_fixed(retry.interval_ms / 1000)(state) * 1000)


def attempts_of(headers: dict[str, str]) -> int:
    """Puts of this message its target has refused before (0 on its first release)."""
    text = headers.get(RETRIES, "0")
    return int(text) + 1 if text.isascii() and text.isdigit() else 1


@dataclass(slots=True)
class Failed:
    """Where the original goes: ``destination`` with ``message``, or nowhere (None)."""

    route: Route
    kind: Kind  # its outcome: UNDELIVERABLE, UNDELIVERED, DEAD_LETTERED, DELETED or EXPIRED
    destination: str | None
    message: Message | None
    text: str  # the reason in words, as on the copy
    # A report the reply-to refused, to put to ``destination`` before the original.
    report: Message | None = None


_KIND = {Home.UNDELIVERABLE: Kind.UNDELIVERABLE, Home.UNDELIVERED: Kind.UNDELIVERED,
         Home.DEAD_LETTER: Kind.DEAD_LETTERED}


class FailurePath:
    """Decides and does the report of one failed message at a time, for one engine."""

    def __init__(
        self,
        broker: StagingBroker,
        settings: FailureSettings,
        *,
        emit: Callable[[Sequence[MessageOutcome]], None],
        clock: Callable[[], int],
    ) -> None:
        self.broker = broker
        self.settings = settings
        self.emit = emit  # hands REPORTED outcomes to the engine's sinks
        self.clock = clock
        self.undelivered = "/queue/" + settings.undelivered_queue
        self.undeliverable = ""  # the engine's, set when it connects

    @property
    def format(self) -> StagedFormat:
        return self.broker.format

    def retry_for(self, target: str) -> MessageRetry:
        return self.settings.retry.lookup(target)

    def routine_expiry(self, headers: dict[str, str], target: str) -> bool:
        """Whether an expired message is simply discarded (no report asked for, not to be kept,
        no expiry destination): checked first, so that plain expiries cost what they did."""
        if REPORT_EXPIRATION in headers or PRESERVE_UNDELIVERED_HEADER in headers:
            return False
        return self.settings.redelivery.lookup(target)[1].expiry is None

    def fail(
        self, held: Held, staged: Staged, cause: Cause, reason: Reason, text: str, now_ms: int
    ) -> Failed:
        """Route a failed message: put its report (BrokerUnavailable propagates: the original
        is still held), and say where it goes."""
        headers = held.message.headers
        policy = self.settings.redelivery.lookup(staged.target)[1]
        where = route(cause, reason, headers, target=staged.target,
                      original_id=staged.message_id, policy=policy)
        report: Message | None = None
        asked = where.report
        if asked is not None:
            report = self._report(asked, held, staged, where.reason, text, now_ms)
            try:
                self._publish(asked.destination, report)
            except PutRefused as refused:
                text = f"{text}; the report to {asked.destination} was refused: {refused}"
                where = route(cause, reason, headers, target=staged.target,
                              original_id=staged.message_id, policy=policy, report_failed=True)
                self.emit([MessageOutcome(Kind.REPORTED, self.clock(), staged.message_id,
                                          staged.target, reason=refused.reason,
                                          detail=f"refused: {refused.text}",
                                          queue=refused.destination)])
            else:
                self.emit([MessageOutcome(Kind.REPORTED, self.clock(), staged.message_id,
                                          staged.target, reason=where.reason,
                                          detail=asked.kind.value, queue=asked.destination)])
                report = None
        if where.home is Home.DISCARD:
            kind = Kind.EXPIRED if cause is Cause.EXPIRED else Kind.DELETED
            return Failed(where, kind, None, None, text)
        destination = {Home.UNDELIVERED: self.undelivered, Home.DEAD_LETTER: where.destination,
                       Home.UNDELIVERABLE: self.undeliverable}[where.home]
        copy = failed_copy_headers(headers, self.format, now_ms=now_ms)
        if reason is MQRC_PROPERTY_VALUE_BAD:
            copy = as_plain_headers(copy)
        policy_text = where.why
        if cause is Cause.REFUSED:
            retry = f"message-retry {self.retry_for(staged.target)}"
            policy_text = f"{retry}; {policy_text}" if policy_text else retry
        mark_failed(copy, reason=where.reason, text=text, destination=staged.target,
                    now_ms=now_ms, delivery_count=copy[DELIVERY_COUNT], policy=policy_text)
        return Failed(where, _KIND[where.home], destination,
                      Message(copy, held.message.body), text, report)

    def _publish(self, destination: str, message: Message) -> None:
        """Put a report; a reply-to the adapter cannot name is refused like a missing one."""
        try:
            self.broker.publish(destination, message)
        except ValueError as bad:
            raise PutRefused(0, MQRC_UNKNOWN_OBJECT_NAME,
                             f"not a destination the bridge can put to: {bad}",
                             destination) from None

    def _report(
        self, report: Report, held: Held, staged: Staged, reason: Reason, text: str, now_ms: int
    ) -> Message:
        original = held.message.headers
        headers = report.headers()
        keeps = _REPORT_KEEPS + (_REPORT_KEEPS_WITH_DATA if report.data is not Data.NONE else ())
        for name in keeps:
            if name in original:
                headers[name] = original[name]
        headers[REPORT] = report.kind.value
        headers[MESSAGE_ID] = staged.message_id
        mark_failed(headers, reason=reason, text=text, destination=staged.target, now_ms=now_ms,
                    delivery_count=original.get(DELIVERY_COUNT, "0"))
        id_header = self.format.message_id_header
        if id_header:
            headers[id_header] = report.message_id or new_message_id()
        return Message(headers, report_body(report.data, held.message.body))

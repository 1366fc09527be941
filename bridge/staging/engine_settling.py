"""The staging engine's settler: it settles the engine's work with the broker, hands the
outcomes to the sinks and the answers to the operators' tools, and decides what becomes of a
move the broker refuses.

A message whose target the broker refuses (no such queue, not authorized, full, too big: the
adapter's PutRefused) does not stall the rest of its batch, and is not taken for a broker
outage: a refusal that can pass (full, put-inhibited) puts it back on the staging queues to be
tried again (message-retry); otherwise, and for an expiry, ``bridge.staging.failures`` puts the
report it asked for and says where it goes (the undelivered queue, a policy's dead-letter
destination, ``<prefix>.undeliverable``, or nowhere). A dead-letter destination that refuses it
leaves it on the staging queues, tried again later.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from adapters.base import Held, Message, Move, StagingBroker
from bridge.staging.engine_holding import Holding
from bridge.staging.engine_work import Destinations, Work, WorkKind
from bridge.staging.envelope import (
    EXPIRED_ON,
    FRAME_ONLY,
    KEPT,
    MESSAGE_ID,
    PREFIX,
    RETRIES,
    RETRY_AT,
    Staged,
    as_plain_headers,
    hop_headers,
)
from bridge.staging.failures import FailurePath, attempts_of, retry_wait_ms
from bridge.staging.levels import Layout
from bridge.staging.orders import Orders
from bridge.staging.outcomes import Kind, MessageOutcome
from bridge.staging.series import SeriesMemory
from bridge.staging.staging_stats import StagingStats
from policies.backoff import backoff_ms
from policies.errors import BrokerUnavailable, PutRefused
from policies.failures import Cause
from policies.reasons import MQFB_EXPIRATION, MQRC_PROPERTY_VALUE_BAD, Reason

INVALID_REASON = PREFIX + "invalid-reason"  # why a message was moved to the invalid queue
INVALID_QUEUE = PREFIX + "invalid-queue"  # the staging queue it was found on

# A message kept because its dead-letter destination refused it is tried again after its
# message-retry interval, doubling each time up to this: many such messages do not keep the
# engine busy with puts that fail.
KEEP_MAX_MS = 60_000

# What an operator's order did, as its answer says.
_DONE = {WorkKind.CANCEL: "cancelled", WorkKind.RELEASE_NOW: "released", WorkKind.EXPIRE: "expired",
         WorkKind.RETRY: "retried", WorkKind.DISCARD: "discarded", WorkKind.KEEP: "kept",
         WorkKind.RESCHEDULE: "rescheduled"}
_OUTCOME = {
    WorkKind.RELEASE: Kind.RELEASED, WorkKind.RELEASE_NOW: Kind.RELEASED_NOW,
    WorkKind.CANCEL: Kind.CANCELLED, WorkKind.EXPIRE: Kind.EXPIRED,
    WorkKind.UNDELIVERABLE: Kind.UNDELIVERABLE, WorkKind.UNDELIVERED: Kind.UNDELIVERED,
    WorkKind.DEAD_LETTERED: Kind.DEAD_LETTERED, WorkKind.DISCARD: Kind.DELETED,
    WorkKind.RETRY: Kind.RETRIED, WorkKind.KEEP: Kind.KEPT,
    WorkKind.RESCHEDULE: Kind.RESCHEDULED, WorkKind.SERIES: Kind.RELEASED,
}
# Moves that put a message back on a staging level.
_ENTERS_LEVEL = frozenset({WorkKind.HOP, WorkKind.RETRY, WorkKind.KEEP, WorkKind.RESCHEDULE,
                           WorkKind.SERIES})
_FAILED = {Kind.UNDELIVERABLE: WorkKind.UNDELIVERABLE, Kind.UNDELIVERED: WorkKind.UNDELIVERED,
           Kind.DEAD_LETTERED: WorkKind.DEAD_LETTERED, Kind.DELETED: WorkKind.DISCARD,
           Kind.EXPIRED: WorkKind.EXPIRE}
# Moves to a dead-letter home: one the broker refuses keeps its message on the staging queues.
_TO_DEAD_LETTER = frozenset({WorkKind.UNDELIVERABLE, WorkKind.UNDELIVERED, WorkKind.DEAD_LETTERED})
_RELEASES = frozenset({WorkKind.RELEASE, WorkKind.RELEASE_NOW})


class Settler:
    """Settles the engine's work with the broker, and tells the sinks and the tools what the
    broker did; a move it refuses is retried, kept or taken down the failure path."""

    def __init__(
        self,
        broker: StagingBroker,
        layout: Layout,
        *,
        clock: Callable[[], int],
        stats: StagingStats,
        emit: Callable[[Sequence[MessageOutcome]], None],
        failures: FailurePath,
        destinations: Destinations,
        holding: Holding,
        standing: Orders,
        answers: list[tuple[str, Message]],
        series: SeriesMemory,
        settled: Callable[[], None],
    ) -> None:
        """``emit`` hands outcomes to the sinks; ``standing``: the operators' orders, one of
        which is done with once its release is refused; ``answers``: (reply topic, answer) for
        the tools whose orders were carried out; ``series``: the copies of series released,
        those a SERIES move continues remembered once settled; ``settled`` is called after
        each settle the broker confirmed."""
        self.broker = broker
        self.layout = layout
        self.clock = clock
        self.stats = stats
        self.emit = emit
        self.failures = failures
        self._dest = destinations
        self._holding = holding
        self._standing = standing
        self._answers = answers
        self._series = series
        self._settled = settled
        self._dwell = {queue: dwell for dwell, queue in layout.levels}
        self._blocked: set[str] = set()  # message ids kept: their dead-letter home refused

    def invalid(self, held: Held, error: Exception, *, plain: bool = False) -> Work:
        """An unreadable staged message is kept for a person to look at, not dropped (with
        ``plain``, its property headers as plain ones: the broker refused one of them)."""
        headers = {n: v for n, v in held.message.headers.items() if n not in FRAME_ONLY}
        if plain:
            headers = as_plain_headers(headers)
        headers[INVALID_REASON] = f"{type(error).__name__}: {error}"
        headers[INVALID_QUEUE] = held.queue
        move = Move(held, self._dest.invalid, Message(headers, held.message.body))
        return Work(WorkKind.INVALID, move, queue=held.queue, error=headers[INVALID_REASON])

    def _restage(
        self, w: Work, kind: WorkKind, due_ms: int, now_ms: int, headers: dict[str, str],
        reason: Reason, text: str, count: int,
    ) -> Work:
        """``w``'s message back on the staging queues, due again at ``due_ms`` (its own due
        time kept), with ``headers`` added: a RETRY or a KEEP."""
        held, staged = w.move.held, w.staged
        assert staged is not None
        out = hop_headers(held.message.headers, now_ms=now_ms)
        out.update(headers)
        out[RETRY_AT] = str(due_ms)
        queue = self.layout.queue_for(due_ms - now_ms)
        dest = self._dest.of(queue)
        retried = Staged(staged.target, due_ms, staged.sent_ms, now_ms, staged.expires_ms,
                         staged.message_id, staged.mandatory)
        return Work(kind, Move(held, dest, Message(out, held.message.body)), retried,
                    queue=queue, error=text, reason=reason, order=w.order, count=count)

    def refused(self, w: Work, refused: PutRefused, now_ms: int) -> Work:
        """A release the broker refused: tried again later if the refusal can pass and
        message-retry allows, else the failure path."""
        staged = w.staged
        assert staged is not None
        headers = w.move.held.message.headers
        attempts = attempts_of(headers)
        retry = self.failures.retry_for(staged.target)
        wait_ms = retry_wait_ms(retry, refused, attempts)
        if w.order is not None:  # a release-now order is done with: message-retry from here
            self._standing.done(staged.message_id)
        if wait_ms is not None:
            return self._restage(w, WorkKind.RETRY, now_ms + wait_ms, now_ms,
                                 {RETRIES: str(attempts)}, refused.reason, refused.text,
                                 attempts)
        text = refused.text
        if attempts > 1:
            text = f"{text} (put {attempts} times, message-retry {retry})"
        return self._failed(w, Cause.REFUSED, refused.reason, text, now_ms)

    def _expired(self, w: Work, now_ms: int) -> Work:
        """An expired message: discarded as before, unless it asked for a report or to be
        kept, or its policy names an expiry destination."""
        staged = w.staged
        assert staged is not None
        if self.failures.routine_expiry(w.move.held.message.headers, staged.target):
            return w
        expires = staged.expires_ms
        where = w.move.held.message.headers.get(EXPIRED_ON)
        text = (f"its time to live ran out at {expires} on {where} (expired by the broker)"
                if where else f"its time to live ran out at {expires} while staged")
        return self._failed(w, Cause.EXPIRED, MQFB_EXPIRATION, text, now_ms)

    def _failed(self, w: Work, cause: Cause, reason: Reason, text: str, now_ms: int) -> Work:
        """The move that takes a message that cannot be delivered where the failure path says,
        after its report; a KEEP when the report's dead-letter home refused that report."""
        held, staged = w.move.held, w.staged
        assert staged is not None
        failed = self.failures.fail(held, staged, cause, reason, text, now_ms)
        if failed.report is not None and failed.destination is not None:
            try:
                self.broker.publish(failed.destination, failed.report)
            except PutRefused as refused:
                return self._keep(w, refused, now_ms)
        kind = _FAILED[failed.kind]
        move = Move(held, failed.destination, failed.message)
        return Work(kind, move, staged, queue=failed.destination, error=failed.text,
                    reason=failed.route.reason, order=w.order)

    def _keep(self, w: Work, refused: PutRefused, now_ms: int) -> Work:
        """A dead-letter home refused the message: it stays on the staging queues (IBM MQ
        leaves it on the transmission queue and stops the channel), due again after its
        target's message-retry interval, doubled each time it is kept, up to KEEP_MAX_MS; its
        target is tried first then."""
        staged = w.staged
        assert staged is not None
        headers = w.move.held.message.headers
        text = headers.get(KEPT, "0")
        kept = int(text) + 1 if text.isascii() and text.isdigit() else 1
        interval = max(self.failures.retry_for(staged.target).interval_ms, 1)
        wait_ms = backoff_ms(kept, initial_ms=interval, max_ms=max(interval, KEEP_MAX_MS))
        return self._restage(w, WorkKind.KEEP, now_ms + wait_ms, now_ms, {KEPT: str(kept)},
                             refused.reason, f"{refused.destination}: {refused.text}", kept)

    def settle(self, work: list[Work], now_ms: int) -> None:
        """Settle ``work``; a release the broker refuses is retried or takes the failure path,
        a dead-letter move it refuses is kept on the staging queues, and the rest of the batch
        is settled after it, without a reconnect. A refused hop, invalid, retry or keep move
        means a staging queue is missing: that is taken for an outage (the reconnect declares
        the queues again)."""
        try:
            self._settle_work(work, now_ms)
        finally:
            self._series.batch.clear()

    def _settle_work(self, work: list[Work], now_ms: int) -> None:
        if any(w.kind is WorkKind.EXPIRE for w in work):
            work = [self._expired(w, now_ms) if w.kind is WorkKind.EXPIRE else w for w in work]
        while work:
            try:
                self.broker.settle([w.move for w in work])
                break
            except PutRefused as refused:
                index, also = refused.index, set(refused.also_done)
                done = [*work[:index], *(work[i] for i in sorted(also))]
                bad = work[index]
                self._record(done, max(now_ms, self.clock()))
                rest = [w for i, w in enumerate(work) if i > index and i not in also]
                if bad.kind in _RELEASES:
                    work = [self.refused(bad, refused, now_ms), *rest]
                elif bad.kind in _TO_DEAD_LETTER:
                    work = [self._keep(bad, refused, now_ms), *rest]
                elif bad.kind is WorkKind.HOP and refused.reason is MQRC_PROPERTY_VALUE_BAD:
                    # The message itself cannot be put (it would fail at every reconnect and
                    # stall the engine): kept on the invalid queue for an operator.
                    work = [self.invalid(bad.move.held, refused, plain=True), *rest]
                else:
                    raise BrokerUnavailable(
                        f"a staging queue refused a {bad.kind.value} move: {refused}"
                    ) from refused
        if not work:
            return
        self._settled()
        # Lateness counts until the broker confirmed the release, not from when it began.
        self._record(work, max(now_ms, self.clock()))

    def _record(self, work: list[Work], now_ms: int) -> None:
        """Hand what the broker has now done to the sinks, as outcomes."""
        looks = self._holding.next_look
        outcomes: list[MessageOutcome] = []
        hops = 0
        for w in work:
            staged, kind = w.staged, w.kind
            if kind is WorkKind.NOTED:
                if w.noted is not None:
                    w.noted.at_ms = now_ms
                    outcomes.append(w.noted)
                if w.order is not None and w.order.reply_topic:  # the tool waits for it
                    self._answers.append((w.order.reply_topic, w.order.answer("noted")))
                continue
            if kind is WorkKind.SERIES and w.series_key is not None:
                self._series.remember(w.series_key, True)
            if kind in _ENTERS_LEVEL:
                if w.queue and w.move.message is not None:
                    self._holding.let_go(w.queue, w.move.message.headers,
                                         len(w.move.message.body), now_ms)
                dwell = self._dwell.get(w.queue or "")
                if dwell is not None and w.queue in looks:
                    # Its head exits no later than the message just put behind it.
                    looks[w.queue] = min(looks[w.queue], now_ms + dwell)
                if kind is WorkKind.HOP:
                    hops += 1
                    continue
            else:
                message_id = w.move.held.message.headers.get(MESSAGE_ID)
                if message_id is not None:
                    self._holding.gone(message_id, now_ms)
            if kind is WorkKind.DROP:
                continue
            if kind is WorkKind.INVALID:
                headers = w.move.held.message.headers
                outcomes.append(MessageOutcome(
                    Kind.INVALID, now_ms,
                    message_id=headers.get("message-id") or headers.get("amqp-message-id"),
                    target=headers.get(PREFIX + "target"), queue=self.layout.invalid,
                    detail=f"{w.error} (on {w.queue})", size=len(w.move.held.message.body),
                ))
            else:
                assert staged is not None
                outcomes.append(MessageOutcome(
                    _OUTCOME[kind], now_ms, staged.message_id, staged.target, staged.due_ms,
                    staged.expires_ms,
                    reason=w.reason or (MQFB_EXPIRATION if kind is WorkKind.EXPIRE else None),
                    detail=w.error or "",
                    queue=self.layout.undeliverable if kind is WorkKind.UNDELIVERABLE else w.queue,
                    size=len(w.move.held.message.body), count=w.count,
                    headers=w.move.message.headers
                    if kind is WorkKind.RESCHEDULE and w.move.message is not None else None,
                ))
                if kind is WorkKind.KEEP:
                    self._blocked.add(staged.message_id)
                    self.stats.blocked = len(self._blocked)
                elif self._blocked and kind is not WorkKind.RETRY:
                    self._blocked.discard(staged.message_id)
                    self.stats.blocked = len(self._blocked)
            if w.order is not None and w.order.reply_topic:
                answer = w.order.answer(_DONE.get(w.kind, w.kind.value))
                self._answers.append((w.order.reply_topic, answer))
        if hops:
            outcomes.append(MessageOutcome(Kind.HOPPED, now_ms, count=hops))
        self.emit(outcomes)

"""An operator's cancel, release now and reschedule of one staged message, found by its original
message id: taken from the staging queues, or ordered of the running engine that holds it."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from adapters.base import Message, StagedFormat, StagingBroker
from bridge.staging import envelope
from bridge.staging.asking import ANSWER_S, answers_to, ask, reply_topic
from bridge.staging.levels import Layout
from bridge.staging.listing import catalogued_rows
from bridge.staging.orders import (
    CANCEL_LEAD_MS,
    EXPIRY_ERROR,
    NOTE,
    NOTE_DETAIL,
    NOTE_DUE,
    NOTE_EXPIRES,
    NOTE_TARGET,
    NOTED_ACTIONS,
    ORDER_ID,
    REPLY_TOPIC,
    Order,
    OrderAction,
    destination,
)
from bridge.staging.outcomes import Kind
from policies.errors import BridgeError, BrokerUnavailable, PutRefused, Refused
from policies.reasons import MQRC_EXPIRY_ERROR

# A running engine holds the messages it has taken ahead: one due within about a second, and
# the first 1,000 (the level prefetch) of each level of up to about a minute. No other
# connection can take those from the broker, so when the staging queues do not give the
# message, its order goes to the running engines (``bridge.staging.orders``).
#
# How long cancel and release wait for a message the engine holds: ActiveMQ pushes a level's
# head to the engine's peek subscription, where it stays until the engine's next look at that
# level (the engine's recheck, 5 s) unless it is due sooner.
PATIENCE_S = 8.0


NOT_FOUND = (
    "no staged message {}: not on the staging queues, and no running staging engine answered "
    "that it holds it"
)


class Busy(BridgeError):
    """A staged message the staging engine kept holding for all of the tool's patience."""


@dataclass(frozen=True, slots=True)
class OrderOutcome:
    """What became of a staged message a tool was asked to cancel or release."""

    # "cancelled", "released"; from an engine also "expired", "undeliverable", and where a
    # release its target refused went: "retried", "undelivered", "dead-lettered", "discarded",
    # "kept".
    done: str
    by_engine: bool  # a running engine held it and did it (or will: a staged cancel)
    staged: Message | None = None  # the staged copy the tool itself took (its journal event)
    due_ms: int | None = None  # a staged cancel: the message's due time, when it is dropped
    # The tool did it itself and a running engine took its note: that engine records the event
    # (journal, catalogue, counters); the tool records nothing.
    noted: bool = False

    @property
    def as_asked(self) -> bool:
        return self.done in ("cancelled", "released", "rescheduled")

    def describe(self, message_id: str) -> str:
        if self.done == EXPIRY_ERROR:
            return (f"{MQRC_EXPIRY_ERROR.name} ({MQRC_EXPIRY_ERROR.code}): not rescheduled "
                    f"{message_id}: its time to live ends before the new due time")
        if self.done == "rescheduled" and self.due_ms is not None:
            return f"rescheduled {message_id}: due {_iso(self.due_ms)}"
        if self.done == "expired":
            return f"expired {message_id}: its time to live was up, it is not delivered"
        if self.done == "undeliverable":
            return (f"undeliverable {message_id}: its target refused it; it is on the "
                    "undeliverable staging queue")
        if self.done == "retried":
            return (f"retried {message_id}: its target refused it for now (full); it is back on "
                    "the staging queues, to be tried again (message-retry)")
        if self.done in ("undelivered", "dead-lettered", "discarded"):
            return (f"{self.done} {message_id}: its target refused it (see the bridge's log "
                    "for where it went)")
        if self.done == "cancelled" and self.due_ms is not None:
            due = dt.datetime.fromtimestamp(self.due_ms / 1000, dt.UTC).isoformat(
                timespec="milliseconds")
            return (f"cancelled {message_id}: it stays on the staging queues until it is due "
                    f"({due}), and is dropped then, not delivered")
        if self.done == "kept":
            return (f"kept {message_id}: its target and its dead-letter destination refused it; "
                    "it is back on the staging queues")
        return f"{self.done} {message_id}"


def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")


def note(broker: StagingBroker, layout: Layout, kind: Kind, staged: Message, *,
         due_ms: int | None = None, detail: str = "", answer_s: float = ANSWER_S) -> bool:
    """Tell one running engine what this tool did itself to ``staged`` (a note on the ready
    queue, which the engines share: one takes it and records the event in its journal, its
    catalogue and its counters), and wait up to ``answer_s`` for its answer that it has: a
    listing made next then shows the change (the engines answer those from their catalogues).
    False when no engine runs (nothing is sent): the tool records it itself, if it can."""
    try:
        if broker.consumers(layout.ready) == 0:
            return False
        info = envelope.Staged.of(staged.headers)
    except (BrokerUnavailable, Refused, KeyError, ValueError):
        return False
    now = str(time.time_ns() // 1_000_000)
    headers = {
        # An engine that knows no notes releases it to the control topic, which ignores it.
        envelope.TARGET: destination(layout.control), envelope.DUE: now, envelope.SENT: now,
        envelope.ENTERED: now, envelope.MESSAGE_ID: info.message_id, "persistent": "true",
        NOTE: kind.value, NOTE_TARGET: info.target,
        NOTE_DUE: str(due_ms if due_ms is not None else info.due_ms),
    }
    if info.expires_ms is not None:
        headers[NOTE_EXPIRES] = str(info.expires_ms)
    if detail:
        headers[NOTE_DETAIL] = detail
    copy = {n: v for n, v in staged.headers.items() if n not in envelope.FRAME_ONLY}
    body = json.dumps({"size": len(staged.body), "headers": copy}).encode()
    action = NOTED_ACTIONS.get(kind)
    order = None if action is None else Order.new(action, info.message_id, reply_topic(layout))
    if order is not None:
        try:
            broker.listen(str(order.reply_topic))
            headers[ORDER_ID], headers[REPLY_TOPIC] = order.order_id, str(order.reply_topic)
        except Refused:  # a user who may not read the topic: the note goes without
            order = None
    try:
        broker.publish(broker.format.client_destination(layout.ready), Message(headers, body))
    except PutRefused as refused:
        structlog.get_logger("staging.tools").warning(
            "cannot hand the event to a running engine", error=str(refused))
        return False
    if order is not None:
        answers_to(broker, order, answer_s, answers=1)
    return True


def cancel(
    broker: StagingBroker, layout: Layout, message_id: str, *,
    patience_s: float = PATIENCE_S, answer_s: float = ANSWER_S, scan: bool = False,
) -> OrderOutcome | None:
    """Make sure the staged message ``message_id`` is never delivered. None when neither the
    staging queues nor a running engine have it; Busy as ``take``. Unless ``scan``, a
    message the engines' catalogues know and that is due later than ``CANCEL_LEAD_MS`` from
    now is cancelled by a staged cancel, without reading the queues."""
    if not scan:
        found = catalogued_rows(broker, layout, target=None, message_id=message_id,
                                wait_s=answer_s)
        row = found[0] if found else None
        now_ms = time.time_ns() // 1_000_000
        if row is not None and row.due_ms - now_ms > CANCEL_LEAD_MS + 2 * answer_s * 1000:
            stage_cancel(broker, layout, message_id, due_ms=row.due_ms - CANCEL_LEAD_MS,
                         now_ms=now_ms)
            # The engine that meets the message drops it (and counts it then).
            return OrderOutcome("cancelled", by_engine=True, due_ms=row.due_ms)
    return _carry_out(broker, layout, OrderAction.CANCEL, message_id, None, patience_s, answer_s)


def stage_cancel(
    broker: StagingBroker, layout: Layout, message_id: str, *, due_ms: int, now_ms: int
) -> None:
    """Stage a cancel of ``message_id`` to come due at ``due_ms`` (its release puts the order
    on the control topic), then tell the running engines now: each takes the message out of
    its catalogue, and lets go of it if it holds it. The staged cancel is persistent and
    confirmed by the broker before this returns."""
    destination_, staged, order = staged_cancel(broker.format, layout, message_id,
                                                due_ms=due_ms, now_ms=now_ms)
    broker.publish(destination_, staged)
    broker.publish(destination(layout.control), order.message())


def staged_cancel(
    fmt: StagedFormat, layout: Layout, message_id: str, *, due_ms: int, now_ms: int
) -> tuple[str, Message, Order]:
    """Where a cancel of ``message_id`` due at ``due_ms`` is staged, its staged copy (the order
    in its body, for the control topic), and the order."""
    queue = layout.queue_for(due_ms - now_ms)
    order = Order.new(OrderAction.CANCEL, message_id, None)
    headers = envelope.staged_headers(
        [("content-type", "application/json"), ("persistent", "true")], fmt,
        target=destination(layout.control), staging_destination=fmt.client_destination(queue),
        due_ms=due_ms, sent_ms=now_ms, expires_ms=None, drop=())
    staged = Message({name: value for name, value in headers if name != "destination"},
                     json.dumps(order.headers()).encode())
    return fmt.client_destination(queue), staged, order


def _carry_out(
    broker: StagingBroker, layout: Layout, action: OrderAction, message_id: str,
    then: Callable[[Message], None] | None, patience_s: float, answer_s: float,
    due_ms: int | None = None,
) -> OrderOutcome | None:
    """The staging queues first (no wait when the message is there); then the engines; then
    the queues again, for a message that was between two of them meanwhile."""
    done = {OrderAction.CANCEL: "cancelled", OrderAction.RELEASE: "released",
            OrderAction.RESCHEDULE: "rescheduled"}[action]
    kind = {OrderAction.CANCEL: Kind.CANCELLED, OrderAction.RELEASE: Kind.RELEASED_NOW,
            OrderAction.RESCHEDULE: Kind.RESCHEDULED}[action]

    def did(taken: Message) -> OrderOutcome:
        detail = ""
        if due_ms is not None:
            with contextlib.suppress(KeyError, ValueError):
                detail = f"was due at {envelope.Staged.of(taken.headers).due_ms}"
        noted = note(broker, layout, kind, taken, due_ms=due_ms, detail=detail)
        return OrderOutcome(done, by_engine=False, staged=taken, due_ms=due_ms, noted=noted)

    found = find(broker, layout, message_id)
    if found is not None:
        taken = broker.take(found[0], envelope.MESSAGE_ID, message_id, then)
        if taken is not None:
            return did(taken)
    answer = ask_engines(broker, layout, action, message_id, answer_s, due_ms=due_ms)
    if answer is not None:
        return OrderOutcome(answer, by_engine=True, due_ms=due_ms)
    taken = take(broker, layout, message_id, then=then, patience_s=patience_s)
    if taken is None:
        return None
    return did(taken)


def ask_engines(
    broker: StagingBroker, layout: Layout, action: OrderAction, message_id: str, wait_s: float,
    *, due_ms: int | None = None,
) -> str | None:
    """Send the order to every running engine; what the one holding the message did with it,
    or None when none answered within ``wait_s`` (or the broker lets us give no orders).
    Every engine carries the order out on any copy of the message it meets for a while after
    (``orders.KEEP_MS``), answered or not."""
    order = Order.new(action, message_id, reply_topic(layout), due_ms=due_ms)
    for answer in ask(broker, layout, order, wait_s, answers=1):
        return order.answered(answer.headers)
    return None


def take(
    broker: StagingBroker,
    layout: Layout,
    message_id: str,
    *,
    then: Callable[[Message], None] | None = None,
    patience_s: float = PATIENCE_S,
) -> Message | None:
    """Remove the staged copy of ``message_id`` from whichever staging queue holds it, calling
    ``then`` with it before it is removed. None when no staging queue has it; Busy when one
    has it but the engine held it for all of ``patience_s``."""
    deadline = time.monotonic() + patience_s
    while True:
        found = find(broker, layout, message_id)
        if found is None:
            return None
        queue, _ = found
        taken = broker.take(queue, envelope.MESSAGE_ID, message_id, then)
        if taken is not None:
            return taken
        if time.monotonic() >= deadline:
            raise Busy(
                f"staged message {message_id} on {queue} is held by the staging engine "
                f"(being moved or released now); try again"
            )
        time.sleep(0.1)


def find(broker: StagingBroker, layout: Layout, message_id: str) -> tuple[str, Message] | None:
    """The staging queue and staged copy of ``message_id``, without consuming it."""
    for queue in layout.queues:
        for message in broker.browse(queue):
            if message.headers.get(envelope.MESSAGE_ID) == message_id:
                return queue, message
    return None


def release_now(
    broker: StagingBroker, layout: Layout, message_id: str, *,
    patience_s: float = PATIENCE_S, answer_s: float = ANSWER_S,
) -> OrderOutcome | None:
    """Deliver a staged message to its target now: hold the staged copy, put the restored
    message to its target (confirmed), and only then remove the staged copy (a crash in
    between duplicates, never loses); or have the engine that holds it do the same. None when
    neither the staging queues nor a running engine have it."""

    def deliver(message: Message) -> None:
        info = envelope.Staged.of(message.headers)
        now = time.time_ns() // 1_000_000
        headers = envelope.released_headers(message.headers, broker.format, now_ms=now)
        broker.publish(info.target, Message(headers, message.body), mandatory=info.mandatory)

    return _carry_out(broker, layout, OrderAction.RELEASE, message_id, deliver, patience_s,
                      answer_s)


def reschedule(
    broker: StagingBroker, layout: Layout, message_id: str, due_ms: int, *,
    patience_s: float = PATIENCE_S, answer_s: float = ANSWER_S,
) -> OrderOutcome | None:
    """Move a staged message's due time to ``due_ms``, earlier or later: hold the staged copy,
    put a copy due at ``due_ms`` on the staging level for it (confirmed), and only then remove
    the old copy (a crash in between leaves both: duplicated, never lost); or have the engine
    that holds it do the same. Refused (MQRC_EXPIRY_ERROR) when its time to live would end
    first, as a delayed send is. None when neither the staging queues nor a running engine
    have it."""

    def restage(message: Message) -> None:
        info = envelope.Staged.of(message.headers)
        if info.expires_ms is not None and due_ms >= info.expires_ms:
            raise Refused(MQRC_EXPIRY_ERROR,
                          f"staged message {message_id} expires at {_iso(info.expires_ms)}, "
                          f"before its new due time {_iso(due_ms)}")
        now = time.time_ns() // 1_000_000
        headers = envelope.hop_headers(message.headers, now_ms=now)
        headers[envelope.DUE] = str(due_ms)
        headers.pop(envelope.RETRY_AT, None)
        queue = layout.queue_for(due_ms - now)
        broker.publish(broker.format.client_destination(queue), Message(headers, message.body))

    outcome = _carry_out(broker, layout, OrderAction.RESCHEDULE, message_id, restage, patience_s,
                         answer_s, due_ms=due_ms)
    if outcome is not None and outcome.done == EXPIRY_ERROR:
        raise Refused(MQRC_EXPIRY_ERROR,
                      f"staged message {message_id} expires before its new due time "
                      f"{_iso(due_ms)}")
    return outcome

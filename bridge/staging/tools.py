"""``jms-bridge staged list|count|cancel|release``: operators' view of pending messages.

Staged copies are found by their original message id (``jms-bridge-message-id``, which is
also their correlation id, as on IBM MQ's staging queue) or by target.

A running engine holds the messages it has taken ahead: one due within about a second, and the
first 1,000 (the level prefetch) of each level of up to about a minute, so most messages due
within about two minutes. No other connection can take those from the broker, so cancel and
release, when the staging queues do not give them the message, send their order to the
running engines (``bridge.staging.orders``) and wait up to ``ANSWER_S`` for the one holding it
to answer. ``list`` and ``count`` browse the queues; where the broker does not show the
messages consumers hold (RabbitMQ: a get does not see unacknowledged messages), they also ask
every running engine (as many as the ready queue has consumers) for the ones it holds.

With ten million pending, reading the queues takes half an hour. Bridges that keep a staged
catalogue (``bridge.staging.catalogue``) answer instead: ``list`` (and ``count --target``)
asks every running engine for its catalogue's rows and what it holds, and reads no queue when
every one of them keeps one (``scan=True`` reads the queues anyway: the truth, slowly).
``cancel`` finds the message there too; one due later than an engine remembers an order
(``orders.CANCEL_LEAD_MS``) is cancelled by staging the order itself, to come due just before
the message, and by telling the running engines now (they take it out of their catalogues).
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import functools
import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

import structlog

from adapters.base import Message, StagedFormat, StagingBroker
from bridge.staging import envelope, series
from bridge.staging.levels import Layout
from bridge.staging.orders import (
    CANCEL_LEAD_MS,
    CATALOGUE,
    ENGINE,
    EXPIRY_ERROR,
    MOVED_FORGOTTEN,
    NOTE,
    NOTE_DETAIL,
    NOTE_DUE,
    NOTE_EXPIRES,
    NOTE_TARGET,
    Order,
    OrderAction,
    destination,
    rows_of,
)
from bridge.staging.outcomes import Kind
from bridge.staging.selection import compile_for, picks
from policies.errors import BridgeError, BrokerUnavailable, PutRefused, Refused
from policies.naming import target_forms
from policies.reasons import MQRC_EXPIRY_ERROR
from policies.selector import Selector

# How long cancel and release wait for a message the engine holds: ActiveMQ pushes a level's
# head to the engine's peek subscription, where it stays until the engine's next look at that
# level (the engine's recheck, 5 s) unless it is due sooner.
PATIENCE_S = 8.0
# How long cancel and release wait for an engine to answer an order. An engine hears it at its
# next poll: within milliseconds when idle, later while it settles a burst. (So does an engine
# asked for what it holds.)
ANSWER_S = 2.0
# Added to the time a listing asks the engines to remember their moves for: the engines'
# clocks and the tool's do not tick quite alike.
MOVED_MARGIN_MS = 1_000


@dataclass(frozen=True, slots=True)
class Row:
    message_id: str
    target: str
    due_ms: int
    size: int
    queue: str
    series: str = ""  # a scheduler series' copy: what remains of it (``series.summary``)

    @classmethod
    def of(cls, row: dict[str, object]) -> Row:
        """A row of an engine's list answer; KeyError or ValueError when it is not one."""
        return cls(str(row["message_id"]), str(row["target"]), int(str(row["due_ms"])),
                   int(str(row["size"])), str(row["queue"]), str(row.get("series", "")))

    @property
    def due(self) -> str:
        return dt.datetime.fromtimestamp(self.due_ms / 1000, dt.UTC).isoformat(
            timespec="milliseconds"
        )


def rows(
    broker: StagingBroker,
    layout: Layout,
    *,
    target: str | None = None,
    message_id: str | None = None,
    answer_s: float = ANSWER_S,
    unseen: dict[str, tuple[int, int]] | None = None,
    scan: bool = False,
    selector: str | None = None,
    warnings: list[str] | None = None,
) -> Iterator[Row]:
    """The staged messages on the staging queues, and those the running engines hold where the
    broker does not show them (each once); or, unless ``scan``, what the running engines
    answer from their staged catalogues when every one keeps one. ``unseen`` gets the queues
    whose browse showed fewer messages than the broker counts on them: queue -> (shown,
    counted). ``selector``: only the messages this JMS selector selects, over their own
    headers (``bridge.staging.selection``); InvalidSelector when it does not parse.
    ``warnings`` gets what an operator must know of messages that may be missing: a running
    engine that did not answer in time, one that forgot some of what it moved meanwhile.

    The queues are read in the order messages move through them (``scan_order``), and the
    engines are asked last, for what they hold and what they let go of onto a staging queue
    since the reading began: a message moving meanwhile is listed (once) wherever it went."""
    # A queue's target however it was written (/queue/X, /amq/queue/X): each message once.
    listed: set[str] = set()
    for form in (None,) if target is None else target_forms(target, broker.format.broker):
        for row in _rows(broker, layout, form, message_id, answer_s, unseen, scan, selector,
                         warnings):
            if row.message_id not in listed:
                listed.add(row.message_id)
                yield row


def _rows(broker: StagingBroker, layout: Layout, target: str | None, message_id: str | None,
          answer_s: float, unseen: dict[str, tuple[int, int]] | None, scan: bool,
          selector: str | None, warnings: list[str] | None) -> Iterator[Row]:
    compiled = None if selector is None else compile_for(selector, broker.format.broker)
    if not scan:
        catalogued = catalogued_rows(broker, layout, target=target, message_id=message_id,
                                     wait_s=answer_s, selector=selector)
        if catalogued is not None:
            yield from catalogued
            return
    seen: set[str] = set()
    started = time.monotonic()
    for row in _queued_rows(broker, layout, target=target, message_id=message_id,
                            unseen=unseen, selector=compiled):
        if row.message_id not in seen:
            seen.add(row.message_id)
            yield row
    for row in held_rows(broker, layout, target=target, message_id=message_id,
                         wait_s=answer_s, selector=selector, since=started,
                         warnings=warnings):
        if row.message_id not in seen:
            seen.add(row.message_id)
            yield row


def staged_messages(
    broker: StagingBroker, layout: Layout, *, answer_s: float = ANSWER_S
) -> Iterator[Message]:
    """Every staged copy, with its headers and body: those on the staging queues, and those the
    running engines hold where the broker does not show them (each once)."""
    seen: set[str] = set()
    for queue in layout.queues:
        for message in broker.browse(queue):
            message_id = message.headers.get(envelope.MESSAGE_ID)
            if message_id is None or envelope.TARGET not in message.headers:
                continue
            seen.add(message_id)
            yield message
    if broker.sees_held or not broker.consumers(layout.ready):
        return
    order = Order.new(OrderAction.LIST, "", _reply_topic(layout), bodies=True)
    for answer in _ask(broker, layout, order, answer_s,
                       answers=broker.consumers(layout.ready)):
        try:
            for row in rows_of(answer.body):
                headers, body = row.get("headers"), row.get("body")
                if not isinstance(headers, dict) or not isinstance(body, str):
                    continue
                message_id = str(headers.get(envelope.MESSAGE_ID, ""))
                if message_id and message_id not in seen:
                    seen.add(message_id)
                    yield Message({str(k): str(v) for k, v in headers.items()},
                                  base64.b64decode(body))
        except (KeyError, ValueError) as error:
            structlog.get_logger("staging.tools").warning("ignored a bad list answer",
                                                          error=str(error))


def count(broker: StagingBroker, layout: Layout, *, answer_s: float = ANSWER_S,
          warnings: list[str] | None = None) -> int:
    """How many staged copies wait: the broker's own count of each staging queue (one request
    per queue, however many are pending), plus those the running engines hold where the broker
    does not count them (RabbitMQ's unacknowledged messages). Unlike ``rows`` it reads no
    message, so a duplicate a crash left counts twice; ``rows`` (``--target``) counts it once.
    Reading every message takes time in proportion to the number pending (docs/benchmarks.md:
    over half an hour at 10 million on RabbitMQ). A message moving between two queues while
    they are counted may count twice, never zero times (``rows``)."""
    started = time.monotonic()
    total = sum(broker.depths(scan_order(layout)).values())
    held = held_rows(broker, layout, target=None, message_id=None, wait_s=answer_s,
                     since=started, warnings=warnings, visible=broker.sees_held)
    return total + len(held)


def catalogued_rows(
    broker: StagingBroker, layout: Layout, *, target: str | None, message_id: str | None,
    wait_s: float, selector: str | None = None,
) -> list[Row] | None:
    """What the running engines answer from their staged catalogues, with what they hold;
    None unless an engine runs and every one answered from a catalogue within ``wait_s``."""
    engines: list[int] = []
    running = functools.partial(_running, broker, layout, engines)

    # RabbitMQ counts the engines at once (a passive declare); ActiveMQ's statistics plugin may
    # not answer a user it is not for (a 10 s wait, then the connection dropped), so there it
    # is asked only once an engine has answered.
    if not broker.sees_held and running() == 0:
        return None
    order = Order.new(OrderAction.LIST, message_id or "", _reply_topic(layout), target=target,
                      catalogue=True, selector=selector)
    answers = _ask(broker, layout, order, wait_s, answers=engines[-1] if engines else running,
                   quiet=True)
    if not answers or not engines or len(answers) < engines[-1] or any(
            CATALOGUE not in a.headers for a in answers):
        return None
    found: dict[str, Row] = {}
    for answer in answers:
        try:
            for row in map(Row.of, rows_of(answer.body)):
                if not _internal(row, layout):
                    found.setdefault(row.message_id, row)
        except (KeyError, ValueError) as error:
            structlog.get_logger("staging.tools").warning("a bad list answer", error=str(error))
            return None
    return sorted(found.values(), key=lambda r: r.due_ms)


def _running(broker: StagingBroker, layout: Layout, engines: list[int]) -> int:
    """How many staging engines run (the consumers of the ready queue), also noted in
    ``engines``; 0 when the broker will not say."""
    try:
        engines.append(broker.consumers(layout.ready))
    except (BrokerUnavailable, Refused):
        engines.append(0)
    return engines[-1]


def _internal(row: Row, layout: Layout) -> bool:
    """A staged cancel (its target is the control topic), not an application's message."""
    return row.target == destination(layout.control)


def held_rows(
    broker: StagingBroker, layout: Layout, *, target: str | None, message_id: str | None,
    wait_s: float, selector: str | None = None, since: float | None = None,
    warnings: list[str] | None = None, visible: bool = False,
) -> list[Row]:
    """What the running engines hold, from their answers to a list order, and (``since``:
    a ``time.monotonic()``) what they let go of onto a staging queue since then: it waits for
    one answer per consumer of the ready queue (each engine has one), up to ``wait_s``, and
    says in ``warnings`` how many did not answer. ``visible``: leave out what they hold on
    the queues the broker shows (a count has counted it), keep what they moved."""
    engines: list[int] = []
    running = functools.partial(_running, broker, layout, engines)

    # RabbitMQ counts the engines at once; ActiveMQ's statistics plugin may not answer a user
    # it is not for (a 10 s wait), so there it is asked once an engine has answered.
    if not broker.sees_held and running() == 0:
        return []
    # The engines' memory of moves must reach back to the start of the reading, when the
    # answer is made (up to ``wait_s`` after the order is sent).
    moved_ms = (None if since is None
                else round((time.monotonic() - since + wait_s) * 1000) + MOVED_MARGIN_MS)
    order = Order.new(OrderAction.LIST, message_id or "", _reply_topic(layout), target=target,
                      selector=selector, moved_ms=moved_ms)
    answers = _ask(broker, layout, order, wait_s, answers=engines[-1] if engines else running,
                   quiet=broker.sees_held)
    found: list[Row] = []
    forgot: list[str] = []
    for answer in answers:
        if MOVED_FORGOTTEN in answer.headers:
            forgot.append(answer.headers.get(ENGINE, "?"))
        try:
            found += (Row.of(r) for r in rows_of(answer.body) if not visible or r.get("moved"))
        except (KeyError, ValueError) as error:
            structlog.get_logger("staging.tools").warning("ignored a bad list answer",
                                                          error=str(error))
    if warnings is not None:
        counted = engines[-1] if engines else (running() if not answers else 0)
        if len(answers) < counted:
            names = ", ".join(sorted(a.headers.get(ENGINE, "?") for a in answers)) or "none"
            warnings.append(
                f"warning: {counted - len(answers)} of the {counted} running staging engines "
                f"did not answer within {wait_s:g} s (answered: {names}); the messages they "
                "hold are not listed or counted here")
        if forgot:
            warnings.append(
                f"warning: the staging engine(s) {', '.join(sorted(forgot))} no longer remember "
                "every message they moved while this read the staging queues; a message moved "
                "then may be missing here")
    return found


def _queued_rows(
    broker: StagingBroker,
    layout: Layout,
    *,
    target: str | None = None,
    message_id: str | None = None,
    unseen: dict[str, tuple[int, int]] | None = None,
    selector: Selector | None = None,
) -> Iterator[Row]:
    # ActiveMQ shows a browser only the first maxBrowsePageSize (400 by default) messages of a
    # queue, held ones included, and says nothing of the rest: compare with its own counts.
    counted: dict[str, int] = {}
    if unseen is not None and broker.sees_held:
        try:
            counted = broker.depths(layout.queues)
        except (BrokerUnavailable, Refused) as error:  # a user the statistics are not for
            structlog.get_logger("staging.tools").debug(
                "cannot compare with the broker's counts", error=str(error))
    for queue in scan_order(layout):
        shown = 0
        for message in broker.browse(queue):
            shown += 1
            try:
                info = envelope.Staged.of(message.headers)
            except (KeyError, ValueError):
                continue
            if target is not None and info.target != target:
                continue
            if message_id is not None and info.message_id != message_id:
                continue
            if selector is not None and not picks(selector, message.headers):
                continue
            row = Row(info.message_id, info.target, info.due_ms, len(message.body), queue,
                      series.summary(message.headers))
            if not _internal(row, layout):
                yield row
        if unseen is not None and shown < counted.get(queue, 0):
            unseen[queue] = (shown, counted[queue])


def scan_order(layout: Layout) -> tuple[str, ...]:
    """The staging queues in the order messages move through them: the longest level first,
    the ready queue last. A message only hops to a shorter level or the ready queue, its new
    copy confirmed before the old one is acknowledged, so a listing that reads in this order
    meets a message moving during it at least once: in the queue it left or in the one it
    entered, read later."""
    return (*(q for _, q in reversed(layout.levels)), layout.ready)


def unseen_warning(unseen: dict[str, tuple[int, int]]) -> str:
    """What an operator needs to know about a list or count that could not see every message."""
    shown = sum(s for s, _ in unseen.values())
    counted = sum(c for _, c in unseen.values())
    return (f"warning: the broker showed {shown:,} of the {counted:,} messages it counts on "
            f"{len(unseen)} staging queue(s) ({', '.join(sorted(unseen))}); the rest are not "
            f"listed or counted here. ActiveMQ lets a browser see only the first "
            f"maxBrowsePageSize (400 by default) messages of a queue")


def render(items: list[Row], *, as_json: bool) -> str:
    if as_json:
        return json.dumps([{**asdict(r), "due": r.due} for r in items], indent=2)
    if not items:
        return "no staged messages"
    lines = [f"{'MESSAGE ID':<48} {'TARGET':<32} {'DUE (UTC)':<29} {'SIZE':>8}"]
    if any(r.series for r in items):
        lines[0] += "  SERIES"
    for r in sorted(items, key=lambda r: r.due_ms):
        line = f"{r.message_id:<48} {r.target:<32} {r.due:<29} {r.size:>8}"
        lines.append(f"{line}  {r.series}" if r.series else line)
    return "\n".join(lines)


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
         due_ms: int | None = None, detail: str = "") -> bool:
    """Tell one running engine what this tool did itself to ``staged`` (a note on the ready
    queue, which the engines share: one takes it and records the event in its journal, its
    catalogue and its counters). False when no engine runs (nothing is sent): the tool
    records it itself, if it can."""
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
    try:
        broker.publish(broker.format.client_destination(layout.ready), Message(headers, body))
    except PutRefused as refused:
        structlog.get_logger("staging.tools").warning(
            "cannot hand the event to a running engine", error=str(refused))
        return False
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
    order = Order.new(action, message_id, _reply_topic(layout), due_ms=due_ms)
    for answer in _ask(broker, layout, order, wait_s, answers=1):
        return order.answered(answer.headers)
    return None


def _reply_topic(layout: Layout) -> str:
    """A topic of this tool's own for the engines' answers (under the control topic's name,
    so the clients' guard keeps clients of the bridge off it)."""
    return f"{layout.control}.reply.{uuid.uuid4().hex}"


def _ask(
    broker: StagingBroker, layout: Layout, order: Order, wait_s: float, *,
    answers: int | Callable[[], int], quiet: bool = False,
) -> list[Message]:
    """Publish ``order`` on the control topic and collect up to ``answers`` answers to it
    within ``wait_s``; none when the broker does not let us give orders (logged; at debug
    level when ``quiet``). ``answers`` may be a function, asked once the first answer has come
    (how many engines run: nothing is asked of the broker when none answers)."""
    reply = order.reply_topic
    assert reply is not None
    try:
        broker.listen(reply)
        broker.publish(destination(layout.control), order.message())
    except (Refused, PutRefused) as refused:
        log = structlog.get_logger("staging.tools")
        (log.debug if quiet else log.warning)(
            "cannot give the running staging engines an order", order=order.action.value,
            message_id=order.message_id or None, error=str(refused))
        return []
    got: list[Message] = []
    deadline = time.monotonic() + wait_s
    wanted = answers if isinstance(answers, int) else 1
    while len(got) < wanted and (left := deadline - time.monotonic()) > 0:
        for held in broker.poll(left):
            if held.queue == reply and order.answered(held.message.headers):
                got.append(held.message)
        if got and not isinstance(answers, int) and wanted == 1:
            wanted = max(1, answers())
    return got


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

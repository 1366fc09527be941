"""Operators' orders to the running staging engines: cancel or release one staged message, or
list the ones they hold.

A running engine holds the messages it has taken ahead (each short level's prefetch, the ready
heap), and no other connection can take those from the broker (RabbitMQ does not even show
them). So ``jms-bridge staged cancel`` and ``release`` also publish an order on the control topic
(``Layout.control``) that every engine listens to. An engine that holds the message settles it
at once (drops it, or puts it to its target) and answers on the reply topic the order names.
Every engine also remembers the order for ``KEEP_MS``, and carries it out on a copy of that
message it meets later: one that was between two queues when the order came, or a duplicate
left by a crash. A list order is answered by every engine with the messages it holds (those
RabbitMQ does not show on the queues), and, when it asks, with the rows of the engine's staged
catalogue (``bridge.staging.catalogue``); it is not remembered.

A cancel of a message due long after an engine's memory of it would last is staged itself,
to come due a little before the message (``CANCEL_LEAD_MS``): its release puts the order on
the control topic then, in its body. Nothing here does I/O.
"""

from __future__ import annotations

import base64
import collections
import json
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from adapters.base import Held, Message
from bridge.staging.catalogue import Entry
from bridge.staging.envelope import DUE, MESSAGE_ID, PREFIX, TARGET
from bridge.staging.outcomes import Kind
from bridge.staging.series import JOB as SERIES_JOB
from bridge.staging.series import summary as series_summary

ORDER = PREFIX + "order"  # "cancel" or "release"
ORDER_ID = PREFIX + "order-id"  # names the order in its answers
REPLY_TOPIC = PREFIX + "reply-topic"  # where answers go (a topic name)
DONE = PREFIX + "done"  # on an answer: what was done ("cancelled", "released")
# On a LIST order: "1" = answer from your staged catalogue too. On its answer: how many rows came
# from the catalogue (absent: the engine keeps none).
CATALOGUE = PREFIX + "catalogue"
SELECTOR = PREFIX + "selector"  # on a LIST order: only the messages this JMS selector selects
ORDER_DUE = PREFIX + "order-due"  # on a RESCHEDULE order: the new due time, epoch ms
# On a LIST order: also answer with the messages you let go of onto a staging queue (hops,
# retries, heads put back, reschedules) this many ms before you answer: a listing that read
# that queue before the message entered it would otherwise miss it.
MOVED_WITHIN = PREFIX + "moved-within"
# On a LIST answer: "1" when the engine no longer remembers every such move of that time.
MOVED_FORGOTTEN = PREFIX + "moved-forgotten"
ENGINE = PREFIX + "engine"  # on a LIST answer: which engine answered (host:pid)
# On a rescheduled copy: the order that made it (that order is not carried out on it again).
RESCHEDULED_BY = PREFIX + "rescheduled-by"
# A tool's note on the ready queue of what it did itself to a staged message (an event kind:
# "cancelled", "released-now", "rescheduled"): the one engine that takes it records the event
# (its journal, its staged catalogue, its counters), so the event is recorded once, by the
# process that keeps the journal. Its body: {"size": body bytes, "headers": the staged copy's}.
NOTE = PREFIX + "note"
NOTE_TARGET = PREFIX + "note-target"
NOTE_DUE = PREFIX + "note-due"  # its due time (rescheduled: the new one)
NOTE_EXPIRES = PREFIX + "note-expires"
NOTE_DETAIL = PREFIX + "note-detail"
# What an engine answers a reschedule whose new due time is not before the message's expiry.
EXPIRY_ERROR = "expiry-error"
# On a LIST order: "1" = each row with the staged copy's headers and body (base64): what the
# scheduler's management destination browses (``bridge.staging.listing.staged_messages``).
BODIES = PREFIX + "bodies"
KEEP_MS = 600_000
# A staged cancel comes due this long before its message: every engine then remembers it for
# KEEP_MS, through the message's own due time, and the engine holding the message (it takes a
# level's head up to about a minute early) lets go of it.
CANCEL_LEAD_MS = 300_000
KEEP_MAX = 10_000  # orders remembered at once; the oldest are forgotten first


class OrderAction(Enum):
    CANCEL = "cancel"
    RELEASE = "release"
    LIST = "list"
    RESCHEDULE = "reschedule"


# The order a tool's note stands for (the tool did it itself and told an engine): its answer says
# the event is recorded.
NOTED_ACTIONS = {Kind.CANCELLED: OrderAction.CANCEL, Kind.RELEASED_NOW: OrderAction.RELEASE,
                 Kind.RESCHEDULED: OrderAction.RESCHEDULE}


@dataclass(frozen=True, slots=True)
class Order:
    action: OrderAction
    message_id: str  # the original message id (``jms-bridge-message-id``); LIST: "" = any
    order_id: str
    reply_topic: str | None = None
    target: str | None = None  # LIST: only messages for this target
    catalogue: bool = False  # LIST: from the engine's staged catalogue too
    selector: str | None = None  # LIST: only the messages it selects (a JMS selector)
    due_ms: int | None = None  # RESCHEDULE: the new due time
    moved_ms: int | None = None  # LIST: with the messages moved within this many ms
    bodies: bool = False  # LIST: the held copies' headers and bodies too

    @classmethod
    def new(
        cls, action: OrderAction, message_id: str, reply_topic: str | None, *,
        target: str | None = None, catalogue: bool = False, selector: str | None = None,
        due_ms: int | None = None, moved_ms: int | None = None, bodies: bool = False,
    ) -> Order:
        return cls(action, message_id, uuid.uuid4().hex, reply_topic, target, catalogue,
                   selector, due_ms, moved_ms, bodies)

    @classmethod
    def of_message(cls, message: Message) -> Order:
        """The order a control message carries in its headers, or in its body as a JSON
        object of the same headers: a cancel staged to come due (``staged_cancel``), whose
        own headers the release has made an application's again."""
        if ORDER in message.headers or not message.body.startswith(b"{"):
            return cls.of(message.headers)
        try:
            fields = json.loads(message.body)
        except ValueError:
            raise ValueError("no order: a control message body that is not JSON") from None
        if not isinstance(fields, dict):
            raise ValueError("no order: a control message body that is not a JSON object")
        return cls.of({str(k): str(v) for k, v in fields.items()})

    @classmethod
    def of(cls, headers: dict[str, str]) -> Order:
        """The order a control message carries; ValueError when it is not one."""
        try:
            action = OrderAction(headers.get(ORDER, ""))
        except ValueError:
            raise ValueError(f"no order: {ORDER}={headers.get(ORDER)!r}") from None
        message_id, order_id = headers.get(MESSAGE_ID, ""), headers.get(ORDER_ID)
        if not order_id or not (message_id or action is OrderAction.LIST):
            raise ValueError(f"an order needs {MESSAGE_ID} and {ORDER_ID}")
        due = headers.get(ORDER_DUE)
        if action is OrderAction.RESCHEDULE and not (due and due.isascii() and due.isdigit()):
            raise ValueError(f"a reschedule order needs {ORDER_DUE} (epoch ms)")
        moved = headers.get(MOVED_WITHIN, "")
        return cls(action, message_id, order_id, headers.get(REPLY_TOPIC) or None,
                   headers.get(TARGET) or None, headers.get(CATALOGUE) == "1",
                   headers.get(SELECTOR) or None, int(due) if due else None,
                   int(moved) if moved.isascii() and moved.isdigit() else None,
                   headers.get(BODIES) == "1")

    def headers(self) -> dict[str, str]:
        headers = {ORDER: self.action.value, MESSAGE_ID: self.message_id, ORDER_ID: self.order_id}
        if self.reply_topic:
            headers[REPLY_TOPIC] = self.reply_topic
        if self.target:
            headers[TARGET] = self.target
        if self.catalogue:
            headers[CATALOGUE] = "1"
        if self.selector:
            headers[SELECTOR] = self.selector
        if self.due_ms is not None:
            headers[ORDER_DUE] = str(self.due_ms)
        if self.moved_ms is not None:
            headers[MOVED_WITHIN] = str(self.moved_ms)
        if self.bodies:
            headers[BODIES] = "1"
        return headers

    def message(self) -> Message:
        return Message(self.headers(), b"")

    def listing(
        self, held: Iterable[Held], catalogued: Sequence[Entry] | None = None,
        picks: Callable[[Mapping[str, str]], bool] | None = None,
    ) -> Message:
        """A LIST order's answer: the held staged messages it asks for, and ``catalogued``
        (the engine's catalogue's rows, when asked and kept), as JSON rows (what ``jms-bridge
        staged list`` shows: message id, target, due time, size, queue)."""
        return self.answer_rows(self.held_rows(held, picks), catalogued)

    def held_rows(
        self, held: Iterable[Held], picks: Callable[[Mapping[str, str]], bool] | None = None,
        *, seen: set[str] | None = None,
    ) -> list[dict[str, object]]:
        """The rows of the held staged messages this LIST order asks for (``picks``: its
        compiled selector, over a staged copy's headers); with ``bodies``, each row with its
        staged copy's headers and body (base64)."""
        held = list(held)
        rows = self.copy_rows(((h.queue, h.message.headers, len(h.message.body)) for h in held),
                              picks, seen=seen)
        if self.bodies:
            copies = {h.message.headers.get(MESSAGE_ID): h.message for h in held}
            for row in rows:
                copy = copies.get(str(row["message_id"]))
                if copy is not None:
                    row["headers"] = dict(copy.headers)
                    row["body"] = base64.b64encode(copy.body).decode()
        return rows

    def copy_rows(
        self, copies: Iterable[tuple[str, Mapping[str, str], int]],
        picks: Callable[[Mapping[str, str]], bool] | None = None, *, seen: set[str] | None = None,
        moved: bool = False,
    ) -> list[dict[str, object]]:
        """``held_rows`` of staged copies given as (queue, headers, body size), each message
        once (``seen``: the (target, message id) keys already given, added to: a staged cancel
        shares its message's id, not its target). ``moved``: copies let go of
        onto ``queue`` (their rows say so: a count has counted them there, or not)."""
        rows: list[dict[str, object]] = []
        seen = set() if seen is None else seen
        for queue, headers, size in copies:
            message_id, target = headers.get(MESSAGE_ID), headers.get(TARGET)
            if message_id is None or target is None:
                continue
            if (self.message_id and message_id != self.message_id) or (
                self.target and target != self.target
            ):
                continue
            key = f"{target}\n{message_id}"
            if key in seen or (picks is not None and not picks(headers)):
                continue
            try:
                due_ms = int(headers.get(DUE, ""))
            except ValueError:
                continue
            seen.add(key)
            rows.append({"message_id": message_id, "target": target, "due_ms": due_ms,
                         "size": size, "queue": queue, **({"moved": 1} if moved else {})})
            if SERIES_JOB in headers:
                rows[-1]["series"] = series_summary(headers)
        return rows

    def answer_rows(
        self, rows: list[dict[str, object]], catalogued: Sequence[Entry] | None = None
    ) -> Message:
        """The answer of held ``rows`` and ``catalogued``."""
        answer = self.answer("listed")
        if catalogued is not None:
            held_ids = {r["message_id"] for r in rows}
            # The catalogue knows where a message entered the staging queues, not where it is
            # now: no queue.
            rows += [{"message_id": e.message_id, "target": e.target, "due_ms": e.due_ms,
                      "size": e.size, "queue": ""}
                     for e in catalogued if e.message_id not in held_ids]
            answer.headers[CATALOGUE] = str(len(catalogued))
        return Message(answer.headers, json.dumps(rows).encode())

    def answer(self, done: str) -> Message:
        """What an engine that carried it out answers: ``done`` is what it did ("cancelled",
        "released", or "expired": a message whose time to live was up is never delivered)."""
        return Message({DONE: done, MESSAGE_ID: self.message_id, ORDER_ID: self.order_id}, b"")

    def answered(self, headers: dict[str, str]) -> str | None:
        """What was done, if ``headers`` are an answer to this order."""
        return headers.get(DONE) if headers.get(ORDER_ID) == self.order_id else None


def rows_of(body: bytes) -> list[dict[str, object]]:
    """The rows of a LIST answer; ValueError when it is not one."""
    rows = json.loads(body)
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ValueError("a list answer is a JSON list of objects")
    return rows


def destination(topic: str) -> str:
    """The STOMP destination that publishes to ``topic`` on both brokers."""
    return "/topic/" + topic


class Orders:
    """The orders an engine remembers, by message id, each for ``keep_ms`` after it came."""

    def __init__(self, keep_ms: int = KEEP_MS, keep_max: int = KEEP_MAX) -> None:
        self.keep_ms = keep_ms
        self.keep_max = keep_max
        self._by_id: collections.OrderedDict[str, tuple[int, Order]] = collections.OrderedDict()

    def __bool__(self) -> bool:
        return bool(self._by_id)

    def __len__(self) -> int:
        return len(self._by_id)

    def add(self, order: Order, now_ms: int) -> None:
        self._by_id.pop(order.message_id, None)
        self._by_id[order.message_id] = (now_ms + self.keep_ms, order)
        self.forget(now_ms)
        while len(self._by_id) > self.keep_max:
            self._by_id.popitem(last=False)

    def restore(self, order: Order, until_ms: int) -> None:
        """An order remembered before a restart (the staged catalogue kept it)."""
        self._by_id[order.message_id] = (until_ms, order)

    def get(self, message_id: str | None, now_ms: int) -> Order | None:
        """The order for ``message_id`` that still stands at ``now_ms``."""
        if message_id is None:
            return None
        entry = self._by_id.get(message_id)
        if entry is None or entry[0] <= now_ms:
            return None
        return entry[1]

    def done(self, message_id: str) -> None:
        """Forget the order for ``message_id``: carried out, it is not to be met again."""
        self._by_id.pop(message_id, None)

    def forget(self, now_ms: int) -> None:
        """Drop the orders whose time is up (they are kept in the order they came)."""
        by_id = self._by_id
        while by_id:
            until, _ = next(iter(by_id.values()))
            if until > now_ms:
                return
            by_id.popitem(last=False)

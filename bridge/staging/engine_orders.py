"""The staging engine's side of operators' orders (``bridge.staging.orders``): carried out on
the copies of a message the engine holds, and answered on the reply topic they name."""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import json
import os
import socket
import sqlite3

from structlog.typing import FilteringBoundLogger

from adapters.base import Held, Message, Move, StagingBroker
from bridge.staging.catalogue import Catalogue
from bridge.staging.engine_holding import Holding
from bridge.staging.engine_release import Releaser
from bridge.staging.engine_work import Destinations, Work, WorkKind
from bridge.staging.envelope import DUE, MESSAGE_ID, RETRY_AT, Staged, hop_headers
from bridge.staging.levels import Layout
from bridge.staging.orders import (
    ENGINE,
    EXPIRY_ERROR,
    MOVED_FORGOTTEN,
    NOTE,
    NOTE_DETAIL,
    NOTE_DUE,
    NOTE_EXPIRES,
    NOTE_TARGET,
    NOTED_ACTIONS,
    ORDER_ID,
    REPLY_TOPIC,
    RESCHEDULED_BY,
    Order,
    OrderAction,
    Orders,
    destination,
)
from bridge.staging.outcomes import Kind, MessageOutcome
from bridge.staging.selection import compile_for, picks
from policies.errors import InvalidSelector, PutRefused

_NAME = f"{socket.gethostname()}:{os.getpid()}"


class OperatorOrders:
    """The orders heard on the control topic: those that stand, carried out on each copy of
    their message met; the list orders being answered; the answers to send."""

    def __init__(
        self,
        broker: StagingBroker,
        layout: Layout,
        *,
        log: FilteringBoundLogger,
        catalogue: Catalogue | None,
        standing: Orders,
        answers: list[tuple[str, Message]],
        holding: Holding,
        destinations: Destinations,
        releaser: Releaser,
    ) -> None:
        """``standing``: the orders (cancel, release now...) by message id, carried out on the
        held copy at once and on any copy met while they stand; ``answers``: (reply topic,
        answer) to publish, the settler's included; ``holding``: the engine's held copies,
        taken out of it when an order names them."""
        self.broker = broker
        self.layout = layout
        self.log = log
        self.catalogue = catalogue
        self.standing = standing
        self._answers = answers
        self._holding = holding
        self._dest = destinations
        self._releaser = releaser
        # List orders the catalogue's reader thread is answering: (reply topic, answer).
        self._listings: list[tuple[str, concurrent.futures.Future[Message]]] = []

    def take(self, message: Message, now_ms: int) -> None:
        """An order heard on the control topic: remember it, and carry it out on every copy
        of its message this engine holds (settled with the next releases)."""
        try:
            order = Order.of_message(message)
        except ValueError as error:
            self.log.warning("ignored a message on the control topic", error=str(error))
            return
        catalogue = self.catalogue
        if order.action is OrderAction.LIST:
            if not order.reply_topic:
                return
            selector = None
            if order.selector:
                try:
                    selector = compile_for(order.selector, self.broker.format.broker)
                except InvalidSelector as error:  # the tool checked it: not from our tools
                    self.log.warning("ignored a list order", error=str(error))
                    return
            picked = None if selector is None else functools.partial(picks, selector)
            rows, reply = self._listed_rows(order, picked, now_ms), order.reply_topic
            forgotten = (order.moved_ms is not None
                         and self._holding.moved_forgotten_ms >= now_ms - order.moved_ms)
            if not (order.catalogue and catalogue is not None):
                self._answers.append((reply, self._signed(order.answer_rows(rows), forgotten)))
                return

            # Every message whose send was confirmed before this order has had its row offered
            # to a writer (the bridge's, before it forwarded the send): wait for those rows, or
            # answer without the catalogue (the tool then reads the queues).
            offered = catalogue.offered()

            def answer(catalogue: Catalogue = catalogue) -> Message:  # on its reader thread
                if not catalogue.caught_up(offered):
                    self.log.warning("the staged catalogue's writers are behind: a list order "
                                     "answered without it (the tool reads the queues)")
                    return self._signed(order.answer_rows(rows), forgotten)
                return self._signed(order.answer_rows(rows, catalogue.entries(
                    now_ms=now_ms, target=order.target, message_id=order.message_id or None,
                    selector=selector)), forgotten)

            self._listings.append((reply, catalogue.later(answer)))
            return
        if order.action is OrderAction.RESCHEDULE:
            if any(self._too_late(order, h) for h in self._holding.held()
                   if h.message.headers.get(MESSAGE_ID) == order.message_id):
                if order.reply_topic:
                    self._answers.append((order.reply_topic, order.answer(EXPIRY_ERROR)))
                return
        self.standing.add(order, now_ms)
        if catalogue is not None and order.action is not OrderAction.RESCHEDULE:
            # (A reschedule's new row comes with its outcome; it is not kept past a restart:
            # the copy it made says which order made it.)
            catalogue.forget([order.message_id])
            catalogue.remember(order.message_id, order.action.value, now_ms + self.standing.keep_ms)
        found = self._holding.unhold(order.message_id)
        self._holding.forget_moved(order.message_id)
        self.log.info("operator order", order=order.action.value, message_id=order.message_id,
                      held=len(found))
        for held, staged in found:
            self._holding.pending.append(self.carry_out(order, held, staged, now_ms))
        # Look at every peeked level's head now (``next_look`` has only those): ActiveMQ pushes
        # a head to the engine's peek subscription, where no one else can take it, long before
        # the engine looks at it.
        self._holding.next_look.clear()

    def order_for(self, held: Held, message_id: str, now_ms: int) -> Order | None:
        """The standing order to carry out on this copy of ``message_id``: not a reschedule
        on the copy it made, nor one its time to live would end before."""
        order = self.standing.get(message_id, now_ms)
        if order is None or order.action is not OrderAction.RESCHEDULE:
            return order
        if (order.due_ms is None or held.message.headers.get(RESCHEDULED_BY) == order.order_id
                or self._too_late(order, held)):
            return None
        return order

    @staticmethod
    def _too_late(order: Order, held: Held) -> bool:
        """A reschedule past the message's expiry (IBM MQ's rule: MQRC_EXPIRY_ERROR)."""
        try:
            expires = Staged.of(held.message.headers).expires_ms
        except (KeyError, ValueError):
            return False
        return expires is not None and order.due_ms is not None and order.due_ms >= expires

    def noted(self, held: Held, now_ms: int) -> Work:
        """A tool's note of what it did itself: acknowledged, its event recorded here."""
        headers = held.message.headers
        try:
            kind = Kind(headers[NOTE])
            fields = json.loads(held.message.body or b"{}")
            copy = fields.get("headers") if isinstance(fields, dict) else None
            expires = headers.get(NOTE_EXPIRES)
            outcome = MessageOutcome(
                kind, now_ms, headers[MESSAGE_ID], headers[NOTE_TARGET], int(headers[NOTE_DUE]),
                int(expires) if expires else None, detail=headers.get(NOTE_DETAIL, ""),
                size=int(fields.get("size", 0)) if isinstance(fields, dict) else None,
                headers={str(k): str(v) for k, v in copy.items()}
                if isinstance(copy, dict) else None)
        except (KeyError, ValueError, TypeError) as error:
            self.log.warning("ignored a bad note from a tool", error=str(error))
            return Work(WorkKind.NOTED, Move(held))
        self._holding.forget_moved(headers[MESSAGE_ID])
        # The tool waits for the answer, sent once the event is recorded: a listing it makes
        # next finds the catalogue up to date.
        action = NOTED_ACTIONS.get(kind)
        reply, order_id = headers.get(REPLY_TOPIC), headers.get(ORDER_ID)
        order = (Order(action, headers[MESSAGE_ID], order_id, reply)
                 if action is not None and reply and order_id else None)
        return Work(WorkKind.NOTED, Move(held), noted=outcome, order=order)

    def restore(self, now_ms: int) -> None:
        """The orders the catalogue kept, remembered again (after a restart: a staged cancel
        heard before it must still drop its message)."""
        if self.catalogue is None:
            return
        for message_id, action, until_ms in self.catalogue.remembered(now_ms):
            with contextlib.suppress(ValueError):
                self.standing.restore(Order(OrderAction(action), message_id, "restored"), until_ms)

    def _listed_rows(
        self, order: Order, picked: functools.partial[bool] | None, now_ms: int
    ) -> list[dict[str, object]]:
        """A list order's rows: what this engine holds (the moves it is about to settle
        included: settled after this answer, they could land on a queue the listing has
        read), and what it let go of onto a staging queue within the order's ``moved_ms``."""
        seen: set[str] = set()
        rows = order.held_rows(self._holding.held(), picked, seen=seen)  # (with bodies, when asked)
        rows += order.copy_rows(
            ((w.move.held.queue, w.move.held.message.headers, len(w.move.held.message.body))
             for w in self._holding.pending if w.staged is not None), picked, seen=seen)
        if order.moved_ms is not None:
            since = now_ms - order.moved_ms
            rows += order.copy_rows(self._holding.listed_moved(since), picked, seen=seen,
                                    moved=True)
        return rows

    @staticmethod
    def _signed(answer: Message, forgotten: bool) -> Message:
        answer.headers[ENGINE] = _NAME
        if forgotten:
            answer.headers[MOVED_FORGOTTEN] = "1"
        return answer

    def carry_out(self, order: Order, held: Held, staged: Staged, now_ms: int) -> Work:
        """The move that does what ``order`` says with one held copy of its message."""
        if order.action is OrderAction.CANCEL:
            return Work(WorkKind.CANCEL, Move(held), staged, order=order)
        if order.action is OrderAction.RESCHEDULE and order.due_ms is not None:
            due = order.due_ms
            headers = hop_headers(held.message.headers, now_ms=now_ms)
            headers[DUE] = str(due)
            headers.pop(RETRY_AT, None)
            headers[RESCHEDULED_BY] = order.order_id
            queue = self.layout.queue_for(due - now_ms)
            dest = self._dest.of(queue)
            moved = Staged(staged.target, due, staged.sent_ms, now_ms, staged.expires_ms,
                           staged.message_id)
            return Work(WorkKind.RESCHEDULE, Move(held, dest, Message(headers, held.message.body)),
                        moved, queue=queue, order=order, error=f"was due at {staged.due_ms}")
        if staged.expires_ms is not None and staged.expires_ms <= now_ms:
            return Work(WorkKind.EXPIRE, Move(held), staged, order=order)
        work = self._releaser.released(held, staged, now_ms, go_on=False)  # a series ends here
        work.kind, work.order = WorkKind.RELEASE_NOW, order
        return work

    def answer(self) -> None:
        """Send the answers that are ready: to the orders just carried out, and to the list
        orders the catalogue's reader thread has finished."""
        if self._listings:
            self._listed()
        if self._answers:
            self._answer()

    def _listed(self) -> None:
        """The answers to list orders the catalogue's reader thread has finished."""
        waiting = []
        for reply, future in self._listings:
            if not future.done():
                waiting.append((reply, future))
                continue
            try:
                self._answers.append((reply, future.result()))
            except (sqlite3.Error, concurrent.futures.CancelledError) as error:
                self.log.warning("cannot read the staged catalogue", error=str(error))
        self._listings = waiting

    def _answer(self) -> None:
        """Tell the tools that gave the orders just carried out (a lost answer only makes a
        tool look on the queues and say it found nothing)."""
        answers = self._answers[:]
        self._answers.clear()
        for topic, answer in answers:
            try:
                self.broker.publish(destination(topic), answer)
            except PutRefused as refused:
                self.log.warning("cannot answer an operator order", topic=topic,
                                 error=str(refused))

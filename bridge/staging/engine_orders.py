"""The staging engine's side of operators' orders (``bridge.staging.orders``): carried out on
the copies of a message the engine holds, and answered on the reply topic they name."""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import heapq
import sqlite3
from collections.abc import Iterator
from typing import TYPE_CHECKING

from structlog.typing import FilteringBoundLogger

from adapters.base import Held, Message, Move, StagingBroker
from bridge.staging.catalogue import Catalogue
from bridge.staging.engine_work import Work, WorkKind
from bridge.staging.envelope import MESSAGE_ID, Staged
from bridge.staging.orders import Action, Order, Orders, destination
from policies.errors import PutRefused


class OperatorOrders:
    """The orders part of ``bridge.staging.engine.Engine``; the state is ``Engine.__init__``'s."""

    log: FilteringBoundLogger
    broker: StagingBroker
    _orders: Orders
    _answers: list[tuple[str, Message]]
    _pending: list[Work]
    _peeked: list[str]
    _next_look: dict[str, int]
    _buffers: dict[str, collections.deque[tuple[int, Held]]]
    _hops: collections.deque[tuple[Held, Staged]]
    _heap: list[tuple[int, int, Held, Staged]]
    catalogue: Catalogue | None
    _listings: list[tuple[str, concurrent.futures.Future[Message]]]

    if TYPE_CHECKING:  # the engine's: the move that releases a held message now
        def _released(
            self, held: Held, staged: Staged, now_ms: int, *, go_on: bool = True
        ) -> Work: ...

    def _take_order(self, message: Message, now_ms: int) -> None:
        """An order heard on the control topic: remember it, and carry it out on every copy
        of its message this engine holds (settled with the next releases)."""
        try:
            order = Order.of_message(message)
        except ValueError as error:
            self.log.warning("ignored a message on the control topic", error=str(error))
            return
        catalogue = self.catalogue
        if order.action is Action.LIST:
            if not order.reply_topic:
                return
            if not (order.catalogue and catalogue is not None):
                self._answers.append((order.reply_topic, order.listing(self._held())))
                return
            rows, reply = order.held_rows(self._held()), order.reply_topic

            def answer(catalogue: Catalogue = catalogue) -> Message:  # on its reader thread
                return order.answer_rows(rows, catalogue.entries(
                    now_ms=now_ms, target=order.target, message_id=order.message_id or None))

            self._listings.append((reply, catalogue.later(answer)))
            return
        self._orders.add(order, now_ms)
        if catalogue is not None:
            catalogue.forget([order.message_id])
            catalogue.remember(order.message_id, order.action.value, now_ms + self._orders.keep_ms)
        found = self._unhold(order.message_id)
        self.log.info("operator order", order=order.action.value, message_id=order.message_id,
                      held=len(found))
        for held, staged in found:
            self._pending.append(self._carry_out(order, held, staged, now_ms))
        # Look at every peeked level's head now: ActiveMQ pushes a head to the engine's peek
        # subscription, where no one else can take it, long before the engine looks at it.
        for queue in self._peeked:
            self._next_look.pop(queue, None)

    def _restore_orders(self, now_ms: int) -> None:
        """The orders the catalogue kept, remembered again (after a restart: a staged cancel
        heard before it must still drop its message)."""
        if self.catalogue is None:
            return
        for message_id, action, until_ms in self.catalogue.remembered(now_ms):
            with contextlib.suppress(ValueError):
                self._orders.restore(Order(Action(action), message_id, "restored"), until_ms)

    def _held(self) -> Iterator[Held]:
        """Every staged message the engine holds between steps."""
        for buffer in self._buffers.values():
            for _, held in buffer:
                yield held
        for held, _ in self._hops:
            yield held
        for entry in self._heap:
            yield entry[2]

    def _unhold(self, message_id: str) -> list[tuple[Held, Staged]]:
        """Take every held copy of ``message_id`` out of the level buffers, the hops to settle
        and the release heap. (One in ``_pending`` is being settled already.)"""
        found: list[tuple[Held, Staged]] = []

        def match(held: Held) -> bool:
            return held.message.headers.get(MESSAGE_ID) == message_id

        for queue, buffer in self._buffers.items():
            if any(match(held) for _, held in buffer):
                keep = collections.deque[tuple[int, Held]]()
                for entry in buffer:
                    if match(entry[1]):
                        found.append((entry[1], Staged.of(entry[1].message.headers)))
                    else:
                        keep.append(entry)
                self._buffers[queue] = keep
        if any(match(held) for held, _ in self._hops):
            found += [(h, s) for h, s in self._hops if match(h)]
            self._hops = collections.deque((h, s) for h, s in self._hops if not match(h))
        if any(match(entry[2]) for entry in self._heap):
            found += [(e[2], e[3]) for e in self._heap if match(e[2])]
            self._heap = [e for e in self._heap if not match(e[2])]
            heapq.heapify(self._heap)
        return found

    def _carry_out(self, order: Order, held: Held, staged: Staged, now_ms: int) -> Work:
        """The move that does what ``order`` says with one held copy of its message."""
        if order.action is Action.CANCEL:
            return Work(WorkKind.CANCEL, Move(held), staged, order=order)
        if staged.expires_ms is not None and staged.expires_ms <= now_ms:
            return Work(WorkKind.EXPIRE, Move(held), staged, order=order)
        work = self._released(held, staged, now_ms, go_on=False)  # a series ends here
        work.kind, work.order = WorkKind.RELEASE_NOW, order
        return work

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
        answers, self._answers = self._answers, []
        for topic, answer in answers:
            try:
                self.broker.publish(destination(topic), answer)
            except PutRefused as refused:
                self.log.warning("cannot answer an operator order", topic=topic,
                                 error=str(refused))

"""The staging engine's level mover: takes the level heads that exit and hops them down a level
or holds them for release; takes the ready queue's deliveries into the release heap; and hands
the settler what is due.

Each level queue holds messages that all wait the same time, so only its head matters. A short
level is streamed: its deliveries wait in a buffer in ``Holding`` until their exit, with no round
trip per head. A long level is peeked: its head is looked at, and either put back (not looked at
again until it exits) or moved on. A head that exits goes to the queue for the time it still has
to wait (a lower level, or the ready queue), or is held for release when that is within the
horizon; one that is due is released.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

from adapters.base import Held, Message, Move, StagingBroker
from bridge.staging.engine_holding import Holding
from bridge.staging.engine_orders import OperatorOrders
from bridge.staging.engine_release import Releaser
from bridge.staging.engine_settling import Settler
from bridge.staging.engine_work import Destinations, Work, WorkKind
from bridge.staging.envelope import (
    EXPIRED_ON,
    MESSAGE_ID,
    Staged,
    hop_headers,
    staged_headers,
)
from bridge.staging.failures import FailurePath
from bridge.staging.levels import MIN_LEVEL, Layout
from bridge.staging.orders import NOTE

HORIZON_MS = 1 << MIN_LEVEL
# Levels whose dwell is at most this are consumed with a prefetch, their heads held in memory
# (no round trip per head, held far less than RabbitMQ's 30 min consumer timeout); longer
# levels are peeked and their heads put back.
STREAM_MAX_MS = 1 << 16
# A streamed level's head is taken up to this long before it exits. Messages sent in a burst
# leave their levels in a burst too (a 10,000-message burst of 1-10 s delays had 4,600 exits
# from the 4 s level within a second, more than the engine settles in that time); taken early,
# that work spreads over the time before the exits. A head taken early goes to the queue for the
# time it has left then, or is held for release when that is under HORIZON_MS + LEAD_MS.
LEAD_MS = 1 << (MIN_LEVEL - 1)
# Streamed heads are taken off their buffers (no I/O) and sorted at once: those to hold go to the
# release heap, those to hop wait in a queue of their own, and the hops are settled with the
# releases, SLICE of them when a release is due within SOON_MS, else up to the batch. A hop's
# next queue is chosen when it is settled, from the time left then: one that waited so long
# that it is due within the horizon is held instead. So a burst of exits never keeps a release
# waiting, and the longer hops wait, the fewer of them are needed.
SLICE = 16
SOON_MS = 5
# Heads taken between two looks at whether a held message has come due.
CHECK_EVERY = 64


def streamed_levels(layout: Layout) -> list[str]:
    """The level queues consumed with a prefetch (the others are peeked), shortest first."""
    return [queue for dwell, queue in layout.levels if dwell <= STREAM_MAX_MS]


class LevelMover:
    """Walks the staged messages down the level queues and into the release heap."""

    def __init__(
        self,
        broker: StagingBroker,
        layout: Layout,
        *,
        clock: Callable[[], int],
        holding: Holding,
        destinations: Destinations,
        failures: FailurePath,
        settler: Settler,
        releaser: Releaser,
        orders: OperatorOrders,
        batch: int,
        lead_ms: int,
        idle_ms: int,
        recheck_ms: int,
    ) -> None:
        """``holding`` has a buffer for each streamed level (``streamed_levels``);
        ``failures`` says which of the broker's expiries to keep; ``orders`` are carried out
        on the copies met. ``idle_ms``: how often the engine looks when there is nothing to
        do; ``recheck_ms``: how often, at least, a put-back head is looked at again."""
        self.broker = broker
        self.layout = layout
        self.clock = clock
        self._holding = holding
        self._dest = destinations
        self.failures = failures
        self._settler = settler
        self._releaser = releaser
        self._orders = orders
        self.batch = batch
        self.lead_ms = lead_ms
        self._recheck_ms = recheck_ms
        # ActiveMQ gives the same head to repeated peeks until it is settled, so a level yields
        # one head per settle there; RabbitMQ (basic.get) gives the next one.
        self._peek_advances = broker.format.peek_advances
        self._dwell = {queue: dwell for dwell, queue in layout.levels}
        self.streamed = list(holding.buffers)
        self.peeked = [q for q in self._dwell if q not in holding.buffers]
        # An empty level is looked at again after an eighth of its dwell (within the idle poll
        # and the recheck): a message entering it is then seen long before it can exit, and an
        # idle engine peeks the slow levels rarely (an empty peek costs a wait on ActiveMQ).
        self._empty_ms = {
            queue: min(max(dwell // 8, idle_ms), recheck_ms)
            for queue, dwell in self._dwell.items()
        }

    # -- level queues -----------------------------------------------------------------------

    def move(self, now_ms: int, work: list[Work], *, peek: bool = True) -> bool:
        """Take every level head that may exit by now; settle the moves, after ``work`` (the
        releases that are due), in one call, or two when a level is peeked (a round trip each,
        so the releases are settled first); the peeked levels only with ``peek``. Returns
        whether the batch limit left exits behind."""
        holding = self._holding
        looks = holding.next_look
        due_levels = sorted(
            (looks.get(queue, -1), queue) for queue in self.peeked
            if looks.get(queue, -1) <= now_ms
        ) if peek else []
        releasing = bool(work)
        taken = 0  # level messages held by this call: moves and holds
        more = False
        for queue, buffer in holding.buffers.items():  # heads in memory: no round trip
            dwell = self._dwell[queue]
            while buffer and buffer[0][0] <= now_ms:
                if taken >= self.batch or (
                    taken % CHECK_EVERY == CHECK_EVERY - 1 and self._ready_due()
                ):
                    more = True
                    break
                _, head = buffer.popleft()
                item = self._exit(head, dwell, now_ms, lead_ms=self.lead_ms, streamed=True)
                assert not isinstance(item, int)
                taken += 1
                if item.kind is WorkKind.HOLD:
                    assert item.staged is not None
                    holding.hold(head, item.staged)
                elif item.kind is WorkKind.HOP:
                    assert item.staged is not None
                    holding.hops.append((head, item.staged))
                else:
                    work.append(item)
        work += self._take_hops()
        more = more or bool(holding.hops)
        for i, (_, queue) in enumerate(due_levels):
            # Peeks take time (a wait, on ActiveMQ, when a level is empty): once one level is
            # done, a ready message come due meanwhile goes first and the rest wait a step.
            if taken >= self.batch or (i and self._ready_due()):
                more = True
                break
            if releasing:  # a peek is a round trip: the releases go first
                self._settler.settle(work, now_ms)
                work, releasing = [], False
            dwell = self._dwell[queue]
            while taken < self.batch:  # at most ``batch`` level messages taken at once
                held = self.broker.peek(queue)
                if held is None:
                    looks[queue] = now_ms + self._empty_ms[queue]
                    break
                item = self._exit(held, dwell, now_ms)
                if isinstance(item, int):
                    self.broker.put_back(held)
                    holding.let_go(queue, held.message.headers, len(held.message.body), now_ms)
                    looks[queue] = min(item, now_ms + self._recheck_ms)
                    break
                taken += 1
                if item.kind is WorkKind.HOLD:
                    assert item.staged is not None
                    holding.hold(held, item.staged)
                    continue
                work.append(item)
                if not self._peek_advances:
                    looks[queue] = now_ms
                    more = True
                    break
            else:
                looks[queue] = now_ms
                more = True
        self._settler.settle(work, now_ms)
        return more

    def _take_hops(self) -> list[Work]:
        """The hop moves to settle now, their queues chosen for the time left now: SLICE of
        them when a release is due within SOON_MS, else up to the batch. A head with less than
        the horizon (and the lead) left by now is held instead."""
        hops = self._holding.hops
        if not hops:
            return []
        now_ms = self.clock()
        heap = self._holding.heap
        limit = SLICE if heap and heap[0][0] - now_ms <= SOON_MS else self.batch
        out: list[Work] = []
        hold_under = HORIZON_MS + self.lead_ms
        while hops and len(out) < limit:
            held, staged = hops.popleft()
            if staged.due_ms - now_ms < hold_under:
                self._holding.hold(held, staged)
            else:
                out.append(self._hop(held, staged, now_ms))
        return out

    def _ready_due(self) -> bool:
        """Whether a held ready message has come due while the levels were being looked at."""
        heap = self._holding.heap
        return bool(heap) and heap[0][0] <= self.clock()

    def _exit(
        self, held: Held, dwell: int, now_ms: int, *, lead_ms: int = 0, streamed: bool = False
    ) -> Work | int:
        """What to do with a level head: a move, or (when it is still waiting) when to look again:
        its exit time, less ``lead_ms`` (a head may be taken that much early). A ``streamed``
        head (delivered by a subscription) can always be held for release, and its HOP is only
        named: ``_take_hops`` builds it when it is settled."""
        try:
            staged = Staged.of(held.message.headers)
        except (KeyError, ValueError) as error:
            return self._settler.invalid(held, error)
        orders = self._orders
        if orders.standing and (order := orders.order_for(held, staged.message_id, now_ms)):
            return orders.carry_out(order, held, staged, now_ms)
        if staged.expires_ms is not None and staged.expires_ms <= now_ms:
            return Work(WorkKind.EXPIRE, Move(held), staged)
        if staged.due_ms <= now_ms:  # late (the engine was away): straight to the target
            return self._releaser.released(held, staged, now_ms)
        exit_ms = staged.entered_ms + dwell - lead_ms
        if exit_ms > now_ms:
            return exit_ms
        if (streamed or self._peek_advances) and staged.due_ms - now_ms < HORIZON_MS + lead_ms:
            # Due within the horizon: hold it for release as a ready message would be held,
            # instead of putting it to the ready queue first. One put instead of two; held
            # for under a second, and given back if the connection goes.
            return Work(WorkKind.HOLD, Move(held), staged)
        if streamed:
            return Work(WorkKind.HOP, Move(held), staged)
        return self._hop(held, staged, now_ms)

    def _hop(self, held: Held, staged: Staged, now_ms: int) -> Work:
        queue = self.layout.queue_for(staged.due_ms - now_ms)
        message = Message(hop_headers(held.message.headers, now_ms=now_ms), held.message.body)
        return Work(WorkKind.HOP, Move(held, self._dest.of(queue), message), staged, queue=queue)

    # -- the subscriptions -----------------------------------------------------------------

    def absorb(self, delivered: Sequence[Held], now_ms: int, *, expiries: str | None) -> None:
        """Take the subscriptions' deliveries: the ready queue's into the heap, the streamed
        levels' into their buffers, the control topic's orders to the operator orders, and the
        broker's expiries (from the queue ``expiries``) and the tools' notes to settle."""
        control, orders, holding = self.layout.control, self._orders, self._holding
        heard: list[Held] = []
        for held in delivered:
            if held.queue == control:
                heard.append(held)
                continue
            if held.queue == expiries:
                holding.pending.append(self._broker_expired(held, now_ms))
                continue
            if NOTE in held.message.headers:
                holding.pending.append(orders.noted(held, now_ms))
                continue
            buffer = holding.buffers.get(held.queue)
            try:
                staged = Staged.of(held.message.headers)
            except (KeyError, ValueError) as error:
                holding.pending.append(self._settler.invalid(held, error))
                continue
            if orders.standing and (order := orders.order_for(held, staged.message_id, now_ms)):
                holding.pending.append(orders.carry_out(order, held, staged, now_ms))
                continue
            if buffer is not None:
                buffer.append((staged.entered_ms + self._dwell[held.queue] - self.lead_ms, held))
                continue
            if staged.due_ms - now_ms >= 2 * HORIZON_MS:
                # Not ours to hold (a clock step, a tool): back to the level it belongs in,
                # so the prefetch is kept for what is due soon.
                holding.pending.append(self._hop(held, staged, now_ms))
                continue
            holding.hold(held, staged)
        # Orders last: a list order's answer then has every delivery of this poll in it (a
        # listing reads the queues first, where a message on its way here shows nowhere).
        for held in heard:
            orders.take(held.message, now_ms)

    def _broker_expired(self, held: Held, now_ms: int) -> Work:
        """A message the broker expired on its own: dropped unless it asked for a report or to
        be kept, or its destination's policy names an expiry destination; then, read as a
        staged copy that expired, it takes the staged expiry's path (the settler's), its move to
        the undelivered queue kept on the staging queues if that queue refuses it."""
        expiry = self.broker.expiry_of(held.message)
        if expiry is None or self.failures.routine_expiry(expiry.message.headers,
                                                          expiry.destination):
            return Work(WorkKind.DROP, Move(held))
        headers = expiry.message.headers
        id_header = self.broker.format.message_id_header
        if expiry.message_id and MESSAGE_ID not in headers and not (
            id_header and headers.get(id_header)
        ):  # ActiveMQ's own id: the application's message id
            headers = {**headers, MESSAGE_ID: expiry.message_id}
        sent = headers.get("timestamp", "")
        sent_ms = int(sent) if sent.isdigit() else expiry.expired_ms
        staged = dict(staged_headers(
            headers, self.broker.format, target=expiry.destination,
            staging_destination=self._dest.ready, due_ms=expiry.expired_ms, sent_ms=sent_ms,
            expires_ms=expiry.expired_ms, drop=()))
        staged[EXPIRED_ON] = expiry.destination
        copy = Held(held.queue, Message(staged, held.message.body), held.token)
        return Work(WorkKind.EXPIRE, Move(copy), Staged.of(staged))

    def release(self, now_ms: int) -> None:
        """Release every held message that is due, in one settle call."""
        self._settler.settle(self.due(now_ms), now_ms)

    def due(self, now_ms: int) -> list[Work]:
        """The releases (and expiries) of the held messages that are due, with the moves
        ``poll`` found."""
        holding = self._holding
        work, holding.pending = holding.pending, []
        heap = holding.heap
        while heap and heap[0][0] <= now_ms:
            _, _, held, staged = heapq.heappop(heap)
            if staged.expires_ms is not None and staged.expires_ms <= now_ms:
                work.append(Work(WorkKind.EXPIRE, Move(held), staged))
            else:
                work.append(self._releaser.released(held, staged, now_ms))
        return work

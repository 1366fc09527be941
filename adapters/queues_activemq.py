"""``adapters.queues.QueueTools`` on ActiveMQ, over the staging adapter's STOMP connection.

ActiveMQ pages a queue into memory a few hundred messages at a time (``maxPageSize`` 200,
``maxBrowsePageSize`` 400) and pages in no more while those are held unacknowledged or match
no selector: a browser sees at most 400 messages, a selector past the first page sees nothing,
and a consumer that holds what it keeps stalls. So a sweep goes round the queue once: every
message it visits is acknowledged in a STOMP transaction together with what becomes of it, and
a message it keeps is sent again to the queue's tail in that same transaction. After a whole
round the kept messages are in their old order (a round stopped part-way by a kill leaves
them rotated, and the next whole round puts them back); their JMSMessageID is new, so a kept
message gets ``jms-bridge-message-id`` (its original id) if it had none. Messages that arrive
during a round land between the kept ones and those not yet visited.

Each batch is BEGIN, the SENDs (the last with a receipt: once it is answered, an ERROR for any
of them is in too, and a refused one aborts the batch before any of its ACKs count), the ACKs,
COMMIT: killed before the COMMIT, the broker rolls it all back and the messages come again. A
batch is committed as soon as no more messages are waiting (ActiveMQ may hold the next ones
back until it is).

``inspect`` of a queue of at most ``maxBrowsePageSize`` messages is a browser subscription
(nothing changes); of a longer one, a round with every message kept.
"""

from __future__ import annotations

import contextlib
import queue as queues
import re
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence

from stomp.exception import StompException  # type: ignore[import-untyped]
from stomp.utils import Frame  # type: ignore[import-untyped]

from adapters.activemq import ActiveMQ, message_from_frame
from adapters.activemq_connection import activemq_reason
from adapters.activemq_puts import valid_destination
from adapters.activemq_transport import StompConnection
from adapters.base import Message
from adapters.queues import KEEP, Drop, Found, Keep, Put, SweepAction, SweepReport, Visit
from policies.errors import BrokerUnavailable, PutRefused
from policies.reasons import MQRC_UNKNOWN_OBJECT_NAME

BROWSE_PAGE = 400  # ActiveMQ's default maxBrowsePageSize
# Messages acknowledged in a transaction not yet committed still count against the page-in
# limit (maxPageSize, 200): a batch must stay below it, or the broker stops dispatching.
MAX_BATCH = 150
IDLE_S = 2.0  # no message for this long, nothing pending: the queue has no more for us
LIST_TIMEOUT_S = 5.0
ORIGINAL_ID = "jms-bridge-message-id"
# How long a refused COMMIT waits for the late ERROR of the SEND that made it fail.
LATE_ERROR_S = 2.0


def _refused(why: str, sends: Sequence[tuple[str, Message, bool]], undone: str) -> PutRefused:
    """A transaction's SEND refused with ``why``: PutRefused naming its destinations."""
    where = ", ".join(sorted({w for w, _, _ in sends}))
    return PutRefused(0, activemq_reason(why), f"{why}: {undone}", where)


class ActiveMQQueues(ActiveMQ):
    """The staging adapter plus the dead-letter tools' port."""

    # -- sizes ---------------------------------------------------------------------------------

    def queue_sizes(self, matching: str | None = None) -> dict[str, int]:
        """From one statistics request for every queue (``>``): its destination wildcards
        cannot say ``matching``, so the names are picked here."""
        pick = re.compile(matching).search if matching is not None else None
        sizes: dict[str, int] = {}
        try:
            for name, values in self._statistics_rows(">", LIST_TIMEOUT_S):
                if not name.startswith("queue://"):
                    continue
                name = name.removeprefix("queue://")
                if pick is None or pick(name):
                    sizes[name] = int(str(values.get("size", 0)))
            return sizes
        except queues.Empty:
            self._close_statistics()
            raise BrokerUnavailable(f"{self._where()}: no answer listing the queues") from None
        except (StompException, OSError, ValueError) as exc:
            self._close_statistics()
            raise BrokerUnavailable(f"{self._where()}: statistics: {exc!r}") from exc

    def size(self, queue: str) -> int | None:
        return self.depth(queue)

    # -- looking -------------------------------------------------------------------------------

    def inspect(self, queue: str) -> Iterator[Found]:
        if self.depth(queue) <= BROWSE_PAGE:
            with contextlib.closing(self._browse(queue)) as frames:
                for i, frame in enumerate(frames):
                    yield Found(message_from_frame(frame), frame.headers.get("message-id", ""), i)
            return
        report = SweepReport()
        round_ = self._round(queue, lambda _f: KEEP, None, MAX_BATCH, None, None, report)
        try:
            for found in round_:  # noqa: UP028 - closing this must not close the round
                yield found
        finally:
            for _ in round_:  # stopped early: finish the round, so the order is kept
                pass

    def sweep(
        self,
        queue: str,
        decide: Callable[[Found], SweepAction],
        *,
        limit: int | None = None,
        batch: int = 500,
        before_commit: Callable[[Sequence[Visit]], None] | None = None,
        after_commit: Callable[[Sequence[Visit]], None] | None = None,
    ) -> SweepReport:
        report = SweepReport()
        for _ in self._round(queue, decide, limit, batch, before_commit, after_commit, report):
            pass
        return report

    def _round(
        self,
        queue: str,
        decide: Callable[[Found], SweepAction],
        limit: int | None,
        batch: int,
        before_commit: Callable[[Sequence[Visit]], None] | None,
        after_commit: Callable[[Sequence[Visit]], None] | None,
        report: SweepReport,
    ) -> Generator[Found, None, None]:
        count = self.depth(queue)
        if count == 0:
            return
        batch = max(1, min(batch, MAX_BATCH))
        inbox: queues.Queue[Frame | None] = queues.Queue()
        sid = self._subscribe(queue, inbox, ack="client-individual",
                              **{"activemq.prefetchSize": str(min(2 * batch, count))})
        pending: list[tuple[Frame, Visit]] = []
        acted = 0
        try:
            while report.seen < count:
                try:
                    # With work pending, commit it as soon as nothing more has arrived: the
                    # broker may be holding the next messages back until it is.
                    frame = inbox.get_nowait() if pending else inbox.get(timeout=IDLE_S)
                except queues.Empty:
                    if pending:
                        self._commit(queue, pending, before_commit, after_commit, report)
                        continue
                    break
                if frame is None:
                    self._live()
                    break
                found = Found(message_from_frame(frame), frame.headers.get("message-id", ""),
                              report.seen)
                report.seen += 1
                action = decide(found) if limit is None or acted < limit else KEEP
                if not isinstance(action, Keep):
                    acted += 1
                pending.append((frame, Visit(found, action)))
                yield found
                if len(pending) >= batch:
                    self._commit(queue, pending, before_commit, after_commit, report)
            self._commit(queue, pending, before_commit, after_commit, report)
        finally:
            if sid in self._listener.routes:  # (not after ``_committed`` opened a new one)
                with contextlib.suppress(BrokerUnavailable):
                    self._unsubscribe(sid)  # what was delivered and not committed goes back

    def _commit(
        self,
        queue: str,
        pending: list[tuple[Frame, Visit]],
        before_commit: Callable[[Sequence[Visit]], None] | None,
        after_commit: Callable[[Sequence[Visit]], None] | None,
        report: SweepReport,
    ) -> None:
        if not pending:
            return
        acting = [v for _, v in pending if not isinstance(v.action, Keep)]
        if before_commit is not None and acting:
            before_commit(acting)
        undone = "nothing of this batch was done"
        _check_destinations((v.action.destination for _, v in pending
                             if isinstance(v.action, Put)), undone)
        conn = self._live()
        tx = f"jb-sweep-{next(self._ids)}"
        targets = [(frame, *self._target(queue, visit)) for frame, visit in pending]
        sends = [(w, m, "content-length" not in f.headers) for f, w, m in targets
                 if w is not None]
        errors = self._begin_with_sends(conn, tx, sends, "sweep SEND", undone)
        done = self._receipt()
        with self._translate(), conn.transport.corked():
            for frame, _ in pending:
                conn.ack(frame.headers["ack"], transaction=tx)
            conn.commit(tx, receipt=done)
        self._committed(done, "sweep COMMIT", sends, undone, errors, acked=True)
        for _, visit in pending:
            if isinstance(visit.action, Keep):
                report.kept += 1
            elif isinstance(visit.action, Drop):
                report.dropped += 1
            else:
                report.put += 1
        if after_commit is not None and acting:
            after_commit(acting)
        pending.clear()

    def put_all(self, puts: Sequence[Put], *, text: bool = False) -> None:
        undone = "none of them was put"
        _check_destinations((put.destination for put in puts), undone)
        if not puts:
            return
        conn = self._live()
        tx = f"jb-put-{next(self._ids)}"
        sends = [(p.destination, p.message, text) for p in puts]
        errors = self._begin_with_sends(conn, tx, sends, "put SEND", undone)
        done = self._receipt()
        with self._translate():
            conn.commit(tx, receipt=done)
        self._committed(done, "put COMMIT", sends, undone, errors)

    def _begin_with_sends(
        self, conn: StompConnection, tx: str, sends: Sequence[tuple[str, Message, bool]], what: str,
        undone: str,
    ) -> int:
        """BEGIN ``tx`` and its SENDs (destination, message, as a text message); PutRefused
        saying ``undone``, the transaction aborted, when the broker refuses any of them.
        Returns how many ERRORs naming no receipt there were before (for ``_committed``)."""
        # Only the last SEND asks for a receipt (a receipt on each made ActiveMQ take each
        # SEND of a transaction one by one: 3 ms apiece here). An ERROR for a SEND before it
        # is usually in by then; when it comes later, the COMMIT is refused (``_committed``).
        errors = len(self._listener.errors)
        barrier = self._receipt()
        with self._translate(), conn.transport.corked():
            conn.begin(tx, **({} if sends else {"receipt": barrier}))
            for i, (where, message, text) in enumerate(sends):
                extra = {"receipt": barrier} if i == len(sends) - 1 else {}
                self._send(conn, where, message, text=text, transaction=tx, **extra)
        why = self._await_all([barrier], what).get(barrier)
        if why is None and len(self._listener.errors) > errors:
            why = self._listener.errors[-1]
        if why is not None:
            with self._translate():
                conn.abort(tx)
            raise _refused(why, sends, undone)
        return errors

    def _committed(self, done: str, what: str, sends: Sequence[tuple[str, Message, bool]],
                   undone: str, errors: int, *, acked: bool = False) -> None:
        """Wait for the COMMIT's receipt ``done``. ActiveMQ answers a transaction's frames
        asynchronously: the ERROR (naming no receipt) of a SEND it refused can come after the
        last SEND's receipt (seen in CI, in the staging engine's settle), and the COMMIT is
        then refused ("Transaction marked rollback only"), nothing of it done. That ERROR,
        waited for up to LATE_ERROR_S, is the refusal, as ``_begin_with_sends`` says it.
        ``acked``: the transaction held ACKs (a sweep's). Their messages are then neither
        delivered again nor browsable until the connection closes (seen here: a sweep's five
        came back only on a new connection), so a new connection is opened before the
        refusal is raised."""
        try:
            self._await([done], what)
        except BrokerUnavailable:
            listener = self._listener
            with listener.cv:
                listener.cv.wait_for(lambda: len(listener.errors) > errors, LATE_ERROR_S)
                late = listener.errors[errors] if len(listener.errors) > errors else None
            if late is None:
                raise
            if acked:
                self.close()
                self.connect()
            raise _refused(late, sends, undone) from None

    @staticmethod
    def _target(queue: str, visit: Visit) -> tuple[str | None, Message]:
        action, message = visit.action, visit.found.message
        if isinstance(action, Put):
            return action.destination, action.message
        if isinstance(action, Drop):
            return None, message
        headers = dict(message.headers)
        if visit.found.broker_id:
            headers.setdefault(ORIGINAL_ID, visit.found.broker_id)
        return f"/queue/{queue}", Message(headers, message.body)


def _check_destinations(destinations: Iterable[str], undone: str) -> None:
    """PutRefused for the first destination ActiveMQ's STOMP cannot name."""
    for destination in destinations:
        if not valid_destination(destination):
            raise PutRefused(0, MQRC_UNKNOWN_OBJECT_NAME,
                             f"not a destination ActiveMQ's STOMP can send to: {undone}",
                             destination)

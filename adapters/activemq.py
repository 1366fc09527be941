"""ActiveMQ through stomp.py (STOMP 1.2, heart-beats), the staging interface.

The connection, receipts and the translation of stomp.py's errors are
``adapters.activemq_connection``'s; settling and publishing ``adapters.activemq_puts``'s; queue
depths (the statistics plugin) ``adapters.activemq_statistics``'s.

What this relies on, checked against ActiveMQ 5.17 (tests/integration/test_adapters.py):
- A MESSAGE carries the message's own headers: custom headers (kept as string properties),
  ``persistent:true`` (only when persistent), ``priority``, ``expires`` (``0`` = never),
  ``timestamp``, ``type``, ``reply-to``, ``correlation-id``; the broker adds ``message-id``,
  ``destination``, ``subscription``, ``ack``, ``redelivered`` and ``content-length``.
  ``Message.headers`` is all but those six, so it holds what a plain STOMP subscriber sees as the
  message's own. ``timestamp`` stays: ActiveMQ takes a SEND's ``timestamp`` as JMSTimestamp, so a
  moved message keeps its original send time. ``expires:0`` and ``priority:4``, which the broker
  reports for a message that set neither, mean the same when sent again.
- ``JMSXGroupID``/``JMSXGroupSeq`` on a SEND set the group and never come back as headers.
- ``browser:true`` on SUBSCRIBE browses the queue, messages held by consumers included, and ends
  with a MESSAGE carrying ``browser:end``.
- ``selector`` on SUBSCRIBE filters (custom headers by name, ``correlation-id`` as
  JMSCorrelationID, ``type`` as JMSType, the message id as JMSMessageID).
- NACK makes ActiveMQ dead-letter the message at once (a poison ack), so nothing here NACKs.
  ``put_back`` of a peeked head UNSUBSCRIBEs that queue's peek subscription: the broker puts the
  head back in its place (marked redelivered, never dead-lettered), where another connection's
  ``take`` (a tool's cancel or release) can get it, and the next ``peek`` subscribes again
  (a millisecond or two). ``hold_put_back=True`` keeps holding instead (ActiveMQ has no consumer
  timeout): re-peeks cost nothing, but no other connection can take that head meanwhile.
"""

from __future__ import annotations

import contextlib
import itertools
import queue as queues
import time
from collections.abc import Callable, Generator, Sequence

import structlog
from stomp.utils import Frame  # type: ignore[import-untyped]

from adapters.activemq_connection import Ack, Inbox, Listener, activemq_reason
from adapters.activemq_puts import Puts, valid_destination
from adapters.activemq_statistics import Statistics
from adapters.activemq_transport import StompConnection
from adapters.base import (
    PER_DELIVERY,
    BrokerExpiry,
    Held,
    Message,
    Move,
    PutCheck,
    StagedFormat,
)
from policies.endpoints import Endpoint
from policies.errors import BrokerUnavailable, Refused
from policies.reasons import MQRC_Q_FULL
from policies.selector import equals, quoted

SELECTOR_FIELDS = {
    "correlation-id": "JMSCorrelationID",
    "type": "JMSType",
    "message-id": "JMSMessageID",
}
# STOMP headers ActiveMQ maps to JMS fields: not properties a selector can name.
MAPPED_HEADERS = frozenset({"persistent", "priority", "expires", "timestamp", "reply-to"})

# ActiveMQ moves an expired persistent message to its dead-letter queue (ActiveMQ.DLQ, or the
# one its deadLetterStrategy names), saying why in dlqDeliveryFailureCause ("java.lang.Throwable:
# Message Expired. Expiration:<ms>"); it drops an expired non-persistent one (processExpired,
# processNonPersistent=false). ``watch_expiries`` takes only those that asked to be kept: the
# operator's other dead letters stay where they are. The flag is a string from STOMP and a
# boolean from a JMS client.
EXPIRED_SELECTOR = (
    "(JMS_TIBCO_PRESERVE_UNDELIVERED = 'true' OR JMS_TIBCO_PRESERVE_UNDELIVERED = TRUE)"
    " AND dlqDeliveryFailureCause LIKE '%Message Expired%'"
)
EXPIRED_PREFETCH = 100
_DEAD_LETTER_HEADERS = ("original-destination", "originalExpiration", "dlqDeliveryFailureCause",
                        "message-id")

# ActiveMQ always assigns its own JMSMessageID. Each streamed level would be a subscription whose
# prefetch the broker fills at once, so the binary levels stay (no second levels).
FORMAT = StagedFormat(
    broker="activemq",
    staging_destination="/queue/{}",
    message_id_header=None,
    second_levels=False,
    peek_advances=False,
)


class ActiveMQ(Puts, Statistics):
    """The staging interface on ActiveMQ through one STOMP 1.2 connection."""

    name = "activemq"
    format = FORMAT
    sees_held = True

    def __init__(
        self,
        stomp: Endpoint,
        *,
        peek_wait: float = 0.02,
        subscribe_wait: float = 0.03,
        take_wait: float = 0.5,
        hold_put_back: bool = False,
        receipt_timeout: float = 10.0,
        heartbeats: tuple[int, int] = (10000, 10000),
        connect_attempts: int = 1,
        retry_wait: float = 0.2,
        dead_letter_queue: str | None = "ActiveMQ.DLQ",
    ) -> None:
        """``dead_letter_queue``: where the broker puts the messages it expires, read by
        ``watch_expiries`` (a wildcard, ``DLQ.>``, for a per-destination deadLetterStrategy);
        None: not read."""
        self.endpoint = stomp
        self._dead_letter_queue = dead_letter_queue
        self._expiry_sid: str | None = None
        self._peek_wait = peek_wait  # how long a peek waits for the next head after a settle
        self._subscribe_wait = subscribe_wait  # the same, for the first head after subscribing
        self._take_wait = take_wait
        self._hold_put_back = hold_put_back
        self._receipt_timeout = receipt_timeout
        self._heartbeats = heartbeats
        self._attempts = connect_attempts
        self._retry_wait = retry_wait
        self._conn: StompConnection | None = None
        self._listener = Listener()
        self._generation = 0
        self._ids = itertools.count(1)
        self._peeks: dict[str, tuple[str, Inbox]] = {}  # queue -> its prefetch-1 subscription
        self._heads: dict[str, Held] = {}  # queue -> the head we hold
        # The receipt on the last settle's ACKs, not waited for, and the ERRORs count before
        # them: the next settle checks both once its SENDs are answered.
        self._acks: tuple[str, int] | None = None
        self._expect: dict[str, float] = {}  # queue -> until when a head may be on its way
        self._polled: Inbox = queues.Queue()
        self._polled_queue: dict[str, str] = {}  # subscription id -> queue
        self._listened: dict[str, str] = {}  # subscription id -> topic (``listen``)
        self._returned: list[Held] = []  # put back after a poll: the next poll returns them
        self._stats: tuple[StompConnection, Inbox] | None = None  # the statistics connection
        self._log = structlog.get_logger("adapters.activemq").bind(
            broker=self.name, address=str(stomp))

    # -- queues --------------------------------------------------------------------------------

    def ensure_queues(self, names: Sequence[str]) -> None:
        """ActiveMQ creates a queue when a consumer first names it: browse each with a
        selector that matches nothing. The SUBSCRIBEs are written at once and their receipts
        awaited together (one after the other, 37 staging queues took 0.5-0.9 s)."""
        conn = self._live()
        asked: dict[str, tuple[str, str]] = {}  # receipt -> (subscription, queue)
        for name in dict.fromkeys(names):
            sid = f"jb-sub-{next(self._ids)}"
            self._listener.routes[sid] = queues.Queue()
            rid = self._receipt()
            asked[rid] = (sid, name)
            with self._translate():
                conn.subscribe(f"/queue/{name}", id=sid, ack="auto",
                               headers={"browser": "true", "selector": "JMSPriority < 0",
                                        "receipt": rid})
        failures = self._await_all(list(asked), f"SUBSCRIBE to {len(asked)} staging queues")
        for sid, _ in asked.values():
            self._unsubscribe(sid)
        for rid, failure in failures.items():
            if failure is not None:
                raise BrokerUnavailable(
                    f"{self._where()}: SUBSCRIBE /queue/{asked[rid][1]}: {failure}")

    # -- holding -------------------------------------------------------------------------------

    def peek(self, queue: str) -> Held | None:
        """The head, through one ``activemq.prefetchSize:1`` subscription per queue.

        The broker pushes a head as soon as there is one and we hold none, so peek only waits
        when a head is on its way: ``subscribe_wait`` s after the queue's first peek,
        ``peek_wait`` s after its head was settled. Otherwise an empty inbox means an empty
        queue (as of a network round trip ago) and peek returns None at once."""
        self._live()
        held = self._heads.get(queue)
        if held is not None:
            return held
        if queue not in self._peeks:
            inbox: Inbox = queues.Queue()
            sid = self._subscribe(
                queue, inbox, ack="client-individual", **{"activemq.prefetchSize": "1"}
            )
            self._peeks[queue] = (sid, inbox)
            self._expect[queue] = time.monotonic() + self._subscribe_wait
        inbox = self._peeks[queue][1]
        wait = self._expect.pop(queue, 0.0) - time.monotonic()
        try:
            frame = inbox.get(timeout=wait) if wait > 0 else inbox.get_nowait()
        except queues.Empty:
            return None
        if frame is None:
            self._live()
            return None
        held = self._held(queue, frame, peeked=True)
        self._heads[queue] = held
        return held

    def _held(self, queue: str, frame: Frame, *, peeked: bool) -> Held:
        token = Ack(
            self._generation, frame.headers["ack"], "content-length" not in frame.headers, peeked
        )
        return Held(queue, message_from_frame(frame), token)

    def put_back(self, held: Held) -> None:
        """A peeked head: UNSUBSCRIBE its queue's peek subscription, so the broker puts it
        back at the head where another connection can take it (a tool's cancel), and the next
        peek subscribes again; with ``hold_put_back`` keep holding it instead (the next peek
        returns it at once, but no other connection can take it meanwhile). A subscription's
        message is kept and comes again from the next poll. Never a NACK (dead-letters it)."""
        token = self._token(held)
        if token.generation != self._generation:
            return  # its connection is gone, so the broker has put it back already
        if not token.peeked:
            self._returned.append(held)
        elif self._hold_put_back:
            self._heads[held.queue] = held
        elif self._heads.get(held.queue) is held:
            del self._heads[held.queue]
            sid, _ = self._peeks.pop(held.queue)
            self._unsubscribe(sid)

    def subscribe(self, queue: str, prefetch: int) -> None:
        sid = self._subscribe(
            queue,
            self._polled,
            ack="client-individual",
            **{"activemq.prefetchSize": str(prefetch)},
        )
        self._polled_queue[sid] = queue

    def listen(self, topic: str) -> None:
        """SUBSCRIBE to ``/topic/<topic>`` with automatic acks."""
        destination = f"/topic/{topic}"
        sid, failure = self._subscribe_to(destination, self._polled, ack="auto")
        if failure is not None:
            raise Refused(activemq_reason(failure), f"subscribing to {destination}: {failure}")
        self._listened[sid] = topic

    def watch_expiries(self, queue: str) -> str | None:
        """Subscribe to the dead-letter queue with EXPIRED_SELECTOR. ``queue`` (the bridge's
        name for these deliveries) is RabbitMQ's; here they are the dead-letter queue's. A
        subscription the broker refuses (a user who may not read it) is logged, not raised."""
        source = self._dead_letter_queue
        if source is None:
            return None
        destination = f"/queue/{source}"
        sid, failure = self._subscribe_to(
            destination, self._polled, ack="client-individual", selector=EXPIRED_SELECTOR,
            **{"activemq.prefetchSize": str(EXPIRED_PREFETCH)})
        if failure is not None:
            self._log.warning("expired messages not read from the dead-letter queue",
                              queue=source, error=failure)
            return None
        self._polled_queue[sid] = source
        self._expiry_sid = sid
        return source

    def expiry_of(self, message: Message) -> BrokerExpiry | None:
        """None unless ActiveMQ dead-lettered it for its expiry."""
        h = message.headers
        destination = h.get("original-destination")
        if "Message Expired" not in h.get("dlqDeliveryFailureCause", "") or not destination:
            return None
        when = h.get("originalExpiration", "")
        expired_ms = int(when) if when.isdigit() else int(time.time() * 1000)
        own = {n: v for n, v in h.items() if n not in _DEAD_LETTER_HEADERS}
        own["expires"] = str(expired_ms)  # its time to live as sent (the broker set it to 0)
        return BrokerExpiry(destination, expired_ms, Message(own, message.body),
                            h.get("message-id"))

    def poll(self, timeout: float) -> list[Held]:
        """Deliveries since the last call (and those put back); waits up to ``timeout`` s."""
        self._live()
        out, self._returned = self._returned, []
        frames: list[Frame | None] = []
        with contextlib.suppress(queues.Empty):
            frames.append(self._polled.get(timeout=timeout) if not out and timeout > 0
                          else self._polled.get_nowait())
            while True:
                frames.append(self._polled.get_nowait())
        self._live()
        for frame in frames:
            if frame is not None:
                sid = frame.headers.get("subscription", "")
                queue = self._polled_queue.get(sid)
                if queue is not None:
                    held = self._held(queue, frame, peeked=False)
                    if sid == self._expiry_sid:  # its own id: the dead letter keeps it
                        held.message.headers["message-id"] = frame.headers.get("message-id", "")
                    out.append(held)
                elif sid in self._listened:
                    out.append(Held(self._listened[sid], message_from_frame(frame), None))
        return out

    # -- tools ---------------------------------------------------------------------------------

    def check_put(self, destination: str) -> PutCheck:
        """ActiveMQ authorizes a SEND inside a transaction when the SEND arrives (and refuses it
        there when the store is full): an ERROR for its receipt. The ABORT drops the rest."""
        if not valid_destination(destination):
            return PutCheck()
        conn = self._live()
        tx, receipt = f"jb-try-{next(self._ids)}", self._receipt()
        with self._translate():
            conn.begin(tx)
            conn.send(destination, b"", headers={"transaction": tx, "receipt": receipt})
        failures = self._await_all([receipt], f"trying a put to {destination}")
        with self._translate():
            conn.abort(tx)
        if receipt not in failures:
            return PutCheck()
        reason = activemq_reason(failures[receipt])
        return PutCheck(
            refused=Refused(reason, f"{destination}: the broker says {failures[receipt]}"),
            changing=reason is MQRC_Q_FULL,
        )

    def staging_checks(self, destination: str) -> bool:
        return False

    def browse(self, queue: str) -> Generator[Message, None, None]:
        """A ``browser:true`` subscription: every message, held ones included, none consumed."""
        with contextlib.closing(self._browse(queue)) as frames:
            for frame in frames:
                yield message_from_frame(frame)

    def _browse(self, queue: str) -> Generator[Frame, None, None]:
        inbox: Inbox = queues.Queue()
        sid = self._subscribe(queue, inbox, ack="auto", browser="true")
        try:
            while True:
                try:
                    frame = inbox.get(timeout=self._receipt_timeout)
                except queues.Empty:
                    raise BrokerUnavailable(
                        f"{self._where()}: browsing {queue}: no browser:end in time"
                    ) from None
                if frame is None:
                    self._live()
                    return
                if frame.headers.get("browser") == "end":
                    return
                yield frame
        finally:
            self._listener.routes.pop(sid, None)
            if self._conn is not None and self._listener.lost is None:
                with contextlib.suppress(BrokerUnavailable):
                    self._unsubscribe(sid)

    def take(
        self, queue: str, header: str, value: str, then: Callable[[Message], None] | None = None
    ) -> Message | None:
        """Remove the first message whose ``header`` is ``value``: a selector subscription on
        that header (or, for a header a selector cannot name, on the JMSMessageID found by
        browsing), ACK what it receives within ``take_wait`` s (after ``then``). None also
        when another consumer holds the message for all of ``take_wait``."""
        self._live()
        held = self.peek(queue) if queue in self._peeks else None  # a head pushed to us
        if held is not None and held.message.headers.get(header) == value:
            if then is not None:
                then(held.message)
            self.settle([Move(held)])
            self._confirm_acks()  # the tool says it is gone: make sure
            return held.message
        selector = _selector(header, value)
        if selector is None:
            with contextlib.closing(self._browse(queue)) as frames:
                found = next(
                    (f for f in frames if message_from_frame(f).headers.get(header) == value), None
                )
            if found is None:
                return None
            selector = f"JMSMessageID = {quoted(found.headers['message-id'])}"
        inbox: Inbox = queues.Queue()
        sid = self._subscribe(
            queue, inbox, ack="client-individual", selector=selector,
            **{"activemq.prefetchSize": "1"},
        )
        try:
            try:
                frame = inbox.get(timeout=self._take_wait)
            except queues.Empty:
                return None
            if frame is None:
                self._live()
                return None
            message = message_from_frame(frame)
            if then is not None:
                then(message)
            rid = self._receipt()
            with self._translate():
                self._live().ack(frame.headers["ack"], receipt=rid)
            self._await([rid], "ACK")
            return message
        finally:
            self._unsubscribe(sid)


def message_from_frame(frame: Frame) -> Message:
    body = frame.body if isinstance(frame.body, bytes) else (frame.body or "").encode()
    return Message({n: v for n, v in frame.headers.items() if n not in PER_DELIVERY}, body)


def _selector(header: str, value: str) -> str | None:
    """A JMS selector for ``header = value``; None when a selector cannot name the header."""
    name = SELECTOR_FIELDS.get(header)
    if name is None:
        if header in MAPPED_HEADERS or header.startswith("JMS"):
            return None
        name = header
    return equals(name, value)

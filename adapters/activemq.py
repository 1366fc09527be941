"""ActiveMQ through stomp.py (STOMP 1.2, heart-beats), the staging interface.

What this relies on, checked against ActiveMQ 5.17 (tests/integration/test_adapters.py):
- A MESSAGE carries the message's own headers: custom headers (kept as string properties),
  ``persistent:true`` (only when persistent), ``priority``, ``expires`` (``0`` = never),
  ``timestamp``, ``type``, ``reply-to``, ``correlation-id``; the broker adds ``message-id``,
  ``destination``, ``subscription``, ``ack``, ``redelivered`` and ``content-length``.
  ``Message.headers`` is all but those six, so it holds what a plain STOMP subscriber sees as the
  message's own. ``timestamp`` stays: ActiveMQ takes a SEND's ``timestamp`` as JMSTimestamp, so a
  moved message keeps its original send time. ``expires:0`` and ``priority:4``, which the broker
  reports for a message that set neither, mean the same when sent again.
- A SEND without ``content-length`` makes a TextMessage, one with it a BytesMessage, and only a
  BytesMessage's MESSAGE has ``content-length``. ``settle`` gives a replacement the kind of the
  held message it replaces (text when its body is UTF-8 without NUL); ``publish`` sends bytes.
- ``JMSXGroupID``/``JMSXGroupSeq`` on a SEND set the group and never come back as headers.
- ``browser:true`` on SUBSCRIBE browses the queue, messages held by consumers included, and ends
  with a MESSAGE carrying ``browser:end``.
- ``selector`` on SUBSCRIBE filters (custom headers by name, ``correlation-id`` as
  JMSCorrelationID, ``type`` as JMSType, the message id as JMSMessageID).
- An ERROR names the ``receipt-id`` of the frame that failed and leaves the connection open.
  ``settle`` SENDs with receipts and ACKs only what went through: a SEND refused that way (e.g.
  to a ``/remote-temp-queue/`` whose connection is gone: DestinationDoesNotExistException) leaves
  its message held by us and raises PutRefused, the other moves done. (Not a transaction: a
  COMMIT costs about 8 ms under load; and a SEND without a receipt that is refused inside one is
  not answered with an ERROR but marks the transaction rollback-only.)
- Queue depths come from the statistics plugin (``<statisticsBrokerPlugin/>``): a SEND to
  ``/queue/ActiveMQ.Statistics.Destination.<queue>`` with a ``reply-to`` is answered with a
  MapMessage, read as JSON (``transformation:jms-map-json``) on a connection of its own: a STOMP
  consumer can only receive a MapMessage through that translator, which needs XStream and
  Jettison on the broker's classpath, and a broker without them drops the connection.
- NACK makes ActiveMQ dead-letter the message at once (a poison ack), so nothing here NACKs.
  ``put_back`` of a peeked head UNSUBSCRIBEs that queue's peek subscription: the broker puts the
  head back in its place (marked redelivered, never dead-lettered), where another connection's
  ``take`` (a tool's cancel or release) can get it, and the next ``peek`` subscribes again
  (a millisecond or two). ``hold_put_back=True`` keeps holding instead (ActiveMQ has no consumer
  timeout): re-peeks cost nothing, but no other connection can take that head meanwhile.

A lost connection (socket, heart-beat, ERROR that closes it) makes the next call raise
BrokerUnavailable; ``connect`` again to go on (subscriptions are not restored).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import queue as queues
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Collection, Generator, Iterator, Sequence
from dataclasses import dataclass

import structlog
from stomp import Connection12, ConnectionListener  # type: ignore[import-untyped]
from stomp.exception import StompException  # type: ignore[import-untyped]
from stomp.utils import Frame  # type: ignore[import-untyped]

from adapters.base import (
    PER_DELIVERY,
    Held,
    Message,
    Move,
    PutCheck,
    StagedFormat,
    connect_with_retries,
)
from policies.endpoints import Endpoint
from policies.errors import BrokerUnavailable, PutRefused, Refused
from policies.reasons import (
    MQRC_MSG_TOO_BIG_FOR_Q,
    MQRC_NOT_AUTHORIZED,
    MQRC_Q_FULL,
    MQRC_UNEXPECTED_ERROR,
    MQRC_UNKNOWN_OBJECT_NAME,
    Reason,
)
from policies.selector import equals, quoted

# Never copied from a Message onto a SEND: the adapter sets its own.
FRAME_HEADERS = PER_DELIVERY | {"receipt", "transaction"}

# /remote-temp-queue/<id>: another connection's temporary queue (a reply-to), as ActiveMQ names it.
DESTINATION_PREFIXES = ("/queue/", "/topic/", "/remote-temp-queue/", "/remote-temp-topic/")
STATISTICS = "/queue/ActiveMQ.Statistics.Destination."
STATISTICS_REPLY = "/temp-queue/jms-bridge-statistics"
# The plugin ends its list of replies with an empty message when the request asks for it.
STATISTICS_END = "ActiveMQ.Statistics.Destination.List.End.With.Null"
STATISTICS_TIMEOUT_S = 0.5  # how long a statistics query may hold up the engine
# An ERROR's text -> the reason it refuses a SEND for (first match).
REFUSALS: tuple[tuple[tuple[str, ...], Reason], ...] = (
    (("DestinationDoesNotExist", "does not exist"), MQRC_UNKNOWN_OBJECT_NAME),
    (("SecurityException", "not authorized", "Not authorized"), MQRC_NOT_AUTHORIZED),
    (("ResourceAllocationException", "Usage Manager", "limit reached", "is full"), MQRC_Q_FULL),
    (("too large", "maxFrameSize", "exceeds"), MQRC_MSG_TOO_BIG_FOR_Q),
)
SELECTOR_FIELDS = {
    "correlation-id": "JMSCorrelationID",
    "type": "JMSType",
    "message-id": "JMSMessageID",
}
# STOMP headers ActiveMQ maps to JMS fields: not properties a selector can name.
MAPPED_HEADERS = frozenset({"persistent", "priority", "expires", "timestamp", "reply-to"})

_Inbox = queues.Queue[Frame | None]  # None: the connection went away

# stomp.py logs through "stomp.py" without a handler of its own, so Python's last-resort handler
# would print its warnings ("could not connect ...") to stderr beside our one-line error.
logging.getLogger("stomp.py").addHandler(logging.NullHandler())


@dataclass(frozen=True, slots=True)
class _Ack:
    generation: int  # of the connection that delivered it
    ack_id: str
    text: bool  # a TextMessage (its MESSAGE had no content-length)
    peeked: bool


class _Listener(ConnectionListener):  # type: ignore[misc]
    """Runs on stomp.py's receiver thread; hands everything over under one condition."""

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.connected = False
        self.lost: str | None = None
        self.receipts: set[str] = set()
        self.failed: dict[str, str] = {}  # receipt-id -> the ERROR's message
        self.errors: list[str] = []  # ERRORs that name no receipt
        self.routes: dict[str, _Inbox] = {}

    def on_connected(self, frame: Frame) -> None:
        with self.cv:
            self.connected = True
            self.cv.notify_all()

    def on_message(self, frame: Frame) -> None:
        inbox = self.routes.get(frame.headers.get("subscription", ""))
        if inbox is not None:
            inbox.put(frame)

    def on_receipt(self, frame: Frame) -> None:
        with self.cv:
            self.receipts.add(frame.headers.get("receipt-id", ""))
            self.cv.notify_all()

    def on_error(self, frame: Frame) -> None:
        text = frame.headers.get("message", "ERROR")
        body = frame.body.decode("utf-8", "replace") if isinstance(frame.body, bytes) else (
            frame.body or "")
        detail = body.strip().partition("\n")[0].strip()  # the exception's first line
        if detail and detail not in text:
            text = f"{text}: {detail}"
        with self.cv:
            if "receipt-id" in frame.headers:
                self.failed[frame.headers["receipt-id"]] = text
            else:
                self.errors.append(text)
            self.cv.notify_all()

    def on_heartbeat_timeout(self) -> None:
        self._gone("no heart-beat from the broker")

    def on_disconnected(self) -> None:
        self._gone("connection closed")

    def _gone(self, why: str) -> None:
        with self.cv:
            if self.lost is None:
                self.lost = self.errors[-1] if self.errors else why
            self.cv.notify_all()
        for inbox in list(self.routes.values()):
            inbox.put(None)


# ActiveMQ always assigns its own JMSMessageID. Each streamed level would be a subscription whose
# prefetch the broker fills at once, so the binary levels stay (no second levels).
FORMAT = StagedFormat(
    broker="activemq",
    staging_destination="/queue/{}",
    message_id_header=None,
    second_levels=False,
    peek_advances=False,
)



def _tls(conn: Connection12, ep: Endpoint) -> None:
    """stomp+ssl://: TLS with the broker's certificate verified (stomp.py verifies only when
    given a CA file: the named one, else the system's) and its host name checked."""
    if ep.tls:
        conn.set_ssl(for_hosts=[(ep.host, ep.port)],
                     ca_certs=ep.ca_file or ssl.get_default_verify_paths().openssl_cafile)

class ActiveMQ:
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
    ) -> None:
        self.endpoint = stomp
        self._peek_wait = peek_wait  # how long a peek waits for the next head after a settle
        self._subscribe_wait = subscribe_wait  # the same, for the first head after subscribing
        self._take_wait = take_wait
        self._hold_put_back = hold_put_back
        self._receipt_timeout = receipt_timeout
        self._heartbeats = heartbeats
        self._attempts = connect_attempts
        self._retry_wait = retry_wait
        self._conn: Connection12 | None = None
        self._listener = _Listener()
        self._generation = 0
        self._ids = itertools.count(1)
        self._peeks: dict[str, tuple[str, _Inbox]] = {}  # queue -> its prefetch-1 subscription
        self._heads: dict[str, Held] = {}  # queue -> the head we hold
        # The receipt on the last settle's ACKs, not waited for, and the ERRORs count before
        # them: the next settle checks both once its SENDs are answered.
        self._acks: tuple[str, int] | None = None
        self._expect: dict[str, float] = {}  # queue -> until when a head may be on its way
        self._polled: _Inbox = queues.Queue()
        self._polled_queue: dict[str, str] = {}  # subscription id -> queue
        self._listened: dict[str, str] = {}  # subscription id -> topic (``listen``)
        self._returned: list[Held] = []  # put back after a poll: the next poll returns them
        self._stats: tuple[Connection12, _Inbox] | None = None  # the statistics connection
        self._log = structlog.get_logger("adapters.activemq").bind(
            broker=self.name, address=str(stomp))

    # -- connection ----------------------------------------------------------------------------

    def connect(self) -> None:
        """Open the connection (``connect_attempts`` tries); BrokerUnavailable names the address."""
        if self._conn is not None and self._listener.lost is None:
            return
        connect_with_retries(self._connect_once, self._attempts, self._retry_wait)

    def _connect_once(self) -> None:
        self.close()
        ep = self.endpoint
        listener = _Listener()
        conn = Connection12(
            [(ep.host, ep.port)],
            heartbeats=self._heartbeats,
            auto_decode=False,
            auto_content_length=False,
            vhost=ep.vhost or "/",
            # One try, and no sleep after it (stomp.py sleeps 0.2 s after a failed last try;
            # the engine's own backoff decides when to try again).
            reconnect_attempts_max=1,
            reconnect_sleep_initial=0.0,
        )
        conn.set_listener("jms-bridge", listener)
        _tls(conn, ep)
        try:
            conn.connect(ep.user, ep.password, wait=False)
        except (StompException, OSError) as exc:
            raise BrokerUnavailable(f"{self._where()}: {_refusal(ep, exc)}") from exc
        _no_delays(conn)
        with listener.cv:
            listener.cv.wait_for(
                lambda: listener.connected or listener.lost is not None or bool(listener.errors),
                self._receipt_timeout,
            )
        if not listener.connected:
            why = (listener.errors or [listener.lost or "no CONNECTED frame in time"])[0]
            _stop(conn)
            raise BrokerUnavailable(f"{self._where()}: CONNECT refused: {why}")
        self._conn, self._listener = conn, listener
        self._generation += 1
        self._polled = queues.Queue()
        self._log.debug("connected")

    def close(self) -> None:
        """Close; the broker returns everything held to its queue."""
        conn, self._conn = self._conn, None
        self._peeks.clear()
        self._heads.clear()
        self._acks = None
        self._expect.clear()
        self._polled_queue.clear()
        self._listened.clear()
        self._returned.clear()
        self._close_statistics()
        if conn is not None:
            grace = 0.0
            if self._listener.lost is None:
                with contextlib.suppress(StompException, OSError):
                    conn.disconnect()
                    grace = 1.0
            _stop(conn, grace)

    def _where(self) -> str:
        return f"{self.name} STOMP at {self.endpoint.host}:{self.endpoint.port}"

    def _live(self) -> Connection12:
        """The connection, or BrokerUnavailable (and close) when it is gone."""
        lost = self._listener.lost
        if self._conn is None or lost is not None:
            self.close()
            raise BrokerUnavailable(f"{self._where()}: {lost or 'not connected'}")
        return self._conn

    @contextlib.contextmanager
    def _translate(self) -> Iterator[None]:
        """The one place stomp.py's and the socket's errors become BrokerUnavailable."""
        try:
            yield
        except (StompException, OSError) as exc:
            self.close()
            self._log.debug("broker error", error=repr(exc))
            raise BrokerUnavailable(f"{self._where()}: {type(exc).__name__}: {exc}") from exc

    def _receipt(self) -> str:
        return f"jb-{next(self._ids)}"

    def _await_all(self, receipts: Collection[str], what: str) -> dict[str, str]:
        """Wait for every receipt to be answered, RECEIPT or ERROR; the ERRORs' texts by
        receipt. A lost connection or silence raise BrokerUnavailable."""
        listener = self._listener
        with listener.cv:
            done = listener.cv.wait_for(
                lambda: listener.lost is not None
                or all(r in listener.receipts or r in listener.failed for r in receipts),
                self._receipt_timeout,
            )
            failures = {r: listener.failed.pop(r) for r in receipts if r in listener.failed}
            listener.receipts.difference_update(receipts)
        self._live()
        if not done:
            self.close()  # the state is unknown: give everything back
            raise BrokerUnavailable(f"{self._where()}: {what}: no RECEIPT in time")
        return failures

    def _await(self, receipts: Collection[str], what: str) -> None:
        """Wait for RECEIPTs; an ERROR for one of them, a lost connection or silence raise."""
        listener = self._listener
        with listener.cv:
            done = listener.cv.wait_for(
                lambda: listener.lost is not None
                or any(r in listener.failed for r in receipts)
                or all(r in listener.receipts for r in receipts),
                self._receipt_timeout,
            )
            failures = [listener.failed.pop(r) for r in receipts if r in listener.failed]
            listener.receipts.difference_update(receipts)
        if failures:
            raise BrokerUnavailable(f"{self._where()}: {what}: {failures[0]}")
        self._live()
        if not done:
            self.close()  # the state is unknown: give everything back
            raise BrokerUnavailable(f"{self._where()}: {what}: no RECEIPT in time")

    def _subscribe(self, queue: str, inbox: _Inbox, *, ack: str, **headers: str) -> str:
        sid, failure = self._subscribe_to(f"/queue/{queue}", inbox, ack=ack, **headers)
        if failure is not None:
            raise BrokerUnavailable(f"{self._where()}: SUBSCRIBE /queue/{queue}: {failure}")
        return sid

    def _subscribe_to(
        self, destination: str, inbox: _Inbox, *, ack: str, **headers: str
    ) -> tuple[str, str | None]:
        """SUBSCRIBE and wait for its receipt: the subscription id, and the ERROR's text when
        the broker refused it (the connection stays open)."""
        conn = self._live()
        sid = f"jb-sub-{next(self._ids)}"
        self._listener.routes[sid] = inbox
        rid = self._receipt()
        with self._translate():
            conn.subscribe(destination, id=sid, ack=ack, headers={**headers, "receipt": rid})
        failure = self._await_all([rid], f"SUBSCRIBE {destination}").get(rid)
        if failure is not None:
            self._listener.routes.pop(sid, None)
        return sid, failure

    def _unsubscribe(self, sid: str) -> None:
        self._listener.routes.pop(sid, None)
        if self._conn is not None and self._listener.lost is None:
            with self._translate():
                self._conn.unsubscribe(sid)

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

    def depth(self, queue: str) -> int:
        """The statistics plugin's ``size`` of ``queue`` (messages held by consumers counted);
        0 for a queue the broker does not have. One request and its replies on the statistics
        connection; BrokerUnavailable (and that connection closed) when there is no answer."""
        return self._sizes(queue, (queue,))[queue]

    def consumers(self, queue: str) -> int:
        """The statistics plugin's ``consumerCount`` of ``queue``."""
        return self._sizes(queue, (queue,), field="consumerCount")[queue]

    def depths(self, queues: Sequence[str]) -> dict[str, int]:
        """One statistics request for queues whose names share leading dotted segments (the
        staging queues): the wildcard ``<those segments>.>`` is answered with one message per
        queue the broker has. A request per queue otherwise."""
        names = tuple(dict.fromkeys(queues))
        scope = _wildcard_scope(names)
        if scope is None:
            return {name: self.depth(name) for name in names}
        return self._sizes(scope + ".>", names)

    def _sizes(
        self, expression: str, names: Sequence[str], *, field: str = "size"
    ) -> dict[str, int]:
        """Ask ActiveMQ.Statistics.Destination.<expression> and read its replies to the end of
        the list: ``field`` of each of ``names`` answered for, 0 for the rest."""
        conn, inbox = self._statistics()
        with contextlib.suppress(queues.Empty):
            while True:  # leftovers of a request that timed out
                inbox.get_nowait()
        cid = f"jb-stats-{uuid.uuid4().hex}"
        expires = str(time.time_ns() // 1_000_000 + 60_000)
        sizes = dict.fromkeys(names, 0)
        try:
            conn.send(
                STATISTICS + expression, b"",
                headers={"reply-to": STATISTICS_REPLY, "correlation-id": cid,
                         STATISTICS_END: "true", "expires": expires},
            )
            # Short: this runs in the release loop, and a local broker answers in milliseconds.
            deadline = time.monotonic() + STATISTICS_TIMEOUT_S
            while True:
                frame = inbox.get(timeout=max(0.0, deadline - time.monotonic()))
                if frame is None:
                    raise BrokerUnavailable(f"{self._where()}: statistics connection lost")
                if frame.headers.get("correlation-id", cid) != cid:
                    continue
                values = map_message_json(frame.body)
                name = str(values.get("destinationName") or "")
                if not name:
                    return sizes  # the end of the list
                queue = name.removeprefix("queue://")
                if queue in sizes and field in values:
                    sizes[queue] = int(str(values[field]))
        except queues.Empty:
            self._close_statistics()
            raise BrokerUnavailable(
                f"{self._where()}: no answer from ActiveMQ.Statistics.Destination.{expression} "
                "(is <statisticsBrokerPlugin/> configured, with XStream and Jettison for "
                "jms-map-json?)"
            ) from None
        except (StompException, OSError, ValueError) as exc:
            self._close_statistics()
            raise BrokerUnavailable(f"{self._where()}: statistics: {exc!r}") from exc

    def _statistics(self) -> tuple[Connection12, _Inbox]:
        """The statistics connection, opened on first use: a translator failure on the broker
        closes it, never the staging connection."""
        if self._stats is not None and self._stats[0].is_connected():
            return self._stats
        self._close_statistics()
        ep = self.endpoint
        inbox: _Inbox = queues.Queue()
        listener = _Listener()
        listener.routes["stats"] = inbox
        conn = Connection12([(ep.host, ep.port)], heartbeats=(0, 0), auto_decode=False,
                            vhost=ep.vhost or "/", reconnect_attempts_max=1,
                            reconnect_sleep_initial=0.0)
        conn.set_listener("jms-bridge-stats", listener)
        _tls(conn, ep)
        self._stats = (conn, inbox)
        try:
            conn.connect(ep.user, ep.password, wait=True)
            conn.subscribe(STATISTICS_REPLY, id="stats", ack="auto",
                           headers={"transformation": "jms-map-json", "receipt": "stats"})
            with listener.cv:
                ok = listener.cv.wait_for(lambda: "stats" in listener.receipts
                                          or listener.lost is not None, self._receipt_timeout)
            if not ok or listener.lost is not None:
                raise BrokerUnavailable(
                    f"{self._where()}: statistics: SUBSCRIBE with transformation:jms-map-json "
                    "not answered (a broker without XStream and Jettison drops the connection)"
                )
        except (StompException, OSError) as exc:
            self._close_statistics()
            raise BrokerUnavailable(f"{self._where()}: statistics: {exc!r}") from exc
        except BrokerUnavailable:
            self._close_statistics()
            raise
        return self._stats

    def _close_statistics(self) -> None:
        stats, self._stats = self._stats, None
        if stats is not None:
            _stop(stats[0])

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
            inbox: _Inbox = queues.Queue()
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
        token = _Ack(
            self._generation, frame.headers["ack"], "content-length" not in frame.headers, peeked
        )
        return Held(queue, _message(frame), token)

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
                    out.append(self._held(queue, frame, peeked=False))
                elif sid in self._listened:
                    out.append(Held(self._listened[sid], _message(frame), None))
        return out

    # -- putting -------------------------------------------------------------------------------

    def settle(self, moves: Sequence[Move]) -> None:
        """Each SEND with a receipt, pipelined; when every receipt is in, the ACK of every
        move whose SEND went through (one receipt, on the last, checked by the next settle).
        No transaction: a COMMIT on ActiveMQ 5.17 took about 8 ms under load, and at 1,000
        releases a second that was most of the engine's time (p99 lateness 3.4-3.7 s with
        transactions, 44 ms without). A crash between a SEND and its ACK puts the message
        twice, never loses it. Any failure but a refused SEND closes the connection, so the
        broker returns what was held; a refused SEND raises PutRefused with the other moves
        done (``also_done``)."""
        if not moves:
            return
        conn = self._live()
        for move in moves:
            token = self._token(move.held)
            if token.generation != self._generation:
                raise BrokerUnavailable(
                    f"{self._where()}: a held message of {move.held.queue} belongs to a lost "
                    "connection and is back on its queue"
                )
            if token.peeked and self._heads.get(move.held.queue) is not move.held:
                raise ValueError(f"a head of {move.held.queue} that was put back is not held")
            if move.destination is not None and move.message is None:
                raise ValueError("a move with a destination needs a message")
        for i, move in enumerate(moves):
            if move.destination is not None and not _valid_destination(move.destination):
                if i:
                    self.settle(moves[:i])
                raise PutRefused(i, MQRC_UNKNOWN_OBJECT_NAME,
                                 "not a destination ActiveMQ's STOMP can send to",
                                 move.destination)
        receipts: list[str] = []
        sends: dict[str, int] = {}  # a SEND's receipt -> its move
        acks, self._acks = self._acks, None
        errors = acks[1] if acks else len(self._listener.errors)
        try:
            with self._translate(), _corked(conn):
                for i, move in enumerate(moves):
                    if move.destination is not None and move.message is not None:
                        receipts.append(self._receipt())
                        sends[receipts[-1]] = i
                        self._send(conn, move.destination, move.message,
                                   text=self._token(move.held).text, receipt=receipts[-1])
            failures = self._await_all([*receipts, *acks[:1]] if acks else receipts, "settle")
            if acks and acks[0] in failures:
                raise BrokerUnavailable(f"{self._where()}: ACK: {failures[acks[0]]}")
            if len(self._listener.errors) > errors:
                raise BrokerUnavailable(f"{self._where()}: settle: {self._listener.errors[-1]}")
            refused = {sends[r]: text for r, text in failures.items()}
            done = [i for i in range(len(moves)) if i not in refused]
            if done:
                # One receipt, on the last ACK, and not waited for: an ACK that is lost only
                # means the message comes again, and the ACKs' round trip was a third of a
                # settle's time. The broker answers frames in order, so the next settle finds
                # this receipt answered with its SENDs', and an ACK it refused (no receipt of
                # its own) among the ERRORs by then.
                last = self._receipt()
                errors = len(self._listener.errors)
                with self._translate(), _corked(conn):
                    for i in done:
                        extra = {"receipt": last} if i == done[-1] else {}
                        conn.ack(self._token(moves[i].held).ack_id, **extra)
                self._acks = (last, errors)
        except BrokerUnavailable:
            self.close()
            raise
        next_head = time.monotonic() + self._peek_wait
        for i in done:
            held = moves[i].held
            if self._heads.get(held.queue) is held:
                del self._heads[held.queue]
                self._expect[held.queue] = next_head
        if refused:
            first = min(refused)
            text = refused[first]
            self._log.debug("put refused", destination=moves[first].destination, error=text)
            raise PutRefused(first, activemq_reason(text), text, moves[first].destination or "",
                             also_done=tuple(i for i in done if i > first))

    def _confirm_acks(self) -> None:
        """Wait for the receipt on the last settle's ACKs (settle itself leaves that to the
        next settle); BrokerUnavailable if the broker refused one."""
        acks, self._acks = self._acks, None
        if acks is None:
            return
        try:
            self._await([acks[0]], "ACK")
            if len(self._listener.errors) > acks[1]:
                raise BrokerUnavailable(f"{self._where()}: ACK: {self._listener.errors[-1]}")
        except BrokerUnavailable:
            self.close()
            raise

    def publish(self, destination: str, message: Message) -> None:
        """SEND (a BytesMessage) with a receipt and wait for it; an ERROR for it (the
        connection stays open) is PutRefused."""
        conn = self._live()
        rid = self._receipt()
        with self._translate():
            self._send(conn, destination, message, text=False, receipt=rid)
        failure = self._await_all([rid], f"SEND {destination}").get(rid)
        if failure is not None:
            raise PutRefused(0, activemq_reason(failure), failure, destination)

    def _send(
        self,
        conn: Connection12,
        destination: str,
        message: Message,
        *,
        text: bool,
        **frame_headers: str,
    ) -> None:
        _check_destination(destination)
        headers = {n: v for n, v in message.headers.items() if n not in FRAME_HEADERS}
        if not (text and _is_text(message.body)):
            headers["content-length"] = str(len(message.body))
        headers.update(frame_headers)
        conn.send(destination, message.body, headers=headers)

    # -- tools ---------------------------------------------------------------------------------

    def check_put(self, destination: str) -> PutCheck:
        """ActiveMQ authorizes a SEND inside a transaction when the SEND arrives (and refuses it
        there when the store is full): an ERROR for its receipt. The ABORT drops the rest."""
        if not _valid_destination(destination):
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
                yield _message(frame)

    def _browse(self, queue: str) -> Generator[Frame, None, None]:
        inbox: _Inbox = queues.Queue()
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
                found = next((f for f in frames if _message(f).headers.get(header) == value), None)
            if found is None:
                return None
            selector = f"JMSMessageID = {quoted(found.headers['message-id'])}"
        inbox: _Inbox = queues.Queue()
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
            message = _message(frame)
            if then is not None:
                then(message)
            rid = self._receipt()
            with self._translate():
                self._live().ack(frame.headers["ack"], receipt=rid)
            self._await([rid], "ACK")
            return message
        finally:
            self._unsubscribe(sid)

    @staticmethod
    def _token(held: Held) -> _Ack:
        if not isinstance(held.token, _Ack):
            raise TypeError("not a message held by an ActiveMQ adapter")
        return held.token


def _message(frame: Frame) -> Message:
    body = frame.body if isinstance(frame.body, bytes) else (frame.body or "").encode()
    return Message({n: v for n, v in frame.headers.items() if n not in PER_DELIVERY}, body)


def _valid_destination(destination: str) -> bool:
    return destination.startswith(DESTINATION_PREFIXES) and destination not in DESTINATION_PREFIXES


def _check_destination(destination: str) -> None:
    if not _valid_destination(destination):
        raise ValueError(f"unsupported destination {destination!r}")


def activemq_reason(text: str) -> Reason:
    """The MQRC reason of an ERROR that refused one SEND."""
    for words, reason in REFUSALS:
        if any(w in text for w in words):
            return reason
    return MQRC_UNEXPECTED_ERROR


def map_message_json(body: bytes | str) -> dict[str, object]:
    """A MapMessage as ActiveMQ's ``jms-map-json`` writes it (XStream through Jettison):
    ``{"map": {"entry": [{"string": ["k", "v"]}, {"string": "size", "long": 3}, ...]}}`` --
    an entry whose two values have the same type is a list, otherwise one key per type, the
    name first; a single entry is not wrapped in a list. Empty map: ``{"map": ""}`` or ``{}``."""
    text = body.decode("utf-8") if isinstance(body, bytes) else body
    if not text.strip():
        return {}
    data = json.loads(text)
    top = data.get("map") if isinstance(data, dict) else None
    entries = top.get("entry", []) if isinstance(top, dict) else []
    if isinstance(entries, dict):
        entries = [entries]
    out: dict[str, object] = {}
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict):
            continue
        values = list(entry.values())
        if len(values) == 1 and isinstance(values[0], list) and len(values[0]) == 2:
            name, value = values[0]
        elif len(values) == 2:
            name, value = values
        else:
            continue
        out[str(name)] = value
    return out


def _is_text(body: bytes) -> bool:
    """Whether a body can travel as a TextMessage: UTF-8, no NUL (no content-length)."""
    if b"\0" in body:
        return False
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _selector(header: str, value: str) -> str | None:
    """A JMS selector for ``header = value``; None when a selector cannot name the header."""
    name = SELECTOR_FIELDS.get(header)
    if name is None:
        if header in MAPPED_HEADERS or header.startswith("JMS"):
            return None
        name = header
    return equals(name, value)


def _refusal(ep: Endpoint, exc: BaseException) -> str:
    """Why a connection failed: stomp.py only says that it did, so ask the socket once more."""
    try:
        socket.create_connection((ep.host, ep.port), timeout=2.0).close()
    except OSError as cause:
        return f"{type(cause).__name__}: {cause}"
    if not str(exc):  # stomp.py's ConnectFailedException says nothing
        return (f"{type(exc).__name__}: the port answers but the STOMP connection failed "
                "(a broker still starting or stopping?)")
    return f"{type(exc).__name__}: {exc}"


CORK_BYTES = 256 * 1024  # written as soon as this much is waiting


def _wildcard_scope(names: Sequence[str]) -> str | None:
    """The dotted segments every one of ``names`` starts with and goes on after, when there are
    such segments and no name holds a wildcard character: ``<scope>.>`` matches them all (and
    maybe others). None when one request per name is needed."""
    if len(names) < 2 or any("*" in n or ">" in n for n in names):
        return None
    split = [n.split(".") for n in names]
    common: list[str] = []
    for segments in zip(*(parts[:-1] for parts in split), strict=False):
        if len(set(segments)) != 1:
            break
        common.append(segments[0])
    return ".".join(common) if common and all(common) else None


class _Cork:
    """Collects encoded frames in place of a transport's ``send`` and writes them joined."""

    def __init__(self, send: Callable[[bytes], None]) -> None:
        self._send = send
        self._frames: list[bytes] = []
        self._bytes = 0

    def __call__(self, frame: bytes) -> None:
        self._frames.append(frame)
        self._bytes += len(frame)
        if self._bytes >= CORK_BYTES:
            self.flush()

    def flush(self) -> None:
        frames, self._frames, self._bytes = self._frames, [], 0
        if frames:
            self._send(b"".join(frames))


@contextlib.contextmanager
def _corked(conn: Connection12) -> Iterator[None]:
    """The frames sent inside go out in few writes: stomp.py writes each frame with a
    ``sendall`` of its own, and a settle batch of 500 moves was 1,000 of them. On loopback each
    runs the kernel's whole TCP path: that was 40 % of the staging engine's time. A frame
    stomp.py's heart-beat thread sends meanwhile joins the rest. When the block fails, what it
    had not written yet is dropped (the caller closes the connection)."""
    transport = conn.transport
    cork = _Cork(transport.send)
    transport.send = cork  # this instance only, until the block ends
    try:
        yield
    finally:
        del transport.send
    cork.flush()


def _no_delays(conn: Connection12) -> None:
    """Small frames both ways: no Nagle on our writes, and (Linux) ack every read at once.
    ActiveMQ's STOMP connector writes a RECEIPT and the next MESSAGE as separate small segments
    with Nagle on (``transport.tcpNoDelay`` is off by default), so the second waits for our
    delayed ACK: 40 ms per COMMIT. TCP_QUICKACK does not stick, so it is set before each read."""
    transport = conn.transport
    sock = transport.socket
    with contextlib.suppress(OSError, AttributeError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    quickack = getattr(socket, "TCP_QUICKACK", None)
    if quickack is None:
        return
    receive = transport.receive

    def receive_acking_at_once() -> bytes:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, quickack, 1)
        data: bytes = receive()
        return data

    transport.receive = receive_acking_at_once


def _stop(conn: Connection12, grace: float = 0.0) -> None:
    """Stop stomp.py's socket and threads, after ``grace`` s for a DISCONNECT to be answered,
    without waiting on a broker that may be gone (stomp.py's own stop waits forever)."""
    deadline = time.monotonic() + grace
    while conn.transport.is_connected() and time.monotonic() < deadline:
        time.sleep(0.005)
    with contextlib.suppress(Exception):
        conn.transport.disconnect_socket()

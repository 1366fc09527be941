"""The ActiveMQ adapter's STOMP connection through stomp.py: connecting, receipts, subscriptions,
and the one place stomp.py's and the socket's errors are translated; what
``adapters.activemq.ActiveMQ`` and its parts build on.

A lost connection (socket, heart-beat, ERROR that closes it) makes the next call raise
BrokerUnavailable; ``connect`` again to go on (subscriptions are not restored).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue as queues
import socket
import ssl
import threading
import time
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass

from stomp import ConnectionListener  # type: ignore[import-untyped]
from stomp.exception import StompException  # type: ignore[import-untyped]
from stomp.utils import Frame  # type: ignore[import-untyped]
from structlog.typing import FilteringBoundLogger

from adapters.activemq_transport import StompConnection
from adapters.base import Held, connect_with_retries
from policies.endpoints import Endpoint
from policies.errors import BrokerUnavailable
from policies.reasons import (
    MQRC_HOST_NOT_AVAILABLE,
    MQRC_MSG_TOO_BIG_FOR_Q,
    MQRC_NOT_AUTHORIZED,
    MQRC_Q_FULL,
    MQRC_UNEXPECTED_ERROR,
    MQRC_UNKNOWN_OBJECT_NAME,
    Reason,
)

# An ERROR's text -> the reason it refuses a SEND for (first match).
REFUSALS: tuple[tuple[tuple[str, ...], Reason], ...] = (
    (("DestinationDoesNotExist", "does not exist"), MQRC_UNKNOWN_OBJECT_NAME),
    (("SecurityException", "not authorized", "Not authorized"), MQRC_NOT_AUTHORIZED),
    (("ResourceAllocationException", "Usage Manager", "limit reached", "is full"), MQRC_Q_FULL),
    (("too large", "maxFrameSize", "exceeds"), MQRC_MSG_TOO_BIG_FOR_Q),
)

Inbox = queues.Queue[Frame | None]  # None: the connection went away

# stomp.py logs through "stomp.py" without a handler of its own, so Python's last-resort handler
# would print its warnings ("could not connect ...") to stderr beside our one-line error.
logging.getLogger("stomp.py").addHandler(logging.NullHandler())


@dataclass(frozen=True, slots=True)
class Ack:
    generation: int  # of the connection that delivered it
    ack_id: str
    text: bool  # a TextMessage (its MESSAGE had no content-length)
    peeked: bool


class Listener(ConnectionListener):  # type: ignore[misc]
    """Runs on stomp.py's receiver thread; hands everything over under one condition."""

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.connected = False
        self.lost: str | None = None
        self.receipts: set[str] = set()
        self.failed: dict[str, str] = {}  # receipt-id -> the ERROR's message
        self.errors: list[str] = []  # ERRORs that name no receipt
        self.routes: dict[str, Inbox] = {}
        # ERRORs naming no receipt that are expected (``forgive``): (text, until when)
        self._echoes: list[tuple[str, float]] = []

    def await_connected(self, timeout: float) -> bool:
        """Wait for CONNECTED, a lost connection or an ERROR, up to ``timeout``: whether
        connected (stomp.py's own wait for CONNECTED has no end)."""
        with self.cv:
            self.cv.wait_for(lambda: self.connected or self.lost is not None or bool(self.errors),
                             timeout)
            return self.connected

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
            elif not self._echo(text):
                self.errors.append(text)
            self.cv.notify_all()

    def forgive(self, since: int, texts: Iterable[str], until: float) -> list[str]:
        """The ERRORs naming no receipt that came since there were ``since``, less one ERROR
        of each of ``texts`` (the echoes of refusals already answered for): an echo not among
        them yet is not counted when it comes, up to ``until`` (``time.monotonic``)."""
        with self.cv:
            new = self.errors[since:]
            for text in texts:
                if text in new:
                    new.remove(text)
                else:
                    self._echoes.append((text, until))
            return new

    def _echo(self, text: str) -> bool:
        """Whether ``text`` is an expected echo (taken off the list); under ``cv``."""
        if not self._echoes:
            return False
        now = time.monotonic()
        self._echoes = [(t, until) for t, until in self._echoes if until > now]
        for k, (t, _) in enumerate(self._echoes):
            if t == text:
                del self._echoes[k]
                return True
        return False

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


def tls(conn: StompConnection, ep: Endpoint) -> None:
    """stomp+ssl://: TLS with the broker's certificate verified (stomp.py verifies only when
    given a CA file: the named one, else the system's) and its host name checked."""
    if ep.tls:
        conn.set_ssl(for_hosts=[(ep.host, ep.port)],
                     ca_certs=ep.ca_file or ssl.get_default_verify_paths().openssl_cafile)


class Connection:
    """The STOMP connection; the state is ``ActiveMQ.__init__``'s."""

    name: str
    endpoint: Endpoint
    _receipt_timeout: float
    _heartbeats: tuple[int, int]
    _attempts: int
    _retry_wait: float
    _conn: StompConnection | None
    _listener: Listener
    _generation: int
    _ids: itertools.count[int]
    _peeks: dict[str, tuple[str, Inbox]]
    _heads: dict[str, Held]
    _acks: tuple[str, int] | None
    _expect: dict[str, float]
    _polled: Inbox
    _polled_queue: dict[str, str]
    _listened: dict[str, str]
    _returned: list[Held]
    _stats: tuple[StompConnection, Inbox] | None
    _log: FilteringBoundLogger

    def connect(self) -> None:
        """Open the connection (``connect_attempts`` tries); BrokerUnavailable names the address."""
        if self._conn is not None and self._listener.lost is None:
            return
        connect_with_retries(self._connect_once, self._attempts, self._retry_wait)

    def _connect_once(self) -> None:
        self.close()
        ep = self.endpoint
        listener = Listener()
        conn = StompConnection(
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
        tls(conn, ep)
        try:
            conn.connect(ep.user, ep.password, wait=False)
        except (StompException, OSError) as exc:
            raise BrokerUnavailable(f"{self._where()}: {_refusal(ep, exc)}") from exc
        if not listener.await_connected(self._receipt_timeout):
            why = (listener.errors or [listener.lost or "no CONNECTED frame in time"])[0]
            _stop(conn)
            # ActiveMQ's words for credentials it refuses: "User name [x] or password is
            # invalid.", or a SecurityException's "not authorized".
            refused = "password" in str(why) or activemq_reason(str(why)) is MQRC_NOT_AUTHORIZED
            raise BrokerUnavailable(f"{self._where()}: CONNECT refused: {why}",
                                    MQRC_NOT_AUTHORIZED if refused else MQRC_HOST_NOT_AVAILABLE)
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

    def _live(self) -> StompConnection:
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

    def _subscribe(self, queue: str, inbox: Inbox, *, ack: str, **headers: str) -> str:
        sid, failure = self._subscribe_to(f"/queue/{queue}", inbox, ack=ack, **headers)
        if failure is not None:
            raise BrokerUnavailable(f"{self._where()}: SUBSCRIBE /queue/{queue}: {failure}")
        return sid

    def _subscribe_to(
        self, destination: str, inbox: Inbox, *, ack: str, **headers: str
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

    def _close_statistics(self) -> None:
        stats, self._stats = self._stats, None
        if stats is not None:
            _stop(stats[0])

    @staticmethod
    def _token(held: Held) -> Ack:
        if not isinstance(held.token, Ack):
            raise TypeError("not a message held by an ActiveMQ adapter")
        return held.token


def activemq_reason(text: str) -> Reason:
    """The MQRC reason of an ERROR that refused one SEND."""
    for words, reason in REFUSALS:
        if any(w in text for w in words):
            return reason
    return MQRC_UNEXPECTED_ERROR


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


def _stop(conn: StompConnection, grace: float = 0.0) -> None:
    """Stop stomp.py's socket and threads, after ``grace`` s for a DISCONNECT to be answered,
    without waiting on a broker that may be gone (stomp.py's own stop waits forever)."""
    deadline = time.monotonic() + grace
    while conn.transport.is_connected() and time.monotonic() < deadline:
        time.sleep(0.005)
    with contextlib.suppress(Exception):
        conn.transport.disconnect_socket()

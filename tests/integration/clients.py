"""Small helpers around stomp.py for the integration tests."""

from __future__ import annotations

import queue as queues
import threading
import time
from typing import Any

import stomp
from stomp.utils import Frame as StompPyFrame

VERSIONS = {"1.0": stomp.Connection10, "1.1": stomp.Connection11, "1.2": stomp.Connection12}


class Inbox(stomp.ConnectionListener):
    """Collects what a stomp.py connection receives."""

    def __init__(self) -> None:
        self.messages: queues.Queue[StompPyFrame] = queues.Queue()
        self.errors: list[StompPyFrame] = []
        self.receipts: set[str] = set()
        self.heartbeats = 0
        self.disconnected = threading.Event()
        self._cv = threading.Condition()

    def on_message(self, frame: StompPyFrame) -> None:
        self.messages.put(frame)

    def on_error(self, frame: StompPyFrame) -> None:
        with self._cv:
            self.errors.append(frame)
            self._cv.notify_all()

    def on_receipt(self, frame: StompPyFrame) -> None:
        with self._cv:
            self.receipts.add(frame.headers.get("receipt-id", ""))
            self._cv.notify_all()

    def on_heartbeat(self) -> None:
        self.heartbeats += 1

    def on_disconnected(self) -> None:
        self.disconnected.set()

    def wait_receipt(self, rid: str, timeout: float = 10.0) -> bool:
        with self._cv:
            return self._cv.wait_for(lambda: rid in self.receipts, timeout)

    def wait_error(self, timeout: float = 10.0) -> StompPyFrame | None:
        with self._cv:
            self._cv.wait_for(lambda: bool(self.errors), timeout)
            return self.errors[0] if self.errors else None

    def take(self, n: int, timeout: float = 10.0) -> list[StompPyFrame]:
        out: list[StompPyFrame] = []
        deadline = time.monotonic() + timeout
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                out.append(self.messages.get(timeout=left))
            except queues.Empty:
                break
        return out

    def quiet(self, seconds: float) -> list[StompPyFrame]:
        """Whatever arrives within ``seconds`` (to show that nothing does)."""
        time.sleep(seconds)
        out = []
        while not self.messages.empty():
            out.append(self.messages.get_nowait())
        return out


def connect(
    port: int,
    user: str,
    password: str,
    *,
    version: str = "1.2",
    heartbeats: tuple[int, int] = (0, 0),
    auto_decode: bool = True,
    vhost: str = "/",
    **kw: Any,
) -> tuple[stomp.connect.BaseConnection, Inbox]:
    if version != "1.0":  # STOMP 1.0 has neither heart-beats nor a host header
        kw.update(heartbeats=heartbeats, vhost=vhost)
    conn = VERSIONS[version]([("127.0.0.1", port)], auto_decode=auto_decode, **kw)
    inbox = Inbox()
    conn.set_listener("inbox", inbox)
    conn.connect(user, password, wait=True)
    return conn, inbox


def ack_id(frame: StompPyFrame, version: str = "1.2") -> str:
    return frame.headers["ack"] if version == "1.2" else frame.headers["message-id"]

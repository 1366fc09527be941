"""A raw-socket STOMP peer, for tests that need to see or send exact bytes."""

from __future__ import annotations

import socket
import time

from bridge.frontends.stomp import HEARTBEAT, Frame, FrameParser


class RawPeer:
    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.parser = FrameParser(role="client", validate=False)
        self.frames: list[Frame] = []
        self.heartbeats = 0
        self.closed = False

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def connect(self, user: str, password: str, *, heart_beat: str = "0,0",
                version: str = "1.2") -> Frame:
        self.send(
            f"CONNECT\naccept-version:{version}\nhost:/\nlogin:{user}\npasscode:{password}\n"
            f"heart-beat:{heart_beat}\n\n\x00".encode()
        )
        return self.next_frame()

    def _pump(self, timeout: float) -> bool:
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return True
        except OSError:
            data = b""
        if not data:
            self.closed = True
            return False
        for event in self.parser.feed(data):
            if event is HEARTBEAT:
                self.heartbeats += 1
            else:
                assert isinstance(event, Frame)
                self.frames.append(event)
        return True

    def next_frame(self, timeout: float = 10.0) -> Frame:
        deadline = time.monotonic() + timeout
        while not self.frames:
            left = deadline - time.monotonic()
            if left <= 0 or self.closed:
                raise AssertionError(f"no frame within {timeout}s (closed={self.closed})")
            self._pump(left)
        return self.frames.pop(0)

    def wait_closed(self, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while not self.closed and time.monotonic() < deadline:
            self._pump(deadline - time.monotonic())
        return self.closed

    def close(self) -> None:
        self.sock.close()

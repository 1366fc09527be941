"""stomp.py's STOMP 1.2 connection with a transport of our own: stomp.py's ``Transport`` with its
two socket methods, ``send`` and ``receive``, overridden (they are the methods stomp.py's
transports are made of) for what the engine's traffic needs:

- ``corked()``: the frames sent inside go out in few writes. stomp.py writes each frame with a
  ``sendall`` of its own, and a settle batch of 500 moves is 1,000 of them; on loopback each runs
  the kernel's whole TCP path, a large share of the staging engine's time.
- No delayed acknowledgement of what we read (Linux ``TCP_QUICKACK``, set before each read
  because it does not stick) and no Nagle on what we write. ActiveMQ's STOMP connector writes a
  RECEIPT and the next MESSAGE as separate small segments with Nagle on (its
  ``transport.tcpNoDelay`` is off by default), so the second waits for our delayed ACK: 40 ms
  per COMMIT.
- TLS reads and writes one at a time. stomp.py reads on its receiver thread while others write,
  and OpenSSL's connection state is not for two threads at once: with TLS 1.3, the session
  tickets the broker sends after the handshake, read while the CONNECT was written, left about
  one connection in thirty under load waiting for a CONNECTED that never came. The TLS socket is
  non-blocking and each read or write holds a lock; the waits for the socket are outside it.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import threading
from collections.abc import Iterator
from typing import Any

from stomp.connect import BaseConnection, StompConnection12  # type: ignore[import-untyped]
from stomp.protocol import Protocol12  # type: ignore[import-untyped]
from stomp.transport import Transport as StompTransport  # type: ignore[import-untyped]

__all__ = ["CORK_BYTES", "RECV_BYTES", "StompConnection", "Transport"]

# A corked block writes what it has collected once it holds this much.
CORK_BYTES = 256 * 1024
# What one read asks the socket for (stomp.py's own default is 1,024 bytes: a level's prefetch
# of a thousand staged messages was several thousand reads).
RECV_BYTES = 64 * 1024

_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)
# How long a TLS read waits for the socket before it looks whether the connection is still
# wanted (stomp.py ends its receiver loop on an empty read).
TLS_WAIT_S = 1.0


class Transport(StompTransport):  # type: ignore[misc]
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._cork_lock = threading.Lock()
        self._corked: list[bytes] | None = None
        self._corked_bytes = 0
        self._tuned: object = None  # the socket the options below were set on
        self._tls_lock = threading.Lock()  # one TLS read or write at a time

    def attempt_connection(self) -> None:
        super().attempt_connection()
        if isinstance(self.socket, ssl.SSLSocket):
            self.socket.setblocking(False)

    def disconnect_socket(self) -> None:
        sock = self.socket
        if isinstance(sock, ssl.SSLSocket):
            # Shut down under the lock, which wakes the receiver's wait; stomp.py's own
            # ``unwrap`` of a non-blocking socket would race it (it finds nothing to unwrap now).
            with self._tls_lock, contextlib.suppress(OSError, ValueError):
                sock.shutdown(socket.SHUT_RDWR)
        super().disconnect_socket()

    @contextlib.contextmanager
    def corked(self) -> Iterator[None]:
        """Collect the frames sent inside (stomp.py's heart-beat thread's too) and write them
        joined at the end. When the block fails, what it had not written yet is dropped (the
        caller closes the connection)."""
        with self._cork_lock:
            self._corked, self._corked_bytes = [], 0
        failed = True
        try:
            yield
            failed = False
        finally:
            with self._cork_lock:
                frames, self._corked = self._corked, None
            if frames and not failed:
                self._write(b"".join(frames))

    def send(self, encoded_frame: bytes) -> None:
        with self._cork_lock:
            if self._corked is not None:
                self._corked.append(encoded_frame)
                self._corked_bytes += len(encoded_frame)
                if self._corked_bytes < CORK_BYTES:
                    return
                frames, self._corked, self._corked_bytes = self._corked, [], 0
                encoded_frame = b"".join(frames)
        self._write(encoded_frame)

    def _write(self, data: bytes) -> None:
        sock = self.socket
        if not isinstance(sock, ssl.SSLSocket):
            super().send(data)
            return
        view = memoryview(data)
        while view:
            with self._tls_lock:
                try:
                    view = view[sock.send(view):]
                    continue
                except ssl.SSLWantWriteError:
                    want: tuple[list[socket.socket], list[socket.socket]] = ([], [sock])
                except ssl.SSLWantReadError:
                    want = ([sock], [])
            # OpenSSL takes the same bytes again once the socket is ready.
            select.select(*want, [], TLS_WAIT_S)

    def receive(self) -> bytes:
        sock = self.socket
        if sock is not None:
            with contextlib.suppress(OSError):
                if self._tuned is not sock:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    self._tuned = sock
                if _QUICKACK is not None:
                    sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
        if isinstance(sock, ssl.SSLSocket):
            return self._tls_receive(sock)
        data: bytes = super().receive()
        return data

    def _tls_receive(self, sock: ssl.SSLSocket) -> bytes:
        """The next bytes on a TLS socket, b"" once it is closed or no longer this transport's."""
        while self.running and self.socket is sock:
            with self._tls_lock:
                try:
                    data: bytes = sock.recv(RECV_BYTES)
                    return data
                except ssl.SSLWantReadError:
                    want: tuple[list[socket.socket], list[socket.socket]] = ([sock], [])
                except ssl.SSLWantWriteError:
                    want = ([], [sock])
                except (OSError, ValueError):
                    return b""
            try:
                select.select(*want, [], TLS_WAIT_S)
            except (OSError, ValueError):  # closed meanwhile
                return b""
        return b""


class StompConnection(StompConnection12):  # type: ignore[misc]
    """``stomp.Connection12`` on a ``Transport`` of this module (stomp.py builds its own
    transport in ``__init__``, so this one builds the same parts itself)."""

    transport: Transport

    def __init__(self, host_and_ports: list[tuple[str, int]], *, heartbeats: tuple[int, int],
                 vhost: str, auto_decode: bool = False, auto_content_length: bool = True,
                 reconnect_attempts_max: int = 1, reconnect_sleep_initial: float = 0.0) -> None:
        transport = Transport(host_and_ports, reconnect_sleep_initial=reconnect_sleep_initial,
                              reconnect_attempts_max=reconnect_attempts_max, vhost=vhost,
                              auto_decode=auto_decode, recv_bytes=RECV_BYTES)
        BaseConnection.__init__(self, transport)
        Protocol12.__init__(self, transport, heartbeats, auto_content_length)

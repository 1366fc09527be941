"""A TCP proxy between the bridge and the broker, for cutting the broker off mid-session."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.integration.brokers import Broker


class TcpProxy:
    """``accepting=False``: the port is bound but refuses connections, as a broker that has not
    started yet does, until ``open()``. ``hold_s``: each connection is taken on only after that
    long, as a broker slow to answer (one still starting, or far away) takes it."""

    def __init__(self, target: tuple[str, int], *, accepting: bool = True,
                 tls: ssl.SSLContext | None = None, hold_s: float = 0.0) -> None:
        self.target = target
        self.hold_s = hold_s
        self.tls = tls  # given: a TLS server in front of a plain one (a broker's TLS port)
        self.port = 0
        self.listener = self._bind()
        self.pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self._stopped = False
        if accepting:
            self.open()

    def _bind(self) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        self.port = int(sock.getsockname()[1])
        return sock

    def open(self) -> None:
        """Start accepting (a bound socket that is not listening refuses connections)."""
        self._stopped = False
        self.listener.listen(128)
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def refuse(self) -> None:
        """Drop every connection and refuse new ones, as a broker that stops does; ``open()``
        accepts again on the same port."""
        self._stopped = True
        self._close_listener()
        self.cut()
        self.listener = self._bind()

    def _close_listener(self) -> None:
        try:  # wakes the accept() blocked in the other thread; close() alone would not
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()

    def _accept(self, listener: socket.socket) -> None:
        while not self._stopped:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            if self.hold_s:
                threading.Thread(target=self._take, args=(client,), daemon=True).start()
            else:
                self._take(client)

    def _take(self, client: socket.socket) -> None:
        if self.hold_s:
            time.sleep(self.hold_s)
        try:
            if self.tls is not None:
                client.settimeout(10)
                client = self.tls.wrap_socket(client, server_side=True)
                client.settimeout(None)
            upstream = socket.create_connection(self.target)
        except OSError:
            client.close()  # the broker itself is not there: the client sees it go
            return
        with self._lock:
            self.pairs.append((client, upstream))
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._copy, args=(a, b), daemon=True).start()

    @staticmethod
    def _copy(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        """Drop every connection at once, as a broker that dies would."""
        with self._lock:
            pairs, self.pairs = self.pairs, []
        for a, b in pairs:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def close(self) -> None:
        self._stopped = True
        self._close_listener()
        self.cut()


class Away:
    """Every way from a bridge to its broker (STOMP, and AMQP on RabbitMQ) through a proxy of
    its own, refusing connections until ``open()``: the broker away, at start or later."""

    def __init__(self, broker: Broker, *, accepting: bool = False, hold_s: float = 0.0) -> None:
        self.proxies = [TcpProxy((broker.stomp_host, broker.stomp_port), accepting=accepting,
                                 hold_s=hold_s)]
        self.extra: list[str] = []
        if broker.name == "rabbitmq":
            amqp = TcpProxy(("127.0.0.1", 5672), accepting=accepting, hold_s=hold_s)
            self.proxies.append(amqp)
            self.extra = ["--upstream-amqp", f"amqp://guest:guest@127.0.0.1:{amqp.port}/%2F"]

    @property
    def stomp_port(self) -> int:
        return self.proxies[0].port

    def open(self) -> None:
        for p in self.proxies:
            p.open()

    def refuse(self) -> None:
        for p in self.proxies:
            p.refuse()

    def close(self) -> None:
        for p in self.proxies:
            p.close()

"""A TCP proxy between the bridge and the broker, for cutting the broker off mid-session."""

from __future__ import annotations

import select
import socket
import ssl
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.integration.brokers import Broker


def _shut(*socks: socket.socket) -> None:
    """Both ways of each socket shut (the peer sees the end), whatever state it is in."""
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class TcpProxy:
    """``accepting=False``: the port is bound but refuses connections, as a broker that has not
    started yet does, until ``open()``. ``hold_s``: each connection is taken on only after that
    long, as a broker slow to answer (one still starting, or far away) takes it. ``record``:
    the bytes of each connection are kept, (sent to the target, sent back), in ``recorded``."""

    def __init__(self, target: tuple[str, int], *, accepting: bool = True,
                 tls: ssl.SSLContext | None = None, hold_s: float = 0.0,
                 record: bool = False) -> None:
        self.target = target
        self.hold_s = hold_s
        self.record = record
        self.recorded: list[tuple[bytearray, bytearray]] = []
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
        _shut(self.listener)  # wakes the accept() blocked in the other thread; close() would not
        self.listener.close()

    def _accept(self, listener: socket.socket) -> None:
        while not self._stopped:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            if self.hold_s or self.tls is not None:  # (a slow TLS handshake holds no other)
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
        kept = (bytearray(), bytearray())
        with self._lock:
            self.pairs.append((client, upstream))
            if self.record:
                self.recorded.append(kept)
        if isinstance(client, ssl.SSLSocket):  # one thread: a TLS socket is not for two
            threading.Thread(target=self._relay, args=(client, upstream), daemon=True).start()
            return
        for a, b, into in ((client, upstream, kept[0]), (upstream, client, kept[1])):
            threading.Thread(target=self._copy, args=(a, b, into if self.record else None),
                             daemon=True).start()

    @staticmethod
    def _copy(src: socket.socket, dst: socket.socket, into: bytearray | None) -> None:
        try:
            while data := src.recv(65536):
                if into is not None:
                    into += data
                dst.sendall(data)
        except OSError:
            pass
        _shut(src, dst)

    @staticmethod
    def _relay(tls: ssl.SSLSocket, plain: socket.socket) -> None:
        """Both ways between a TLS client and its plain upstream, in one thread: a read and a
        write on one TLS connection from two threads at once can stall it (OpenSSL's
        connection state is not for two threads)."""
        try:
            while True:
                ready = [tls] if tls.pending() else select.select([tls, plain], [], [])[0]
                for src in ready:
                    data = src.recv(65536)
                    if not data:
                        raise EOFError
                    (plain if src is tls else tls).sendall(data)
        except (OSError, EOFError, ValueError):
            pass
        _shut(tls, plain)

    def cut(self) -> None:
        """Drop every connection at once, as a broker that dies would."""
        with self._lock:
            pairs, self.pairs = self.pairs, []
        for a, b in pairs:
            _shut(a, b)
            a.close()
            b.close()

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

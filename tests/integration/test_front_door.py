"""The broker sees only real clients: the upstream connection is opened once a whole CONNECT
has arrived; a client that never sends one is closed after the handshake timeout; connection
limits answer an excess connection with an ERROR frame."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from tests.integration.bridgeproc import BridgeProcess
from tests.integration.brokers import BROKERS, require
from tests.integration.staging_util import management


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BridgeProcess]:
    broker = BROKERS["rabbitmq"]
    require(broker)
    proc = BridgeProcess("rabbitmq", f"{broker.stomp_host}:{broker.stomp_port}",
                         tmp_path_factory.mktemp("door") / "bridge.log",
                         extra=["--handshake-timeout", "1.5",
                                "--max-connections-per-address", "25",
                                "--staging-engine", "off"])
    proc.start()
    yield proc
    assert proc.stop() == 0, proc.log()


def _stomp_connections() -> int:
    conns = management(BROKERS["rabbitmq"], "/connections?columns=protocol")
    return sum(1 for c in conns if "STOMP" in str(c.get("protocol", "")))


def _read_all(sock: socket.socket, timeout: float) -> bytes:
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        pass
    return data


def test_idle_and_garbage_connections_never_reach_the_broker(door: BridgeProcess) -> None:
    before = _stomp_connections()
    idle = [socket.create_connection(("127.0.0.1", door.stomp_port)) for _ in range(10)]
    garbage = [socket.create_connection(("127.0.0.1", door.stomp_port)) for _ in range(5)]
    for s in garbage:
        s.sendall(b"\x16\x03\x01 not stomp at all\n\n\x00")
    for s in garbage:
        reply = _read_all(s, 2.0)
        assert reply.startswith(b"ERROR\n"), reply  # answered by the bridge, and closed
    time.sleep(1.0)  # the management API's view lags a little
    assert _stomp_connections() - before < 3  # (other tests' bridges may come and go)
    for s in idle + garbage:
        s.close()


def test_a_client_that_never_connects_is_closed_after_the_handshake_timeout(
    door: BridgeProcess,
) -> None:
    sock = socket.create_connection(("127.0.0.1", door.stomp_port))
    start = time.monotonic()
    reply = _read_all(sock, 5.0)
    took = time.monotonic() - start
    assert reply.startswith(b"ERROR\n") and b"handshake timeout" in reply, reply
    assert 1.4 <= took < 4.0
    sock.close()
    assert 'kind="handshake-timeout"' in door.http("/metrics")[1]


def test_a_real_client_still_gets_through(door: BridgeProcess) -> None:
    broker = BROKERS["rabbitmq"]
    sock = socket.create_connection(("127.0.0.1", door.stomp_port))
    sock.sendall(f"CONNECT\naccept-version:1.2\nhost:/\nlogin:{broker.user}\n"
                 f"passcode:{broker.password}\n\n\x00".encode())
    sock.settimeout(5)
    assert sock.recv(65536).startswith(b"CONNECTED\n")
    time.sleep(2.0)  # past the handshake timeout: a connected client stays
    sock.sendall(b"DISCONNECT\nreceipt:bye\n\n\x00")
    assert b"RECEIPT" in _read_all(sock, 3.0)
    sock.close()


def test_connections_past_the_limit_per_address_are_refused(door: BridgeProcess) -> None:
    held = [socket.create_connection(("127.0.0.1", door.stomp_port)) for _ in range(25)]
    extra = socket.create_connection(("127.0.0.1", door.stomp_port))
    reply = _read_all(extra, 3.0)
    assert reply.startswith(b"ERROR\n") and b"--max-connections-per-address" in reply, reply
    for s in held + [extra]:
        s.close()
    time.sleep(0.3)
    again = socket.create_connection(("127.0.0.1", door.stomp_port))
    again.sendall(b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\x00")
    again.settimeout(5)
    assert again.recv(65536).startswith(b"CONNECTED\n")
    again.close()

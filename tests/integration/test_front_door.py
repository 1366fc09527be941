"""The broker sees only real clients: the upstream connection is opened once a whole CONNECT
(AMQP: the protocol header) has arrived; a client that never sends one is closed after the
handshake timeout; connection limits answer an excess connection with an ERROR frame."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.bridgeproc import BridgeProcess, free_port
from tests.integration.brokers import BROKERS, require

AMQP_PORT = free_port()
AMQP_HEADER = b"AMQP\x00\x00\x09\x01"


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BridgeProcess]:
    broker = BROKERS["rabbitmq"]
    require(broker)
    proc = BridgeProcess("rabbitmq", f"{broker.stomp_host}:{broker.stomp_port}",
                         tmp_path_factory.mktemp("door") / "bridge.log",
                         extra=["--handshake-timeout", "1.5",
                                "--amqp-listen", f"127.0.0.1:{AMQP_PORT}",
                                "--max-connections-per-address", "25",
                                "--staging-engine", "off"])
    proc.start()
    yield proc
    assert proc.stop() == 0, proc.log()


def _sockets_to(pid: int, port: int) -> int:
    """The process's established TCP connections to ``port`` (from /proc: at once, unlike the
    management API's view, which lags by its statistics interval)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if remote_port == port and fields[3] == "01" and fields[9] in inodes:
                count += 1
    return count


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
    assert door.proc is not None
    broker_port = BROKERS["rabbitmq"].stomp_port
    before = _sockets_to(door.proc.pid, broker_port)
    idle = [socket.create_connection(("127.0.0.1", door.stomp_port)) for _ in range(10)]
    garbage = [socket.create_connection(("127.0.0.1", door.stomp_port)) for _ in range(5)]
    for s in garbage:
        s.sendall(b"\x16\x03\x01 not stomp at all\n\n\x00")
    for s in garbage:
        reply = _read_all(s, 2.0)
        assert reply.startswith(b"ERROR\n"), reply  # answered by the bridge, and closed
    time.sleep(0.5)
    # Not one upstream connection for them (at most as many as before: one the bridge opened
    # for itself while it started may have closed since).
    assert _sockets_to(door.proc.pid, broker_port) <= before
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


def test_amqp_idle_and_other_protocols_never_reach_the_broker(door: BridgeProcess) -> None:
    assert door.proc is not None
    broker_port = int(BROKERS["rabbitmq"].amqp_url.rsplit(":", 1)[1].split("/")[0])
    before = _sockets_to(door.proc.pid, broker_port)
    idle = [socket.create_connection(("127.0.0.1", AMQP_PORT)) for _ in range(10)]
    half = [socket.create_connection(("127.0.0.1", AMQP_PORT)) for _ in range(5)]
    for s in half:
        s.sendall(AMQP_HEADER[:5])  # a header begun, never finished
    garbage = [socket.create_connection(("127.0.0.1", AMQP_PORT)) for _ in range(5)]
    for s in garbage:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    for s in garbage:
        reply = _read_all(s, 2.0)
        assert reply == AMQP_HEADER, reply  # RabbitMQ's answer to another protocol, then closed
    time.sleep(0.5)
    # Not one upstream connection for them (at most as many as before: one the bridge opened
    # for itself while it started may have closed since).
    assert _sockets_to(door.proc.pid, broker_port) <= before
    for s in idle + half:
        reply = _read_all(s, 3.0)  # closed by the handshake timeout (1.5 s), nothing said
        assert reply == b"", reply
    for s in idle + half + garbage:
        s.close()
    metrics = door.http("/metrics")[1]
    assert 'jms_bridge_amqp_protocol_errors_total{kind="handshake-timeout"} 15.0' in metrics
    assert 'jms_bridge_amqp_protocol_errors_total{kind="bad-header"} 5.0' in metrics


def test_amqp_client_sending_its_header_in_pieces_gets_through(door: BridgeProcess) -> None:
    import pika

    sock = socket.create_connection(("127.0.0.1", AMQP_PORT))
    for octet in AMQP_HEADER:
        sock.sendall(bytes([octet]))
        time.sleep(0.05)
    sock.settimeout(5)
    start = sock.recv(65536)
    assert start[:1] == b"\x01" and b"RabbitMQ" in start  # the broker's own Connection.Start
    sock.close()
    broker = BROKERS["rabbitmq"]
    params = pika.ConnectionParameters(
        "127.0.0.1", AMQP_PORT, credentials=pika.PlainCredentials(broker.user, broker.password))
    conn = pika.BlockingConnection(params)
    time.sleep(2.0)  # past the handshake timeout: a client that sent its header stays
    assert conn.is_open
    conn.channel().queue_declare("", exclusive=True)
    conn.close()

"""Memory bounded by configuration, against the real brokers: a frame over --max-frame-bytes is
refused as soon as its size is known; past --max-buffered-bytes the bridge stops reading the
clients that stream large frames, everything still arrives, and a small client keeps working."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pamqp import body as body_frame
from pamqp import commands, header
from pamqp import frame as pframe

from tests.integration.amqp_raw import handshake, read_frame
from tests.integration.bridgeproc import BridgeProcess, free_port, wait_port
from tests.integration.brokers import BROKERS, Broker, require
from tests.integration.clients import connect

MIB = 1024 * 1024


def _connected(port: int, broker: Broker) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(f"CONNECT\naccept-version:1.2\nhost:/\nlogin:{broker.user}\n"
                 f"passcode:{broker.password}\nheart-beat:0,0\n\n\0".encode())
    assert _read_frame(sock).startswith(b"CONNECTED\n")
    return sock


def _read_frame(sock: socket.socket, timeout: float = 10.0) -> bytes:
    sock.settimeout(timeout)
    data = b""
    while b"\0" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data.split(b"\0", 1)[0]


def test_a_frame_declaring_too_large_a_body_is_refused_at_once(bridge: BridgeProcess,
                                                              broker: Broker, queue: str) -> None:
    sock = _connected(bridge.stomp_port, broker)
    started = time.monotonic()
    sock.sendall(f"SEND\ndestination:/queue/{queue}\ncontent-length:{200 * MIB}\n\n".encode()
                 + b"x" * 65536)
    reply = _read_frame(sock, 5.0)
    assert reply.startswith(b"ERROR\n") and b"frame too large" in reply, reply[:300]
    assert time.monotonic() - started < 3.0  # not after 64 MiB had come
    sock.close()


@pytest.fixture
def small(broker: Broker, tmp_path: Path) -> Iterator[BridgeProcess]:
    proc = BridgeProcess(broker.name, f"{broker.stomp_host}:{broker.stomp_port}",
                         tmp_path / "bridge.log",
                         extra=["--max-frame-bytes", "1MiB", "--max-buffered-bytes", "1MiB",
                                "--staging-engine", "off"]).start()
    yield proc
    assert proc.stop() == 0, proc.log()[-3000:]


def test_a_frame_without_content_length_is_refused_when_it_crosses_the_limit(
        small: BridgeProcess, broker: Broker, queue: str) -> None:
    sock = _connected(small.stomp_port, broker)
    sock.sendall(f"SEND\ndestination:/queue/{queue}\n\n".encode() + b"x" * (MIB + 4096))
    reply = _read_frame(sock, 5.0)
    assert reply.startswith(b"ERROR\n") and b"frame too large" in reply, reply[:300]
    sock.close()


def test_past_the_budget_clients_wait_and_nothing_is_lost(small: BridgeProcess,
                                                          broker: Broker, queue: str) -> None:
    big = 900 * 1024
    streams = 6
    receipts: list[bytes] = []

    def stream(i: int) -> None:
        sock = _connected(small.stomp_port, broker)
        head = (f"SEND\ndestination:/queue/{queue}\nreceipt:big{i}\n"
                f"content-length:{big}\n\n").encode()
        body = bytes([65 + i]) * big
        data = head + body + b"\0"
        for at in range(0, len(data), 32 * 1024):
            sock.sendall(data[at:at + 32 * 1024])
            time.sleep(0.002)  # a slow network: the streams overlap
        receipts.append(_read_frame(sock, 30.0))
        sock.close()

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    # Meanwhile a normal client sends and receives through the same bridge.
    conn, inbox = connect(small.stomp_port, broker.user, broker.password)
    small_queue = queue + "-small"
    conn.subscribe(f"/queue/{small_queue}", id="s", ack="auto")
    for i in range(20):
        conn.send(f"/queue/{small_queue}", f"small {i}", headers={"receipt": f"s{i}"})
    assert all(inbox.wait_receipt(f"s{i}", timeout=20) for i in range(20))
    assert len(inbox.take(20, timeout=20)) == 20
    for t in threads:
        t.join(60)
    assert sorted(r.split(b"\n")[0] for r in receipts) == [b"RECEIPT"] * streams, receipts
    conn.subscribe(f"/queue/{queue}", id="b", ack="auto")
    got = inbox.take(streams, timeout=30)
    conn.disconnect()
    assert sorted(len(m.body) for m in got) == [big] * streams
    assert small.metric("jms_bridge_budget_pauses_total") > 0
    assert small.metric("jms_bridge_buffered_bytes") == 0


# -- the AMQP listener shares the budget ------------------------------------------------------

def _amqp_channel(port: int, broker: Broker) -> socket.socket:
    """A raw AMQP connection through the bridge, channel 1 open in confirm mode."""
    sock = handshake(port, user=broker.user, password=broker.password, timeout=30)
    sock.sendall(pframe.marshal(commands.Channel.Open(), 1))
    assert isinstance(read_frame(sock)[1], commands.Channel.OpenOk)
    sock.sendall(pframe.marshal(commands.Confirm.Select(), 1))
    assert isinstance(read_frame(sock)[1], commands.Confirm.SelectOk)
    return sock


@pytest.fixture
def small_amqp(tmp_path: Path) -> Iterator[tuple[BridgeProcess, int]]:
    rabbit = BROKERS["rabbitmq"]
    require(rabbit)
    port = free_port()
    proc = BridgeProcess("rabbitmq", f"{rabbit.stomp_host}:{rabbit.stomp_port}",
                         tmp_path / "bridge.log",
                         extra=["--max-frame-bytes", "1MiB", "--max-buffered-bytes", "1MiB",
                                "--amqp-listen", f"127.0.0.1:{port}",
                                "--staging-engine", "off"]).start()
    assert wait_port(port, 10)
    yield proc, port
    assert proc.stop() == 0, proc.log()[-3000:]


def test_amqp_publishes_past_the_budget_wait_and_nothing_is_lost(
        small_amqp: tuple[BridgeProcess, int]) -> None:
    import pika

    bridge, port = small_amqp
    rabbit = BROKERS["rabbitmq"]
    queue = f"jbt-{uuid.uuid4().hex[:12]}"
    params = pika.ConnectionParameters("127.0.0.1", port, credentials=pika.PlainCredentials(
        rabbit.user, rabbit.password))
    setup = pika.BlockingConnection(params)
    channel = setup.channel()
    channel.queue_declare(queue, durable=False, arguments={"x-expires": 120_000})
    big, streams = 900 * 1024, 6
    confirms: list[object] = []

    def stream(i: int) -> None:
        sock = _amqp_channel(port, rabbit)
        body = bytes([65 + i]) * big
        data = (pframe.marshal(commands.Basic.Publish(exchange="", routing_key=queue), 1)
                + pframe.marshal(header.ContentHeader(0, big, commands.Basic.Properties()), 1)
                + b"".join(pframe.marshal(body_frame.ContentBody(body[at:at + 131_000]), 1)
                           for at in range(0, big, 131_000)))
        for at in range(0, len(data), 32 * 1024):
            sock.sendall(data[at:at + 32 * 1024])
            time.sleep(0.002)  # a slow network: the streams overlap
        confirms.append(read_frame(sock)[1])
        sock.close()

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    # Meanwhile a normal client publishes and gets through the same bridge.
    small_queue = queue + "-small"
    channel.queue_declare(small_queue, durable=False, arguments={"x-expires": 120_000})
    channel.confirm_delivery()
    for i in range(20):
        channel.basic_publish("", small_queue, f"small {i}".encode())
    assert [channel.basic_get(small_queue, auto_ack=True)[2] for _ in range(20)] == [
        f"small {i}".encode() for i in range(20)]
    for t in threads:
        t.join(60)
    assert [type(c).__name__ for c in confirms] == ["Ack"] * streams, confirms
    got = []
    for _ in range(streams):
        method, _, body = channel.basic_get(queue, auto_ack=True)
        assert method is not None
        got.append(body)
    channel.queue_delete(queue)
    channel.queue_delete(small_queue)
    setup.close()
    assert sorted(got) == sorted(bytes([65 + i]) * big for i in range(streams))
    assert bridge.metric("jms_bridge_amqp_budget_pauses_total") > 0
    assert bridge.metric("jms_bridge_amqp_buffered_bytes") == 0

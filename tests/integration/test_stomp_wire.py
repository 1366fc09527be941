"""Exact bytes through the bridge: CONNECTED, errors, heart-beat timeouts, broker loss, SIGTERM."""

from __future__ import annotations

import json
import socket
import time
import uuid
from pathlib import Path

from bridge.frontends.stomp import Frame
from tests.integration.bridgeproc import BridgeProcess
from tests.integration.brokers import Broker
from tests.integration.tcpproxy import TcpProxy
from tests.integration.wire import RawPeer


def test_connected_frame_is_the_brokers_own(bridge: BridgeProcess, broker: Broker) -> None:
    direct = RawPeer(broker.stomp_port, broker.stomp_host)
    expected = direct.connect(broker.user, broker.password, heart_beat="0,0")
    relayed = RawPeer(bridge.stomp_port)
    got = relayed.connect(broker.user, broker.password, heart_beat="0,0")
    assert got.command == expected.command == "CONNECTED"
    assert got.get("version") == expected.get("version") == "1.2"
    assert got.get("server") == expected.get("server")
    assert got.get("heart-beat") == expected.get("heart-beat")
    direct.close()
    relayed.close()


def test_malformed_frame_gets_error_and_close_others_unaffected(
    bridge: BridgeProcess, broker: Broker, queue: str
) -> None:
    bystander = RawPeer(bridge.stomp_port)
    assert bystander.connect(broker.user, broker.password).command == "CONNECTED"
    before = bridge.metric("jms_bridge_protocol_errors_total", kind="bad-header")

    bad = RawPeer(bridge.stomp_port)
    assert bad.connect(broker.user, broker.password).command == "CONNECTED"
    bad.send(b"SEND\ndestination:/queue/x\nthis line has no colon\n\nbody\x00")
    error = bad.next_frame()
    assert error.command == "ERROR"
    assert "header" in (error.get("message") or "").lower()
    assert bad.wait_closed()
    assert bridge.metric("jms_bridge_protocol_errors_total", kind="bad-header") == before + 1

    dest = broker.queue_destination(queue)
    bystander.send(f"SUBSCRIBE\nid:1\ndestination:{dest}\nack:auto\n\n\x00".encode())
    bystander.send(f"SEND\ndestination:{dest}\nreceipt:r1\n\nstill here\x00".encode())
    frames = [bystander.next_frame(), bystander.next_frame()]
    assert sorted(f.command for f in frames) == ["MESSAGE", "RECEIPT"]
    assert [f.body for f in frames if f.command == "MESSAGE"] == [b"still here"]
    bystander.close()


def test_first_frame_must_be_connect(bridge: BridgeProcess) -> None:
    peer = RawPeer(bridge.stomp_port)
    peer.send(b"SEND\ndestination:/queue/x\nreceipt:77\n\nhi\x00")
    error = peer.next_frame()
    assert error.command == "ERROR"
    assert "CONNECT" in (error.get("message") or "")
    assert error.get("receipt-id") == "77"
    assert peer.wait_closed()


def test_silent_client_is_disconnected_and_upstream_closed(
    bridge: BridgeProcess, broker: Broker
) -> None:
    peer = RawPeer(bridge.stomp_port)
    connected = peer.connect(broker.user, broker.password, heart_beat="300,0")
    assert connected.command == "CONNECTED"
    assert connected.get("heart-beat", "0,0").split(",")[1] != "0", "broker offers no heart-beat"
    started = time.monotonic()
    assert peer.wait_closed(timeout=15), "a silent client was not disconnected"
    assert time.monotonic() - started < 10
    # The bridge says why (unless the broker noticed first and hung up on us).
    errors = [f for f in peer.frames if f.command == "ERROR"]
    assert errors, "the client was closed without an ERROR frame"
    deadline = time.monotonic() + 5
    while bridge.metric("jms_bridge_connections_open") > 0 and time.monotonic() < deadline:
        time.sleep(0.1)


def test_broker_going_away_reaches_clients_as_error(
    broker: Broker, tmp_path: Path
) -> None:
    proxy = TcpProxy((broker.stomp_host, broker.stomp_port))
    proc = BridgeProcess(broker.name, f"127.0.0.1:{proxy.port}", tmp_path / "b.log").start()
    try:
        peers = [RawPeer(proc.stomp_port) for _ in range(3)]
        for p in peers:
            assert p.connect(broker.user, broker.password).command == "CONNECTED"
        proxy.cut()
        for p in peers:
            error = p.next_frame()
            assert error.command == "ERROR"
            assert "broker" in (error.get("message") or "")
            assert p.wait_closed()
    finally:
        proxy.close()
        assert proc.stop() == 0


def test_sigterm_shuts_down_cleanly(broker: Broker, tmp_path: Path, queue: str) -> None:
    proc = BridgeProcess(broker.name, f"{broker.stomp_host}:{broker.stomp_port}",
                         tmp_path / "b.log").start()
    peer = RawPeer(proc.stomp_port)
    assert peer.connect(broker.user, broker.password).command == "CONNECTED"
    dest = broker.queue_destination(queue)
    peer.send(f"SEND\ndestination:{dest}\nreceipt:before-stop\n\nkept\x00".encode())
    assert peer.next_frame().command == "RECEIPT"
    assert proc.stop() == 0, proc.log()
    assert peer.wait_closed()
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", proc.stomp_port)) != 0, "still accepting after SIGTERM"
    # The message sent before the stop is on the broker.
    direct = RawPeer(broker.stomp_port, broker.stomp_host)
    direct.connect(broker.user, broker.password)
    direct.send(f"SUBSCRIBE\nid:1\ndestination:{dest}\nack:auto\n\n\x00".encode())
    assert direct.next_frame().body == b"kept"
    direct.close()


def test_a_malformed_admin_request_gets_400_and_one_log_line_not_a_traceback(
    bridge: BridgeProcess,
) -> None:
    """aiohttp logs a request line it cannot parse with its parser's traceback; the bridge's
    log has one line naming the error instead."""
    before = len(bridge.log())
    with socket.create_connection(("127.0.0.1", bridge.admin_port), timeout=5) as sock:
        sock.sendall(b"GET /dlq?limit=\xc2\xb2 HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = sock.recv(4096)
    assert answer.split(b" ", 2)[1] == b"400", answer
    deadline = time.monotonic() + 5
    while "Error handling request" not in bridge.log()[before:] and time.monotonic() < deadline:
        time.sleep(0.05)
    written = bridge.log()[before:]
    assert "Error handling request" in written and "Invalid char in url" in written, written
    assert "Traceback" not in written, written


def test_admin_endpoints(bridge: BridgeProcess, broker: Broker) -> None:
    assert bridge.http("/healthz")[0] == 200
    status, body = bridge.http("/policy?destination=/queue/orders&upto=4")
    assert status == 200 and json.loads(body)["policy"] == "3:25; 5:50; 10:100; 20:1000; 50:5000"
    assert json.loads(body)["failures"][0] == {"first": 1, "last": 3, "action": "redeliver at once"}
    assert bridge.http("/policy")[0] == 400
    # With a token file, only the probes and /metrics are open to anyone.
    assert bridge.http("/policy?destination=/queue/orders", authorized=False)[0] == 401
    for path in ("/healthz", "/readyz", "/metrics"):
        assert bridge.http(path, authorized=False)[0] == 200, path
    status, body = bridge.http("/readyz")
    assert status == 200 and '"ready"' in body
    peer = RawPeer(bridge.stomp_port)
    peer.connect(broker.user, broker.password)
    status, text = bridge.http("/metrics")
    assert status == 200
    for name in ("jms_bridge_connections_open", "jms_bridge_connections_total",
                 "jms_bridge_frames_relayed_total", "jms_bridge_bytes_relayed_total",
                 "jms_bridge_protocol_errors_total"):
        assert name in text
    assert bridge.metric("jms_bridge_frames_relayed_total", command="CONNECT",
                         direction="upstream") >= 1
    assert bridge.metric("jms_bridge_frames_relayed_total", command="CONNECTED",
                         direction="downstream") >= 1
    assert bridge.metric("jms_bridge_connections_open") >= 1
    peer.close()


def test_readyz_says_when_the_broker_is_gone(broker: Broker, tmp_path: Path) -> None:
    proxy = TcpProxy((broker.stomp_host, broker.stomp_port))
    proc = BridgeProcess(broker.name, f"127.0.0.1:{proxy.port}", tmp_path / "b.log",
                         admin_token=None).start()
    try:
        assert proc.http("/readyz")[0] == 200
        # Without --admin-token-file nobody may list or change staged messages.
        status, body = proc.http("/staged")
        assert status == 403 and "--admin-token-file" in body
        proxy.close()
        status, body = proc.http("/readyz")
        assert status == 503 and "not ready" in body
        assert proc.http("/healthz")[0] == 200
    finally:
        assert proc.stop() == 0


def _answers(peer: RawPeer, data: bytes, dest: str, receipt: str) -> tuple[list[Frame], bool]:
    """What a connected peer gets back for ``data``, then whether a SEND after it is answered
    (False: the connection was closed)."""
    peer.send(data)
    peer.send(f"SEND\ndestination:{dest}\nreceipt:{receipt}\n\nafter\x00".encode())
    got: list[Frame] = []
    while True:
        try:
            frame = peer.next_frame(timeout=5)
        except AssertionError:
            return got, False
        got.append(frame)
        if frame.command == "RECEIPT" and frame.get("receipt-id") == receipt:
            return got, True


def _shape(frames: list[Frame]) -> list[tuple[str, str | None, str | None]]:
    return [(f.command, f.get("message"), f.get("receipt-id")) for f in frames]


def test_stray_nuls_between_frames_are_skipped_as_the_broker_skips_them(
    bridge: BridgeProcess, broker: Broker
) -> None:
    dest = broker.queue_destination(f"jbt-stompwire-{uuid.uuid4().hex[:8]}")
    for port, host in ((broker.stomp_port, broker.stomp_host), (bridge.stomp_port, "127.0.0.1")):
        peer = RawPeer(port, host)
        assert peer.connect(broker.user, broker.password).command == "CONNECTED"
        got, open_after = _answers(peer, b"\x00\x00", dest, "r1")
        assert open_after and _shape(got) == [("RECEIPT", None, "r1")], (port, _shape(got))
        # a NUL right behind a frame's own NUL
        peer.send(f"SEND\ndestination:{dest}\nreceipt:r2\n\nx\x00\x00".encode())
        assert _shape([peer.next_frame()]) == [("RECEIPT", None, "r2")]
        peer.close()


def test_unknown_command_after_connect_gets_the_brokers_own_answer(
    bridge: BridgeProcess, broker: Broker
) -> None:
    dest = broker.queue_destination(f"jbt-stompwire-{uuid.uuid4().hex[:8]}")
    seen = []
    for port, host in ((broker.stomp_port, broker.stomp_host), (bridge.stomp_port, "127.0.0.1")):
        peer = RawPeer(port, host)
        assert peer.connect(broker.user, broker.password).command == "CONNECTED"
        got, open_after = _answers(peer, b"FOO\nreceipt:f1\n\n\x00", dest, "r1")
        seen.append((_shape(got), open_after, [f.body for f in got if f.command == "ERROR"]))
        peer.close()
    direct, relayed = seen
    assert direct[0] and direct[0][0][0] == "ERROR"
    # RabbitMQ: "Bad command" and the connection goes on; ActiveMQ: "Unknown STOMP action" + close
    assert relayed[:2] == direct[:2]
    assert relayed[2][0].split(b"\n")[0] == direct[2][0].split(b"\n")[0]


def test_unknown_command_before_connect_is_still_refused_by_the_bridge(
    bridge: BridgeProcess,
) -> None:
    peer = RawPeer(bridge.stomp_port)
    peer.send(b"FOO\nreceipt:f1\n\n\x00")
    error = peer.next_frame()
    assert error.command == "ERROR" and "CONNECT" in (error.get("message") or "")
    assert peer.wait_closed()

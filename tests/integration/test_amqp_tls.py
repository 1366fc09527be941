"""The AMQP 0-9-1 listener over TLS (``--amqp-tls-listen``), as RabbitMQ's amqps port: pika
with a client certificate (mutual TLS) publishes a delayed message through it and sees it
arrive; a client without a certificate, or speaking plain text, is closed at once."""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest

from bridge.frontends.amqp import PROTOCOL_HEADER
from tests.integration.bridgeproc import BridgeProcess, free_port, wait_port
from tests.integration.brokers import BROKERS, require
from tests.integration.certs import Authority, Pair

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def client_pair(ca: Authority) -> Pair:
    return ca.issue("client", "billing-app", server=False)


@pytest.fixture(scope="module")
def amqps_bridge(ca: Authority, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[BridgeProcess]:
    broker = BROKERS["rabbitmq"]
    require(broker)
    tmp = tmp_path_factory.mktemp("amqps")
    server = ca.issue(f"bridge-{uuid.uuid4().hex[:6]}", "localhost")
    cert, key = tmp / "tls.crt", tmp / "tls.key"
    shutil.copy(server.cert, cert)
    shutil.copy(server.key, key)
    port = free_port()
    proc = BridgeProcess("rabbitmq", f"{broker.stomp_host}:{broker.stomp_port}",
                         tmp / "bridge.log",
                         extra=["--amqp-tls-listen", f"127.0.0.1:{port}", "--tls-cert",
                                str(cert), "--tls-key", str(key), "--tls-client-ca",
                                str(ca.pem), "--staging-prefix",
                                f"jbt-staging-{uuid.uuid4().hex[:8]}"])
    proc.amqps_port = port  # type: ignore[attr-defined]
    proc.start()
    assert wait_port(port, 20, proc.proc), proc.log()
    yield proc
    assert proc.stop() == 0, proc.log()[-3000:]


def amqps(port: int, ca: Authority, pair: Pair | None) -> pika.BlockingConnection:
    ctx = ssl.create_default_context(cafile=str(ca.pem))
    if pair is not None:
        ctx.load_cert_chain(str(pair.cert), str(pair.key))
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", port, credentials=pika.PlainCredentials("guest", "guest"),
        ssl_options=pika.SSLOptions(ctx, server_hostname="localhost"),
        connection_attempts=1, socket_timeout=5))


def test_a_delayed_publish_over_mutual_tls(amqps_bridge: BridgeProcess, ca: Authority,
                                          client_pair: Pair) -> None:
    conn = amqps(amqps_bridge.amqps_port, ca, client_pair)  # type: ignore[attr-defined]
    channel: Any = conn.channel()
    queue = f"jbt-amqps-{uuid.uuid4().hex[:12]}"
    channel.queue_declare(queue, auto_delete=False)
    try:
        channel.confirm_delivery()
        sent = time.monotonic()
        channel.basic_publish("", queue, b"over tls, later",
                              pika.BasicProperties(headers={"x-delay": 400}))
        body = None
        while body is None and time.monotonic() - sent < 15:
            body = channel.basic_get(queue, auto_ack=True)[2]
            time.sleep(0.05)
        assert body == b"over tls, later", amqps_bridge.log()[-3000:]
        assert time.monotonic() - sent >= 0.35  # it was held, not relayed at once
    finally:
        channel.queue_delete(queue)
        conn.close()
    lines = [json.loads(x) for x in amqps_bridge.log().splitlines() if '"tls client"' in x]
    assert lines and lines[-1]["client_subject"] == "CN=billing-app,O=jms-bridge tests"


def test_without_a_client_certificate_the_handshake_fails(amqps_bridge: BridgeProcess,
                                                          ca: Authority) -> None:
    with pytest.raises((pika.exceptions.AMQPConnectionError, OSError)):
        amqps(amqps_bridge.amqps_port, ca, None)  # type: ignore[attr-defined]


def test_plain_text_on_the_tls_port_is_closed_at_once(amqps_bridge: BridgeProcess) -> None:
    port = amqps_bridge.amqps_port  # type: ignore[attr-defined]
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(PROTOCOL_HEADER)
        try:
            data = sock.recv(65536)
            rest = sock.recv(65536) if data else b""
        except ConnectionResetError:
            data = rest = b""
    assert not data.startswith(b"\x01")  # no Connection.Start
    assert rest == b""
    assert time.monotonic() - started < 2.0
    assert amqps_bridge.proc is not None and amqps_bridge.proc.poll() is None
    assert "Traceback" not in amqps_bridge.log()


def test_the_tls_listener_needs_a_certificate(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bridge.app.cli", "run", "--broker", "rabbitmq",
         "--amqp-tls-listen", f"127.0.0.1:{free_port()}"],
        capture_output=True, text=True, timeout=30)
    lines = [x for x in done.stderr.splitlines() if x.strip()]
    assert done.returncode == 1 and lines == [
        "jms-bridge: amqp-tls-listen: needs --tls-cert and --tls-key (PEM files)"], done.stderr

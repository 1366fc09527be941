"""The real brokers the integration tests talk to, and a check that one answers.

`scripts/brokers up` starts them. A test calls `require(broker)` first: a broker that does not
answer fails the test when CI is set, so a CI run can never pass by skipping, and skips it on a
developer's machine. Override an address with JMS_BRIDGE_TEST_RABBITMQ_STOMP or
JMS_BRIDGE_TEST_ACTIVEMQ_STOMP (host:port).
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass

import pytest

STATE_DIR = os.environ.get("JMS_BRIDGE_STATE", "/var/lib/jms-bridge")

_CONNECT_TIMEOUT = 2.0
_STOMP_TIMEOUT = 5.0
_MAX_REPLY = 64 * 1024


@dataclass(frozen=True)
class Broker:
    name: str
    stomp_host: str
    stomp_port: int
    user: str
    password: str
    amqp_url: str | None
    management_url: str | None
    log: str = ""
    # The STOMP CONNECT `host` header. RabbitMQ reads it as the vhost, and stomp.py 1.1/1.2
    # connections send the address they dialled unless told otherwise, which RabbitMQ refuses
    # ("Virtual host '127.0.0.1' access denied"). ActiveMQ ignores it.
    vhost: str = "/"

    def queue_destination(self, name: str) -> str:
        """The STOMP destination of queue `name`; the same form on RabbitMQ and ActiveMQ."""
        return f"/queue/{name}"


def _address(variable: str, default: str) -> tuple[str, int]:
    host, _, port = os.environ.get(variable, default).rpartition(":")
    return host.strip("[]"), int(port)


def _brokers() -> dict[str, Broker]:
    rabbit_host, rabbit_port = _address("JMS_BRIDGE_TEST_RABBITMQ_STOMP", "127.0.0.1:61613")
    amq_host, amq_port = _address("JMS_BRIDGE_TEST_ACTIVEMQ_STOMP", "127.0.0.1:61623")
    return {
        "rabbitmq": Broker(
            name="rabbitmq",
            stomp_host=rabbit_host,
            stomp_port=rabbit_port,
            user="guest",
            password="guest",
            amqp_url="amqp://guest:guest@127.0.0.1:5672/%2F",
            management_url="http://127.0.0.1:15672",
            log="/var/log/rabbitmq/",
        ),
        "activemq": Broker(
            name="activemq",
            stomp_host=amq_host,
            stomp_port=amq_port,
            user="admin",
            password="admin",
            amqp_url=None,
            management_url=None,
            log=f"{STATE_DIR}/activemq/log/activemq.log",
        ),
    }


BROKERS: dict[str, Broker] = _brokers()

# Broker -> None when it answered, else why not. One probe per broker per test session.
_probed: dict[Broker, str | None] = {}


def require(broker: Broker) -> None:
    """Fail (CI set) or skip the calling test unless `broker` accepts a STOMP login."""
    if broker not in _probed:
        _probed[broker] = probe(broker)
    problem = _probed[broker]
    if problem is None:
        return
    message = (
        f"{broker.name} STOMP at {broker.stomp_host}:{broker.stomp_port} is not reachable: "
        f"run scripts/brokers up (log: {broker.log}); {problem}"
    )
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def probe(broker: Broker) -> str | None:
    """Connect, log in with the broker's credentials, disconnect; None on success."""
    connect = (
        f"CONNECT\naccept-version:1.0,1.1,1.2\nhost:{broker.vhost}\nheart-beat:0,0\n"
        f"login:{broker.user}\npasscode:{broker.password}\n\n\0"
    ).encode()
    try:
        with socket.create_connection(
            (broker.stomp_host, broker.stomp_port), timeout=_CONNECT_TIMEOUT
        ) as sock:
            sock.sendall(connect)
            reply = _read_frame(sock, time.monotonic() + _STOMP_TIMEOUT)
            command, _, rest = reply.lstrip(b"\r\n").partition(b"\n")
            if command.rstrip(b"\r") == b"CONNECTED":
                sock.sendall(b"DISCONNECT\n\n\0")
                return None
            headers = rest.split(b"\n\n", 1)[0].decode(errors="replace").replace("\n", ", ")
            return f"CONNECT was answered with {command.decode(errors='replace')!r} ({headers})"
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"


def _read_frame(sock: socket.socket, deadline: float) -> bytes:
    """Bytes up to the first frame's NUL; TimeoutError when none comes before `deadline`."""
    data = b""
    while b"\0" not in data:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or len(data) > _MAX_REPLY:
            raise TimeoutError("no complete STOMP frame in reply to CONNECT")
        sock.settimeout(remaining)
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("connection closed before a reply to CONNECT")
        data += chunk
    return data.split(b"\0", 1)[0]

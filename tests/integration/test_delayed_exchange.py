"""RabbitMQ's delayed-message exchange (``x-delayed-message``) through the bridge, with the
plugin absent: declared as a real exchange of its ``x-delayed-type``, its delayed publishes
staged by the bridge and routed through that exchange when due."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pika
import pika.exceptions
import pytest

from tests.integration.bridgeproc import BridgeProcess, free_port, wait_port
from tests.integration.brokers import BROKERS, require

DELAYED = "x-delayed-message"


@pytest.fixture(scope="module")
def dx_bridge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BridgeProcess]:
    broker = BROKERS["rabbitmq"]
    require(broker)
    port = free_port()
    prefix = f"jbt-staging-delayx-{uuid.uuid4().hex[:8]}"
    proc = BridgeProcess("rabbitmq", f"{broker.stomp_host}:{broker.stomp_port}",
                         tmp_path_factory.mktemp("delayx") / "bridge.log",
                         extra=["--amqp-listen", f"127.0.0.1:{port}",
                                "--staging-prefix", prefix])
    proc.amqp_port = port  # type: ignore[attr-defined]
    proc.staging_prefix = prefix  # type: ignore[attr-defined]
    proc.start()
    assert wait_port(port, 20, proc.proc), proc.log()
    yield proc
    assert proc.stop() == 0, proc.log()


def _connect(bridge: BridgeProcess) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", bridge.amqp_port,  # type: ignore[attr-defined]
        credentials=pika.PlainCredentials("guest", "guest"), heartbeat=0))


def _direct() -> pika.BlockingConnection:
    broker = BROKERS["rabbitmq"]
    return pika.BlockingConnection(pika.ConnectionParameters(
        broker.stomp_host, 5672, credentials=pika.PlainCredentials("guest", "guest"),
        heartbeat=0))


def _name(kind: str) -> str:
    return f"jbt-delayx-{kind}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def names() -> Iterator[list[str]]:
    """Exchanges and queues a test made, deleted on the broker afterwards."""
    made: list[str] = []
    yield made
    conn = _direct()
    for name in made:
        ch = conn.channel()
        if "-q-" in name:
            ch.queue_delete(name)
        else:
            ch.exchange_delete(name)
    conn.close()


def _get(channel: Any, queue: str, timeout: float) -> tuple[Any, bytes] | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        method, props, body = channel.basic_get(queue, auto_ack=True)
        if method is not None:
            return props, body
        time.sleep(0.02)
    return None


def _delayed_exchange(ch: Any, names: list[str], kind: str = "direct") -> str:
    exchange = _name("x")
    names.append(exchange)
    ch.exchange_declare(exchange, DELAYED, durable=True,
                        arguments={"x-delayed-type": kind})
    return exchange


def _bound_queue(ch: Any, names: list[str], exchange: str, key: str = "k",
                 arguments: dict[str, Any] | None = None) -> str:
    queue = _name("q")
    names.append(queue)
    ch.queue_declare(queue, durable=True)
    ch.queue_bind(queue, exchange, key, arguments=arguments)
    return queue


def test_the_plugin_readme_with_pika(dx_bridge: BridgeProcess, names: list[str]) -> None:
    conn = _connect(dx_bridge)
    ch = conn.channel()
    exchange = _delayed_exchange(ch, names)
    queue = _bound_queue(ch, names, exchange)
    ch.confirm_delivery()  # a confirm means staged
    ch.basic_publish(exchange, "k", b"later", pika.BasicProperties(
        headers={"x-delay": 1500, "app": "kept"}, message_id="M-dx-1"))
    ch.basic_publish(exchange, "k", b"now", pika.BasicProperties(headers={"app": "now"}))
    got = _get(ch, queue, 1.0)
    assert got is not None and got[1] == b"now"  # no x-delay: at once
    assert _get(ch, queue, 0.8) is None  # not before its due time
    got = _get(ch, queue, 10)
    assert got is not None, dx_bridge.log()
    props, body = got
    assert body == b"later"
    assert props.headers["x-delay"] == -1500  # as the plugin leaves it
    assert props.headers["app"] == "kept"
    assert props.message_id == "M-dx-1"
    conn.close()

"""A queue declared with RabbitMQ 4.3 / LavinMQ delayed-retry arguments gets that schedule as its
redelivery policy through the bridge, on a RabbitMQ that ignores them: AMQP and STOMP consumers,
a queue declared through the bridge or straight on the broker; ``policy show`` says so."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pika
import pytest

from bridge.staging import envelope
from tests.integration.bridgeproc import BridgeProcess, free_port, wait_port
from tests.integration.brokers import BROKERS, require
from tests.integration.clients import connect

RUN = uuid.uuid4().hex[:6]
MANAGEMENT = "http://guest:guest@127.0.0.1:15672"
DELAY_MS = 400


@pytest.fixture(scope="module")
def bridge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BridgeProcess]:
    broker = BROKERS["rabbitmq"]
    require(broker)
    tmp = tmp_path_factory.mktemp("retryargs")
    port = free_port()
    proc = BridgeProcess("rabbitmq", f"{broker.stomp_host}:{broker.stomp_port}",
                         tmp / "bridge.log",
                         extra=["--amqp-listen", f"127.0.0.1:{port}",
                                "--upstream-management", MANAGEMENT,
                                "--staging-prefix", f"jbt-staging-retryargs-{RUN}"])
    proc.amqp_port = port  # type: ignore[attr-defined]
    proc.start()
    assert wait_port(port, 20, proc.proc), proc.log()
    yield proc
    assert proc.stop() == 0, proc.log()


def _pika(port: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", port, heartbeat=0, credentials=pika.PlainCredentials("guest", "guest")))


def _arguments(queue: str) -> dict[str, Any]:
    # RabbitMQ 3.x takes x-delivery-limit on quorum queues only, and keeps the x-delayed-retry-*
    # arguments it does not know.
    return {"x-queue-type": "quorum", "x-delayed-retry-type": "all",
            "x-delayed-retry-min": DELAY_MS, "x-delivery-limit": 2,
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": f"{queue}.dlq"}


def _declare(channel: Any, queue: str) -> None:
    channel.queue_declare(queue, durable=True, arguments=_arguments(queue))
    channel.queue_declare(f"{queue}.dlq", durable=True)


def _count(props: Any) -> int:
    return int((props.headers or {}).get("JMSXDeliveryCount", 1))


def _cleanup(queue: str) -> None:
    conn = _pika(5672)
    channel = conn.channel()
    channel.queue_delete(queue)
    channel.queue_delete(f"{queue}.dlq")
    conn.close()


def test_an_amqp_queue_declared_through_the_bridge_takes_its_arguments_schedule(
    bridge: BridgeProcess,
) -> None:
    queue = f"jbt-retryargs-{RUN}-amqp-{uuid.uuid4().hex[:6]}"
    conn = _pika(bridge.amqp_port)  # type: ignore[attr-defined]
    channel = conn.channel()
    _declare(channel, queue)
    channel.confirm_delivery()
    channel.basic_publish("", queue, b"poison", pika.BasicProperties(message_id="M-args"))
    got: list[tuple[Any, Any, bytes, float]] = []
    channel.basic_qos(prefetch_count=10)
    channel.basic_consume(queue, lambda _c, m, p, b: got.append((m, p, b, time.monotonic())))
    try:
        failed_at = 0.0
        for failure in range(1, 4):  # two redeliveries, then the third failure dead-letters
            deadline = time.monotonic() + 10
            while not got and time.monotonic() < deadline:
                conn.process_data_events(time_limit=0.05)
            assert got, f"delivery {failure} never came; log:\n{bridge.log()[-3000:]}"
            method, props, body, at = got.pop(0)
            assert body == b"poison" and _count(props) == failure
            if failure > 1:  # min * delivery count: 400 ms, then 800 ms
                assert (at - failed_at) * 1000 >= DELAY_MS * (failure - 1) - 2
            failed_at = time.monotonic()
            if failure == 2:
                channel.basic_reject(method.delivery_tag, requeue=True)
            else:
                channel.basic_nack(method.delivery_tag, requeue=True)
        conn.process_data_events(time_limit=1.5)
        assert got == []  # nothing more on the queue
        dead = channel.basic_get(f"{queue}.dlq", auto_ack=True)
        assert dead[0] is not None, f"nothing dead-lettered; log:\n{bridge.log()[-3000:]}"
        assert dead[2] == b"poison" and dead[1].message_id == "M-args"
        headers = dead[1].headers
        assert headers[envelope.REASON] == "MQRC_BACKOUT_THRESHOLD_REACHED"
        assert headers[envelope.DELIVERIES_TRIED] == "3"
        assert channel.basic_get(f"{queue}.dlq", auto_ack=True)[0] is None  # exactly once
        assert channel.queue_declare(queue, passive=True).method.message_count == 0
    finally:
        conn.close()
        _cleanup(queue)


def test_a_stomp_consumer_of_a_queue_declared_on_the_broker_gets_the_same(
    bridge: BridgeProcess,
) -> None:
    queue = f"jbt-retryargs-{RUN}-stomp-{uuid.uuid4().hex[:6]}"
    direct = _pika(5672)  # not through the bridge: its arguments are read from the broker
    _declare(direct.channel(), queue)
    direct.close()
    conn, inbox = connect(bridge.stomp_port, "guest", "guest")
    try:
        conn.send(f"/amq/queue/{queue}", "poison")
        conn.subscribe(f"/amq/queue/{queue}", id="c", ack="client-individual")
        failed_at = 0.0
        for failure in range(1, 4):
            got = inbox.take(1)
            assert got, f"delivery {failure} never came; log:\n{bridge.log()[-3000:]}"
            message = got[0]
            assert int(message.headers.get("JMSXDeliveryCount", "1")) == failure
            if failure > 1:
                assert (time.monotonic() - failed_at) * 1000 >= DELAY_MS * (failure - 1) - 50
            failed_at = time.monotonic()
            conn.nack(message.headers["ack"])
        assert inbox.quiet(1.5) == []
    finally:
        conn.disconnect()
    check = _pika(5672)
    channel = check.channel()
    dead = channel.basic_get(f"{queue}.dlq", auto_ack=True)
    assert dead[0] is not None and dead[2] == b"poison"
    assert channel.basic_get(f"{queue}.dlq", auto_ack=True)[0] is None
    check.close()
    _cleanup(queue)


def test_policy_show_says_the_policy_comes_from_the_queues_arguments() -> None:
    require(BROKERS["rabbitmq"])
    queue = f"jbt-retryargs-{RUN}-show-{uuid.uuid4().hex[:6]}"
    direct = _pika(5672)
    _declare(direct.channel(), queue)
    direct.close()
    try:
        base = [sys.executable, "-m", "bridge.app.cli", "policy", "show", f"/queue/{queue}",
                "--broker", "rabbitmq", "--upstream-management", MANAGEMENT]
        shown = subprocess.run(base, capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, shown.stderr
        assert "from the queue's arguments" in shown.stdout, shown.stdout
        assert "x-delayed-retry-min=400" in shown.stdout
        assert "failure 1: redeliver after 400 ms" in shown.stdout
        assert f"failure 3 and later: move to /amq/queue/{queue}.dlq" in shown.stdout
        report = json.loads(subprocess.run([*base, "--json"], capture_output=True, text=True,
                                           timeout=60).stdout)
        assert report["source"] == "queue arguments" and report["pattern"] is None
        # a queue without them: the configuration's word, as before
        plain = subprocess.run([*base[:5], f"/queue/jbt-retryargs-{RUN}-none", *base[6:]],
                               capture_output=True, text=True, timeout=60)
        assert "no pattern matches: JMSJCA's default" in plain.stdout, plain.stdout + plain.stderr
    finally:
        _cleanup(queue)

"""A redelivery pattern means the queue, however a consumer names it: on RabbitMQ a policy keyed
``/queue/NAME.*`` governs an AMQP consumer of the queue (which the bridge sees as
``/amq/queue/...``) and a STOMP ``/amq/queue/...`` subscriber, and one keyed ``/amq/queue/...``
a STOMP subscriber whose messages say ``/queue/...``. Each consumer fails the message twice and
finds it dead-lettered per its policy, where JMSJCA's default would have redelivered it again.
A topic subscriber's failures stay the broker's, on both brokers, as ``policy show`` says."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pika
import pika.exceptions
import pytest
import yaml

from bridge.app.policy_report import policy_report
from bridge.staging import envelope
from policies.redelivery import compile_table
from tests.integration.bridgeproc import BridgeProcess, free_port, wait_port
from tests.integration.brokers import BROKERS, Broker, require
from tests.integration.clients import connect

RUN = uuid.uuid4().hex[:6]
BY_QUEUE = f"jbt-patterns-{RUN}"  # keyed as the README writes patterns: /queue/NAME.*
BY_AMQ = f"jbt-patterns-amq-{RUN}"  # keyed in RabbitMQ's other queue form: /amq/queue/NAME.*
POLICY = "1:move(queue:$.dlq)"  # failure 1 redelivered at once, failure 2 dead-lettered
POLICIES = {f"/queue/{BY_QUEUE}.*": POLICY, f"/amq/queue/{BY_AMQ}.*": POLICY}


@pytest.fixture(scope="module")
def bridge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BridgeProcess]:
    broker = BROKERS["rabbitmq"]
    require(broker)
    tmp = tmp_path_factory.mktemp("destination-forms")
    config = tmp / "bridge.yaml"
    config.write_text(yaml.safe_dump({"redelivery": POLICIES}))
    port = free_port()
    proc = BridgeProcess("rabbitmq", f"{broker.stomp_host}:{broker.stomp_port}",
                         tmp / "bridge.log",
                         extra=["--amqp-listen", f"127.0.0.1:{port}", "--config", str(config),
                                "--staging-prefix", f"jbt-staging-patterns-{RUN}"])
    proc.amqp_port = port  # type: ignore[attr-defined]
    proc.start()
    assert wait_port(port, 20, proc.proc), proc.log()
    yield proc
    assert proc.stop() == 0, proc.log()


def _broker_channel() -> tuple[pika.BlockingConnection, Any]:
    url = BROKERS["rabbitmq"].amqp_url
    assert url is not None
    conn = pika.BlockingConnection(pika.URLParameters(url))
    return conn, conn.channel()


def _queue(stem: str, arguments: dict[str, Any] | None = None) -> str:
    """A durable queue of its own, bound to amq.direct by its name, and its dead-letter queue."""
    queue = f"{stem}.{uuid.uuid4().hex[:8]}"
    conn, channel = _broker_channel()
    channel.queue_declare(queue, durable=True, arguments=arguments)
    channel.queue_bind(queue, "amq.direct", routing_key=queue)
    conn.close()
    return queue


def _dead_letter(queue: str) -> tuple[Any, bytes] | None:
    """The message on ``queue``'s dead-letter queue (both queues deleted after)."""
    conn, channel = _broker_channel()
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                method, props, body = channel.basic_get(f"{queue}.dlq", auto_ack=True)
            except pika.exceptions.ChannelClosedByBroker:  # not declared (yet)
                channel = conn.channel()
                method = None
            if method is not None:
                return props, body
            time.sleep(0.1)
        return None
    finally:
        channel = conn.channel()
        channel.queue_delete(f"{queue}.dlq")
        channel.queue_delete(queue)
        conn.close()


def _publish(queue: str, body: bytes, exchange: str = "") -> None:
    conn, channel = _broker_channel()
    channel.confirm_delivery()
    channel.basic_publish(exchange, queue, body, pika.BasicProperties(delivery_mode=2))
    conn.close()


def test_an_amqp_consumer_of_the_queue_meets_the_queue_pattern(bridge: BridgeProcess) -> None:
    queue = _queue(BY_QUEUE)
    _publish(queue, b"amqp poison")
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", bridge.amqp_port, heartbeat=0,  # type: ignore[attr-defined]
        credentials=pika.PlainCredentials("guest", "guest")))
    channel = conn.channel()
    got: list[Any] = []
    channel.basic_consume(queue, lambda _c, m, p, b: got.append((m, p, b)))
    for failure in (1, 2):
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.05)
        assert got, f"delivery {failure} never came; log:\n{bridge.log()[-3000:]}"
        method, props, body = got.pop(0)
        count = int((props.headers or {}).get("JMSXDeliveryCount", 1))
        assert body == b"amqp poison" and count == failure
        if failure == 1:
            channel.basic_reject(method.delivery_tag, requeue=True)
        else:
            channel.basic_nack(method.delivery_tag, requeue=True)
    conn.process_data_events(time_limit=0.5)
    assert got == [], "redelivered a third time: JMSJCA's default applied, not the pattern's"
    conn.close()
    dead = _dead_letter(queue)
    assert dead is not None, f"nothing on {queue}.dlq"
    props, body = dead
    assert body == b"amqp poison"
    assert props.headers[envelope.REASON] == "MQRC_BACKOUT_THRESHOLD_REACHED"
    assert props.headers[envelope.DELIVERIES_TRIED] == "2"
    assert props.headers[envelope.POLICY] == f"jmsjca: {POLICY}"


@pytest.mark.parametrize(("stem", "exchange", "arguments"), [
    # Published through an exchange: the MESSAGE says /exchange/amq.direct/..., the subscriber
    # consumes the queue.
    (BY_QUEUE, "amq.direct", None),
    # Published to the queue: the MESSAGE says /queue/..., the policy is keyed /amq/queue/...
    (BY_AMQ, "", None),
    # The same to a queue declared with arguments: a copy sent to /queue/... would declare it
    # again without them, and RabbitMQ would close the consumer's connection.
    (BY_AMQ, "", {"x-max-length": 1000}),
], ids=["through-an-exchange", "to-the-queue", "to-a-queue-with-arguments"])
def test_a_stomp_amq_queue_subscriber_meets_the_queue_s_pattern(
    bridge: BridgeProcess, stem: str, exchange: str, arguments: dict[str, Any] | None,
) -> None:
    broker = BROKERS["rabbitmq"]
    queue = _queue(stem, arguments)
    _publish(queue, b"stomp poison", exchange)
    conn, inbox = connect(bridge.stomp_port, broker.user, broker.password)
    conn.subscribe(f"/amq/queue/{queue}", id="s", ack="client-individual")
    for failure in (1, 2):
        got = inbox.take(1, timeout=10)
        assert got, f"delivery {failure} never came; log:\n{bridge.log()[-3000:]}"
        assert got[0].body == "stomp poison"
        assert got[0].headers.get("JMSXDeliveryCount", "1") == str(failure)
        conn.nack(got[0].headers["ack"])
    assert inbox.quiet(0.5) == [], \
        "redelivered a third time: JMSJCA's default applied, not the pattern's"
    conn.disconnect()
    dead = _dead_letter(queue)
    assert dead is not None, f"nothing on {queue}.dlq"
    props, body = dead
    assert body == b"stomp poison"
    assert props.headers[envelope.REASON] == "MQRC_BACKOUT_THRESHOLD_REACHED"
    assert props.headers[envelope.DELIVERIES_TRIED] == "2"
    assert props.headers[envelope.POLICY] == f"jmsjca: {POLICY}"


def test_the_bridge_names_a_pattern_that_can_never_match_at_start(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    broker = BROKERS["rabbitmq"]
    require(broker)
    tmp = tmp_path_factory.mktemp("destination-forms-typo")
    config = tmp / "bridge.yaml"
    config.write_text(yaml.safe_dump({"redelivery": {f"/queues/{BY_QUEUE}.*": POLICY,
                                                     f"/queue/{BY_QUEUE}.*": POLICY}}))
    proc = BridgeProcess("rabbitmq", f"{broker.stomp_host}:{broker.stomp_port}",
                         tmp / "bridge.log",
                         extra=["--config", str(config),
                                "--staging-prefix", f"jbt-staging-patterns-{RUN}"])
    proc.start()
    try:
        lines = [line for line in proc.log().splitlines() if "can never match" in line]
    finally:
        assert proc.stop() == 0, proc.log()
    assert len(lines) == 1, proc.log()
    assert f"'/queues/{BY_QUEUE}.*'" in lines[0] and '"level": "warning"' in lines[0]
    assert "RabbitMQ has no destination of this form" in lines[0]


def test_a_topic_subscriber_s_nack_is_the_broker_s_as_policy_show_says(
    broker: Broker, tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A pattern that matches a topic is not applied there: RabbitMQ requeues the message to
    the subscription past the policy's limit, ActiveMQ does not give it back (BROKER_HANDLES)."""
    tmp = tmp_path_factory.mktemp("destination-forms-topic")
    config = tmp / "bridge.yaml"
    topic = f"{BY_QUEUE}-topic.{uuid.uuid4().hex[:8]}"
    config.write_text(yaml.safe_dump({"redelivery": {f"{BY_QUEUE}-topic.*": POLICY}}))
    proc = BridgeProcess(broker.name, f"{broker.stomp_host}:{broker.stomp_port}",
                         tmp / "bridge.log",
                         extra=["--config", str(config),
                                "--staging-prefix", f"jbt-staging-patterns-{RUN}"])
    proc.start()
    try:
        report = policy_report(compile_table({f"{BY_QUEUE}-topic.*": POLICY}).on(broker.name),
                               f"/topic/{topic}")
        assert report["applied"] is False and report["failures"] == []
        conn, inbox = connect(proc.stomp_port, broker.user, broker.password)
        conn.subscribe(f"/topic/{topic}", id="t", ack="client-individual")
        time.sleep(0.3)  # the subscription is in place before the send
        conn.send(f"/topic/{topic}", "topic poison")
        deliveries = 0
        for _ in range(4):
            got = inbox.take(1, timeout=3)
            if not got:
                break
            deliveries += 1
            conn.nack(got[0].headers["ack"])
        conn.disconnect()
    finally:
        assert proc.stop() == 0, proc.log()
    if broker.name == "rabbitmq":
        assert deliveries == 4, "RabbitMQ requeues a topic subscriber's NACK every time"
    else:
        assert deliveries == 1, "ActiveMQ does not redeliver a topic subscriber's NACK"

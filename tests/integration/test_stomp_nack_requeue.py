"""A STOMP NACK with RabbitMQ's ``requeue: false`` header, against RabbitMQ directly and through
the bridge: the broker drops the message or dead-letters it by the queue's own settings, once,
and the bridge lets it (as it lets an AMQP Nack with requeue=false go up as sent). A value
RabbitMQ does not read as false (``FALSE``) is a NACK that requeues there, so through the bridge
it is a failed delivery like any other. On ActiveMQ the header means nothing to the broker: the
destination's redelivery policy applies to such a NACK as to any other."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pika
import pytest

from tests.integration.bridgeproc import BridgeProcess
from tests.integration.brokers import Broker
from tests.integration.clients import ack_id, connect

RUN = uuid.uuid4().hex[:6]


@pytest.fixture(scope="module")
def nack_bridge(broker: Broker,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[BridgeProcess]:
    tmp = tmp_path_factory.mktemp("nack-requeue")
    proc = BridgeProcess(broker.name, f"{broker.stomp_host}:{broker.stomp_port}",
                         tmp / "bridge.log",
                         extra=["--staging-prefix", f"jbt-staging-props-nack-{RUN}"])
    proc.start()
    yield proc
    assert proc.stop() == 0, proc.log()


def _pika(broker: Broker) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(broker.amqp_url or ""))


class DeadLettered:
    """A queue whose rejected messages RabbitMQ dead-letters to ``<queue>.dlx`` (or drops, when
    it has no dead-letter exchange), with ``count`` messages on it."""

    def __init__(self, broker: Broker, count: int, dlx: bool = True) -> None:
        self.broker = broker
        self.name = f"jbt-props-{RUN}-nack.{uuid.uuid4().hex[:8]}"
        self.dlx = f"{self.name}.dlx"
        conn = _pika(broker)
        channel = conn.channel()
        channel.queue_declare(self.dlx, durable=True)
        arguments = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": self.dlx}
        channel.queue_declare(self.name, durable=True, arguments=arguments if dlx else None)
        channel.confirm_delivery()
        for i in range(count):
            channel.basic_publish("", self.name, f"m{i}".encode(),
                                  pika.BasicProperties(delivery_mode=2))
        conn.close()

    def counts(self) -> tuple[int, int]:
        """(ready on the queue, on the dead-letter queue)."""
        conn = _pika(self.broker)
        channel = conn.channel()
        counts = tuple(channel.queue_declare(q, passive=True).method.message_count
                       for q in (self.name, self.dlx))
        conn.close()
        return counts  # type: ignore[return-value]

    def dead(self) -> list[tuple[bytes, Any]]:
        conn = _pika(self.broker)
        channel = conn.channel()
        out = []
        while True:
            method, props, body = channel.basic_get(self.dlx, auto_ack=True)
            if method is None:
                break
            out.append((body, props))
        conn.close()
        return out

    def delete(self) -> None:
        conn = _pika(self.broker)
        channel = conn.channel()
        channel.queue_delete(self.name)
        channel.queue_delete(self.dlx)
        conn.close()


def _nack_once(port: int, broker: Broker, queue: str, version: str, value: str,
               ack: str = "client-individual", take: int = 1) -> list[Any]:
    """Consume ``take`` messages, NACK the last with ``requeue: value``; what came after it
    (within a second), and with the consumer gone."""
    conn, inbox = connect(port, broker.user, broker.password, version=version)
    conn.subscribe(f"/amq/queue/{queue}", id="s", ack=ack)
    got = inbox.take(take, timeout=10)
    assert len(got) == take, "the messages never came"
    conn.nack(ack_id(got[-1], version), **({"subscription": "s"} if version == "1.1" else {}),
              requeue=value, receipt="nacked")
    assert inbox.wait_receipt("nacked")
    after = inbox.quiet(1.0)
    conn.disconnect()
    time.sleep(0.2)
    return after


@pytest.mark.parametrize("value", ["false", "False"])
@pytest.mark.parametrize("version", ["1.1", "1.2"])
@pytest.mark.parametrize("through", ["rabbitmq", "bridge"])
def test_a_nack_without_requeue_is_rabbitmqs_own_dead_lettering(
    nack_bridge: BridgeProcess, broker: Broker, through: str, version: str, value: str,
) -> None:
    if broker.name != "rabbitmq":
        pytest.skip("RabbitMQ's STOMP header")
    queue = DeadLettered(broker, 1)
    try:
        port = broker.stomp_port if through == "rabbitmq" else nack_bridge.stomp_port
        after = _nack_once(port, broker, queue.name, version, value)
        assert after == [], [m.headers for m in after]  # not redelivered
        assert queue.counts() == (0, 1)
        [(body, props)] = queue.dead()
        assert body == b"m0"
        [death] = props.headers["x-death"]  # RabbitMQ's own dead-lettering, exactly once
        assert death["reason"] == "rejected" and death["count"] == 1
        assert "jms-bridge-reason" not in props.headers
    finally:
        queue.delete()


@pytest.mark.parametrize("through", ["rabbitmq", "bridge"])
def test_a_nack_without_requeue_on_a_queue_without_dead_letter_exchange_drops_it(
    nack_bridge: BridgeProcess, broker: Broker, through: str,
) -> None:
    if broker.name != "rabbitmq":
        pytest.skip("RabbitMQ's STOMP header")
    queue = DeadLettered(broker, 1, dlx=False)
    try:
        port = broker.stomp_port if through == "rabbitmq" else nack_bridge.stomp_port
        assert _nack_once(port, broker, queue.name, "1.2", "false") == []
        assert queue.counts() == (0, 0)
    finally:
        queue.delete()


@pytest.mark.parametrize("through", ["rabbitmq", "bridge"])
def test_a_cumulative_nack_without_requeue_dead_letters_all_it_covers(
    nack_bridge: BridgeProcess, broker: Broker, through: str,
) -> None:
    if broker.name != "rabbitmq":
        pytest.skip("RabbitMQ's STOMP header")
    queue = DeadLettered(broker, 2)
    try:
        port = broker.stomp_port if through == "rabbitmq" else nack_bridge.stomp_port
        assert _nack_once(port, broker, queue.name, "1.2", "false", ack="client", take=2) == []
        assert queue.counts() == (0, 2)
        assert sorted(body for body, _ in queue.dead()) == [b"m0", b"m1"]
    finally:
        queue.delete()


def test_a_value_rabbitmq_does_not_read_as_false_is_a_failed_delivery(
    nack_bridge: BridgeProcess, broker: Broker,
) -> None:
    """``FALSE``: RabbitMQ's plugin reads only ``false`` and ``False`` as false, and requeues
    the message. Through the bridge that is a failure its redelivery policy handles (JMSJCA's
    default: at once, with its count), not a requeue that would bypass the policy."""
    if broker.name != "rabbitmq":
        pytest.skip("RabbitMQ's STOMP header")
    # (No dead-letter exchange: the bridge's copy of a failed delivery goes to /queue/<name>,
    # which RabbitMQ's plugin declares without arguments.)
    queue = DeadLettered(broker, 1, dlx=False)
    try:
        direct = _nack_once(broker.stomp_port, broker, queue.name, "1.2", "FALSE")
        assert [m.headers.get("redelivered") for m in direct] == ["true"]
        conn, inbox = connect(nack_bridge.stomp_port, broker.user, broker.password)
        conn.subscribe(f"/amq/queue/{queue.name}", id="s", ack="client-individual")
        [first] = inbox.take(1, timeout=10)
        conn.nack(ack_id(first), requeue="FALSE")
        again = inbox.take(1, timeout=10)
        assert [m.body for m in again] == ["m0"]
        assert again[0].headers["JMSXDeliveryCount"] == "3", again[0].headers
        conn.ack(ack_id(again[0]), receipt="acked")
        assert inbox.wait_receipt("acked")
        conn.disconnect()
        assert queue.counts() == (0, 0)
    finally:
        queue.delete()


@pytest.mark.parametrize("value", ["false", "False", "FALSE"])
def test_on_activemq_the_header_means_nothing_and_the_policy_applies(
    nack_bridge: BridgeProcess, broker: Broker, value: str,
) -> None:
    if broker.name != "activemq":
        pytest.skip("ActiveMQ")
    destination = f"/queue/jbt-props-{RUN}-nack.{uuid.uuid4().hex[:8]}"
    conn, inbox = connect(nack_bridge.stomp_port, broker.user, broker.password)
    conn.send(destination, "m0", headers={"receipt": "sent"})
    assert inbox.wait_receipt("sent")
    conn.subscribe(destination, id="s", ack="client-individual")
    counts = []
    for _ in range(3):
        got = inbox.take(1, timeout=10)
        assert got, f"delivery {len(counts) + 1} never came"
        counts.append(got[0].headers.get("JMSXDeliveryCount", "1"))  # a first delivery: none
        if len(counts) < 3:
            conn.nack(ack_id(got[0]), requeue=value)
        else:
            conn.ack(ack_id(got[0]))
    conn.disconnect()
    assert counts == ["1", "2", "3"]

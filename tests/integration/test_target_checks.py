"""A delayed send is checked against its target at send time, as IBM MQ checks a put: the sending
user must be allowed to write there, and the target must exist. Through the bridge, against each
real broker, with the restricted users scripts/brokers creates (test_restricted_users.py)."""

from __future__ import annotations

import time

import pika
import pytest

from tests.integration.bridgeproc import BridgeProcess
from tests.integration.brokers import Broker
from tests.integration.clients import connect

# Each may write to the staging queues, and, on RabbitMQ, to queues through the default exchange,
# but not to amq.topic; on ActiveMQ, to no other queue.
LIMITED = {"rabbitmq": ("jms-bridge-limited", "limited"), "activemq": ("limited", "limited")}


def forbidden(broker: Broker, queue: str) -> str:
    return f"/topic/{queue}" if broker.name == "rabbitmq" else broker.queue_destination(queue)


def test_a_delayed_send_the_user_may_not_write_is_refused_at_send_time(
    broker: Broker, bridge: BridgeProcess, queue: str
) -> None:
    user, password = LIMITED[broker.name]
    target = forbidden(broker, queue)
    staged_before = bridge.metric("jms_bridge_staged_total")
    conn, sent = connect(bridge.stomp_port, user, password)
    conn.send(target, "secret", headers={"x-delay": "60000", "receipt": "r1"})
    error = sent.wait_error(10)
    assert error is not None, "no ERROR for a delayed send the broker would not allow"
    assert error.headers["message"].startswith("MQRC_NOT_AUTHORIZED"), error.headers
    assert error.headers["reason-code"] == "2035"
    assert error.headers["receipt-id"] == "r1"
    assert target in error.headers["message"]
    assert "r1" not in sent.receipts
    assert bridge.metric("jms_bridge_staged_total") == staged_before
    assert bridge.metric("jms_bridge_sends_refused_total", reason="MQRC_NOT_AUTHORIZED") >= 1
    print(f"{broker.name}: {error.headers['message']}")


def test_an_allowed_target_is_checked_once_and_frames_keep_their_order(
    broker: Broker, bridge: BridgeProcess, queue: str
) -> None:
    """A topic on RabbitMQ (a probe of amq.topic), a queue on ActiveMQ (a probe of the queue):
    the delayed message is staged and released, and the plain send behind it, held while the
    target was checked, is relayed after it: receipts come back in the order of the sends."""
    target = f"/topic/{queue}" if broker.name == "rabbitmq" else broker.queue_destination(queue)
    plain = broker.queue_destination(queue + "-plain")
    reader, inbox = connect(bridge.stomp_port, broker.user, broker.password)
    reader.subscribe(target, id="t", ack="auto")
    reader.subscribe(plain, id="p", ack="auto")
    time.sleep(0.2)  # the topic subscription is in place before the release
    conn, sent = connect(bridge.stomp_port, broker.user, broker.password)
    start = time.monotonic()
    conn.send(target, "later", headers={"x-delay": "1500", "receipt": "r1"})
    conn.send(plain, "now", headers={"receipt": "r2"})
    assert sent.wait_receipt("r2"), sent.wait_error(0.1)
    assert "r1" in sent.receipts, "the held frame went up after the one behind it"
    conn.send(target, "again", headers={"x-delay": "1500", "receipt": "r3"})  # remembered
    assert sent.wait_receipt("r3"), sent.wait_error(0.1)
    got = inbox.take(3, timeout=10)
    elapsed = time.monotonic() - start
    conn.disconnect()
    reader.disconnect()
    bodies = [f.body for f in got]
    assert bodies[0] == "now" and sorted(bodies[1:]) == ["again", "later"], bodies
    assert elapsed >= 1.5


def test_a_delayed_send_to_a_queue_that_does_not_exist_is_refused(
    broker: Broker, bridge: BridgeProcess, queue: str
) -> None:
    """RabbitMQ's /amq/queue/ names a queue that must exist; ActiveMQ creates queues on use,
    but not another connection's temporary queue once that connection is gone."""
    missing = (f"/amq/queue/{queue}" if broker.name == "rabbitmq"
               else f"/remote-temp-queue/ID:{queue}-gone-1:1:1")
    conn, sent = connect(bridge.stomp_port, broker.user, broker.password)
    conn.send(missing, "lost", headers={"x-delay": "60000", "receipt": "r1"})
    error = sent.wait_error(10)
    assert error is not None
    assert error.headers["message"].startswith("MQRC_UNKNOWN_OBJECT_NAME"), error.headers
    assert error.headers["reason-code"] == "2085"
    assert error.headers["receipt-id"] == "r1"


@pytest.mark.parametrize("broker", ["rabbitmq"], indirect=True)
def test_a_delayed_send_to_a_full_queue_or_one_too_small_for_it_is_refused(
    broker: Broker, bridge: BridgeProcess, queue: str
) -> None:
    """Queues whose length limits refuse publishes (overflow reject-publish), seen through the
    management API (the shared RabbitMQ bridge has --upstream-management)."""
    full, small = f"{queue}-full", f"{queue}-small"
    amqp = pika.BlockingConnection(pika.URLParameters(broker.amqp_url or ""))
    ch = amqp.channel()
    ch.queue_declare(full, durable=True,
                     arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    ch.basic_publish("", full, b"the one it holds")
    ch.queue_declare(small, durable=True,
                     arguments={"x-max-length-bytes": 100, "x-overflow": "reject-publish"})
    amqp.close()

    def refusal(destination: str, body: str) -> dict[str, str]:
        conn, sent = connect(bridge.stomp_port, broker.user, broker.password)
        conn.send(destination, body, headers={"x-delay": "60000", "receipt": "r1"})
        error = sent.wait_error(10)
        assert error is not None, f"no ERROR for a delayed send to {destination}"
        assert error.headers["receipt-id"] == "r1"
        return dict(error.headers)

    is_full = refusal(f"/amq/queue/{full}", "one more")
    assert is_full["message"].startswith("MQRC_Q_FULL"), is_full
    assert is_full["reason-code"] == "2053"
    too_big = refusal(f"/amq/queue/{small}", "x" * 200)
    assert too_big["message"].startswith("MQRC_MSG_TOO_BIG_FOR_Q"), too_big
    assert too_big["reason-code"] == "2030"

    reader, inbox = connect(bridge.stomp_port, broker.user, broker.password)
    reader.subscribe(f"/amq/queue/{small}", id="s", ack="auto")
    conn, sent = connect(bridge.stomp_port, broker.user, broker.password)
    conn.send(f"/amq/queue/{small}", "y" * 50, headers={"x-delay": "300", "receipt": "r2"})
    assert sent.wait_receipt("r2"), sent.wait_error(0.1)
    got = inbox.take(1, timeout=10)
    conn.disconnect()
    reader.disconnect()
    assert [f.body for f in got] == ["y" * 50]
    print(f"rabbitmq: {is_full['message']} / {too_big['message']}")

"""The restricted user scripts/brokers gives each broker has exactly the rights tests rely on.

ActiveMQ: `limited` may write to the staging queues (jms-bridge.staging.>) and to nothing else.
RabbitMQ: `jms-bridge-limited` may publish through the default exchange (to a queue) and to no
other exchange. Tests of delayed sends the sender may not make send as these users.
"""

from __future__ import annotations

import queue
import uuid
from collections.abc import Iterator

import pika
import pytest
import stomp
from pika.exceptions import ChannelClosedByBroker, ProbableAuthenticationError
from stomp.utils import Frame

from tests.integration.brokers import BROKERS, Broker, require

pytestmark = pytest.mark.integration

TIMEOUT = 10.0
AMQ_LIMITED = ("limited", "limited")
RABBIT_LIMITED = ("jms-bridge-limited", "limited")


class _Frames(stomp.ConnectionListener):
    """RECEIPT, ERROR and MESSAGE frames as they arrive."""

    def __init__(self) -> None:
        self.frames: queue.Queue[Frame] = queue.Queue()

    def on_receipt(self, frame: Frame) -> None:
        self.frames.put(frame)

    def on_error(self, frame: Frame) -> None:
        self.frames.put(frame)

    def on_message(self, frame: Frame) -> None:
        self.frames.put(frame)


def _stomp(broker: Broker, login: str, passcode: str) -> tuple[stomp.Connection12, _Frames]:
    frames = _Frames()
    connection = stomp.Connection12([(broker.stomp_host, broker.stomp_port)], heartbeats=(0, 0))
    connection.set_listener("frames", frames)
    try:
        connection.connect(login, passcode, wait=True)
    except stomp.exception.ConnectFailedException:
        pytest.fail(f"{broker.name} refused {login}/{passcode}: run scripts/brokers up")
    return connection, frames


@pytest.fixture
def activemq() -> Broker:
    broker = BROKERS["activemq"]
    require(broker)
    return broker


@pytest.fixture
def rabbitmq() -> Broker:
    broker = BROKERS["rabbitmq"]
    require(broker)
    return broker


def test_activemq_limited_writes_only_to_staging_queues(activemq: Broker) -> None:
    name = uuid.uuid4().hex[:12]
    staging, other = f"/queue/jms-bridge.staging.jbt-{name}", f"/queue/jbt-{name}"
    connection, frames = _stomp(activemq, *AMQ_LIMITED)
    try:
        connection.send(staging, "allowed", receipt="staging")
        frame = frames.frames.get(timeout=TIMEOUT)
        assert (frame.cmd, frame.headers.get("receipt-id")) == ("RECEIPT", "staging"), frame

        connection.send(other, "refused", receipt="other")
        frame = frames.frames.get(timeout=TIMEOUT)
        assert frame.cmd == "ERROR", frame
        assert frame.headers.get("receipt-id") == "other"
        assert frame.headers["message"] == (
            f"User limited is not authorized to write to: queue://jbt-{name}"
        )
    finally:
        connection.disconnect()

    # The staged message arrived; take it off again (an idle empty queue is removed by itself).
    admin, frames = _stomp(activemq, activemq.user, activemq.password)
    try:
        admin.subscribe(staging, id="1", ack="auto")
        admin.subscribe(other, id="2", ack="auto")
        frame = frames.frames.get(timeout=TIMEOUT)
        assert (frame.cmd, frame.headers["destination"], frame.body) == (
            "MESSAGE", staging, "allowed"
        ), frame
        try:
            extra: Frame | None = frames.frames.get(timeout=0.5)
        except queue.Empty:
            extra = None
        assert extra is None, f"a refused send was delivered: {extra}"
    finally:
        admin.disconnect()


@pytest.fixture
def rabbit_queue(rabbitmq: Broker) -> Iterator[str]:
    name = f"jbt-{uuid.uuid4().hex[:12]}"
    with pika.BlockingConnection(pika.URLParameters(rabbitmq.amqp_url or "")) as connection:
        connection.channel().queue_declare(name, durable=True)
    yield name
    with pika.BlockingConnection(pika.URLParameters(rabbitmq.amqp_url or "")) as connection:
        connection.channel().queue_delete(name)


def test_rabbitmq_limited_publishes_only_through_the_default_exchange(
    rabbitmq: Broker, rabbit_queue: str
) -> None:
    parameters = pika.URLParameters(rabbitmq.amqp_url or "")
    parameters.credentials = pika.PlainCredentials(*RABBIT_LIMITED)
    try:
        connection = pika.BlockingConnection(parameters)
    except ProbableAuthenticationError:
        pytest.fail(f"rabbitmq refused {'/'.join(RABBIT_LIMITED)}: run scripts/brokers up")
    with connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("", rabbit_queue, b"allowed")
        method, _, body = channel.basic_get(rabbit_queue, auto_ack=True)
        assert method is not None and body == b"allowed"

        with pytest.raises(ChannelClosedByBroker) as refused:
            channel.basic_publish("amq.topic", rabbit_queue, b"refused")
        assert refused.value.reply_code == 403
        assert "ACCESS_REFUSED - access to exchange 'amq.topic'" in refused.value.reply_text

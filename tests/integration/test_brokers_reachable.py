"""Each broker from scripts/brokers takes a message and hands it back: the setup works."""

from __future__ import annotations

import queue
import uuid
from collections.abc import Iterator

import pika
import pytest
import stomp
from stomp.utils import Frame

from tests.integration.brokers import BROKERS, Broker, require

pytestmark = pytest.mark.integration

TIMEOUT = 10.0


class _Inbox(stomp.ConnectionListener):
    """MESSAGE and ERROR frames as they arrive, for a test thread to wait on."""

    def __init__(self) -> None:
        self.frames: queue.Queue[Frame] = queue.Queue()

    def on_message(self, frame: Frame) -> None:
        self.frames.put(frame)

    def on_error(self, frame: Frame) -> None:
        self.frames.put(frame)


@pytest.fixture(params=sorted(BROKERS), ids=str)
def broker(request: pytest.FixtureRequest) -> Broker:
    chosen = BROKERS[request.param]
    require(chosen)
    return chosen


@pytest.fixture
def queue_name(broker: Broker) -> Iterator[str]:
    name = f"jms-bridge.test.reachable.{uuid.uuid4().hex}"
    yield name
    # RabbitMQ keeps a STOMP /queue/ queue after its last consumer leaves; ActiveMQ removes an
    # idle empty queue by itself (gcInactiveDestinations in scripts/activemq/activemq.xml.in).
    if broker.amqp_url:
        with pika.BlockingConnection(pika.URLParameters(broker.amqp_url)) as connection:
            connection.channel().queue_delete(name)


def test_stomp_send_then_receive(broker: Broker, queue_name: str) -> None:
    destination = broker.queue_destination(queue_name)
    body = f"hello {queue_name}"
    inbox = _Inbox()
    connection = stomp.Connection12([(broker.stomp_host, broker.stomp_port)], vhost=broker.vhost)
    connection.set_listener("inbox", inbox)
    connection.connect(broker.user, broker.password, wait=True)
    try:
        connection.subscribe(destination, id="1", ack="client-individual")
        connection.send(destination, body, content_type="text/plain")
        frame = inbox.frames.get(timeout=TIMEOUT)
        assert frame.cmd == "MESSAGE", frame
        assert frame.body == body
        assert frame.headers["destination"] == destination
        connection.ack(frame.headers["ack"], "1")
    finally:
        connection.disconnect()

"""The AMQP 0-9-1 front-end of the bridge with pika against the real RabbitMQ: relayed as is,
delayed publishes staged and released, refusals as RabbitMQ refuses a publish."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pika
import pika.exceptions
import pytest

from bridge.staging import envelope
from tests.integration.bridgeproc import BridgeProcess
from tests.integration.brokers import BROKERS
from tests.integration.clients import connect


def _connect(bridge: BridgeProcess, password: str = "guest") -> pika.BlockingConnection:
    params = pika.ConnectionParameters(
        "127.0.0.1", bridge.amqp_port,  # type: ignore[attr-defined]
        credentials=pika.PlainCredentials("guest", password), heartbeat=0)
    return pika.BlockingConnection(params)


@pytest.fixture
def amqp_queue(amqp_bridge: BridgeProcess) -> Iterator[str]:
    name = f"jbt-amqp-{uuid.uuid4().hex[:10]}"
    conn = _connect(amqp_bridge)
    conn.channel().queue_declare(name, durable=True)
    conn.close()
    yield name
    conn = _connect(amqp_bridge)
    conn.channel().queue_delete(name)
    conn.close()


def _get(channel: Any, queue: str, timeout: float) -> tuple[Any, bytes, float] | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        method, props, body = channel.basic_get(queue, auto_ack=True)
        if method is not None:
            return props, body, time.monotonic()
        time.sleep(0.02)
    return None


def test_plain_publish_and_consume_are_relayed(amqp_bridge: BridgeProcess, amqp_queue: str) -> None:
    conn = _connect(amqp_bridge)
    channel = conn.channel()
    channel.confirm_delivery()
    props = pika.BasicProperties(content_type="text/plain", headers={"n": 7, "s": "x"})
    channel.basic_publish("", amqp_queue, b"plain", props)
    got = _get(channel, amqp_queue, 5)
    assert got is not None and got[1] == b"plain"
    assert got[0].headers == {"n": 7, "s": "x"}  # a first delivery: as RabbitMQ sent it
    assert got[0].content_type == "text/plain"
    conn.close()


def test_a_wrong_password_is_refused_by_rabbitmq(amqp_bridge: BridgeProcess) -> None:
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as refused:
        _connect(amqp_bridge, password="wrong")
    assert "ACCESS_REFUSED" in str(refused.value)


def test_a_delayed_publish_is_staged_confirmed_and_released_when_due(
    amqp_bridge: BridgeProcess, amqp_queue: str,
) -> None:
    conn = _connect(amqp_bridge)
    channel = conn.channel()
    channel.confirm_delivery()  # a confirm means staged
    props = pika.BasicProperties(
        content_type="application/json", correlation_id="corr-1", message_id="M-amqp-1",
        delivery_mode=2, headers={"x-delay": 5000, "app": "kept"})
    sent = time.monotonic()
    channel.basic_publish("", amqp_queue, b'{"delayed": true}', props)
    # The listing reads queues the engine is moving the message between (with no staged
    # catalogue, it is a snapshot of a moving set: it can miss a message in flight between two
    # levels), so it is asked again while the message is surely still staged (a loaded machine
    # answers each look slowly: the delay leaves it four seconds of them).
    listed: list[str] = []
    while time.monotonic() - sent < 4.0 and listed != ["M-amqp-1"]:
        status, body = amqp_bridge.http(f"/staged?target=/amq/queue/{amqp_queue}")
        assert status == 200
        listed = [r["message_id"] for r in json.loads(body)]
    assert listed == ["M-amqp-1"]
    # Not early: there only if the delay has passed (the listing above can take a while on a
    # loaded machine), and then given back for the look below.
    method, _, _ = channel.basic_get(amqp_queue, auto_ack=False)
    if method is not None:
        looked = time.monotonic() - sent
        assert looked >= 5.0, f"on the target {looked:.2f} s after the publish, before its delay"
        channel.basic_nack(method.delivery_tag, requeue=True)
    got = _get(channel, amqp_queue, 10)
    assert got is not None, amqp_bridge.log()[-2000:]
    released, payload, at = got
    assert at - sent >= 5.0
    assert payload == b'{"delayed": true}'
    assert released.content_type == "application/json"
    assert released.correlation_id == "corr-1" and released.message_id == "M-amqp-1"
    assert released.delivery_mode == 2
    assert released.headers["app"] == "kept" and "x-delay" not in released.headers
    assert released.headers[envelope.MESSAGE_ID] == "M-amqp-1"
    conn.close()


def test_a_delayed_amqp_publish_can_be_consumed_over_stomp(
    amqp_bridge: BridgeProcess, amqp_queue: str,
) -> None:
    conn = _connect(amqp_bridge)
    channel = conn.channel()
    channel.confirm_delivery()
    channel.basic_publish("", amqp_queue, b"cross",
                          pika.BasicProperties(headers={"x-delay": "300"}))
    conn.close()
    broker = BROKERS["rabbitmq"]
    stomp_conn, inbox = connect(amqp_bridge.stomp_port, broker.user, broker.password)
    stomp_conn.subscribe(f"/amq/queue/{amqp_queue}", id="s", ack="auto")
    got = inbox.take(1, timeout=10)
    stomp_conn.disconnect()
    assert [m.body for m in got] == ["cross"]


@pytest.mark.parametrize(("headers", "routing", "reason"), [
    ({"x-delay": -5}, None, "MQRC_OPTIONS_ERROR"),
    ({"x-delay": 5000}, None, None),  # with expiration below: MQRC_EXPIRY_ERROR
    ({"x-delay": 10}, "{staging}.L3", "MQRC_NOT_AUTHORIZED"),
])
def test_refusals_close_the_channel_with_406_and_the_reason(
    amqp_bridge: BridgeProcess, amqp_queue: str, headers: dict, routing: str | None,
    reason: str | None,
) -> None:
    conn = _connect(amqp_bridge)
    channel = conn.channel()
    channel.confirm_delivery()
    props = pika.BasicProperties(headers=headers)
    if reason is None:
        props.expiration = "1000"
        reason = "MQRC_EXPIRY_ERROR"
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.basic_publish("", (routing or amqp_queue).format(
            staging=amqp_bridge.staging_prefix), b"no", props)
    assert closed.value.reply_code == 406
    assert closed.value.reply_text.startswith(reason), closed.value.reply_text
    other = conn.channel()  # the connection carries on
    other.queue_declare(amqp_queue, passive=True)
    conn.close()


def test_publishes_in_a_rolled_back_transaction_are_not_staged(
    amqp_bridge: BridgeProcess, amqp_queue: str,
) -> None:
    conn = _connect(amqp_bridge)
    channel = conn.channel()
    channel.tx_select()
    channel.basic_publish("", amqp_queue, b"tx", pika.BasicProperties(headers={"x-delay": 200}))
    channel.tx_rollback()
    assert json.loads(amqp_bridge.http(f"/staged?target=/amq/queue/{amqp_queue}")[1]) == []
    channel.basic_publish("", amqp_queue, b"tx2", pika.BasicProperties(headers={"x-delay": 200}))
    channel.tx_commit()
    got = _get(channel, amqp_queue, 10)
    assert got is not None and got[1] == b"tx2"
    conn.close()


def test_metrics_count_amqp_connections_channels_methods_bytes_and_refusals(
    amqp_bridge: BridgeProcess, amqp_queue: str,
) -> None:
    before = {
        "connections": amqp_bridge.metric("jms_bridge_amqp_connections_total"),
        "channels": amqp_bridge.metric("jms_bridge_amqp_channels_total"),
        "publishes": amqp_bridge.metric("jms_bridge_amqp_methods_relayed_total",
                                        method="Basic.Publish", direction="upstream"),
        "bytes": amqp_bridge.metric("jms_bridge_amqp_bytes_relayed_total",
                                    direction="upstream"),
        "refused": amqp_bridge.metric("jms_bridge_amqp_sends_refused_total",
                                      reason="MQRC_OPTIONS_ERROR"),
    }
    conn = _connect(amqp_bridge)
    channel = conn.channel()
    channel.confirm_delivery()
    for _ in range(3):
        channel.basic_publish("", amqp_queue, b"counted")
    assert amqp_bridge.metric("jms_bridge_amqp_channels_open") >= 1
    with pytest.raises(pika.exceptions.ChannelClosedByBroker):
        channel.basic_publish("", amqp_queue, b"no",
                              pika.BasicProperties(headers={"x-delay": "soon"}))
    conn.close()
    assert amqp_bridge.metric("jms_bridge_amqp_connections_total") == before["connections"] + 1
    assert amqp_bridge.metric("jms_bridge_amqp_channels_total") == before["channels"] + 1
    assert amqp_bridge.metric("jms_bridge_amqp_methods_relayed_total", method="Basic.Publish",
                              direction="upstream") == before["publishes"] + 4  # + refused
    assert amqp_bridge.metric("jms_bridge_amqp_methods_relayed_total", method="Basic.Ack",
                              direction="downstream") >= 3
    assert amqp_bridge.metric("jms_bridge_amqp_bytes_relayed_total",
                              direction="upstream") > before["bytes"] + 3 * len(b"counted")
    assert amqp_bridge.metric("jms_bridge_amqp_sends_refused_total",
                              reason="MQRC_OPTIONS_ERROR") == before["refused"] + 1


def test_readyz_checks_the_amqp_upstream_too(amqp_bridge: BridgeProcess) -> None:
    status, body = amqp_bridge.http("/readyz")
    assert status == 200, body
    assert ":5672" in json.loads(body)["upstream_amqp"], body


def test_publishes_sent_after_a_refused_one_on_its_channel_are_dropped_not_fatal(
    amqp_bridge: BridgeProcess, amqp_queue: str,
) -> None:
    """A client that pipelines publishes: one refused, then more on the same channel, and one on
    another channel, in one write. The refused one's channel is closed and what followed on it
    is dropped by the bridge (the spec's rule for a closing channel): not delivered, not
    staged, not counted as staged; the other channel's publish goes through, and the
    connection carries on."""
    from pamqp import commands
    from pamqp import frame as pframe

    from bridge.frontends.amqp.builders import publish_frames
    from tests.integration.amqp_raw import handshake, read_frame

    def publish(channel: int, body: bytes, headers: dict | None = None) -> bytes:
        return publish_frames(channel, commands.Basic.Publish(exchange="", routing_key=amqp_queue),
                              commands.Basic.Properties(headers=headers), body, 131072)

    staged_before = amqp_bridge.metric("jms_bridge_staged_total")
    sock = handshake(amqp_bridge.amqp_port)  # type: ignore[attr-defined]
    for channel in (1, 2):
        sock.sendall(pframe.marshal(commands.Channel.Open(), channel))
        assert isinstance(read_frame(sock)[1], commands.Channel.OpenOk)
    sock.sendall(publish(1, b"refused", {"x-delay": -5}) + publish(1, b"after-1")
                 + publish(1, b"delayed-after", {"x-delay": 100}) + publish(2, b"on-2"))
    channel, close = read_frame(sock)
    assert channel == 1 and isinstance(close, commands.Channel.Close), close
    assert close.reply_code == 406 and close.reply_text.startswith("MQRC_OPTIONS_ERROR")
    sock.sendall(pframe.marshal(commands.Channel.CloseOk(), 1))
    sock.sendall(pframe.marshal(commands.Channel.Open(), 3)
                 + pframe.marshal(commands.Queue.Declare(queue=amqp_queue, passive=True), 3))
    got = [read_frame(sock) for _ in range(2)]
    assert [type(v) for _, v in got] == [commands.Channel.OpenOk, commands.Queue.DeclareOk], got
    sock.close()
    conn = _connect(amqp_bridge)
    bodies = []
    deadline = time.monotonic() + 1  # the delayed one would be due after 100 ms
    while time.monotonic() < deadline:
        found = _get(conn.channel(), amqp_queue, 0.2)
        if found is not None:
            bodies.append(found[1])
    assert bodies == [b"on-2"]
    assert amqp_bridge.metric("jms_bridge_staged_total") == staged_before
    conn.close()


def test_artemis_scheduled_delivery_time_in_a_header_table(
    amqp_bridge: BridgeProcess, amqp_queue: str,
) -> None:
    """``_AMQ_SCHED_DELIVERY`` as an AMQP long (epoch ms) delays as ``JMSDeliveryTime`` does."""
    conn = _connect(amqp_bridge)
    channel = conn.channel()
    channel.confirm_delivery()
    due = time.time() + 1.5
    channel.basic_publish("", amqp_queue, b"artemis", pika.BasicProperties(
        headers={"_AMQ_SCHED_DELIVERY": int(due * 1000)}))
    got = _get(channel, amqp_queue, 10)
    assert got is not None, amqp_bridge.log()[-2000:]
    assert time.time() >= due - 0.001, "delivered before its _AMQ_SCHED_DELIVERY"
    conn.close()


def test_a_staged_publish_is_found_by_its_queue_in_every_form(
    amqp_bridge: BridgeProcess, amqp_queue: str,
) -> None:
    """An AMQP publish's target is written /amq/queue/X; an operator who names the queue as
    /queue/X (as STOMP clients and the dead-letter tools print it) or X finds it all the same."""
    conn = _connect(amqp_bridge)
    channel = conn.channel()
    channel.confirm_delivery()
    channel.basic_publish("", amqp_queue, b"later", pika.BasicProperties(
        message_id="M-forms-1", headers={"x-delay": 600_000}))
    conn.close()
    for form in (f"/queue/{amqp_queue}", amqp_queue, f"/amq/queue/{amqp_queue}"):
        status, body = amqp_bridge.http(f"/staged?target={form}")
        assert status == 200, body
        assert [r["message_id"] for r in json.loads(body)] == ["M-forms-1"], form
    status, _ = amqp_bridge.http("/staged/M-forms-1/cancel", "POST")
    assert status == 200

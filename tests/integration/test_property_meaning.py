"""Message properties read by their meaning, not their wire type, end to end: a boolean, an
integer or a string in an AMQP header table (pika) or a STOMP header give the same answer for
``JMS_TIBCO_PRESERVE_UNDELIVERED`` (at the redelivery limit, and when a message expires while
staged), ``JMS_IBM_RETAIN`` and the delay headers."""

from __future__ import annotations

import decimal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pika
import pika.exceptions
import pytest
import yaml
from pamqp import commands
from pamqp import frame as pframe

from bridge.frontends.amqp.builders import publish_frames
from bridge.staging import envelope
from policies.redelivery import Redeliver, compile_table, decide
from tests.integration.amqp_raw import handshake, read_frame
from tests.integration.bridgeproc import BridgeProcess, free_port, wait_port
from tests.integration.brokers import BROKERS, Broker, require
from tests.integration.clients import connect

RUN = uuid.uuid4().hex[:6]
UNDELIVERED = f"jbt-props-{RUN}-undelivered"
TIBCO = {"dialect": "tibco", "maxRedelivery": 2}  # then deleted, unless asked to be kept
POLICIES: dict[str, object] = {
    f"/queue/jbt-props-{RUN}-tibco.*": TIBCO,  # its AMQP consumers' too
}
TABLE = compile_table(POLICIES)
PRESERVE = "JMS_TIBCO_PRESERVE_UNDELIVERED"


def _bridge(broker: Broker, tmp: Any, amqp: bool) -> BridgeProcess:
    config = tmp / "bridge.yaml"
    config.write_text(yaml.safe_dump({"redelivery": POLICIES}))
    extra = ["--config", str(config), "--undelivered-queue", UNDELIVERED,
             "--staging-prefix", f"jbt-staging-props-{RUN}-{broker.name}"]
    port = free_port()
    if amqp:
        extra += ["--amqp-listen", f"127.0.0.1:{port}"]
    proc = BridgeProcess(broker.name, f"{broker.stomp_host}:{broker.stomp_port}",
                         tmp / "bridge.log", extra=extra)
    proc.amqp_port = port  # type: ignore[attr-defined]
    proc.start()
    if amqp:
        assert wait_port(port, 20, proc.proc), proc.log()
    return proc


@pytest.fixture(scope="module")
def amqp_bridge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BridgeProcess]:
    broker = BROKERS["rabbitmq"]
    require(broker)
    proc = _bridge(broker, tmp_path_factory.mktemp("props-amqp"), amqp=True)
    yield proc
    assert proc.stop() == 0, proc.log()


@pytest.fixture(scope="module")
def stomp_bridge(broker: Broker,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[BridgeProcess]:
    proc = _bridge(broker, tmp_path_factory.mktemp("props-stomp"), amqp=False)
    yield proc
    assert proc.stop() == 0, proc.log()


def _connect(bridge: BridgeProcess) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", bridge.amqp_port, heartbeat=0,  # type: ignore[attr-defined]
        credentials=pika.PlainCredentials("guest", "guest")))


def _queue(kind: str) -> str:
    return f"jbt-props-{RUN}-{kind}.{uuid.uuid4().hex[:8]}"


def _get(channel: Any, queue: str, mark: str, timeout: float) -> tuple[Any, bytes] | None:
    """The message marked ``mark`` from ``queue`` (others are put back), within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        method, props, body = channel.basic_get(queue)
        if method is None:
            time.sleep(0.05)
            continue
        if (props.headers or {}).get("mark") == mark:
            channel.basic_ack(method.delivery_tag)
            return props, body
        channel.basic_nack(method.delivery_tag, requeue=True)
    return None


def _publish(bridge: BridgeProcess, queue: str, headers: dict[str, Any]) -> str | None:
    """Publish with confirms on a raw connection, whose table writer writes floats as doubles
    (pika cannot send a float): None when confirmed, else the channel's close reply."""
    sock = handshake(bridge.amqp_port)  # type: ignore[attr-defined]
    try:
        sock.sendall(pframe.marshal(commands.Channel.Open(), 1)
                     + pframe.marshal(commands.Confirm.Select(), 1))
        publish = commands.Basic.Publish(exchange="", routing_key=queue)
        sock.sendall(publish_frames(1, publish, commands.Basic.Properties(headers=headers),
                                    b"raw", 131072))
        while True:
            _, frame = read_frame(sock)
            if isinstance(frame, commands.Basic.Ack):
                return None
            if isinstance(frame, commands.Channel.Close):
                return f"{frame.reply_code} {frame.reply_text}"
    finally:
        sock.close()


# -- AMQP: pika's typed header table -------------------------------------------------------

# What pika sends for the property: a boolean (as TIBCO defines it and typed clients send it),
# an integer 1, strings; and values that do not ask for it.
KEPT = [True, 1, "true", "TRUE", "1"]
NOT_KEPT = [False, 0, "false"]


@pytest.mark.parametrize("value", KEPT + NOT_KEPT, ids=repr)
def test_amqp_preserve_undelivered_at_the_redelivery_limit(
    amqp_bridge: BridgeProcess, value: object,
) -> None:
    queue = _queue("tibco")
    destination = f"/amq/queue/{queue}"
    _, policy = TABLE.lookup(destination)
    mark = uuid.uuid4().hex
    conn = _connect(amqp_bridge)
    channel = conn.channel()
    channel.queue_declare(queue, durable=True)
    channel.queue_declare(UNDELIVERED, durable=True)
    channel.confirm_delivery()
    channel.basic_publish("", queue, b"poison", pika.BasicProperties(
        headers={"mark": mark, PRESERVE: value}))
    failures = 0
    while True:
        got = None
        for _ in range(200):
            got = channel.basic_get(queue)
            if got[0] is not None:
                break
            time.sleep(0.05)
        assert got is not None and got[0] is not None, (
            f"delivery {failures + 1} never came; log:\n{amqp_bridge.log()[-3000:]}")
        method, props, _ = got
        failures += 1
        channel.basic_nack(method.delivery_tag, requeue=True)
        if not isinstance(decide(policy, failures, destination, {}, 0.5), Redeliver):
            break
    kept = _get(channel, UNDELIVERED, mark, timeout=5 if value in KEPT else 1)
    log = amqp_bridge.log()
    channel.queue_delete(queue)
    conn.close()
    if value not in KEPT:
        assert kept is None, f"{value!r} asked for nothing, yet the message was kept"
        return
    assert kept is not None, f"{PRESERVE}={value!r} not kept at the limit; log:\n{log[-3000:]}"
    props, body = kept
    assert body == b"poison"
    assert props.headers[PRESERVE] == value and type(props.headers[PRESERVE]) is type(value)
    assert props.headers[envelope.REASON] == "MQRC_BACKOUT_THRESHOLD_REACHED"


@pytest.mark.parametrize("value", KEPT + NOT_KEPT, ids=repr)
def test_amqp_preserve_undelivered_when_it_expires_while_staged(
    amqp_bridge: BridgeProcess, value: object,
) -> None:
    queue = _queue("expiring")
    mark = uuid.uuid4().hex
    conn = _connect(amqp_bridge)
    channel = conn.channel()
    channel.queue_declare(queue, durable=True)
    channel.queue_declare(UNDELIVERED, durable=True)
    # Its time to live (600 ms) ends before it is staged, on the commit 2 s after the publish
    # (a TTL not longer than the delay is refused at the send): it expires staged. (With 0.8 s,
    # a loaded machine read the publish late enough that it was still live at the commit.)
    sending = conn.channel()
    sending.tx_select()
    sending.basic_publish("", queue, b"expiring", pika.BasicProperties(
        headers={"mark": mark, PRESERVE: value, "x-delay": 300}, expiration="600"))
    time.sleep(2.0)
    sending.tx_commit()
    kept = _get(channel, UNDELIVERED, mark, timeout=20 if value in KEPT else 3)
    delivered = channel.basic_get(queue, auto_ack=True)[0]
    log = amqp_bridge.log()
    channel.queue_delete(queue)
    conn.close()
    assert delivered is None, "an expired message was delivered"
    if value not in KEPT:
        assert kept is None, f"{value!r} asked for nothing, yet the message was kept"
        return
    assert kept is not None, f"{PRESERVE}={value!r} expired and dropped; log:\n{log[-3000:]}"
    props, body = kept
    assert body == b"expiring"
    assert props.headers[PRESERVE] == value and type(props.headers[PRESERVE]) is type(value)
    assert props.headers[envelope.REASON] == "MQFB_EXPIRATION"


@pytest.mark.parametrize(("name", "delay"), [
    ("x-delay", 300), ("x-delay", "300"), ("x-delay", 300.0), ("x-delay", decimal.Decimal("300")),
    ("x-delay", decimal.Decimal("300.00")), ("AMQ_SCHEDULED_DELAY", 300.0),
    # absolute epoch ms: pika sends it as a long, or as a double
    ("JMSDeliveryTime", "at"), ("JMSDeliveryTime", "at-float"),
], ids=repr)
def test_amqp_delay_of_any_numeric_type_is_staged(
    amqp_bridge: BridgeProcess, name: str, delay: object,
) -> None:
    queue = _queue("delay")
    conn = _connect(amqp_bridge)
    channel = conn.channel()
    channel.queue_declare(queue, durable=True)
    channel.confirm_delivery()
    sent = time.monotonic()
    earliest_ms = time.time_ns() // 1_000_000 + 300
    if delay in ("at", "at-float"):
        # Far enough ahead that a publish slowed by a busy machine still reaches the bridge
        # before its due time (one due already is forwarded at once, its header left on).
        earliest_ms = time.time_ns() // 1_000_000 + 2_000
        delay = earliest_ms if delay == "at" else float(earliest_ms)
    if isinstance(delay, float):
        assert _publish(amqp_bridge, queue, {name: delay, "mark": "m"}) is None
    else:
        channel.basic_publish("", queue, b"later", pika.BasicProperties(
            headers={name: delay, "mark": "m"}))
    got = _get(channel, queue, "m", timeout=15)
    arrived, arrived_ms = time.monotonic(), time.time_ns() // 1_000_000
    channel.queue_delete(queue)
    conn.close()
    assert got is not None, f"{name}={delay!r}: never delivered"
    assert (arrived - sent) * 1000 >= 300 - 2, f"{name}={delay!r}: not delayed"
    assert arrived_ms >= earliest_ms - 2, f"{name}={delay!r}: delivered before its due time"
    assert name not in got[0].headers


@pytest.mark.parametrize("headers", [
    {"x-delay": 300.5}, {"x-delay": True}, {"x-delay": decimal.Decimal("0.5")},
    {"x-delay": "3e2"}, {"x-delay": -1.0},
    {"x-delay": 300, "JMS_IBM_RETAIN": True}, {"x-delay": 300, "JMS_IBM_RETAIN": 1},
    {"x-delay": 300, "JMS_IBM_RETAIN": "1"}, {"x-delay": 300, "JMS_IBM_RETAIN": 1.0},
], ids=repr)
def test_amqp_malformed_delay_or_retained_publication_is_refused(
    amqp_bridge: BridgeProcess, headers: dict[str, object],
) -> None:
    queue = _queue("refused")
    conn = _connect(amqp_bridge)
    channel = conn.channel()
    channel.queue_declare(queue, durable=True)
    channel.confirm_delivery()
    if any(isinstance(v, float) for v in headers.values()):
        text = _publish(amqp_bridge, queue, headers) or "confirmed"
        assert text.startswith("406 "), text
        text = text[4:]
    else:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            channel.basic_publish("", queue, b"no", pika.BasicProperties(headers=headers))
        assert closed.value.reply_code == 406
        text = closed.value.reply_text
    conn.channel().queue_delete(queue)
    conn.close()
    assert text.startswith("MQRC_OPTIONS_ERROR"), text
    named = "JMS_IBM_RETAIN" if "JMS_IBM_RETAIN" in headers else "x-delay"
    assert named in text, text


# -- STOMP: the same meanings in headers, on both brokers ------------------------------------


@pytest.mark.parametrize("value", ["true", "True", "1"])
def test_stomp_preserve_undelivered_at_the_redelivery_limit(
    stomp_bridge: BridgeProcess, broker: Broker, value: str,
) -> None:
    dest = f"/queue/{_queue('tibco')}"
    _, policy = TABLE.lookup(dest)
    mark = uuid.uuid4().hex
    conn, inbox = connect(stomp_bridge.stomp_port, broker.user, broker.password)
    conn.send(dest, "poison", headers={"mark": mark, PRESERVE: value, "persistent": "true"})
    conn.subscribe(dest, id="c", ack="client-individual")
    failures = 0
    while True:
        got = inbox.take(1, timeout=15)
        assert got, f"delivery {failures + 1} never came; log:\n{stomp_bridge.log()[-3000:]}"
        failures += 1
        conn.nack(got[0].headers["ack"])
        if not isinstance(decide(policy, failures, dest, {}, 0.5), Redeliver):
            break
    conn.subscribe(f"/queue/{UNDELIVERED}", id="u", ack="client-individual")
    kept = []
    deadline = time.monotonic() + 8
    while not kept and time.monotonic() < deadline:
        for m in inbox.take(1, timeout=1):
            if m.headers.get("mark") == mark:  # (others are left to their own tests)
                kept.append(m)
                conn.ack(m.headers["ack"])
    conn.disconnect()
    assert kept, f"{PRESERVE}={value!r} not kept at the limit"
    assert kept[0].headers[envelope.REASON] == "MQRC_BACKOUT_THRESHOLD_REACHED"


@pytest.mark.parametrize(("headers", "named"), [
    ({"x-delay": "300.5"}, "x-delay"), ({"x-delay": "true"}, "x-delay"),
    ({"x-delay": "300", "JMS_IBM_RETAIN": "true"}, "JMS_IBM_RETAIN"),
    ({"x-delay": "300", "JMS_IBM_RETAIN": "1.0"}, "JMS_IBM_RETAIN"),
])
def test_stomp_malformed_delay_or_retained_publication_is_refused(
    stomp_bridge: BridgeProcess, broker: Broker, headers: dict[str, str], named: str,
) -> None:
    conn, inbox = connect(stomp_bridge.stomp_port, broker.user, broker.password)
    conn.send(f"/queue/{_queue('refused')}", "no", headers={**headers, "receipt": "r"})
    error = inbox.wait_error(10)
    assert error is not None and not inbox.receipts
    assert error.headers["message"].startswith("MQRC_OPTIONS_ERROR"), error.headers
    assert error.headers["reason-code"] == "2046"
    assert named in error.headers["message"] + error.body, (error.headers, error.body)


def test_stomp_delay_with_a_zero_fraction_is_staged(
    stomp_bridge: BridgeProcess, broker: Broker,
) -> None:
    dest = f"/queue/{_queue('delay')}"
    conn, inbox = connect(stomp_bridge.stomp_port, broker.user, broker.password)
    conn.subscribe(dest, id="d", ack="auto")
    time.sleep(0.2)
    sent = time.monotonic()
    conn.send(dest, "later", headers={"x-delay": "300.0", "receipt": "r"})
    got = inbox.take(1, timeout=10)
    arrived = time.monotonic()
    error = inbox.errors
    conn.disconnect()
    assert not error, error[0].headers if error else None
    assert [m.body for m in got] == ["later"]
    assert (arrived - sent) * 1000 >= 300 - 2

"""RabbitMQ's delayed-message exchange (``x-delayed-message``) through the bridge, with the
plugin absent: declared as a real exchange of its ``x-delayed-type``, its delayed publishes
staged by the bridge and routed through that exchange when due."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest
import stomp.exception

from tests.integration.bridgeproc import BridgeProcess, free_port, wait_port
from tests.integration.brokers import BROKERS, require
from tests.integration.clients import connect

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
    proc.staging_prefix = prefix
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


def _closed(conn: pika.BlockingConnection, call: Any) -> pika.exceptions.ChannelClosedByBroker:
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        call()
    assert conn.is_open  # a channel error: the connection carries on
    return closed.value


def test_fanout_exchange_to_exchange_and_headers_routing_at_release(
    dx_bridge: BridgeProcess, names: list[str],
) -> None:
    conn = _connect(dx_bridge)
    ch = conn.channel()
    fanout = _delayed_exchange(ch, names, "fanout")
    queues = [_bound_queue(ch, names, fanout, "") for _ in range(3)]
    onward = _name("x")  # a plain exchange behind the delayed one
    names.append(onward)
    ch.exchange_declare(onward, "direct")
    ch.exchange_bind(onward, fanout, "")
    behind = _bound_queue(ch, names, onward, "k2")
    headers = _delayed_exchange(ch, names, "headers")
    matched = _bound_queue(ch, names, headers, "", {"x-match": "all", "kind": "a"})
    unmatched = _bound_queue(ch, names, headers, "", {"x-match": "all", "kind": "b"})
    ch.confirm_delivery()
    ch.basic_publish(fanout, "k2", b"f", pika.BasicProperties(headers={"x-delay": "2000"}))
    ch.basic_publish(headers, "", b"h", pika.BasicProperties(
        headers={"x-delay": 2000, "kind": "a"}))
    time.sleep(0.5)
    assert all(_get(ch, q, 0.01) is None for q in (*queues, behind, matched))
    for queue in (*queues, behind):
        got = _get(ch, queue, 10)
        assert got is not None and got[1] == b"f", queue
        assert got[0].headers["x-delay"] == -2000
    got = _get(ch, matched, 10)
    assert got is not None and got[1] == b"h" and got[0].headers["kind"] == "a"
    assert _get(ch, unmatched, 0.3) is None
    conn.close()


def test_declares_as_on_a_broker_with_the_plugin(
    dx_bridge: BridgeProcess, names: list[str],
) -> None:
    conn = _connect(dx_bridge)
    ch = conn.channel()
    exchange = _delayed_exchange(ch, names, "topic")
    ch.exchange_declare(exchange, DELAYED, durable=True, arguments={"x-delayed-type": "topic"})
    ch.exchange_declare(exchange, DELAYED, passive=True)
    refused = _closed(conn, lambda: ch.exchange_declare(
        exchange, DELAYED, durable=True, arguments={"x-delayed-type": "direct"}))
    assert refused.reply_code == 406 and "PRECONDITION_FAILED" in refused.reply_text
    ch = conn.channel()
    refused = _closed(conn, lambda: ch.exchange_declare(_name("x"), DELAYED))
    assert refused.reply_code == 406
    assert refused.reply_text.startswith("MQRC_OPTIONS_ERROR (2046)")
    assert "'x-delayed-type' must be an existing exchange type" in refused.reply_text
    ch = conn.channel()
    refused = _closed(conn, lambda: ch.exchange_declare(
        _name("x"), DELAYED, arguments={"x-delayed-type": "x-bogus"}))
    assert refused.reply_code == 406
    assert refused.reply_text.startswith("MQRC_OPTIONS_ERROR (2046): x-delayed-type='x-bogus'")
    ch = conn.channel()
    queue = _bound_queue(ch, names, exchange, "a.*")
    ch.queue_unbind(queue, exchange, "a.*")
    ch.exchange_delete(exchange)
    direct = _direct()
    probe = direct.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as gone:  # the marker too
        probe.exchange_declare(f"jms-bridge.delayed-message.{exchange}", passive=True)
    assert gone.value.reply_code == 404
    direct.close()
    conn.close()


def test_negative_zero_and_bad_x_delay(dx_bridge: BridgeProcess, names: list[str]) -> None:
    conn = _connect(dx_bridge)
    ch = conn.channel()
    exchange = _delayed_exchange(ch, names)
    queue = _bound_queue(ch, names, exchange)
    ch.confirm_delivery()
    ch.basic_publish(exchange, "k", b"neg", pika.BasicProperties(headers={"x-delay": -5000}))
    ch.basic_publish(exchange, "k", b"zero", pika.BasicProperties(headers={"x-delay": 0}))
    for body in (b"neg", b"zero"):
        got = _get(ch, queue, 2)
        assert got is not None and got[1] == body
    refused = _closed(conn, lambda: ch.basic_publish(
        exchange, "k", b"bad", pika.BasicProperties(headers={"x-delay": "soon"})))
    assert refused.reply_code == 406
    assert refused.reply_text.startswith("MQRC_OPTIONS_ERROR (2046): x-delay='soon'")
    other = conn.channel()
    assert _get(other, queue, 1.5) is None  # nothing staged, nothing delivered
    conn.close()


def test_tx_stages_on_commit(dx_bridge: BridgeProcess, names: list[str]) -> None:
    conn = _connect(dx_bridge)
    ch = conn.channel()
    exchange = _delayed_exchange(ch, names)
    queue = _bound_queue(ch, names, exchange)
    ch.tx_select()
    ch.basic_publish(exchange, "k", b"rolled", pika.BasicProperties(headers={"x-delay": 500}))
    ch.tx_rollback()
    ch.basic_publish(exchange, "k", b"kept", pika.BasicProperties(headers={"x-delay": 500}))
    ch.tx_commit()
    got = _get(ch, queue, 10)
    assert got is not None and got[1] == b"kept"
    assert _get(ch, queue, 1.0) is None
    conn.close()


def test_a_release_no_queue_takes_is_undeliverable(
    dx_bridge: BridgeProcess, names: list[str],
) -> None:
    conn = _connect(dx_bridge)
    ch = conn.channel()
    exchange = _delayed_exchange(ch, names)
    ch.confirm_delivery()
    ch.basic_publish(exchange, "nobody", b"lost?", pika.BasicProperties(
        headers={"x-delay": 300}, message_id=f"M-dx-{uuid.uuid4().hex[:8]}"))
    undeliverable = f"{dx_bridge.staging_prefix}.undeliverable"
    direct = _direct()  # (the bridge keeps clients off its own queues)
    ch = direct.channel()
    deadline = time.monotonic() + 15
    found = None
    while found is None and time.monotonic() < deadline:
        method, props, body = ch.basic_get(undeliverable, auto_ack=False)
        if method is None:
            time.sleep(0.1)
        elif body == b"lost?":
            ch.basic_ack(method.delivery_tag)
            found = props
        else:
            ch.basic_nack(method.delivery_tag, requeue=True)
    assert found is not None, dx_bridge.log()
    assert found.headers["jms-bridge-reason"] == "MQRC_UNKNOWN_OBJECT_NAME"
    assert f"no queue bound to exchange {exchange!r}" in found.headers["jms-bridge-reason-text"]
    assert found.headers["jms-bridge-original-destination"] == f"/exchange/{exchange}/nobody"
    direct.close()
    conn.close()


CLIENTS = Path(__file__).parents[1] / "clients" / "amqp"
JAVA_CLASSPATH = "/usr/share/java/amqp-client.jar:/usr/share/java/slf4j-api.jar"


def test_the_rabbitmq_jms_clients_delivery_delay_with_the_java_client(
    dx_bridge: BridgeProcess, names: list[str],
) -> None:
    if shutil.which("java") is None or not Path(JAVA_CLASSPATH.split(":")[0]).exists():
        pytest.fail("java or the RabbitMQ Java client is missing: run scripts/install-test-deps",
                    pytrace=False)
    exchange, queue = _name("x"), _name("q")
    names += [exchange, queue]
    run = subprocess.run(["java", "-cp", JAVA_CLASSPATH, str(CLIENTS / "DelayedExchange.java"),
                          str(dx_bridge.amqp_port), exchange, queue, "1000"],  # type: ignore[attr-defined]
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert found["early"] is False and found["body"] == "jms later", found
    assert found["waited_ms"] >= 1000, found
    assert found["x_delay"] == -1000 and found["x_delay_type"] == "Integer", found


def test_the_plugin_readme_with_node_amqplib(dx_bridge: BridgeProcess, names: list[str]) -> None:
    if not (CLIENTS / "node_modules" / "amqplib").is_dir():
        pytest.fail("amqplib is not installed: run scripts/install-test-deps", pytrace=False)
    exchange, queue = _name("x"), _name("q")
    names += [exchange, queue]
    run = subprocess.run(["node", str(CLIENTS / "delayed_exchange.js"),
                          str(dx_bridge.amqp_port), exchange, queue, "800"],  # type: ignore[attr-defined]
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert found["early"] is False and found["body"] == "node later", found
    assert found["waited_ms"] >= 800 and found["x_delay"] == -800, found


def test_stomp_send_to_a_delayed_exchange(dx_bridge: BridgeProcess, names: list[str]) -> None:
    amqp = _connect(dx_bridge)
    ch = amqp.channel()
    exchange = _delayed_exchange(ch, names)
    queue = _bound_queue(ch, names, exchange)
    conn, inbox = connect(dx_bridge.stomp_port, "guest", "guest")
    conn.send(f"/exchange/{exchange}/k", "stomp later",
              headers={"x-delay": "1000", "receipt": "staged"})
    assert inbox.wait_receipt("staged")
    assert _get(ch, queue, 0.5) is None
    got = _get(ch, queue, 10)
    assert got is not None and got[1] == b"stomp later"
    assert got[0].headers["x-delay"] == -1000
    conn.send(f"/exchange/{exchange}/k", "now", headers={"x-delay": "-20", "receipt": "now"})
    assert inbox.wait_receipt("now")
    got = _get(ch, queue, 2)
    assert got is not None and got[1] == b"now"
    conn.send(f"/exchange/{exchange}/k", "bad", headers={"x-delay": "1.5s", "receipt": "bad"})
    error = inbox.wait_error()
    assert error is not None and error.headers["receipt-id"] == "bad"
    assert error.headers["message"].startswith("MQRC_OPTIONS_ERROR")
    assert "x-delay" in error.headers["message"]
    # The bridge closes the connection after an ERROR, as a broker does: it may be gone already.
    with contextlib.suppress(stomp.exception.NotConnectedException):
        conn.disconnect()
    amqp.close()


def _staged(bridge: BridgeProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bridge.app.cli", "staged", *args, "--broker", "rabbitmq",
         "--upstream-stomp", f"stomp://{bridge.upstream}",
         "--staging-prefix", bridge.staging_prefix],
        capture_output=True, text=True, timeout=60)


def test_staged_tools_show_and_act_on_them(dx_bridge: BridgeProcess, names: list[str]) -> None:
    conn = _connect(dx_bridge)
    ch = conn.channel()
    exchange = _delayed_exchange(ch, names)
    queue = _bound_queue(ch, names, exchange)
    ch.confirm_delivery()
    ids = [f"M-dx-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    for message_id in ids:
        ch.basic_publish(exchange, "k", message_id.encode(), pika.BasicProperties(
            headers={"x-delay": 600_000}, message_id=message_id))
    target = f"/exchange/{exchange}/k"
    time.sleep(1.0)  # let the engine look at the level head and give it back
    listed = _staged(dx_bridge, "list", "--target", target, "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert sorted(row["message_id"] for row in rows) == sorted(ids)
    assert {row["target"] for row in rows} == {target}
    assert _staged(dx_bridge, "count", "--target", target).stdout.strip() == "2"
    cancelled = _staged(dx_bridge, "cancel", ids[0])
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    released = _staged(dx_bridge, "release", ids[1])
    assert released.returncode == 0, released.stdout + released.stderr
    got = _get(ch, queue, 10)
    assert got is not None and got[1] == ids[1].encode()
    assert got[0].headers["x-delay"] == -600_000
    assert _staged(dx_bridge, "count", "--target", target).stdout.strip() == "0"
    assert _get(ch, queue, 0.5) is None
    conn.close()

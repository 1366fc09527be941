"""A target the broker refuses when a staged message is due does not stall the engine, and the
engine counts what is pending: against each real broker, on a staging prefix of its own."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pika

from tests.integration.brokers import Broker
from tests.integration.clients import connect
from tests.integration.staging_util import private_bridges


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def refused_target(broker: Broker, queue: str) -> tuple[str, Callable[[], None]]:
    """A destination that passes the send-time check and is gone when the message is due, and
    what makes it go.

    RabbitMQ: ``/amq/queue/<q>`` of a queue deleted before the message is due (the mandatory
    publish comes back unroutable). ActiveMQ: the temporary queue of a connection (as another
    connection sees it in a reply-to, ``/remote-temp-queue/...``) that closes before the message
    is due: ERROR DestinationDoesNotExistException."""
    if broker.name == "rabbitmq":
        name = f"jbt-gone-{uuid.uuid4().hex[:12]}"
        conn = pika.BlockingConnection(pika.URLParameters(broker.amqp_url or ""))
        conn.channel().queue_declare(name, durable=True)
        conn.close()

        def delete() -> None:
            conn = pika.BlockingConnection(pika.URLParameters(broker.amqp_url or ""))
            conn.channel().queue_delete(name)
            conn.close()

        return f"/amq/queue/{name}", delete
    owner, _ = connect(broker.stomp_port, broker.user, broker.password)
    reader, inbox = connect(broker.stomp_port, broker.user, broker.password)
    reader.subscribe(f"/queue/{queue}-replies", id="r", ack="auto")
    owner.send(f"/queue/{queue}-replies", "?", headers={"reply-to": "/temp-queue/jbt-gone"})
    [request] = inbox.take(1, timeout=10)
    reader.disconnect()
    temporary = request.headers["reply-to"]
    assert temporary.startswith("/remote-temp-queue/"), temporary
    return temporary, owner.disconnect


def test_a_refused_target_goes_to_the_undeliverable_queue_without_a_reconnect(
    broker: Broker, tmp_path: Path, queue: str
) -> None:
    dest = broker.queue_destination(queue)
    bad, make_it_go = refused_target(broker, queue)
    with private_bridges(broker, tmp_path) as (layout, (bridge,)):
        arrivals, inbox = connect(broker.stomp_port, broker.user, broker.password)
        arrivals.subscribe(dest, id="arrivals", ack="auto")
        conn, sent = connect(bridge.stomp_port, broker.user, broker.password)
        # The target must be gone before the due time: sending, a metric and the delete took
        # over 3 s beside a busier suite.
        due = now_ms() + 8_000
        for i, target in enumerate([dest, dest, bad, dest, dest]):  # one due time: one batch
            conn.send(target, f"m{i}", headers={"JMSDeliveryTime": str(due), "seq": str(i),
                                                "receipt": f"r{i}"})
        assert sent.wait_receipt("r4"), sent.wait_error(0.1)
        conn.disconnect()
        reconnects = bridge.metric("jms_bridge_staging_reconnects_total")
        make_it_go()
        assert now_ms() < due, "the target was still there at the due time"

        got = inbox.take(4, timeout=15)
        arrived = now_ms()
        arrivals.disconnect()
        undeliverable = f"{layout.prefix}.undeliverable"
        reader, dead = connect(broker.stomp_port, broker.user, broker.password)
        prefix = "/amq/queue/" if broker.name == "rabbitmq" else "/queue/"
        reader.subscribe(prefix + undeliverable, id="dead", ack="auto")
        [dead_letter] = dead.take(1, timeout=10)
        reader.disconnect()
        assert bridge.metric("jms_bridge_staging_reconnects_total") == reconnects
        assert bridge.settled_metric("jms_bridge_staging_undeliverable_total", 1) == 1
        assert bridge.settled_metric("jms_bridge_staging_released_total", 4) == 4
        log = bridge.log()

    assert sorted(f.headers["seq"] for f in got) == ["0", "1", "3", "4"]
    assert due <= arrived < due + 3_000, "released on time, beside the refused one"
    headers = dead_letter.headers
    assert headers["jms-bridge-target"] == bad
    assert headers["jms-bridge-reason"] == "MQRC_UNKNOWN_OBJECT_NAME"
    assert headers["jms-bridge-reason-code"] == "2085"
    assert headers["jms-bridge-reason-text"]
    assert due <= int(headers["jms-bridge-failed-at"]) < due + 3_000
    assert dead_letter.body in ("m2", b"m2")
    assert "moved to the undeliverable queue" in log and "reconnecting" not in log
    print(f"{broker.name}: refused with {headers['jms-bridge-reason-text']!r}")


def test_pending_gauge_counts_what_is_staged(broker: Broker, tmp_path: Path, queue: str) -> None:
    dest = broker.queue_destination(queue)
    n = 37
    with private_bridges(broker, tmp_path) as (_, (bridge,)):
        conn, sent = connect(bridge.stomp_port, broker.user, broker.password)
        for i in range(n):
            conn.send(dest, f"m{i}", headers={"x-delay": str(3_600_000 + i * 100_000),
                                              "receipt": f"r{i}"})
        assert sent.wait_receipt(f"r{n - 1}")
        conn.disconnect()
        deadline = time.monotonic() + 12
        pending = math.nan
        while time.monotonic() < deadline:
            pending = bridge.metric("jms_bridge_staging_pending")
            if pending == n:
                break
            time.sleep(0.5)
        log = bridge.log()
    assert pending == n, f"pending {pending}, not {n}; the bridge's log ends: {log[-1500:]}"

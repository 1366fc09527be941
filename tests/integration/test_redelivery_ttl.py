"""A redelivered message's time to live counts from the original send, on both brokers over
STOMP and on RabbitMQ over AMQP: every copy the bridge puts back (at once, or through the staging
queues after a delay) carries no more time to live than is left since the send, no copy comes
after the time is up, and one whose time ends while it waits for its redelivery is handled as an
expired staged message (an expiration report, the undelivered queue, or discarded)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pika
import pytest
import yaml

from policies import reports
from tests.integration.bridgeproc import BridgeProcess, free_port, wait_port
from tests.integration.brokers import Broker
from tests.integration.clients import connect
from tests.integration.staging_util import private_bridges

RUN = uuid.uuid4().hex[:6]
NOW = f"jbt-ttl-{RUN}-now"  # redelivered at once
LATER = f"jbt-ttl-{RUN}-later"  # redelivered after 400 ms
POLICIES: dict[str, object] = {
    # (a /queue/ pattern covers the queue's AMQP consumers too)
    f"/queue/{NOW}.*": "50:move(queue:$.dlq)",
    f"/queue/{LATER}.*": {"dialect": "weblogic", "redelivery-delay": 400,
                          "redelivery-limit": 50},
}
# Time for several redeliveries 400 ms apart (beside the whole suite, one took 2 s).
TTL_MS = 4000
SLACK_MS = 5  # the bridge's clock rounds up to the next ms
UNDELIVERED = f"jbt-ttl-{RUN}-undelivered"


def now_ms() -> int:
    return int(time.time() * 1000)


@pytest.fixture(scope="module")
def ttl_bridge(broker: Broker, tmp_path_factory: pytest.TempPathFactory,
               ) -> Iterator[BridgeProcess]:
    tmp = tmp_path_factory.mktemp("redelivery-ttl")
    config = tmp / "bridge.yaml"
    config.write_text(yaml.safe_dump({"redelivery": POLICIES}))
    extra = ["--config", str(config), "--undelivered-queue", UNDELIVERED]
    if broker.name == "rabbitmq":
        port = free_port()
        extra += ["--amqp-listen", f"127.0.0.1:{port}"]
    with private_bridges(broker, tmp, extra=tuple(extra)) as (_, (bridge,)):
        if broker.name == "rabbitmq":
            bridge.amqp_port = port  # type: ignore[attr-defined]
            assert wait_port(port, 20, bridge.proc), bridge.log()
        yield bridge


def _ttl_headers(broker: Broker) -> dict[str, str]:
    """A TTL of TTL_MS as each broker's STOMP takes it: relative on RabbitMQ, absolute on
    ActiveMQ."""
    if broker.name == "rabbitmq":
        return {"expiration": str(TTL_MS)}
    return {"expires": str(now_ms() + TTL_MS)}


def _left_ms(broker: Broker, headers: dict[str, str]) -> int:
    """The time to live a delivery carries, as ms from now."""
    if broker.name == "rabbitmq":
        assert "expiration" in headers, f"a redelivered copy lost its TTL: {headers}"
        return int(headers["expiration"])
    assert "expires" in headers, f"a redelivered copy lost its TTL: {headers}"
    return int(headers["expires"]) - now_ms()


def _fail_until_gone(conn: Any, inbox: Any, broker: Broker, sent_ms: int,
                     pause_s: float) -> list[int]:
    """NACK every delivery (after ``pause_s``) until none comes; each delivery's TTL checked
    against what is left since ``sent_ms`` (taken after the send's receipt: the bridge read
    the SEND before it). The times of the deliveries, ms after the send."""
    arrivals: list[int] = []
    failed_at = sent_ms
    while True:
        got = inbox.take(1, timeout=max(TTL_MS - (now_ms() - sent_ms), 0) / 1000 + 1.5)
        if not got:
            return arrivals
        arrived = now_ms()
        message = got[0]
        arrivals.append(arrived - sent_ms)
        left = _left_ms(broker, message.headers)
        # Put after the previous NACK, so at most what was left then.
        allowed = TTL_MS - (failed_at - sent_ms) + SLACK_MS
        assert left <= allowed, (
            f"delivery {len(arrivals)} carries {left} ms to live, more than the {allowed} "
            f"left since the send ({arrived - sent_ms} ms ago)")
        time.sleep(pause_s)
        failed_at = now_ms()
        conn.nack(message.headers["ack"])


@pytest.mark.parametrize("kind", [NOW, LATER], ids=["now", "later"])
def test_every_redelivered_copy_counts_its_ttl_from_the_send(
    ttl_bridge: BridgeProcess, broker: Broker, kind: str,
) -> None:
    dest = f"/queue/{kind}.{uuid.uuid4().hex[:8]}"
    conn, inbox = connect(ttl_bridge.stomp_port, broker.user, broker.password)
    conn.send(dest, "short-lived", headers={**_ttl_headers(broker), "receipt": "s"})
    assert inbox.wait_receipt("s")
    sent_ms = now_ms()
    conn.subscribe(dest, id="c", ack="client-individual")
    arrivals = _fail_until_gone(conn, inbox, broker, sent_ms, 0.15 if kind == NOW else 0)
    conn.disconnect()
    assert len(arrivals) >= 4, arrivals
    late = [a for a in arrivals if a > TTL_MS + 200]
    assert not late, f"delivered after its time to live: {arrivals}"


@pytest.mark.parametrize("asks", ["report", "undelivered", "discard"])
def test_a_ttl_that_ends_while_waiting_for_redelivery_goes_where_it_asked(
    ttl_bridge: BridgeProcess, broker: Broker, asks: str,
) -> None:
    dest = f"/queue/{LATER}.{uuid.uuid4().hex[:8]}"
    replies = f"/queue/jbt-ttl-{RUN}-replies.{uuid.uuid4().hex[:8]}"
    mark = uuid.uuid4().hex
    headers = {**_ttl_headers(broker), "mark": mark, "persistent": "true", "receipt": "s"}
    if asks == "report":
        headers.update({"reply-to": replies,
                        reports.REPORT_EXPIRATION: str(reports.MQRO_EXPIRATION_WITH_DATA)})
    elif asks == "undelivered":
        headers["JMS_TIBCO_PRESERVE_UNDELIVERED"] = "true"
    discarded = ttl_bridge.metric("jms_bridge_staging_dead_letters_total",
                                  reason="MQFB_EXPIRATION", to="discard")
    reader, answers = connect(ttl_bridge.stomp_port, broker.user, broker.password)
    reader.subscribe(replies, id="replies", ack="auto")
    conn, inbox = connect(ttl_bridge.stomp_port, broker.user, broker.password)
    conn.send(dest, "x" * 300, headers=headers)
    assert inbox.wait_receipt("s")
    sent_ms = now_ms()
    conn.subscribe(dest, id="c", ack="client-individual")
    arrivals = _fail_until_gone(conn, inbox, broker, sent_ms, 0)
    assert arrivals and max(arrivals) <= TTL_MS + 200, arrivals
    conn.disconnect()
    reported = answers.take(1, timeout=10) if asks == "report" else answers.quiet(0.2)
    reader.disconnect()
    if asks == "report":
        assert len(reported) == 1, "no expiration report"
        h = reported[0].headers
        assert h["JMS_IBM_Feedback"] == "258" and h["jms-bridge-reason"] == "MQFB_EXPIRATION"
        assert h["jms-bridge-report"] == "expiration" and reported[0].body == "x" * 100
    elif asks == "undelivered":
        reader, kept = connect(ttl_bridge.stomp_port, broker.user, broker.password)
        reader.subscribe(f"/queue/{UNDELIVERED}", id="u", ack="auto",
                         headers={"selector": f"mark = '{mark}'"}
                         if broker.name == "activemq" else {})
        copies = [m for m in kept.take(1, timeout=10) + kept.quiet(0.3)
                  if m.headers.get("mark") == mark]
        reader.disconnect()
        assert len(copies) == 1, "nothing on the undelivered queue"
        h = copies[0].headers
        assert h["jms-bridge-reason"] == "MQFB_EXPIRATION"
        assert h["jms-bridge-policy"] == "JMS_TIBCO_PRESERVE_UNDELIVERED"
        assert h["jms-bridge-original-destination"] == dest
    if asks != "report":
        assert reported == [], "a report nobody asked for"
    if asks == "discard":
        assert ttl_bridge.settled_metric(
            "jms_bridge_staging_dead_letters_total", discarded + 1, timeout=10,
            reason="MQFB_EXPIRATION", to="discard") == discarded + 1


# --- AMQP 0-9-1 through --amqp-listen (RabbitMQ) ----------------------------------------------


def _amqp(bridge: BridgeProcess) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", bridge.amqp_port, heartbeat=0,  # type: ignore[attr-defined]
        credentials=pika.PlainCredentials("guest", "guest")))


@pytest.mark.parametrize("kind", [NOW, LATER], ids=["now", "later"])
def test_amqp_redelivered_copies_count_their_ttl_from_the_publish(
    ttl_bridge: BridgeProcess, broker: Broker, kind: str,
) -> None:
    if broker.name != "rabbitmq":
        pytest.skip("the AMQP front-end runs on RabbitMQ")
    queue = f"{kind}.{uuid.uuid4().hex[:8]}"
    conn = _amqp(ttl_bridge)
    channel = conn.channel()
    channel.queue_declare(queue, durable=True)
    channel.confirm_delivery()
    channel.basic_publish("", queue, b"short-lived", pika.BasicProperties(
        expiration=str(TTL_MS), headers={"JMS_TIBCO_PRESERVE_UNDELIVERED": "true"}))
    sent_ms = now_ms()
    got: list[tuple[Any, Any, int]] = []
    channel.basic_consume(queue, lambda _c, m, p, _b: got.append((m, p, now_ms())))
    arrivals: list[int] = []
    failed_at = sent_ms
    while True:
        deadline = time.monotonic() + max(TTL_MS - (now_ms() - sent_ms), 0) / 1000 + 1.5
        while not got and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.05)
        if not got:
            break
        method, props, arrived = got.pop(0)
        arrivals.append(arrived - sent_ms)
        assert props.expiration is not None, "a redelivered copy lost its TTL"
        allowed = TTL_MS - (failed_at - sent_ms) + SLACK_MS
        assert int(props.expiration) <= allowed, (
            f"delivery {len(arrivals)} carries {props.expiration} ms to live, more than the "
            f"{allowed} left since the publish")
        if kind == NOW:
            conn.sleep(0.15)
        failed_at = now_ms()
        channel.basic_nack(method.delivery_tag, requeue=True)
    conn.close()
    assert len(arrivals) >= 4, arrivals
    assert max(arrivals) <= TTL_MS + 200, f"delivered after its time to live: {arrivals}"
    if kind == LATER:  # its time ran out while it waited: kept, as it asked
        reader = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", 5672, credentials=pika.PlainCredentials("guest", "guest")))
        ch = reader.channel()
        ch.queue_declare(UNDELIVERED, durable=True)
        deadline = time.monotonic() + 10
        found = None
        while found is None and time.monotonic() < deadline:
            method, props, body = ch.basic_get(UNDELIVERED, auto_ack=False)
            if method is None:
                time.sleep(0.2)
                continue
            if (props.headers or {}).get("jms-bridge-original-destination", "").endswith(queue):
                found = props
                ch.basic_ack(method.delivery_tag)
            # (another test's is left unacknowledged: back on the queue when this one closes)
        reader.close()
        assert found is not None, f"nothing on the undelivered queue: {ttl_bridge.log()[-3000:]}"
        assert found.headers["jms-bridge-reason"] == "MQFB_EXPIRATION"


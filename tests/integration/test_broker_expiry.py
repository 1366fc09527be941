"""A message that is not delayed, asked to be kept (``JMS_TIBCO_PRESERVE_UNDELIVERED: true``) and
expires on the broker, with no consumer, reaches the undelivered queue once, with the metadata of
any undelivered message; one that did not ask is not kept. RabbitMQ brings expired messages to
the bridge through a policy the bridge applies (``--expiry-policy``, on this test's queue only);
ActiveMQ moves an expired persistent message to ActiveMQ.DLQ by itself, after its expiry check
(every 30 s by default), where the bridge takes only those that asked to be kept."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from base64 import b64encode
from pathlib import Path

import pika

from tests.integration.brokers import Broker
from tests.integration.clients import connect
from tests.integration.test_dlq_tools import cli
from tests.integration.test_staging_failures import bridge_with, send

TTL_MS = 500
# ActiveMQ's expiry check runs every 30 s (expireMessagesPeriod): the copy comes within that,
# and the time to move it.
ARRIVES_WITHIN_S = 75


def _policy(
    broker: Broker, name: str, method: str = "GET",
) -> dict | None:  # type: ignore[type-arg]
    request = urllib.request.Request(
        f"{broker.management_url}/api/policies/%2F/{name}", method=method)
    request.add_header("Authorization", "Basic " + b64encode(b"guest:guest").decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            body = answer.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise
    return json.loads(body) if body else {}


def _wait_policy(broker: Broker, name: str, timeout: float = 30) -> dict:  # type: ignore[type-arg]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = _policy(broker, name)
        if found is not None:
            return found
        time.sleep(0.2)
    raise AssertionError(f"the bridge applied no policy {name}")


def _forget(broker: Broker, name: str, queues: list[str], prefix: str) -> None:
    """RabbitMQ: the test's policy, expired exchange and queues."""
    _policy(broker, f"{prefix}.expired", method="DELETE")
    conn = pika.BlockingConnection(pika.URLParameters(broker.amqp_url or ""))
    channel = conn.channel()
    for queue in queues:
        channel.queue_delete(queue)
    channel.exchange_delete(f"{prefix}.expired")
    conn.close()


def _own_activemq_dead_letters(broker: Broker, tag: str) -> list:  # type: ignore[type-arg]
    """Take this test's messages off the shared ActiveMQ.DLQ."""
    conn, inbox = connect(broker.stomp_port, broker.user, broker.password)
    conn.subscribe("/queue/ActiveMQ.DLQ", id="own", ack="auto",
                   headers={"selector": f"jbt_run = '{tag}'"})
    got = inbox.quiet(3.0)
    conn.disconnect()
    return got


def test_a_preserved_message_the_broker_expires_reaches_the_undelivered_queue_once(
    broker: Broker, tmp_path: Path,
) -> None:
    tag = uuid.uuid4().hex[:10]
    name = f"jbt-expiry-{tag}"
    target = f"/queue/{name}"
    undelivered = f"jbt-expiry-undelivered-{tag}"
    extra = ["--undelivered-queue", undelivered]
    if broker.name == "activemq":
        extra += ["--expiry-dead-letter-queue", "ActiveMQ.DLQ"]
    if broker.name == "rabbitmq":
        extra += ["--upstream-management", broker.management_url or "",
                  "--expiry-policy", f"^{name}$"]
    prefix = ""
    try:
        with bridge_with(broker, tmp_path, {}, *extra) as (prefix, bridge):
            if broker.name == "rabbitmq":  # the policy is there before the message expires
                policy = _wait_policy(broker, f"{prefix}.expired")
                assert policy["priority"] < 0 and policy["apply-to"] == "queues"
                assert policy["definition"] == {"dead-letter-exchange": f"{prefix}.expired"}
            sent_ms = int(time.time() * 1000)
            ttl = ({"expiration": str(TTL_MS)} if broker.name == "rabbitmq"
                   else {"expires": str(sent_ms + TTL_MS)})
            send(bridge, broker, target, "keep me", seq="kept", jbt_run=tag,
                 JMS_TIBCO_PRESERVE_UNDELIVERED="true", **ttl)
            send(bridge, broker, target, "drop me", seq="dropped", jbt_run=tag, **ttl)
            on_target = f"JMSDestination='Queue[{name}]'"
            deadline = time.monotonic() + ARRIVES_WITHIN_S
            entries: list[dict] = []  # type: ignore[type-arg]
            while time.monotonic() < deadline and not entries:
                shown = cli(broker, "browse", "--queue", undelivered, "--selector", on_target,
                            "--json", "--body")
                entries = json.loads(shown.stdout) if shown.returncode == 0 else []
                if not entries:
                    time.sleep(2)
            assert entries, f"nothing on {undelivered}; the bridge's log ends: " \
                            f"{bridge.log()[-2000:]}"
            reader, inbox = connect(broker.stomp_port, broker.user, broker.password)
            reader.subscribe(f"/queue/{undelivered}", id="u", ack="auto")
            got = inbox.take(1, timeout=10) + inbox.quiet(3.0)
            reader.disconnect()
            metric = bridge.metric("jms_bridge_staging_dead_letters_total",
                                   reason="MQFB_EXPIRATION", to="undelivered")
            log = bridge.log()
    finally:
        if broker.name == "rabbitmq" and prefix:
            _forget(broker, name, [name, undelivered], prefix)
    left = _own_activemq_dead_letters(broker, tag) if broker.name == "activemq" else []
    # ActiveMQ: the one that did not ask stays where the broker put it, for the operator.
    assert [f.headers["seq"] for f in left] == (["dropped"] if broker.name == "activemq" else [])
    [entry] = entries
    assert entry["reason"] == "MQFB_EXPIRATION" and entry["reason_code"] == 258
    assert entry["original_destination"].endswith(f"/queue/{name}")
    assert entry["body"] == "keep me"
    # (ActiveMQ.DLQ is shared: a bridge takes whatever asked to be kept there, other runs' too.)
    ours = [f for f in got if f.headers.get("jbt_run") == tag]
    assert [f.body for f in ours] == ["keep me"], [f.headers for f in got]
    h = ours[0].headers
    assert h["seq"] == "kept"
    assert h["jms-bridge-reason"] == "MQFB_EXPIRATION" and h["jms-bridge-reason-code"] == "258"
    assert h["jms-bridge-original-jms-destination"] == f"Queue[{name}]"
    assert h["jms-bridge-policy"] == "JMS_TIBCO_PRESERVE_UNDELIVERED"
    assert "expired by the broker" in h["jms-bridge-reason-text"]
    assert int(h["jms-bridge-failed-at"]) >= sent_ms + TTL_MS
    assert "expiration" not in h and h.get("expires", "0") == "0"
    assert metric == 1
    assert "Traceback" not in log

"""Redelivery policies end to end: a real consumer NACKs through the bridge until its policy
moves, dead-letters or deletes the message, on both brokers, in every dialect.

The expected action for each failure comes from the policy model itself (``decide``); what is
tested here is that the bridge carries it out: the delays between deliveries are never shorter
than the policy's, the delivery count is right on every delivery, and the message ends where
the policy says, with why.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bridge.frontends.stomp import Frame
from bridge.staging import envelope
from policies.redelivery import Delete, Move, Redeliver, Undelivered, compile_table, decide
from tests.integration.bridgeproc import BridgeProcess
from tests.integration.brokers import Broker
from tests.integration.clients import Inbox, connect
from tests.integration.wire import RawPeer

RUN = uuid.uuid4().hex[:6]
UNDELIVERED = f"jbt-rd-{RUN}-undelivered"
POLICIES: dict[str, object] = {
    f"/queue/jbt-rd-{RUN}-jmsjca.*": "1:300; 2:600; 3:move(queue:$.dlq)",
    f"/queue/jbt-rd-{RUN}-weblogic.*": {
        "dialect": "weblogic", "redelivery-delay": 400, "redelivery-limit": 1,
        "error-destination": f"/queue/jbt-rd-{RUN}-wl-errors"},
    f"/queue/jbt-rd-{RUN}-jboss.*": {
        "dialect": "jboss", "DefaultRedeliveryDelay": 200, "DefaultMaxDeliveryAttempts": 3,
        "DefaultDLQ": f"/queue/jbt-rd-{RUN}-jboss-dlq"},
    f"/queue/jbt-rd-{RUN}-websphere.*": {
        "dialect": "websphere", "maxFailedDeliveries": 2,
        "exceptionDestination": f"/queue/jbt-rd-{RUN}-ws-exceptions"},
    f"/queue/jbt-rd-{RUN}-tibco.*": {"dialect": "tibco", "maxRedelivery": 2},
    f"/queue/jbt-rd-{RUN}-activemq.*": {
        "dialect": "activemq", "initialRedeliveryDelay": 200, "redeliveryDelay": 100,
        "useExponentialBackOff": True, "backOffMultiplier": 3, "maximumRedeliveries": 2,
        "deadLetterQueue": f"jbt-rd-{RUN}-amq-dlq"},
    f"/queue/jbt-rd-{RUN}-artemis.*": {
        "dialect": "artemis", "redelivery-delay": 150, "redelivery-delay-multiplier": 2,
        "max-delivery-attempts": 3, "dead-letter-address": f"/queue/jbt-rd-{RUN}-artemis-dla"},
    f"/queue/jbt-rd-{RUN}-delete.*": "delete",
}
TABLE = compile_table(POLICIES)
# Where first deliveries carry JMSXDeliveryCount 1 too (--first-delivery-count); elsewhere only
# redeliveries carry it.
COUNT_FIRST = [f"/queue/jbt-rd-{RUN}-{kind}.*" for kind in ("jmsjca", "jboss", "tibco")]


@pytest.fixture(scope="module")
def rd_bridge(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BridgeProcess]:
    tmp = tmp_path_factory.mktemp("redelivery")
    config = tmp / "bridge.yaml"
    config.write_text(yaml.safe_dump({"redelivery": POLICIES,
                                      "first-delivery-count": COUNT_FIRST}))
    proc = BridgeProcess(broker.name, f"{broker.stomp_host}:{broker.stomp_port}",
                         tmp / "bridge.log",
                         extra=["--config", str(config), "--undelivered-queue", UNDELIVERED])
    proc.start()
    yield proc
    assert proc.stop() == 0, proc.log()


def _dest(kind: str) -> str:
    return f"/queue/jbt-rd-{RUN}-{kind}.{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize("kind", ["jmsjca", "weblogic", "jboss", "websphere", "tibco",
                                  "activemq", "artemis", "delete"])
def test_a_consumer_that_always_fails_meets_its_policy(
    rd_bridge: BridgeProcess, broker: Broker, kind: str, tmp_path: Path,
) -> None:
    dest = _dest(kind)
    _, policy = TABLE.lookup(dest)
    mark = uuid.uuid4().hex
    headers = {"mark": mark, "persistent": "true"}
    if kind == "tibco":
        headers["JMS_TIBCO_PRESERVE_UNDELIVERED"] = "true"
    conn, inbox = connect(rd_bridge.stomp_port, broker.user, broker.password)
    conn.send(dest, "poison", headers=headers)
    conn.subscribe(dest, id="c", ack="client-individual")
    failures, nacked_at = 0, 0.0
    while True:
        got = inbox.take(1, timeout=15)
        assert got, f"delivery {failures + 1} never came ({kind}); log:\n{rd_bridge.log()[-3000:]}"
        arrived = time.monotonic()
        message = got[0]
        assert message.body == "poison" and message.headers["mark"] == mark
        if failures or kind in ("jmsjca", "jboss", "tibco"):
            assert message.headers["JMSXDeliveryCount"] == str(failures + 1)
        else:  # a first delivery, as the broker sent it
            assert "JMSXDeliveryCount" not in message.headers, kind
        if failures:
            action = decide(policy, failures, dest, headers, 0.5)
            assert isinstance(action, Redeliver)
            waited_ms = (arrived - nacked_at) * 1000
            assert waited_ms >= action.delay_ms - 2, (kind, failures, waited_ms, action)
        failures += 1
        nacked_at = time.monotonic()
        conn.nack(message.headers["ack"])
        action = decide(policy, failures, dest, headers, 0.5)
        if not isinstance(action, Redeliver):
            break
    assert inbox.quiet(0.3) == []
    if isinstance(action, Delete):
        conn.disconnect()
        return
    where = action.destination if isinstance(action, Move) else f"/queue/{UNDELIVERED}"
    assert isinstance(action, Move | Undelivered)
    conn.subscribe(where, id="dead", ack="auto", headers={"selector": f"mark = '{mark}'"}
                   if broker.name == "activemq" else {})
    dead = [m for m in inbox.take(1, timeout=10) if m.headers.get("mark") == mark]
    conn.disconnect()
    assert len(dead) == 1, f"{kind}: nothing on {where}"
    h = dead[0].headers
    assert dead[0].body == "poison"
    assert h[envelope.REASON] == "MQRC_BACKOUT_THRESHOLD_REACHED"
    assert h[envelope.REASON_CODE] == "2362"
    assert h[envelope.ORIGINAL_DESTINATION] == dest
    assert h[envelope.ORIGINAL_JMS_DESTINATION] == f"Queue[{dest.rsplit('/', 1)[1]}]"
    assert h[envelope.DELIVERIES_TRIED] == str(failures)
    assert envelope.DELIVERY_COUNT not in h  # counted afresh on the dead-letter queue
    assert h[envelope.POLICY].startswith(policy.dialect)


def test_an_abort_of_a_transaction_that_acked_counts_as_a_failure(
    rd_bridge: BridgeProcess, broker: Broker,
) -> None:
    dest = _dest("jmsjca")
    conn, inbox = connect(rd_bridge.stomp_port, broker.user, broker.password)
    conn.send(dest, "rolled back")
    conn.subscribe(dest, id="c", ack="client-individual")
    (first,) = inbox.take(1)
    tx = conn.begin()
    conn.ack(first.headers["ack"], transaction=tx)
    conn.abort(tx)
    again = inbox.take(1)
    assert [m.body for m in again] == ["rolled back"]
    assert again[0].headers["JMSXDeliveryCount"] == "2"
    conn.ack(again[0].headers["ack"])
    assert inbox.quiet(0.5) == []
    conn.disconnect()


def test_a_consumer_that_goes_away_unsettled_counts_as_a_failure(
    rd_bridge: BridgeProcess, broker: Broker,
) -> None:
    dest = _dest("jmsjca")
    conn, inbox = connect(rd_bridge.stomp_port, broker.user, broker.password)
    conn.send(dest, "left behind", receipt="sent")
    assert inbox.wait_receipt("sent")
    conn.subscribe(dest, id="c", ack="client-individual")
    assert [m.body for m in inbox.take(1)] == ["left behind"]
    conn.disconnect()  # without an ACK
    other, inbox2 = connect(rd_bridge.stomp_port, broker.user, broker.password)
    other.subscribe(dest, id="c2", ack="client-individual")
    again = inbox2.take(1)
    assert [m.body for m in again] == ["left behind"]
    assert again[0].headers["JMSXDeliveryCount"] == "2"
    other.ack(again[0].headers["ack"])
    assert inbox2.quiet(0.5) == []
    other.disconnect()


FRAME_HEADERS = ("receipt", "transaction", "receipt-id")


def test_no_copy_carries_the_frame_headers_of_the_send(
    rd_bridge: BridgeProcess, broker: Broker,
) -> None:
    """A SEND's receipt (and transaction) belong to that frame: neither its staged copy when
    released, nor a redelivered copy, nor the dead-letter copy carries them to a consumer."""
    dest = _dest("jmsjca")  # 1:300; 2:600; 3:move(queue:$.dlq)
    mark = uuid.uuid4().hex
    conn, inbox = connect(rd_bridge.stomp_port, broker.user, broker.password)
    delay = "x-delay" if broker.name == "rabbitmq" else "AMQ_SCHEDULED_DELAY"
    conn.send(dest, "delayed", headers={delay: "200", "mark": mark, "receipt": "r-delayed"})
    assert inbox.wait_receipt("r-delayed")
    tx = conn.begin()
    conn.send(dest, "in a transaction", headers={delay: "200", "mark": mark}, transaction=tx)
    conn.commit(tx)
    conn.subscribe(dest, id="c", ack="client-individual")
    seen: list[dict[str, str]] = []
    for _ in range(2 * 4):  # each message: its release, then redelivered (now, 300, 600 ms)
        got = inbox.take(1, timeout=15)
        assert got, f"after {len(seen)} deliveries; log:\n{rd_bridge.log()[-3000:]}"
        seen.append(dict(got[0].headers))
        conn.nack(got[0].headers["ack"])  # the 4th failure moves it to the dead-letter queue
    assert sorted(h["JMSXDeliveryCount"] for h in seen) == ["1", "1", "2", "2", "3", "3", "4",
                                                            "4"]
    for headers in seen:
        assert not {h: headers[h] for h in FRAME_HEADERS if h in headers}, headers
    conn.subscribe(f"{dest}.dlq", id="dead", ack="auto")
    dead = inbox.take(2, timeout=10)
    conn.disconnect()
    assert len(dead) == 2
    for message in dead:
        assert message.headers[envelope.REASON] == "MQRC_BACKOUT_THRESHOLD_REACHED"
        assert not {h: message.headers[h] for h in FRAME_HEADERS if h in message.headers}


def test_a_dead_letter_starts_its_life_on_the_dead_letter_queue_as_a_first_delivery(
    rd_bridge: BridgeProcess, broker: Broker,
) -> None:
    """The dead-letter queue is a new destination (as on WebLogic and ActiveMQ): the first
    delivery from it is JMSXDeliveryCount 1, so a limit there counts its own deliveries, while
    the dead letter says how many deliveries were tried before."""
    dest = _dest("jmsjca")  # 1:300; 2:600; 3:move(queue:$.dlq): the 4th failure moves it
    conn, inbox = connect(rd_bridge.stomp_port, broker.user, broker.password)
    conn.send(dest, "poison", receipt="sent")
    assert inbox.wait_receipt("sent")
    conn.subscribe(dest, id="c", ack="client-individual")
    for count in range(1, 5):
        got = inbox.take(1, timeout=15)
        assert got and got[0].headers["JMSXDeliveryCount"] == str(count)
        conn.nack(got[0].headers["ack"])
    conn.unsubscribe("c")
    conn.subscribe(f"{dest}.dlq", id="dead", ack="client-individual")
    (dead,) = inbox.take(1, timeout=10)
    assert "JMSXDeliveryCount" not in dead.headers  # a first delivery there
    assert dead.headers[envelope.DELIVERIES_TRIED] == "4"
    conn.nack(dead.headers["ack"])  # failing it on the dead-letter queue counts from there
    (again,) = inbox.take(1, timeout=10)
    assert again.headers["JMSXDeliveryCount"] == "2"
    assert again.headers[envelope.DELIVERIES_TRIED] == "4"
    conn.ack(again.headers["ack"])
    conn.disconnect()

# How a consumer leaves with a delivery it neither ACKed nor NACKed.
LEAVINGS = ["unsubscribe", "disconnect", "unsubscribe-disconnect", "drop", "unsubscribe-drop"]


def _receiving(bridge: BridgeProcess, broker: Broker, dest: str, sub: str) -> RawPeer:
    peer = RawPeer(bridge.stomp_port)
    assert peer.connect(broker.user, broker.password).command == "CONNECTED"
    peer.send(f"SUBSCRIBE\nid:{sub}\ndestination:{dest}\nack:client-individual\n\n\x00"
              .encode())
    return peer


def _messages(peer: RawPeer, first: float, more: float) -> list[Frame]:
    """Every MESSAGE a peer gets: the first within ``first`` seconds, then any others within
    ``more`` seconds of it (so a second copy would be seen)."""
    got: list[Frame] = []
    deadline = time.monotonic() + first
    while not peer.closed:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        peer._pump(left)
        found = [f for f in peer.frames if f.command == "MESSAGE"]
        peer.frames = [f for f in peer.frames if f.command != "MESSAGE"]
        if found and not got:
            deadline = time.monotonic() + more
        got += found
    return got


def _frame(peer: RawPeer, command: str, receipt: str) -> None:
    peer.send(f"{command}\nreceipt:{receipt}\n\n\x00".encode() if command == "DISCONNECT"
              else f"{command}\nid:{receipt}\nreceipt:{receipt}\n\n\x00".encode())
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        frame = peer.next_frame(deadline - time.monotonic())
        if frame.command == "RECEIPT" and frame.get("receipt-id") == receipt:
            return
        assert frame.command == "MESSAGE", (command, frame.command, frame.headers)


def _leave(peer: RawPeer, sub: str, how: str) -> None:
    """The consumer goes away as ``how`` says; after "unsubscribe" it stays connected."""
    if how.startswith("unsubscribe"):
        _frame(peer, "UNSUBSCRIBE", sub)
    if how.endswith("disconnect"):
        _frame(peer, "DISCONNECT", "bye")
    elif how.endswith("drop"):
        peer.close()  # no DISCONNECT: the socket just ends


@pytest.mark.parametrize("how", LEAVINGS)
@pytest.mark.parametrize("kind", ["weblogic", "websphere"])
def test_deliveries_left_unsettled_are_failed_once_however_the_consumer_leaves(
    rd_bridge: BridgeProcess, broker: Broker, kind: str, how: str,
) -> None:
    """A ``client-individual`` consumer leaves twice with its delivery unsettled. After each
    leaving, exactly one copy of the message is on its queue (WebLogic: the bridge's staged
    copy after 400 ms; WebSphere: a redelivery at once, the broker's own requeue) and the
    second leaving moves it: one copy on the error destination, none on the queue. A leaving
    by UNSUBSCRIBE alone settles what the subscription was handed while the consumer is still
    connected (RabbitMQ would refuse its ACK once the subscription is gone: "Subscription not
    found"; ActiveMQ takes the message back at once)."""
    dest = f"/queue/jbt-rd-{RUN}-{kind}.unsettled-{uuid.uuid4().hex[:8]}"
    mark = uuid.uuid4().hex
    sender, inbox = connect(rd_bridge.stomp_port, broker.user, broker.password)
    peers: list[RawPeer] = []  # closed at the end, whatever happens: a consumer left
    try:  # behind by a failed run would take the next run's messages
        _leave_twice(rd_bridge, broker, dest, how, mark, sender, inbox, peers)
    finally:
        for peer in peers:
            peer.close()
        sender.disconnect()


def _leave_twice(bridge: BridgeProcess, broker: Broker, dest: str, how: str, mark: str,
                 sender: Any, inbox: Inbox, peers: list[RawPeer]) -> None:
    _, policy = TABLE.lookup(dest)
    sender.send(dest, "unsettled", headers={"mark": mark, "persistent": "true"},
                receipt="sent")
    assert inbox.wait_receipt("sent")
    peer = _receiving(bridge, broker, dest, "first")
    peers.append(peer)
    (delivery,) = _messages(peer, 10, 0.3)
    assert delivery.get("JMSXDeliveryCount") is None  # a first delivery
    kind = policy.dialect
    for failures in (1, 2):
        action = decide(policy, failures, dest, {}, 0.5)
        _leave(peer, "first" if failures == 1 else "again", how)
        after = _receiving(bridge, broker, dest, "again")
        peers.append(after)
        if how == "unsubscribe":  # still connected: a delay or a move is carried out now
            copies = _messages(after, 3 if failures == 1 else 1.5, 1.5)
            if not (isinstance(action, Redeliver) and action.delay_ms == 0):
                expected = 1 if failures == 1 else 0
                assert len(copies) == expected, (failures, [c.headers for c in copies])
            _frame(peer, "DISCONNECT", "bye")
            copies += _messages(after, 3 if failures == 1 and not copies else 1.5, 1.5)
        else:
            copies = _messages(after, 10 if failures == 1 else 1.5, 1.5)
        counts = [c.get("JMSXDeliveryCount") for c in copies]
        if failures == 1:
            assert isinstance(action, Redeliver)
            assert counts == ["2"], f"{kind} {how}: copies on the queue {counts}"
            assert copies[0].body == b"unsettled" and copies[0].get("mark") == mark
            # weblogic: the bridge's copy, through the staging queues; websphere: a requeue
            assert (copies[0].get("redelivered") == "true") is (action.delay_ms == 0)
            peer = after
            continue
        assert isinstance(action, Move)
        assert counts == [], f"{kind} {how}: copies left on the queue {counts}"
        sender.subscribe(action.destination, id="dead", ack="auto",
                         headers={"selector": f"mark = '{mark}'"}
                         if broker.name == "activemq" else {})
        dead = [m for m in inbox.take(2, timeout=3) if m.headers.get("mark") == mark]
        assert len(dead) == 1, f"{kind} {how}: {len(dead)} copies on {action.destination}"
        assert dead[0].headers[envelope.DELIVERIES_TRIED] == "2"

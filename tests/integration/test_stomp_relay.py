"""stomp.py through the bridge to each real broker: the client should notice no difference."""

from __future__ import annotations

import threading
import uuid

import pytest
import stomp
from stomp.exception import ConnectFailedException

from tests.integration.bridgeproc import BridgeProcess
from tests.integration.brokers import Broker
from tests.integration.clients import ack_id, connect


def _open(bridge: BridgeProcess, broker: Broker, **kw):  # type: ignore[no-untyped-def]
    return connect(bridge.stomp_port, broker.user, broker.password, **kw)


def _roundtrip(port: int, broker: Broker, dest: str, version: str) -> list[tuple[str, dict]]:
    conn, inbox = connect(port, broker.user, broker.password, version=version)
    conn.subscribe(dest, id="s1", ack="auto")
    for i in range(10):
        conn.send(dest, f"hello {i}", headers={"seq": str(i), "app-header": "a:b\\cé"})
    got = inbox.take(10)
    conn.disconnect()
    unstable = {"message-id", "ack", "subscription", "destination", "timestamp",
                "expires", "priority", "redelivered", "persistent"}
    return [(m.body, {k: v for k, v in m.headers.items() if k not in unstable}) for m in got]


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_send_and_subscribe_as_if_direct(
    bridge: BridgeProcess, broker: Broker, queue: str, version: str
) -> None:
    dest = broker.queue_destination(queue)
    through = _roundtrip(bridge.stomp_port, broker, dest, version)
    direct = _roundtrip(broker.stomp_port, broker, dest, version)
    assert [body for body, _ in through] == [f"hello {i}" for i in range(10)]
    assert [h["seq"] for _, h in through] == [str(i) for i in range(10)]
    # A first delivery is the broker's: no JMSXDeliveryCount the application never sent.
    assert through == direct
    if version != "1.0":
        assert through[0][1]["app-header"] == "a:b\\cé"


def test_ack_mode_client_is_cumulative(bridge: BridgeProcess, broker: Broker, queue: str) -> None:
    dest = broker.queue_destination(queue)
    conn, inbox = _open(bridge, broker)
    for i in range(3):
        conn.send(dest, str(i))
    conn.subscribe(dest, id="c", ack="client")
    got = inbox.take(3)
    assert [m.body for m in got] == ["0", "1", "2"]
    conn.ack(ack_id(got[1]))  # acks 0 and 1
    conn.disconnect(receipt="bye")
    conn2, inbox2 = _open(bridge, broker)
    conn2.subscribe(dest, id="c2", ack="auto")
    rest = inbox2.take(1)
    assert inbox2.quiet(0.5) == []
    conn2.disconnect()
    assert [m.body for m in rest] == ["2"]


def test_ack_mode_client_individual(bridge: BridgeProcess, broker: Broker, queue: str) -> None:
    dest = broker.queue_destination(queue)
    conn, inbox = _open(bridge, broker)
    for i in range(3):
        conn.send(dest, str(i))
    conn.subscribe(dest, id="ci", ack="client-individual")
    got = inbox.take(3)
    conn.ack(ack_id(got[0]))
    conn.ack(ack_id(got[2]))
    conn.disconnect(receipt="bye")
    conn2, inbox2 = _open(bridge, broker)
    conn2.subscribe(dest, id="ci2", ack="auto")
    rest = inbox2.take(1)
    assert inbox2.quiet(0.5) == []
    conn2.disconnect()
    assert [m.body for m in rest] == ["1"]


def test_a_nack_is_handled_by_the_destination_s_policy(
    bridge: BridgeProcess, broker: Broker, queue: str,
) -> None:
    """Not the broker's own NACK handling (RabbitMQ requeues, ActiveMQ dead-letters at once):
    with no policy configured, JMSJCA's default redelivers the first three failures at once,
    and the redelivery carries its JMSXDeliveryCount."""
    dest = broker.queue_destination(queue)
    conn, inbox = _open(bridge, broker)
    conn.send(dest, "bad", headers={"mark": queue, "persistent": "true"})
    conn.subscribe(dest, id="n", ack="client-individual")
    first = inbox.take(1)
    assert [m.body for m in first] == ["bad"]
    assert "JMSXDeliveryCount" not in first[0].headers  # a first delivery: as the broker sent it
    conn.nack(ack_id(first[0]))
    again = inbox.take(1)
    assert [m.body for m in again] == ["bad"]
    assert again[0].headers["JMSXDeliveryCount"] == "2"
    assert again[0].headers["mark"] == queue
    conn.ack(ack_id(again[0]))
    assert inbox.quiet(0.5) == []
    conn.disconnect()


def test_transactions_commit_and_abort(bridge: BridgeProcess, broker: Broker, queue: str) -> None:
    dest = broker.queue_destination(queue)
    conn, inbox = _open(bridge, broker)
    conn.subscribe(dest, id="t", ack="auto")
    tx = conn.begin()
    conn.send(dest, "aborted-1", transaction=tx)
    conn.send(dest, "aborted-2", transaction=tx)
    assert inbox.quiet(0.5) == []
    conn.abort(tx)
    tx2 = conn.begin()
    conn.send(dest, "committed", transaction=tx2)
    assert inbox.quiet(0.3) == []
    conn.commit(tx2)
    got = inbox.take(1)
    assert inbox.quiet(0.5) == []
    conn.disconnect()
    assert [m.body for m in got] == ["committed"]


def test_receipts(bridge: BridgeProcess, broker: Broker, queue: str) -> None:
    conn, inbox = _open(bridge, broker)
    rid = f"r-{uuid.uuid4()}"
    conn.send(broker.queue_destination(queue), "x", headers={"receipt": rid})
    assert inbox.wait_receipt(rid)
    conn.subscribe(broker.queue_destination(queue), id="r", ack="auto",
                   headers={"receipt": rid + "-sub"})
    assert inbox.wait_receipt(rid + "-sub")
    assert [m.body for m in inbox.take(1)] == ["x"]
    conn.disconnect()


def test_wrong_credentials_are_refused_by_the_broker(bridge: BridgeProcess, broker: Broker) -> None:
    conn = stomp.Connection12([("127.0.0.1", bridge.stomp_port)], heartbeats=(0, 0),
                              vhost=broker.vhost)
    from tests.integration.clients import Inbox

    inbox = Inbox()
    conn.set_listener("i", inbox)
    with pytest.raises(ConnectFailedException):
        conn.connect(broker.user, "not-the-password", wait=True)
    error = inbox.wait_error(5)
    assert error is not None, "the broker's ERROR frame did not reach the client"
    text = (error.headers.get("message", "") + str(error.body)).lower()
    assert any(w in text for w in ("login", "auth", "password", "credential", "refused"))


def test_heartbeats_flow_both_ways(bridge: BridgeProcess, broker: Broker, queue: str) -> None:
    conn, inbox = _open(bridge, broker, heartbeats=(1000, 1000))
    threading.Event().wait(3.5)
    assert conn.is_connected()
    assert inbox.heartbeats >= 2, "no heart-beats arrived from the broker through the bridge"
    dest = broker.queue_destination(queue)
    conn.subscribe(dest, id="h", ack="auto")
    conn.send(dest, "still alive")
    assert [m.body for m in inbox.take(1)] == ["still alive"]
    conn.disconnect()


def test_one_mebibyte_body_with_nul_bytes(bridge: BridgeProcess, broker: Broker,
                                          queue: str) -> None:
    body = bytes(range(256)) * 4096
    assert len(body) == 1 << 20 and b"\x00" in body
    conn, inbox = _open(bridge, broker, auto_decode=False)
    dest = broker.queue_destination(queue)
    conn.subscribe(dest, id="big", ack="auto")
    conn.send(dest, body, headers={"content-type": "application/octet-stream"})
    got = inbox.take(1, timeout=20)
    conn.disconnect()
    assert len(got) == 1 and got[0].body == body


def test_fifty_concurrent_clients(bridge: BridgeProcess, broker: Broker) -> None:
    clients, per_client = 50, 200
    failures: list[str] = []

    def one(n: int) -> None:
        try:
            dest = broker.queue_destination(f"jbt-many-{uuid.uuid4().hex[:8]}-{n}")
            conn, inbox = _open(bridge, broker)
            conn.subscribe(dest, id="m", ack="client-individual")
            for i in range(per_client):
                conn.send(dest, f"{n}:{i}")
            got = inbox.take(per_client, timeout=60)
            for m in got:
                conn.ack(ack_id(m))
            extra = inbox.quiet(0.2)
            conn.disconnect(receipt=f"done-{n}")
            bodies = [m.body for m in got + extra]
            if sorted(bodies) != sorted(f"{n}:{i}" for i in range(per_client)):
                failures.append(f"client {n}: got {len(bodies)} messages, "
                                f"{len(set(bodies))} distinct, expected {per_client}")
        except Exception as exc:  # collected and reported below
            failures.append(f"client {n}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=one, args=(n,)) for n in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures, failures[:5]

"""The AMQP front-end's consumer side with pika against the real RabbitMQ: every delivery carries
JMSXDeliveryCount, and Basic.Nack / Basic.Reject with requeue, Basic.Recover, a rolled-back
transaction and a channel or connection closed with unacknowledged deliveries are failures the
destination's redelivery policy handles, as for STOMP; the header table keeps its types."""

from __future__ import annotations

import datetime as dt
import decimal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest
import yaml
from pamqp import commands
from pamqp import frame as pframe

from bridge.staging import envelope
from policies.redelivery import Move, Redeliver, compile_table, decide
from tests.integration.bridgeproc import BridgeProcess, free_port, wait_port
from tests.integration.brokers import BROKERS, require
from tests.integration.tcpproxy import TcpProxy

RUN = uuid.uuid4().hex[:6]
SLOW = f"/amq/queue/jbt-aq-{RUN}-slow.*"  # delays, then a dead-letter queue
NOW = f"/amq/queue/jbt-aq-{RUN}-now.*"  # redelivered at once, five times
BAD = f"/amq/queue/jbt-aq-{RUN}-bad.*"  # the dead-letter target does not exist
DELETE = f"/amq/queue/jbt-aq-{RUN}-delete.*"  # deleted at the first failure
LATER = f"/amq/queue/jbt-aq-{RUN}-later.*"  # every redelivery after 300 ms
# Redelivered once (after 400 ms, or at once), then moved: a consumer that leaves twice.
WEBLOGIC = f"/amq/queue/jbt-aq-{RUN}-unsettled-weblogic.*"
WEBSPHERE = f"/amq/queue/jbt-aq-{RUN}-unsettled-websphere.*"
POLICIES: dict[str, object] = {
    SLOW: "1:300; 3:move(queue:$.dlq)",
    NOW: "5:move(queue:$.dlq)",
    DELETE: "delete",
    LATER: {"dialect": "weblogic", "redelivery-delay": 300, "redelivery-limit": 5,
            "error-destination": f"/queue/jbt-aq-{RUN}-later-errors"},
    WEBLOGIC: {"dialect": "weblogic", "redelivery-delay": 400, "redelivery-limit": 1,
               "error-destination": f"/queue/jbt-aq-{RUN}-unsettled-errors"},
    WEBSPHERE: {"dialect": "websphere", "maxFailedDeliveries": 2,
                "exceptionDestination": f"/queue/jbt-aq-{RUN}-unsettled-exceptions"},
    BAD: {"dialect": "weblogic", "redelivery-limit": 0,
          "error-destination": f"/exchange/jbt-aq-{RUN}-missing/x"},
}
TABLE = compile_table(POLICIES)


def _started(tmp: Path, extra: list[str]) -> BridgeProcess:
    """A bridge on RabbitMQ with an AMQP listener (``amqp_port``) and POLICIES, started."""
    broker = BROKERS["rabbitmq"]
    require(broker)
    config = tmp / "bridge.yaml"
    config.write_text(yaml.safe_dump({"redelivery": POLICIES}))
    port = free_port()
    proc = BridgeProcess("rabbitmq", f"{broker.stomp_host}:{broker.stomp_port}",
                         tmp / "bridge.log",
                         extra=["--amqp-listen", f"127.0.0.1:{port}", "--config", str(config),
                                *extra])
    proc.amqp_port = port  # type: ignore[attr-defined]
    proc.start()
    # The AMQP listener opens after the STOMP one that start() waits for.
    if not wait_port(port, 20, proc.proc):
        proc.stop()
        raise AssertionError(proc.log())
    return proc


@pytest.fixture(scope="module")
def amqp_bridge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BridgeProcess]:
    # Staging queues of its own: no other bridge on the broker releases its copies.
    proc = _started(tmp_path_factory.mktemp("amqp-consumers"),
                    ["--staging-prefix", f"jbt-staging-{RUN}"])
    yield proc
    assert proc.stop() == 0, proc.log()


def _connect(bridge: BridgeProcess, via: TcpProxy | None = None) -> pika.BlockingConnection:
    port = bridge.amqp_port if via is None else via.port  # type: ignore[attr-defined]
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", port, heartbeat=0, credentials=pika.PlainCredentials("guest", "guest")))


@pytest.fixture
def dropper(amqp_bridge: BridgeProcess) -> Iterator[TcpProxy]:
    """A TCP proxy in front of the bridge: ``cut()`` drops the clients connected through it
    with no close of a channel or the connection, as a client process that dies does."""
    proxy = TcpProxy(("127.0.0.1", amqp_bridge.amqp_port))  # type: ignore[attr-defined]
    yield proxy
    proxy.close()


def _queue(kind: str) -> str:
    return f"jbt-aq-{RUN}-{kind}.{uuid.uuid4().hex[:8]}"


class Inbox:
    """A pika consumer on one channel: what it was handed, in order."""

    def __init__(self, conn: pika.BlockingConnection, channel: Any, queue: str,
                 prefetch: int = 10, auto_ack: bool = False) -> None:
        self.conn = conn
        self.got: list[tuple[Any, Any, bytes, float]] = []
        channel.basic_qos(prefetch_count=prefetch)
        self.tag = channel.basic_consume(queue, self._on, auto_ack=auto_ack)

    def _on(self, _ch: Any, method: Any, props: Any, body: bytes) -> None:
        self.got.append((method, props, body, time.monotonic()))

    def take(self, n: int, timeout: float = 10.0) -> list[tuple[Any, Any, bytes, float]]:
        deadline = time.monotonic() + timeout
        while len(self.got) < n and time.monotonic() < deadline:
            self.conn.process_data_events(time_limit=0.05)
        taken, self.got = self.got[:n], self.got[n:]
        return taken

    def quiet(self, seconds: float) -> list[Any]:
        self.conn.process_data_events(time_limit=seconds)
        extra, self.got = self.got, []
        return extra


def _send(bridge: BridgeProcess, queue: str, bodies: list[bytes],
          props: pika.BasicProperties | None = None) -> None:
    conn = _connect(bridge)
    channel = conn.channel()
    channel.confirm_delivery()
    channel.queue_declare(queue, durable=True)
    for body in bodies:
        channel.basic_publish("", queue, body, props or pika.BasicProperties())
    conn.close()


def _count(props: Any) -> int:
    return int((props.headers or {}).get("JMSXDeliveryCount", 1))  # a first delivery: none


TYPED = {"i": 7, "big": 2**40, "neg": -3, "s": "text", "t": True, "f": False,
         "x": b"\x00\x01bytes", "d": decimal.Decimal("1.25"),
         "ts": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC), "nested": {"k": 1, "v": "w"},
         "list": [1, "two"]}


def test_nacks_follow_the_policy_with_counts_delays_and_a_dead_letter(
    amqp_bridge: BridgeProcess,
) -> None:
    queue = _queue("slow")
    destination = f"/amq/queue/{queue}"
    _, policy = TABLE.lookup(destination)
    props = pika.BasicProperties(headers=TYPED, content_type="application/x-test",
                                 delivery_mode=1, priority=3, message_id="M-nack")
    _send(amqp_bridge, queue, [b"poison"], props)
    conn = _connect(amqp_bridge)
    channel = conn.channel()
    inbox = Inbox(conn, channel, queue)
    failures, nacked_at = 0, 0.0
    while True:
        got = inbox.take(1)
        assert got, f"delivery {failures + 1} never came; log:\n{amqp_bridge.log()[-3000:]}"
        method, received, body, at = got[0]
        assert body == b"poison" and _count(received) == failures + 1
        assert received.content_type == "application/x-test" and received.priority == 3
        typed = {k: v for k, v in received.headers.items() if k in TYPED}
        assert typed == TYPED, typed  # the copies keep the table's types
        if failures:
            action = decide(policy, failures, destination, {}, 0.5)
            assert isinstance(action, Redeliver)
            assert (at - nacked_at) * 1000 >= action.delay_ms - 2
        failures += 1
        nacked_at = time.monotonic()
        if failures % 2:
            channel.basic_nack(method.delivery_tag, requeue=True)
        else:
            channel.basic_reject(method.delivery_tag, requeue=True)
        if not isinstance(decide(policy, failures, destination, {}, 0.5), Redeliver):
            break
    assert inbox.quiet(0.3) == []
    action = decide(policy, failures, destination, {}, 0.5)
    assert isinstance(action, Move) and action.destination == f"/queue/{queue}.dlq"
    dead = channel.basic_get(f"{queue}.dlq", auto_ack=True)
    assert dead[0] is not None, "nothing on the dead-letter queue"
    h = dead[1].headers
    assert dead[2] == b"poison"
    assert h[envelope.REASON] == "MQRC_BACKOUT_THRESHOLD_REACHED"
    assert h[envelope.ORIGINAL_DESTINATION] == destination
    assert h[envelope.DELIVERIES_TRIED] == str(failures) and envelope.DELIVERY_COUNT not in h
    assert {k: v for k, v in h.items() if k in TYPED} == TYPED
    assert dead[1].delivery_mode == 1 and dead[1].message_id == "M-nack"
    channel.queue_delete(f"{queue}.dlq")
    channel.queue_delete(queue)
    conn.close()


def test_a_multiple_nack_fails_every_delivery_up_to_its_tag_and_tags_stay_the_clients(
    amqp_bridge: BridgeProcess,
) -> None:
    queue = _queue("now")
    _send(amqp_bridge, queue, [b"a", b"b", b"c"])
    conn = _connect(amqp_bridge)
    channel = conn.channel()
    inbox = Inbox(conn, channel, queue)
    first = inbox.take(3)
    assert [b for _, _, b, _ in first] == [b"a", b"b", b"c"]
    assert [m.delivery_tag for m, *_ in first] == [1, 2, 3]
    channel.basic_nack(2, multiple=True, requeue=True)
    again = inbox.take(2)
    assert sorted(b for _, _, b, _ in again) == [b"a", b"b"]
    assert [_count(p) for _, p, _, _ in again] == [2, 2]
    assert [m.delivery_tag for m, *_ in again] == [4, 5]  # the broker's own numbering
    channel.basic_ack(3)  # still the client's tag for "c"
    channel.basic_ack(5, multiple=True)
    assert inbox.quiet(0.4) == []
    channel.queue_delete(queue)
    opened = amqp_bridge.metric("jms_bridge_amqp_channels_total")
    conn.close()
    # The bridge's own channel (it published the copies) is not counted as the client's.
    assert amqp_bridge.metric("jms_bridge_amqp_channels_total") == opened
    deadline = time.monotonic() + 5
    while amqp_bridge.metric("jms_bridge_amqp_channels_open") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert amqp_bridge.metric("jms_bridge_amqp_channels_open") == 0


def test_recover_rollback_and_a_transactional_nack_are_failures(
    amqp_bridge: BridgeProcess,
) -> None:
    queue = _queue("now")
    _send(amqp_bridge, queue, [b"r"])
    conn = _connect(amqp_bridge)
    channel = conn.channel()
    inbox = Inbox(conn, channel, queue)
    (_, props, _, _), = inbox.take(1)
    assert _count(props) == 1
    channel.basic_recover(requeue=True)
    (method, props, _, _), = inbox.take(1)
    assert _count(props) == 2
    channel.tx_select()
    channel.basic_ack(method.delivery_tag)
    channel.tx_rollback()
    (method, props, _, _), = inbox.take(1)
    assert _count(props) == 3
    channel.basic_nack(method.delivery_tag, requeue=True)
    assert inbox.quiet(0.4) == []  # kept back until the commit
    channel.tx_commit()
    (method, props, _, _), = inbox.take(1)
    assert _count(props) == 4
    channel.basic_ack(method.delivery_tag)
    channel.tx_commit()
    assert inbox.quiet(0.4) == []
    assert channel.queue_declare(queue, passive=True).method.message_count == 0
    channel.queue_delete(queue)
    conn.close()


@pytest.mark.parametrize("kind", ["later", "now"])
@pytest.mark.parametrize("how", ["channel-close", "connection-close", "socket-drop"])
def test_unacked_deliveries_of_a_closed_channel_or_connection_are_failures(
    amqp_bridge: BridgeProcess, dropper: TcpProxy, how: str, kind: str,
) -> None:
    """A delayed redelivery is the bridge's copy (through the staging queues); a redelivery
    at once is left to the broker's requeue when the consumer leaves (a copy put then could be
    dispatched to the departing consumer itself), counted by the redelivered flag."""
    queue = _queue(kind)
    _send(amqp_bridge, queue, [b"left"])
    conn = _connect(amqp_bridge, via=dropper)
    channel = conn.channel()
    inbox = Inbox(conn, channel, queue)
    assert [b for _, _, b, _ in inbox.take(1)] == [b"left"]
    if how == "channel-close":
        channel.close()
    elif how == "connection-close":
        conn.close()
    else:
        dropper.cut()  # the client dies without closing anything
    other = _connect(amqp_bridge)
    ch2 = other.channel()
    inbox2 = Inbox(other, ch2, queue)
    got = inbox2.take(1)
    assert [b for _, _, b, _ in got] == [b"left"], amqp_bridge.log()[-3000:]
    assert _count(got[0][1]) == 2
    # later: the bridge's copy, through the staging queues; now: the broker's requeue
    assert got[0][0].redelivered is (kind == "now")
    ch2.basic_ack(got[0][0].delivery_tag)
    assert inbox2.quiet(0.3) == []
    ch2.queue_delete(queue)
    other.close()
    if how == "channel-close":
        conn.close()


def test_get_ok_is_stamped_and_auto_ack_consumers_too(amqp_bridge: BridgeProcess) -> None:
    queue = _queue("now")
    _send(amqp_bridge, queue, [b"g", b"h"])
    conn = _connect(amqp_bridge)
    channel = conn.channel()
    method, props, body = channel.basic_get(queue, auto_ack=False)
    assert body == b"g" and _count(props) == 1
    channel.basic_reject(method.delivery_tag, requeue=True)
    inbox = Inbox(conn, channel, queue, auto_ack=True)
    got = inbox.take(2)
    assert sorted((b, _count(p)) for _, p, b, _ in got) == [(b"g", 2), (b"h", 1)]
    channel.queue_delete(queue)
    conn.close()


def test_reject_without_requeue_is_the_brokers_own_dead_lettering(
    amqp_bridge: BridgeProcess,
) -> None:
    queue = _queue("now")
    conn = _connect(amqp_bridge)
    channel = conn.channel()
    channel.queue_declare(f"{queue}.x", durable=True)
    channel.queue_declare(queue, durable=True, arguments={
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": f"{queue}.x"})
    channel.confirm_delivery()
    channel.basic_publish("", queue, b"dlx")
    method, _, _ = channel.basic_get(queue)
    channel.basic_reject(method.delivery_tag, requeue=False)
    time.sleep(0.2)
    method, props, body = channel.basic_get(f"{queue}.x", auto_ack=True)
    assert body == b"dlx" and "x-death" in props.headers  # RabbitMQ's, not the bridge's
    channel.queue_delete(f"{queue}.x")
    channel.queue_delete(queue)
    conn.close()


def test_a_copy_the_broker_refuses_leaves_the_message_on_its_queue(
    amqp_bridge: BridgeProcess,
) -> None:
    queue = _queue("bad")
    _send(amqp_bridge, queue, [b"kept"])
    conn = _connect(amqp_bridge)
    channel = conn.channel()
    method, _, _ = channel.basic_get(queue)
    channel.basic_nack(method.delivery_tag, requeue=True)  # its move fails: 404 exchange
    method, props, body = channel.basic_get(queue)
    assert body == b"kept" and method.redelivered
    assert _count(props) == 2
    channel.basic_ack(method.delivery_tag)
    assert "copy refused" in amqp_bridge.log()
    channel.queue_delete(queue)
    conn.close()


def test_consuming_a_staging_queue_is_refused_with_403(amqp_bridge: BridgeProcess) -> None:
    conn = _connect(amqp_bridge)
    channel = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.basic_consume(f"{amqp_bridge.staging_prefix}.L3",
                              lambda *a: None)
    assert closed.value.reply_code == 403
    assert closed.value.reply_text.startswith("MQRC_NOT_AUTHORIZED (2035)")
    channel = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.basic_get(f"{amqp_bridge.staging_prefix}.L3")
    assert closed.value.reply_code == 403
    queue = _queue("now")
    conn.channel().queue_declare(queue, auto_delete=True)  # the connection goes on
    conn.close()


def test_a_delayed_publish_keeps_the_header_tables_types(
    amqp_bridge: BridgeProcess, tmp_path: Path,
) -> None:
    queue = _queue("now")
    conn = _connect(amqp_bridge)
    channel = conn.channel()
    channel.queue_declare(queue, durable=True)
    channel.confirm_delivery()
    props = pika.BasicProperties(headers={**TYPED, "x-delay": 300}, delivery_mode=1,
                                 app_id="typed", timestamp=1700000000)
    channel.basic_publish("", queue, b"typed", props)
    inbox = Inbox(conn, channel, queue, auto_ack=True)
    (method, released, body, _), = inbox.take(1)
    assert body == b"typed"
    assert {k: v for k, v in released.headers.items() if k in TYPED} == TYPED
    assert "x-delay" not in released.headers
    assert not any(k.startswith("x-jms-bridge") for k in released.headers)
    assert released.delivery_mode == 1 and released.app_id == "typed"
    assert released.timestamp == 1700000000
    channel.queue_delete(queue)
    conn.close()


def test_a_quorum_queues_own_redeliveries_are_counted(amqp_bridge: BridgeProcess) -> None:
    """RabbitMQ redelivered it on its own (a consumer straight on 5672 requeued it twice): the
    quorum queue's x-delivery-count is counted, and the redelivered flag not twice."""
    queue = _queue("now")
    direct = pika.BlockingConnection(pika.URLParameters(BROKERS["rabbitmq"].amqp_url or ""))
    channel = direct.channel()
    channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
    channel.confirm_delivery()
    channel.basic_publish("", queue, b"q")
    for _ in range(2):
        method = None
        deadline = time.monotonic() + 5
        while method is None and time.monotonic() < deadline:
            method, _, _ = channel.basic_get(queue)
        assert method is not None
        channel.basic_nack(method.delivery_tag, requeue=True)
    conn = _connect(amqp_bridge)
    inbox = Inbox(conn, conn.channel(), queue)
    (method, props, body, _), = inbox.take(1)
    assert body == b"q" and props.headers.get("x-delivery-count") == 2
    assert _count(props) == 3
    conn.close()
    channel.queue_delete(queue)
    direct.close()


@pytest.mark.parametrize("how", ["channel-close", "socket-drop"])
def test_a_lost_transaction_is_rolled_back_and_its_deliveries_are_failures(
    amqp_bridge: BridgeProcess, dropper: TcpProxy, how: str,
) -> None:
    """A consumer in a transaction acks and publishes, then goes away without a commit: the
    ack is undone (the delivery fails: JMSXDeliveryCount 2 next time) and the publish never
    happens; the bridge's own acknowledgements are committed on their own."""
    queue, other = _queue("later"), _queue("now")  # later: a staged copy, not a requeue
    _send(amqp_bridge, queue, [b"tx-lost"])
    conn = _connect(amqp_bridge, via=dropper)
    channel = conn.channel()
    channel.queue_declare(other, durable=True)
    channel.tx_select()
    inbox = Inbox(conn, channel, queue)
    (method, _, _, _), = inbox.take(1)
    channel.basic_ack(method.delivery_tag)
    channel.basic_publish("", other, b"never committed")
    if how == "channel-close":
        channel.close()
    else:
        dropper.cut()  # the client dies without closing anything
    again = _connect(amqp_bridge)
    ch2 = again.channel()
    inbox2 = Inbox(again, ch2, queue)
    got = inbox2.take(1)
    assert [b for _, _, b, _ in got] == [b"tx-lost"], amqp_bridge.log()[-3000:]
    assert _count(got[0][1]) == 2
    assert not got[0][0].redelivered  # the bridge's copy, not the broker's requeue
    ch2.basic_ack(got[0][0].delivery_tag)
    assert ch2.queue_declare(other, passive=True).method.message_count == 0
    assert inbox2.quiet(0.3) == []
    ch2.queue_delete(queue)
    ch2.queue_delete(other)
    again.close()
    if how == "channel-close":
        conn.close()


def test_a_delete_policy_deletes_the_failed_delivery(amqp_bridge: BridgeProcess) -> None:
    queue = _queue("delete")
    _send(amqp_bridge, queue, [b"gone"])
    conn = _connect(amqp_bridge)
    channel = conn.channel()
    method, props, body = channel.basic_get(queue)
    assert body == b"gone" and _count(props) == 1
    channel.basic_reject(method.delivery_tag, requeue=True)
    time.sleep(0.3)
    assert channel.basic_get(queue)[0] is None  # acknowledged upstream, nothing put back
    assert channel.queue_declare(queue, passive=True).method.message_count == 0
    channel.queue_delete(queue)
    conn.close()


def _leave(conn: pika.BlockingConnection, channel: Any, inbox: Inbox, how: str,
           dropper: TcpProxy) -> None:
    """The consumer cancels, then goes away as ``how`` says, its delivery unacknowledged."""
    channel.basic_cancel(inbox.tag)
    if how == "cancel-channel-close":
        channel.close()
        conn.close()  # after the channel: its closing is what settles the delivery
    elif how == "cancel-connection-close":
        conn.close()
    else:
        dropper.cut()  # the client dies without closing anything


def _copies(bridge: BridgeProcess, queue: str, first: float, via: TcpProxy,
            ) -> tuple[pika.BlockingConnection, Any, Inbox, list[tuple[Any, Any, bytes, float]]]:
    """A new consumer of ``queue`` (connected through ``via``) and every delivery it gets: the
    first within ``first`` seconds, then any others within 1.5 s of it (so a second copy would
    be seen)."""
    conn = _connect(bridge, via=via)
    channel = conn.channel()
    inbox = Inbox(conn, channel, queue)
    got = inbox.take(1, timeout=first)
    if got:
        got += inbox.take(5, timeout=1.5)
    return conn, channel, inbox, got


def _methods(data: bytes) -> list[tuple[int, Any]]:
    """(channel, method) of each method frame in one direction of a recorded AMQP connection."""
    pos = 8 if data.startswith(b"AMQP") else 0  # the protocol header
    found = []
    while pos + 8 <= len(data):
        size = int.from_bytes(data[pos + 3:pos + 7], "big")
        if len(data) < pos + 8 + size:
            break
        if data[pos] == 1:
            _, channel, method = pframe.unmarshal(data[pos:pos + 8 + size])
            found.append((channel, method))
        pos += 8 + size
    return found


def test_a_lost_clients_acknowledgements_are_applied_before_its_upstream_connection_closes(
    tmp_path: Path,
) -> None:
    """Once the copies of a lost client's deliveries are confirmed, the bridge acknowledges
    the originals and closes the client's upstream connection with Connection.Close, waiting
    for Close-Ok. A socket closed at once can undo that acknowledgement: RabbitMQ stops a
    channel on a closed socket ahead of frames it has not yet worked through, and would
    deliver the original again beside its copy (seen under load as two copies, each
    delivery count 2)."""
    watched = TcpProxy(("127.0.0.1", 5672), record=True)
    bridge = _started(tmp_path, ["--upstream-amqp",
                                 f"amqp://guest:guest@127.0.0.1:{watched.port}/%2F"])
    dropper = TcpProxy(("127.0.0.1", bridge.amqp_port))  # type: ignore[attr-defined]
    queue = _queue("unsettled-weblogic")
    try:
        _send(bridge, queue, [b"unsettled"])
        conn, channel, inbox, got = _copies(bridge, queue, 10, dropper)
        assert [(b, _count(p)) for _, p, b, _ in got] == [(b"unsettled", 1)]
        dropper.cut()
        conn, channel, inbox, got = _copies(bridge, queue, 10, dropper)
        assert [(_count(p), m.redelivered) for m, p, _, _ in got] == [(2, False)]
        channel.queue_delete(queue)
        conn.close()
        # The lost client's upstream connection: the one that consumed first from the queue.
        consumed = [pair for pair in watched.recorded if any(
            isinstance(m, commands.Basic.Consume) and m.queue == queue
            for _, m in _methods(bytes(pair[0])))]
        up, down = (_methods(bytes(b)) for b in consumed[0])
        names = [type(m).__name__ for _, m in up]
        assert names[-3:] == ["Publish", "Ack", "Close"], names  # the copy, the original's ack
        assert isinstance(up[-1][1], commands.Connection.Close) and up[-1][0] == 0, up[-3:]
        assert isinstance(down[-1][1], commands.Connection.CloseOk), down[-3:]
    finally:
        dropper.close()
        assert bridge.stop() == 0, bridge.log()
        watched.close()


@pytest.mark.parametrize("how", ["cancel-channel-close", "cancel-connection-close",
                                 "cancel-socket-drop"])
@pytest.mark.parametrize("kind", ["weblogic", "websphere"])
def test_a_cancelled_consumers_unacked_deliveries_fail_once_when_it_leaves(
    amqp_bridge: BridgeProcess, dropper: TcpProxy, kind: str, how: str,
) -> None:
    """Basic.Cancel leaves a channel's deliveries the client's (it may still ack them); the
    channel or connection that closes after it fails them, once: after each leaving exactly one
    copy is on the queue (WebLogic: the bridge's staged copy; WebSphere: RabbitMQ's requeue),
    and the second moves it: one copy on the error queue, none on the queue."""
    queue = _queue(f"unsettled-{kind}")
    destination = f"/amq/queue/{queue}"
    _, policy = TABLE.lookup(destination)
    _send(amqp_bridge, queue, [b"unsettled"])
    conn, channel, inbox, got = _copies(amqp_bridge, queue, 10, dropper)
    assert [(b, _count(p)) for _, p, b, _ in got] == [(b"unsettled", 1)]
    opened = [conn]
    try:
        for failures in (1, 2):
            action = decide(policy, failures, destination, {}, 0.5)
            if how == "cancel-socket-drop":
                opened.remove(conn)  # pika cannot close what it lost
            _leave(conn, channel, inbox, how, dropper)
            conn, channel, inbox, got = _copies(amqp_bridge, queue, 10 if failures == 1 else 1.5,
                                                dropper)
            opened.append(conn)
            counts = [_count(p) for _, p, _, _ in got]
            if failures == 1:
                assert isinstance(action, Redeliver)
                assert counts == [2], (f"{kind} {how}: copies on the queue {counts}: " + ", ".join(
                    f"redelivered={m.redelivered} headers={p.headers}" for m, p, _, _ in got))
                # weblogic: the bridge's copy, through the staging queues; websphere: a requeue
                assert got[0][0].redelivered is (action.delay_ms == 0)
                continue
            assert isinstance(action, Move)
            assert counts == [], f"{kind} {how}: copies left on the queue {counts}"
            dead_queue = action.destination.rsplit("/", 1)[1]
            dead = []
            while (found := channel.basic_get(dead_queue, auto_ack=True))[0] is not None:
                if found[2] == b"unsettled" and found[1].headers.get(
                        envelope.ORIGINAL_DESTINATION) == destination:
                    dead.append(found)
            assert len(dead) == 1, f"{kind} {how}: {len(dead)} copies on {dead_queue}"
            assert dead[0][1].headers[envelope.DELIVERIES_TRIED] == "2"
            channel.queue_delete(queue)
    finally:
        for c in opened:
            if c.is_open:
                c.close()

"""The broker away, at start and later, through a TCP proxy that refuses connections as a
stopped broker does: the bridge starts and stays up, says why it is not ready, answers a
CONNECT with an ERROR naming the broker, and relays and releases by itself once the broker
answers, with every receipted message delivered once at most late, never early."""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pika
import pytest
import stomp

from adapters import activemq, rabbitmq
from bridge.staging.levels import layout_for
from tests.integration.bridgeproc import BridgeProcess, free_port, wait_port
from tests.integration.brokers import BROKERS, Broker, require
from tests.integration.clients import Inbox, connect
from tests.integration.staging_util import clean
from tests.integration.tcpproxy import Away
from tests.integration.test_staging_guarantees import Arrivals, now_ms


@contextmanager
def bridge_before_broker(broker: Broker, tmp: Path, *, accepting: bool = False,
                         hold_s: float = 0.0) -> Iterator[tuple[BridgeProcess, Away]]:
    away = Away(broker, accepting=accepting, hold_s=hold_s)
    fmt = {"rabbitmq": rabbitmq.FORMAT, "activemq": activemq.FORMAT}[broker.name]
    layout = layout_for(fmt, f"jbt-staging-{uuid.uuid4().hex[:8]}")
    bridge = BridgeProcess(broker.name, f"127.0.0.1:{away.stomp_port}", tmp / "bridge.log",
                           extra=["--staging-prefix", layout.prefix, *away.extra])
    try:
        yield bridge, away
    finally:
        code = bridge.stop()
        away.close()
        clean(broker, layout)
        assert code == 0, f"bridge exited {code} on SIGTERM; log:\n{bridge.log()[-3000:]}"


def connect_error(port: int, broker: Broker) -> stomp.utils.Frame:
    """A CONNECT through the bridge, answered by an ERROR frame (not a CONNECTED)."""
    conn = stomp.Connection12([("127.0.0.1", port)], heartbeats=(0, 0), vhost="/")
    inbox = Inbox()
    conn.set_listener("inbox", inbox)
    with pytest.raises(stomp.exception.ConnectFailedException):
        conn.connect(broker.user, broker.password, wait=True)
    error = inbox.wait_error(timeout=5)
    assert error is not None
    return error


def collect_all(arrivals: Arrivals, due: dict[str, int], timeout: float) -> None:
    """Until every message has arrived (then a moment for duplicates), or ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(arrivals.seen[s] == 0 for s in due):
        arrivals.collect(time.monotonic() + 0.2)
    arrivals.collect(time.monotonic() + 0.5)


def wait_ready(bridge: BridgeProcess, timeout: float) -> float:
    """Seconds until /readyz says 200."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if bridge.http("/readyz")[0] == 200:
            return time.monotonic() - start
        time.sleep(0.05)
    raise AssertionError(f"/readyz not 200 after {timeout} s: {bridge.http('/readyz')}")


def test_a_bridge_started_before_its_broker_waits_for_it(broker: Broker, tmp_path: Path,
                                                        queue: str) -> None:
    dest = broker.queue_destination(queue)
    with bridge_before_broker(broker, tmp_path) as (bridge, away):
        started = time.monotonic()
        bridge.start(ready=False)
        assert bridge.http("/healthz")[0] == 200
        status, body = bridge.http("/readyz")
        assert status == 503 and "not reachable" in json.loads(body)["problem"], body
        error = connect_error(bridge.stomp_port, broker)
        message = error.headers["message"]
        assert message.startswith("MQRC_HOST_NOT_AVAILABLE (2538)"), error.headers
        assert error.headers["reason-code"] == "2538"
        assert broker.name in message and str(away.stomp_port) in message, message
        # The old bridge gave up after about 4 s: this one is still there after that.
        time.sleep(max(0.0, 4.5 - (time.monotonic() - started)))
        assert bridge.proc is not None and bridge.proc.poll() is None, bridge.log()[-2000:]
        assert bridge.http("/readyz")[0] == 503

        away.open()
        print(f"/readyz 200 {wait_ready(bridge, 10):.2f} s after the broker answered")
        arrivals = Arrivals(broker, dest)
        rng = random.Random(11)
        delays = [rng.randint(300, 2500) for _ in range(60)]
        conn, inbox = connect(bridge.stomp_port, broker.user, broker.password)
        due = {}
        for i, d in enumerate(delays):
            due[str(i)] = now_ms() + d
            conn.send(dest, f"m{i}", headers={"x-delay": str(d), "seq": str(i),
                                              "due": str(due[str(i)]), "receipt": f"r{i}"})
        for i in range(60, 70):  # plain ones too
            due[str(i)] = now_ms()
            conn.send(dest, f"m{i}", headers={"seq": str(i), "due": "0", "receipt": f"r{i}"})
        assert all(inbox.wait_receipt(f"r{i}", timeout=15) for i in range(70))
        conn.disconnect()
        collect_all(arrivals, due, 8.0)
        arrivals.close()
    missing = [s for s in due if arrivals.seen[s] == 0]
    duplicates = sum(n - 1 for n in arrivals.seen.values() if n > 1)
    assert not missing, f"{len(missing)} lost: {missing[:10]}"
    assert not arrivals.early, f"released early: {arrivals.early[:10]}"
    assert duplicates == 0


def test_the_broker_going_away_and_coming_back(broker: Broker, tmp_path: Path,
                                               queue: str) -> None:
    """Connected clients get MQRC_CONNECTION_BROKEN, new ones MQRC_HOST_NOT_AVAILABLE; what
    fell due during the outage is released once the broker is back, none early, none lost."""
    dest = broker.queue_destination(queue)
    with bridge_before_broker(broker, tmp_path) as (bridge, away):
        away.open()
        bridge.start()
        wait_ready(bridge, 10)
        arrivals = Arrivals(broker, dest)
        conn, inbox = connect(bridge.stomp_port, broker.user, broker.password)
        delays = [1500 + 40 * i for i in range(40)]  # due 1.5-3.1 s from now: in the outage
        due = {}
        for i, d in enumerate(delays):
            due[str(i)] = now_ms() + d
            conn.send(dest, f"m{i}", headers={"x-delay": str(d), "seq": str(i),
                                              "due": str(due[str(i)]), "receipt": f"r{i}"})
        assert all(inbox.wait_receipt(f"r{i}", timeout=15) for i in range(len(delays)))
        time.sleep(0.5)
        away.refuse()
        cut_at = now_ms()
        error = inbox.wait_error(timeout=5)
        assert error is not None
        assert error.headers["message"].startswith("MQRC_CONNECTION_BROKEN (2009)"), error.headers
        assert error.headers["reason-code"] == "2009"
        assert bridge.http("/readyz")[0] == 503
        assert connect_error(bridge.stomp_port, broker).headers["reason-code"] == "2538"
        time.sleep(max(0.0, (cut_at + 3500 - now_ms()) / 1000))  # all fall due meanwhile
        away.open()
        back_at = now_ms()
        wait_ready(bridge, 10)
        collect_all(arrivals, due, 8.0)
        arrivals.close()
        assert bridge.proc is not None and bridge.proc.poll() is None
    missing = [s for s in due if arrivals.seen[s] == 0]
    duplicates = sum(n - 1 for n in arrivals.seen.values() if n > 1)
    print(f"outage {(back_at - cut_at) / 1000:.1f} s: {len(due)} sent, {len(missing)} missing, "
          f"{duplicates} duplicates, {len(arrivals.early)} early")
    assert not missing, f"{len(missing)} lost: {missing[:10]}"
    assert not arrivals.early, f"released early: {arrivals.early[:10]}"
    # What the engine held when the link went is redelivered to it: a duplicate is possible
    # only for a release whose acknowledgement the cut lost.
    assert duplicates <= len(delays)


def test_amqp_clients_are_told_the_broker_is_away_and_the_connection_limit(
        tmp_path: Path) -> None:
    """The AMQP 0-9-1 listener answers a client it cannot carry with a Connection.Close whose
    text names the reason, the broker away (MQRC_HOST_NOT_AVAILABLE) or a connection limit."""
    rabbit = BROKERS["rabbitmq"]
    require(rabbit)
    amqp_port = free_port()
    with bridge_before_broker(rabbit, tmp_path) as (bridge, away):
        bridge.extra += ["--amqp-listen", f"127.0.0.1:{amqp_port}",
                         "--max-connections-per-address", "2", "--staging-engine", "off"]
        bridge.start(ready=False)
        params = pika.ConnectionParameters("127.0.0.1", amqp_port, connection_attempts=1,
                                           socket_timeout=5)
        with pytest.raises(pika.exceptions.AMQPError) as away_error:
            pika.BlockingConnection(params)
        assert "MQRC_HOST_NOT_AVAILABLE (2538)" in repr(away_error.value), repr(away_error.value)
        away.open()
        wait_ready(bridge, 10)
        held = [pika.BlockingConnection(params) for _ in range(2)]
        with pytest.raises(pika.exceptions.AMQPError) as limit_error:
            pika.BlockingConnection(params)
        assert "--max-connections-per-address" in repr(limit_error.value)
        for conn in held:
            conn.close()


def test_clients_that_connect_while_the_bridge_starts_are_served(
        broker: Broker, tmp_path: Path, queue: str) -> None:
    """A sidecar and its application start together: a CONNECT (and on RabbitMQ an AMQP
    protocol header) sent the moment the bridge's port opens, before its first check of a
    broker that is slow to answer has ended, waits for that check and is served."""
    dest = broker.queue_destination(queue)
    amqp_port = free_port()
    with bridge_before_broker(broker, tmp_path, accepting=True, hold_s=1.5) as (bridge, away):
        if broker.name == "rabbitmq":
            bridge.extra += ["--amqp-listen", f"127.0.0.1:{amqp_port}"]
        bridge.start(ready=False)
        assert bridge.http("/readyz")[0] != 200, "the first check ended before the test began"
        amqp_problem: list[str] = []

        def amqp_client() -> None:
            try:
                assert wait_port(amqp_port, 10, bridge.proc), "no AMQP listener"
                pika.BlockingConnection(pika.ConnectionParameters(
                    "127.0.0.1", amqp_port, connection_attempts=1, socket_timeout=10,
                    blocked_connection_timeout=10)).close()
            except Exception as exc:  # reported by the test's thread
                amqp_problem.append(repr(exc))
        amqp = threading.Thread(target=amqp_client)
        if broker.name == "rabbitmq":
            amqp.start()
        conn, inbox = connect(bridge.stomp_port, broker.user, broker.password)
        conn.subscribe(dest, id="s", ack="auto")
        conn.send(dest, "first", headers={"x-delay" if broker.name == "rabbitmq"
                                          else "AMQ_SCHEDULED_DELAY": "200"}, receipt="r")
        (m,) = inbox.take(1, timeout=15) or [None]
        assert m is not None and m.body == "first", bridge.log()[-2000:]
        conn.disconnect()
        if broker.name == "rabbitmq":
            amqp.join(30)
            assert not amqp_problem, amqp_problem

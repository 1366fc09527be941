"""Redelivery under a crash: 500 messages that each fail three times, the bridge SIGKILLed in the
middle of it, and two bridges sharing the work. Nothing is lost; duplicates are counted and
bounded by what was in flight."""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.bridgeproc import BridgeProcess
from tests.integration.brokers import Broker
from tests.integration.clients import connect

N = 500
FAILS = 3
PREFETCH = 50
RUN = uuid.uuid4().hex[:6]
# Failure 1 back at once, failures 2 and 3 through the staging queues after 100 ms.
POLICY = {f"/queue/jbt-rf-{RUN}.*": "1:100"}


@pytest.fixture
def bridges(broker: Broker, tmp_path: Path) -> Iterator[list[BridgeProcess]]:
    config = tmp_path / "bridge.yaml"
    config.write_text(yaml.safe_dump({"redelivery": POLICY}))
    prefix = f"jbt-rf-staging-{uuid.uuid4().hex[:6]}"
    procs = [BridgeProcess(broker.name, f"{broker.stomp_host}:{broker.stomp_port}",
                           tmp_path / f"bridge{i}.log",
                           extra=["--config", str(config), "--staging-prefix", prefix])
             for i in range(2)]
    for p in procs:
        p.start()
    yield procs
    for p in procs:
        if p.proc is not None and p.proc.poll() is None:
            p.stop()


class FailingConsumer:
    """NACKs each message until its delivery count passes FAILS, then ACKs it."""

    def __init__(self, bridge: BridgeProcess, broker: Broker, dest: str) -> None:
        self.acked: Counter[str] = Counter()
        self.deliveries: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.conn: Any = None
        self.open(bridge, broker, dest)

    def open(self, bridge: BridgeProcess, broker: Broker, dest: str) -> None:
        conn, inbox = connect(bridge.stomp_port, broker.user, broker.password)
        consumer = self

        class Listener:
            def on_message(self, frame: Any) -> None:
                n = frame.body
                with consumer.lock:
                    consumer.deliveries[n] += 1
                try:
                    if int(frame.headers.get("JMSXDeliveryCount", "1")) <= FAILS:
                        conn.nack(frame.headers["ack"])
                    else:
                        conn.ack(frame.headers["ack"])
                        with consumer.lock:
                            consumer.acked[n] += 1
                except Exception:  # noqa: BLE001 - the bridge went away: the broker has it back
                    pass

        conn.set_listener("failing", Listener())
        conn.subscribe(dest, id="f", ack="client-individual",
                       headers={"prefetch-count": str(PREFETCH),
                                "activemq.prefetchSize": str(PREFETCH)})
        self.conn = conn

    def done(self) -> int:
        with self.lock:
            return len(self.acked)


def _wait(until: float, check: Any) -> None:
    while time.monotonic() < until and not check():
        time.sleep(0.1)


def test_redelivery_survives_a_sigkill_of_the_bridge(
    bridges: list[BridgeProcess], broker: Broker,
) -> None:
    first, second = bridges
    dest = f"/queue/jbt-rf-{RUN}.{uuid.uuid4().hex[:8]}"
    producer, inbox = connect(first.stomp_port, broker.user, broker.password)
    for i in range(N):
        producer.send(dest, str(i), headers={"persistent": "true"},
                      **({"receipt": "last"} if i == N - 1 else {}))
    assert inbox.wait_receipt("last", timeout=30)
    producer.disconnect()
    consumer = FailingConsumer(first, broker, dest)
    _wait(time.monotonic() + 60, lambda: consumer.done() >= N // 3)
    assert first.proc is not None
    first.proc.send_signal(signal.SIGKILL)  # the consumer's connection goes with it
    first.proc.wait()
    killed_at_done = consumer.done()
    consumer.open(second, broker, dest)  # carries on through the other bridge
    _wait(time.monotonic() + 120, lambda: consumer.done() >= N)
    time.sleep(1.0)  # duplicates still on their way
    consumer.conn.disconnect()
    lost = [str(i) for i in range(N) if consumer.acked[str(i)] == 0]
    duplicates = sum(n - 1 for n in consumer.acked.values() if n > 1)
    print(f"{broker.name}: {N} messages, killed after {killed_at_done} done; lost {len(lost)}, "
          f"acknowledged twice {duplicates}, deliveries {sum(consumer.deliveries.values())}")
    assert not lost, f"{len(lost)} never acknowledged: {lost[:10]}"
    # In flight at the kill: what the consumer held (the prefetch) and the copies being put.
    assert duplicates <= 2 * PREFETCH
    # Every message that was acknowledged once was delivered at least FAILS + 1 times, unless
    # the kill's own redelivery by the broker counted one more.
    short = [n for n in consumer.acked if consumer.deliveries[n] < FAILS]
    assert not short, short[:10]

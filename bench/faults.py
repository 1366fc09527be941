"""The broker going away and coming back, for each broker in one run: what the bridge does about
the messages it staged.

Its queues are named bench-faults-* (removed at the end). The outage is simulated at the
network: the bridge reaches its broker only through TCP proxies of this script's (STOMP, and on
RabbitMQ AMQP too, for the staging engine); at the outage they drop every connection and refuse
new ones (connection refused, as a stopped broker's port does), then accept again. The brokers
themselves keep running (they are shared).

A producer sends delayed messages through the bridge at --rate per second (delays uniform over
--min-delay..--max-delay ms, a receipt on each: only receipted ones count as sent), from
--before seconds before the outage; it reconnects as soon as the bridge lets it after. A
consumer reads the target queue straight from the broker. Printed per broker: the outage's
length; after the proxies accept again, the time until /readyz answers 200 and until the first
release; sent / lost / duplicated / early; and for the messages that fell due during the
outage, their lateness (arrival - due) and how long after the broker came back they arrived.

Usage:
    .venv/bin/python bench/faults.py --brokers rabbitmq,activemq --outage 10
"""

from __future__ import annotations

import argparse
import collections
import random
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pika  # noqa: E402
import stomp  # noqa: E402

from adapters import activemq, rabbitmq  # noqa: E402
from bridge.staging.levels import layout_for  # noqa: E402
from tests.integration.bridgeproc import BridgeProcess  # noqa: E402
from tests.integration.brokers import BROKERS, Broker  # noqa: E402
from tests.integration.clients import connect  # noqa: E402
from tests.integration.staging_util import clean  # noqa: E402
from tests.integration.tcpproxy import Away  # noqa: E402


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Producer(threading.Thread):
    def __init__(self, bridge: BridgeProcess, broker: Broker, dest: str, args: Any) -> None:
        super().__init__(daemon=True)
        self.bridge, self.broker, self.dest, self.args = bridge, broker, dest, args
        self.due: dict[str, int] = {}  # receipted: seq -> due (epoch ms)
        self.stop = threading.Event()
        self.rng = random.Random(1)

    def run(self) -> None:
        seq = 0
        while not self.stop.is_set():
            try:
                conn, inbox = connect(self.bridge.stomp_port, self.broker.user,
                                      self.broker.password)
            except Exception:  # noqa: BLE001 - the bridge refuses while the broker is away
                time.sleep(0.1)
                continue
            try:
                while not self.stop.is_set() and conn.is_connected():
                    seq += 1
                    delay = self.rng.randint(self.args.min_delay, self.args.max_delay)
                    due = now_ms() + delay
                    conn.send(self.dest, f"m{seq}", headers={
                        "x-delay": str(delay), "seq": str(seq), "due": str(due),
                        "receipt": f"r{seq}"})
                    if inbox.wait_receipt(f"r{seq}", timeout=5):
                        self.due[str(seq)] = due
                    time.sleep(1 / self.args.rate)
            except Exception:  # noqa: BLE001 - cut off mid-send: not receipted, not counted
                pass
            finally:
                try:
                    conn.disconnect()
                except Exception:  # noqa: BLE001
                    pass


class Consumer(stomp.ConnectionListener):
    def __init__(self, broker: Broker, dest: str) -> None:
        self.arrivals: dict[str, list[int]] = collections.defaultdict(list)
        self.conn = stomp.Connection12([(broker.stomp_host, broker.stomp_port)],
                                       heartbeats=(0, 0), vhost="/")
        self.conn.set_listener("c", self)
        self.conn.connect(broker.user, broker.password, wait=True)
        self.conn.subscribe(dest, id="c", ack="auto",
                            headers={"prefetch-count": "1000", "activemq.prefetchSize": "1000"})

    def on_message(self, frame: Any) -> None:
        self.arrivals[frame.headers["seq"]].append(now_ms())


def run(broker: Broker, args: Any) -> dict[str, Any]:
    away = Away(broker)
    fmt = {"rabbitmq": rabbitmq.FORMAT, "activemq": activemq.FORMAT}[broker.name]
    # Not named jbt-...: a test session ending meanwhile deletes the queues named so.
    layout = layout_for(fmt, f"bench-faults-staging-{uuid.uuid4().hex[:8]}")
    target = f"bench-faults-{uuid.uuid4().hex[:8]}"
    dest = f"/queue/{target}"
    bridge = BridgeProcess(broker.name, f"127.0.0.1:{away.stomp_port}",
                           Path(f"/tmp/jbt-faults-{broker.name}-{uuid.uuid4().hex[:6]}.log"),
                           extra=["--staging-prefix", layout.prefix, *away.extra,
                                  *args.bridge_args.split()])
    away.open()
    bridge.start()
    try:
        while bridge.http("/readyz")[0] != 200:
            time.sleep(0.05)
        consumer = Consumer(broker, dest)
        producer = Producer(bridge, broker, dest, args)
        producer.start()
        time.sleep(args.before)
        away.refuse()
        cut_at = now_ms()
        time.sleep(args.outage)
        away.open()
        back_at = now_ms()
        ready_at = None
        while ready_at is None or not any(t >= back_at for ts in consumer.arrivals.values()
                                          for t in ts):
            if ready_at is None and bridge.http("/readyz")[0] == 200:
                ready_at = now_ms()
            if now_ms() - back_at > 30_000:
                break
            time.sleep(0.01)
        time.sleep(args.after)
        producer.stop.set()
        producer.join(10)
        last_due = max(producer.due.values(), default=now_ms())
        while now_ms() < last_due + 30_000 and any(not consumer.arrivals.get(s)
                                                   for s in producer.due):
            time.sleep(0.1)
        time.sleep(1.0)  # for duplicates
        consumer.conn.disconnect()
    finally:
        code = bridge.stop()
        away.close()
        clean(broker, layout)
        if broker.name == "rabbitmq":
            conn = pika.BlockingConnection(pika.URLParameters(broker.amqp_url or ""))
            conn.channel().queue_delete(target)
            conn.close()
    due, arrivals = producer.due, consumer.arrivals
    first_release = min((t for ts in arrivals.values() for t in ts if t >= back_at),
                        default=None)
    lost = [s for s in due if not arrivals.get(s)]
    duplicated = sum(len(arrivals[s]) - 1 for s in due if len(arrivals.get(s, [])) > 1)
    early = [s for s in due if arrivals.get(s) and min(arrivals[s]) < due[s]]
    in_outage = [s for s in due if cut_at <= due[s] < back_at and arrivals.get(s)]
    lateness = [min(arrivals[s]) - due[s] for s in in_outage]
    after_back = [min(arrivals[s]) - back_at for s in in_outage]
    return {
        "broker": broker.name, "outage_s": (back_at - cut_at) / 1000,
        "readyz_s": None if ready_at is None else (ready_at - back_at) / 1000,
        "first_release_s": None if first_release is None else (first_release - back_at) / 1000,
        "sent": len(due), "lost": len(lost), "duplicated": duplicated, "early": len(early),
        "due_in_outage": len(in_outage), "lateness_ms": lateness, "after_back_ms": after_back,
        "exit": code, "log": str(bridge.log_path),
    }


def show(r: dict[str, Any]) -> None:
    def stats(values: list[int]) -> str:
        if not values:
            return "none"
        ordered = sorted(values)
        return (f"p50 {statistics.median(ordered) / 1000:.2f} s, max "
                f"{ordered[-1] / 1000:.2f} s")

    print(f"{r['broker']}: outage {r['outage_s']:.1f} s (proxy links refused); bridge log "
          f"{r['log']}")
    print(f"  after the broker answered again: /readyz 200 in {r['readyz_s']} s, first release "
          f"in {r['first_release_s']} s")
    print(f"  sent (receipted) {r['sent']}, lost {r['lost']}, duplicated {r['duplicated']}, "
          f"early {r['early']}; bridge exit {r['exit']}")
    print(f"  {r['due_in_outage']} fell due during the outage: lateness {stats(r['lateness_ms'])}; "
          f"arrived after the broker was back: {stats(r['after_back_ms'])}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--brokers", default="rabbitmq,activemq")
    parser.add_argument("--outage", type=float, default=10.0, help="seconds")
    parser.add_argument("--before", type=float, default=4.0, help="seconds of sending first")
    parser.add_argument("--after", type=float, default=4.0, help="seconds of sending after")
    parser.add_argument("--rate", type=float, default=50.0, help="delayed sends a second")
    parser.add_argument("--min-delay", type=int, default=1000)
    parser.add_argument("--max-delay", type=int, default=8000)
    parser.add_argument("--bridge-args", default="", help="extra flags for the bridge")
    args = parser.parse_args(argv)
    results = [run(BROKERS[name], args) for name in args.brokers.split(",")]
    for r in results:
        show(r)
    return 0 if all(r["lost"] == 0 and r["early"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

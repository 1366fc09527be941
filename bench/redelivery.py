"""Redelivery: a consumer that fails every message three times, through the bridge, on each broker.

N messages (default 10,000 of 256 B, each with a `seq` header) are put on a fresh queue straight
to the broker. A stomp.py consumer then subscribes *through the bridge* (client-individual acks,
prefetch --prefetch, default 500) and NACKs every delivery whose JMSXDeliveryCount is at most 3,
then ACKs the fourth. For every redelivery the consumer records the lateness: its arrival minus
(the time the consumer sent the NACK + the delay the policy asks for after that failure, from the
policy model itself). Early = a negative lateness. Three runs per broker:

  plain     the same messages consumed and ACKed at once through the bridge: the baseline;
  default   no policy configured, so JMSJCA's default `3:25; 5:50; 10:100; 20:1000; 50:5000`:
            failures 1-3 are redelivered at once (a copy with the count on the source, then the
            original acked), no staging;
  staged    a policy that delays every failure (Artemis-style, 25 ms x 2: 25, 50, 100 ms), so
            each redelivery is a stage, a release and an ack: the staging path under load.

Throughput = N / (subscribe to the receipt on the last ACK), and its ratio to plain (goal >= 1/4).
The bridge's peak RSS (VmHWM of the bridge and its staging engine) is printed after all runs.

For reference, in the same run on RabbitMQ, the broker's own immediate redelivery straight to the
broker: the consumer NACKs and the broker requeues; the consumer counts deliveries per `seq`
itself, since RabbitMQ's STOMP gives a classic queue no delivery count. ActiveMQ's STOMP offers a
client no redelivery to measure against: a NACK sends the message to its DLQ at once, and what a
rolled-back transaction ACKed is not redispatched to the open subscription (tried: 501 deliveries
of 1,000, then nothing; the prefetch of 500 stays full). Its redelivery plugin needs the broker's
scheduler and applies to JMS clients' rollbacks, which STOMP clients cannot make.

Lateness in those runs counts the wait behind the queue's backlog (a copy goes to the back of its
queue, behind up to N messages). So each policy is also run paced: --paced messages (default
3,000) sent straight to the broker at --rate a second (default 500) while the consumer fails them,
which keeps the queue short: there the lateness is the bridge's own.

Goals: zero early; p99 lateness (paced runs) at most 20 ms; throughput with three redeliveries a
message at least a quarter of plain consume through the bridge.

Usage:
    .venv/bin/python bench/redelivery.py                       # both brokers, 10,000 messages
    .venv/bin/python bench/redelivery.py --brokers rabbitmq --messages 2000 --json out.json
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import stomp
import yaml
from stomp_throughput import (
    BROKERS,
    BenchError,
    Server,
    disconnect,
    free_port,
    parse_address,
    send_phase,
)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from policies.redelivery import Redeliver, compile_table, decide  # noqa: E402

FAILS = 3
STAGED_POLICY = {"dialect": "artemis", "redelivery-delay": 25, "redelivery-delay-multiplier": 2,
                 "max-delivery-attempts": 10}
GOALS = {"early": 0, "p99_ms": 20.0, "ratio": 0.25}
RUNS = ("plain", "default", "staged")
LOG_LEVEL = "warning"


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Failer(stomp.ConnectionListener):
    """NACKs each message until its delivery count passes `fails`, then ACKs it; records when.

    `counted_by_bridge`: the delivery count comes from JMSXDeliveryCount (through the bridge);
    otherwise the listener counts deliveries per `seq` itself (straight to the broker)."""

    def __init__(self, conn: Any, expected: int, fails: int, delays: list[int],
                 counted_by_bridge: bool) -> None:
        self.conn, self.expected, self.fails = conn, expected, fails
        self.delays = delays  # delays[f] = the policy's delay after failure f (ms), f = 1..fails
        self.by_bridge = counted_by_bridge
        self.tally = [0] * expected
        self.nacked_at = [0.0] * expected
        self.lateness: list[float] = []
        self.deliveries = 0
        self.acked = 0
        self.bad_count = 0
        self.done = threading.Event()
        self.error: str | None = None

    def on_message(self, frame: Any) -> None:
        now = time.monotonic()
        h = frame.headers
        self.deliveries += 1
        try:
            seq = int(h["seq"])
            self.tally[seq] += 1
        except (KeyError, ValueError, IndexError):
            self.error = f"a delivery without a valid seq header: {h}"[:400]
            self.done.set()
            return
        count = self.tally[seq]
        if self.by_bridge:
            reported = int(h.get("JMSXDeliveryCount", "1"))  # a first delivery carries none
            if reported != count:
                self.bad_count += 1
                count = reported
        if count > 1 and self.nacked_at[seq]:
            due = self.nacked_at[seq] + self.delays[count - 1] / 1000
            self.lateness.append((now - due) * 1000)
        if count <= self.fails:
            self.nacked_at[seq] = time.monotonic()
            self.conn.nack(h["ack"])
            return
        self.acked += 1
        if self.acked == self.expected:
            self.conn.ack(h["ack"], receipt="all-acked")
        else:
            self.conn.ack(h["ack"])

    def on_receipt(self, frame: Any) -> None:
        if frame.headers.get("receipt-id") == "all-acked":
            self.done.set()

    def on_error(self, frame: Any) -> None:
        self.error = f"ERROR frame: {frame.headers.get('message', '')} {frame.body!r}"[:400]
        self.done.set()

    def on_disconnected(self) -> None:
        if not self.done.is_set():
            self.error = self.error or "connection closed"
            self.done.set()


def consume(address: tuple[str, int], broker: dict[str, Any], queue: str, count: int, fails: int,
            delays: list[int], by_bridge: bool, args: argparse.Namespace,
            rate: float | None = None) -> dict[str, Any]:
    """Consume `count` messages from `queue`, failing each `fails` times. With `rate`, the
    messages are not on the queue yet: a producer sends them straight to the broker at that
    rate once the consumer is subscribed, so the queue stays short and a redelivery's lateness
    is the bridge's, not the wait behind a backlog."""
    conn = stomp.Connection12([address], heartbeats=(0, 0), auto_content_length=True,
                              auto_decode=False, vhost=broker["vhost"])
    listener = Failer(conn, count, fails, delays, by_bridge)
    conn.set_listener("bench", listener)
    try:
        conn.connect(broker["login"], broker["passcode"], wait=True)
    except stomp.exception.StompException as exc:
        raise BenchError(f"cannot connect to {address[0]}:{address[1]}: "
                         f"{listener.error or type(exc).__name__}") from None
    try:
        gc.collect()
        start = time.perf_counter()
        conn.subscribe(f"/queue/{queue}", id="1", ack="client-individual",
                       headers={broker["prefetch_header"]: str(args.prefetch)})
        if rate is not None:
            threading.Thread(target=paced_send, daemon=True,
                             args=(broker, queue, count, args.size, rate)).start()
        last = -1
        while not listener.done.wait(args.stall_s):
            if listener.deliveries == last:
                raise BenchError(f"stalled: {listener.acked}/{count} acked after "
                                 f"{listener.deliveries} deliveries")
            last = listener.deliveries
        elapsed = time.perf_counter() - start
    finally:
        disconnect(conn)
    if listener.error:
        raise BenchError(listener.error)
    late = listener.lateness
    return {
        "messages": count, "deliveries": listener.deliveries, "seconds": round(elapsed, 3),
        "msgs_per_s": round(count / elapsed, 1),
        "deliveries_per_s": round(listener.deliveries / elapsed, 1),
        "redeliveries": len(late), "wrong_count": listener.bad_count,
        "early": sum(1 for v in late if v < 0),
        "lateness_ms": {"min": min(late) if late else None, "p50": percentile(late, 0.50),
                        "p99": percentile(late, 0.99), "max": max(late) if late else None},
    }


def paced_send(broker: dict[str, Any], queue: str, count: int, size: int, rate: float) -> None:
    conn = stomp.Connection12([parse_address(broker["address"])], heartbeats=(0, 0),
                              auto_content_length=True, vhost=broker["vhost"])
    conn.connect(broker["login"], broker["passcode"], wait=True)
    body, start = b"p" * size, time.monotonic()
    for seq in range(count):
        ahead = start + seq / rate - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
        conn.send(f"/queue/{queue}", body, headers={"seq": str(seq)})
    disconnect(conn)


class Bridge(Server):
    def __init__(self, broker_name: str, upstream: str, config: Path, prefix: str,
                 timeout: float) -> None:
        host, port = parse_address(upstream)
        listen, self.admin = free_port(), free_port()
        argv = [sys.executable, "-m", "bridge.app.cli", "run", "--broker", broker_name,
                "--upstream-stomp", f"stomp://{host}:{port}",
                "--stomp-listen", f"127.0.0.1:{listen}",
                "--admin-listen", f"127.0.0.1:{self.admin}", "--log-level", LOG_LEVEL,
                "--staging-prefix", prefix, "--config", str(config)]
        super().__init__("bridge", argv, listen, timeout,
                         ready_url=f"http://127.0.0.1:{self.admin}/readyz")
        self.address = ("127.0.0.1", listen)


def policy_delays(patterns: dict[str, Any], dest: str) -> list[int]:
    """The delay the policy asks for after each of the FAILS failures, index 1..FAILS."""
    _, policy = compile_table(patterns).lookup(dest)
    delays = [0]
    for failure in range(1, FAILS + 1):
        action = decide(policy, failure, dest, {}, 0.5)
        if not isinstance(action, Redeliver):
            raise BenchError(f"the policy for {dest} does not redeliver after failure {failure}")
        delays.append(action.delay_ms)
    return delays


def fill(broker: dict[str, Any], queue: str, args: argparse.Namespace) -> None:
    send_phase(parse_address(broker["address"]), broker, f"/queue/{queue}", args.messages,
               b"r" * args.size, 1000, args.stall_s)


def run_broker(name: str, args: argparse.Namespace) -> dict[str, Any]:
    broker = BROKERS[name]
    run_id = uuid.uuid4().hex[:8]
    patterns: dict[str, Any] = {f"/queue/jbr-{run_id}.staged": STAGED_POLICY,
                                f"/queue/jbr-{run_id}.staged.*": STAGED_POLICY}
    out: dict[str, Any] = {"broker": name, "messages": args.messages, "paced": args.paced,
                           "rate": args.rate}
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "bridge.yaml"
        config.write_text(yaml.safe_dump({"redelivery": patterns}))
        bridge = Bridge(name, broker["address"], config, args.staging_prefix, args.start_timeout)
        try:
            for run in RUNS:
                queue = f"jbr-{run_id}.{run}"
                delays = policy_delays(patterns, f"/queue/{queue}")
                fill(broker, queue, args)
                fails = 0 if run == "plain" else FAILS
                out[run] = consume(bridge.address, broker, queue, args.messages, fails, delays,
                                   True, args)
                out[run]["delays_ms"] = delays[1:] if fails else []
            for run in RUNS[1:]:  # the same policies with the messages coming at a steady pace
                queue = f"jbr-{run_id}.{run}.paced"
                delays = policy_delays(patterns, f"/queue/{queue}")
                out[f"{run} paced"] = consume(bridge.address, broker, queue, args.paced,
                                              FAILS, delays, True, args, args.rate)
                out[f"{run} paced"]["delays_ms"] = delays[1:]
            out["bridge_peak_rss_mb"] = round(bridge.rss(), 1)
        except BenchError as exc:
            raise BenchError(f"{name}: {exc}\n{bridge.output()}") from exc
        finally:
            bridge.stop()
    if name == "rabbitmq":
        queue = f"jbr-{run_id}.broker"
        fill(broker, queue, args)
        out["broker_requeue"] = consume(parse_address(broker["address"]), broker, queue,
                                        args.messages, FAILS, [0] * (FAILS + 1), False, args)
    else:
        out["broker_requeue"] = None
    if name == "rabbitmq":
        names = (*RUNS, "broker", "default.paced", "staged.paced")
        remove_queues([f"jbr-{run_id}.{r}" for r in names])
    return out


def remove_queues(names: list[str]) -> None:
    import pika
    conn = pika.BlockingConnection(pika.URLParameters("amqp://guest:guest@127.0.0.1:5672/%2F"))
    channel = conn.channel()
    for n in names:
        channel.queue_delete(n)
    conn.close()


def fmt(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def summarize(r: dict[str, Any]) -> list[str]:
    plain = r["plain"]["msgs_per_s"]
    print(f"\n== {r['broker']}: {r['messages']:,} messages on the queue (paced runs: "
          f"{r['paced']:,} at {r['rate']:,.0f}/s), each NACKed {FAILS} times then ACKed")
    print(f"{'run':<16}{'msgs/s':>9}{'deliv/s':>9}{'ratio':>7}{'redeliv':>9}{'early':>7}"
          f"{'min ms':>8}{'p50 ms':>8}{'p99 ms':>8}{'max ms':>8}  delays")
    failed = []
    for run in (*RUNS, "broker_requeue", "default paced", "staged paced"):
        x = r[run]
        if x is None:
            print(f"{run:<16}(none: see the docstring)")
            continue
        ratio = x["msgs_per_s"] / plain
        lat = x["lateness_ms"]
        paced = run.endswith("paced")
        print(f"{run:<16}{x['msgs_per_s']:>9,.0f}{x['deliveries_per_s']:>9,.0f}"
              f"{'' if paced else format(ratio, '.2f'):>7}"
              f"{x['redeliveries']:>9,}{x['early']:>7}{fmt(lat['min']):>8}{fmt(lat['p50']):>8}{fmt(lat['p99']):>8}"
              f"{fmt(lat['max']):>8}  {x.get('delays_ms', '')}")
        if run in ("default", "staged") and ratio < GOALS["ratio"]:
            failed.append(f"{run}: throughput ratio {ratio:.2f} < {GOALS['ratio']}")
        if run in ("default", "staged", "default paced", "staged paced"):
            if x["early"] > GOALS["early"]:
                failed.append(f"{run}: {x['early']} early")
            if x["wrong_count"]:
                failed.append(f"{run}: {x['wrong_count']} deliveries with a wrong "
                              "JMSXDeliveryCount")
        if paced and lat["p99"] is not None and lat["p99"] > GOALS["p99_ms"]:
            failed.append(f"{run}: p99 {lat['p99']:.1f} ms > {GOALS['p99_ms']} ms")
    print("(lateness of the runs from a full queue includes the wait behind the queue's backlog:"
          " a copy goes to the back; the paced runs measure the bridge's own)")
    print(f"bridge + engine peak RSS: {r['bridge_peak_rss_mb']} MB")
    print("goals: " + ("met" if not failed else "NOT met: " + "; ".join(failed)))
    return failed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--brokers", default="rabbitmq,activemq")
    p.add_argument("--messages", type=int, default=10_000)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--prefetch", type=int, default=500)
    p.add_argument("--paced", type=int, default=3000,
                   help="messages of the paced runs, where lateness is measured (default 3,000)")
    p.add_argument("--rate", type=float, default=500.0,
                   help="messages a second the paced runs' producer sends (default 500)")
    p.add_argument("--staging-prefix", default="jms-bridge-bench.staging")
    p.add_argument("--start-timeout", type=float, default=30.0)
    p.add_argument("--stall-s", type=float, default=30.0)
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args(argv)
    results, failed = [], []
    for name in args.brokers.split(","):
        try:
            r = run_broker(name, args)
        except BenchError as exc:
            print(f"{name}: {exc}", file=sys.stderr)
            return 1
        results.append(r)
        failed += [f"{name} {f}" for f in summarize(r)]
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

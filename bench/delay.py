"""Delivery delay: release lateness, memory with many pending messages, cost of a delayed send.

Three parts, each on every broker named, each with a fresh bridge subprocess:

a. Lateness. N messages (default 10,000 of 256 B) with delays uniform over 1-10 s are sent through
   the bridge with `x-delay` as fast as stomp.py can write them (no window; one receipt on the
   last). Each carries its due time, `bench_due` = the sender's clock at the send + the delay
   (epoch ms). A consumer subscribed to the target queue *directly on the broker* before the first
   send (ack auto, large prefetch) records each arrival on the same machine clock:
   lateness = arrival - due, early = lateness < 0. The bridge's own histogram
   (jms_bridge_staging_release_lateness_seconds, release time minus the due time it computed) is
   shown next to it, and the p50 lateness of each tenth of the sends in send order: a burst is
   written into the socket faster than anything can read it, so late sends wait to be read, and
   that wait counts. Then a paced run: --a-paced-messages (default 15,000) sent at --a-rate
   (default 1,000/s), so releases climb to that rate and hold it for several seconds (the
   "at 1,000 releases per second" of the goal, without the burst's read-queue wait).
   ``--a-header JMSDeliveryTime`` asks for the delay with the due time itself instead, so
   lateness from the sender holds no wait to be read: 2,000 due over 2 s is
   ``--a-messages 200 --a-paced-messages 2000 --a-min-ms 2000 --a-max-ms 2000``.
   Each run's delays are then run through the broker's own mechanism, as the reference, with the
   same sending and the same consumer:
     - ActiveMQ: AMQ_SCHEDULED_DELAY sent straight to an instance with schedulerSupport="true"
       (STOMP 61624, `scripts/brokers up activemq-scheduler`; started and stopped by this script
       when it does not answer), consumed there.
     - RabbitMQ: per-queue TTL with a dead-letter exchange, its best case: one holding queue per
       distinct delay rounded to 100 ms (91 queues for 1-10 s), each with x-message-ttl = that
       delay, dead-lettering through the default exchange to the target. (Per-message TTL on one
       holding queue only expires at the head, so it cannot do spread delays at all.)
   The burst, and the paced run, are also sent once with no delay, straight to the broker's
   STOMP port and consumed there: the lateness of undelayed messages, what the sending itself
   costs before any delay mechanism (the sender's clock counts the wait in the sockets and in
   the broker). For the paced run that is the floor a release sent at its due time meets.
b. Pending. N messages (default 200,000 of 256 B) with delays uniform over 1 h - 30 days are
   sent through the bridge with a receipt on every 1,000th, waited for before sending on: time
   to stage them all (to the last receipt), and the bridge's peak RSS (VmHWM of its process tree)
   right after and after 30 s more of the staging engine running.
c. Send cost. N messages (default 20,000 of 1 KiB) through the bridge, a receipt on every
   1,000th as in stomp_throughput.py: plain sends against sends with x-delay = 1 h, msgs/s each,
   median over rounds run in rotated order, and the ratio.

The bridge runs with a staging prefix of the benchmark's own (--staging-prefix, default
jms-bridge-bench.staging), so nothing staged by anyone else is read, released or purged. Whatever
a part leaves on the staging queues (b and c leave everything) is removed when the part ends: the
bridge is stopped, then the queues are deleted (RabbitMQ) or drained (ActiveMQ, which removes the
empty queues itself after 5 minutes). Messages found on the benchmark's staging queues at start
(a run that crashed) are purged with a warning, or with --keep-other-staged parts b and c are
skipped and nothing is purged. Target queues are private to the run and removed too.

Goals: zero early; p99 lateness at most 20 ms at 1,000 releases per second; peak RSS at most
150 MB with 200,000 pending; delayed sends at least half as fast as plain sends.

Usage:
    .venv/bin/python bench/delay.py --brokers rabbitmq,activemq
    .venv/bin/python bench/delay.py --brokers rabbitmq --parts a,c --a-messages 2000 \\
        --c-messages 5000 --json out.json
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import random
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pika
import stomp

# Same directory: the bridge subprocess, /proc measurements and the stomp.py helpers.
from stomp_throughput import (
    BROKERS,
    BenchError,
    Server,
    connect,
    disconnect,
    fmt,
    free_port,
    parse_address,
    wait,
)

from bridge.staging.levels import Layout

ROOT = Path(__file__).resolve().parent.parent
SCHEDULER = {"address": "127.0.0.1:61624", "login": "admin", "passcode": "admin",
             "prefetch_header": "activemq.prefetchSize", "vhost": None}
HOUR_MS, DAY_MS = 3_600_000, 86_400_000
GOALS = {"early": 0, "p99_ms": 20.0, "release_rate": 1000.0, "rss_mb": 150.0, "send_ratio": 0.5}


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def staging_queues(prefix: str) -> list[str]:
    queues = {q: None for sl in (False, True) for q in Layout(prefix, second_levels=sl).queues}
    return [*queues, f"{prefix}.invalid"]


def percentile(sorted_values: list[int], q: float) -> int | None:
    """Nearest rank."""
    if not sorted_values:
        return None
    rank = max(1, -(-len(sorted_values) * q // 100))
    return sorted_values[int(rank) - 1]


def cpu_idle(interval: float = 1.0) -> float:
    """The machine's idle share of CPU time over `interval` seconds (/proc/stat)."""
    def sample() -> tuple[int, int]:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return fields[3] + fields[4], sum(fields)  # idle + iowait, all
    idle0, total0 = sample()
    time.sleep(interval)
    idle1, total1 = sample()
    return (idle1 - idle0) / max(total1 - total0, 1)


def wait_quiet(what: str, idle: float = 0.85, limit_s: float = 90.0) -> None:
    """Wait until the machine is mostly idle: a broker still deleting what the run before
    purged takes CPU from the next run's bridge, and its lateness shows it."""
    deadline = time.monotonic() + limit_s
    while (share := cpu_idle()) < idle:
        if time.monotonic() > deadline:
            print(f"  warning: the machine is still {1 - share:.0%} busy; starting {what} anyway",
                  flush=True)
            return
        print(f"  waiting for the machine to settle before {what} ({1 - share:.0%} busy)",
              flush=True)


def vm_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def staging_metrics(admin_port: int) -> dict[str, float]:
    """The bridge's staging samples on /metrics (jms_bridge_staged*, jms_bridge_staging*,
    jms_bridge_catalogue*)."""
    url = f"http://127.0.0.1:{admin_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(("jms_bridge_stag", "jms_bridge_catalogue")):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


# --- the bridge -----------------------------------------------------------------------------------

class Bridge(Server):
    def __init__(self, broker_name: str, args: argparse.Namespace) -> None:
        host, port = parse_address(getattr(args, broker_name))
        listen, self.admin = free_port(), free_port()
        self.argv = [args.bridge_exe, "run", "--broker", broker_name,
                     "--upstream-stomp", f"stomp://{host}:{port}",
                     "--stomp-listen", f"127.0.0.1:{listen}",
                     "--admin-listen", f"127.0.0.1:{self.admin}",
                     "--log-level", "warning", "--staging-prefix", args.staging_prefix,
                     *(getattr(args, "bridge_arg", None) or [])]
        super().__init__("bridge", self.argv, listen, args.start_timeout,
                         ready_url=f"http://127.0.0.1:{self.admin}/readyz")
        self.address = ("127.0.0.1", listen)

    def metrics(self) -> dict[str, float]:
        return staging_metrics(self.admin)


def histogram(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """The bridge's lateness histogram over a part: count, mean, and the bucket bounds that hold
    p50, p99 and the largest value."""
    name = "jms_bridge_staging_release_lateness_seconds"
    buckets = []
    for key, value in after.items():
        m = re.fullmatch(name + r'_bucket\{le="([^"]+)"\}', key)
        if m:
            bound = float("inf") if m.group(1) == "+Inf" else float(m.group(1)) * 1000
            buckets.append((bound, value - before.get(key, 0.0)))
    buckets.sort()
    count = after.get(f"{name}_count", 0.0) - before.get(f"{name}_count", 0.0)
    total = after.get(f"{name}_sum", 0.0) - before.get(f"{name}_sum", 0.0)

    def bound_of(q: float) -> float | None:
        for bound, cumulative in buckets:
            if cumulative >= q * count:
                return bound
        return None

    def counter(metric: str) -> float:
        return after.get(metric, 0.0) - before.get(metric, 0.0)

    return {"count": int(count), "mean_ms": total / count * 1000 if count else None,
            "p50_le_ms": bound_of(0.5) if count else None,
            "p99_le_ms": bound_of(0.99) if count else None,
            "max_le_ms": bound_of(1.0) if count else None,
            "staged": int(counter("jms_bridge_staged_total")),
            "released": int(counter("jms_bridge_staging_released_total"))}


def show_le(bound: float | None) -> str:
    if bound is None:
        return "-"
    return "> 10000" if bound == float("inf") else f"<= {bound:g}"


# --- broker housekeeping --------------------------------------------------------------------------

def amqp(args: argparse.Namespace) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(args.rabbitmq_amqp))


def rabbit_counts(args: argparse.Namespace, queues: list[str]) -> dict[str, int]:
    """Messages ready on each queue that exists."""
    counts = {}
    conn = amqp(args)
    try:
        for q in queues:
            ch = conn.channel()
            try:
                counts[q] = ch.queue_declare(q, passive=True).method.message_count
                ch.close()
            except pika.exceptions.ChannelClosedByBroker:
                pass  # 404: no such queue
    finally:
        conn.close()
    return counts


def rabbit_delete(args: argparse.Namespace, queues: list[str]) -> int:
    """Delete the queues; returns the messages they held."""
    removed = 0
    conn = amqp(args)
    try:
        ch = conn.channel()
        for q in queues:
            removed += ch.queue_delete(q).method.message_count
    finally:
        conn.close()
    return removed


class _Counter(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.count = 0
        self.end = threading.Event()

    def on_message(self, frame: Any) -> None:
        if frame.headers.get("browser") == "end":
            self.end.set()
        else:
            self.count += 1
            self.end.set()


def amq_connect(broker: dict[str, Any], listener: stomp.ConnectionListener) -> Any:
    conn = stomp.Connection12([parse_address(broker["address"])], heartbeats=(0, 0),
                              auto_decode=False)
    conn.set_listener("bench", listener)
    conn.connect(broker["login"], broker["passcode"], wait=True)
    return conn


def amq_nonempty(broker: dict[str, Any], queues: list[str]) -> list[str]:
    """The queues that hold a message, by browsing each until its first message or browser:end."""
    found = []
    for q in queues:
        listener = _Counter()
        conn = amq_connect(broker, listener)
        try:
            conn.subscribe(f"/queue/{q}", id="b", ack="auto", headers={"browser": "true"})
            listener.end.wait(10)
            if listener.count:
                found.append(q)
        finally:
            disconnect(conn)
    return found


def amq_drain(broker: dict[str, Any], queues: list[str], quiet_s: float = 2.0) -> int:
    """Consume everything on the queues; returns how many messages that was."""
    removed = 0
    for _ in range(5):
        listener = _Counter()
        conn = amq_connect(broker, listener)
        try:
            for i, q in enumerate(queues):
                conn.subscribe(f"/queue/{q}", id=str(i), ack="auto",
                               headers={"activemq.prefetchSize": "5000"})
            last, quiet_since = -1, time.monotonic()
            while time.monotonic() - quiet_since < quiet_s:
                if listener.count != last:
                    last, quiet_since = listener.count, time.monotonic()
                time.sleep(0.1)
        finally:
            disconnect(conn)
        removed += listener.count
        if not amq_nonempty(broker, queues):
            return removed
    raise BenchError(f"could not drain {', '.join(queues)}")


def remove_queues(broker_name: str, args: argparse.Namespace, queues: list[str]) -> int:
    if broker_name == "rabbitmq":
        return rabbit_delete(args, queues)
    return amq_drain(broker_config(broker_name, args), queues)


def broker_config(broker_name: str, args: argparse.Namespace) -> dict[str, Any]:
    return {**BROKERS[broker_name], "address": getattr(args, broker_name)}


def leftover_staged(broker_name: str, args: argparse.Namespace) -> int | str:
    """Messages on the benchmark's staging queues before it starts (RabbitMQ: a count; ActiveMQ:
    the names of the queues that are not empty, since counting means consuming)."""
    queues = staging_queues(args.staging_prefix)
    if broker_name == "rabbitmq":
        return sum(rabbit_counts(args, queues).values())
    return ", ".join(amq_nonempty(broker_config(broker_name, args), queues))


# --- part a: lateness -----------------------------------------------------------------------------

class Arrivals(stomp.ConnectionListener):
    """Records the arrival time of each message against the due time it carries."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.arrival = [0] * expected
        self.due = [0] * expected
        # The due time the bridge gave the message when it read the SEND (on a released message,
        # jms-bridge-delivery-time): lateness from the put, as IBM MQ counts a delay from the put.
        self.put_due: list[int | None] = [None] * expected
        self.seen = bytearray(expected)
        self.distinct = self.delivered = self.duplicates = self.unknown = 0
        self.done = threading.Event()
        self.error: str | None = None

    def on_message(self, frame: Any) -> None:
        t = time.time_ns() // 1_000_000
        self.delivered += 1
        try:
            seq = int(frame.headers["bench_seq"])
            due = int(frame.headers["bench_due"])
            fresh = not self.seen[seq]
        except (KeyError, ValueError, IndexError):
            self.unknown += 1
            return
        if not fresh:
            self.duplicates += 1
            return
        self.seen[seq] = 1
        self.arrival[seq], self.due[seq] = t, due
        put_due = frame.headers.get("jms-bridge-delivery-time")
        if put_due is not None:
            self.put_due[seq] = int(put_due)
        self.distinct += 1
        if self.distinct == self.expected:
            self.done.set()

    def on_error(self, frame: Any) -> None:
        self.error = f"ERROR frame: {frame.headers.get('message', '')} {frame.body!r}"[:500]
        self.done.set()

    def on_disconnected(self) -> None:
        if not self.done.is_set():
            self.error = self.error or "consumer connection closed"
            self.done.set()


def lateness_run(consume_at: dict[str, Any], send_at: tuple[str, int], send_as: dict[str, Any],
                 destinations: list[str], target: str, delays: list[int], delay_header: str | None,
                 body: bytes, timeout: float, rate: float | None = None) -> dict[str, Any]:
    """Consume `target` on `consume_at`; send message i to destinations[i] through `send_at`
    with delay_header = delays[i] (if any) and bench_due = now + delays[i]; as fast as the
    client can, or `rate` messages per second."""
    n = len(delays)
    arrivals = Arrivals(n)
    consumer = stomp.Connection12([parse_address(consume_at["address"])], heartbeats=(0, 0),
                                  auto_decode=False, vhost=consume_at["vhost"])
    consumer.set_listener("arrivals", arrivals)
    consumer.connect(consume_at["login"], consume_at["passcode"], wait=True)
    sender, listener = connect(send_at, send_as, 0)
    try:
        consumer.subscribe(f"/queue/{target}", id="1", ack="auto", receipt="subscribed",
                           headers={consume_at["prefetch_header"]: "20000"})
        time.sleep(0.5)  # the subscription is in place (stomp.py's receipt goes to the listener)
        gc.collect()
        send = sender.send
        start = time.perf_counter()
        for i, delay in enumerate(delays):
            if rate:
                pause = start + i / rate - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
            due = now_ms() + delay
            headers = {"bench_seq": str(i), "bench_due": str(due)}
            if delay_header == "JMSDeliveryTime":  # the due time itself, not a delay
                headers[delay_header] = str(due)
            elif delay_header:
                headers[delay_header] = str(delay)
            if i == n - 1:
                listener.receipt_id = headers["receipt"] = "last"
            send(destinations[i], body, headers=headers)
        wait(listener, "the receipt on the last send", timeout)
        send_s = time.perf_counter() - start
        last, latest_due = -1, now_ms() + max(delays)
        while not arrivals.done.wait(timeout):
            if arrivals.delivered == last and now_ms() > latest_due + timeout * 1000:
                break  # nothing for `timeout` s, and everything should have been due by now
            last = arrivals.delivered
    finally:
        disconnect(sender)
        disconnect(consumer)
    by_send = [arrivals.arrival[i] - arrivals.due[i] for i in range(n) if arrivals.seen[i]]
    tenth = max(1, len(by_send) // 10)
    deciles = [percentile(sorted(by_send[k:k + tenth]), 50) for k in range(0, tenth * 10, tenth)]
    late = sorted(by_send)
    from_put = sorted(arrivals.arrival[i] - due for i in range(n)
                      if arrivals.seen[i] and (due := arrivals.put_due[i]) is not None)
    ingest = sorted(due - arrivals.due[i] for i in range(n)
                    if arrivals.seen[i] and (due := arrivals.put_due[i]) is not None)
    got_due = [arrivals.due[i] for i in range(n) if arrivals.seen[i]]
    got_arrival = [arrivals.arrival[i] for i in range(n) if arrivals.seen[i]]
    errors = []
    if arrivals.error:
        errors.append(arrivals.error)
    if arrivals.distinct != n or arrivals.duplicates or arrivals.unknown:
        errors.append(f"received {arrivals.distinct} of {n}, {arrivals.duplicates} duplicates, "
                      f"{arrivals.unknown} without bench_seq/bench_due")
    due_span = (max(got_due) - min(got_due)) / 1000 if len(got_due) > 1 else None
    per_second = collections.Counter(d // 1000 for d in got_due)
    arrival_span = (max(got_arrival) - min(got_arrival)) / 1000 if len(got_arrival) > 1 else None
    return {
        "messages": n, "received": arrivals.distinct, "duplicates": arrivals.duplicates,
        "send_msgs_per_s": n / send_s,
        "due_rate_per_s": len(got_due) / due_span if due_span else None,
        "due_peak_per_s": max(per_second.values(), default=0),
        "arrival_rate_per_s": len(got_arrival) / arrival_span if arrival_span else None,
        "p50_ms": percentile(late, 50), "p99_ms": percentile(late, 99),
        "max_ms": late[-1] if late else None,
        "min_ms": late[0] if late else None, "mean_ms": statistics.fmean(late) if late else None,
        "early": sum(1 for v in late if v < 0), "errors": errors,
        "p50_ms_by_send_decile": deciles, "paced_per_s": rate,
        # Against the due time the bridge set at the put (None where nothing carries it).
        "put_p50_ms": percentile(from_put, 50), "put_p99_ms": percentile(from_put, 99),
        "put_max_ms": from_put[-1] if from_put else None,
        "put_early": sum(1 for v in from_put if v < 0) if from_put else None,
        # How much later the bridge's due time is than the sender's: the wait to be read.
        "read_wait_p50_ms": percentile(ingest, 50),
        "read_wait_max_ms": ingest[-1] if ingest else None,
    }


def part_a(broker_name: str, args: argparse.Namespace, state: dict[str, Any]) -> dict[str, Any]:
    """The burst (as fast as the client can send) and then the paced run (--a-rate/s)."""
    out: dict[str, Any] = {}
    burst = lateness_pair(broker_name, args, state, args.a_messages, None, random.Random(args.seed))
    out["bridge"], out["reference"] = burst["bridge"], burst["reference"]
    out["undelayed"] = undelayed(broker_name, args, args.a_messages)
    if args.a_rate > 0:
        paced = lateness_pair(broker_name, args, state, args.a_paced_messages, args.a_rate,
                              random.Random(args.seed + 1))
        out["bridge_paced"], out["reference_paced"] = paced["bridge"], paced["reference"]
        out["undelayed_paced"] = undelayed(broker_name, args, args.a_paced_messages, args.a_rate)
    return out


def lateness_pair(broker_name: str, args: argparse.Namespace, state: dict[str, Any], n: int,
                  rate: float | None, rng: random.Random) -> dict[str, Any]:
    """The bridge, then the broker's own mechanism, with the same delays and sending."""
    delays = [rng.randint(args.a_min_ms, args.a_max_ms) for _ in range(n)]
    body = b"x" * args.a_size
    broker = broker_config(broker_name, args)
    out: dict[str, Any] = {}
    how = f"paced at {rate:,.0f}/s" if rate else "burst"

    target = f"bench-delay.{uuid.uuid4().hex[:12]}"
    wait_quiet(f"{broker_name} {how} through the bridge")
    bridge = Bridge(broker_name, args)
    try:
        before, cpu0 = bridge.metrics(), bridge.cpu()
        run = lateness_run(broker, bridge.address, broker, [f"/queue/{target}"] * n, target, delays,
                           args.a_header, body, args.timeout, rate)
        time.sleep(0.5)
        run["bridge_histogram"] = histogram(before, bridge.metrics())
        run["bridge_cpu_s"] = bridge.cpu() - cpu0
        run["bridge_peak_rss_mb"] = bridge.rss()
    finally:
        bridge.stop()
        cleanup(broker_name, args, [target] if broker_name == "rabbitmq" else [], state)
    out["bridge"] = run
    report_a(broker_name, f"bridge ({args.a_header}, consumed from the broker), {how}", run)

    try:
        wait_quiet(f"{broker_name} {how} through the broker's own mechanism")
        if broker_name == "rabbitmq":
            ref = rabbit_ttl_reference(args, delays, body, rate)
            label = "RabbitMQ per-queue TTL + DLX, one queue per delay rounded to 100 ms"
        else:
            ref = activemq_scheduler_reference(args, delays, body, state, rate)
            label = "ActiveMQ scheduler (AMQ_SCHEDULED_DELAY, schedulerSupport=true, STOMP 61624)"
        ref["mechanism"] = label
        out["reference"] = ref
        report_a(broker_name, f"{label}, {how}", ref)
    except (BenchError, stomp.exception.StompException, pika.exceptions.AMQPError, OSError) as exc:
        out["reference"] = {"errors": [f"{type(exc).__name__}: {exc}"]}
        print(f"error: {broker_name} reference: {exc}", file=sys.stderr)
    return out


def undelayed(broker_name: str, args: argparse.Namespace, n: int,
              rate: float | None = None) -> dict[str, Any]:
    """The same burst (or paced run) without a delay, sent straight to the broker's STOMP port
    and consumed there: what the sending costs before any delay mechanism, counted the same way
    (arrival minus the sender's clock at the send)."""
    broker = broker_config(broker_name, args)
    target = f"bench-delay.{uuid.uuid4().hex[:12]}"
    how = f"paced at {rate:,.0f}/s" if rate else "burst"
    wait_quiet(f"{broker_name} undelayed {how} straight to the broker")
    try:
        run = lateness_run(broker, parse_address(broker["address"]), broker,
                           [f"/queue/{target}"] * n, target, [0] * n, None,
                           b"x" * args.a_size, args.timeout, rate)
    except (BenchError, stomp.exception.StompException, OSError) as exc:
        print(f"error: {broker_name} undelayed {how}: {exc}", file=sys.stderr)
        return {"errors": [f"{type(exc).__name__}: {exc}"]}
    finally:
        if broker_name == "rabbitmq":
            remove_queues(broker_name, args, [target])
    run["mechanism"] = "no delay, no bridge: the broker's STOMP port"
    report_a(broker_name, f"undelayed sends straight to the broker (the sending's own cost), {how}",
             run)
    return run


def rabbit_ttl_reference(args: argparse.Namespace, delays: list[int], body: bytes,
                         rate: float | None) -> dict[str, Any]:
    run_id = uuid.uuid4().hex[:12]
    target = f"bench-delay.{run_id}"
    rounded = [max(100, round(d / 100) * 100) for d in delays]
    holding = {d: f"bench-ttl.{run_id}.{d}" for d in sorted(set(rounded))}
    conn = amqp(args)
    try:
        ch = conn.channel()
        ch.queue_declare(target, durable=True)  # as the STOMP plugin declares /queue/<target>
        for d, q in holding.items():
            ch.queue_declare(q, durable=True, arguments={
                "x-message-ttl": d, "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": target})
    finally:
        conn.close()
    try:
        run = lateness_run(BROKERS["rabbitmq"] | {"address": args.rabbitmq},
                           parse_address(args.rabbitmq), BROKERS["rabbitmq"],
                           [f"/amq/queue/{holding[d]}" for d in rounded], target,
                           rounded, None, body, args.timeout, rate)
    finally:
        rabbit_delete(args, [target, *holding.values()])
    run["holding_queues"] = len(holding)
    return run


def activemq_scheduler_reference(args: argparse.Namespace, delays: list[int], body: bytes,
                                 state: dict[str, Any], rate: float | None) -> dict[str, Any]:
    address = parse_address(args.scheduler)
    try:
        socket.create_connection(address, timeout=3).close()
    except OSError:
        if not args.start_scheduler:
            raise BenchError(f"the ActiveMQ scheduler instance at {args.scheduler} "
                             f"does not answer; "
                             f"run scripts/brokers up activemq-scheduler") from None
        print("  starting the ActiveMQ scheduler instance: scripts/brokers up activemq-scheduler",
              flush=True)
        done = subprocess.run([str(ROOT / "scripts" / "brokers"), "up", "activemq-scheduler"],
                              capture_output=True, text=True)
        if done.returncode:
            raise BenchError(f"scripts/brokers up activemq-scheduler failed: "
                             f"{(done.stdout + done.stderr).strip()[-1000:]}") from None
        state["started_scheduler"] = True
    broker = {**SCHEDULER, "address": args.scheduler}
    target = f"bench-delay.{uuid.uuid4().hex[:12]}"
    return lateness_run(broker, address, broker, [f"/queue/{target}"] * len(delays), target, delays,
                        "AMQ_SCHEDULED_DELAY", body, args.timeout, rate)


def report_a(broker_name: str, label: str, r: dict[str, Any]) -> None:
    print(f"  {broker_name} a. {label}:\n"
          f"      {r['received']}/{r['messages']} received, sent at {fmt(r['send_msgs_per_s'])}/s, "
          f"due {fmt(r['due_rate_per_s'])}/s, arrived {fmt(r['arrival_rate_per_s'])}/s\n"
          f"      lateness ms: p50 {fmt(r['p50_ms'])}  p99 {fmt(r['p99_ms'])}  "
          f"max {fmt(r['max_ms'])}  "
          f"min {fmt(r['min_ms'])}  mean {fmt(r['mean_ms'], '.1f')}  early {r['early']}\n"
          f"      p50 lateness ms by tenth of the sends, first to last: "
          f"{' '.join(fmt(v) for v in r['p50_ms_by_send_decile'])}", flush=True)
    if r.get("put_p99_ms") is not None:
        print(f"      lateness ms from the due time the bridge set when it read the SEND: "
              f"p50 {fmt(r['put_p50_ms'])}  p99 {fmt(r['put_p99_ms'])}  "
              f"max {fmt(r['put_max_ms'])}  early {r['put_early']}; "
              f"the bridge read the SENDs p50 {fmt(r['read_wait_p50_ms'])}, "
              f"max {fmt(r['read_wait_max_ms'])} ms after they were sent", flush=True)
    h = r.get("bridge_histogram")
    if h:
        print(f"      bridge's histogram: {h['released']} released of {h['staged']} staged, "
              f"mean {fmt(h['mean_ms'], '.1f')} ms, p50 {show_le(h['p50_le_ms'])} ms, "
              f"p99 {show_le(h['p99_le_ms'])} ms, max {show_le(h['max_le_ms'])} ms; "
              f"bridge CPU {r['bridge_cpu_s']:.1f} s, peak RSS {r['bridge_peak_rss_mb']:.1f} MB",
              flush=True)
    for error in r["errors"]:
        print(f"error: {broker_name} a. {label}: {error}", file=sys.stderr)


# --- parts b and c: windowed sends through the bridge ---------------------------------------------

def windowed_send(address: tuple[str, int], broker: dict[str, Any], destination: str, count: int,
                  body: bytes, window: int, timeout: float, delays: list[int] | None = None,
                  delay: int | None = None) -> float:
    """As stomp_throughput.send_phase, with an x-delay header when asked; returns seconds."""
    conn, listener = connect(address, broker, 0)
    send = conn.send
    try:
        gc.collect()
        start = time.perf_counter()
        for first in range(0, count, window):
            last = min(first + window, count) - 1
            for seq in range(first, last + 1):
                headers = {"seq": str(seq)}
                if delays is not None:
                    headers["x-delay"] = str(delays[seq])
                elif delay is not None:
                    headers["x-delay"] = str(delay)
                if seq == last:
                    listener.receipt.clear()
                    listener.receipt_id = headers["receipt"] = f"r{last}"
                send(destination, body, headers=headers)
            wait(listener, f"receipt r{last}", timeout)
        return time.perf_counter() - start
    finally:
        disconnect(conn)


def part_b(broker_name: str, args: argparse.Namespace, state: dict[str, Any]) -> dict[str, Any]:
    rng = random.Random(args.seed + 1)
    n = args.b_messages
    delays = [rng.randint(HOUR_MS, 30 * DAY_MS) for _ in range(n)]
    target = f"bench-delay.{uuid.uuid4().hex[:12]}"
    broker = broker_config(broker_name, args)
    out: dict[str, Any] = {"messages": n, "body_bytes": args.b_size}
    bridge = Bridge(broker_name, args)
    try:
        before, cpu0 = bridge.metrics(), bridge.cpu()
        elapsed = windowed_send(bridge.address, broker, f"/queue/{target}", n, b"x" * args.b_size,
                                args.window, args.timeout, delays=delays)
        out["stage_s"] = elapsed
        out["stage_msgs_per_s"] = n / elapsed
        out["rss_hwm_after_staging_mb"] = bridge.rss()
        out["rss_after_staging_mb"] = vm_rss_mb(bridge.proc.pid)
        print(f"  {broker_name} b. staged {n:,} in {elapsed:.1f} s ({n / elapsed:,.0f}/s), "
              f"peak RSS {out['rss_hwm_after_staging_mb']:.1f} MB; "
              f"engine running {args.b_settle:.0f} s more",
              flush=True)
        time.sleep(args.b_settle)
        out["rss_hwm_after_settle_mb"] = bridge.rss()
        out["rss_after_settle_mb"] = vm_rss_mb(bridge.proc.pid)
        out["bridge_cpu_s"] = bridge.cpu() - cpu0
        h = histogram(before, bridge.metrics())
        out["bridge_staged"], out["bridge_released"] = h["staged"], h["released"]
        if broker_name == "rabbitmq":
            out["pending_on_broker"] = sum(
                rabbit_counts(args, staging_queues(args.staging_prefix)).values())
    finally:
        bridge.stop()
        out["purged"] = cleanup(broker_name, args, [target] if broker_name == "rabbitmq" else [],
                                state)
    out["errors"] = []
    if out["bridge_staged"] != n:
        out["errors"].append(f"the bridge counted {out['bridge_staged']} staged, not {n}")
    if out.get("pending_on_broker", n) != n:
        out["errors"].append(f"{out['pending_on_broker']} pending on the staging queues, not {n}")
    print(f"  {broker_name} b. after {args.b_settle:.0f} s: "
          f"peak RSS {out['rss_hwm_after_settle_mb']:.1f} MB "
          f"(RSS now {out['rss_after_settle_mb']:.1f} MB), bridge CPU {out['bridge_cpu_s']:.1f} s, "
          f"pending on the broker {out.get('pending_on_broker', '-')}, purged {out['purged']:,}",
          flush=True)
    return out


def part_c(broker_name: str, args: argparse.Namespace, state: dict[str, Any]) -> dict[str, Any]:
    n = args.c_messages
    broker = broker_config(broker_name, args)
    body = b"x" * args.c_size
    plain_queue = f"bench-plain.{uuid.uuid4().hex[:12]}"
    delayed_queue = f"bench-delay.{uuid.uuid4().hex[:12]}"
    rates: dict[str, list[float]] = {"plain": [], "delayed": []}
    bridge = Bridge(broker_name, args)
    try:
        if args.warmup:
            windowed_send(bridge.address, broker, f"/queue/{plain_queue}", args.warmup, body,
                          args.window, args.timeout)
            windowed_send(bridge.address, broker, f"/queue/{delayed_queue}", args.warmup, body,
                          args.window, args.timeout, delay=HOUR_MS)
        for rnd in range(args.c_rounds):
            kinds = ["plain", "delayed"] if rnd % 2 == 0 else ["delayed", "plain"]
            for kind in kinds:
                dest = plain_queue if kind == "plain" else delayed_queue
                elapsed = windowed_send(bridge.address, broker, f"/queue/{dest}", n, body,
                                        args.window, args.timeout,
                                        delay=HOUR_MS if kind == "delayed" else None)
                rates[kind].append(n / elapsed)
                print(f"  {broker_name} c. round {rnd + 1} {kind:7} {n / elapsed:>8,.0f} msgs/s",
                      flush=True)
        peak = bridge.rss()
    finally:
        bridge.stop()
        purged = cleanup(broker_name, args, [plain_queue, delayed_queue], state)
    plain, delayed = statistics.median(rates["plain"]), statistics.median(rates["delayed"])
    print(f"  {broker_name} c. median plain {plain:,.0f}/s, delayed {delayed:,.0f}/s, "
          f"ratio {delayed / plain:.3f}; purged {purged:,} (plain and staged)", flush=True)
    return {"messages": n, "body_bytes": args.c_size, "rounds": rates, "plain_msgs_per_s": plain,
            "delayed_msgs_per_s": delayed, "ratio": delayed / plain, "bridge_peak_rss_mb": peak,
            "purged": purged, "errors": []}


def cleanup(broker_name: str, args: argparse.Namespace, targets: list[str],
            state: dict[str, Any]) -> int:
    """After the bridge has stopped: remove the staging queues' messages and the run's targets."""
    if state.get("keep_staged"):
        queues = targets
    else:
        queues = [*staging_queues(args.staging_prefix), *targets]
    return remove_queues(broker_name, args, queues) if queues else 0


# --- the run --------------------------------------------------------------------------------------

PARTS = {"a": part_a, "b": part_b, "c": part_c}


def run_broker(broker_name: str, args: argparse.Namespace, state: dict[str, Any]) -> dict[str, Any]:
    upstream = parse_address(getattr(args, broker_name))
    try:
        socket.create_connection(upstream, timeout=3).close()
    except OSError as exc:
        raise BenchError(f"{broker_name}: STOMP at {upstream[0]}:{upstream[1]} does not answer: "
                         f"{exc}") from exc
    result: dict[str, Any] = {}
    state["keep_staged"] = False
    left = leftover_staged(broker_name, args)
    if left:
        if args.keep_other_staged:
            print(f"warning: {broker_name}: the staging queues {args.staging_prefix}.* "
                  f"hold messages "
                  f"({left}); --keep-other-staged: parts b and c skipped, nothing purged",
                  file=sys.stderr)
            state["keep_staged"] = True
        else:
            removed = remove_queues(broker_name, args, staging_queues(args.staging_prefix))
            print(f"warning: {broker_name}: purged {removed:,} messages left on the staging queues "
                  f"{args.staging_prefix}.* (a run that crashed?)", file=sys.stderr)
    for part in args.parts:
        if state["keep_staged"] and part in "bc":
            result[part] = {"skipped": "staging queues not empty and --keep-other-staged"}
            continue
        try:
            wait_quiet(f"{broker_name} part {part}")
            result[part] = PARTS[part](broker_name, args, state)
        except (BenchError, stomp.exception.StompException, pika.exceptions.AMQPError,
                OSError) as exc:
            print(f"error: {broker_name} part {part}: {type(exc).__name__}: {exc}", file=sys.stderr)
            result[part] = {"errors": [f"{type(exc).__name__}: {exc}"]}
            try:  # never leave a part's staged messages behind
                cleanup(broker_name, args, [], state)
            except Exception as again:  # noqa: BLE001
                print(f"error: {broker_name}: cleaning up after part {part}: {again}",
                      file=sys.stderr)
    return result


def goals(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(goal, measured, verdict) rows."""
    rows = []
    a = result.get("a", {})
    for key, how in (("bridge", "burst of sends"), ("bridge_paced", "paced sends")):
        r = a.get(key)
        if not r or "p99_ms" not in r:
            continue
        rows.append((f"a. released early: 0 ({how})", f"{r['early']}",
                     "met" if r["early"] == 0 and not r["errors"] else "NOT met"))
        rate = r["due_peak_per_s"] or 0
        rows.append((f"a. p99 lateness <= {GOALS['p99_ms']:g} ms ({how})",
                     f"{fmt(r['p99_ms'])} ms, peak {rate:,.0f}/s",
                     ("met" if r["p99_ms"] is not None and r["p99_ms"] <= GOALS["p99_ms"]
                      else "NOT met")
                     + ("" if rate >= 0.9 * GOALS["release_rate"] else " (peak below 1,000/s)")))
        if r.get("put_p99_ms") is not None:
            ok = r["put_p99_ms"] <= GOALS["p99_ms"] and r["put_early"] == 0 and not r["errors"]
            rows.append((f"a. p99 from bridge's due <= {GOALS['p99_ms']:g} ms ({how})",
                         f"{fmt(r['put_p99_ms'])} ms, {r['put_early']} early",
                         "met" if ok else "NOT met"))
    if not rows:
        rows.append(("a. lateness", "-", "not measured"))
    b = result.get("b", {})
    if "rss_hwm_after_settle_mb" in b:
        rss = max(b["rss_hwm_after_staging_mb"], b["rss_hwm_after_settle_mb"])
        rows.append((f"b. peak RSS <= {GOALS['rss_mb']:g} MB with {b['messages']:,} pending",
                     f"{rss:.1f} MB",
                     "met" if rss <= GOALS["rss_mb"] and not b["errors"] else "NOT met"))
    else:
        rows.append(("b. peak RSS with 200,000 pending", "-", "not measured"))
    c = result.get("c", {})
    if "ratio" in c:
        rows.append((f"c. delayed/plain sends >= {GOALS['send_ratio']}", f"{c['ratio']:.3f}",
                     "met" if c["ratio"] >= GOALS["send_ratio"] else "NOT met"))
    else:
        rows.append(("c. delayed/plain sends", "-", "not measured"))
    return rows


def summarize(broker_name: str, result: dict[str, Any]) -> None:
    print(f"\n{broker_name}")
    a = result.get("a", {})
    rows = [(name, a[key]) for name, key in (("bridge", "bridge"), ("reference", "reference"),
                                             ("undelayed", "undelayed"),
                                             ("bridge paced", "bridge_paced"),
                                             ("ref. paced", "reference_paced"),
                                             ("undel. paced", "undelayed_paced"))
            if key in a and "p50_ms" in a[key]]
    if rows:
        print(f"  a. {'path':<14}{'received':>8}{'peak/s':>8}{'p50 ms':>9}{'p99 ms':>9}"
              f"{'max ms':>9}{'early':>7}")
        for name, r in rows:
            print(f"     {name:<14}{r['received']:>8,}{fmt(r['due_peak_per_s']):>8}"
                  f"{fmt(r['p50_ms']):>9}{fmt(r['p99_ms']):>9}{fmt(r['max_ms']):>9}{r['early']:>7}"
                  + (f"   ({r['mechanism']})" if "mechanism" in r else ""))
    b = result.get("b", {})
    if "stage_s" in b:
        print(f"  b. {b['messages']:,} pending ({b['body_bytes']} B, 1 h - 30 d): "
              f"staged in {b['stage_s']:.1f} s "
              f"({b['stage_msgs_per_s']:,.0f}/s); "
              f"peak RSS {b['rss_hwm_after_staging_mb']:.1f} MB after staging, "
              f"{b['rss_hwm_after_settle_mb']:.1f} MB after {ARGS.b_settle:.0f} s more")
    c = result.get("c", {})
    if "ratio" in c:
        print(f"  c. {c['messages']:,} x {c['body_bytes']} B: "
              f"plain {c['plain_msgs_per_s']:,.0f}/s, "
              f"delayed {c['delayed_msgs_per_s']:,.0f}/s, ratio {c['ratio']:.3f}")
    print(f"  {'goal':<52}{'measured':<22}verdict")
    for goal, measured, verdict in goals(result):
        print(f"  {goal:<52}{measured:<22}{verdict}")


ARGS: argparse.Namespace


def main(argv: list[str] | None = None) -> int:
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--brokers", default="rabbitmq,activemq")
    parser.add_argument("--parts", default="a,b,c")
    parser.add_argument("--a-messages", type=int, default=10000)
    parser.add_argument("--a-min-ms", type=int, default=1000)
    parser.add_argument("--a-max-ms", type=int, default=10000)
    parser.add_argument("--a-size", type=int, default=256, help="body bytes in part a")
    parser.add_argument("--a-rate", type=float, default=1000.0,
                        help="send rate of part a's paced run (0: no paced run)")
    parser.add_argument("--a-paced-messages", type=int, default=15000)
    parser.add_argument("--a-header", choices=("x-delay", "JMSDeliveryTime"), default="x-delay",
                        help="how part a asks the bridge for the delay (JMSDeliveryTime: the "
                        "due time itself, so lateness from the sender has no read wait in it)")
    parser.add_argument("--b-messages", type=int, default=200000)
    parser.add_argument("--b-size", type=int, default=256, help="body bytes in part b")
    parser.add_argument("--b-settle", type=float, default=30.0,
                        help="seconds the engine runs after staging before RSS is read again")
    parser.add_argument("--c-messages", type=int, default=20000)
    parser.add_argument("--c-size", type=int, default=1024, help="body bytes in part c")
    parser.add_argument("--c-rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2000,
                        help="untimed sends of each kind before part c")
    parser.add_argument("--window", type=int, default=1000,
                        help="receipt on every N-th send (b, c)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rabbitmq", default=BROKERS["rabbitmq"]["address"], metavar="HOST:PORT")
    parser.add_argument("--rabbitmq-amqp", default="amqp://guest:guest@127.0.0.1:5672/%2F",
                        metavar="URL")
    parser.add_argument("--activemq", default=BROKERS["activemq"]["address"], metavar="HOST:PORT")
    parser.add_argument("--scheduler", default=SCHEDULER["address"], metavar="HOST:PORT",
                        help="ActiveMQ with schedulerSupport=true, for the reference in part a")
    parser.add_argument("--no-start-scheduler", dest="start_scheduler", action="store_false",
                        help="do not run scripts/brokers up activemq-scheduler "
                             "when it does not answer")
    parser.add_argument("--staging-prefix", default="jms-bridge-bench.staging",
                        help="the bridge's staging prefix for the run; its queues are purged")
    parser.add_argument("--keep-other-staged", action="store_true",
                        help="if the staging queues hold messages at start, "
                             "skip b and c instead of purging them")
    parser.add_argument("--bridge-exe", default=str(Path(sys.prefix) / "bin" / "jms-bridge"))
    parser.add_argument("--start-timeout", type=float, default=20.0)
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds without progress")
    parser.add_argument("--json", metavar="FILE")
    args = ARGS = parser.parse_args(argv)
    args.brokers = [b.strip() for b in args.brokers.split(",") if b.strip()]
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    for b in args.brokers:
        if b not in BROKERS:
            parser.error(f"unknown broker {b!r}; choose from {', '.join(BROKERS)}")
    for p in args.parts:
        if p not in PARTS:
            parser.error(f"unknown part {p!r}; choose from {', '.join(PARTS)}")

    report: dict[str, Any] = {"config": {k: v for k, v in vars(args).items() if k != "bridge_exe"},
                              "goals": GOALS, "brokers": {}}
    state: dict[str, Any] = {}
    status = 0
    try:
        for broker_name in args.brokers:
            print(f"{broker_name}: parts {','.join(args.parts)}", flush=True)
            try:
                report["brokers"][broker_name] = run_broker(broker_name, args, state)
            except (BenchError, pika.exceptions.AMQPError, stomp.exception.StompException,
                    OSError) as exc:
                print(f"error: {exc}", file=sys.stderr)
                report["brokers"][broker_name] = {"error": str(exc)}
                status = 1
    finally:
        if state.get("started_scheduler"):
            subprocess.run([str(ROOT / "scripts" / "brokers"), "down", "activemq-scheduler"],
                           capture_output=True)
    for broker_name, result in report["brokers"].items():
        if "error" in result:
            continue
        summarize(broker_name, result)
        for part in result.values():
            for r in (part, part.get("bridge", {}), part.get("reference", {})):
                if r.get("errors"):
                    status = 1
        report["brokers"][broker_name]["goals"] = [
            {"goal": g, "measured": m, "verdict": v} for g, m, v in goals(result)]
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())

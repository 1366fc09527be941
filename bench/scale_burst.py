"""A burst due at once: N messages with the same JMSDeliveryTime, released at the broker's pace?

N persistent messages (default 100,000 of 100 B) are sent through a fresh bridge with one
``JMSDeliveryTime``, far enough ahead that every send is staged before it (``--burst-lead-s``,
or N / 2,500 s + 15 s). Alongside, probes are sent to a second target, one due every 100 ms from
a second before the burst to ``--burst-probe-s`` after it: the other due messages a burst must
not hold up more than it needs itself.

A consumer on the broker itself (pika on RabbitMQ, stomp.py on ActiveMQ, in a process of its own
so the senders do not slow it) subscribed to both targets before the first send records every
arrival against the due time the message carries (``bench_due``, the sender's clock); the
arrival is later than the put to the target by the consumer's lag (it keeps up: its own rate is
printed). (Not ActiveMQ's ``timestamp``: a released message keeps the JMSTimestamp of the
original send, as the rest of the message it was sent as: a message delayed 2 s carries the
time of its send, not of its release.)

Printed: early (arrived before its due time: must be 0), the first and last arrival after the
due time, the rate per 500 ms from the due time on, the bridge's CPU over the burst, the peak
RSS (VmHWM, read before the bridge stops) of the bridge process and of its staging engine
process, its own release-lateness figures, and the probes' lateness. Goal: within 1.5 times the
broker's own move of as many messages, none early.

Once the bridge has stopped, the broker's own move of as many messages of the same size, with no
bridge (bench/broker_ceiling.py: RabbitMQ, queue to queue with confirms on queues of the staging
queues' type; ActiveMQ, its Java client in transactions), and the burst's time over it.

    .venv/bin/python bench/scale_burst.py --brokers rabbitmq,activemq
    .venv/bin/python bench/scale_burst.py --brokers rabbitmq --burst-messages 20000
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing as mp
import os
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

import broker_ceiling
import pika
import stomp
from delay import Bridge, broker_config, leftover_staged, remove_queues, staging_queues
from scale_common import tree_peak_rss
from stomp_throughput import BROKERS, BenchError, connect, disconnect, parse_address, wait

GOAL_S = 5.0
PROBE_EVERY_MS = 100


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--burst-messages", type=int, default=100_000)
    parser.add_argument("--burst-size", type=int, default=100, help="body bytes")
    parser.add_argument("--burst-lead-s", type=float, default=None,
                        help="due time after the first send (default N / 2,500 + 15 s)")
    parser.add_argument("--burst-senders", type=int, default=2, help="sending connections")
    parser.add_argument("--burst-probe-s", type=float, default=10.0,
                        help="probes come due up to this long after the burst")


def _common(parser: argparse.ArgumentParser) -> None:
    """The options bench/scale.py gives every part, for running this one alone."""
    parser.add_argument("--brokers", default="rabbitmq,activemq")
    parser.add_argument("--quick", action="store_true",
                        help="2,000 messages due 4 s ahead, probes for 1 s after")
    parser.add_argument("--rabbitmq", default=BROKERS["rabbitmq"]["address"], metavar="HOST:PORT")
    parser.add_argument("--rabbitmq-amqp", default="amqp://guest:guest@127.0.0.1:5672/%2F")
    parser.add_argument("--activemq", default=BROKERS["activemq"]["address"], metavar="HOST:PORT")
    parser.add_argument("--staging-prefix", default="jms-bridge-scale.staging")
    parser.add_argument("--bridge-exe", default=str(Path(sys.prefix) / "bin" / "jms-bridge"))
    parser.add_argument("--start-timeout", type=float, default=20.0)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds without progress")
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--bridge-arg", action="append", metavar="ARG",
                        help="one more argument for `jms-bridge run` (repeat it)")


# --- the consumer, in a process of its own --------------------------------------------------

def _consume(broker_name: str, cfg: dict[str, Any], amqp_url: str, queues: list[str],
             expected: int, ready: Any, results: Any) -> None:
    """Record (seq, due, arrival, broker time) of every message on ``queues`` until ``expected``
    distinct ones came, or nothing came for 60 s after the last due time."""
    got: dict[str, list[tuple[int, int, int, int]]] = {q: [] for q in queues}
    seen: set[tuple[str, int]] = set()
    dupes = 0
    done = threading.Event()
    last_seen = [time.monotonic()]

    def record(queue: str, headers: dict[str, Any], stamp: int) -> None:
        nonlocal dupes
        t = now_ms()
        last_seen[0] = time.monotonic()
        seq, due = int(headers["bench_seq"]), int(headers["bench_due"])
        if (queue, seq) in seen:
            dupes += 1
            return
        seen.add((queue, seq))
        got[queue].append((seq, due, t, stamp or t))
        if len(seen) >= expected:
            done.set()

    if broker_name == "rabbitmq":
        conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
        ch = conn.channel()
        for q in queues:
            ch.queue_declare(q, durable=True)
            ch.basic_consume(q, lambda _c, _m, props, _b, q=q: record(q, props.headers or {}, 0),
                             auto_ack=True)
        ready.set()
        while not done.is_set() and time.monotonic() - last_seen[0] < 120:
            conn.process_data_events(time_limit=0.2)
        conn.close()
    else:
        class Listener(stomp.ConnectionListener):
            def on_message(self, frame: Any) -> None:
                sub = frame.headers.get("subscription", "0")
                record(queues[int(sub)], frame.headers, 0)

        conn = stomp.Connection12([parse_address(cfg["address"])], heartbeats=(0, 0),
                                  auto_decode=False)
        conn.set_listener("arrivals", Listener())
        conn.connect(cfg["login"], cfg["passcode"], wait=True)
        for i, q in enumerate(queues):
            conn.subscribe(f"/queue/{q}", id=str(i), ack="auto",
                           headers={"activemq.prefetchSize": "20000"})
        time.sleep(0.5)
        ready.set()
        while not done.wait(0.2) and time.monotonic() - last_seen[0] < 120:
            pass
        disconnect(conn)
    results.put({"got": got, "duplicates": dupes})


# --- sending --------------------------------------------------------------------------------

def _send(address: tuple[str, int], cfg: dict[str, Any], destination: str, seqs: range,
          due: int, body: bytes, window: int, timeout: float) -> None:
    conn, listener = connect(address, cfg, 0)
    send = conn.send
    due_s = str(due)
    try:
        seqs_list = list(seqs)
        for first in range(0, len(seqs_list), window):
            chunk = seqs_list[first:first + window]
            for seq in chunk:
                headers = {"bench_seq": str(seq), "bench_due": due_s, "JMSDeliveryTime": due_s,
                           "persistent": "true"}
                if seq == chunk[-1]:
                    listener.receipt.clear()
                    listener.receipt_id = headers["receipt"] = f"r{seq}"
                send(destination, body, headers=headers)
            wait(listener, f"receipt r{chunk[-1]}", timeout)
    finally:
        disconnect(conn)


def _send_probes(address: tuple[str, int], cfg: dict[str, Any], destination: str,
                 dues: list[int], timeout: float) -> None:
    conn, listener = connect(address, cfg, 0)
    try:
        for seq, due in enumerate(dues):
            headers = {"bench_seq": str(seq), "bench_due": str(due),
                       "JMSDeliveryTime": str(due), "persistent": "true"}
            if seq == len(dues) - 1:
                listener.receipt_id = headers["receipt"] = "probes"
            conn.send(destination, b"probe", headers=headers)
        wait(listener, "the probes' receipt", timeout)
    finally:
        disconnect(conn)


# --- the run --------------------------------------------------------------------------------

def _secs(value: float | None) -> str:
    """A time in seconds for a line of the report; "-" when nothing arrived to time."""
    return "-" if value is None else f"{value:.3f}"


def _pct(values: list[int], q: float) -> int | None:
    if not values:
        return None
    return sorted(values)[max(0, -(-len(values) * q // 100) - 1)]


def run(broker_name: str, args: argparse.Namespace) -> dict[str, Any]:
    quick = getattr(args, "quick", False)
    n = 2_000 if quick else args.burst_messages
    # The quick run's 2,000 sends took 6.4 s through ActiveMQ beside a whole test suite, and a
    # machine twice as busy doubles that.
    lead_s = args.burst_lead_s or (20.0 if quick else n / 2_500 + 15)
    probe_s = 1.0 if quick else args.burst_probe_s
    cfg = broker_config(broker_name, args)
    leftover = leftover_staged(broker_name, args)
    if leftover:
        print(f"  {broker_name} burst: purging leftover staged messages ({leftover})", flush=True)
        remove_queues(broker_name, args, staging_queues(args.staging_prefix))
    tag = uuid.uuid4().hex[:10]
    target, probe_target = f"bench-burst.{tag}", f"bench-burst-probe.{tag}"
    ctx = mp.get_context("spawn")
    ready, results = ctx.Event(), ctx.Queue()
    # How many probes there are is known now; their due times and the burst's are set once the
    # bridge and the consumer are up (starting them took 1.8 s of a 4 s lead on a busy machine).
    n_probes = len(range(-1000, round(probe_s * 1000) + 1, PROBE_EVERY_MS))
    consumer = ctx.Process(target=_consume, args=(
        broker_name, cfg, getattr(args, "rabbitmq_amqp", ""), [target, probe_target],
        n + n_probes, ready, results), daemon=True)
    out: dict[str, Any] = {"messages": n, "body_bytes": args.burst_size, "lead_s": lead_s}
    bridge = Bridge(broker_name, args)
    timeline: list[tuple[float, float, float, float]] = []
    sampling = threading.Event()
    sampler: threading.Thread | None = None
    due = now_ms() + round(lead_s * 1000)
    probe_dues: list[int] = []
    try:
        consumer.start()
        if not ready.wait(30):
            raise BenchError("the consumer did not start")
        start = now_ms()
        due = start + round(lead_s * 1000)
        probe_dues = list(range(due - 1000, due + round(probe_s * 1000) + 1, PROBE_EVERY_MS))
        assert len(probe_dues) == n_probes
        sampler = threading.Thread(target=_sample, args=(bridge, due, timeline, sampling),
                                   daemon=True)
        sampler.start()
        _send_probes(bridge.address, cfg, f"/queue/{probe_target}", probe_dues, args.timeout)
        senders = [threading.Thread(target=_send, args=(
            bridge.address, cfg, f"/queue/{target}", range(k, n, args.burst_senders), due,
            b"x" * args.burst_size, 1000, args.timeout)) for k in range(args.burst_senders)]
        for s in senders:
            s.start()
        for s in senders:
            s.join()
        staged_at = now_ms()
        out["staged_s"] = (staged_at - start) / 1000
        out["staged_per_s"] = n / out["staged_s"]
        print(f"  {broker_name} burst: {n:,} sent and receipted in {out['staged_s']:.1f} s "
              f"({out['staged_per_s']:,.0f}/s); due in {(due - staged_at) / 1000:.1f} s",
              flush=True)
        if staged_at >= due - 2000:
            raise BenchError(f"sending took {out['staged_s']:.1f} s, too close to the due time:"
                             f" give a longer --burst-lead-s than {lead_s}")
        time.sleep(max(0.0, (due - 1500 - now_ms()) / 1000))
        before, cpu0 = bridge.metrics(), bridge.cpu()
        wait_s = max(args.timeout, 60) + (due + probe_s * 1000 - now_ms()) / 1000
        try:  # before the join: a child does not end until what it put has been read
            got = results.get(timeout=wait_s + 120)
        except Exception as exc:  # queue.Empty
            raise BenchError("the consumer gave no results") from exc
        consumer.join(timeout=10)
        out["bridge_cpu_s"] = bridge.cpu() - cpu0
        out["peak_rss_mb"] = tree_peak_rss(bridge.proc.pid)
        out["bridge_peak_rss_mb"] = out["peak_rss_mb"]["total_mb"]
        after = bridge.metrics()
        out["bridge_released"] = (after.get("jms_bridge_staging_released_total", 0)
                                  - before.get("jms_bridge_staging_released_total", 0))
    finally:
        sampling.set()
        if sampler is not None:
            sampler.join()
        bridge.stop()
        if consumer.is_alive():
            consumer.terminate()
        queues = staging_queues(args.staging_prefix)
        remove_queues(broker_name, args, [*queues, target, probe_target]
                      if broker_name == "rabbitmq" else queues)
    out["timeline"] = timeline
    out["broker_move"] = broker_move(broker_name, args, n)
    return _report(broker_name, out, got, target, probe_target, due, n, len(probe_dues))


def staging_queue_type(args: argparse.Namespace) -> str:
    """The staging queues' type of the run's bridges: from --bridge-arg, else the environment."""
    kind = os.environ.get("JMS_BRIDGE_STAGING_QUEUE_TYPE", "classic")
    given = list(getattr(args, "bridge_arg", None) or [])
    for i, arg in enumerate(given):
        if arg == "--staging-queue-type" and i + 1 < len(given):
            kind = given[i + 1]
        elif arg.startswith("--staging-queue-type="):
            kind = arg.split("=", 1)[1]
    return kind


def broker_move(broker_name: str, args: argparse.Namespace, n: int) -> dict[str, Any]:
    """The broker's own move of ``n`` persistent messages from one queue to another, no bridge
    (bench/broker_ceiling.py), on queues of its own: {"seconds": ...} or {"error": ...}."""
    if broker_name == "rabbitmq":
        url = urllib.parse.urlsplit(args.rabbitmq_amqp)
        host, port, kind = url.hostname or "127.0.0.1", url.port or 5672, staging_queue_type(args)
    else:
        host, port, kind = parse_address(args.activemq)[0], 0, "KahaDB"
    options = broker_ceiling.options(
        count=n, size=args.burst_size, host=host, amqp_port=port, rabbitmq_moves="confirm",
        activemq_async=False, queue_prefix=f"ceiling-burst-{uuid.uuid4().hex[:8]}",
        remove_leftovers=False)
    out: dict[str, Any] = {"count": n, "queues": kind}
    try:
        case = broker_ceiling.measure(broker_name, options, kind)
    except (RuntimeError, OSError, subprocess.SubprocessError, KeyError) as exc:
        return {**out, "error": f"{type(exc).__name__}: {exc}"}
    move = case.first_move()
    if move is None or move.seconds is None:
        return {**out, "error": next((p.note for p in case.phases if p.note), "no move ran")}
    return {**out, "client": case.client, "phase": move.name, "seconds": move.seconds,
            "per_s": n / move.seconds, "broker_cpu_s": move.broker_cpu_s,
            **({"note": move.note.strip()} if move.note else {})}


def _sample(bridge: Bridge, due: int, timeline: list[tuple[float, float, float, float]],
            stop: threading.Event) -> None:
    """The bridge's staged, hop and release counters every second: (s from due, staged, hops,
    released), where the engine's time goes before and during the burst."""
    while not stop.wait(1.0):
        try:
            m = bridge.metrics()
        except OSError:
            continue
        timeline.append(((now_ms() - due) / 1000, m.get("jms_bridge_staged_total", 0),
                         m.get("jms_bridge_staging_hops_total", 0),
                         m.get("jms_bridge_staging_released_total", 0)))


def _report(broker_name: str, out: dict[str, Any], got: dict[str, Any], target: str,
            probe_target: str, due: int, n: int, probes: int) -> dict[str, Any]:
    burst = got["got"][target]
    arrivals = [a for _, _, a, _ in burst]
    on_target = [b for _, _, _, b in burst]
    out["received"], out["duplicates"] = len(burst), got["duplicates"]
    out["early"] = sum(1 for _, d, a, b in burst if min(a, b) < d)
    out["first_s"] = (min(on_target) - due) / 1000 if burst else None
    out["last_s"] = (max(on_target) - due) / 1000 if burst else None
    out["last_arrival_s"] = (max(arrivals) - due) / 1000 if burst else None
    per_half = collections.Counter((b - due) // 500 for b in on_target)
    out["per_500ms"] = [per_half.get(k, 0) for k in range(0, max(per_half, default=-1) + 1)]
    out["release_per_s"] = (n / out["last_s"]) if out["last_s"] else None
    probe = got["got"][probe_target]
    probe_late = [min(a, b) - d for _, d, a, b in probe]
    after_due = [min(a, b) - d for _, d, a, b in probe if d >= due]
    out["probes"] = {"sent": probes, "received": len(probe),
                     "early": sum(1 for v in probe_late if v < 0),
                     "before_burst_max_ms": max((min(a, b) - d for _, d, a, b in probe
                                                 if d < due), default=None),
                     "during_p50_ms": _pct(after_due, 50), "during_max_ms": max(after_due,
                                                                                  default=None)}
    out["met"] = (out["received"] == n and out["early"] == 0 and out["last_s"] is not None
                  and out["last_s"] <= GOAL_S)
    p = out["probes"]
    print(f"  {broker_name} burst: {out['received']:,}/{n:,} on target, {out['early']} early, "
          f"{out['duplicates']} duplicates; first {_secs(out['first_s'])} s, last "
          f"{_secs(out['last_s'])} s after the due time (consumer's last arrival "
          f"{_secs(out['last_arrival_s'])} s); {out['release_per_s'] or 0:,.0f} released/s; "
          f"goal last <= {GOAL_S} s: {'met' if out['met'] else 'NOT met'}", flush=True)
    print(f"  {broker_name} burst: per 500 ms from the due time: {out['per_500ms'][:40]}",
          flush=True)
    peak = out["peak_rss_mb"]
    print(f"  {broker_name} burst: bridge CPU {out['bridge_cpu_s']:.1f} s from 1.5 s before "
          f"the due time; peak RSS (VmHWM) bridge {peak['bridge_mb']:.0f} MB, engine "
          f"{peak['engine_mb']:.0f} MB", flush=True)
    move = out["broker_move"]
    if move.get("seconds") and out["last_s"]:
        out["ratio_to_broker_move"] = out["last_s"] / move["seconds"]
        print(f"  {broker_name} burst: {n:,} released in {out['last_s']:.2f} s (due time to "
              f"last on target); the broker's own move of {n:,} ({move['queues']} queues): "
              f"{move['seconds']:.2f} s; ratio {out['ratio_to_broker_move']:.2f}"
              + (f" ({move['note']})" if move.get("note") else ""), flush=True)
    else:
        print(f"  {broker_name} burst: the broker's own move of {n:,}: not measured "
              f"({move.get('error') or 'nothing released'})", flush=True)
    print(f"  {broker_name} burst: probes {p['received']}/{p['sent']}, {p['early']} early; due "
          f"before the burst: late at most {p['before_burst_max_ms']} ms; due during and after "
          f"it: late p50 {p['during_p50_ms']} ms, max {p['during_max_ms']} ms", flush=True)
    rows = out.get("timeline") or []
    line: list[str] = []
    for (_, s0, h0, r0), (t1, s1, h1, r1) in zip(rows, rows[1:], strict=False):
        if t1 > (out["last_s"] or 0) + 2:
            break
        line.append(f"{t1:+.0f}: {s1 - s0:,.0f}/{h1 - h0:,.0f}/{r1 - r0:,.0f}")
    if line:
        print(f"  {broker_name} burst: per second (s from due: staged, hops, released):",
              flush=True)
        for k in range(0, len(line), 8):
            print("    " + "  ".join(line[k:k + 8]), flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _common(parser)
    add_arguments(parser)
    args = parser.parse_args(argv)
    results: dict[str, Any] = {}
    failed = False
    for name in args.brokers.split(","):
        try:
            results[name] = run(name, args)
            failed |= not results[name]["received"] == results[name]["messages"]
        except BenchError as error:
            print(f"error: {name} burst: {error}", file=sys.stderr)
            failed = True
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

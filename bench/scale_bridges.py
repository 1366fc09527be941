"""Several bridges on one broker: release rate with one, two, three bridges.

For each count k of ``--bridges-counts`` (default 1,2,3): k bridges on one staging prefix (their
engines compete for the same staging queues, as the Helm chart's replicas do) take the same
workload: ``--bridges-messages`` messages (default 30,000 of 100 B, persistent), sent through
all k fronts in turn, every one due at the same instant, far enough ahead that all are staged
first. A consumer on the target, on the broker itself, records every arrival against the due
time the message carries. Printed for each k: released a second (from the first arrival to the
last), the last arrival after the due time, early, duplicates, lost, how the releases split
between the engines (each bridge's ``jms_bridge_staging_released_total``), and where the CPU went
over the release: the bridges (their process trees), the broker's process, and the whole
machine's busy share of its cores, which says what bounds the rate here.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
import uuid
from typing import Any

from delay import leftover_staged, remove_queues
from scale_common import (
    Arrivals,
    ScaleBridge,
    broker_pid,
    machine_busy,
    now_ms,
    process_cpu,
    quick,
    run_queues,
    send_all,
)
from stomp_throughput import BenchError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("bridges (item 5)")
    g.add_argument("--bridges-counts", default=None,
                   help="bridges in each round (default 1,2,3; with --quick 1,3)")
    g.add_argument("--bridges-messages", type=int, default=30_000,
                   help="messages released in each round, all due at once")
    g.add_argument("--bridges-size", type=int, default=100, help="body bytes")


def run(broker_name: str, args: argparse.Namespace) -> dict[str, Any]:
    counts = [int(c) for c in (args.bridges_counts or ("1,3" if quick(args) else "1,2,3"))
              .split(",") if c.strip()]
    n = 1_000 if quick(args) else args.bridges_messages
    out: dict[str, Any] = {"messages": n, "rounds": [], "errors": []}
    for k in counts:
        left = leftover_staged(broker_name, args)
        if left:
            removed = remove_queues(broker_name, args, run_queues(args.staging_prefix))
            print(f"  {broker_name} bridges: purged {removed:,} messages left on "
                  f"{args.staging_prefix}.*", flush=True)
        r = one_round(broker_name, args, k, n)
        out["rounds"].append(r)
        out["errors"] += [f"{k} bridges: {e}" for e in r["errors"]]
        show(broker_name, r)
    return out


def one_round(broker_name: str, args: argparse.Namespace, k: int, n: int) -> dict[str, Any]:
    target = f"bench-bridges.{uuid.uuid4().hex[:10]}"
    body = b"x" * args.bridges_size
    cores = os.cpu_count() or 1
    r: dict[str, Any] = {"bridges": k, "messages": n, "errors": []}
    arrivals: Arrivals | None = None
    bridges: list[ScaleBridge] = []
    try:
        arrivals = Arrivals(broker_name, args, [target])
        bridges = [ScaleBridge(broker_name, args) for _ in range(k)]
        # Staged at about 3,000 a second on this machine (k senders), plus time to settle; the
        # quick run's 1,000 through three bridges took over 3 s beside the whole test suite.
        due = now_ms() + round(n / 3_000 * 1000) + (8_000 if quick(args) else 5_000)
        due_s = str(due)
        failures: list[str] = []

        def sender(i: int) -> None:
            share = range(i, n, k)
            try:
                send_all(bridges[i].address, broker_name, args,
                         ((f"/queue/{target}", {"JMSDeliveryTime": due_s, "bench_due": due_s,
                                                "bench_seq": str(seq), "persistent": "true"})
                          for seq in share), len(share), body)
            except Exception as exc:  # noqa: BLE001 - reported with the round
                failures.append(f"sender {i}: {type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=sender, args=(i,)) for i in range(k)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if failures:
            raise BenchError("; ".join(failures))
        if now_ms() > due - 1000:
            r["errors"].append("staging took longer than the lead: some were due while staged")
        # CPU from just before the due time until the last arrival.
        time.sleep(max(0.0, (due - 500 - now_ms()) / 1000))
        broker = broker_pid(broker_name)
        cpu0 = [b.cpu() for b in bridges]
        broker0, busy0 = process_cpu(broker), machine_busy()
        t0 = time.monotonic()
        arrivals.wait_for(n, due, quiet_s=15.0)
        wall = time.monotonic() - t0
        busy1 = machine_busy()
        r["bridges_cpu_s"] = sum(b.cpu() for b in bridges) - sum(cpu0)
        r["broker_cpu_s"] = process_cpu(broker) - broker0
        r["wall_s"] = wall
        r["machine_busy"] = (busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1])
        r["cores"] = cores
        r["released_by"] = [b.released() for b in bridges]
        with arrivals.lock:
            got = list(arrivals.first.values())
            r["duplicates"] = arrivals.duplicates
        r["received"] = len(got)
        r["lost"] = n - len(got)
        r["early"] = sum(1 for d, a in got if a < d)
        times = sorted(a for _, a in got)
        if len(times) > 1:
            r["first_s"] = (times[0] - due) / 1000
            r["last_s"] = (times[-1] - due) / 1000
            r["per_s"] = len(times) / max(0.001, (times[-1] - times[0]) / 1000)
        if r["lost"]:
            r["errors"].append(f"{r['lost']} of {n} never arrived")
        if r["early"]:
            r["errors"].append(f"{r['early']} released early")
    finally:
        if arrivals is not None:
            arrivals.stop()
            if arrivals.error:
                r["errors"].append(f"consumer: {arrivals.error}")
        for b in bridges:
            b.stop()
        remove_queues(broker_name, args, [*run_queues(args.staging_prefix),
                                          *([target] if broker_name == "rabbitmq" else [])])
    return r


def show(broker_name: str, r: dict[str, Any]) -> None:
    if "per_s" not in r:
        for e in r["errors"]:
            print(f"error: {broker_name} bridges: {r['bridges']}: {e}", flush=True)
        return
    wall = r["wall_s"] or 1
    print(f"  {broker_name} bridges: {r['bridges']} bridge(s): {r['received']:,}/{r['messages']:,} "
          f"released at {r['per_s']:,.0f}/s, last {r['last_s']:.2f} s after the due time; "
          f"{r['early']} early, {r['duplicates']} duplicates; by engine {r['released_by']}; "
          f"CPU over {wall:.1f} s: bridges {r['bridges_cpu_s'] / wall:.2f} cores, broker "
          f"{r['broker_cpu_s'] / wall:.2f} cores, machine {r['machine_busy']:.0%} busy of "
          f"{r['cores']} cores", flush=True)
    for e in r["errors"]:
        print(f"error: {broker_name} bridges: {r['bridges']}: {e}", flush=True)


def failed(out: dict[str, Any]) -> bool:
    return bool(out.get("errors")) or not all("per_s" in r for r in out.get("rounds", []))

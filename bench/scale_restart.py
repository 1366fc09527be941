"""Restart at scale: the bridge SIGKILLed and restarted with many pending.

A bridge stages ``--restart-pending`` messages (default 1,000,000 of 100 B, delays 1 h - 30 d:
none due during the run; when the pending part ran just before on the same broker, its messages
are used instead) and then ``--restart-due`` messages (default 10,000) due one after another
over ``--restart-due-s`` (60 s) from just after the kill on, each carrying its due time
(``bench_due``, the sender's clock at the send plus its delay). Its whole process group (the
bridge and its staging engine) is SIGKILLed, and ``--restart-down-s`` (10 s) later a new bridge
is started on the same staging queues: about 1,500 came due meanwhile, the backlog it catches
up on. A consumer on the target, on the broker itself, records every arrival.

Printed: the new bridge's time from its start (the exec) to listening, to ready (/readyz 200)
and to its first release (the first arrival after the start); early (arrived before its due
time: must be 0); duplicates (released by the killed bridge and again: bounded by what it held);
lost; the backlog (due while no bridge ran) and how fast it was caught up (backlog over the time
from the first release to the last of it); the lateness of the messages due after the catch-up.
Goal: first release within 1 s of the start, none early.
"""

from __future__ import annotations

import argparse
import random
import time
import uuid
from typing import Any

from delay import leftover_staged, remove_queues
from scale_common import (
    Arrivals,
    ScaleBridge,
    now_ms,
    pct,
    quick,
    remove_policy,
    run_queues,
    send_all,
)

HOUR_MS, DAY_MS = 3_600_000, 86_400_000
GOAL_FIRST_S = 1.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("restart (item 3)")
    g.add_argument("--restart-pending", type=int, default=1_000_000,
                   help="messages pending (1 h - 30 d) when the bridge is killed")
    g.add_argument("--restart-due", type=int, default=10_000,
                   help="messages due one after another from just after the kill on")
    g.add_argument("--restart-due-s", type=float, default=60.0)
    g.add_argument("--restart-down-s", type=float, default=10.0,
                   help="seconds between the kill and the new bridge's start")
    g.add_argument("--restart-size", type=int, default=100, help="body bytes")


def run(broker_name: str, args: argparse.Namespace) -> dict[str, Any]:
    small = quick(args)
    n_due = 500 if small else args.restart_due
    due_s = 5.0 if small else args.restart_due_s
    down_s = 2.0 if small else args.restart_down_s
    handoff = getattr(args, "pending_handoff", None)
    reuse = bool(handoff and handoff.get("broker") == broker_name)
    n_pending = handoff["staged"] if reuse and handoff else (
        2_000 if small else args.restart_pending)
    body = b"x" * args.restart_size
    target = f"bench-restart.{uuid.uuid4().hex[:10]}"
    if not reuse:
        left = leftover_staged(broker_name, args)
        if left:
            removed = remove_queues(broker_name, args, run_queues(args.staging_prefix))
            print(f"  {broker_name} restart: purged {removed:,} messages left on "
                  f"{args.staging_prefix}.*", flush=True)
    out: dict[str, Any] = {"pending": n_pending, "due": n_due, "due_s": due_s,
                           "reused_pending": reuse, "errors": []}
    arrivals: Arrivals | None = None
    bridges: list[ScaleBridge] = []
    try:
        arrivals = Arrivals(broker_name, args, [target])
        first = ScaleBridge(broker_name, args)
        bridges.append(first)
        if not reuse:
            rng = random.Random(3)
            filler = f"bench-restart.{uuid.uuid4().hex[:10]}.pending"
            t0 = time.monotonic()
            send_all(first.address, broker_name, args,
                     ((f"/queue/{filler}", {"x-delay": str(rng.randint(HOUR_MS, 30 * DAY_MS))})
                      for _ in range(n_pending)), n_pending, body)
            print(f"  {broker_name} restart: staged {n_pending:,} pending (1 h - 30 d) in "
                  f"{time.monotonic() - t0:.0f} s", flush=True)
        # The due messages: sent in about n_due / 5,000 s; the first due about 1 s after the
        # kill, so that those due in the last ``down_s - 1`` s before the restart wait for it.
        lead_ms = round(n_due / 5_000 * 1000) + 1_000
        t_send = now_ms()
        first_due = t_send + lead_ms

        def due_items() -> Any:
            for i in range(n_due):
                due = first_due + round(i * due_s * 1000 / n_due)
                now = now_ms()
                yield f"/queue/{target}", {"x-delay": str(max(1, due - now)),
                                           "bench_due": str(due), "bench_seq": str(i),
                                           "persistent": "true"}

        send_all(first.address, broker_name, args, due_items(), n_due, body)
        sent_s = (now_ms() - t_send) / 1000
        kill_ms = now_ms()
        first.kill()
        before_kill = arrivals.count()
        print(f"  {broker_name} restart: {n_due:,} due over {due_s:.0f} s sent in {sent_s:.1f} s; "
              f"bridge SIGKILLed {(kill_ms - first_due) / 1000:+.1f} s from the first due time "
              f"({before_kill} released before); down {down_s:.0f} s", flush=True)
        time.sleep(down_s)
        start_ms = now_ms()
        second = ScaleBridge(broker_name, args, timeline=True)
        bridges.append(second)
        out["listening_s"], out["ready_s"] = second.listening_s, second.ready_s
        out["first_due_before_start_s"] = (start_ms - first_due) / 1000
        last_due = first_due + round(due_s * 1000)
        arrivals.wait_for(n_due, last_due, quiet_s=30.0)
        out.update(figures(arrivals, n_due, start_ms, kill_ms))
        out["released_by_new_bridge"] = second.released()
        out["timeline"] = {**second.timeline(), "first release": out["first_release_s"]}
        out["rss_after"] = second.rss()
    finally:
        if arrivals is not None:
            arrivals.stop()
        for b in bridges:
            b.stop()
        removed = remove_queues(broker_name, args, [
            *run_queues(args.staging_prefix),
            *([target] if broker_name == "rabbitmq" else [])])
        out["removed"] = removed
        if broker_name == "rabbitmq":
            remove_policy(args)  # the pending part's, when it handed its messages over
        args.pending_handoff = None
    if arrivals is not None and arrivals.error:
        out["errors"].append(f"consumer: {arrivals.error}")
    if out.get("lost"):
        out["errors"].append(f"{out['lost']} of {n_due} receipted messages never arrived")
    if out.get("early"):
        out["errors"].append(f"{out['early']} released early")
    report(broker_name, out)
    return out


def figures(arrivals: Arrivals, n: int, start_ms: int, kill_ms: int) -> dict[str, Any]:
    with arrivals.lock:
        got = dict(arrivals.first)
        duplicates = arrivals.duplicates
    late = [a - d for d, a in got.values()]
    after_start = sorted(a for _, a in got.values() if a >= start_ms)
    first_release_s = (after_start[0] - start_ms) / 1000 if after_start else None
    # The backlog: due before the new bridge started and not released before the kill.
    backlog = [(d, a) for d, a in got.values() if d < start_ms and a >= kill_ms]
    caught_up_ms = max((a for _, a in backlog), default=None)
    rate = None
    if backlog and after_start and caught_up_ms is not None and caught_up_ms > after_start[0]:
        rate = len(backlog) / ((caught_up_ms - after_start[0]) / 1000)
    steady = [a - d for d, a in got.values() if d > (caught_up_ms or start_ms)]
    return {"received": len(got), "lost": n - len(got), "duplicates": duplicates,
            "early": sum(1 for v in late if v < 0), "first_release_s": first_release_s,
            "backlog": len(backlog),
            "caught_up_s": (caught_up_ms - start_ms) / 1000 if caught_up_ms else None,
            "catch_up_per_s": rate,
            "steady_p50_ms": pct(steady, 50), "steady_p99_ms": pct(steady, 99),
            "steady_max_ms": max(steady, default=None), "max_late_ms": max(late, default=None)}


def report(broker_name: str, out: dict[str, Any]) -> None:
    if "received" not in out:
        return
    first = out["first_release_s"]
    print(f"  {broker_name} restart: with {out['pending']:,} pending: new bridge listening "
          f"{out['listening_s']:.2f} s, ready {out['ready_s']:.2f} s, first release "
          f"{'-' if first is None else f'{first:.2f}'} s after its start "
          f"(goal <= {GOAL_FIRST_S:g} s: "
          f"{'met' if first is not None and first <= GOAL_FIRST_S else 'NOT met'})", flush=True)
    until = (out["first_release_s"] or 0) + 0.05
    line = ", ".join(f"{event} {at:.2f} s" for event, at in sorted(
        out.get("timeline", {}).items(), key=lambda kv: kv[1] if kv[1] is not None else 1e9)
        if at is not None and at <= until and " #" not in event)  # each event's first time
    print(f"  {broker_name} restart: from the new bridge's exec: {line}", flush=True)
    rate = out["catch_up_per_s"]
    print(f"  {broker_name} restart: {out['received']:,}/{out['due']:,} received, "
          f"{out['early']} early, {out['duplicates']} duplicates, {out['lost']} lost; backlog "
          f"{out['backlog']:,} due while down, caught up {out['caught_up_s'] or 0:.2f} s after "
          f"the start ({'-' if rate is None else f'{rate:,.0f}'}/s); due after that: late p50 "
          f"{out['steady_p50_ms']} ms, p99 {out['steady_p99_ms']} ms, max "
          f"{out['steady_max_ms']} ms; the first was due {out['first_due_before_start_s']:.2f} s "
          f"before the start", flush=True)
    for error in out["errors"]:
        print(f"error: {broker_name} restart: {error}", flush=True)


def failed(out: dict[str, Any]) -> bool:
    return bool(out.get("errors")) or "received" not in out

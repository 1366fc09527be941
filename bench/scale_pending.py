"""Ten million pending: memory flat while a broker holds them, tools fast.

N delayed messages (default 10,000,000 of 100 B, delays uniform over 1 h - 30 days, so none
comes due during the run) are sent through one bridge on one STOMP connection, with a receipt
on every 1,000th that is waited for before sending on. Every tenth of N (every million by
default) it prints: the RSS of the bridge process and of its staging engine (a child process)
and their sum over the process tree; the broker's memory (RabbitMQ: the node's ``mem_used``
from the management API; ActiveMQ: the JVM's RSS) and disk (``du`` of its data folder); and
staged sends per second over that tenth.

The messages go to ten targets of the run's own and one rare target that gets 10 messages
(every N/10th) with ids of the run's own (``jms-bridge-message-id``): at the end the staged
tools are timed at that size: ``staged count``, ``staged list --target <the rare target>`` and
``staged cancel <one of those ids>``, each as the real command in a child process, stopped
after ``--pending-tool-timeout`` seconds (goal: under a second). The bridge keeps a staged
catalogue (``--staged-catalogue``, in a temporary folder; ``--pending-catalogue off`` runs
without it): the tools ask it instead of reading every message, and its
file's size is printed with the other figures.

On RabbitMQ the run's staging queues get ``queue-mode: lazy`` by a policy of the run's own
(``--pending-queue-mode default`` leaves them as the bridge declares them): without it a classic
queue keeps every message in memory until the node's paging threshold. Staging stops early,
and says so, when the broker is about to refuse publishers: RabbitMQ's memory above
``--pending-broker-mem-share`` of its high watermark or an alarm; on ActiveMQ a send the broker
refuses (its store or temp store full). The largest figure it held is printed.

When the part ends (or fails) the bridge is stopped and the run's staging queues and targets
are removed: deleted on RabbitMQ (with the policy), drained on ActiveMQ.

    .venv/bin/python bench/scale.py --parts pending --brokers rabbitmq --pending-messages 1000000
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import time
import uuid
from typing import Any

import stomp
from delay import leftover_staged, remove_queues
from scale_common import (
    ScaleBridge,
    broker_cfg,
    broker_figures,
    quick,
    remove_policy,
    run_queues,
    set_lazy_policy,
    show_broker,
    show_tool,
    tool,
)
from stomp_throughput import BenchError, connect, disconnect

HOUR_MS, DAY_MS = 3_600_000, 86_400_000
TARGETS = 10
RARE = 10
GOAL_RSS_MB = 150.0
GOAL_TOOL_S = 1.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("pending (item 2)")
    g.add_argument("--pending-messages", type=int, default=10_000_000)
    g.add_argument("--pending-size", type=int, default=100, help="body bytes")
    g.add_argument("--pending-window", type=int, default=1000, help="a receipt every N sends")
    g.add_argument("--pending-persistent", action="store_true",
                   help="send persistent messages (default: transient, as bench/delay.py)")
    g.add_argument("--pending-queue-mode", choices=("lazy", "default"), default="lazy",
                   help="RabbitMQ: the staging queues' queue-mode, by a policy of the run's own")
    g.add_argument("--pending-broker-mem-share", type=float, default=0.8,
                   help="RabbitMQ: stop staging above this share of the memory high watermark")
    g.add_argument("--pending-tool-timeout", type=float, default=60.0,
                   help="seconds before a staged tool that has not answered is stopped")
    g.add_argument("--pending-catalogue", choices=("on", "off"), default="on",
                   help="the bridge keeps a staged catalogue the tools ask (default on)")
    g.add_argument("--pending-keep", action="store_true",
                   help="leave the staged messages for the restart part (scale.py sets it)")


def sizes(args: argparse.Namespace) -> int:
    return 2_000 if quick(args) else args.pending_messages


def run(broker_name: str, args: argparse.Namespace) -> dict[str, Any]:
    n = sizes(args)
    every = max(1, n // 10)
    tag = uuid.uuid4().hex[:10]
    targets = [f"bench-scale.{tag}.t{i}" for i in range(TARGETS)]
    rare = f"bench-scale.{tag}.rare"
    rare_ids = [f"scale-{tag}-{i}" for i in range(RARE)]
    left = leftover_staged(broker_name, args)
    if left:
        removed = remove_queues(broker_name, args, run_queues(args.staging_prefix))
        print(f"  {broker_name} pending: purged {removed:,} messages left on "
              f"{args.staging_prefix}.* (a run that crashed?)", flush=True)
    lazy = broker_name == "rabbitmq" and args.pending_queue_mode == "lazy"
    out: dict[str, Any] = {"messages": n, "body_bytes": args.pending_size, "rows": [],
                           "queue_mode": args.pending_queue_mode if broker_name == "rabbitmq"
                           else None, "persistent": args.pending_persistent, "errors": []}
    bridge: ScaleBridge | None = None
    keep = False
    try:
        if lazy:
            set_lazy_policy(args)
        extra: tuple[str, ...] = ()
        if args.pending_catalogue == "on":
            catalogue_dir = tempfile.mkdtemp(prefix="jms-bridge-catalogue-")
            out["catalogue"] = os.path.join(catalogue_dir, "staged.db")
            extra = ("--staged-catalogue", out["catalogue"])
        bridge = ScaleBridge(broker_name, args, *extra)
        start_rss = bridge.rss()
        out["start"] = {"rss": start_rss, "broker": broker_figures(broker_name, args)}
        print(f"  {broker_name} pending: {n:,} messages of {args.pending_size} B, 1 h - 30 d, "
              f"{'persistent' if args.pending_persistent else 'transient'}"
              + (f", staging queues {args.pending_queue_mode}" if out["queue_mode"] else "")
              + f"; at start: bridge {start_rss['bridge_mb']:.0f} MB + engine "
              f"{start_rss['engine_mb']:.0f} MB = {start_rss['total_mb']:.0f} MB, "
              f"{show_broker(out['start']['broker'])}", flush=True)
        out["staged"], out["stopped_because"] = stage(broker_name, args, bridge, n, every,
                                                      targets, rare, rare_ids, out["rows"],
                                                      out.get("catalogue"))
        out["peak_total_mb"] = max(r["rss"]["total_mb"] for r in out["rows"]) if out["rows"] \
            else None
        if out["staged"]:
            out["tools"] = time_tools(broker_name, args, rare, rare_ids, out["staged"], n)
        out["end"] = {"rss": bridge.rss(), "broker": broker_figures(broker_name, args)}
        keep = args.pending_keep and out["stopped_because"] is None
    finally:
        if bridge is not None:
            bridge.stop()
        if out.get("catalogue"):
            shutil.rmtree(os.path.dirname(out["catalogue"]), ignore_errors=True)
        if keep:
            args.pending_handoff = {"staged": out.get("staged", 0), "broker": broker_name}
        else:
            removed = remove_queues(broker_name, args, [
                *run_queues(args.staging_prefix),
                *([*targets, rare] if broker_name == "rabbitmq" else [])])
            out["removed"] = removed
            if lazy:
                remove_policy(args)
            print(f"  {broker_name} pending: removed {removed:,} messages from the staging "
                  f"queues", flush=True)
    report(broker_name, out)
    return out


def catalogue_mb(path: str | None) -> float | None:
    """The staged catalogue's size on disk: its file and its write-ahead log."""
    if path is None:
        return None
    return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p)) / 1e6


def stage(broker_name: str, args: argparse.Namespace, bridge: ScaleBridge, n: int, every: int,
          targets: list[str], rare: str, rare_ids: list[str],
          rows: list[dict[str, Any]], catalogue: str | None = None) -> tuple[int, str | None]:
    """Send n delayed messages; a row of figures every ``every``. Returns how many were
    receipted, and why staging stopped early (None: it did not)."""
    rng = random.Random(1)
    body = b"x" * args.pending_size
    window = args.pending_window
    cfg = broker_cfg(broker_name, args)
    conn, listener = connect(bridge.address, cfg, 0)
    send = conn.send
    persistent = "true" if args.pending_persistent else "false"
    rare_every = max(1, n // RARE)
    mark_t, mark_n = time.perf_counter(), 0
    confirmed = 0
    try:
        for first in range(0, n, window):
            last = min(first + window, n) - 1
            for seq in range(first, last + 1):
                headers = {"x-delay": str(rng.randint(HOUR_MS, 30 * DAY_MS)),
                           "persistent": persistent}
                if seq % rare_every == rare_every // 2 and seq // rare_every < RARE:
                    destination = f"/queue/{rare}"
                    headers["jms-bridge-message-id"] = rare_ids[seq // rare_every]
                else:
                    destination = f"/queue/{targets[seq % TARGETS]}"
                if seq == last:
                    listener.receipt.clear()
                    listener.receipt_id = headers["receipt"] = f"r{last}"
                send(destination, body, headers=headers)
            try:
                _wait_receipt(listener, f"receipt r{last}", args.timeout)
            except BenchError as exc:
                return confirmed, f"the broker stopped taking messages: {exc}"
            confirmed = last + 1
            if confirmed % every == 0 or confirmed == n:
                t = time.perf_counter()
                row = {"staged": confirmed, "rate": (confirmed - mark_n) / (t - mark_t),
                       "rss": bridge.rss(), "broker": broker_figures(broker_name, args),
                       "catalogue_mb": catalogue_mb(catalogue),
                       "catalogue_dropped": (bridge.metrics().get(
                           "jms_bridge_catalogue_dropped_total") if catalogue else None)}
                mark_t, mark_n = time.perf_counter(), confirmed
                rows.append(row)
                print(f"  {broker_name} pending: {confirmed:>11,} staged, {row['rate']:>6,.0f}/s; "
                      f"bridge {row['rss']['bridge_mb']:.0f} MB + engine "
                      f"{row['rss']['engine_mb']:.0f} MB = {row['rss']['total_mb']:.0f} MB RSS; "
                      f"{show_broker(row['broker'])}"
                      + (f"; catalogue {row['catalogue_mb']:,.0f} MB on disk, "
                         f"{row['catalogue_dropped'] or 0:,.0f} rows dropped"
                         if catalogue else ""), flush=True)
                why = broker_limit(broker_name, args, row["broker"])
                if why:
                    return confirmed, why
    except (stomp.exception.StompException, OSError) as exc:
        return confirmed, f"{type(exc).__name__}: {exc}"
    finally:
        disconnect(conn)
    return confirmed, None


def _wait_receipt(listener: Any, what: str, timeout: float) -> None:
    from stomp_throughput import wait

    wait(listener, what, timeout)


def broker_limit(broker_name: str, args: argparse.Namespace, figures: dict[str, Any]) -> str | None:
    """Why to stop before the broker refuses every publisher on it (other users' too)."""
    if broker_name != "rabbitmq" or "error" in figures:
        return None
    if figures.get("mem_alarm") or figures.get("disk_alarm"):
        return "RabbitMQ raised a resource alarm (see its log)"
    share = figures["mem_mb"] / figures["mem_limit_mb"]
    if share > args.pending_broker_mem_share:
        return (f"RabbitMQ's memory is at {share:.0%} of its high watermark "
                f"({figures['mem_mb']:,.0f} of {figures['mem_limit_mb']:,.0f} MB); stopped "
                f"before its memory alarm blocks every publisher")
    return None


def time_tools(broker_name: str, args: argparse.Namespace, rare: str, rare_ids: list[str],
               staged: int, n: int) -> list[dict[str, Any]]:
    limit = min(args.pending_tool_timeout, 30.0) if quick(args) else args.pending_tool_timeout
    results = [
        tool(broker_name, args, "count", timeout=limit),
        tool(broker_name, args, "list", "--target", f"/queue/{rare}", timeout=limit),
        tool(broker_name, args, "cancel", rare_ids[len(rare_ids) // 2], timeout=limit),
    ]
    for t in results:
        t["goal_met"] = not t["timed_out"] and t["code"] == 0 and t["seconds"] < GOAL_TOOL_S
        print(f"  {broker_name} pending: at {staged:,}: {show_tool(t)}", flush=True)
        if t["code"] == 3:
            print(f"  {broker_name} pending: finding: `staged {t['command']}` did not find a "
                  f"message that is staged", flush=True)
    listed = results[1]
    every = max(1, n // RARE)  # the rare target's messages among the first ``staged``
    sent = sum(1 for k in range(RARE) if k * every + every // 2 < staged)
    if not listed["timed_out"] and listed["code"] == 0 and listed["lines"] - 1 < sent:
        listed["error"] = f"listed {listed['lines'] - 1} of the rare target's {sent}"
        print(f"error: {broker_name} pending: staged list --target listed "
              f"{listed['lines'] - 1} messages; {sent} were staged there", flush=True)
    counted = results[0]["output"].strip()
    if not results[0]["timed_out"] and counted.isdigit() and int(counted) < staged:
        results[0]["error"] = f"counted {counted}, {staged:,} staged"
        print(f"error: {broker_name} pending: staged count said {counted}, {staged:,} were "
              f"staged", flush=True)
    return results


def report(broker_name: str, out: dict[str, Any]) -> None:
    if out.get("stopped_because"):
        print(f"  {broker_name} pending: staging stopped at {out.get('staged', 0):,}: "
              f"{out['stopped_because']}", flush=True)
    peak = out.get("peak_total_mb")
    if peak is not None:
        print(f"  {broker_name} pending: largest held {out.get('staged', 0):,}; bridge with its "
              f"engine peaked at {peak:.0f} MB RSS (goal under {GOAL_RSS_MB:.0f} MB: "
              f"{'met' if peak < GOAL_RSS_MB else 'NOT met'})", flush=True)


def failed(out: dict[str, Any]) -> bool:
    """A run that could not measure (not one that missed a goal)."""
    return bool(out.get("errors")) or not out.get("staged")

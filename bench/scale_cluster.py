"""Staging that survives the loss of a broker node: the cluster part of bench/scale.py.

On the three-node RabbitMQ cluster of ``scripts/brokers up rabbitmq-cluster`` (started here if
it is not up), a bridge with ``--staging-queue-type quorum`` on node 2 stages --cluster-messages
delayed messages (receipt on each, at --cluster-rate a second, delays uniform over
--cluster-delays ms); --cluster-kill-after seconds in, the node that leads the staging queues
(node 1) has its Erlang VM SIGKILLed; then the same with the bridge on node 1 itself, node 2
its alternate (``--upstream-stomp`` and ``--upstream-amqp`` lists). Printed: receipted, lost,
early and duplicated messages, when releases resumed after the kill (the first release after
it, and the longest pause in releases), how late the messages due just after the kill came,
and how long the killed node took to start again. The run is in tests/integration/cluster.py
(``node_loss``), which the integration test test_staging_cluster.py runs at a smaller size.

With --cluster-single-copy the same load runs again with classic staging queues on node 1 (one
copy on one node, as the RabbitMQ delayed-message plugin keeps each message), node 1 killed and
left down --cluster-down seconds: what a single copy costs, in the same figures.

Usage:
    .venv/bin/python bench/scale_cluster.py                # 20,000 messages
    .venv/bin/python bench/scale_cluster.py --quick        # 1,000, delays 2-6 s
    .venv/bin/python bench/scale_cluster.py --cluster-single-copy --json out.json

bench/scale.py imports this module: ``add_arguments(parser)`` then ``run(args)``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bridge.app import logs as bridge_logs  # noqa: E402
from tests.integration import cluster  # noqa: E402


@dataclass(frozen=True)
class Size:
    messages: int
    rate: float
    kill_after: float
    delays: tuple[int, int]


FULL = Size(20_000, 1000.0, 8.0, (2000, 20_000))
QUICK = Size(1_000, 500.0, 1.5, (2000, 6000))


class BenchError(Exception):
    """The cluster is not there, or the run could not be made."""


def _delays(text: str) -> tuple[int, int]:
    low, sep, high = text.partition(":")
    if not sep or not low.isdigit() or not high.isdigit() or not 0 < int(low) <= int(high):
        raise argparse.ArgumentTypeError(f"expected MIN_MS:MAX_MS (0 < MIN <= MAX), got {text!r}")
    return int(low), int(high)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The cluster part's options, all named --cluster-...; ``run`` also reads ``args.quick``
    when there is one (bench/scale.py's --quick; this module's main adds its own)."""
    group = parser.add_argument_group("cluster (a RabbitMQ node lost under load)")
    group.add_argument("--cluster-messages", type=int, default=None,
                       help=f"delayed messages (default {FULL.messages:,}; "
                            f"--quick {QUICK.messages:,})")
    group.add_argument("--cluster-rate", type=float, default=None,
                       help=f"delayed sends a second (default {FULL.rate:g}; "
                            f"--quick {QUICK.rate:g})")
    group.add_argument("--cluster-delays", type=_delays, default=None,
                       metavar="MIN_MS:MAX_MS",
                       help="delays, uniform (default 2000:20000; --quick 2000:6000)")
    group.add_argument("--cluster-kill-after", type=float, default=None,
                       help=f"seconds of sending before the SIGKILL (default "
                            f"{FULL.kill_after:g}; --quick {QUICK.kill_after:g})")
    group.add_argument("--cluster-single-copy", action="store_true",
                       help="also run with classic staging queues on the killed node")
    group.add_argument("--cluster-down", type=float, default=15.0,
                       help="seconds the node stays down in the single-copy run (default 15)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the cluster part; prints its figures as it goes and returns them: per run
    (``quorum``, ``quorum_bridge_on_leader``, with --cluster-single-copy ``classic``) the dict of
    tests/integration/cluster.py's ``node_loss``. BenchError when the cluster cannot be started;
    the run's own failures (a bridge that does not start) raise what they raise."""
    defaults = argparse.ArgumentParser()
    add_arguments(defaults)
    args = argparse.Namespace(**{**vars(defaults.parse_args([])), **vars(args)})
    size = QUICK if getattr(args, "quick", False) else FULL
    messages: int = args.cluster_messages or size.messages
    rate: float = args.cluster_rate or size.rate
    kill_after: float = args.cluster_kill_after or size.kill_after
    delays: tuple[int, int] = args.cluster_delays or size.delays
    if messages < 1 or rate <= 0 or kill_after < 0:
        raise BenchError("--cluster-messages, --cluster-rate must be positive, "
                         "--cluster-kill-after not negative")
    bridge_logs.configure("console", "warning")  # the adapter's own lines: only trouble
    # stomp.py logs a traceback when the bridge closes the producer's connection (a single-copy
    # run): the producer counts that itself.
    logging.getLogger("stomp.py").setLevel(logging.CRITICAL)
    print("cluster: a RabbitMQ node lost under load (scripts/brokers up rabbitmq-cluster)",
          flush=True)
    why = cluster.problem()
    if why is not None:
        print(f"  cluster not up ({why}); starting it", flush=True)
        try:
            print(f"  cluster up in {cluster.up():.1f} s", flush=True)
        except (OSError, RuntimeError) as exc:
            raise BenchError(str(exc)) from None
    logs = Path(tempfile.mkdtemp(prefix="jbt-cluster-bench-"))
    result: dict[str, Any] = {}
    runs = [("quorum", "quorum", 0.0, False), ("quorum_bridge_on_leader", "quorum", 0.0, True)]
    if args.cluster_single_copy:
        runs.append(("classic", "classic", args.cluster_down, False))
    for name, queue_type, down, on_leader in runs:
        print(f"  {queue_type} staging queues: {messages:,} delayed messages at {rate:g}/s, "
              f"delays {delays[0]}-{delays[1]} ms, bridge on "
              + ("the killed node, then its alternate" if on_leader else "another node"),
              flush=True)
        r = cluster.node_loss(messages, logs, rate=rate, delays=delays,
                              kill_after_s=kill_after, queue_type=queue_type, down_s=down,
                              wait_after_s=30.0 + down, bridge_on_leader=on_leader)
        cluster.show(r)
        result[name] = r
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK.messages:,} messages instead of {FULL.messages:,}")
    add_arguments(parser)
    parser.add_argument("--json", metavar="FILE", help="write the figures here too")
    args = parser.parse_args(argv)
    try:
        result = run(args)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    quorum = [r for name, r in result.items() if name.startswith("quorum")]
    return 0 if all(r["lost"] == 0 and r["early"] == 0 for r in quorum) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Scale past one node: every scale figure, for each broker, in one command.

Parts (``--parts``, default all, in this order):
  burst     100,000 messages due in the same millisecond, and the broker's own move of as many
            with no bridge (bench/scale_burst.py)
  pending   10,000,000 pending: bridge/engine RSS, broker memory and disk, send rate; the staged
            tools timed at that size (bench/scale_pending.py)
  restart   the bridge SIGKILLed and restarted with a million pending: first release, early,
            catch-up rate (bench/scale_restart.py)
  bridges   release rate with one, two and three bridges on one broker (bench/scale_bridges.py)
  cluster   staging on a three-node RabbitMQ cluster, its leader killed (bench/scale_cluster.py;
            RabbitMQ only)

A part whose module is not in this tree is reported as not available and the rest run. Each part
runs with a bridge of this tree (``python -m bridge.app.cli``) on a staging prefix of the run's
own (``--staging-prefix``), and removes what it staged when it ends, also when it fails.
``--quick`` runs every part at a small size (well under a minute a broker), for the smoke test
(tests/integration/test_scale_bench.py). Exit status 1 when a part could not measure.

    .venv/bin/python bench/scale.py --brokers rabbitmq,activemq
    .venv/bin/python bench/scale.py --quick --parts pending,restart,bridges
    .venv/bin/python bench/scale.py --brokers rabbitmq --parts pending --pending-messages 10000000
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import socket
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# The bench's helpers beside it; this tree's packages before any installed copy of them.
for path in (str(ROOT), str(HERE)):
    if path not in sys.path:
        sys.path.insert(0, path)
# A part that starts `--bridge-exe` (the installed script) runs this tree's code too.
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)

import pika  # noqa: E402
import stomp  # noqa: E402
from stomp_throughput import BROKERS, BenchError, parse_address  # noqa: E402

PARTS = ("burst", "pending", "restart", "bridges", "cluster")
MODULES = {"burst": "scale_burst", "pending": "scale_pending", "restart": "scale_restart",
           "bridges": "scale_bridges", "cluster": "scale_cluster"}
# run(broker_name, args); the cluster part: run(args)
PER_BROKER = {"burst", "pending", "restart", "bridges"}


def load(part: str) -> ModuleType | None:
    """The part's module, or None when this tree does not have it."""
    name = MODULES[part]
    if not (HERE / f"{name}.py").exists():
        return None
    return importlib.import_module(name)


def common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--brokers", default="rabbitmq,activemq")
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--quick", action="store_true",
                        help="every part at a small size (the suite's smoke test)")
    parser.add_argument("--rabbitmq", default=BROKERS["rabbitmq"]["address"], metavar="HOST:PORT")
    parser.add_argument("--rabbitmq-amqp", default="amqp://guest:guest@127.0.0.1:5672/%2F",
                        metavar="URL")
    parser.add_argument("--rabbitmq-management", default="http://127.0.0.1:15672", metavar="URL")
    parser.add_argument("--activemq", default=BROKERS["activemq"]["address"], metavar="HOST:PORT")
    parser.add_argument("--staging-prefix", default="jms-bridge-scale.staging",
                        help="the bridges' staging prefix for the run; its queues are removed")
    parser.add_argument("--bridge-exe", default=str(Path(sys.prefix) / "bin" / "jms-bridge"))
    parser.add_argument("--start-timeout", type=float, default=30.0)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds without progress")
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--bridge-arg", action="append", metavar="ARG",
                        help="one more argument for every `jms-bridge run` (repeat it), e.g. "
                             "--bridge-arg=--staging-queue-type --bridge-arg=quorum")


def build_parser(modules: dict[str, ModuleType]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common(parser)
    for module in modules.values():
        module.add_arguments(parser)
    return parser


def reachable(broker_name: str, args: argparse.Namespace) -> str | None:
    host, port = parse_address(getattr(args, broker_name))
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError as exc:
        return f"STOMP at {host}:{port} does not answer: {exc}"
    return None


ERRORS = (BenchError, stomp.exception.StompException, pika.exceptions.AMQPError, OSError,
          ValueError)


def run_part(part: str, module: ModuleType, broker_name: str | None,
             args: argparse.Namespace) -> dict[str, Any]:
    label = f"{broker_name} {part}" if broker_name else part
    start = time.monotonic()
    try:
        result = module.run(broker_name, args) if broker_name else module.run(args)
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # noqa: BLE001 - one clear line per part, never a traceback
        known = isinstance(exc, (*ERRORS, getattr(module, "BenchError", BenchError)))
        print(f"error: {label}: {type(exc).__name__}: {exc}"
              + ("" if known else " (a bug in the bench or the bridge?)"),
              file=sys.stderr, flush=True)
        return {"error": f"{type(exc).__name__}: {exc}"}
    print(f"  {label}: done in {time.monotonic() - start:.0f} s", flush=True)
    return result if isinstance(result, dict) else {"result": result}


def part_failed(module: ModuleType, result: dict[str, Any]) -> bool:
    if "error" in result:
        return True
    check = getattr(module, "failed", None)
    if check:
        return bool(check(result))
    # A part without its own verdict: errors, or a message lost or early in any of its runs.
    runs = [result, *(r for r in result.values() if isinstance(r, dict))]
    return any(r.get("errors") or r.get("lost") or r.get("early")
               or ("received" in r and "messages" in r and r["received"] < r["messages"])
               for r in runs)


def main(argv: list[str] | None = None) -> int:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--parts", default=",".join(PARTS))
    known, _ = pre.parse_known_args(argv)
    wanted = [p.strip() for p in known.parts.split(",") if p.strip()]
    unknown = [p for p in wanted if p not in PARTS]
    modules: dict[str, ModuleType] = {}
    missing: list[str] = []
    for part in wanted:
        if part in unknown:
            continue
        module = load(part)
        if module is None:
            missing.append(part)
        else:
            modules[part] = module
    parser = build_parser(modules)
    args = parser.parse_args(argv)
    if unknown:
        parser.error(f"unknown part {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    brokers = [b.strip() for b in args.brokers.split(",") if b.strip()]
    for b in brokers:
        if b not in BROKERS:
            parser.error(f"unknown broker {b!r}; choose from {', '.join(BROKERS)}")
    # The restart part takes over what pending staged, when both run.
    if "pending" in modules and "restart" in modules:
        args.pending_keep = True

    report: dict[str, Any] = {"brokers": {}, "not_available": missing}
    status = 0
    for part in missing:
        print(f"part {part}: not available (bench/{MODULES[part]}.py missing)", flush=True)
    for broker_name in brokers:
        down = reachable(broker_name, args)
        if down:
            print(f"error: {broker_name}: {down}", file=sys.stderr, flush=True)
            report["brokers"][broker_name] = {"error": down}
            status = 1
            continue
        results: dict[str, Any] = report["brokers"].setdefault(broker_name, {})
        for part, module in modules.items():
            if part not in PER_BROKER:
                continue
            print(f"{broker_name}: part {part}", flush=True)
            results[part] = run_part(part, module, broker_name, args)
            if part_failed(module, results[part]):
                status = 1
        args.pending_handoff = None
    if "cluster" in modules:
        if "rabbitmq" in brokers:
            print("rabbitmq: part cluster", flush=True)
            report["cluster"] = run_part("cluster", modules["cluster"], None, args)
            if part_failed(modules["cluster"], report["cluster"]):
                status = 1
        else:
            print("part cluster: RabbitMQ only; not run (--brokers has no rabbitmq)", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"scale: {'FAILED' if status else 'done'}", flush=True)
    return status


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)

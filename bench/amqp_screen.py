"""The AMQP front-end's cost for one delayed publish, in-process: framing it and screening it.

Delayed publishes (1 KiB, ``x-delay`` of an hour, a delivery mode, as ``bench/amqp.py``'s
client sends them) go through ``ProxyConnection.client_data`` and the ``PublishScreen`` the
bridge runs, with its interceptors, its staged-message counters and a target check whose
verdict is known; each must come out as its staged copy's bytes. No broker, no sockets.

Prints the CPU µs a publish (the best of ``--repeat`` runs of ``--count``: this machine's speed
swings by a third from one timing to the next) and, with ``--instructions``, the instructions a
publish as valgrind's callgrind counts them: two runs of this script under callgrind (``--count``
and ten times more), the difference divided. That count is deterministic to a few instructions,
so it compares two versions of the code where timings cannot; it takes about a minute.

Usage:
    .venv/bin/python bench/amqp_screen.py
    .venv/bin/python bench/amqp_screen.py --instructions
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from pamqp import body as pbody
from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import callgrind  # noqa: E402

from adapters import rabbitmq  # noqa: E402
from adapters.base import PutCheck  # noqa: E402
from bridge.frontends.amqp.assembler import Message  # noqa: E402
from bridge.frontends.amqp.builders import PROTOCOL_HEADER  # noqa: E402
from bridge.frontends.amqp.connection import ProxyConnection, State  # noqa: E402
from bridge.frontends.amqp.translate import PublishScreen  # noqa: E402
from bridge.intercept.chain import Chain  # noqa: E402
from bridge.intercept.delay import DelayInterceptor  # noqa: E402
from bridge.intercept.guard import StagingGuard  # noqa: E402
from bridge.staging.levels import Layout  # noqa: E402
from bridge.staging.outcomes import StatsSink  # noqa: E402
from bridge.staging.staging_stats import StagingStats  # noqa: E402
from bridge.staging.targets import TargetChecks, TargetKey  # noqa: E402
from policies.delay import DelayConfig  # noqa: E402

QUEUE = "bench-screen"


def publish_bytes() -> bytes:
    body = b"x" * 1024
    props = commands.Basic.Properties(delivery_mode=1, headers={"x-delay": 3_600_000})
    return (pframe.marshal(commands.Basic.Publish(exchange="", routing_key=QUEUE), 1)
            + pframe.marshal(pheader.ContentHeader(0, len(body), props), 1)
            + pframe.marshal(pbody.ContentBody(body), 1))


def screened_connection() -> tuple[ProxyConnection, PublishScreen]:
    """A connection past its handshake (as guest, vhost /) and the bridge's screen for it."""
    targets = TargetChecks(lambda key: PutCheck())
    targets.remember(TargetKey("guest", "/", f"/amq/queue/{QUEUE}"), PutCheck(), ttl_s=1e9)
    layout = Layout()
    screen = PublishScreen(Chain([
        StagingGuard(layout),
        DelayInterceptor(fmt=rabbitmq.FORMAT, config=DelayConfig(), layout=layout,
                         sinks=[StatsSink(StagingStats())], targets=targets),
    ]))
    conn = ProxyConnection(reserve_channel=True)
    conn.state = State.OPEN
    conn.login, conn.passcode, conn.vhost = "guest", "guest", "/"
    conn.screen_needles = screen.needles
    conn.screen_flags = screen.flags
    conn.client_data(PROTOCOL_HEADER)
    return conn, screen


def run(conn: ProxyConnection, screen: PublishScreen, data: bytes, count: int) -> None:
    for _ in range(count):
        for event in conn.client_data(data):
            if type(event) is Message:
                staged = screen(event, conn)
                if type(staged) is not bytes:
                    raise SystemExit(f"the screen gave {staged!r}, not a staged copy's bytes")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000, help="publishes a run")
    parser.add_argument("--repeat", type=int, default=5, help="runs; the best is printed")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions with valgrind's callgrind instead")
    parser.add_argument("--quiet", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.instructions:
        count = min(args.count, 300)
        each = callgrind.per_item(__file__, ["--repeat", "1", "--quiet"], count)
        print(f"{each:,} instructions a delayed publish (callgrind, "
              f"{count} and {11 * count} publishes)")
        return 0
    conn, screen = screened_connection()
    data = publish_bytes()
    run(conn, screen, data, 300)  # warm up
    best = float("inf")
    for _ in range(args.repeat):
        started = time.process_time()
        run(conn, screen, data, args.count)
        best = min(best, time.process_time() - started)
    if not args.quiet:
        print(f"{best / args.count * 1e6:.1f} CPU µs a delayed publish (framed and screened; "
              f"the best of {args.repeat} runs of {args.count})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

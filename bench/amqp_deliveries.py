"""The AMQP front-end's cost for one delivery to a consumer, in-process: the consumer side.

A consumer's deliveries (1 KiB, a delivery mode, as ``bench/amqp.py``'s consumer is handed
them), a chunk of ``--batch`` at a time as the broker's socket gives them, go through
``ProxyConnection.broker_data`` and the ``ConsumerSide`` the bridge runs for a link (the
bridge's chain: its staging guard, delivery delay and redelivery, with the default policy):
each first delivery goes out as the broker's bytes and is remembered until it is settled; the
consumer's multiple ack every 100 deliveries (``client_frame``) settles them. No broker, no
sockets. The output is checked: every delivery comes out unchanged, in order.

Prints the CPU µs a delivery (the best of ``--repeat`` runs of ``--count``) and, with
``--instructions``, the instructions a delivery as valgrind's callgrind counts them (two runs,
``--count`` and ten times more, differenced), which compares two versions of the code where
timings on this shared machine cannot.

Usage:
    .venv/bin/python bench/amqp_deliveries.py
    .venv/bin/python bench/amqp_deliveries.py --instructions
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
from bridge.frontends.amqp.builders import PROTOCOL_HEADER  # noqa: E402
from bridge.frontends.amqp.connection import DeliveryRun, ProxyConnection, State  # noqa: E402
from bridge.frontends.amqp.settling import ConsumerSide  # noqa: E402
from bridge.frontends.relay_stats import RelayStats  # noqa: E402
from bridge.intercept.chain import Chain  # noqa: E402
from bridge.intercept.delay import DelayInterceptor  # noqa: E402
from bridge.intercept.guard import StagingGuard  # noqa: E402
from bridge.intercept.redelivery import RedeliveryInterceptor  # noqa: E402
from bridge.staging.levels import Layout  # noqa: E402
from policies.delay import DelayConfig  # noqa: E402
from policies.redelivery import PolicyTable  # noqa: E402

QUEUE = "bench-deliveries"


def delivery(tag: int, body: bytes) -> bytes:
    props = commands.Basic.Properties(delivery_mode=1)
    return (pframe.marshal(commands.Basic.Deliver("bench", tag, False, "", QUEUE), 1)
            + pframe.marshal(pheader.ContentHeader(0, len(body), props), 1)
            + pframe.marshal(pbody.ContentBody(body), 1))


def consuming_side() -> tuple[ProxyConnection, ConsumerSide]:
    """A connection past its handshake, consuming ``QUEUE`` on channel 1, and its side."""
    layout = Layout()
    chain = Chain([
        StagingGuard(layout),
        DelayInterceptor(fmt=rabbitmq.FORMAT, config=DelayConfig(), layout=layout),
        RedeliveryInterceptor(table=PolicyTable(), fmt=rabbitmq.FORMAT, layout=layout),
    ])
    conn = ProxyConnection(assemble_broker=True, reserve_channel=True)  # as a link makes it
    conn.state = State.OPEN
    conn.login, conn.passcode, conn.vhost = "guest", "guest", "/"
    side = ConsumerSide(chain, conn, RelayStats())
    side.attach(lambda data: None)
    conn.client_data(PROTOCOL_HEADER)
    for method in (commands.Channel.Open(), commands.Basic.Consume(queue=QUEUE,
                                                                   consumer_tag="bench")):
        for event in conn.client_data(pframe.marshal(method, 1)):
            side.client_frame(event)  # type: ignore[arg-type]
    for event in conn.broker_data(pframe.marshal(commands.Basic.ConsumeOk("bench"), 1)):
        side.broker_event(event)
    if type(conn.broker_data(chunks_of(100, 100, 1)[0][0])[0]) is not DeliveryRun:
        raise SystemExit("plain deliveries were framed, not taken as a run")
    return conn, side


def run(conn: ProxyConnection, side: ConsumerSide, chunks: list[bytes], acks: list[bytes],
        check: bool = False) -> None:
    for chunk, ack in zip(chunks, acks, strict=True):
        out = [side.broker_event(event) for event in conn.broker_data(chunk)]
        for event in conn.client_data(ack):
            side.client_frame(event)  # type: ignore[arg-type]
        if check:
            data = b"".join(o for o in out if o is not None)
            if data != chunk:  # first deliveries: the broker's bytes
                raise SystemExit("a first delivery came out changed")
    if side.consumers.unsettled():
        raise SystemExit("deliveries left unsettled after the consumer's acks")


def chunks_of(count: int, batch: int, first_tag: int) -> tuple[list[bytes], list[bytes]]:
    """The broker's chunks of deliveries from ``first_tag`` on, and the consumer's acks for
    each (made from one delivery's bytes, its tag replaced: little to count beside the run)."""
    one = delivery(0, b"x" * 1024)
    at = 12 + one[11]  # the delivery tag, past the consumer tag
    head, tail = one[:at], one[at + 8:]
    ack = pframe.marshal(commands.Basic.Ack(0, multiple=True), 1)
    ack_head, ack_tail = ack[:11], ack[19:]
    chunks, acks = [], []
    tag = first_tag
    for _ in range(0, count, batch):
        chunks.append(b"".join(head + t.to_bytes(8, "big") + tail
                               for t in range(tag, tag + batch)))
        tag += batch
        acks.append(b"".join(ack_head + t.to_bytes(8, "big") + ack_tail
                             for t in range(tag - batch + 99, tag, 100)))
    return chunks, acks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20_000, help="deliveries a run")
    parser.add_argument("--batch", type=int, default=100, help="deliveries a chunk")
    parser.add_argument("--repeat", type=int, default=5, help="runs; the best is printed")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions with valgrind's callgrind instead")
    parser.add_argument("--quiet", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.count % args.batch or args.batch % 100:
        parser.error("--count must be a multiple of --batch, and --batch of 100")
    if args.instructions:
        count = min(args.count, 2_000) // args.batch * args.batch
        each = callgrind.per_item(
            __file__, ["--batch", str(args.batch), "--repeat", "1", "--quiet"], count)
        print(f"{each:,} instructions a delivery (callgrind, "
              f"{count} and {11 * count} deliveries)")
        return 0
    conn, side = consuming_side()
    tag = 1
    warm, warm_acks = chunks_of(args.batch * 3, args.batch, tag)
    run(conn, side, warm, warm_acks, check=True)
    tag += args.batch * 3
    best = float("inf")
    for _ in range(args.repeat):
        chunks, acks = chunks_of(args.count, args.batch, tag)
        tag += args.count
        started = time.process_time()
        run(conn, side, chunks, acks)
        best = min(best, time.process_time() - started)
    if not args.quiet:
        print(f"{best / args.count * 1e6:.2f} CPU µs a delivery (framed, remembered "
              f"and acked; the best of {args.repeat} runs of {args.count}, {args.batch} a "
              f"chunk)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""AMQP 0-9-1 throughput: direct to RabbitMQ, through a do-nothing relay, and through the bridge.

One run prints, per path, publishes with publisher confirms (a window of ``--window``
outstanding, 100) and consumption with a prefetch of ``--prefetch`` (1,000, a multiple ack
every 100), ``--count`` messages of ``--size`` bytes (the issue asks for 100,000 of 1 KiB);
then, through the bridge, delayed publishes (``x-delay`` of an hour, each staged) against
plain ones (``--rounds`` pairs, every other one delayed first; the median of their ratios is
the one against the goal), and, for reference, what RabbitMQ alone does with publishes shaped
like staged copies (a new message id, a correlation id, the envelope's header table) against
plain ones, direct; the ratios against the goals; the bridge's CPU time per message and peak
RSS; and, for those plain and delayed publishes and the broker alone, where a message's CPU
went (the bridge, the broker when it listens on this machine, this client) against its wall
time: how many of the machine's cores the path kept busy.

The client is a minimal AMQP client on asyncio and pamqp that writes pre-built frames and
counts the broker's acks and deliveries from their bytes: its own cost per message is a few
microseconds, so the figures are the paths', not pika's. The do-nothing relay copies bytes both
ways with no parsing (the cost of the extra hop alone); ``--paths frontend`` adds the AMQP
front-end with no interceptors. Each relay and the bridge run in a process of their own; the
bridge with a staging prefix of its own and its engine off, so the delayed publishes wait on
staging queues that are deleted at the end. The bridge declares those lazy and of classic queue
version 2 (``--staging-queues as-before`` declares them first with no arguments, and the bridge
uses them so: held in memory, for comparison), and the broker-alone
reference puts its staged-shaped publishes on a queue declared the same way. Queue names start
with ``bench-amqp-``, not the test suite's ``jbt-`` (a test session deletes every ``jbt-``
queue when it ends).

Usage:
    .venv/bin/python bench/amqp.py                            # the issue's run: 100,000, once
    .venv/bin/python bench/amqp.py --count 30000 --rounds 3   # medians of three shorter rounds
    .venv/bin/python bench/amqp.py --staging-queues as-before # staging queues held in memory
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import statistics
import struct
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pamqp import body as pbody
from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from adapters.rabbitmq import CLASSIC_ARGUMENTS  # noqa: E402
from bridge.frontends.amqp.framer import Framer  # noqa: E402

GOALS = {"bridge/relay": 0.95, "delayed/plain": 0.5}
PATHS = ("direct", "relay", "frontend", "bridge")
ACK = commands.Basic.Ack.index
NACK = commands.Basic.Nack.index
DELIVER = commands.Basic.Deliver.index
_LONGLONG = struct.Struct(">Q")

RELAY_SOURCE = r"""
import asyncio, sys
listen, upstream = int(sys.argv[1]), int(sys.argv[2])
class Pipe(asyncio.Protocol):
    peer = None
    def connection_made(self, transport):
        self.transport = transport
    def data_received(self, data):
        self.peer.transport.write(data)
    def connection_lost(self, exc):
        if self.peer is not None:
            self.peer.transport.close()
class Client(Pipe):
    def connection_made(self, transport):
        super().connection_made(transport)
        transport.pause_reading()
        asyncio.ensure_future(self.open())
    async def open(self):
        loop = asyncio.get_running_loop()
        _, self.peer = await loop.create_connection(Pipe, "127.0.0.1", upstream)
        self.peer.peer = self
        self.transport.resume_reading()
async def main():
    server = await asyncio.get_running_loop().create_server(Client, "127.0.0.1", listen)
    await server.serve_forever()
asyncio.run(main())
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    from stomp_throughput import answers_200

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the bridge exited {proc.returncode} before it was ready")
        if answers_200(url):
            return
        time.sleep(0.1)
    raise SystemExit(f"the bridge was not ready ({url}) after {timeout:.0f} s")


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"process on {port} exited {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"nothing listens on {port} after {timeout:.0f} s")


# -- a minimal AMQP client ---------------------------------------------------------------------
class Client:
    """One connection, one channel; frames parsed by the bridge's own framer (no validation)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.framer = Framer(expect_header=False, validate=False, frame_max=0)
        self.frames: list[Any] = []
        self.frame_max = 131072

    async def open(self) -> None:
        self.r, self.w = await asyncio.open_connection("127.0.0.1", self.port, limit=1 << 20)
        self.w.write(b"AMQP\x00\x00\x09\x01")
        await self.expect(commands.Connection.Start)
        self.send(commands.Connection.StartOk(
            client_properties={"product": "jms-bridge bench"}, mechanism="PLAIN",
            response="\0guest\0guest"), 0)
        tune = await self.expect(commands.Connection.Tune)
        self.frame_max = tune.frame_max or self.frame_max
        self.send(commands.Connection.TuneOk(tune.channel_max, self.frame_max, 0), 0)
        self.send(commands.Connection.Open(virtual_host="/"), 0)
        await self.expect(commands.Connection.OpenOk)
        self.send(commands.Channel.Open(), 1)
        await self.expect(commands.Channel.OpenOk)

    def send(self, method: Any, channel: int = 1) -> None:
        self.w.write(pframe.marshal(method, channel))

    async def next_frame(self) -> Any:
        while not self.frames:
            data = await self.r.read(1 << 20)
            if not data:
                raise ConnectionError("connection closed")
            self.frames.extend(self.framer.feed(data))
        return self.frames.pop(0)

    async def expect(self, kind: type) -> Any:
        while True:
            frame = await self.next_frame()
            if frame.type != 1:
                continue
            method = frame.method
            if isinstance(method, (commands.Connection.Close, commands.Channel.Close)):
                raise ConnectionError(f"closed: {method.reply_code} {method.reply_text}")
            if isinstance(method, kind):
                return method

    def publish_bytes(self, queue: str, body: bytes, headers: dict[str, Any] | None,
                      props: Any = None, exchange: str = "") -> bytes:
        if props is None:
            props = commands.Basic.Properties(delivery_mode=1, headers=headers)
        return (pframe.marshal(commands.Basic.Publish(exchange=exchange, routing_key=queue), 1)
                + pframe.marshal(pheader.ContentHeader(0, len(body), props), 1)
                + pframe.marshal(pbody.ContentBody(body), 1))

    async def publish(self, queue: str, count: int, body: bytes, window: int,
                      headers: dict[str, Any] | None = None, props: Any = None,
                      exchange: str = "") -> float:
        """Publish ``count`` messages with confirms, ``window`` outstanding; seconds taken
        (to ``exchange`` with ``queue`` as the routing key)."""
        self.send(commands.Confirm.Select())
        await self.expect(commands.Confirm.SelectOk)
        one = self.publish_bytes(queue, body, headers, props, exchange)
        sent = confirmed = 0
        start = time.perf_counter()
        while confirmed < count:
            room = min(window - (sent - confirmed), count - sent)
            if room > 0:
                self.w.write(one * room)
                sent += room
            frame = await self.next_frame()
            if frame.type != 1:
                continue
            index = frame.method_index
            if index == ACK or index == NACK:
                if index == NACK:
                    raise SystemExit("the broker nacked a publish")
                # One queue: RabbitMQ confirms in order, so the highest tag is the count.
                confirmed = max(confirmed, _LONGLONG.unpack_from(frame.raw, 11)[0])
            elif index == commands.Channel.Close.index:
                raise SystemExit(f"publish refused: {frame.method.reply_text}")
        return time.perf_counter() - start

    async def consume(self, queue: str, count: int, prefetch: int) -> float:
        """Consume ``count`` messages, prefetch ``prefetch``, a multiple ack every 100."""
        self.send(commands.Basic.Qos(prefetch_count=prefetch))
        await self.expect(commands.Basic.QosOk)
        self.send(commands.Basic.Consume(queue=queue, consumer_tag="bench"))
        await self.expect(commands.Basic.ConsumeOk)
        got = 0
        start = time.perf_counter()
        while got < count:
            frame = await self.next_frame()
            if frame.type == 1 and frame.method_index == DELIVER:
                got += 1
                if got % 100 == 0 or got == count:
                    raw = frame.raw
                    tag = _LONGLONG.unpack_from(raw, 12 + raw[11])[0]
                    self.send(commands.Basic.Ack(delivery_tag=tag, multiple=True))
        elapsed = time.perf_counter() - start
        self.send(commands.Basic.Cancel(consumer_tag="bench"))
        await self.expect(commands.Basic.CancelOk)
        return elapsed

    async def declare(self, queue: str) -> None:
        self.send(commands.Queue.Declare(queue=queue, durable=False, auto_delete=False))
        await self.expect(commands.Queue.DeclareOk)

    async def delete(self, queue: str) -> None:
        self.send(commands.Queue.Delete(queue=queue))
        await self.expect(commands.Queue.DeleteOk)

    async def close(self) -> None:
        self.send(commands.Connection.Close(200, "bye", 0, 0), 0)
        try:
            await asyncio.wait_for(self.expect(commands.Connection.CloseOk), 5)
        except (ConnectionError, TimeoutError):
            pass
        self.w.close()


# -- processes ---------------------------------------------------------------------------------
@dataclass
class Proc:
    name: str
    port: int
    proc: subprocess.Popen[bytes]
    cpu_marks: list[float] = field(default_factory=list)

    def cpu_s(self) -> float:
        """User + system CPU seconds of the process and its children so far."""
        return cpu_s(_tree(self.proc.pid))

    def peak_rss_mb(self) -> float:
        """VmHWM of the main process (the front-end; the staging engine is a child)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of these processes so far (those gone count 0)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def listener_pid(port: int) -> int | None:
    """The process listening on ``port`` on this machine (the local RabbitMQ), for its CPU
    time; None when there is none here or ``ss`` cannot tell."""
    try:
        out = subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], capture_output=True,
                             text=True, timeout=5, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"pid=(\d+)", out)
    return int(found.group(1)) if found else None


class CpuMeter:
    """CPU µs a message of the bridge, the broker (when it runs here) and this client."""

    def __init__(self, bridge: Proc | None, broker: int | None) -> None:
        self.bridge, self.broker = bridge, broker

    def now(self) -> tuple[float, float, float]:
        mine = os.times()
        return (self.bridge.cpu_s() if self.bridge else 0.0,
                cpu_s([self.broker]) if self.broker else 0.0, mine.user + mine.system)

    def per_message(self, before: tuple[float, float, float], count: int, kind: str
                    ) -> dict[str, float]:
        after = self.now()
        out = {f"{kind}_client_cpu_us": (after[2] - before[2]) / count * 1e6}
        if self.bridge is not None:
            out[f"{kind}_cpu_us"] = (after[0] - before[0]) / count * 1e6
        if self.broker is not None:
            out[f"{kind}_broker_cpu_us"] = (after[1] - before[1]) / count * 1e6
        return out


def _tree(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, ()))
    return found


def start(args: argparse.Namespace, staging_prefix: str) -> dict[str, Proc]:
    procs: dict[str, Proc] = {}
    upstream = str(args.amqp_port)
    if "relay" in args.paths:
        port = free_port()
        procs["relay"] = Proc("relay", port, subprocess.Popen(
            [sys.executable, "-c", RELAY_SOURCE, str(port), upstream]))
    if "frontend" in args.paths:
        port = free_port()
        procs["frontend"] = Proc("frontend", port, subprocess.Popen(
            [sys.executable, "-m", "bridge.frontends.amqp.server", "--listen",
             f"127.0.0.1:{port}", "--upstream", f"127.0.0.1:{upstream}"], cwd=ROOT,
            stderr=subprocess.DEVNULL))
    admin = free_port()
    if "bridge" in args.paths or args.delayed:
        port = free_port()
        procs["bridge"] = Proc("bridge", port, subprocess.Popen(
            [sys.executable, "-m", "bridge.app.cli", "run", "--broker", "rabbitmq",
             "--upstream-stomp", f"stomp://127.0.0.1:{args.stomp_port}",
             "--stomp-listen", f"127.0.0.1:{free_port()}",
             "--admin-listen", f"127.0.0.1:{admin}",
             "--amqp-listen", f"127.0.0.1:{port}", "--staging-prefix", staging_prefix,
             "--staging-engine", "off", "--log-level", "warning"], cwd=ROOT))
    for p in procs.values():
        wait_port(p.port, p.proc)
    if "bridge" in procs:  # until its staging queues exist it refuses AMQP clients (320)
        wait_ready(f"http://127.0.0.1:{admin}/readyz", procs["bridge"].proc)
    return procs


# -- the run -----------------------------------------------------------------------------------
async def publish_and_consume(port: int, args: argparse.Namespace,
                              proc: Proc | None) -> dict[str, float]:
    body = b"x" * args.size
    queue = f"bench-amqp-{uuid.uuid4().hex[:8]}"
    client = Client(port)
    await client.open()
    await client.declare(queue)
    cpu0 = proc.cpu_s() if proc else 0.0
    published = await client.publish(queue, args.count, body, args.window)
    cpu1 = proc.cpu_s() if proc else 0.0
    consumer = Client(port)
    await consumer.open()
    consumed = await consumer.consume(queue, args.count, args.prefetch)
    cpu2 = proc.cpu_s() if proc else 0.0
    await consumer.close()
    await client.delete(queue)
    await client.close()
    out = {"publish": args.count / published, "consume": args.count / consumed}
    if proc is not None:
        out["publish_cpu_us"] = (cpu1 - cpu0) / args.count * 1e6
        out["consume_cpu_us"] = (cpu2 - cpu1) / args.count * 1e6
    return out


async def delayed_vs_plain(port: int, args: argparse.Namespace, proc: Proc,
                           delayed_first: bool = False) -> dict[str, float]:
    body = b"x" * args.size
    out: dict[str, float] = {}
    kinds: list[tuple[str, dict[str, Any] | None]] = [("plain", None),
                                                      ("delayed", {"x-delay": 3_600_000})]
    meter = CpuMeter(proc, listener_pid(args.amqp_port))
    for kind, headers in reversed(kinds) if delayed_first else kinds:
        queue = f"bench-amqp-{uuid.uuid4().hex[:8]}"
        client = Client(port)
        await client.open()
        await client.declare(queue)
        before = meter.now()
        elapsed = await client.publish(queue, args.count, body, args.window, headers)
        out[kind] = args.count / elapsed
        out.update(meter.per_message(before, args.count, kind))
        await client.delete(queue)
        await client.close()
    return out


def staged_shape(queue: str) -> Any:
    """Properties shaped like a staged copy of a transient message sent with ``x-delay``: a new
    message id, the original one as correlation id, and the envelope's header table."""
    from adapters import amqp_types
    from bridge.staging import envelope

    original, now = envelope.new_message_id(), int(time.time() * 1000)
    table = {amqp_types.TYPES_HEADER: amqp_types.encode({}, 1) or "",
             envelope.TARGET: f"/amq/queue/{queue}", envelope.DUE: str(now + 3_600_000),
             envelope.SENT: str(now), envelope.ENTERED: str(now), envelope.MESSAGE_ID: original}
    return commands.Basic.Properties(delivery_mode=1, headers=table, correlation_id=original,
                                     message_id=envelope.new_message_id())


async def broker_alone(args: argparse.Namespace) -> dict[str, float]:
    """Direct to RabbitMQ, no bridge: plain publishes and publishes shaped like staged copies,
    each to a durable queue as the staging queues are (what the broker itself does with them)."""
    body = b"x" * args.size
    out: dict[str, float] = {}
    meter = CpuMeter(None, listener_pid(args.amqp_port))
    for kind in ("plain", "staged-shaped"):
        queue = f"bench-amqp-{uuid.uuid4().hex[:8]}"
        client = Client(args.amqp_port)
        await client.open()
        staged = kind == "staged-shaped"  # on a queue like the staging queues
        client.send(commands.Queue.Declare(queue=queue, durable=True, arguments=(
            CLASSIC_ARGUMENTS if staged and args.staging_queues == "declared" else None)))
        await client.expect(commands.Queue.DeclareOk)
        props = staged_shape(queue) if staged else None
        before = meter.now()
        out[kind] = args.count / await client.publish(queue, args.count, body, args.window,
                                                      props=props)
        out.update(meter.per_message(before, args.count, kind))
        await client.delete(queue)
        await client.close()
    return out


STAGING_SHOWN = {"declared": "as the bridge declares them (lazy, classic queue version 2)",
                 "as-before": "declared first with no arguments, as bridges before left them "
                              "(held in memory)"}


def declare_as_before(args: argparse.Namespace, prefix: str) -> None:
    """The staging queues declared with no arguments before the bridge starts: it uses them as
    they are (``adapters.rabbitmq``), as it does queues an earlier bridge made."""
    import pika

    from adapters.rabbitmq import FORMAT
    from bridge.staging.levels import layout_for

    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", args.amqp_port))
    channel = conn.channel()
    for queue in layout_for(FORMAT, prefix).all_queues:
        channel.queue_declare(queue, durable=True)
    conn.close()


def staging_settings(prefix: str) -> dict[str, dict[str, Any]]:
    """The arguments of each staging queue, as RabbitMQ's management API gives them."""
    from scale_common import _management

    try:
        rows = _management(argparse.Namespace(), "/queues/%2F?columns=name,arguments")
    except (OSError, ValueError) as exc:
        return {"error": {"management API": str(exc)}}
    return {r["name"]: r.get("arguments") or {} for r in rows
            if r["name"].startswith(prefix + ".")}


def purge_staging(args: argparse.Namespace, prefix: str) -> int:
    """Delete the bench bridge's staging queues (what the delayed publishes staged)."""
    import pika

    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", args.amqp_port))
    channel = conn.channel()
    from adapters.rabbitmq import FORMAT
    from bridge.staging.levels import layout_for

    removed = 0
    for queue in layout_for(FORMAT, prefix).all_queues:
        try:
            removed += channel.queue_delete(queue).method.message_count
        except pika.exceptions.ChannelClosedByBroker:
            channel = conn.channel()
    conn.close()
    return removed


def fmt(value: float | None, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100_000,
                        help="messages per phase (the issue's figure: 100000)")
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--prefetch", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--paths", default="direct,relay,bridge",
                        type=lambda s: [p for p in s.split(",") if p])
    parser.add_argument("--no-delayed", dest="delayed", action="store_false")
    parser.add_argument("--staging-queues", choices=("declared", "as-before"),
                        default="declared",
                        help="RabbitMQ: the staging queues as the bridge declares them (lazy, "
                             "classic queue version 2), or declared first with no arguments "
                             "(held in memory), for comparison")
    parser.add_argument("--amqp-port", type=int, default=5672)
    parser.add_argument("--stomp-port", type=int, default=61613)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    for path in args.paths:
        if path not in PATHS:
            parser.error(f"--paths: {path!r} is not one of {', '.join(PATHS)}")
    prefix = f"bench-amqp-staging-{uuid.uuid4().hex[:8]}"
    if args.staging_queues == "as-before":
        declare_as_before(args, prefix)
    print(f"staging queues: {STAGING_SHOWN[args.staging_queues]}", flush=True)
    procs = start(args, prefix)
    results: dict[str, list[dict[str, float]]] = {p: [] for p in args.paths}
    report: dict[str, Any] = {"config": {k: getattr(args, k) for k in (
        "count", "size", "window", "prefetch", "rounds", "paths")}}
    try:
        for rnd in range(args.rounds):
            order = args.paths[rnd % len(args.paths):] + args.paths[:rnd % len(args.paths)]
            for path in order:
                port = args.amqp_port if path == "direct" else procs[path].port
                found = asyncio.run(publish_and_consume(port, args, procs.get(path)))
                results[path].append(found)
                print(f"round {rnd + 1} {path:9} publish {fmt(found['publish']):>8}/s  "
                      f"consume {fmt(found['consume']):>8}/s", flush=True)
        medians = {p: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                   for p, runs in results.items() if runs}
        report["paths"] = medians
        delayed = None
        if args.delayed:
            # A round each, every other one delayed first: one run of each swings by a
            # quarter from run to run here (the broker's confirm stalls, two shared cores).
            pairs = []
            for rnd in range(args.rounds):
                pair = asyncio.run(delayed_vs_plain(procs["bridge"].port, args, procs["bridge"],
                                                    delayed_first=rnd % 2 == 1))
                pairs.append(pair)
                print(f"round {rnd + 1} through the bridge: plain {fmt(pair['plain']):>8}/s  "
                      f"delayed {fmt(pair['delayed']):>8}/s  "
                      f"({pair['delayed'] / pair['plain']:.3f})", flush=True)
            delayed = {k: statistics.median(p[k] for p in pairs) for k in pairs[0]}
            delayed["ratio"] = statistics.median(p["delayed"] / p["plain"] for p in pairs)
            report["delayed"] = delayed
            report["broker_alone"] = asyncio.run(broker_alone(args))
        if "bridge" in procs:
            report["bridge_peak_rss_mb"] = procs["bridge"].peak_rss_mb()
    finally:
        for p in procs.values():
            p.stop()
        # The bridge declares its staging queues whether or not anything was delayed.
        if "bridge" in procs and args.delayed:
            report["staging_queues"] = staging_settings(prefix)
        purged = purge_staging(args, prefix) if "bridge" in procs else 0
        report["staged_purged"] = purged if args.delayed else 0

    print(f"\n{args.count:,} messages of {args.size} B, confirms window {args.window}, "
          f"prefetch {args.prefetch}, {args.rounds} round(s) (medians)")
    print(f"  {'path':10}{'publish/s':>12}{'consume/s':>12}{'CPU µs/msg pub':>16}"
          f"{'CPU µs/msg con':>16}")
    for path, m in medians.items():
        print(f"  {path:10}{fmt(m['publish']):>12}{fmt(m['consume']):>12}"
              f"{fmt(m.get('publish_cpu_us'), '.1f'):>16}{fmt(m.get('consume_cpu_us'), '.1f'):>16}")
    ratios: dict[str, float] = {}
    if "bridge" in medians and "relay" in medians:
        for phase in ("publish", "consume"):
            ratios[f"bridge/relay {phase}"] = medians["bridge"][phase] / medians["relay"][phase]
    if "relay" in medians and "direct" in medians:
        for phase in ("publish", "consume"):
            ratios[f"relay/direct {phase}"] = medians["relay"][phase] / medians["direct"][phase]
    if delayed is not None:
        ratios["delayed/plain publish"] = delayed["ratio"]  # the median of the rounds' ratios
        print(f"  through the bridge: plain {fmt(delayed['plain'])}/s "
              f"({delayed['plain_cpu_us']:.1f} CPU µs/msg), delayed {fmt(delayed['delayed'])}/s "
              f"({delayed['delayed_cpu_us']:.1f} CPU µs/msg); {report['staged_purged']:,} staged "
              "copies purged")
        for kind in ("plain", "delayed"):
            print("  " + budget(f"{kind} through the bridge", delayed, kind))
    held = report.get("staging_queues")
    if held and "error" not in held:
        lazy = sum(1 for q in held.values() if q == CLASSIC_ARGUMENTS)
        print(f"  staging queues: {len(held)}, {lazy} of them declared lazy and of version 2")
    alone = report.get("broker_alone")
    if alone is not None:
        print(f"  the broker alone (direct, durable queues; staged-shaped ones on a queue "
              f"{STAGING_SHOWN[args.staging_queues]}): plain {fmt(alone['plain'])}/s, "
              f"staged-shaped {fmt(alone['staged-shaped'])}/s "
              f"({alone['staged-shaped'] / alone['plain']:.3f})")
        for kind in ("plain", "staged-shaped"):
            print("  " + budget(f"{kind}, the broker alone", alone, kind))
    for name, value in ratios.items():
        goal = GOALS.get(name.rsplit(" ", 1)[0])
        verdict = "" if goal is None else (" (goal {:.2f}: {})".format(
            goal, "met" if value >= goal else "NOT met"))
        print(f"  {name:24}{value:6.3f}{verdict}")
    if "bridge_peak_rss_mb" in report:
        print(f"  bridge peak RSS {report['bridge_peak_rss_mb']:.1f} MB (front-end process)")
    report["ratios"] = ratios
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


def budget(name: str, figures: dict[str, float], kind: str) -> str:
    """Where a message's CPU went (bridge, broker, this client) against its wall time: how many
    of the machine's cores the path kept busy."""
    parts = [(who, figures.get(f"{kind}{suffix}")) for who, suffix in (
        ("bridge", "_cpu_us"), ("broker", "_broker_cpu_us"), ("client", "_client_cpu_us"))]
    known = [(who, us) for who, us in parts if us is not None]
    total = sum(us for _, us in known)
    wall = 1e6 / figures[kind]
    return (f"CPU a message, {name}: " + " + ".join(f"{who} {us:.1f}" for who, us in known)
            + f" = {total:.1f} µs, in {wall:.1f} µs of wall time ({total / wall:.2f} cores busy"
            f" of {os.cpu_count()})")


if __name__ == "__main__":
    raise SystemExit(main())

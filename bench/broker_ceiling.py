"""The brokers' own ceiling on this machine: persistent publish and queue-to-queue move rates.

The staging engine releases a due message by consuming it from a staging queue, publishing a
persistent copy to its target and acking the staged one. The issue asks for 100,000 persistent
100-byte messages due at once to be on their targets within 5 s, i.e. at least 20,000 such
moves a second. This script measures how fast the fastest client available here can do that
with no engine at all, so that a miss can be put down to the engine or to the broker:

* publish: ``--count`` persistent messages of ``--size`` bytes into ``ceiling-...-src``, from
  the first send to the last confirm (RabbitMQ) or to the last commit / broker answer (ActiveMQ);
* move: every message from ``ceiling-...-src`` to ``ceiling-...-dst``, consumed, published
  persistent and acked on the source once its copy is safe, from the start until the last
  source ack is settled and the last copy confirmed. Both queues are then counted.

Clients:

* RabbitMQ (classic durable and quorum queues): a minimal asyncio client in this file writing
  raw AMQP 0-9-1 frames (built once with pamqp), reading only the frame boundaries and the few
  bytes it needs. Publish: confirms, ``--window`` outstanding. Move, two ways: ``confirm`` (one
  connection consumes with a prefetch of ``--prefetch`` and forwards each delivery's own
  header and body frames to a second, confirm-mode connection; a multiple ack on the source
  follows every confirm) and ``tx`` (one channel in transactions: ``--batch`` deliveries
  published and acked, then Tx.Commit; the broker refuses anything on the channel until
  Commit-Ok, so deliveries arriving meanwhile wait for the next transaction).
* ActiveMQ: the OpenWire JMS client from /usr/share/activemq/lib, in a small Java program
  (bench/broker_ceiling_java/Ceiling.java) compiled with javac into a temporary folder. Publish:
  transacted sessions committing every ``--batch`` (and, for comparison, non-transacted sends
  each answered by the broker, ``--window`` unanswered). Move: a transacted session receiving
  ``--batch``, sending them on and committing (prefetch ``--prefetch``), in ``--activemq-threads``
  connections at once. Queues are removed at the end with
  ActiveMQConnection.destroyDestination (OpenWire's remove-destination command, no JMX needed).

The broker's CPU time during each phase comes from /proc (this machine has 2 cores; the client
competes with the broker for them). A phase that takes longer than ``--limit`` seconds (180) is
stopped and reported as such. New broker log lines about memory, alarms, flow control, warnings
and errors are printed at the end. Only queues named ``ceiling-*`` (``--queue-prefix``) are
used, and deleted.

Another bench measures the same with ``measure(broker, options(...), kind)``: bench/scale_burst.py
sets a burst's release time beside the broker's own move of as many messages.

Usage:
    PYTHONPATH=. .venv/bin/python bench/broker_ceiling.py [--count 100000]
        [--brokers rabbitmq,activemq]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from pamqp import body as pbody
from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader

ACTIVEMQ_LIB = Path("/usr/share/activemq/lib")
ACTIVEMQ_CONF = Path("/var/lib/jms-bridge/activemq/conf/activemq.xml")
ACTIVEMQ_LOG = Path("/var/lib/jms-bridge/activemq/log/activemq.log")
RABBITMQ_LOG_DIR = Path("/var/log/rabbitmq")
LOG_WORDS = ("memory", "alarm", "flow", "blocked", "warn", "error")

_HEAD = struct.Struct(">BHI")
_UINT = struct.Struct(">I")
_ULONGLONG = struct.Struct(">Q")
DELIVER = commands.Basic.Deliver.index
ACK = commands.Basic.Ack.index
NACK = commands.Basic.Nack.index
COMMIT_OK = commands.Tx.CommitOk.index
CLOSES = {commands.Channel.Close.index, commands.Connection.Close.index}
# --rabbitmq-queues: classic (3.10's default, version 1), classic-v2 (3.10's new classic queue
# store, per queue), quorum.
QUEUE_ARGUMENTS: dict[str, dict[str, Any]] = {
    "classic": {}, "classic-v2": {"x-queue-version": 2}, "quorum": {"x-queue-type": "quorum"}}


# -- results -----------------------------------------------------------------------------------
@dataclass
class Phase:
    """One timed phase: seconds (None when stopped), CPU seconds of the broker and the client."""

    name: str
    count: int
    seconds: float | None = None
    broker_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    note: str = ""
    move: bool = False  # a queue-to-queue move (not a publish)

    def row(self) -> str:
        if self.seconds is None:
            return f"  {self.name:<56} {'-':>9} {'-':>9}   {self.note}"
        rate = self.count / self.seconds
        share = self.broker_cpu_s / self.seconds * 100
        return (f"  {self.name:<56} {rate:>9,.0f} {self.seconds:>9.2f}   broker CPU {share:3.0f} %"
                f", client CPU {self.client_cpu_s:5.2f} s{'  ' + self.note if self.note else ''}")


@dataclass
class Case:
    broker: str
    title: str
    client: str
    phases: list[Phase] = field(default_factory=list)

    def first_move(self) -> Phase | None:
        return next((phase for phase in self.phases if phase.move), None)

    def show(self) -> None:
        print(f"\n{self.broker}: {self.title}\n  client: {self.client}")
        print(f"  {'phase':<56} {'msg/s':>9} {'seconds':>9}")
        for phase in self.phases:
            print(phase.row())


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a process (its threads included), from /proc."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def find_pid(*needles: str) -> int | None:
    """The first process whose command line holds every needle (the broker's JVM or VM)."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if all(n in text for n in needles):
            return int(cmdline.parent.name)
    return None


# -- a minimal AMQP 0-9-1 client ---------------------------------------------------------------
class Amqp:
    """One connection with channel 1 open; frames are returned as their raw bytes."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.rest = b""  # the start of a frame not complete yet
        self.unread: list[bytes] = []  # frames read after the one expect() waited for

    async def open(self) -> Amqp:
        self.reader, self.writer = await asyncio.open_connection(
            self.host, self.port, limit=1 << 22)
        self.writer.write(b"AMQP\x00\x00\x09\x01")
        await self.expect(commands.Connection.Start)
        self.send(commands.Connection.StartOk(
            client_properties={"product": "jms-bridge broker_ceiling"}, mechanism="PLAIN",
            response="\0guest\0guest"), 0)
        tune = await self.expect(commands.Connection.Tune)
        self.frame_max = tune.frame_max
        self.send(commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0), 0)
        self.send(commands.Connection.Open(virtual_host="/"), 0)
        await self.expect(commands.Connection.OpenOk)
        self.send(commands.Channel.Open(), 1)
        await self.expect(commands.Channel.OpenOk)
        return self

    def send(self, method: Any, channel: int = 1) -> None:
        self.writer.write(pframe.marshal(method, channel))

    async def frames(self) -> list[bytes]:
        """The complete frames in the next read (at least one)."""
        if self.unread:
            out, self.unread = self.unread, []
            return out
        while True:
            data = await self.reader.read(1 << 20)
            if not data:
                raise ConnectionError("the broker closed the connection")
            data = self.rest + data if self.rest else data
            out, pos, end = [], 0, len(data)
            while end - pos >= 7:
                size = _HEAD.unpack_from(data, pos)[2]
                if end - pos < size + 8:
                    break
                out.append(data[pos:pos + size + 8])
                pos += size + 8
            self.rest = data[pos:]
            if out:
                return out

    async def expect(self, kind: type) -> Any:
        """Skip frames until a method of ``kind``; a Close from the broker raises."""
        while True:
            frames = await self.frames()
            for i, raw in enumerate(frames):
                if raw[0] != 1:
                    continue
                method = pframe.unmarshal(raw)[2]
                if isinstance(method, (commands.Connection.Close, commands.Channel.Close)):
                    raise ConnectionError(f"{method.reply_code} {method.reply_text}")
                if isinstance(method, kind):
                    self.unread = frames[i + 1:]
                    return method

    async def call(self, method: Any, reply: type) -> Any:
        self.send(method)
        return await self.expect(reply)

    async def close(self) -> None:
        try:
            self.send(commands.Connection.Close(200, "bye", 0, 0), 0)
            await asyncio.wait_for(self.expect(commands.Connection.CloseOk), 5)
        except (ConnectionError, OSError, TimeoutError):
            pass
        self.writer.close()


def method_index(raw: bytes) -> int:
    return int(_UINT.unpack_from(raw, 7)[0])


def check_not_closed(raw: bytes) -> None:
    if method_index(raw) in CLOSES:
        method = pframe.unmarshal(raw)[2]
        raise ConnectionError(f"closed by the broker: {method.reply_code} {method.reply_text}")


class Confirms:
    """Publisher confirms: ``upto`` is the highest tag below which every publish is confirmed."""

    def __init__(self) -> None:
        self.upto = 0
        self.singles: set[int] = set()

    def feed(self, raw: bytes) -> None:
        index = method_index(raw)
        if index == NACK:
            raise RuntimeError("the broker nacked a publish")
        if index != ACK:
            check_not_closed(raw)
            return
        tag = _ULONGLONG.unpack_from(raw, 11)[0]
        if raw[19] & 1:
            self.upto = max(self.upto, tag)
        else:
            self.singles.add(tag)
        while self.upto + 1 in self.singles:
            self.singles.remove(self.upto + 1)
            self.upto += 1


def publish_frame(queue: str) -> bytes:
    return pframe.marshal(commands.Basic.Publish(exchange="", routing_key=queue), 1)


def persistent_message(queue: str, body: bytes) -> bytes:
    """The three frames of one persistent publish to ``queue`` via the default exchange."""
    props = commands.Basic.Properties(delivery_mode=2)
    return (publish_frame(queue)
            + pframe.marshal(pheader.ContentHeader(0, len(body), props), 1)
            + pframe.marshal(pbody.ContentBody(body), 1))


async def publish(conn: Amqp, queue: str, count: int, size: int, window: int) -> None:
    """``count`` persistent messages with confirms, at most ``window`` unconfirmed."""
    await conn.call(commands.Confirm.Select(), commands.Confirm.SelectOk)
    one = persistent_message(queue, b"x" * size)
    confirms, sent = Confirms(), 0
    while confirms.upto < count:
        room = min(window - (sent - confirms.upto), count - sent)
        if room > 0:
            conn.writer.write(one * room)
            sent += room
        for raw in await conn.frames():
            if raw[0] == 1:
                confirms.feed(raw)


async def consume(conn: Amqp, queue: str, prefetch: int) -> None:
    await conn.call(commands.Basic.Qos(prefetch_count=prefetch), commands.Basic.QosOk)
    await conn.call(commands.Basic.Consume(queue=queue, consumer_tag="ceiling"),
                    commands.Basic.ConsumeOk)


async def cancel(conn: Amqp) -> None:
    """Basic.Cancel and its Cancel-Ok: the broker has handled every earlier frame (the acks)."""
    await conn.call(commands.Basic.Cancel(consumer_tag="ceiling"), commands.Basic.CancelOk)


def delivery_tag(raw: bytes) -> int:
    return int(_ULONGLONG.unpack_from(raw, 12 + raw[11])[0])


async def move_confirm(src: Amqp, dst: Amqp, source: str, target: str, count: int,
                       prefetch: int) -> None:
    """Forward each delivery from ``src`` to ``dst`` (confirm mode); ack sources once confirmed.

    The n-th publish on ``dst`` is the n-th delivery on ``src``: ``tags`` maps one to the other.
    Bodies are smaller than frame_max, so each delivery is three frames.
    """
    await dst.call(commands.Confirm.Select(), commands.Confirm.SelectOk)
    await consume(src, source, prefetch)
    publish_target = publish_frame(target)
    tags: list[int] = []

    async def forward() -> None:
        bodies = 0
        while bodies < count:
            out = []
            for raw in await src.frames():
                kind = raw[0]
                if kind == 1:
                    if method_index(raw) == DELIVER:
                        tags.append(delivery_tag(raw))
                        out.append(publish_target)
                    else:
                        check_not_closed(raw)
                elif kind in (2, 3):
                    out.append(raw)
                    bodies += kind == 3
            if out:
                dst.writer.write(b"".join(out))

    async def settle() -> None:
        confirms, acked = Confirms(), 0
        while acked < count:
            for raw in await dst.frames():
                if raw[0] == 1:
                    confirms.feed(raw)
            if confirms.upto > acked:
                acked = confirms.upto
                src.send(commands.Basic.Ack(delivery_tag=tags[acked - 1], multiple=True))

    await asyncio.gather(forward(), settle())
    await cancel(src)


async def move_tx(conn: Amqp, source: str, target: str, count: int, prefetch: int,
                  batch: int) -> None:
    """One channel in transactions of ``batch``: publish copies, multiple ack, Tx.Commit."""
    await conn.call(commands.Tx.Select(), commands.Tx.SelectOk)
    await consume(conn, source, prefetch)
    publish_target = publish_frame(target)
    held: list[tuple[int, bytes]] = []  # (delivery tag, publish + header + body)
    tag, header, moved, committing = 0, b"", 0, 0
    while moved < count:
        for raw in await conn.frames():
            kind = raw[0]
            if kind == 1:
                index = method_index(raw)
                if index == DELIVER:
                    tag = delivery_tag(raw)
                elif index == COMMIT_OK:
                    moved, committing = moved + committing, 0
                else:
                    check_not_closed(raw)
            elif kind == 2:
                header = raw
            elif kind == 3:
                held.append((tag, publish_target + header + raw))
        if not committing and held and (len(held) >= batch or moved + len(held) >= count):
            take, held = held[:batch], held[batch:]
            conn.writer.write(b"".join(m for _, m in take) + pframe.marshal(
                commands.Basic.Ack(delivery_tag=take[-1][0], multiple=True), 1)
                + pframe.marshal(commands.Tx.Commit(), 1))
            committing = len(take)
    await cancel(conn)


async def declare(conn: Amqp, queue: str, arguments: dict[str, Any]) -> None:
    await conn.call(commands.Queue.Declare(queue=queue, durable=True, arguments=arguments),
                    commands.Queue.DeclareOk)


async def depth(conn: Amqp, queue: str) -> int:
    ok = await conn.call(commands.Queue.Declare(queue=queue, passive=True),
                         commands.Queue.DeclareOk)
    return int(ok.message_count)


async def delete_queues(host: str, port: int, *queues: str) -> None:
    conn = await Amqp(host, port).open()
    for queue in queues:
        await conn.call(commands.Queue.Delete(queue=queue), commands.Queue.DeleteOk)
    await conn.close()


async def timed(phase: Phase, work: Callable[[], Awaitable[None]], broker_pid: int | None,
                limit: float) -> bool:
    """Run ``work`` into ``phase``; False when it failed or took over ``limit`` seconds."""
    cpu0, own0, t0 = cpu_seconds(broker_pid), time.process_time(), time.perf_counter()
    try:
        await asyncio.wait_for(work(), limit)
    except TimeoutError:
        phase.note = f"stopped after {limit:.0f} s"
        return False
    except (ConnectionError, RuntimeError) as exc:
        phase.note = f"failed: {exc}"
        return False
    phase.seconds = time.perf_counter() - t0
    phase.broker_cpu_s = cpu_seconds(broker_pid) - cpu0
    phase.client_cpu_s = time.process_time() - own0
    return True


async def rabbitmq_move(args: argparse.Namespace, mode: str, source: str, target: str,
                        pid: int | None) -> tuple[Phase, int, int]:
    """One move of every message from ``source`` to ``target``; (phase, left, arrived)."""
    confirm = mode == "confirm"
    how = (f"confirms, prefetch {args.prefetch:,}" if confirm
           else f"transactions of {args.batch:,}, prefetch {args.prefetch:,}")
    phase = Phase(f"move {source[-3:]}->{target[-3:]} ({how})", args.count, move=True)
    conns = [await Amqp(args.host, args.amqp_port).open() for _ in range(2 if confirm else 1)]
    if confirm:
        work = partial(move_confirm, *conns, source, target, args.count, args.prefetch)
    else:
        work = partial(move_tx, *conns, source, target, args.count, args.prefetch, args.batch)
    await timed(phase, work, pid, args.limit)
    for conn in conns:
        await conn.close()
    check = await Amqp(args.host, args.amqp_port).open()
    left, arrived = await depth(check, source), await depth(check, target)
    await check.close()
    return phase, left, arrived


async def rabbitmq_case(args: argparse.Namespace, kind: str) -> Case:
    """Publish into src, move src->dst with confirms, then dst->src in transactions (or the
    moves of ``--rabbitmq-moves``, there and back in turn)."""
    arguments = QUEUE_ARGUMENTS[kind]
    src, dst = f"{args.queue_prefix}-{kind}-src", f"{args.queue_prefix}-{kind}-dst"
    case = Case("RabbitMQ", f"{kind} durable queues {src}, {dst}",
                "raw AMQP 0-9-1 frames on asyncio (pamqp-built), this file's Amqp class")
    pid = find_pid("beam.smp", "rabbit")
    await delete_queues(args.host, args.amqp_port, src, dst)
    conn = await Amqp(args.host, args.amqp_port).open()
    await declare(conn, src, arguments)
    await declare(conn, dst, arguments)
    phase = Phase(f"publish persistent (confirms, window {args.window:,})", args.count)
    case.phases.append(phase)
    ok = await timed(phase, partial(publish, conn, src, args.count, args.size, args.window),
                     pid, args.limit)
    await conn.close()
    there_and_back = [(src, dst), (dst, src)]
    legs = [(mode, *there_and_back[i % 2])
            for i, mode in enumerate(args.rabbitmq_moves.split(","))]
    for mode, source, target in legs if ok else []:
        phase, left, arrived = await rabbitmq_move(args, mode, source, target, pid)
        case.phases.append(phase)
        if phase.seconds is not None and (left, arrived) != (0, args.count):
            phase.note += f"  COUNTS: {left} left on source, {arrived} on target"
        if phase.seconds is None:
            break
    await delete_queues(args.host, args.amqp_port, src, dst)
    return case


# -- ActiveMQ through a Java OpenWire client ---------------------------------------------------
# The Java program: bench/broker_ceiling_java/Ceiling.java.
JAVA_SOURCE = Path(__file__).with_name("broker_ceiling_java") / "Ceiling.java"


@dataclass
class Java:
    """The compiled Ceiling program and how to run one phase of it."""

    folder: Path
    url: str
    limit: float

    @classmethod
    def build(cls, url: str, limit: float) -> Java:
        if shutil.which("javac") is None:
            raise RuntimeError("javac not found: the ActiveMQ case needs a JDK")
        folder = Path(tempfile.mkdtemp(prefix="broker-ceiling-"))
        shutil.copy(JAVA_SOURCE, folder / "Ceiling.java")
        java = cls(folder, url, limit)
        # javac's own JIT at its first tier only: it compiles one small file (half the time).
        subprocess.run(["javac", "-J-XX:TieredStopAtLevel=1", "-nowarn", "-cp", java.classpath(),
                        "-d", str(folder), str(folder / "Ceiling.java")], check=True)
        return java

    def classpath(self) -> str:
        return ":".join([str(self.folder), *map(str, sorted(ACTIVEMQ_LIB.glob("*.jar")))])

    def run(self, phases: str, src: str, dst: str = "-", count: int = 0, batch: int = 0,
            threads: int = 1, size: int = 0, pid: int | None = None) -> list[dict[str, Any]]:
        """Phases joined by "+" in one JVM (a start-up less each): an answer for each, its JSON
        line, a timed one with the CPU seconds of the broker (``pid``) since the answer before
        it (or the start, the JVM's start-up included); {"error": ...} in place of the first
        one that did not answer, and last. ``limit`` seconds a phase, or the JVM is killed."""
        cmd = ["java", "-cp", self.classpath(), "Ceiling", self.url, phases, src, dst,
               str(count), str(batch), str(threads), str(size)]
        wanted = len(phases.split("+"))
        answers: list[dict[str, Any]] = []
        with tempfile.TemporaryFile("w+") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
            killed = threading.Event()
            timer = threading.Timer(self.limit * wanted, lambda: (killed.set(), proc.kill()))
            timer.start()
            cpu = cpu_seconds(pid)
            try:
                for line in proc.stdout or ():
                    if line.startswith("{"):
                        answers.append(json.loads(line))
                        if "seconds" in answers[-1]:
                            now = cpu_seconds(pid)
                            answers[-1]["broker_cpu_s"], cpu = now - cpu, now
                proc.wait()
            finally:
                timer.cancel()
            if len(answers) < wanted:
                err.seek(0)
                errors = [line for line in err.read().splitlines() if "SLF4J" not in line]
                why = (f"stopped after {self.limit * wanted:.0f} s" if killed.is_set()
                       else (errors or [f"exit {proc.returncode}"])[0][:200])
                answers.append({"error": why})
        return answers

    def destroy(self, src: str, dst: str) -> str:
        """Remove both queues; a consumer left by a killed JVM can hold one for ~30 s."""
        for _ in range(8):
            answer = self.run("destroy", src, dst)[-1]
            if "error" not in answer:
                return ""
            time.sleep(10)
        return str(answer["error"])


def openwire_port() -> int:
    """The openwire transportConnector's port in the broker's activemq.xml (61616 if none)."""
    text = ACTIVEMQ_CONF.read_text() if ACTIVEMQ_CONF.exists() else ""
    found = re.search(r'name="openwire"\s+uri="tcp://[^:]+:(\d+)', text)
    return int(found.group(1)) if found else 61616


def java_phase(phase: Phase, answer: dict[str, Any]) -> bool:
    """``phase`` from the Java program's answer for it."""
    if "error" in answer:
        phase.note = str(answer["error"])
        return False
    phase.seconds = float(answer["seconds"])
    phase.client_cpu_s = float(answer["client_cpu_s"])
    phase.broker_cpu_s = float(answer["broker_cpu_s"])
    return True


def activemq_case(args: argparse.Namespace) -> Case:
    """Publish in transactions, move src->dst in transactions; then non-transacted publishes."""
    url = (f"tcp://{args.host}:{openwire_port()}?jms.prefetchPolicy.queuePrefetch="
           f"{args.prefetch}&jms.watchTopicAdvisories=false")
    java = Java.build(url, args.limit)
    try:
        return activemq_phases(args, java)
    finally:
        shutil.rmtree(java.folder, ignore_errors=True)


def activemq_phases(args: argparse.Namespace, java: Java) -> Case:
    src, dst = f"{args.queue_prefix}-src", f"{args.queue_prefix}-dst"
    case = Case("ActiveMQ", f"queues {src}, {dst} (KahaDB)",
                f"OpenWire JMS client ({ACTIVEMQ_LIB}/activemq-client.jar) in a Java program, "
                f"{args.activemq_threads} connection(s)")
    pid = find_pid("java", "activemq.jar")
    count, threads = args.count, args.activemq_threads
    if args.remove_leftovers and (error := java.destroy(src, dst)):
        case.phases.append(Phase("remove leftover queues", 0, note=error))
        return case
    publish_tx = Phase(f"publish persistent (transactions of {args.batch:,})", count)
    move = Phase(f"move src->dst (transactions of {args.batch:,}, prefetch {args.prefetch:,})",
                 count, move=True)
    case.phases += [publish_tx, move]
    # One JVM; the broker's CPU time of the publish includes the JVM's start-up: a little high.
    answers = java.run("publish-tx+move+sizes+destroy", src, dst, count, args.batch, threads,
                       args.size, pid=pid)
    if java_phase(publish_tx, answers[0]) and java_phase(move, answers[1]):
        sizes = answers[2]
        if sizes.get(src) != 0 or sizes.get(dst) != count:
            move.note += f"  COUNTS (statistics plugin): {sizes}"
    if "error" in answers[-1] and (error := java.destroy(src, dst)):
        case.phases.append(Phase("remove queues", 0, note=error))
        return case
    if args.activemq_async:
        one_by_one = Phase(f"publish persistent (each answered, window {args.window:,})", count)
        case.phases.append(one_by_one)
        java_phase(one_by_one, java.run("publish-async", src, dst, count, args.window, threads,
                                        args.size, pid=pid)[0])
        if error := java.destroy(src, dst):
            case.phases.append(Phase("remove queues", 0, note=error))
    return case


# -- logs and main -----------------------------------------------------------------------------
def log_files() -> list[Path]:
    files = sorted(RABBITMQ_LOG_DIR.glob("*.log")) if RABBITMQ_LOG_DIR.exists() else []
    return [*files, ACTIVEMQ_LOG]


def log_sizes() -> dict[Path, int]:
    return {f: f.stat().st_size for f in log_files() if f.exists()}


def show_new_log_lines(before: dict[Path, int], shown: int = 5) -> None:
    """Lines written to the broker logs since ``before`` that mention LOG_WORDS."""
    print("\nbroker log lines written during the run about " + ", ".join(LOG_WORDS) + ":")
    for path in log_sizes():
        with path.open("rb") as f:
            f.seek(before.get(path, 0))
            new = f.read().decode(errors="replace").splitlines()
        hits = [line for line in new if any(w in line.lower() for w in LOG_WORDS)]
        print(f"  {path}: {len(new)} new lines, {len(hits)} matching")
        for line in hits[:shown]:
            print(f"    {line[:220]}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=100_000)
    p.add_argument("--size", type=int, default=100, help="body bytes (below frame_max)")
    p.add_argument("--brokers", default="rabbitmq,activemq")
    p.add_argument("--rabbitmq-queues", default="classic,quorum",
                   help=f"of {', '.join(QUEUE_ARGUMENTS)}")
    p.add_argument("--rabbitmq-moves", default="confirm,tx",
                   help="the RabbitMQ moves to time, there and back in turn: confirm (confirm "
                        "mode) or tx (transactions)")
    p.add_argument("--window", type=int, default=5000, help="unconfirmed publishes at most")
    p.add_argument("--prefetch", type=int, default=5000)
    p.add_argument("--batch", type=int, default=1000, help="messages per transaction")
    p.add_argument("--activemq-threads", type=int, default=1)
    p.add_argument("--activemq-async", action=argparse.BooleanOptionalAction, default=True,
                   help="also time ActiveMQ publishes each answered by the broker")
    p.add_argument("--limit", type=float, default=180.0, help="seconds a phase may take")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--amqp-port", type=int, default=5672)
    p.add_argument("--queue-prefix", default="ceiling", help="the queues' names start with it")
    p.add_argument("--remove-leftovers", action=argparse.BooleanOptionalAction, default=True,
                   help="first remove the queues a stopped run may have left (on ActiveMQ, one "
                        "more JVM started; not needed with a --queue-prefix of the run's own)")
    return p


def options(**given: Any) -> argparse.Namespace:
    """The command line's defaults, with ``given`` (``count=2000``, ...) in place of some."""
    args = parser().parse_args([])
    for name, value in given.items():
        if not hasattr(args, name):
            raise TypeError(f"broker_ceiling has no option {name!r}")
        setattr(args, name, value)
    return args


def measure(broker: str, args: argparse.Namespace, kind: str = "classic") -> Case:
    """One case: RabbitMQ with queues of ``kind`` (of QUEUE_ARGUMENTS), or ActiveMQ.

    A phase that fails or runs out of time has no ``seconds`` and says why in its ``note``;
    RuntimeError when the case cannot start (no ``javac`` for ActiveMQ)."""
    if broker == "rabbitmq":
        return asyncio.run(rabbitmq_case(args, kind))
    if broker == "activemq":
        return activemq_case(args)
    raise ValueError(f"unknown broker {broker!r}")


def main() -> None:
    args = parser().parse_args()
    if not set(args.rabbitmq_moves.split(",")) <= {"confirm", "tx"}:
        raise SystemExit(f"--rabbitmq-moves: confirm or tx, not {args.rabbitmq_moves!r}")
    brokers = args.brokers.split(",")
    print(f"{args.count:,} persistent messages of {args.size} bytes; load average "
          f"{os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs")
    before = log_sizes()
    cases: list[Case] = []
    if "rabbitmq" in brokers:
        for kind in args.rabbitmq_queues.split(","):
            cases.append(measure("rabbitmq", args, kind))
            cases[-1].show()
    if "activemq" in brokers:
        try:
            cases.append(measure("activemq", args))
        except RuntimeError as exc:
            raise SystemExit(str(exc)) from None
        cases[-1].show()
    show_new_log_lines(before)
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

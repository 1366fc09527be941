"""STOMP throughput: direct to the broker, through a do-nothing TCP relay, through jms-bridge.

stomp.py sends N messages (default 20,000 of 1 KiB) with a receipt on every `window`-th one and
waits for that receipt before sending on (at most `window` unconfirmed messages), then consumes
them with client-individual acks and a prefetch of `window`. Each round runs every path on a fresh
queue, in rotated order so that drift (broker warm-up, other load) spreads over all paths.

The relay is the fastest any proxy can be on this machine: asyncio copying bytes both ways, with no
parsing. It and the bridge each run in their own process, so they pay the same isolation
costs. The goal of the bridge is at least 0.95 of the relay, send and consume, on both brokers.

Usage:
    .venv/bin/python bench/stomp_throughput.py --brokers rabbitmq,activemq --rounds 3
    .venv/bin/python bench/stomp_throughput.py --brokers rabbitmq --paths direct,relay \
        --json out.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import stomp

# The fastest any proxy can be here: bytes in, the same bytes out, flow control and nothing else.
# "protocol" (the default) writes from data_received with no task switch per read; "streams" is the
# same relay with StreamReader.read(65536) and drain(), a few percent slower on RabbitMQ.
RELAY_SOURCES = {
    "protocol": r"""
import asyncio, sys
listen_host, broker_host = sys.argv[1], sys.argv[3]
listen_port, broker_port = int(sys.argv[2]), int(sys.argv[4])
class Pipe(asyncio.Protocol):
    peer = None
    def connection_made(self, transport): self.transport = transport
    def data_received(self, data): self.peer.transport.write(data)
    def connection_lost(self, exc):
        if self.peer: self.peer.transport.close()
    def pause_writing(self): self.peer.transport.pause_reading()
    def resume_writing(self): self.peer.transport.resume_reading()
class Client(Pipe):
    def connection_made(self, transport):
        self.transport = transport
        transport.pause_reading()
        asyncio.ensure_future(self.open())
    async def open(self):
        loop = asyncio.get_running_loop()
        _, self.peer = await loop.create_connection(Pipe, broker_host, broker_port)
        self.peer.peer = self
        self.transport.resume_reading()
async def main():
    server = await asyncio.get_running_loop().create_server(Client, listen_host, listen_port)
    await server.serve_forever()
asyncio.run(main())
""",
    "streams": r"""
import asyncio, sys
listen_host, broker_host = sys.argv[1], sys.argv[3]
listen_port, broker_port = int(sys.argv[2]), int(sys.argv[4])
async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()
async def handle(client_reader, client_writer):
    broker_reader, broker_writer = await asyncio.open_connection(broker_host, broker_port)
    await asyncio.gather(pipe(client_reader, broker_writer), pipe(broker_reader, client_writer),
                         return_exceptions=True)
async def main():
    server = await asyncio.start_server(handle, listen_host, listen_port)
    await server.serve_forever()
asyncio.run(main())
""",
}

BROKERS: dict[str, dict[str, Any]] = {
    "rabbitmq": {"address": "127.0.0.1:61613", "login": "guest", "passcode": "guest",
                 "prefetch_header": "prefetch-count", "vhost": "/"},
    "activemq": {"address": "127.0.0.1:61623", "login": "admin", "passcode": "admin",
                 "prefetch_header": "activemq.prefetchSize", "vhost": None},
}
PATHS = ("direct", "relay", "bridge")
CLK_TCK = os.sysconf("SC_CLK_TCK")


class BenchError(Exception):
    """A phase failed: broker ERROR frame, stall, or a process that would not start."""


def parse_address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- processes under test -------------------------------------------------------------------------

def descendants(pid: int) -> list[int]:
    """pid and every live descendant, so a bridge that forks workers is measured whole."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, ()))
    return found


def cpu_seconds(pid: int) -> float:
    """user+sys of the process tree, including reaped children, from /proc/<pid>/stat."""
    total = 0
    for p in descendants(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        # fields[0] is field 3 (state): utime, stime, cutime, cstime are fields 14-17.
        total += sum(int(v) for v in fields[11:15])
    return total / CLK_TCK


def peak_rss_mb(pid: int) -> float:
    """VmHWM summed over the process tree, in MiB."""
    kib = 0
    for p in descendants(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    kib += int(line.split()[1])
        except OSError:
            continue
    return kib / 1024


def answers_200(url: str) -> bool:
    """Whether ``url`` answers 200 now (a bridge's /readyz)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


class Server:
    """A relay or bridge subprocess listening on a STOMP port."""

    def __init__(self, name: str, argv: list[str], port: int, timeout: float = 20.0,
                 ready_url: str | None = None) -> None:
        """``ready_url``: also wait for it to answer 200 (a bridge's /readyz: until the broker
        has answered and the staging queues exist, it answers a CONNECT with an ERROR)."""
        self.name, self.port = name, port
        self.stderr = tempfile.TemporaryFile()
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.stderr,
                                         stderr=subprocess.STDOUT)
        except OSError as exc:
            raise BenchError(f"{name}: cannot start {argv[0]}: {exc}") from exc
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise BenchError(f"{name} exited with code {self.proc.returncode} before listening "
                                 f"on 127.0.0.1:{port}\ncommand: {' '.join(argv)}\n{self.output()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                if ready_url is None or answers_200(ready_url):
                    return
                if time.monotonic() > deadline:
                    self.stop()
                    raise BenchError(f"{name} was not ready ({ready_url}) within {timeout:.0f} s"
                                     f"\n{self.output()}")
                time.sleep(0.1)
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise BenchError(f"{name} did not accept connections on 127.0.0.1:{port} "
                                     f"within {timeout:.0f} s\ncommand: {' '.join(argv)}\n"
                                     f"{self.output()}") from None
                time.sleep(0.1)

    def output(self) -> str:
        self.stderr.seek(0)
        text = self.stderr.read().decode(errors="replace").strip()
        return f"--- {self.name} output ---\n{text[-4000:] or '(none)'}"

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def rss(self) -> float:
        return peak_rss_mb(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# --- the stomp.py client --------------------------------------------------------------------------

class Listener(stomp.ConnectionListener):
    """Counts deliveries by their `seq` header and acks each one from the receiver thread."""

    def __init__(self, conn: stomp.Connection, expected: int) -> None:
        self.conn = conn
        self.expected = expected
        self.seen = bytearray(expected)
        self.distinct = 0
        self.delivered = 0
        self.duplicates = 0
        self.unknown = 0
        self.receipt_id: str | None = None
        self.receipt = threading.Event()
        self.error: str | None = None

    def on_message(self, frame: Any) -> None:
        headers = frame.headers
        self.delivered += 1
        if "ack" not in headers:
            self.error = f"MESSAGE without an ack header: {headers}"[:500]
            self.receipt.set()
            return
        try:
            seq = int(headers["seq"])
            fresh = not self.seen[seq]
        except (KeyError, ValueError, IndexError):
            self.unknown += 1
            fresh = False
        else:
            if fresh:
                self.seen[seq] = 1
                self.distinct += 1
            else:
                self.duplicates += 1
        if fresh and self.distinct == self.expected:
            self.receipt_id = "acks-done"
            self.conn.ack(headers["ack"], receipt="acks-done")
        else:
            self.conn.ack(headers["ack"])

    def on_receipt(self, frame: Any) -> None:
        if frame.headers.get("receipt-id") == self.receipt_id:
            self.receipt.set()

    def on_error(self, frame: Any) -> None:
        self.error = f"ERROR frame: {frame.headers.get('message', '')} {frame.body!r}"[:500]
        self.receipt.set()

    def on_disconnected(self) -> None:
        if not self.receipt.is_set():
            self.error = self.error or "connection closed"
            self.receipt.set()


def connect(address: tuple[str, int], broker: dict[str, Any],
            expected: int) -> tuple[Any, Listener]:
    # STOMP 1.2 puts the host header in CONNECT; RabbitMQ reads it as the vhost.
    conn = stomp.Connection12([address], heartbeats=(0, 0), auto_content_length=True,
                              auto_decode=False, vhost=broker["vhost"])
    listener = Listener(conn, expected)
    conn.set_listener("bench", listener)
    conn.connect(broker["login"], broker["passcode"], wait=True)
    return conn, listener


def wait(listener: Listener, what: str, timeout: float) -> None:
    """Wait for the awaited receipt while deliveries or receipts keep coming; fail on a stall."""
    last = -1
    while not listener.receipt.wait(timeout):
        if listener.delivered == last:
            raise BenchError(f"stalled waiting for {what}: {listener.distinct}/{listener.expected} "
                             f"messages received")
        last = listener.delivered
    if listener.error:
        raise BenchError(f"{what}: {listener.error}")


def disconnect(conn: Any) -> None:
    try:
        conn.disconnect(receipt="bye")
    except Exception:  # noqa: BLE001 - the measurement is over; a failed goodbye changes nothing
        pass


def send_phase(address: tuple[str, int], broker: dict[str, Any], destination: str, count: int,
               body: bytes, window: int, timeout: float) -> float:
    conn, listener = connect(address, broker, 0)
    send = conn.send
    try:
        gc.collect()
        start = time.perf_counter()
        for first in range(0, count, window):
            last = min(first + window, count) - 1
            for seq in range(first, last):
                send(destination, body, headers={"seq": str(seq)})
            listener.receipt.clear()
            listener.receipt_id = receipt = f"r{last}"
            send(destination, body, headers={"seq": str(last), "receipt": receipt})
            wait(listener, f"receipt {receipt}", timeout)
        elapsed = time.perf_counter() - start
    finally:
        disconnect(conn)
    return count / elapsed


def consume_phase(address: tuple[str, int], broker: dict[str, Any], destination: str, count: int,
                  window: int, timeout: float) -> tuple[float, list[str]]:
    conn, listener = connect(address, broker, count)
    try:
        gc.collect()
        start = time.perf_counter()
        conn.subscribe(destination, id="1", ack="client-individual",
                       headers={broker["prefetch_header"]: str(window)})
        wait(listener, "the receipt on the last ACK", timeout)
        elapsed = time.perf_counter() - start
    finally:
        disconnect(conn)
    problems = []
    if listener.distinct != count or listener.duplicates or listener.unknown:
        problems.append(f"received {listener.delivered} deliveries, "
                        f"{listener.distinct} distinct of {count} sent, "
                        f"{listener.duplicates} duplicates, {listener.unknown} without "
                        f"a valid seq header")
    return count / elapsed, problems


# --- the run --------------------------------------------------------------------------------------

@dataclass
class Result:
    broker: str
    path: str
    round: int
    send_msgs_per_s: float | None = None
    consume_msgs_per_s: float | None = None
    server_cpu_s: float | None = None
    client_cpu_s: float | None = None
    errors: list[str] = field(default_factory=list)


def measure(broker_name: str, path: str, rnd: int, address: tuple[str, int],
            args: argparse.Namespace, server: Server | None, count: int) -> Result:
    broker = BROKERS[broker_name]
    result = Result(broker_name, path, rnd)
    destination = f"/queue/bench-{uuid.uuid4()}"
    body = b"x" * args.size
    cpu_before = server.cpu() if server else 0.0
    client_before = time.process_time()
    try:
        result.send_msgs_per_s = send_phase(address, broker, destination, count, body, args.window,
                                            args.timeout)
        result.consume_msgs_per_s, result.errors = consume_phase(address, broker, destination,
                                                                 count, args.window, args.timeout)
    except (BenchError, stomp.exception.StompException, OSError) as exc:
        result.errors.append(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    result.client_cpu_s = time.process_time() - client_before
    if server:
        result.server_cpu_s = server.cpu() - cpu_before
    return result


def start_servers(broker_name: str, upstream: tuple[str, int],
                  args: argparse.Namespace) -> dict[str, Server]:
    servers: dict[str, Server] = {}
    host, port = upstream
    try:
        if "relay" in args.paths:
            listen = free_port()
            servers["relay"] = Server("relay", [sys.executable, "-c", RELAY_SOURCES[args.relay],
                                                "127.0.0.1", str(listen), host, str(port)], listen)
        if "bridge" in args.paths:
            listen, admin = free_port(), free_port()
            servers["bridge"] = Server("bridge", [
                args.bridge_exe, "run", "--broker", broker_name,
                "--upstream-stomp", f"stomp://{host}:{port}",
                "--stomp-listen", f"127.0.0.1:{listen}", "--admin-listen", f"127.0.0.1:{admin}",
                "--log-level", "warning"], listen, args.start_timeout,
                ready_url=f"http://127.0.0.1:{admin}/readyz")
    except BenchError:
        for server in servers.values():
            server.stop()
        raise
    return servers


def median(values: list[float | None]) -> float | None:
    clean = [v for v in values if v is not None]
    return statistics.median(clean) if clean else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def fmt(value: float | None, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


def run_broker(broker_name: str, args: argparse.Namespace) -> dict[str, Any]:
    upstream = parse_address(getattr(args, broker_name))
    try:
        socket.create_connection(upstream, timeout=3).close()
    except OSError as exc:
        raise BenchError(f"{broker_name}: STOMP at {upstream[0]}:{upstream[1]} does not answer: "
                         f"{exc}") from exc
    servers = start_servers(broker_name, upstream, args)
    addresses = {"direct": upstream, **{name: ("127.0.0.1", s.port) for name, s in servers.items()}}
    results: list[Result] = []
    try:
        if args.warmup:
            for path in args.paths:
                warm = measure(broker_name, path, 0, addresses[path], args, servers.get(path),
                               args.warmup)
                for error in warm.errors:
                    print(f"error: {broker_name} {path} warm-up: {error}", file=sys.stderr)
        for rnd in range(1, args.rounds + 1):
            shift = (rnd - 1) % len(args.paths)
            for path in args.paths[shift:] + args.paths[:shift]:
                result = measure(broker_name, path, rnd, addresses[path], args, servers.get(path),
                                 args.messages)
                results.append(result)
                print(f"  {broker_name:8} round {rnd} {path:6}  "
                      f"send {fmt(result.send_msgs_per_s):>7}/s"
                      f"  consume {fmt(result.consume_msgs_per_s):>7}/s", flush=True)
                for error in result.errors:
                    print(f"error: {broker_name} round {rnd} {path}: {error}", file=sys.stderr)
        usage = {name: {"cpu_s": s.cpu(), "peak_rss_mb": s.rss()} for name, s in servers.items()}
    finally:
        for server in servers.values():
            server.stop()
    return summarize(broker_name, args, results, usage)


def summarize(broker_name: str, args: argparse.Namespace, results: list[Result],
              usage: dict[str, dict[str, float]]) -> dict[str, Any]:
    medians = {path: {"send": median([r.send_msgs_per_s for r in results if r.path == path]),
                      "consume": median([r.consume_msgs_per_s for r in results if r.path == path]),
                      "client_cpu_us_per_message": median([
                          r.client_cpu_s / (2 * args.messages) * 1e6
                          for r in results if r.path == path and r.client_cpu_s is not None])}
               for path in args.paths}
    ratios = {}
    for other in ("relay", "direct"):
        if "bridge" in medians and other in medians:
            ratios[f"bridge/{other}"] = {phase: ratio(medians["bridge"][phase],
                                                      medians[other][phase])
                                         for phase in ("send", "consume")}
    if "relay" in medians and "direct" in medians:
        ratios["relay/direct"] = {phase: ratio(medians["relay"][phase], medians["direct"][phase])
                                  for phase in ("send", "consume")}
    measured = 2 * args.messages * args.rounds
    for name, figures in usage.items():
        phase_cpu = sum(r.server_cpu_s or 0.0 for r in results if r.path == name)
        figures["cpu_us_per_message"] = phase_cpu / measured * 1e6

    print(f"\n{broker_name}: {args.messages} messages of {args.size} B, window {args.window}, "
          f"{args.rounds} rounds")
    print(f"  {'path':<8}{'round':>6}{'send msgs/s':>14}{'consume msgs/s':>17}"
          f"{'client CPU µs/msg':>20}")
    for r in sorted(results, key=lambda r: (PATHS.index(r.path), r.round)):
        flag = "  ERROR" if r.errors else ""
        client = r.client_cpu_s / (2 * args.messages) * 1e6 if r.client_cpu_s is not None else None
        print(f"  {r.path:<8}{r.round:>6}{fmt(r.send_msgs_per_s):>14}"
              f"{fmt(r.consume_msgs_per_s):>17}{fmt(client, '.1f'):>20}{flag}")
    for path, m in medians.items():
        print(f"  {path:<8}{'median':>6}{fmt(m['send']):>14}{fmt(m['consume']):>17}"
              f"{fmt(m['client_cpu_us_per_message'], '.1f'):>20}")
    for name, r in ratios.items():
        print(f"  {name:<14}send {fmt(r['send'], '.3f'):>6}   "
              f"consume {fmt(r['consume'], '.3f'):>6}")
    for name, u in usage.items():
        print(f"  {name} process: {u['cpu_s']:.2f} CPU s in all, "
              f"{u['cpu_us_per_message']:.1f} CPU µs per message sent or consumed in the timed "
              f"rounds, peak RSS {u['peak_rss_mb']:.1f} MB")
    if "bridge/relay" in ratios:
        goal = all((v or 0) >= args.goal for v in ratios["bridge/relay"].values())
        print(f"  goal bridge/relay >= {args.goal}: {'met' if goal else 'NOT met'}")
    return {"rounds": [asdict(r) for r in results], "medians": medians, "ratios": ratios,
            "processes": usage, "errors": sum(len(r.errors) for r in results)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--brokers", default="rabbitmq,activemq")
    parser.add_argument("--paths", default="direct,relay,bridge")
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--size", type=int, default=1024, help="body bytes")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=int, default=1000,
                        help="receipt on every N-th send, and consumer prefetch")
    parser.add_argument("--warmup", type=int, default=2000,
                        help="messages per path sent and consumed once, untimed, before round 1")
    parser.add_argument("--rabbitmq", default=BROKERS["rabbitmq"]["address"], metavar="HOST:PORT")
    parser.add_argument("--activemq", default=BROKERS["activemq"]["address"], metavar="HOST:PORT")
    parser.add_argument("--relay", choices=sorted(RELAY_SOURCES), default="protocol")
    parser.add_argument("--bridge-exe", default=str(Path(sys.prefix) / "bin" / "jms-bridge"))
    parser.add_argument("--start-timeout", type=float, default=20.0)
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds without progress")
    parser.add_argument("--goal", type=float, default=0.95)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    args.brokers = [b.strip() for b in args.brokers.split(",") if b.strip()]
    args.paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    for b in args.brokers:
        if b not in BROKERS:
            parser.error(f"unknown broker {b!r}; choose from {', '.join(BROKERS)}")
    for p in args.paths:
        if p not in PATHS:
            parser.error(f"unknown path {p!r}; choose from {', '.join(PATHS)}")

    report: dict[str, Any] = {"config": {k: getattr(args, k) for k in (
        "brokers", "paths", "messages", "size", "rounds", "window", "warmup", "relay")},
        "brokers": {}}
    status = 0
    for broker_name in args.brokers:
        try:
            report["brokers"][broker_name] = summary = run_broker(broker_name, args)
        except BenchError as exc:
            print(f"error: {exc}", file=sys.stderr)
            report["brokers"][broker_name] = {"error": str(exc)}
            status = 1
            continue
        if summary["errors"]:
            status = 1
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    if "rabbitmq" in args.brokers:
        remove_bench_queues()
    return status


def remove_bench_queues(amqp_url: str = "amqp://guest:guest@127.0.0.1:5672/%2F") -> None:
    """RabbitMQ keeps the durable queue each /queue/bench-... destination declared."""
    import urllib.request
    from base64 import b64encode

    import pika

    request = urllib.request.Request("http://127.0.0.1:15672/api/queues/%2F?columns=name")
    request.add_header("Authorization", "Basic " + b64encode(b"guest:guest").decode())
    try:
        names = [q["name"] for q in json.loads(urllib.request.urlopen(request, timeout=10).read())]
        conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    except (OSError, pika.exceptions.AMQPError) as exc:
        print(f"note: bench queues left on RabbitMQ ({exc})")
        return
    channel = conn.channel()
    for name in names:
        if name.startswith("bench-"):
            channel.queue_delete(name)
    conn.close()


if __name__ == "__main__":
    sys.exit(main())

"""Memory under large frames: N clients each streaming one large SEND through the bridge at once,
while a normal client sends and receives small messages through the same bridge.

Printed: the bridge's RSS (VmRSS of its own process, and of its tree with the staging engine)
before, its peak while the streams run (sampled every 20 ms, and VmHWM), and after they end
(settled for a few seconds); the small client's round trips (count, p50/p99/max ms) during the
streams; how many large frames got their RECEIPT; the bridge's budget pauses.

The large SENDs go to a topic no one subscribes to (`/topic/jbt-bench-mem-<id>`): both brokers
drop such a message once they have read it, so a shared broker is not filled with gigabytes.
The bridge runs with its default limits (--max-frame-bytes 64 MiB, --max-buffered-bytes
128 MiB) unless given others.

Usage:
    .venv/bin/python bench/memory.py --broker rabbitmq --clients 50 --size-mb 60
    .venv/bin/python bench/memory.py --broker activemq --clients 10 --size-mb 20
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.bridgeproc import BridgeProcess  # noqa: E402
from tests.integration.brokers import BROKERS  # noqa: E402
from tests.integration.clients import connect  # noqa: E402
from tests.integration.staging_util import tree  # noqa: E402

CHUNK = 256 * 1024


def status_kb(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_rss_kb(pid: int) -> int:
    return sum(status_kb(p, "VmRSS") for p in tree(pid))


def stream(port: int, user: str, password: str, dest: str, size: int, out: list[str]) -> None:
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=120)
        sock.sendall(f"CONNECT\naccept-version:1.2\nhost:/\nlogin:{user}\npasscode:{password}\n"
                     "heart-beat:0,0\n\n\0".encode())
        reply = sock.recv(4096)
        if not reply.startswith(b"CONNECTED"):
            out.append(f"connect: {reply[:80]!r}")
            return
        sock.sendall(f"SEND\ndestination:{dest}\nreceipt:big\ncontent-length:{size}\n\n"
                     .encode())
        chunk = b"x" * CHUNK
        left = size
        while left:
            n = min(left, CHUNK)
            sock.sendall(chunk if n == CHUNK else chunk[:n])
            left -= n
        sock.sendall(b"\0")
        data = b""
        while b"\0" not in data:
            more = sock.recv(65536)
            if not more:
                break
            data += more
        out.append(data.split(b"\n", 1)[0].decode(errors="replace"))
        sock.close()
    except OSError as exc:
        out.append(f"{type(exc).__name__}: {exc}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", choices=sorted(BROKERS), default="rabbitmq")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--size-mb", type=float, default=60.0)
    parser.add_argument("--bridge-args", default="", help="extra flags for the bridge")
    parser.add_argument("--settle-s", type=float, default=5.0)
    args = parser.parse_args(argv)
    broker = BROKERS[args.broker]
    size = int(args.size_mb * 1_000_000)
    log = Path(f"/tmp/jbt-bench-memory-{uuid.uuid4().hex[:8]}.log")
    bridge = BridgeProcess(broker.name, f"{broker.stomp_host}:{broker.stomp_port}", log,
                           extra=[*args.bridge_args.split()]).start()
    assert bridge.proc is not None
    pid = bridge.proc.pid
    try:
        conn, inbox = connect(bridge.stomp_port, broker.user, broker.password)
        small = f"/queue/jbt-bench-mem-{uuid.uuid4().hex[:8]}"
        conn.subscribe(small, id="s", ack="auto")
        for i in range(20):  # warm up
            conn.send(small, "warm", headers={"receipt": f"w{i}"})
        inbox.take(20, timeout=10)
        time.sleep(1.0)
        base_own, base_tree = status_kb(pid, "VmRSS"), tree_rss_kb(pid)
        replies: list[str] = []
        dest = f"/topic/jbt-bench-mem-{uuid.uuid4().hex[:8]}"
        threads = [threading.Thread(target=stream, daemon=True,
                                    args=(bridge.stomp_port, broker.user, broker.password, dest,
                                          size, replies)) for _ in range(args.clients)]
        peak = {"own": base_own, "tree": base_tree}
        running = threading.Event()
        running.set()

        def sample() -> None:
            while running.is_set():
                peak["own"] = max(peak["own"], status_kb(pid, "VmRSS"))
                peak["tree"] = max(peak["tree"], tree_rss_kb(pid))
                time.sleep(0.02)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        started = time.monotonic()
        for t in threads:
            t.start()
        rtts: list[float] = []
        n = 0
        while any(t.is_alive() for t in threads):
            n += 1
            t0 = time.monotonic()
            conn.send(small, f"during {n}", headers={"receipt": f"d{n}"})
            got = inbox.take(1, timeout=30)
            if inbox.wait_receipt(f"d{n}", timeout=30) and got:
                rtts.append((time.monotonic() - t0) * 1000)
            time.sleep(0.05)
        took = time.monotonic() - started
        running.clear()
        sampler.join()
        hwm = status_kb(pid, "VmHWM")
        time.sleep(args.settle_s)
        after_own, after_tree = status_kb(pid, "VmRSS"), tree_rss_kb(pid)
        pauses = bridge.metric("jms_bridge_budget_pauses_total")
        buffered = bridge.metric("jms_bridge_buffered_bytes")
        conn.disconnect()
    finally:
        code = bridge.stop()
    ok = sum(1 for r in replies if r == "RECEIPT")
    mb = 1024
    print(f"broker {broker.name}: {args.clients} clients x {size / 1e6:.0f} MB SEND, "
          f"bridge flags: {args.bridge_args or '(defaults)'}")
    print(f"  streams took {took:.1f} s; RECEIPTs {ok}/{args.clients}; other replies: "
          f"{sorted(set(r for r in replies if r != 'RECEIPT'))[:3]}")
    print(f"  bridge RSS MB   before {base_own / mb:.0f}   peak {peak['own'] / mb:.0f} "
          f"(VmHWM {hwm / mb:.0f})   after {after_own / mb:.0f}")
    print(f"  with engine MB  before {base_tree / mb:.0f}   peak {peak['tree'] / mb:.0f}   "
          f"after {after_tree / mb:.0f}")
    if rtts:
        ordered = sorted(rtts)
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        print(f"  small client during the streams: {len(rtts)} round trips, p50 "
              f"{statistics.median(rtts):.0f} ms, p99 {p99:.0f} ms, max {max(rtts):.0f} ms")
    print(f"  budget pauses {pauses:.0f}; buffered bytes at the end {buffered:.0f}; "
          f"bridge exit {code}")
    return 0 if ok == args.clients and code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

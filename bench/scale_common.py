"""What the parts of bench/scale.py share: bridges started and killed as an operator would,
the bridge's and the broker's memory and disk, the staged tools timed, and a consumer that
records each arrival against the due time the message carries.

The bridge runs this tree's code (``python -m bridge.app.cli`` from the repository root), in a
session of its own, so that a SIGKILL of its process group is a kill of the bridge and its
staging engine, as a pod's kill would be, and never of the benchmark.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from base64 import b64encode
from pathlib import Path
from typing import Any

import pika
import stomp
from delay import staging_metrics
from stomp_throughput import BenchError, cpu_seconds, descendants, free_port, parse_address

ROOT = Path(__file__).resolve().parent.parent
RABBIT_DATA = Path("/var/lib/rabbitmq/mnesia")
AMQ_INSTANCE = Path(os.environ.get("JMS_BRIDGE_STATE", "/var/lib/jms-bridge")) / "activemq"


def run_queues(prefix: str) -> list[str]:
    """Every queue a bridge with this staging prefix may have made: both layouts' levels, the
    ready queue, and the queues it moves messages aside to."""
    from bridge.staging.levels import Layout

    names = {q: None for sl in (False, True) for q in Layout(prefix, second_levels=sl).all_queues}
    return list(names)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def quick(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "quick", False))


# --- the bridge -------------------------------------------------------------------------------

class ScaleBridge:
    """``jms-bridge run`` from this tree, in its own session; its output in a temporary file."""

    def __init__(self, broker_name: str, args: argparse.Namespace, *extra: str,
                 wait_ready: bool = True, timeline: bool = False) -> None:
        host, port = parse_address(getattr(args, broker_name))
        self.listen, self.admin = free_port(), free_port()
        self.address = ("127.0.0.1", self.listen)
        self.argv = [sys.executable, "-m", "bridge.app.cli", "run", "--broker", broker_name,
                     "--upstream-stomp", f"stomp://{host}:{port}",
                     "--stomp-listen", f"127.0.0.1:{self.listen}",
                     "--admin-listen", f"127.0.0.1:{self.admin}",
                     "--log-level", "warning", "--staging-prefix", args.staging_prefix, *extra,
                     *(getattr(args, "bridge_arg", None) or [])]
        if timeline:  # the bridge's and its engine's log lines, timed (the last flags win)
            self.argv += ["--log-level", "debug", "--log-format", "json"]
        self.output = tempfile.TemporaryFile()
        self.started = time.time()
        try:
            self.proc = subprocess.Popen(self.argv, cwd=ROOT, stdin=subprocess.DEVNULL,
                                         stdout=self.output, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        except OSError as exc:
            raise BenchError(f"bridge: cannot start {self.argv[0]}: {exc}") from exc
        self.listening_s = self._wait_port(args.start_timeout)
        self.ready_s = self._wait_ready(args.start_timeout) if wait_ready else None

    def _wait_port(self, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            try:
                socket.create_connection(self.address, timeout=1).close()
                return time.time() - self.started
            except OSError:
                if time.monotonic() > deadline:
                    self.kill()
                    raise BenchError(f"bridge did not listen on {self.address[1]} within "
                                     f"{timeout:.0f} s\n{self.log()}") from None
                time.sleep(0.01)

    def _wait_ready(self, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.admin}/readyz",
                                            timeout=2) as reply:
                    if reply.status == 200:
                        return time.time() - self.started
            except (OSError, urllib.error.HTTPError):
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise BenchError(f"bridge not ready within {timeout:.0f} s\n{self.log()}")
            time.sleep(0.01)

    def _check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise BenchError(f"bridge exited with code {self.proc.returncode}\n{self.log()}")

    def log(self) -> str:
        self.output.seek(0)
        text = self.output.read().decode(errors="replace").strip()
        return f"--- bridge output ---\n{text[-4000:] or '(none)'}"

    def timeline(self) -> dict[str, float]:
        """Seconds from the start (the exec) to each log line (a bridge started with
        ``timeline=True``, at debug level); an event said again is numbered (``connected #2``)."""
        self.output.seek(0)
        out: dict[str, float] = {}
        for line in self.output.read().decode(errors="replace").splitlines():
            try:
                entry = json.loads(line)
                at = datetime.datetime.fromisoformat(entry["timestamp"].replace("Z", "+00:00"))
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
            event = str(entry.get("event"))
            # The bridge's own adapter and its engine's both say "connected": number them.
            n = sum(1 for key in out if key == event or key.startswith(event + " #"))
            out[event if n == 0 else f"{event} #{n + 1}"] = at.timestamp() - self.started
        return out

    def metrics(self) -> dict[str, float]:
        return staging_metrics(self.admin)

    def released(self) -> int:
        return int(self.metrics().get("jms_bridge_staging_released_total", 0))

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def rss(self) -> dict[str, float]:
        return tree_rss(self.proc.pid)

    def kill(self) -> None:
        """SIGKILL the bridge's process group: the bridge and its staging engine at once."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
        try:  # anything left of the group (an engine that outlived it)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def tree_rss(pid: int) -> dict[str, float]:
    """VmRSS in MiB of the bridge process, of its staging engine (the multiprocessing child
    that is not the resource tracker), and of the whole tree."""
    return tree_status_mb(pid, "VmRSS")


def tree_peak_rss(pid: int) -> dict[str, float]:
    """The same for VmHWM, each process's peak RSS so far (kept by the kernel: no sampling)."""
    return tree_status_mb(pid, "VmHWM")


def tree_status_mb(pid: int, name: str) -> dict[str, float]:
    out = {"bridge_mb": 0.0, "engine_mb": 0.0, "total_mb": 0.0}
    for p in descendants(pid):
        try:
            status = Path(f"/proc/{p}/status").read_text()
            cmdline = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        kib = next((int(line.split()[1]) for line in status.splitlines()
                    if line.startswith(name + ":")), 0)
        out["total_mb"] += kib / 1024
        if p == pid:
            out["bridge_mb"] += kib / 1024
        elif b"spawn_main" in cmdline and b"resource_tracker" not in cmdline:
            out["engine_mb"] += kib / 1024
    return out


# --- the broker's memory and disk -------------------------------------------------------------

def _management(args: argparse.Namespace, path: str, method: str = "GET",
                body: dict[str, Any] | None = None) -> Any:
    url = getattr(args, "rabbitmq_management", "http://127.0.0.1:15672")
    request = urllib.request.Request(f"{url}/api{path}", method=method,
                                      data=json.dumps(body).encode() if body else None)
    request.add_header("Authorization", "Basic " + b64encode(b"guest:guest").decode())
    request.add_header("content-type", "application/json")
    with urllib.request.urlopen(request, timeout=10) as reply:
        data = reply.read()
    return json.loads(data) if data else None


def du_mb(path: Path) -> float | None:
    try:
        done = subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if not done.stdout.strip():
        return None
    return int(done.stdout.split()[0]) / 1024


def pid_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def activemq_pid() -> int | None:
    for name in ("activemq.pid", "data/activemq.pid", "pid"):
        path = AMQ_INSTANCE / name
        if path.exists():
            try:
                return int(path.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
    return None


def broker_figures(broker_name: str, args: argparse.Namespace) -> dict[str, Any]:
    """RabbitMQ: the node's mem_used and alarms (management API) and du of its data folder;
    ActiveMQ: the JVM's RSS and du of the instance's data folder (KahaDB and the temp store)."""
    if broker_name == "rabbitmq":
        try:
            node = _management(args, "/nodes")[0]
        except (OSError, ValueError, IndexError) as exc:
            return {"error": f"management API: {exc}"}
        return {"mem_mb": node["mem_used"] / 2**20, "mem_limit_mb": node["mem_limit"] / 2**20,
                "mem_alarm": node.get("mem_alarm"), "disk_alarm": node.get("disk_free_alarm"),
                "disk_free_mb": node["disk_free"] / 2**20,
                "disk_mb": du_mb(RABBIT_DATA / node["name"])}
    pid = activemq_pid()
    return {"mem_mb": pid_rss_mb(pid) if pid else None, "disk_mb": du_mb(AMQ_INSTANCE / "data")}


def show_broker(figures: dict[str, Any]) -> str:
    if "error" in figures:
        return figures["error"]
    mem = figures.get("mem_mb")
    disk = figures.get("disk_mb")
    return (f"broker mem {'-' if mem is None else f'{mem:,.0f}'} MB, "
            f"disk {'-' if disk is None else f'{disk:,.0f}'} MB")


# --- RabbitMQ policies for the staging queues -------------------------------------------------

def policy_name(args: argparse.Namespace) -> str:
    return f"bench-scale-{args.staging_prefix}"


def set_lazy_policy(args: argparse.Namespace) -> None:
    """``queue-mode: lazy`` on this run's staging queues only (``^<prefix>\\.``)."""
    pattern = "^" + args.staging_prefix.replace(".", "\\.") + "\\."
    _management(args, f"/policies/%2F/{policy_name(args)}", "PUT", {
        "pattern": pattern, "definition": {"queue-mode": "lazy"}, "priority": 10,
        "apply-to": "queues"})


def remove_policy(args: argparse.Namespace) -> None:
    try:
        _management(args, f"/policies/%2F/{policy_name(args)}", "DELETE")
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise


# --- the staged tools -------------------------------------------------------------------------

def tool(broker_name: str, args: argparse.Namespace, *words: str,
         timeout: float) -> dict[str, Any]:
    """Run ``jms-bridge staged <words>`` from this tree against the run's staging queues: its
    exit code, seconds, the last line it printed; ``timed_out`` when it had to be killed."""
    host, port = parse_address(getattr(args, broker_name))
    argv = [sys.executable, "-m", "bridge.app.cli", "staged", *words, "--broker", broker_name,
            "--upstream-stomp", f"stomp://{host}:{port}", "--staging-prefix", args.staging_prefix,
            "--log-level", "error"]
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"command": " ".join(words), "seconds": time.perf_counter() - start,
                "timed_out": True, "code": None, "output": ""}
    text = out.decode(errors="replace").strip()
    return {"command": " ".join(words), "seconds": time.perf_counter() - start,
            "timed_out": False, "code": proc.returncode,
            "output": text.splitlines()[-1] if text else "", "lines": len(text.splitlines())}


def show_tool(t: dict[str, Any]) -> str:
    if t["timed_out"]:
        return f"`staged {t['command']}`: no answer in {t['seconds']:.0f} s (stopped)"
    return (f"`staged {t['command']}`: {t['seconds']:.2f} s, exit {t['code']}, "
            f"{t['lines']} lines, last: {t['output'][:100]!r}")


# --- the consumer of released messages --------------------------------------------------------

class Arrivals:
    """Consumes targets straight from the broker (pika on RabbitMQ, stomp.py on ActiveMQ) on a
    thread, and records each distinct message's arrival (epoch ms) and the due time it carries
    (``bench_due``, the sender's clock); counts duplicates (same ``bench_seq``)."""

    def __init__(self, broker_name: str, args: argparse.Namespace, targets: list[str]) -> None:
        self.broker_name, self.args, self.targets = broker_name, args, targets
        self.first: dict[int, tuple[int, int]] = {}  # seq -> (due, arrival)
        self.deliveries = self.duplicates = self.unknown = 0
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.ready = threading.Event()
        self.error: str | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        if not self.ready.wait(15):
            raise BenchError(f"the consumer of {targets} did not start: {self.error}")

    def _record(self, headers: dict[str, Any]) -> None:
        t = now_ms()
        with self.lock:
            self.deliveries += 1
            try:
                seq, due = int(headers["bench_seq"]), int(headers["bench_due"])
            except (KeyError, ValueError, TypeError):
                self.unknown += 1
                return
            if seq in self.first:
                self.duplicates += 1
            else:
                self.first[seq] = (due, t)

    def _run(self) -> None:
        try:
            if self.broker_name == "rabbitmq":
                self._run_pika()
            else:
                self._run_stomp()
        except Exception as exc:  # noqa: BLE001 - reported by the part that reads it
            self.error = f"{type(exc).__name__}: {exc}"
            self.ready.set()

    def _run_pika(self) -> None:
        conn = pika.BlockingConnection(pika.URLParameters(self.args.rabbitmq_amqp))
        ch = conn.channel()
        ch.basic_qos(prefetch_count=5000)
        for q in self.targets:
            ch.queue_declare(q, durable=True)
            ch.basic_consume(q, lambda _c, _m, props, _b: self._record(props.headers or {}),
                             auto_ack=True)
        self.ready.set()
        while not self.stopping.is_set():
            conn.process_data_events(time_limit=0.1)
        conn.close()

    def _run_stomp(self) -> None:
        outer = self

        class Listener(stomp.ConnectionListener):
            def on_message(self, frame: Any) -> None:
                outer._record(frame.headers)

        cfg = broker_cfg(self.broker_name, self.args)
        conn = stomp.Connection12([parse_address(cfg["address"])], heartbeats=(0, 0),
                                  auto_decode=False)
        conn.set_listener("arrivals", Listener())
        conn.connect(cfg["login"], cfg["passcode"], wait=True)
        for i, q in enumerate(self.targets):
            conn.subscribe(f"/queue/{q}", id=str(i), ack="auto",
                           headers={"activemq.prefetchSize": "5000"})
        time.sleep(0.5)
        self.ready.set()
        self.stopping.wait()
        try:
            conn.disconnect()
        except Exception:  # noqa: BLE001 - the run is over
            pass

    def count(self) -> int:
        with self.lock:
            return len(self.first)

    def wait_for(self, expected: int, until_ms: int, quiet_s: float) -> None:
        """Until ``expected`` distinct messages came, or it is past ``until_ms`` and nothing
        came for ``quiet_s``."""
        last, since = -1, time.monotonic()
        while self.count() < expected and self.error is None:
            got = self.deliveries
            if got != last:
                last, since = got, time.monotonic()
            elif now_ms() > until_ms and time.monotonic() - since > quiet_s:
                return
            time.sleep(0.1)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(10)


def broker_cfg(broker_name: str, args: argparse.Namespace) -> dict[str, Any]:
    from stomp_throughput import BROKERS

    return {**BROKERS[broker_name], "address": getattr(args, broker_name)}


# --- sending ----------------------------------------------------------------------------------

def send_all(address: tuple[str, int], broker_name: str, args: argparse.Namespace,
             items: Any, count: int, body: bytes, window: int = 1000) -> None:
    """Send ``count`` messages, ``items`` giving (destination, headers) for each, with a
    receipt on every ``window``-th that is waited for before sending on."""
    from stomp_throughput import connect, disconnect, wait

    conn, listener = connect(address, broker_cfg(broker_name, args), 0)
    send = conn.send
    try:
        for i, (destination, headers) in enumerate(items):
            if i % window == window - 1 or i == count - 1:
                listener.receipt.clear()
                listener.receipt_id = headers["receipt"] = f"r{i}"
                send(destination, body, headers=headers)
                wait(listener, f"receipt r{i}", args.timeout)
            else:
                send(destination, body, headers=headers)
    finally:
        disconnect(conn)


def broker_pid(broker_name: str) -> int | None:
    """The broker's own process: RabbitMQ's Erlang VM (beam.smp), ActiveMQ's JVM."""
    if broker_name == "activemq":
        return activemq_pid()
    # The node's own pid file (other nodes may run on this machine: a cluster's).
    pid_files = (sorted(RABBIT_DATA.glob("rabbit@localhost.pid"))
                 or sorted(RABBIT_DATA.glob("*.pid")))
    for path in pid_files:
        try:
            return int(path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return None


def process_cpu(pid: int | None) -> float:
    """user+sys seconds of one process (not its children)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy() -> tuple[int, int]:
    """(busy, all) jiffies of the machine so far (/proc/stat), for a share over an interval."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4], sum(fields)


def pct(values: list[int], q: float) -> int | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, -(-len(ordered) * q // 100) - 1)]

"""The three-node RabbitMQ cluster of ``scripts/brokers up rabbitmq-cluster``, and a node of it
lost under load: what quorum staging queues keep (tests/integration/test_staging_cluster.py and
bench/scale_cluster.py run ``node_loss``).

The scenario: the staging queues of a prefix of its own are declared as quorum queues through
node 1, so node 1 leads them all (RabbitMQ puts a new quorum queue's leader on the node the
declaring client is connected to). A bridge with ``--staging-queue-type quorum`` runs against
node 2; a consumer reads the target queue (a classic queue on node 3) straight from node 3. A
producer sends delayed messages through the bridge, a receipt on each: only receipted messages
count as sent. Mid-run the node that leads the staging queues (asked of the management API) has
its Erlang VM SIGKILLed; its queues elect leaders on the two other nodes. Then every receipted
message is waited for, and the killed node started again so that the cluster is whole for
whatever runs next.

With ``bridge_on_leader`` the bridge is given node 1 first and node 2 as its alternate
(``--upstream-stomp stomp://...:61681,stomp://...:61682``): the kill takes its own connections
too, the producer's among them, and the bridge must carry on through node 2.

With ``queue_type="classic"`` the same run shows what a single copy on one node costs (the
RabbitMQ delayed-message plugin keeps each message so, in a Mnesia table on the node that took
it): the staging queues are classic queues on node 1, and the killed node stays down for
``down_s`` seconds before it is started again.
"""

from __future__ import annotations

import base64
import collections
import json
import os
import random
import signal
import statistics
import subprocess
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pika
import pytest
import stomp

from adapters import rabbitmq
from bridge.staging.levels import Layout, layout_for
from policies.endpoints import Endpoint
from tests.integration.bridgeproc import BridgeProcess
from tests.integration.brokers import STATE_DIR, Broker, probe
from tests.integration.clients import connect

ROOT = Path(__file__).resolve().parents[2]
USER = PASSWORD = "guest"
UP_TIMEOUT_S = 240


@dataclass(frozen=True)
class Node:
    n: int

    @property
    def name(self) -> str:
        return f"jbc{self.n}@localhost"

    @property
    def amqp(self) -> int:
        return 5680 + self.n

    @property
    def stomp(self) -> int:
        return 61680 + self.n

    @property
    def management(self) -> int:
        return 15680 + self.n

    @property
    def broker(self) -> Broker:
        """This node as the integration tests' Broker (its STOMP port, guest/guest)."""
        return Broker(self.name, "127.0.0.1", self.stomp, USER, PASSWORD,
                      f"amqp://{USER}:{PASSWORD}@127.0.0.1:{self.amqp}/%2F",
                      f"http://127.0.0.1:{self.management}", log=str(self.log))

    @property
    def log(self) -> Path:
        return Path(STATE_DIR) / "rabbitmq-cluster" / f"jbc{self.n}" / "log" / f"{self.name}.log"

    def pid(self) -> int | None:
        """Its Erlang VM's pid (the pid file scripts/brokers has it write), if that runs."""
        try:
            pid = int((Path(STATE_DIR) / "rabbitmq-cluster" / f"jbc{self.n}" / "pid").read_text())
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            return None
        return pid if f"RABBITMQ_NODENAME={self.name}".encode() in environ else None


NODES = [Node(1), Node(2), Node(3)]


def by_name(name: str) -> Node:
    return next(node for node in NODES if node.name == name)


def management(node: Node, path: str, method: str = "GET") -> Any:
    request = urllib.request.Request(f"http://127.0.0.1:{node.management}/api/{path}",
                                     method=method)
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(request, timeout=5) as r:
        body = r.read()
    return json.loads(body) if body else None


def problem() -> str | None:
    """None when all three nodes take a STOMP login and are running members of one cluster."""
    for node in NODES:
        why = probe(node.broker)
        if why is not None:
            return f"{node.name} STOMP at 127.0.0.1:{node.stomp}: {why}"
    try:
        running = {n["name"] for n in management(NODES[0], "nodes?columns=name,running")
                   if n.get("running")}
    except OSError as exc:
        return f"{NODES[0].name} management API: {exc}"
    if running != {node.name for node in NODES}:
        return f"running cluster members are {sorted(running)}"
    return None


def up() -> float:
    """``scripts/brokers up rabbitmq-cluster``; returns the seconds it took. RuntimeError with
    its output when it fails."""
    started = time.monotonic()
    done = subprocess.run([str(ROOT / "scripts" / "brokers"), "up", "rabbitmq-cluster"],
                          capture_output=True, text=True, timeout=UP_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"scripts/brokers up rabbitmq-cluster exited {done.returncode}:\n"
                           f"{done.stdout}{done.stderr}")
    return time.monotonic() - started


def require() -> None:
    """Bring the cluster up if it is not; fail (CI set) or skip when that does not work."""
    why = problem()
    if why is None:
        return
    try:
        up()
        why = problem()
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        why = f"{why}; {exc}"
    if why is None:
        return
    message = f"the RabbitMQ cluster (scripts/brokers up rabbitmq-cluster) is not there: {why}"
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def leaders(node: Node, queues: list[str]) -> dict[str, str]:
    """Each quorum queue's leader, as ``node``'s management API sees it."""
    out = {}
    for q in queues:
        info = management(node, f"queues/%2F/{urllib.request.quote(q, safe='')}")
        out[q] = info.get("leader") or info.get("node") or "?"
    return out


def declare_staging(node: Node, layout: Layout, queue_type: str = "quorum") -> None:
    """The staging queues, declared through ``node``: it leads the quorum ones, and holds the
    classic ones."""
    broker = rabbitmq.RabbitMQ(Endpoint("127.0.0.1", node.amqp, USER, PASSWORD, "/"),
                               queue_type=queue_type)
    broker.connect()
    try:
        broker.ensure_queues(layout.all_queues)
    finally:
        broker.close()


def delete_queues(node: Node, queues: list[str]) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(node.broker.amqp_url or ""))
    try:
        for q in queues:
            conn.channel().queue_delete(q)
    finally:
        conn.close()


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Producer(threading.Thread):
    """Delayed sends through the bridge at ``rate`` a second, a receipt on each; reconnects
    when the bridge closes it. ``due`` holds the receipted ones: seq -> due (epoch ms)."""

    def __init__(self, port: int, dest: str, count: int, delays: tuple[int, int],
                 rate: float, seed: int = 1) -> None:
        super().__init__(daemon=True)
        self.port, self.dest, self.count, self.delays, self.rate = port, dest, count, delays, rate
        self.rng = random.Random(seed)
        self.due: dict[str, int] = {}
        self.sent: dict[str, int] = {}
        self.errors: list[str] = []
        self.reconnects = 0
        self.finished_at: float | None = None

    def run(self) -> None:
        seq = 0
        started = time.monotonic()
        while seq < self.count:
            try:
                conn, inbox = connect(self.port, USER, PASSWORD)
            except Exception as exc:  # noqa: BLE001 - the bridge refuses while it cannot reach
                self.errors.append(f"connect: {exc}")
                time.sleep(0.1)
                continue
            waiting: dict[str, int] = {}
            try:
                while seq < self.count and conn.is_connected():
                    seq += 1
                    delay = self.rng.randint(*self.delays)
                    due = now_ms() + delay
                    conn.send(self.dest, f"m{seq}", headers={
                        "x-delay": str(delay), "seq": str(seq), "due": str(due),
                        "persistent": "true", "receipt": f"r{seq}"})
                    waiting[str(seq)] = due
                    self.sent[str(seq)] = due
                    self._take(inbox, waiting)
                    ahead = started + seq / self.rate - time.monotonic()
                    if ahead > 0:
                        time.sleep(ahead)
                deadline = time.monotonic() + 30
                while waiting and time.monotonic() < deadline and not inbox.errors:
                    self._take(inbox, waiting)
                    time.sleep(0.05)
            except Exception as exc:  # noqa: BLE001 - cut off mid-send: not receipted
                self.errors.append(f"send: {exc}")
            finally:
                self._take(inbox, waiting)
                if inbox.errors:
                    self.errors.append(inbox.errors[0].headers.get("message", "ERROR frame"))
                try:
                    conn.disconnect()
                except Exception:  # noqa: BLE001
                    pass
            if seq < self.count:
                self.reconnects += 1
        self.finished_at = time.monotonic()

    def _take(self, inbox: Any, waiting: dict[str, int]) -> None:
        for rid in list(inbox.receipts):
            seq = rid[1:]
            if seq in waiting:
                self.due[seq] = waiting.pop(seq)


class Consumer(stomp.ConnectionListener):
    """The target queue, straight from a node: arrival times per seq, and the due time the
    bridge computed (``jms-bridge-delivery-time``)."""

    def __init__(self, node: Node, dest: str) -> None:
        self.arrivals: dict[str, list[int]] = collections.defaultdict(list)
        self.bridge_due: dict[str, int] = {}
        self.delivery_counts = 0  # releases carrying a quorum queue's x-delivery-count
        self.conn = stomp.Connection12([("127.0.0.1", node.stomp)], heartbeats=(0, 0),
                                       vhost="/")
        self.conn.set_listener("c", self)
        self.conn.connect(USER, PASSWORD, wait=True)
        self.conn.subscribe(dest, id="c", ack="auto", headers={"prefetch-count": "2000"})

    def on_message(self, frame: Any) -> None:
        seq = frame.headers.get("seq", "?")
        self.arrivals[seq].append(now_ms())
        if "x-delivery-count" in frame.headers:
            self.delivery_counts += 1
        if "jms-bridge-delivery-time" in frame.headers:
            self.bridge_due[seq] = int(frame.headers["jms-bridge-delivery-time"])

    def close(self) -> None:
        try:
            self.conn.disconnect()
        except Exception:  # noqa: BLE001
            pass


def node_loss(count: int, log_dir: Path, *, rate: float = 600.0,
              delays: tuple[int, int] = (2000, 10_000), kill_after_s: float = 2.5,
              wait_after_s: float = 30.0, queue_type: str = "quorum", down_s: float = 0.0,
              bridge_on_leader: bool = False, say: Any = print) -> dict[str, Any]:
    """Run the scenario of this module's docstring; returns its figures."""
    tag = uuid.uuid4().hex[:8]
    layout = layout_for(rabbitmq.FORMAT, f"jbt-cluster-{tag}")
    target = f"jbt-cluster-{tag}-target"
    dest = f"/queue/{target}"
    seed, bridged, far = NODES
    declare_staging(seed, layout, queue_type)
    conn = pika.BlockingConnection(pika.URLParameters(far.broker.amqp_url or ""))
    conn.channel().queue_declare(target, durable=True)
    conn.close()
    staging = list(layout.all_queues)
    before = leaders(bridged, staging) if queue_type == "quorum" else {
        q: seed.name for q in staging}
    led: collections.Counter[str] = collections.Counter(before.values())
    victim = by_name(led.most_common(1)[0][0])
    nodes = [victim, bridged] if bridge_on_leader else [bridged]
    bridge = BridgeProcess(
        "rabbitmq", ",stomp://".join(f"127.0.0.1:{n.stomp}" for n in nodes),
        log_dir / f"bridge-{tag}.log",
        extra=["--upstream-amqp", ",".join(f"amqp://{USER}:{PASSWORD}@127.0.0.1:{n.amqp}/%2F"
                                           for n in nodes),
               "--staging-prefix", layout.prefix, "--staging-queue-type", queue_type])
    out: dict[str, Any] = {"messages": count, "queue_type": queue_type,
                           "bridge_upstream": ",".join(n.name for n in nodes),
                           "staging_prefix": layout.prefix,
                           "leader": victim.name, "queues_led": led[victim.name],
                           "staging_queues": len(staging), "bridge_log": str(bridge.log_path)}
    consumer: Consumer | None = None
    killed_at = 0
    restarted = False
    try:
        bridge.start(timeout=60)
        consumer = Consumer(far, dest)
        producer = Producer(bridge.stomp_port, dest, count, delays, rate)
        producer.start()
        time.sleep(kill_after_s)
        pid = victim.pid()
        if pid is None:
            raise RuntimeError(f"no running Erlang VM for {victim.name}")
        os.kill(pid, signal.SIGKILL)
        killed_at = now_ms()
        out["killed_pid"] = pid
        say(f"  SIGKILL {victim.name} (pid {pid}, leading {led[victim.name]} of "
            f"{len(staging)} staging queues) {kill_after_s:.1f} s into the run, "
            f"{len(producer.sent):,} sent so far", flush=True)
        if down_s:
            time.sleep(max(0.0, killed_at / 1000 + down_s - time.time()))
            out["down_s"] = round((now_ms() - killed_at) / 1000, 1)
            out["restart_s"] = round(up(), 1)
            out["back_at_s"] = round((now_ms() - killed_at) / 1000, 1)
            restarted = True
        producer.join(count / rate + 120)
        last_due = max(producer.due.values(), default=now_ms())
        deadline = last_due + wait_after_s * 1000
        while now_ms() < deadline and any(not consumer.arrivals.get(s) for s in producer.due):
            time.sleep(0.2)
        time.sleep(1.0)  # a duplicate comes soon after its first copy, if at all
        if queue_type == "quorum":
            after = leaders(bridged, staging)
            out["leaders_after"] = dict(collections.Counter(after.values()))
        if not restarted:
            out["restart_s"] = round(up(), 1)
            restarted = True
    finally:
        if consumer is not None:
            consumer.close()
        out["bridge_exit"] = bridge.stop()
        if killed_at and not restarted:
            try:
                up()
            except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
                say(f"  could not start {victim.name} again: {exc}")
        try:
            delete_queues(bridged, [*staging, target])
        except (pika.exceptions.AMQPError, OSError) as exc:
            say(f"  could not delete the queues of {layout.prefix}: {exc}")
    due, arrivals = producer.due, consumer.arrivals
    out["sent"] = len(producer.sent)
    out["receipted"] = len(due)
    out["unreceipted"] = len(producer.sent) - len(due)
    out["producer_reconnects"] = producer.reconnects
    out["producer_errors"] = producer.errors[:5]
    lost = sorted((s for s in due if not arrivals.get(s)), key=int)
    out["lost"] = len(lost)
    out["lost_seqs"] = lost[:20]
    out["duplicates"] = sum(len(arrivals[s]) - 1 for s in arrivals if len(arrivals[s]) > 1)
    early = [s for s in arrivals
             if min(arrivals[s]) < max(consumer.bridge_due.get(s, 0), producer.sent.get(s, 0))]
    out["early"] = len(early)
    out["foreign"] = sum(1 for s in arrivals if s not in producer.sent)
    out["with_x_delivery_count"] = consumer.delivery_counts
    out["unreceipted_arrived"] = sum(1 for s in producer.sent if s not in due and arrivals.get(s))
    times = sorted(t for ts in arrivals.values() for t in ts)
    after_kill = [t for t in times if t >= killed_at]
    gaps = [b - a for a, b in zip([killed_at, *after_kill], after_kill, strict=False)]
    out["first_release_after_kill_s"] = (after_kill[0] - killed_at) / 1000 if after_kill else None
    out["longest_pause_after_kill_s"] = max(gaps) / 1000 if gaps else None
    # Messages due in the 15 s after the kill: how late they came (the kill's cost).
    late = sorted(min(arrivals[s]) - due[s] for s in due
                  if arrivals.get(s) and killed_at <= due[s] < killed_at + 15_000)
    out["due_after_kill"] = len(late)
    out["late_after_kill_p50_s"] = statistics.median(late) / 1000 if late else None
    out["late_after_kill_max_s"] = late[-1] / 1000 if late else None
    if down_s:  # released while the node was down, and how late those due then came
        back = killed_at + out["back_at_s"] * 1000
        out["released_while_down"] = sum(1 for t in times if killed_at <= t < back)
        held = sorted(min(arrivals[s]) - due[s] for s in due
                      if arrivals.get(s) and killed_at <= due[s] < back)
        out["due_while_down"] = len(held)
        out["late_due_while_down_max_s"] = held[-1] / 1000 if held else None
    calm = sorted(min(arrivals[s]) - due[s] for s in due
                  if arrivals.get(s) and due[s] < killed_at)
    out["late_before_kill_max_s"] = calm[-1] / 1000 if calm else None
    return out


def show(r: dict[str, Any], say: Any = print) -> None:
    say(f"  bridge on {r['bridge_upstream']}: {r['receipted']:,} receipted of {r['sent']:,} "
        f"sent ({r['unreceipted']} without a receipt, {r['unreceipted_arrived']} of those "
        f"arrived; producer reconnects {r['producer_reconnects']}); lost {r['lost']}, "
        f"early {r['early']}, duplicates {r['duplicates']}", flush=True)
    say(f"  releases after the kill: first {r['first_release_after_kill_s']} s after it, longest "
        f"pause {r['longest_pause_after_kill_s']} s; {r['due_after_kill']} due in the 15 s after "
        f"it arrived p50 {r['late_after_kill_p50_s']} s, max {r['late_after_kill_max_s']} s "
        f"late (before the kill: max {r['late_before_kill_max_s']} s)", flush=True)
    if "down_s" in r:
        say(f"  {r['leader']} down {r['down_s']} s: {r['released_while_down']} released meanwhile; "
            f"{r['due_while_down']} due meanwhile came up to {r['late_due_while_down_max_s']} s "
            f"late", flush=True)
    say(f"  leaders after the kill: {r.get('leaders_after')}; {r.get('leader')} started again "
        f"in {r.get('restart_s')} s; bridge exit {r['bridge_exit']}, log {r['bridge_log']}",
        flush=True)

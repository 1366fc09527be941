"""Run the real ``jms-bridge run`` as a subprocess, the way an operator would."""

from __future__ import annotations

import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

# Listening ports for test processes: below Linux's ephemeral range (32768-60999), where the
# suite's thousands of client connections take their local ports, and clear of RabbitMQ's
# distribution ports (25672 and up, a cluster's nodes). Chosen at random, so that the suite's
# processes side by side rarely pick the same one before either has bound it.
PORTS = [*range(20000, 25000), *range(26000, 32000)]


def free_port() -> int:
    for _ in range(100):
        port = random.choice(PORTS)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port to listen on among the suite's ports")


def wait_port(port: int, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


# Every bridge on ActiveMQ takes the expired messages that asked to be kept off the shared
# ActiveMQ.DLQ to its own undelivered queue: a test's bridge does so only when it asks
# (``--expiry-dead-letter-queue``), so that another process's bridge cannot take its message.
NOT_WATCHING_ACTIVEMQ_DLQ = ["--expiry-dead-letter-queue", "off"]


@dataclass
class BridgeProcess:
    broker: str
    upstream: str  # host:port of the broker's STOMP port
    log_path: Path
    extra: list[str] = field(default_factory=list)
    stomp_port: int = field(default_factory=free_port)
    admin_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    # The admin API's bearer token, in a file beside the log; None: run without one.
    admin_token: str | None = field(default_factory=lambda: secrets.token_urlsafe(16))
    # Staging queues of its own unless ``extra`` names a prefix: another bridge on the same
    # broker (another test process's, another worktree's) must not release what it staged.
    staging_prefix: str = field(default_factory=lambda: f"jbt-staging-{uuid.uuid4().hex[:8]}")

    def __post_init__(self) -> None:
        self.own_prefix = "--staging-prefix" not in self.extra  # removed when it stops
        if not self.own_prefix:
            self.staging_prefix = self.extra[self.extra.index("--staging-prefix") + 1]

    def command(self) -> list[str]:
        auth: list[str] = []
        if self.admin_token is not None:
            token_file = self.log_path.with_name(self.log_path.name + ".admin-token")
            token_file.write_text(self.admin_token + "\n")
            auth = ["--admin-token-file", str(token_file)]
        return [
            sys.executable, "-m", "bridge.app.cli", "run",
            "--broker", self.broker,
            "--upstream-stomp", f"stomp://{self.upstream}",
            "--stomp-listen", f"127.0.0.1:{self.stomp_port}",
            "--admin-listen", f"127.0.0.1:{self.admin_port}",
            "--log-format", "json", "--log-level", "info",
            *auth,
            *([] if "--staging-prefix" in self.extra else
              ["--staging-prefix", self.staging_prefix]),
            *([] if self.broker != "activemq" or "--expiry-dead-letter-queue" in self.extra else
              NOT_WATCHING_ACTIVEMQ_DLQ),
            *self.extra,
        ]

    def start(self, timeout: float = 60.0, *, ready: bool = True) -> BridgeProcess:
        """Start it and wait for its STOMP port, and (``ready``) for /readyz to say 200: a
        bridge takes clients once its broker has answered and its staging queues exist. A
        STOMP or admin port another process took after ``free_port`` saw it free is picked
        again (the suite's processes pick theirs side by side). The 60 s are for the suite's
        start, when its eight processes start their bridges and Spark side by side (one took
        over 20 s to listen then)."""
        for _ in range(3):
            if self._listening(timeout):
                break
            self.stop()
            taken = [f"127.0.0.1:{port}: Address already in use" in self.log()
                     for port in (self.stomp_port, self.admin_port)]
            if not any(taken):
                raise RuntimeError(f"bridge did not start; its log:\n{self.log()}")
            self.stomp_port = free_port() if taken[0] else self.stomp_port
            self.admin_port = free_port() if taken[1] else self.admin_port
        else:
            raise RuntimeError(f"bridge did not start: no free port; its log:\n{self.log()}")
        deadline = time.monotonic() + timeout
        while ready and self.http("/readyz")[0] != 200:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"bridge not ready in {timeout} s; its log:\n{self.log()}")
            time.sleep(0.05)
        return self

    def _listening(self, timeout: float) -> bool:
        """Start the process; True once its STOMP and admin ports take connections and it has
        said it is listening."""
        start = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.log_file = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            self.command(), stdout=self.log_file, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        deadline = time.monotonic() + timeout
        # The admin API listens a moment after the STOMP port: wait for both.
        if not (wait_port(self.stomp_port, timeout, self.proc)
                and wait_port(self.admin_port, max(0.1, deadline - time.monotonic()),
                              self.proc)):
            return False
        # Its AMQP listeners and its SIGTERM handler come a moment later, before the line that
        # says it listens (a test connected to its AMQP port too early on a loaded machine, and
        # a SIGTERM then ended it with -15).
        while self.proc.poll() is None:
            with open(self.log_path, "rb") as log:
                log.seek(start)
                if b'"event": "listening"' in log.read():
                    return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 15.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log_file.close()
        if self.own_prefix and self.broker == "rabbitmq":
            self._remove_staging_queues()
        return self.proc.returncode

    def _remove_staging_queues(self) -> None:
        """Delete the staging queues of a prefix made for this bridge alone: RabbitMQ keeps
        every queue, and with thousands of them its management API lists them too slowly for
        the tools and the console that read it."""
        import pika

        from adapters import rabbitmq
        from bridge.staging.levels import layout_for
        from tests.integration.brokers import BROKERS
        from tests.integration.staging_util import clean

        try:
            clean(BROKERS["rabbitmq"], layout_for(rabbitmq.FORMAT, self.staging_prefix))
        except pika.exceptions.AMQPError:
            pass  # left to the suite's end-of-run clean-up

    def http(self, path: str, method: str = "GET", *, authorized: bool = True,
             timeout: float = 30) -> tuple[int, str]:
        """Call the admin API, with the bearer token unless ``authorized`` is False."""
        request = urllib.request.Request(f"http://127.0.0.1:{self.admin_port}{path}",
                                         method=method)
        if authorized and self.admin_token is not None:
            request.add_header("Authorization", f"Bearer {self.admin_token}")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def metric(self, name: str, **labels: str) -> float:
        """The value of one sample on /metrics (0 when absent)."""
        _, text = self.http("/metrics")
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        key = f"{name}{{{want}}}" if labels else name
        for line in text.splitlines():
            if line.startswith("#"):
                continue
            sample, _, value = line.rpartition(" ")
            if sample == key or (labels and sample.startswith(name + "{") and
                                 all(f'{k}="{v}"' in sample for k, v in labels.items())):
                return float(value)
        return 0.0

    def settled_metric(self, name: str, expected: float, timeout: float = 10,
                       **labels: str) -> float:
        """The sample once it equals ``expected``, or its last value after ``timeout`` seconds.

        The engine counts an outcome after the broker has confirmed it, so a client can see the
        message a moment before the counter moves."""
        deadline = time.monotonic() + timeout
        value = self.metric(name, **labels)
        while value != expected and time.monotonic() < deadline:
            time.sleep(0.1)
            value = self.metric(name, **labels)
        return value

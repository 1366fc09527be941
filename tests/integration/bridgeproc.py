"""Run the real ``jms-bridge run`` as a subprocess, the way an operator would."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


@dataclass
class BridgeProcess:
    broker: str
    upstream: str  # host:port of the broker's STOMP port
    log_path: Path
    extra: list[str] = field(default_factory=list)
    stomp_port: int = field(default_factory=free_port)
    admin_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "bridge.app.cli", "run",
            "--broker", self.broker,
            "--upstream-stomp", f"stomp://{self.upstream}",
            "--stomp-listen", f"127.0.0.1:{self.stomp_port}",
            "--admin-listen", f"127.0.0.1:{self.admin_port}",
            "--log-format", "json", "--log-level", "info",
            *self.extra,
        ]

    def start(self, timeout: float = 20.0) -> BridgeProcess:
        self.log_file = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            self.command(), stdout=self.log_file, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        if not wait_port(self.stomp_port, timeout, self.proc):
            self.stop()
            raise RuntimeError(f"bridge did not start; its log:\n{self.log()}")
        return self

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
        return self.proc.returncode

    def http(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.admin_port}{path}", timeout=5
            ) as r:
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

"""A ``jms-bridge`` command whose stderr is a pseudo-terminal and stdout a pipe: what a person at
a terminal sees (a progress bar is drawn only there)."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
JMS_BRIDGE = [sys.executable, "-m", "bridge.app.cli"]  # this checkout's code


def tool_env() -> dict[str, str]:
    """The environment without the bridge's own settings, and a terminal 120 columns wide."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JMS_BRIDGE_")}
    env["COLUMNS"] = "120"
    return env


class OnTerminal:
    """``jms-bridge ARGS``; ``session``: in a session of its own, so that a Ctrl-C can go to its
    whole process group, as a terminal sends it."""

    def __init__(self, args: Sequence[str], *, session: bool = False) -> None:
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen([*JMS_BRIDGE, *args], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=slave, env=tool_env(),
                                     cwd=ROOT, text=True, start_new_session=session)
        os.close(slave)
        self.seen = b""

    def read(self, until: float) -> None:
        """What the terminal shows, until ``until`` (monotonic) or the command's end."""
        while time.monotonic() < until:
            ready, _, _ = select.select([self.master], [], [], 0.05)
            if not ready:
                if self.proc.poll() is not None:
                    return
                continue
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # the other end closed
                return
            if not chunk:
                return
            self.seen += chunk

    def text(self) -> str:
        return self.seen.decode(errors="replace")

    def finish(self, timeout: float = 120) -> tuple[int, str, str]:
        """Its exit status, stdout and what the terminal showed (killed after ``timeout``)."""
        deadline = time.monotonic() + timeout
        try:
            self.read(deadline)
            out, _ = self.proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            os.close(self.master)
        return self.proc.returncode, out, self.text()

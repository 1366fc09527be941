"""A command whose reader goes away (``jms-bridge ... | head``) ends quietly: no traceback, no
"Exception ignored" line, exit 0 or 141 (128 + SIGPIPE, what a shell reports for a command
that a closed pipe stopped)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("args", [
    ["policy", "show", "/queue/a", "--json", "--upto", "1000"],
    ["policy", "show", "/queue/a"],
    ["--help"],
    ["dlq", "browse", "--help"],
])
def test_a_closed_stdout_ends_quietly(args: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JMS_BRIDGE_")}
    env["PYTHONPATH"] = str(ROOT)
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the command writes anything
    try:
        done = subprocess.run([sys.executable, "-m", "bridge.app.cli", *args], stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=60, env=env, cwd=ROOT)
    finally:
        os.close(write)
    assert done.returncode in (0, 141), done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    assert "BrokenPipe" not in done.stderr, done.stderr

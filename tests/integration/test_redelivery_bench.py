"""bench/redelivery.py at a small size on each broker, so the benchmark of redelivery cannot rot
and its guarantees are checked on every run: no redelivery early (the bench counts from the
moment its consumer sent the NACK, not from the bridge's own due time), every delivery's
JMSXDeliveryCount right, every failure redelivered. Its throughput goal is the bench's to report,
not this test's (the machine sets it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

from tests.integration.brokers import Broker

ROOT = Path(__file__).resolve().parents[2]
MESSAGES = 300
FAILS = 3  # the bench NACKs each message this many times, then ACKs it


def test_redelivery_bench_small(broker: Broker, tmp_path: Path) -> None:
    figures = tmp_path / "redelivery.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "redelivery.py"), "--brokers", broker.name,
         "--messages", str(MESSAGES), "--paced", str(MESSAGES), "--rate", "1000",
         "--staging-prefix", f"jbt-staging-{uuid.uuid4().hex[:8]}", "--json", str(figures)],
        capture_output=True, text=True, timeout=240, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    output = done.stdout + done.stderr
    # 0: every goal met; 1: it measured, and a goal (throughput, on this machine) was missed.
    assert done.returncode in (0, 1) and figures.exists(), output
    [run] = json.loads(figures.read_text())
    assert run["plain"]["early"] == 0 and run["plain"]["redeliveries"] == 0, output
    for name in ("default", "staged", "default paced", "staged paced"):
        x = run[name]
        assert x["redeliveries"] == FAILS * MESSAGES, (name, output)
        assert x["early"] == 0, (name, x["lateness_ms"], output)
        assert x["wrong_count"] == 0, (name, output)

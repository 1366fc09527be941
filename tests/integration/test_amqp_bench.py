"""bench/amqp.py, bench/amqp_screen.py and bench/amqp_deliveries.py at a small size, so that the
AMQP benchmarks cannot rot: every path publishes and consumes, every delayed publish is staged
(and purged at the end), and the figures the issue asks for are printed, the CPU budget lines
included. The goals are the bench's to report, not this test's (this machine's swings decide
them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.integration.brokers import BROKERS, require

ROOT = Path(__file__).resolve().parents[2]
COUNT = 300
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def test_the_amqp_bench_runs_every_path_and_stages_every_delayed_publish(tmp_path: Path) -> None:
    broker = BROKERS["rabbitmq"]
    require(broker)
    figures = tmp_path / "amqp.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "amqp.py"), "--count", str(COUNT), "--rounds", "1",
         "--stomp-port", str(broker.stomp_port), "--json", str(figures)],
        capture_output=True, text=True, timeout=240, cwd=ROOT, env=ENV)
    output = done.stdout + done.stderr
    assert done.returncode == 0 and figures.exists(), output[-4000:]
    report = json.loads(figures.read_text())
    assert set(report["paths"]) == {"direct", "relay", "bridge"}, output
    for path, found in report["paths"].items():
        assert found["publish"] > 0 and found["consume"] > 0, (path, output)
    assert report["delayed"]["delayed"] > 0 and report["delayed"]["plain"] > 0, output
    assert report["staged_purged"] == COUNT, output  # each delayed publish was staged once
    assert {"bridge/relay publish", "bridge/relay consume", "delayed/plain publish"} <= set(
        report["ratios"]), output
    assert report["bridge_peak_rss_mb"] > 0, output
    assert "CPU a message, delayed through the bridge: bridge " in done.stdout, output
    # The staging queues were declared lazy and of classic queue version 2.
    held = report["staging_queues"]
    assert held and all(q == {"x-queue-mode": "lazy", "x-queue-version": 2}
                        for q in held.values()), held


def test_the_screen_bench_frames_and_screens_delayed_publishes() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "amqp_screen.py"), "--count", "200", "--repeat",
         "1"], capture_output=True, text=True, timeout=120, cwd=ROOT, env=ENV)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "CPU µs a delayed publish" in done.stdout, done.stdout


def test_the_delivery_bench_stamps_remembers_and_settles_every_delivery() -> None:
    """bench/amqp_deliveries.py checks its own output: every delivery stamped, taken as a run
    of plain deliveries, and settled by the consumer's acks (it exits non-zero otherwise)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "amqp_deliveries.py"), "--count", "1000",
         "--batch", "100", "--repeat", "1"], capture_output=True, text=True, timeout=120,
        cwd=ROOT, env=ENV)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "CPU µs a delivery" in done.stdout, done.stdout

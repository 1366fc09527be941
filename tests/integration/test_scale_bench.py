"""bench/scale.py --quick on each broker, so the scale benchmark cannot rot: every part
this tree has (the cluster part needs a cluster of its own and is left to the bench) runs at its
small size and must finish with exit status 0 and its figures printed."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path

from tests.integration.bridgeproc import NOT_WATCHING_ACTIVEMQ_DLQ
from tests.integration.brokers import Broker

ROOT = Path(__file__).resolve().parents[2]
PER_BROKER = ("burst", "pending", "restart", "bridges")
# What each part prints when it has measured.
PRINTS = {
    "burst": "burst:",
    "pending": "pending: largest held",
    "restart": "first release",
    "bridges": "3 bridge(s):",
}
# The burst's time over the broker's own move of as many messages, and the peak RSS of the
# bridge and of its engine.
BURST_LINES = (
    r"burst: [\d,]+ released in [\d.]+ s .*; the broker's own move of [\d,]+ .*: [\d.]+ s; "
    r"ratio [\d.]+",
    r"burst: .*peak RSS \(VmHWM\) bridge [1-9]\d* MB, engine [1-9]\d* MB",
)


def test_scale_bench_quick(broker: Broker) -> None:
    parts = [p for p in PER_BROKER if (ROOT / "bench" / f"scale_{p}.py").exists()]
    assert {"pending", "restart", "bridges"} <= set(parts)
    urls = []
    if broker.amqp_url:
        urls += ["--rabbitmq-amqp", broker.amqp_url]
    if broker.management_url:
        urls += ["--rabbitmq-management", broker.management_url]
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "scale.py"), "--quick", "--brokers", broker.name,
         "--parts", ",".join(parts), f"--{broker.name}", f"{broker.stomp_host}:{broker.stomp_port}",
         "--staging-prefix", f"jbt-staging-{uuid.uuid4().hex[:8]}", *urls,
         *(f"--bridge-arg={arg}" for arg in NOT_WATCHING_ACTIVEMQ_DLQ
           if broker.name == "activemq")],
        capture_output=True, text=True, timeout=240, cwd=ROOT,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "Traceback" not in output, output
    for part in parts:
        assert PRINTS[part] in output, f"part {part} printed no figures:\n{output}"
    for line in BURST_LINES if "burst" in parts else ():
        assert re.search(line, output), f"no line like {line!r}:\n{output}"
    assert "scale: done" in output, output

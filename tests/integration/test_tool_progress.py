"""Long tool runs on both brokers: a progress bar (count, rate, estimate) on a terminal and
nothing of it otherwise, and Ctrl-C stopping a ``dlq export`` cleanly with one line saying what
was done, nothing lost."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path

from adapters.base import Message
from adapters.queues import QueueTools
from tests.integration.bridgeproc import BridgeProcess
from tests.integration.brokers import Broker
from tests.integration.clients import connect
from tests.integration.terminal import JMS_BRIDGE, ROOT, OnTerminal, tool_env
from tests.integration.test_dlq_tools import (  # noqa: F401 - fixtures
    PREFIX,
    _delete_own_queues,
    drain,
    fill,
    flags,
)
from tests.integration.test_dlq_tools import (
    tools as tools,
)

BAR = re.compile(r"(\d+)/(\d+) \[[0-9:]+<[0-9:?]+, +[0-9.?]+ ?[kM]? ?msg/s\]")


def _queue(tools: QueueTools, n: int) -> str:
    name = f"{PREFIX}stompwire-{uuid.uuid4().hex[:8]}"
    fill(tools, name, [Message({"n": str(i)}, f"body {i}".encode()) for i in range(n)])
    return name


def dlq(broker: Broker, command: str, *args: str) -> OnTerminal:
    """``jms-bridge dlq COMMAND`` against ``broker`` on a terminal."""
    return OnTerminal(["dlq", command, *flags(broker), *args])


def test_a_purge_on_a_terminal_shows_its_count_and_rate(broker: Broker,
                                                          tools: QueueTools) -> None:
    queue = _queue(tools, 300)
    code, out, err = dlq(broker, "purge", "--queue", queue, "--all").finish()
    assert code == 0, err
    bars = BAR.findall(err)
    assert bars and ("300", "300") in bars, err
    assert "purged 300 of 300" in out and "msg/s" not in out


def test_no_bar_without_a_terminal_or_with_json(broker: Broker, tools: QueueTools,
                                                tmp_path: Path) -> None:
    queue = _queue(tools, 50)
    piped = subprocess.run([*JMS_BRIDGE, "dlq", "export", *flags(broker), "--queue", queue,
                            "--to", str(tmp_path / "a")],
                           capture_output=True, text=True, env=tool_env(), cwd=ROOT, timeout=120)
    assert piped.returncode == 0, piped.stderr
    assert "msg/s" not in piped.stderr and "\r" not in piped.stderr and "%" not in piped.stderr
    code, out, err = dlq(broker, "replay", "--queue", queue, "--to",
                                f"{queue}-to", "--json").finish()
    assert code == 0, err
    assert json.loads(out)["done"] == 50 and "msg/s" not in err, err
    assert len(drain(tools, f"{queue}-to")) == 50


def test_ctrl_c_stops_an_export_cleanly_and_loses_nothing(broker: Broker, tools: QueueTools,
                                                          tmp_path: Path) -> None:
    total = 6000
    queue = _queue(tools, total)
    run = dlq(broker, "export", "--queue", queue, "--to", str(tmp_path / "out"),
                     "--remove")
    # Until the bar shows the first batch of the export (1,000: bridge/app/dlq.py) done and
    # more under way: an interrupt before the first commit rightly exports none.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        run.read(time.monotonic() + 0.1)
        counts = [int(a) for a, _ in BAR.findall(run.text())]
        if counts and 1000 < max(counts) < total - 1500:
            break
    run.proc.send_signal(signal.SIGINT)
    code, out, err = run.finish()
    assert code == 130, (code, err)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    line = [x for x in re.split(r"[\r\n]+", err) if x.startswith("interrupted:")]
    assert len(line) == 1, err
    m = re.match(r"interrupted: ([\d,]+) of ([\d,]+) exported to .* and removed; "
                 r"the rest stays on the queue$", line[0].strip())
    assert m, line
    done = int(m.group(1).replace(",", ""))
    assert int(m.group(2).replace(",", "")) == total and 0 < done < total
    rows = [json.loads(x) for f in (tmp_path / "out").iterdir()
            for x in f.read_text().splitlines()]
    assert len(rows) == done
    left = drain(tools, queue)
    assert len(left) == total - done
    everyone = {r["headers"]["n"] for r in rows} | {m.headers["n"] for m in left}
    assert everyone == {str(i) for i in range(total)}  # each exactly once, none lost


def test_staged_list_shows_its_reading_on_a_terminal_only(bridge: BridgeProcess,
                                                           broker: Broker) -> None:
    dest = broker.queue_destination(f"jbt-stompwire-{uuid.uuid4().hex[:8]}")
    conn, inbox = connect(bridge.stomp_port, broker.user, broker.password)
    conn.send(dest, "later", headers={"x-delay": "3600000", "receipt": "staged"})
    assert inbox.wait_receipt("staged")
    conn.disconnect()
    args = ["staged", "list", "--target", dest, "--broker", bridge.broker,
            "--upstream-stomp", f"stomp://{bridge.upstream}", "--staging-prefix",
            bridge.staging_prefix, "--scan"]
    code, out, err = OnTerminal(args).finish()
    assert code == 0, err
    assert "msg/s" in err and re.search(r"\b\d+(/\d+)? ?(msg)? ?\[", err), err
    assert dest in out and "msg/s" not in out
    piped = subprocess.run([*JMS_BRIDGE, *args], capture_output=True, text=True, env=tool_env(),
                           cwd=ROOT, timeout=60)
    assert piped.returncode == 0 and dest in piped.stdout, piped.stderr
    assert "msg/s" not in piped.stderr and "\r" not in piped.stderr

"""Long tool runs on both brokers: a progress bar (count, rate, estimate) on a terminal and
nothing of it otherwise, and Ctrl-C stopping a ``dlq export`` cleanly with one line saying what
was done, nothing lost."""

from __future__ import annotations

import json
import os
import pty
import re
import select
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
from tests.integration.test_dlq_tools import (  # noqa: F401 - fixtures
    JMS_BRIDGE,
    PREFIX,
    ROOT,
    _delete_own_queues,
    drain,
    fill,
    flags,
    tools,
)

BAR = re.compile(r"(\d+)/(\d+) \[[0-9:]+<[0-9:?]+, +[0-9.?]+ ?[kM]? ?msg/s\]")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JMS_BRIDGE_")}
    env["COLUMNS"] = "120"
    return env


def _queue(tools: QueueTools, n: int) -> str:
    name = f"{PREFIX}stompwire-{uuid.uuid4().hex[:8]}"
    fill(tools, name, [Message({"n": str(i)}, f"body {i}".encode()) for i in range(n)])
    return name


class OnTerminal:
    """A command whose stderr is a pseudo-terminal (stdout a pipe): what a person sees."""

    def __init__(self, broker: Broker, *args: str) -> None:
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen([*JMS_BRIDGE, "dlq", args[0], *flags(broker), *args[1:]],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=slave, env=_env(), cwd=ROOT, text=True)
        os.close(slave)
        self.seen = b""

    def read(self, until: float) -> None:
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

    def finish(self, timeout: float = 120) -> tuple[int, str, str]:
        deadline = time.monotonic() + timeout
        self.read(deadline)
        out, _ = self.proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        os.close(self.master)
        return self.proc.returncode, out, self.seen.decode(errors="replace")


def test_a_purge_on_a_terminal_shows_its_count_and_rate(broker: Broker,
                                                          tools: QueueTools) -> None:
    queue = _queue(tools, 300)
    code, out, err = OnTerminal(broker, "purge", "--queue", queue, "--all").finish()
    assert code == 0, err
    bars = BAR.findall(err)
    assert bars and ("300", "300") in bars, err
    assert "purged 300 of 300" in out and "msg/s" not in out


def test_no_bar_without_a_terminal_or_with_json(broker: Broker, tools: QueueTools,
                                                tmp_path: Path) -> None:
    queue = _queue(tools, 50)
    piped = subprocess.run([*JMS_BRIDGE, "dlq", "export", *flags(broker), "--queue", queue,
                            "--to", str(tmp_path / "a")],
                           capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=120)
    assert piped.returncode == 0, piped.stderr
    assert "msg/s" not in piped.stderr and "\r" not in piped.stderr and "%" not in piped.stderr
    code, out, err = OnTerminal(broker, "replay", "--queue", queue, "--to",
                                f"{queue}-to", "--json").finish()
    assert code == 0, err
    assert json.loads(out)["done"] == 50 and "msg/s" not in err, err
    assert len(drain(tools, f"{queue}-to")) == 50


def test_ctrl_c_stops_an_export_cleanly_and_loses_nothing(broker: Broker, tools: QueueTools,
                                                          tmp_path: Path) -> None:
    total = 6000
    queue = _queue(tools, total)
    run = OnTerminal(broker, "export", "--queue", queue, "--to", str(tmp_path / "out"),
                     "--remove")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until the bar shows work under way
        run.read(time.monotonic() + 0.1)
        counts = [int(a) for a, _ in BAR.findall(run.seen.decode(errors="replace"))]
        if counts and 0 < max(counts) < total - 1500:
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
            "--upstream-stomp", f"stomp://{bridge.upstream}", "--scan"]
    master, slave = pty.openpty()
    proc = subprocess.Popen([*JMS_BRIDGE, *args], stdout=subprocess.PIPE, stderr=slave,
                            stdin=subprocess.DEVNULL, env=_env(), cwd=ROOT, text=True)
    os.close(slave)
    run = OnTerminal.__new__(OnTerminal)
    run.master, run.proc, run.seen = master, proc, b""
    code, out, err = run.finish()
    assert code == 0, err
    assert "msg/s" in err and re.search(r"\b\d+(/\d+)? ?(msg)? ?\[", err), err
    assert dest in out and "msg/s" not in out
    piped = subprocess.run([*JMS_BRIDGE, *args], capture_output=True, text=True, env=_env(),
                           cwd=ROOT, timeout=60)
    assert piped.returncode == 0 and dest in piped.stdout, piped.stderr
    assert "msg/s" not in piped.stderr and "\r" not in piped.stderr

"""``jms-bridge report`` (a PySpark job) on a terminal: a progress bar of its tasks (a count
and a rate), nothing of it on a pipe, and Ctrl-C stopping it with one line and exit 130, no
Py4J traceback. No broker: these run once."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
JMS_BRIDGE = [sys.executable, "-m", "bridge.app.cli"]  # this checkout's code
BAR = re.compile(r"report: (?:\d+%\|.*\| )?(\d+)(?:/\d+)? ?(?:tasks)? ?\[[0-9:]+(?:<[0-9:?]+)?, "
                 r"+[0-9.?]+ ?[kM]? ?tasks/s\]")
H = 1_700_000_000_000


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JMS_BRIDGE_")}
    env["COLUMNS"] = "120"
    return env


def _journal(folder: Path, lines: int, files: int = 4) -> Path:
    folder.mkdir()
    events = ("staged", "released", "redelivered", "expired")
    for f in range(files):
        with (folder / f"h-1-engine-{f}-00001.jsonl").open("w") as out:
            for i in range(f, lines, files):
                out.write(json.dumps({"v": 1, "time": H + i * 37, "event": events[i % 4],
                                      "destination": f"/queue/d{i % 40}",
                                      "message_id": f"m{i % 9000}", "late_ms": i % 700}) + "\n")
    return folder


class OnTerminal:
    """``jms-bridge report`` with stderr on a pseudo-terminal (stdout a pipe), in a session of
    its own so that a Ctrl-C can go to its whole process group, as a terminal sends it."""

    def __init__(self, *args: str) -> None:
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen([*JMS_BRIDGE, "report", *args], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=slave, env=_env(), cwd=ROOT,
                                     text=True, start_new_session=True)
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

    def text(self) -> str:
        return self.seen.decode(errors="replace")

    def finish(self, timeout: float = 300) -> tuple[int, str, str]:
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


def test_a_report_on_a_terminal_shows_its_tasks_and_rate(tmp_path: Path) -> None:
    journal = _journal(tmp_path / "journal", 20_000)
    code, out, err = OnTerminal("--journal", str(journal), "--out", str(tmp_path / "out")).finish()
    assert code == 0, err
    counts = [int(n) for n in BAR.findall(err)]
    assert counts and max(counts) > 0, err
    assert "20000 events" in out and "tasks" not in out
    assert (tmp_path / "out" / "report.html").exists()


def test_no_bar_without_a_terminal(tmp_path: Path) -> None:
    journal = _journal(tmp_path / "journal", 2_000)
    piped = subprocess.run([*JMS_BRIDGE, "report", "--journal", str(journal), "--out",
                            str(tmp_path / "out")], capture_output=True, text=True, env=_env(),
                           cwd=ROOT, timeout=300)
    assert piped.returncode == 0, piped.stderr
    assert "2000 events" in piped.stdout
    assert "tasks" not in piped.stderr and "\r" not in piped.stderr, piped.stderr


def test_ctrl_c_stops_a_report_with_one_line(tmp_path: Path) -> None:
    journal = _journal(tmp_path / "journal", 400_000)
    run = OnTerminal("--journal", str(journal), "--out", str(tmp_path / "out"))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and run.proc.poll() is None:  # until work is under way
        run.read(time.monotonic() + 0.1)
        if BAR.search(run.text()):
            break
    assert run.proc.poll() is None, run.text()
    os.killpg(run.proc.pid, signal.SIGINT)  # what Ctrl-C on the terminal does
    code, out, err = run.finish(timeout=120)
    assert code == 130, (code, err)
    assert "Traceback" not in err and "py4j" not in err.lower() and "ERROR" not in err, err
    lines = [x.strip() for x in re.split(r"[\r\n]+", err) if x.strip()]
    assert [x for x in lines if "interrupted" in x] == ["interrupted: the report was not written"]
    assert lines[-1] == "interrupted: the report was not written", err
    assert out == "" and not (tmp_path / "out" / "report.html").exists()

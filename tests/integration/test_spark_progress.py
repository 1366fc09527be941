"""``jms-bridge report`` (a PySpark job) on a terminal: a progress bar of its tasks (a count
and a rate), and Ctrl-C stopping it with one line and exit 130, no Py4J traceback (that a
report on a pipe shows no bar, test_spark_cluster checks). No broker: these run once."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

from tests.integration.terminal import OnTerminal

BAR = re.compile(r"report: (?:\d+%\|.*\| )?(\d+)(?:/\d+)? ?(?:tasks)? ?\[[0-9:]+(?:<[0-9:?]+)?, "
                 r"+[0-9.?]+ ?[kM]? ?tasks/s\]")
H = 1_700_000_000_000


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


def report(*args: str) -> OnTerminal:
    """``jms-bridge report ARGS`` on a terminal, in a session of its own (for the Ctrl-C)."""
    return OnTerminal(["report", *args], session=True)


def test_a_report_on_a_terminal_shows_its_tasks_and_rate(tmp_path: Path) -> None:
    journal = _journal(tmp_path / "journal", 20_000)
    run = report("--journal", str(journal), "--out", str(tmp_path / "out"))
    code, out, err = run.finish(timeout=300)
    assert code == 0, err
    counts = [int(n) for n in BAR.findall(err)]
    assert counts and max(counts) > 0, err
    assert "20000 events" in out and "tasks" not in out
    assert (tmp_path / "out" / "report.html").exists()


def test_ctrl_c_stops_a_report_with_one_line(tmp_path: Path) -> None:
    journal = _journal(tmp_path / "journal", 400_000)
    run = report("--journal", str(journal), "--out", str(tmp_path / "out"))
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

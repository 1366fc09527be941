"""The documented ``spark-submit`` of the report's script works as printed (docs/pipeline.md):
run from its folder, no module of the project hides one of Python's own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_spark_submit_of_the_report_script(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    journal.mkdir()
    event = {"v": 1, "time": 1767225601234, "event": "released", "broker": "rabbitmq",
             "instance": "i", "process": "engine", "message_id": "ID:1",
             "destination": "/queue/later", "size": 5, "due": 1767225601230, "late_ms": 4}
    (journal / "events-1.jsonl").write_text(json.dumps(event) + "\n")
    out = tmp_path / "out"
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    done = subprocess.run(
        [str(bin_dir / "spark-submit"), "--master", "local[1]",
         "--conf", "spark.ui.enabled=false", "bridge/pipeline/report.py",
         "--journal", str(journal), "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "1 events" in done.stdout, done.stdout
    assert (out / "report.html").is_file() and (out / "lateness").is_dir()

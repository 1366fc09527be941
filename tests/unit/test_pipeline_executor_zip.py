"""The zip a job ships to its executors holds everything replay's partitions import: checked in
an interpreter that sees nothing but the standard library, PySpark's own zips and ours."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bridge.pipeline.executor_zip import executor_zip

# What an executor imports to run replay.publish_partition (and unpickle its Target).
EXECUTOR_SIDE = """
import sys
sys.path[:0] = {paths!r}
from importlib import metadata
import bridge.pipeline.replay as replay
from adapters.base import Message
from adapters.queues import Put
import adapters.queues_rabbitmq, adapters.queues_activemq
from bridge.deadletter.metadata import describe, replay_headers
from policies.endpoints import Endpoint
from policies.errors import BrokerUnavailable, PutRefused
replay._quiet_logs()
assert metadata.version("pika")
outside = [m.__file__ for m in list(sys.modules.values())
           if getattr(m, "__file__", None) and "site-packages" in m.__file__
           and ".zip" not in m.__file__]
assert not outside, outside
print("ok")
"""


def test_replays_partition_code_imports_from_the_zip_alone(tmp_path: Path) -> None:
    pyspark = pytest.importorskip("pyspark")
    lib = Path(pyspark.__file__).parent / "python" / "lib"
    spark_zips = sorted(str(p) for p in lib.glob("*.zip"))
    assert spark_zips, f"no PySpark zips in {lib}"
    shipped = executor_zip(tmp_path)
    code = EXECUTOR_SIDE.format(paths=[str(shipped), *spark_zips])
    # -I: no PYTHONPATH, no user site; -S: no site-packages
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "ok", done.stderr[-3000:]


def test_the_zip_is_built_once_for_the_same_sources(tmp_path: Path) -> None:
    first = executor_zip(tmp_path)
    made = first.stat().st_mtime_ns
    again = executor_zip(tmp_path)
    assert again == first and again.stat().st_mtime_ns == made
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary file left

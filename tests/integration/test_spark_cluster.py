"""``jms-bridge report`` and ``replay`` on a real Spark standalone cluster (a master and one worker
started from the installed PySpark), with only ``--master`` and ``--conf``: the executors run a
Python without the project's packages or its dependencies, so whatever the command does not ship
itself shows as a failure. Their results are compared with the embedded (local) run's."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SPARK_JVM_OPTIONS
from tests.integration.bridgeproc import free_port
from tests.integration.brokers import BROKERS, require
from tests.integration.test_pipeline_replay import drain, forget_ledger, target_args, write_archive
from tests.unit.test_pipeline_report import write_journal

ROOT = Path(__file__).resolve().parents[2]
# The executors' Python: the system's, of the driver's minor version (PySpark refuses another),
# without the venv's packages.
WORKER_PYTHON = "/usr/bin/python3"
EXECUTOR = ["--conf", "spark.executor.memory=500m", "--conf", "spark.cores.max=1",
            "--conf", "spark.sql.shuffle.partitions=4",
            "--conf", f"spark.pyspark.python={WORKER_PYTHON}",
            "--conf", f"spark.executor.extraJavaOptions={SPARK_JVM_OPTIONS}"]
CLUSTER_START_S = 90


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def _clean_env() -> dict[str, str]:
    """The environment of the cluster's JVMs: no PYTHONPATH (Spark passes it on to the Python
    workers, which would then find the project's sources), a PATH whose ``python3`` is the
    system's, and small daemons."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "VIRTUAL_ENV")}
    env.update(SPARK_HOME=str(_spark_home()), SPARK_DAEMON_MEMORY="256m",
               SPARK_LOCAL_IP="127.0.0.1", PATH="/usr/bin:/bin")
    return env


def _alive_workers(webui: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{webui}/json/", timeout=2) as r:
            state = json.load(r)
    except OSError:
        return 0
    return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """TERM each daemon's process group (the worker's executors and their Python workers are
    in it), then KILL whatever is left."""
    for p in reversed(procs):
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    for p in reversed(procs):
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(timeout=10)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A standalone master and worker (1 core, 512 MB) on loopback; its URL."""
    if not Path(WORKER_PYTHON).exists():
        message = f"{WORKER_PYTHON} (the workers' Python) is not installed"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    folder = tmp_path_factory.mktemp("spark-cluster")
    spark_class = str(_spark_home() / "bin" / "spark-class")
    port, webui, worker_ui = free_port(), free_port(), free_port()
    url = f"spark://127.0.0.1:{port}"
    env = _clean_env()
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, *args: str) -> None:
        log = (folder / f"{name}.log").open("wb")
        procs.append(subprocess.Popen([spark_class, *args], cwd=folder, env=env, stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True))

    try:
        start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
              "--port", str(port), "--webui-port", str(webui))
        start("worker", "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
              "--cores", "1", "--memory", "512m", "--webui-port", str(worker_ui),
              "--work-dir", str(folder / "work"))
        deadline = time.monotonic() + CLUSTER_START_S
        while _alive_workers(webui) < 1:
            logs = {p.name: p.read_text(errors="replace")[-2000:] for p in folder.glob("*.log")}
            assert time.monotonic() < deadline, f"the cluster did not start: {logs}"
            assert all(p.poll() is None for p in procs), f"a daemon ended: {logs}"
            time.sleep(0.5)
        yield url
    finally:
        _stop(procs)


def jms_bridge(*args: str) -> subprocess.Popen[str]:
    """The command as an operator runs it (the executors' Python is named with ``--conf``),
    started: the test runs the local job meanwhile."""
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.Popen([sys.executable, "-m", "bridge.app.cli", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finished(proc: subprocess.Popen[str], timeout: float = 300) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the command did not end in {timeout} s: {err[-3000:]}")
    return proc.returncode, out, err


def test_the_executors_python_lacks_the_projects_packages(tmp_path: Path) -> None:
    """Else the cluster tests would pass whether the command ships them or not."""
    for python in (WORKER_PYTHON, "python3"):  # named, and the cluster's PATH's
        for module in ("bridge", "adapters", "policies", "pika", "stomp", "tenacity",
                       "structlog"):
            done = subprocess.run([python, "-c", f"import {module}"], cwd=tmp_path,
                                  env=_clean_env(), capture_output=True, text=True, timeout=30)
            assert done.returncode != 0, f"{python} imports {module}"


def rows(df: Any) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in df.collect())


def test_the_report_on_a_cluster_gives_the_local_tables(
    cluster: str, spark: Any, tmp_path: Path
) -> None:
    from bridge.pipeline import report

    journal = tmp_path / "journal"
    journal.mkdir()
    write_journal(journal)
    proc = jms_bridge("report", "--journal", str(journal), "--out", str(tmp_path / "cluster"),
                      "--master", cluster, *EXECUTOR)
    local = report.run(spark, str(journal), str(tmp_path / "local"), html=False)
    code, _, err = finished(proc)
    assert code == 0, err[-3000:]
    # On a pipe, no progress bar (test_spark_progress has the one on a terminal).
    assert "tasks" not in err and "\r" not in err, err[-3000:]
    for name in report.TABLES:
        there = spark.read.parquet(str(tmp_path / "cluster" / name))
        assert rows(there) == rows(local.tables[name]), name
    assert (tmp_path / "cluster" / "report.html").stat().st_size > 0


def test_a_selector_replay_on_a_cluster_puts_back_what_a_local_one_does(
    cluster: str, spark: Any, tmp_path: Path
) -> None:
    from bridge.pipeline import replay
    from policies.endpoints import Endpoint

    rabbit = BROKERS["rabbitmq"]
    require(rabbit)
    run = uuid.uuid4().hex[:8]
    archive = tmp_path / "archive"
    write_archive(archive, rabbit, f"spark-{run}")
    selector = "color = 'red' AND seq < 40"
    local_to, cluster_to = f"/queue/jbt-spark-{run}-local", f"/queue/jbt-spark-{run}-cluster"

    proc = jms_bridge("replay", *target_args(rabbit), "--archive", str(archive),
                      "--selector", selector, "--to", cluster_to, "--batch", "5",
                      "--ledger", f"jbt-spark-{run}-cluster", "--master", cluster, *EXECUTOR)
    endpoint = Endpoint("127.0.0.1", 5672, rabbit.user, rabbit.password, "/")
    target = replay.Target("rabbitmq", endpoint, None, local_to,
                           replay.LEDGER_PREFIX + f"jbt-spark-{run}-local", None, 5)
    local = replay.run(spark, [str(archive)], selector, target, broker="rabbitmq")
    assert (local.matched, local.replayed, local.failed) == (20, 20, 0), local
    code, out, err = finished(proc)
    assert code == 0, err[-3000:]
    assert "matched 20 of 240 archived messages; replayed 20" in out, out

    def received(destination: str) -> list[tuple[str, str]]:
        got = drain(rabbit, destination, 20)
        return sorted((m.headers["seq"], m.body if isinstance(m.body, str) else
                       m.body.decode()) for m in got)

    try:
        from_local, from_cluster = received(local_to), received(cluster_to)
        assert len(from_local) == 20
        assert from_cluster == from_local
    finally:
        for name in ("local", "cluster"):
            forget_ledger(rabbit, replay.LEDGER_PREFIX + f"jbt-spark-{run}-{name}")


def test_an_unreachable_master_is_named_in_one_line_quickly(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    journal = tmp_path / "journal"
    journal.mkdir()
    master = f"spark://127.0.0.1:{port}"
    began = time.monotonic()
    code, _, err = finished(jms_bridge("report", "--journal", str(journal), "--out",
                                       str(tmp_path / "out"), "--master", master), 120)
    took = time.monotonic() - began
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and master in lines[0], err[-3000:]
    assert took < 15, f"{took:.0f} s"


pytestmark = pytest.mark.slow

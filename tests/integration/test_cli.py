"""The ``jms-bridge`` command as a person runs it: failures are one line, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.bridgeproc import free_port

BIN = Path(sys.executable).with_name("jms-bridge")
ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JMS_BRIDGE_")}
    # The code of this checkout, not the one the virtualenv was installed from (a worktree).
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([str(BIN), *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_console_script_is_installed() -> None:
    result = run("--version")
    assert result.returncode == 0 and result.stdout.startswith("jms-bridge ")


def test_unknown_flag() -> None:
    assert "--frobnicate" in one_line_error(run("run", "--frobnicate"))


def test_bad_flag_value() -> None:
    assert "upstream-stomp" in one_line_error(run("run", "--upstream-stomp", "localhost"))


def test_quorum_staging_on_activemq() -> None:
    line = one_line_error(run("run", "--broker", "activemq", "--staging-queue-type", "quorum"))
    assert "staging-queue-type" in line and "ActiveMQ has none" in line


@pytest.mark.parametrize("text", ["broker: [\n", "nonsense: 1\n", "broker: kafka\n"])
def test_invalid_config_file(tmp_path: Path, text: str) -> None:
    cfg = tmp_path / "bridge.yaml"
    cfg.write_text(text)
    assert str(cfg) in one_line_error(run("run", "--config", str(cfg)))


def test_unreadable_config_file(tmp_path: Path) -> None:
    line = one_line_error(run("run", "--config", str(tmp_path / "missing.yaml")))
    assert "cannot read" in line


def test_unreachable_broker_with_upstream_wait(tmp_path: Path) -> None:
    """The old fail-fast start, asked for: one line naming the broker, exit 1."""
    port = free_port()
    started = time.monotonic()
    line = one_line_error(
        run("run", "--broker", "activemq", "--upstream-stomp", f"stomp://127.0.0.1:{port}",
            "--stomp-listen", f"127.0.0.1:{free_port()}",
            "--admin-listen", f"127.0.0.1:{free_port()}", "--upstream-wait", "1")
    )
    assert "activemq" in line and f"127.0.0.1:{port}" in line and "not reachable" in line
    assert time.monotonic() - started < 15


def test_listen_port_taken(tmp_path: Path) -> None:
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        line = one_line_error(
            run("run", "--upstream-stomp", f"stomp://127.0.0.1:{taken.getsockname()[1]}",
                "--stomp-listen", f"127.0.0.1:{port}",
                "--admin-listen", f"127.0.0.1:{free_port()}")
        )
    assert "stomp-listen" in line and str(port) in line


@pytest.mark.parametrize("broker", ["rabbitmq", "activemq"])
def test_tools_name_the_mqrc_reason_of_a_broker_they_cannot_use(broker: str) -> None:
    """Unreachable: MQRC_HOST_NOT_AVAILABLE (2538); credentials refused: MQRC_NOT_AUTHORIZED
    (2035), each with the broker's own words after it."""
    from tests.integration.brokers import BROKERS, require

    b = BROKERS[broker]
    require(b)
    port = free_port()
    away = ["--upstream-stomp", f"stomp://{b.user}:{b.password}@127.0.0.1:{port}"]
    wrong = ["--upstream-stomp", f"stomp://{b.user}:not-{b.password}@{b.stomp_host}:{b.stomp_port}"]
    if broker == "rabbitmq":
        away += ["--upstream-amqp", f"amqp://{b.user}:{b.password}@127.0.0.1:{port}/"]
        wrong += ["--upstream-amqp", f"amqp://{b.user}:not-{b.password}@127.0.0.1:5672/"]
    line = one_line_error(run("staged", "list", "--broker", broker, *away))
    assert line.startswith("jms-bridge: MQRC_HOST_NOT_AVAILABLE (2538): "), line
    assert f"127.0.0.1:{port}" in line
    line = one_line_error(run("staged", "list", "--broker", broker, *wrong))
    assert line.startswith("jms-bridge: MQRC_NOT_AUTHORIZED (2035): "), line

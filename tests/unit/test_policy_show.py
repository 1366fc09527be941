"""Redelivery policies from the config file and the environment, and ``jms-bridge policy show``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridge.app.cli import main
from bridge.app.config import resolve
from policies.errors import ConfigError

CONFIG = """\
redelivery:
  "/queue/orders.*": "5:1000; 10:5000; 50:move(queue:dlq$error)"
  "/queue/billing": {dialect: weblogic, redelivery-delay: 2000, redelivery-limit: 3,
                     error-destination: /queue/billing.errors}
  users:
    alice:
      "/queue/orders.*": "2:100; 4:delete"
"""


@pytest.fixture()
def config(tmp_path: Path) -> str:
    path = tmp_path / "bridge.yaml"
    path.write_text(CONFIG)
    return str(path)


def test_the_config_file_s_policies_are_compiled_into_the_settings(config: str) -> None:
    table = resolve({}, config_file=config, environ={}).redelivery
    pattern, policy = table.lookup("/queue/orders.eu")
    assert pattern == "/queue/orders.*" and policy.dialect == "jmsjca"
    assert table.lookup("/queue/orders.eu", "alice")[1].text == "2:100; 4:delete"
    assert table.lookup("/queue/billing")[1].dialect == "weblogic"
    assert table.lookup("/queue/else") == (None, table.lookup("/queue/else")[1])


def test_the_environment_beats_the_file_with_yaml_text(config: str) -> None:
    env = {"JMS_BRIDGE_REDELIVERY": '{"/queue/>": "50:delete"}'}
    table = resolve({}, config_file=config, environ=env).redelivery
    assert table.lookup("/queue/orders.eu") [1].text == "50:delete"


def test_a_bad_policy_names_the_file_the_pattern_and_the_part(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text('redelivery:\n  "/queue/a": "10:abc"\n')
    with pytest.raises(ConfigError) as error:
        resolve({}, config_file=str(path), environ={})
    assert str(path) in str(error.value) and "/queue/a" in str(error.value)
    assert "10:abc" in str(error.value) and "milliseconds" in str(error.value)


def test_policy_show_prints_the_action_for_each_failure(
    config: str, capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["policy", "show", "--config", config, "/queue/orders.eu"]) == 0
    out = capsys.readouterr().out
    assert "pattern /queue/orders.*" in out
    assert "failures 1-5: redeliver at once" in out
    assert "failures 6-10: redeliver after 1000 ms" in out
    assert "move to /queue/dlqorders.euerror" in out


def test_policy_show_as_json_for_a_user(config: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "show", "--config", config, "--user", "alice", "--json",
                 "/queue/orders.x"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["policy"] == "2:100; 4:delete" and report["user"] == "alice"
    assert report["failures"][-1]["action"].startswith("delete")


def test_policy_show_without_a_configuration_shows_jmsjca_s_default(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("JMS_BRIDGE_CONFIG", raising=False)
    monkeypatch.delenv("JMS_BRIDGE_REDELIVERY", raising=False)
    assert main(["policy", "show", "/queue/x", "--upto", "6"]) == 0
    out = capsys.readouterr().out
    assert "JMSJCA's default" in out and "3:25; 5:50; 10:100; 20:1000; 50:5000" in out


def test_a_broken_policy_is_one_line_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text('redelivery:\n  "/queue/a": 42\n')
    assert main(["policy", "show", "--config", str(path), "/queue/a"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("jms-bridge: ") and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("destination", ["/queue/orders.eu", "/amq/queue/orders.eu", "orders.eu"])
def test_policy_show_takes_every_form_of_a_queue(
    config: str, capsys: pytest.CaptureFixture[str], destination: str,
) -> None:
    assert main(["policy", "show", "--config", config, destination]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{destination}: the queue orders.eu: pattern /queue/orders.*\n")
    assert "move to /queue/dlqorders.euerror" in out


def test_policy_show_says_when_the_default_applies(
    config: str, capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["policy", "show", "--config", config, "/amq/queue/else"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("/amq/queue/else: the queue else: no pattern matches: JMSJCA's default")


@pytest.mark.parametrize(("broker", "handling"), [
    ("rabbitmq", "RabbitMQ requeues a NACKed message to the subscription at once"),
    ("activemq", "ActiveMQ takes a NACK as a poison acknowledgement"),
])
def test_policy_show_for_a_topic_says_what_happens_to_a_topic_subscriber(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], broker: str, handling: str,
) -> None:
    path = tmp_path / "bridge.yaml"
    path.write_text(f'broker: {broker}\nredelivery:\n  "orders.*": "1:move(queue:dlq)"\n')
    assert main(["policy", "show", "--config", str(path), "/topic/orders.eu"]) == 0
    out = capsys.readouterr().out
    assert "move" not in out and "failure" not in out
    assert "no redelivery policy" in out and handling in out
    assert "pattern orders.* matches" in out
    assert main(["policy", "show", "--config", str(path), "--json", "/topic/orders.eu"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kind"] == "topic" and report["applied"] is False
    assert report["failures"] == [] and handling in report["broker_handles"]


def test_policy_show_names_a_form_the_broker_does_not_take(
    config: str, capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["policy", "show", "--config", config, "/queues/orders.eu"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("jms-bridge: ") and err.count("\n") == 1
    assert "/queues/orders.eu" in err and "RabbitMQ has no destination of this form" in err

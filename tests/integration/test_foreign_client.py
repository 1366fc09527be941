"""A client from another ecosystem through the bridge: Perl's Net::Stomp (Debian libnet-stomp-perl).

tests/clients/stomp_roundtrip.pl subscribes with client acks, sends messages with custom
headers (text and binary bodies, escaped header values on 1.1/1.2), receives and acks them all,
then checks on a second connection that nothing is redelivered. It prints one JSON line.

Perl or Net::Stomp missing: the test fails when CI is set (a CI run can never pass by skipping)
and skips otherwise; scripts/install-test-deps installs them.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.bridgeproc import BridgeProcess
from tests.integration.brokers import Broker

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "clients" / "stomp_roundtrip.pl"
COUNT = 20
# The scripts bound themselves (the round trip to 30 s, the redelivery one to 60 s); this only
# guards against one hanging regardless.
TIMEOUT = 65.0
INSTALL_HINT = (
    "run scripts/install-test-deps (or: apt-get install -y libnet-stomp-perl; "
    "elsewhere: cpan Net::Stomp)"
)


@functools.cache
def _missing() -> str | None:
    """None when perl can load Net::Stomp and JSON::PP, else what is wrong."""
    perl = shutil.which("perl")
    if perl is None:
        return "perl is not installed"
    try:
        check = subprocess.run(
            [perl, "-MNet::Stomp", "-MJSON::PP", "-e", "1"],
            capture_output=True, text=True, timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run {perl}: {exc}"
    if check.returncode != 0:
        first = (check.stderr.strip().splitlines() or ["(no message)"])[0].split(" (@INC")[0]
        return f"perl cannot load Net::Stomp/JSON::PP: {first}"
    return None


def _require_perl() -> str:
    problem = _missing()
    if problem is not None:
        message = f"foreign STOMP client unavailable: {problem}; {INSTALL_HINT}"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return shutil.which("perl") or "perl"


def _run(
    perl: str, port: int, broker: Broker, dest: str, version: str
) -> tuple[dict[str, Any], str]:
    """Run the script against 127.0.0.1:`port`; its JSON summary and a transcript for messages."""
    args = [perl, str(SCRIPT), broker.stomp_host, str(port), broker.user, broker.password,
            broker.vhost, dest, str(COUNT), version]
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        return {"ok": False, "error": f"killed after {TIMEOUT} s"}, f"{args}\n{exc.stdout!r}"
    transcript = (f"$ {' '.join(args)}\nexit {done.returncode}\n"
                  f"stdout:\n{done.stdout}stderr:\n{done.stderr}")
    lines = done.stdout.strip().splitlines()
    try:
        summary = json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        summary = {}
    if not isinstance(summary, dict) or not summary:
        summary = {"ok": False, "error": "no JSON summary on stdout"}
    if done.returncode != 0:
        summary["ok"] = False
    return summary, transcript


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_perl_net_stomp_roundtrip_through_bridge(
    bridge: BridgeProcess, broker: Broker, queue: str, version: str
) -> None:
    perl = _require_perl()
    dest = broker.queue_destination(queue)
    summary, transcript = _run(perl, bridge.stomp_port, broker, dest, version)
    if not summary.get("ok"):
        # Tell a bridge fault from a client or broker fault: the same run straight to the broker.
        direct, direct_transcript = _run(
            perl, broker.stomp_port, broker, broker.queue_destination(queue + "-direct"), version
        )
        verdict = ("the same run straight to the broker PASSED, so the bridge is at fault"
                   if direct.get("ok") else
                   "the same run straight to the broker FAILED too")
        log = bridge.log()[-4000:]
        pytest.fail(
            f"Net::Stomp (STOMP {version}) through the bridge to {broker.name} failed: "
            f"{summary.get('error')}\n{verdict}\n\n--- through the bridge ---\n{transcript}\n"
            f"--- direct ---\n{direct_transcript}\n--- bridge log (tail) ---\n{log}",
            pytrace=False,
        )
    assert summary["version"] == version
    assert (summary["sent"], summary["received"], summary["acked"]) == (COUNT, COUNT, COUNT)
    assert summary["redelivered_after_ack"] == 0
    assert summary["server"] == f"{broker.stomp_host}:{bridge.stomp_port}"


# --- redelivery seen from Perl ------------------------------------------------------------------

REDELIVERY_SCRIPT = ROOT / "tests" / "clients" / "stomp_redelivery.pl"
RUN = os.urandom(3).hex()
# Failure 1 redelivered at once, failures 2-3 after 250 ms, failure 4 moves it to `<queue>.dead`.
PERL_POLICY = {f"/queue/jbt-perl-{RUN}.*": "1:250; 3:move(queue:$.dead)"}


@pytest.fixture(scope="module")
def policy_bridge(
    broker: Broker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BridgeProcess]:
    import yaml

    tmp = tmp_path_factory.mktemp("perl-redelivery")
    config = tmp / "bridge.yaml"
    config.write_text(yaml.safe_dump({"redelivery": PERL_POLICY}))
    proc = BridgeProcess(broker.name, f"{broker.stomp_host}:{broker.stomp_port}",
                         tmp / "bridge.log", extra=["--config", str(config)]).start()
    yield proc
    assert proc.stop() == 0, proc.log()


def _run_failing(perl: str, port: int, broker: Broker, dest: str, version: str, mode: str,
                 ack_after: int, expect: int) -> dict[str, Any]:
    args = [perl, str(REDELIVERY_SCRIPT), broker.stomp_host, str(port), broker.user,
            broker.password, broker.vhost, dest, version, mode, str(ack_after), str(expect)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT + 15)
    lines = done.stdout.strip().splitlines()
    summary = json.loads(lines[-1]) if lines else {}
    assert done.returncode == 0 and summary.get("ok"), f"{args}\n{done.stdout}\n{done.stderr}"
    return dict(summary)


def test_perl_consumer_nacks_until_the_policy_moves_the_message(
    policy_bridge: BridgeProcess, broker: Broker
) -> None:
    perl = _require_perl()
    queue = f"jbt-perl-{RUN}.{os.urandom(4).hex()}"
    summary = _run_failing(perl, policy_bridge.stomp_port, broker, f"/queue/{queue}", "1.2",
                           "nack", 99, expect=4)
    # the first delivery as the broker sent it, without a count
    assert summary["counts"] == ["missing", "2", "3", "4"], (summary, policy_bridge.log()[-2000:])
    immediate, *delayed = summary["gaps_ms"]
    assert all(gap >= 250 for gap in delayed), summary
    # the fourth failure moved it, with why, where the policy says
    from tests.integration.clients import connect

    conn, inbox = connect(policy_bridge.stomp_port, broker.user, broker.password)
    conn.subscribe(f"/queue/{queue}.dead", id="dead", ack="auto")
    dead = inbox.take(1, timeout=10)
    conn.disconnect()
    assert len(dead) == 1, policy_bridge.log()[-2000:]
    h = dead[0].headers
    assert (h["jms-bridge-reason"], h["jms-bridge-reason-code"]) == (
        "MQRC_BACKOUT_THRESHOLD_REACHED", "2362")
    assert h["jms-bridge-deliveries-tried"] == "4" and "jms-bridge-delivery-count" not in h
    assert h["jms-bridge-original-destination"] == f"/queue/{queue}"


def test_perl_consumer_that_drops_its_connection_gets_the_message_again_counted(
    policy_bridge: BridgeProcess, broker: Broker
) -> None:
    """STOMP 1.0 has no NACK: a consumer that disconnects with the delivery unacknowledged
    failed it, and the policy (not the broker) redelivers it, with the count."""
    perl = _require_perl()
    queue = f"jbt-perl-{RUN}.{os.urandom(4).hex()}"
    summary = _run_failing(perl, policy_bridge.stomp_port, broker, f"/queue/{queue}", "1.0",
                           "disconnect", 3, expect=3)
    assert summary["counts"] == ["missing", "2", "3"], (summary, policy_bridge.log()[-2000:])
    assert summary.get("acked") is True
    assert summary["gaps_ms"][1] >= 250, summary

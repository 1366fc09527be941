"""The config the chart renders is the config the bridge reads: the every-option values
rendered by Helm, the ConfigMap's config.yaml and the Secret's environment handed to a real
`jms-bridge run` against the local RabbitMQ, exactly as the Deployment hands them over."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.chart.test_chart import secret_env
from tests.chart.tools import EVERY_OPTION, ROOT, by_kind, template
from tests.integration.bridgeproc import free_port, wait_port
from tests.integration.brokers import BROKERS, require

pytestmark = pytest.mark.integration


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_bridge_runs_with_the_rendered_config(tmp_path: Path) -> None:
    rabbit = BROKERS["rabbitmq"]
    require(rabbit)
    # Only the broker's address differs from the file: here it is the local RabbitMQ.
    manifests = template(EVERY_OPTION, sets=(f"upstream.host={rabbit.stomp_host}",))
    config = tmp_path / "config.yaml"
    rendered = yaml.safe_load(by_kind(manifests, "ConfigMap")["data"]["config.yaml"])
    # The pod's paths, mounted here from the test's own folder: the Secret's token file and
    # the journal's volume.
    assert rendered["admin-token-file"] == "/etc/jms-bridge-admin/token"
    (tmp_path / "token").write_text("s3cret\n")
    rendered["admin-token-file"] = str(tmp_path / "token")
    rendered["journal"] = str(tmp_path / "journal")
    assert rendered["staged-catalogue"] == "/var/lib/jms-bridge/staged.db"
    rendered["staged-catalogue"] = str(tmp_path / "staged.db")
    # The TLS Secret's files, made here; the TLS port, a free one.
    from tests.integration.certs import authority

    ca = authority(tmp_path / "tls")
    pair = ca.issue("bridge", "localhost")
    assert rendered["tls-cert"].startswith("/etc/jms-bridge-tls/")
    rendered.update({"tls-cert": str(pair.cert), "tls-key": str(pair.key),
                     "tls-client-ca": str(ca.pem), "upstream-ca": str(ca.pem),
                     "stomp-tls-listen": f"127.0.0.1:{free_port()}",
                     "amqp-tls-listen": f"127.0.0.1:{free_port()}"})
    config.write_text(yaml.safe_dump(rendered))
    env = secret_env(manifests, by_kind(manifests, "Deployment"))
    assert env["JMS_BRIDGE_UPSTREAM_STOMP"] == f"stomp://guest:guest@{rabbit.stomp_host}:61613"

    stomp_port, admin_port, amqp_port = free_port(), free_port(), free_port()
    # `jms-bridge run`, as bridgeproc starts it: this checkout's bridge, whatever the venv holds.
    command = [
        sys.executable, "-m", "bridge.app.cli", "run", "--config", str(config),
        "--stomp-listen", f"127.0.0.1:{stomp_port}", "--admin-listen", f"127.0.0.1:{admin_port}",
        "--amqp-listen", f"127.0.0.1:{amqp_port}", "--staging-engine", "off",
    ]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("JMS_BRIDGE_")}
    log_path = tmp_path / "bridge.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                env={**clean, **env, "PYTHONUNBUFFERED": "1"})
        try:
            assert wait_port(admin_port, 30, proc), f"bridge did not start:\n{log_path.read_text()}"
            assert get(f"http://127.0.0.1:{admin_port}/healthz")[0] == 200
            deadline = time.monotonic() + 10
            while (ready := get(f"http://127.0.0.1:{admin_port}/readyz"))[0] != 200:
                assert time.monotonic() < deadline, ready
                time.sleep(0.2)
            assert json.loads(ready[1])["upstream"] == f"{rabbit.stomp_host}:61613"
            status, metrics = get(f"http://127.0.0.1:{admin_port}/metrics")
            assert status == 200 and "jms_bridge_" in metrics
            assert "jms_bridge_catalogue_written_total" in metrics
            assert (tmp_path / "staged.db").exists()
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
    assert code == 0, f"bridge exited {code} on SIGTERM; log:\n{log_path.read_text()}"
    lines = [json.loads(ln) for ln in log_path.read_text().splitlines() if ln.startswith("{")]
    assert any(ln.get("event") == "listening" for ln in lines), log_path.read_text()
    assert any(ln.get("level") == "debug" for ln in lines)  # log-level: debug from the file

"""The image definition: hadolint passes it, and it keeps the conventions the chart relies on
(no container engine runs here, so the image itself is not built in the tests)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from bridge.app.config import resolve
from tests.chart.tools import ROOT, hadolint

DOCKERFILE = ROOT / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of each instruction, continuation lines joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip("\\").strip() + " " if line.endswith("\\") else line.strip()
        if not line.endswith("\\"):
            word, _, rest = pending.partition(" ")
            out.append((word.upper(), rest.strip()))
            pending = ""
    return out


def stages() -> list[list[tuple[str, str]]]:
    found: list[list[tuple[str, str]]] = []
    for ins in instructions():
        if ins[0] == "FROM":
            found.append([])
        if found:
            found[-1].append(ins)
    return found


def test_hadolint_passes() -> None:
    done = subprocess.run([hadolint(), "--failure-threshold", "info", str(DOCKERFILE)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_multi_stage_slim_python_311_wheel_install() -> None:
    args = {k: v for k, v in instructions() if k == "ARG"}
    assert args["ARG"] == "PYTHON_IMAGE=python:3.11-slim-bookworm"
    build, final = stages()
    assert build[0] == ("FROM", "${PYTHON_IMAGE} AS build")
    assert final[0] == ("FROM", "${PYTHON_IMAGE}")
    assert any(k == "RUN" and "pip wheel --wheel-dir /wheels ." in v for k, v in build)
    (install,) = [v for k, v in final if k == "RUN" and "pip install" in v]
    # the wheels are mounted, not copied: no layer keeps them; no extras, so runtime deps only
    assert "--mount=type=bind,from=build,source=/wheels,target=/wheels" in install
    assert "--no-index" in install and "[" not in install
    assert "pip uninstall --yes pip setuptools wheel" in install
    env = " ".join(v for k, v in final if k == "ENV")
    assert "PIP_NO_CACHE_DIR=1" in env
    assert not any(k == "COPY" and "--from=build" in v for k, v in final)
    assert not any(k in ("RUN",) and ("apt-get" in v or "gcc" in v) for k, v in final)


def test_runs_as_a_fixed_non_root_user_with_the_bridges_ports() -> None:
    final = stages()[-1]
    users = [v for k, v in final if k == "USER"]
    assert users == ["10001:10001"]
    assert any(k == "RUN" and "--uid 10001" in v for k, v in final)
    (expose,) = [v for k, v in final if k == "EXPOSE"]
    assert set(expose.split()) == {"61633", "5673", "9613"}
    (entrypoint,) = [v for k, v in final if k == "ENTRYPOINT"]
    assert json.loads(entrypoint) == [
        "jms-bridge", "run", "--config", "/etc/jms-bridge/config.yaml"]
    values = yaml.safe_load((ROOT / "charts/jms-bridge/values.yaml").read_text())
    assert values["podSecurityContext"]["runAsUser"] == 10001
    assert values["containerSecurityContext"]["runAsUser"] == 10001


def test_image_default_config_is_accepted_by_the_bridge() -> None:
    copies = [v for k, v in stages()[-1] if k == "COPY"]
    assert "docker/config.yaml /etc/jms-bridge/config.yaml" in copies
    settings = resolve({}, config_file=str(ROOT / "docker" / "config.yaml"), environ={})
    assert (settings.stomp_listen.host, settings.stomp_listen.port) == ("0.0.0.0", 61633)
    assert (settings.admin_listen.host, settings.admin_listen.port) == ("0.0.0.0", 9613)


def test_dockerignore_sends_only_what_the_build_copies() -> None:
    lines = [ln for ln in (ROOT / ".dockerignore").read_text().splitlines()
             if ln and not ln.startswith("#")]
    assert lines[0] == "*"
    allowed = {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}
    copied = set()
    for k, v in instructions():
        if k == "COPY" and "--from" not in v:
            copied.update(p.rstrip("/") for p in v.split()[:-1])
    assert copied <= allowed
    for path in allowed:
        assert Path(ROOT / path).exists(), path

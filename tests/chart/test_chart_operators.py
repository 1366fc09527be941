"""The chart where operators run it: the broker chart's own password Secret, pods rolled when
what they read changes, metrics scraped without the admin port on the Service, a start-up probe
that waits for the broker, a NetworkPolicy on the admin port, a volume per pod, and a schema
that refuses garbage by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from bridge.app.config import SETTING_NAMES, resolve
from tests.chart.tools import CHART, by_kind, helm, rendered_config, template

BROKER_SECRET = ("auth.existingSecret=rabbitmq", "auth.existingSecretPasswordKey=rabbitmq-password",
                 "auth.username=user")
# The Secret the Bitnami RabbitMQ chart's release `rabbitmq` makes, as it makes it.
RABBITMQ_SECRET = {"rabbitmq": {"rabbitmq-password": "p@ss:w/rd %", "rabbitmq-erlang-cookie": "c",
                                "rabbitmq-user": "user"}}


def workload(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    found = [m for m in manifests if m["kind"] in ("Deployment", "StatefulSet")]
    assert len(found) == 1, [m["kind"] for m in found]
    return found[0]


def container_env(manifests: list[dict[str, Any]],
                  secrets: dict[str, dict[str, str]]) -> dict[str, str]:
    """The bridge container's environment as the kubelet fills it in."""
    (bridge,) = [c for c in workload(manifests)["spec"]["template"]["spec"]["containers"]
                 if c["name"] == "jms-bridge"]
    env = {}
    for var in bridge.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = secrets[ref["name"]][ref["key"]]
    return env


def fails(*sets: str) -> str:
    args = ["template", "t", str(CHART)]
    for s in sets:
        args += ["--set", s]
    done = helm(*args)
    assert done.returncode != 0, f"rendered with {sets}"
    return done.stderr


def test_the_broker_charts_own_secret_by_its_password_key(tmp_path: Path) -> None:
    manifests = template(sets=(*BROKER_SECRET, "upstream.amqp.enabled=true",
                               "upstream.management.enabled=true"))
    assert not [m for m in manifests if m["kind"] == "Secret"]
    env = container_env(manifests, RABBITMQ_SECRET)
    assert env == {"JMS_BRIDGE_BROKER_USER": "user", "JMS_BRIDGE_BROKER_PASSWORD": "p@ss:w/rd %"}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(rendered_config(manifests)))
    settings = resolve({}, config_file=str(path), environ=env)
    assert settings.upstream_amqp is not None and settings.upstream_management is not None
    for endpoint in (settings.upstream_stomp, settings.upstream_amqp,
                     settings.upstream_management):
        assert (endpoint.user, endpoint.password) == ("user", "p@ss:w/rd %")
    # the user from a key of the Secret too
    manifests = template(sets=(*BROKER_SECRET[:2], "auth.existingSecretUsernameKey=rabbitmq-user"))
    assert container_env(manifests, RABBITMQ_SECRET)["JMS_BRIDGE_BROKER_USER"] == "user"


@pytest.mark.parametrize(("sets", "message"), [
    (("auth.existingSecretPasswordKey=rabbitmq-password",),
     "auth.existingSecretPasswordKey needs auth.existingSecret"),
    ((*BROKER_SECRET, "auth.existingSecretUsernameKey=rabbitmq-user"),
     "set one of auth.username and auth.existingSecretUsernameKey"),
    (("auth.existingSecret=rabbitmq", "auth.username=user"),
     "auth.username with auth.existingSecret needs auth.existingSecretPasswordKey"),
], ids=["key-without-secret", "user-twice", "user-without-key"])
def test_credentials_that_contradict_fail_with_a_message(sets: tuple[str, ...],
                                                         message: str) -> None:
    assert message in fails(*sets)


def test_a_rotated_existing_secret_rolls_the_pods_when_told() -> None:
    def annotations(*sets: str) -> dict[str, str]:
        pod = workload(template(sets=(*BROKER_SECRET, *sets)))["spec"]["template"]
        return dict(pod["metadata"]["annotations"])

    assert "checksum/existing-secret" not in annotations()
    one, two = annotations("auth.secretChecksum=1"), annotations("auth.secretChecksum=2")
    assert one["checksum/existing-secret"] != two["checksum/existing-secret"]
    assert {k: v for k, v in one.items() if k != "checksum/existing-secret"} == {
        k: v for k, v in two.items() if k != "checksum/existing-secret"}


def test_service_monitor_without_the_admin_port_on_the_service() -> None:
    manifests = template(sets=("service.adminPortEnabled=false",
                               "metrics.serviceMonitor.enabled=true"))
    services = {m["metadata"]["name"]: m for m in manifests if m["kind"] == "Service"}
    main, metrics = services["t-jms-bridge"], services["t-jms-bridge-metrics"]
    assert "admin" not in {p["name"] for p in main["spec"]["ports"]}
    assert metrics["spec"]["clusterIP"] == "None"
    assert metrics["spec"]["type"] == "ClusterIP"
    assert metrics["spec"]["selector"] == main["spec"]["selector"]
    monitor = by_kind(manifests, "ServiceMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= metrics["metadata"]["labels"].items()
    assert not selector.items() <= main["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in metrics["spec"]["ports"]}
    # with the admin port on the Service, no second Service
    manifests = template(sets=("metrics.serviceMonitor.enabled=true",))
    assert [m["metadata"]["name"] for m in manifests if m["kind"] == "Service"] == ["t-jms-bridge"]


def test_pod_monitor_scrapes_the_pods_admin_port() -> None:
    manifests = template(sets=("service.adminPortEnabled=false", "metrics.podMonitor.enabled=true",
                               "metrics.podMonitor.interval=15s",
                               "metrics.podMonitor.labels.release=prometheus"))
    monitor = by_kind(manifests, "PodMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    pod = workload(manifests)["spec"]["template"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == ["messaging"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    ports = {p["name"] for c in pod["spec"]["containers"] for p in c["ports"]}
    assert endpoint == {"port": "admin", "path": "/metrics", "interval": "15s"}
    assert endpoint["port"] in ports


def test_pod_monitor_of_an_application_with_the_bridge_beside_it() -> None:
    manifests = template(sets=("mode=sidecar", "metrics.podMonitor.enabled=true",
                               "metrics.podMonitor.selector.app=orders"))
    monitor = by_kind(manifests, "PodMonitor")
    assert monitor["spec"]["selector"] == {"matchLabels": {"app": "orders"}}
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "bridge-admin"
    assert "metrics.podMonitor.selector: the labels of the pods the bridge runs in" in fails(
        "mode=sidecar", "metrics.podMonitor.enabled=true")


def test_the_startup_probe_waits_for_the_broker() -> None:
    (container,) = workload(template())["spec"]["template"]["spec"]["containers"]
    assert container["startupProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"


NETPOL = ("networkPolicy.enabled=true", "networkPolicy.admin.namespaces[0]=monitoring",
          "networkPolicy.admin.pods[0].app=ops-console", "bridge.amqpListen=true",
          "service.amqpPortEnabled=true")


def test_network_policy_keeps_the_admin_port_to_named_namespaces_and_pods() -> None:
    manifests = template(sets=NETPOL)
    policy = by_kind(manifests, "NetworkPolicy")
    pod = workload(manifests)["spec"]["template"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= (
        pod["metadata"]["labels"].items())
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    rules = {tuple(p["port"] for p in rule["ports"]): rule for rule in policy["spec"]["ingress"]}
    clients, admin = rules[("stomp", "amqp")], rules[("admin",)]
    assert "from" not in clients  # the STOMP and AMQP ports stay open to every pod
    assert admin["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}},
        {"podSelector": {"matchLabels": {"app": "ops-console"}}},
    ]
    # nobody named: no rule opens the admin port (the kubelet's probes still reach it)
    policy = by_kind(template(sets=("networkPolicy.enabled=true",)), "NetworkPolicy")
    assert [[p["port"] for p in r["ports"]] for r in policy["spec"]["ingress"]] == [["stomp"]]
    assert not [m for m in template() if m["kind"] == "NetworkPolicy"]


PERSISTENCE = ("persistence.enabled=true", "persistence.size=2Gi",
               "bridge.stagedCatalogue=/var/lib/jms-bridge/staged.db",
               "bridge.journal=/var/lib/jms-bridge/journal")


def test_a_statefulset_gives_each_pod_a_volume_for_its_catalogue_and_journal() -> None:
    manifests = template(sets=(*PERSISTENCE, "autoscaling.enabled=true"))
    assert not [m for m in manifests if m["kind"] == "Deployment"]
    sts = by_kind(manifests, "StatefulSet")
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "2Gi"
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == "/var/lib/jms-bridge"
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    headless = {m["metadata"]["name"]: m for m in manifests if m["kind"] == "Service"}[
        sts["spec"]["serviceName"]]
    assert headless["spec"]["clusterIP"] == "None"
    hpa = by_kind(manifests, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet",
                                             "name": sts["metadata"]["name"]}
    config = rendered_config(manifests)
    assert config["staged-catalogue"].startswith("/var/lib/jms-bridge/")
    assert "persistence.enabled keeps bridge.stagedCatalogue or bridge.journal" in fails(
        "persistence.enabled=true")


@pytest.mark.parametrize(("sets", "message"), [
    (("bridge.redelivery.orders=5:1000\\, 10:5000",), "bridge.redelivery.orders: Does not match"),
    (("bridge.redelivery.orders=lots",), "bridge.redelivery.orders: Does not match"),
    (("extraConfig.upstream-stmop=stomp://a:1",),
     "extraConfig: Additional property upstream-stmop is not allowed"),
    (("resources.limits.memory=lots",), "resources.limits.memory: Does not match pattern"),
    (("resources.requests.cpu=1 core",), "resources.requests.cpu: Does not match pattern"),
    (("persistence.size=big",), "persistence.size: Does not match pattern"),
    (("networkPolicy.admin.namespaces[0]=Not A Namespace",),
     "networkPolicy.admin.namespaces.0: Does not match pattern"),
], ids=["redelivery-commas", "redelivery-word", "unknown-setting", "memory", "cpu",
        "volume-size", "namespace"])
def test_the_schema_refuses_garbage_by_name(sets: tuple[str, ...], message: str) -> None:
    stderr = fails(*sets)
    assert "values don't meet the specifications of the schema" in stderr
    assert message in stderr, stderr


def test_the_schema_takes_every_good_policy_and_quantity() -> None:
    good = {"orders": "5:1000; 10:5000; 50:move(queue:dlq$error)", "a": "delete",
            "b": "3:25; 5:50;10:100; 20:DELETE", "c": "move(topic:$.dlq)"}
    sets = tuple(f"bridge.redelivery.{k}={v}" for k, v in good.items())
    sets += ("resources.limits.memory=1.5Gi", "resources.requests.cpu=250m",
             "resources.limits.cpu=2", "resources.requests.ephemeral-storage=1e9")
    rendered = rendered_config(template(sets=sets))
    assert rendered["redelivery"] == good


def test_the_schemas_extra_config_knows_every_setting_of_the_bridge() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert set(schema["properties"]["extraConfig"]["properties"]) == set(SETTING_NAMES)


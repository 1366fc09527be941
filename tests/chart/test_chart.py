"""The Helm chart, with Helm's own CLI: it lints, renders, and each manifest it renders is valid
against the Kubernetes API schemas; wrong values fail with the schema's message; the
config.yaml it renders is one the bridge accepts."""

from __future__ import annotations

import base64
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate import utils as kv
from referencing import Registry, Resource

from bridge.app.config import SETTING_NAMES, parse_url, resolve
from tests.chart.tools import (
    CHART,
    CI_VALUES,
    EVERY_OPTION,
    by_kind,
    helm,
    rendered_config,
    template,
)

HERE = Path(__file__).parent
FUTURE = HERE / "future-settings-values.yaml"
# The oldest and the newest Kubernetes whose schemas kubernetes-validate carries.
K8S_VERSIONS = sorted({kv.all_versions()[0], kv.latest_version()})
VALUE_SETS = [pytest.param((), id="defaults")] + [
    pytest.param((p,), id=p.name) for p in CI_VALUES
]


# The Secret a user of ci/existing-secret-values.yaml made beforehand.
USERS_SECRETS = {"activemq-bridge-credentials": {"data": {
    "stomp-url": base64.b64encode(b"stomp://bridge:s3cret@activemq:61613").decode()}},
    # the one the Bitnami RabbitMQ chart makes (ci/operator-values.yaml)
    "rabbitmq": {"data": {"rabbitmq-password": base64.b64encode(b"s3cret").decode()}}}


def secret_env(manifests: list[dict[str, Any]], deployment: dict[str, Any]) -> dict[str, str]:
    """The environment the bridge container gets, as the kubelet fills it in from the Secret."""
    secrets = {m["metadata"]["name"]: m for m in manifests if m["kind"] == "Secret"}
    secrets = {**USERS_SECRETS, **secrets}
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env: dict[str, str] = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
            continue
        ref = var["valueFrom"]["secretKeyRef"]
        data = secrets[ref["name"]]["data"]
        if ref["key"] in data:
            env[var["name"]] = base64.b64decode(data[ref["key"]]).decode()
        else:
            assert ref.get("optional"), f"{var['name']}: key {ref['key']} is not in the Secret"
    return env


def validate_object_meta(meta: dict[str, Any], version: str) -> None:
    """A custom resource's metadata against Kubernetes' own ObjectMeta schema."""
    schema_dir = f"kubernetes-json-schema/v{version}-local-strict"
    schema = kv.schema_contents(f"{schema_dir}/objectmeta-meta-v1.json", version)
    defs = kv.schema_contents(f"{schema_dir}/_definitions.json", version)
    registry = Resource.from_contents(defs) @ (Resource.from_contents(schema) @ Registry())
    jsonschema.Draft202012Validator(schema, registry=registry).validate(meta)


@pytest.mark.parametrize("values", VALUE_SETS)
def test_lint(values: tuple[Path, ...]) -> None:
    args = ["lint", "--strict", str(CHART)]
    for v in values:
        args += ["-f", str(v)]
    done = helm(*args)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("values", VALUE_SETS)
def test_manifests_valid_against_kubernetes_schemas(values: tuple[Path, ...], version: str) -> None:
    manifests = template(*values)
    assert manifests
    for m in manifests:
        if m["apiVersion"].startswith("monitoring.coreos.com/"):
            # Prometheus Operator's CRD is not among Kubernetes' schemas: its metadata is checked
            # against ObjectMeta here, its spec by test_service_monitor_scrapes_the_admin_port.
            validate_object_meta(m["metadata"], version)
            continue
        try:
            kubernetes_validate.validate(m, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{m['kind']} {m['metadata']['name']} (Kubernetes {version}): {exc.message}"
                        f" at {'.'.join(map(str, exc.path))}")


@pytest.mark.parametrize("values", VALUE_SETS)
def test_rendered_config_is_accepted_by_the_bridge(
    values: tuple[Path, ...], tmp_path: Path
) -> None:
    manifests = template(*values)
    config = rendered_config(manifests)
    assert set(config) <= set(SETTING_NAMES)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    env: dict[str, str] = {}
    for workload in (m for m in manifests if m["kind"] in ("Deployment", "StatefulSet")):
        env = secret_env(manifests, workload)
    env = {k: v for k, v in env.items() if k.startswith("JMS_BRIDGE_")}
    settings = resolve({}, config_file=str(path), environ=env)
    assert settings.stomp_listen.host == "0.0.0.0"
    assert settings.admin_listen.host == "0.0.0.0"


def test_every_option_config_has_every_setting_of_todays_bridge() -> None:
    config = rendered_config(template(EVERY_OPTION))
    # broker-password only ever comes from a Secret (auth.existingSecretPasswordKey)
    assert set(config) == set(SETTING_NAMES) - {"broker-password"}


def test_quorum_staging_reaches_the_config() -> None:
    config = rendered_config(template(sets=("bridge.stagingQueueType=quorum",)))
    assert config["staging-queue-type"] == "quorum"
    assert rendered_config(template())["staging-queue-type"] == "classic"


def test_the_validator_rejects_what_kubernetes_would() -> None:
    deployment = by_kind(template(), "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "stomp"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[-1], strict=True)
    deployment = by_kind(template(), "Deployment")
    deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonroot"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[-1], strict=True)


def test_credentials_reach_the_bridge_percent_encoded() -> None:
    password = "p@ss:w/rd +%?#"
    manifests = template(EVERY_OPTION, sets=(
        "auth.username=bridge user", f"auth.password={password}", "upstream.amqp.vhost=prod/eu",
    ))
    env = secret_env(manifests, by_kind(manifests, "Deployment"))
    stomp = parse_url(env["JMS_BRIDGE_UPSTREAM_STOMP"], "stomp", "stomp")
    amqp = parse_url(env["JMS_BRIDGE_UPSTREAM_AMQP"], "amqp", "amqp", vhost=True)
    management = parse_url(env["JMS_BRIDGE_UPSTREAM_MANAGEMENT"], "management", "http")
    for endpoint in (stomp, amqp, management):
        assert (endpoint.user, endpoint.password) == ("bridge user", password)
        assert endpoint.host == "rabbitmq.messaging.svc.cluster.local"
    assert amqp.vhost == "prod/eu"
    # and none of it in the ConfigMap
    assert password not in by_kind(manifests, "ConfigMap")["data"]["config.yaml"]


def test_existing_secret_is_used_and_no_secret_is_made() -> None:
    manifests = template(CHART / "ci" / "existing-secret-values.yaml")
    assert not [m for m in manifests if m["kind"] == "Secret"]
    env = by_kind(manifests, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in env}
    assert refs["JMS_BRIDGE_UPSTREAM_STOMP"] == {
        "name": "activemq-bridge-credentials", "key": "stomp-url"}
    assert refs["JMS_BRIDGE_UPSTREAM_AMQP"]["optional"] is True


def test_deployment_rolls_safely_and_runs_restricted() -> None:
    manifests = template()
    deployment = by_kind(manifests, "Deployment")
    spec = deployment["spec"]
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert sc["runAsUser"] == 10001
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    assert volumes[mounts["/etc/jms-bridge"]]["configMap"]["name"] == (
        by_kind(manifests, "ConfigMap")["metadata"]["name"])
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert container["startupProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"stomp": 61633, "admin": 9613}
    assert rendered_config(manifests)["admin-listen"] == "0.0.0.0:9613"
    annotations = spec["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "9613"
    assert "resources" in container and container["resources"]["requests"]


def test_config_change_rolls_the_pods() -> None:
    def checksum(*sets: str) -> str:
        deployment = by_kind(template(sets=sets), "Deployment")
        return str(deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"])

    assert checksum() == checksum()
    assert checksum() != checksum("bridge.logLevel=debug")
    assert checksum() != checksum("extraConfig.delay-disabled=orders.*")


def test_service_ports_each_on_or_off() -> None:
    def ports(*sets: str) -> dict[str, int]:
        service = by_kind(template(sets=sets), "Service")
        return {p["name"]: p["port"] for p in service["spec"]["ports"]}

    assert ports() == {"stomp": 61633, "admin": 9613}
    assert ports("service.amqpPortEnabled=true") == {"stomp": 61633, "amqp": 5673, "admin": 9613}
    assert ports("service.adminPortEnabled=false", "service.ports.stomp=1234") == {"stomp": 1234}


TLS = ("tls.enabled=true", "tls.secretName=bridge-tls")


def tls_parts(manifests: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The bridge container and the pod's volumes by name."""
    pod = by_kind(manifests, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return container, {v["name"]: v for v in pod["volumes"]}


def test_tls_mounts_the_secret_and_turns_on_the_stomp_tls_listener(tmp_path: Path) -> None:
    manifests = template(sets=TLS)
    container, volumes = tls_parts(manifests)
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/etc/jms-bridge-tls"]
    # The whole Secret as a directory, read-only: with a subPath (or items picked out of it) a
    # renewed certificate would never reach the pod.
    assert mount == {"name": mount["name"], "mountPath": "/etc/jms-bridge-tls", "readOnly": True}
    assert volumes[mount["name"]] == {"name": mount["name"], "secret": {"secretName": "bridge-tls"}}
    assert not [m for m in container["volumeMounts"] if "subPath" in m or "subPathExpr" in m]
    config = rendered_config(manifests)
    assert config["stomp-tls-listen"] == "0.0.0.0:61634"
    assert config["tls-cert"] == "/etc/jms-bridge-tls/tls.crt"
    assert config["tls-key"] == "/etc/jms-bridge-tls/tls.key"
    assert "tls-client-ca" not in config
    assert "amqp-tls-listen" not in config  # tls.amqp is off by default
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"stomp": 61633, "stomp-tls": 61634, "admin": 9613}
    service = by_kind(manifests, "Service")
    assert {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        "stomp": (61633, "stomp"), "stomp-tls": (61634, "stomp-tls"), "admin": (9613, "admin")}
    # the bridge accepts the config, and it listens on the port the pod declares
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    settings = resolve({}, config_file=str(path), environ={})
    assert settings.stomp_tls_listen is not None
    assert settings.stomp_tls_listen.port == ports["stomp-tls"]
    assert settings.tls_cert == "/etc/jms-bridge-tls/tls.crt"


def test_tls_is_off_by_default() -> None:
    manifests = template(sets=("tls.secretName=bridge-tls",))
    container, volumes = tls_parts(manifests)
    assert "tls" not in volumes
    assert not [m for m in container["volumeMounts"] if m["mountPath"] == "/etc/jms-bridge-tls"]
    assert not {k for k in rendered_config(manifests) if k.startswith("tls-") or "-tls-" in k}
    assert {p["name"] for p in container["ports"]} == {"stomp", "admin"}


def test_tls_amqp_listener_and_service_ports() -> None:
    manifests = template(sets=(*TLS, "tls.amqp=true", "tls.stomp=false", "service.type=NodePort",
                               "service.nodePorts.amqpTls=30674", "containerPorts.amqpTls=5675",
                               "service.ports.amqpTls=5671"))
    config = rendered_config(manifests)
    assert config["amqp-tls-listen"] == "0.0.0.0:5675"
    assert "stomp-tls-listen" not in config
    container, _ = tls_parts(manifests)
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "stomp": 61633, "amqp-tls": 5675, "admin": 9613}
    service = {p["name"]: p for p in by_kind(manifests, "Service")["spec"]["ports"]}
    assert service["amqp-tls"] == {"name": "amqp-tls", "port": 5671, "targetPort": "amqp-tls",
                                   "protocol": "TCP", "nodePort": 30674}
    assert "stomp-tls" not in service
    # the listener stays, the Service leaves its port out when asked to
    manifests = template(sets=(*TLS, "service.stompTlsPortEnabled=false"))
    assert "stomp-tls" not in {p["name"] for p in by_kind(manifests, "Service")["spec"]["ports"]}
    assert "stomp-tls" in {p["name"] for p in tls_parts(manifests)[0]["ports"]}


def test_mutual_tls_client_ca_from_a_key_of_the_secret() -> None:
    config = rendered_config(template(sets=(*TLS, "tls.clientCaKey=ca.crt")))
    assert config["tls-client-ca"] == "/etc/jms-bridge-tls/ca.crt"


def test_a_renewed_tls_secret_does_not_roll_the_pods() -> None:
    """The bridge reads a renewed certificate itself: no checksum of the TLS Secret on the pods,
    so that cert-manager's renewal restarts nothing."""
    def annotations(*sets: str) -> dict[str, str]:
        deployment = by_kind(template(sets=sets), "Deployment")
        return dict(deployment["spec"]["template"]["metadata"]["annotations"])

    plain, tls = annotations(), annotations(*TLS)
    assert {k for k in tls if k.startswith("checksum/")} == {"checksum/config", "checksum/secret"}
    assert tls["checksum/secret"] == plain["checksum/secret"]
    assert annotations(TLS[0], "tls.secretName=another-tls") == tls


def test_tls_in_sidecar_mode_points_the_config_at_the_mount() -> None:
    manifests = template(sets=(*TLS, "mode=sidecar"))
    assert sorted(m["kind"] for m in manifests) == ["ConfigMap"]
    assert rendered_config(manifests)["tls-cert"] == "/etc/jms-bridge-tls/tls.crt"


def test_service_monitor_scrapes_the_admin_port() -> None:
    manifests = template(EVERY_OPTION)
    monitor = by_kind(manifests, "ServiceMonitor")
    service = by_kind(manifests, "Service")
    assert monitor["metadata"]["namespace"] == "monitoring"
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == ["messaging"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert endpoint["interval"] == "30s"


def test_autoscaler_owns_the_replica_count() -> None:
    manifests = template(EVERY_OPTION)
    hpa = by_kind(manifests, "HorizontalPodAutoscaler")
    deployment = by_kind(manifests, "Deployment")
    assert "replicas" not in deployment["spec"]
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert by_kind(manifests, "PodDisruptionBudget")["spec"]["minAvailable"] == 2


def test_sidecar_mode_renders_only_config_and_secret() -> None:
    manifests = template(CHART / "ci" / "sidecar-values.yaml")
    assert sorted(m["kind"] for m in manifests) == ["ConfigMap", "Secret"]


def test_settings_still_to_land_have_a_place_in_values() -> None:
    config = rendered_config(template(FUTURE))
    assert config["redelivery"] == {
        "orders.*": "5:1000; 10:5000; 50:move(queue:dlq$error)",
        "payments.>": {"dialect": "weblogic", "redelivery-delay": 2000,
                       "redelivery-limit": 5, "error-destination": "payments.dlq"},
    }
    assert config["journal"] == "/var/lib/jms-bridge/journal"
    assert config["amqp-listen"] == "0.0.0.0:5673"
    assert config["log-level"] == "warning"  # extraConfig is merged last


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("service.ports.stomp=not-a-port",),
         "service.ports.stomp: Invalid type. Expected: integer, given: string"),
        (("bridge.broker=ibmmq",),
         'bridge.broker: bridge.broker must be one of the following: "rabbitmq", "activemq"'),
        (("containerPorts.admin=70000",),
         "containerPorts.admin: Must be less than or equal to 65535"),
        (("bridge.stagingLevelPrefetch=0",),
         "bridge.stagingLevelPrefetch: Must be greater than or equal to 1"),
        (("bridge.stagingQueueType=stream",),
         'bridge.stagingQueueType: bridge.stagingQueueType must be one of the following: '
         '"classic", "quorum"'),
        (("bridge.logLevl=debug",), "bridge: Additional property logLevl is not allowed"),
        (("mode=daemonset",), "mode: mode must be one of the following"),
        (("upstream.host=stomp://rabbitmq:61613",), "upstream.host: Does not match pattern"),
    ],
    ids=["port-string", "unknown-broker", "port-range", "prefetch", "queue-type", "typo", "mode",
         "host-url"],
)
def test_bad_values_fail_with_the_schemas_message(sets: tuple[str, ...], message: str) -> None:
    args = ["template", "t", str(CHART)]
    for s in sets:
        args += ["--set-string" if "not-a-port" in s else "--set", s]
    done = helm(*args)
    assert done.returncode != 0
    assert "values don't meet the specifications of the schema" in done.stderr
    assert message in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("bridge.broker=activemq", "upstream.management.enabled=true"),
         "are for bridge.broker rabbitmq only"),
        (("pdb.minAvailable=1",), "set one of pdb.minAvailable and pdb.maxUnavailable"),
        (("tls.enabled=true",), "tls.enabled needs tls.secretName: the name of an existing "
                                "kubernetes.io/tls Secret with tls.crt and tls.key"),
        (("tls.enabled=true", "tls.secretName=bridge-tls", "tls.stomp=false"),
         "tls.enabled needs tls.stomp or tls.amqp"),
        (("tls.enabled=true", "tls.secretName=bridge-tls", "tls.amqp=true",
          "bridge.broker=activemq"),
         "tls.amqp (AMQP 0-9-1 over TLS) is for bridge.broker rabbitmq only"),
        (("tls.enabled=true", "tls.secretName=bridge-tls", "containerPorts.stompTls=61633"),
         "containerPorts.stomp and containerPorts.stompTls are both 61633"),
    ],
    ids=["activemq-management", "pdb-both", "tls-without-secret",
         "tls-without-listener", "tls-amqp-activemq", "tls-port-taken"],
)
def test_contradicting_values_fail_with_a_message(sets: tuple[str, ...], message: str) -> None:
    args = ["template", "t", str(CHART)]
    for s in sets:
        args += ["--set", s]
    done = helm(*args)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr


def render_notes(chart_copy: Path, *sets: str) -> str:
    """NOTES.txt as `helm install` prints it. `helm template` leaves NOTES.txt out and
    `helm install --dry-run` needs a cluster, so a copy of the chart renders it into a ConfigMap
    with Helm's own `tpl`."""
    shutil.copytree(CHART, chart_copy)
    (chart_copy / "notes.txt").write_text((CHART / "templates" / "NOTES.txt").read_text())
    (chart_copy / "templates" / "zz-notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\n"
        "data:\n  notes: {{ tpl (.Files.Get \"notes.txt\") . | toJson }}\n"
    )
    args = ["template", "t", str(chart_copy), "--namespace", "messaging",
            "--show-only", "templates/zz-notes.yaml"]
    for s in sets:
        args += ["--set", s]
    done = helm(*args)
    assert done.returncode == 0, done.stderr
    return str(yaml.safe_load(done.stdout)["data"]["notes"])


def test_notes_tell_how_to_point_an_application_at_the_bridge(tmp_path: Path) -> None:
    notes = render_notes(tmp_path / "standalone")
    assert "stomp://t-jms-bridge.messaging.svc:61633 in place of stomp://rabbitmq:61613" in notes
    assert "kubectl port-forward --namespace messaging service/t-jms-bridge" in notes
    sidecar = render_notes(tmp_path / "sidecar", "mode=sidecar")
    assert "Sidecar mode" in sidecar and "t-jms-bridge-config" in sidecar


def test_the_guides_tls_values_render(tmp_path: Path) -> None:
    guide = (CHART.parents[1] / "docs" / "kubernetes.md").read_text()
    block = guide.split("**TLS.**", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    values = tmp_path / "tls-values.yaml"
    values.write_text(block)
    config = rendered_config(template(values))
    assert {k: v for k, v in config.items() if "tls" in k} == {
        "tls-cert": "/etc/jms-bridge-tls/tls.crt", "tls-key": "/etc/jms-bridge-tls/tls.key",
        "tls-client-ca": "/etc/jms-bridge-tls/ca.crt",
        "stomp-tls-listen": "0.0.0.0:61634", "amqp-tls-listen": "0.0.0.0:5674"}


def test_notes_tell_where_the_tls_listeners_are(tmp_path: Path) -> None:
    notes = render_notes(tmp_path / "tls", *TLS, "tls.amqp=true", "tls.clientCaKey=ca.crt")
    assert "STOMP over TLS:  t-jms-bridge.messaging.svc:61634" in notes
    assert "AMQP over TLS:   t-jms-bridge.messaging.svc:5674" in notes
    assert "the Secret bridge-tls; clients must show a certificate signed by its ca.crt" in notes
    assert "over TLS" not in render_notes(tmp_path / "plain")

"""The Helm chart: every object lints and validates, and the gateway pod (see tests/helm/harness.py)."""

from __future__ import annotations

import base64
import copy
import os

import pytest

from gateway.settings import Settings
from tests.helm.harness import (
    AUTH_KEYS_FILE, CHART, KITCHEN_SINK, KUBE_VERSIONS, NAMESPACE, RELEASE, helm_python, kubernetes_validate,
    production_values, render, Rendered, suffixed,
)

# --------------------------------------------------------------------------------------
# Lint and schema validation of every object
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("values", [None, "production"], ids=["default", "production"])
def test_helm_lint_is_clean(values: str | None) -> None:
    report = helm_python.lint(str(CHART), production_values() if values else None, strict=True,
                              namespace=NAMESPACE, kube_version="v1.30.0")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not report["errors"] and not problems, report


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_every_builtin_object_is_valid_kubernetes(scenario: Rendered, kube_version: str) -> None:
    checked = 0
    for obj in scenario.objects:
        group = obj["apiVersion"].rpartition("/")[0]
        if group == "monitoring.coreos.com":  # a custom resource: no schema bundled
            continue
        try:
            kubernetes_validate.validate(obj, kube_version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = "/".join(str(p) for p in exc.absolute_path)
            pytest.fail(f"{obj['kind']} {obj['metadata']['name']}: {path}: {exc.message}")
        checked += 1
    assert checked >= 8


def test_every_object_has_standard_labels_and_a_namespace(scenario: Rendered) -> None:
    for obj in scenario.objects:
        labels = obj["metadata"]["labels"]
        where = f"{obj['kind']} {obj['metadata']['name']}"
        assert labels["app.kubernetes.io/name"] == "sandbox-gateway", where
        assert labels["app.kubernetes.io/instance"] == RELEASE, where
        assert labels["app.kubernetes.io/managed-by"] == "Helm", where
        assert labels["app.kubernetes.io/component"], where
        assert obj["metadata"].get("namespace"), f"{where} has no namespace"


# --------------------------------------------------------------------------------------
# The gateway pod
# --------------------------------------------------------------------------------------


def test_container_runs_serve_with_the_mounted_policy(scenario: Rendered) -> None:
    c = scenario.container
    assert c["command"] + c["args"] == ["sandbox-gateway", "serve", "--host", "0.0.0.0",
                                        "--policy", "/etc/sandbox-gateway/policy.yaml"]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["policy"]["mountPath"] == "/etc/sandbox-gateway"
    assert "subPath" not in mounts["policy"], "a subPath mount never sees ConfigMap updates (no hot reload)"
    volumes = {v["name"]: v for v in scenario.pod["spec"]["volumes"]}
    assert volumes["policy"]["configMap"]["name"] == suffixed(scenario.fullname, "policy")


def test_probes_hit_health_endpoints_on_the_control_port(scenario: Rendered) -> None:
    c = scenario.container
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": 8080, "control": 8081, "grpc": 50051}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "control"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "control"}
    assert c["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "control"}


def test_pod_runs_non_root_read_only_without_capabilities(scenario: Rendered) -> None:
    pod_sc = scenario.pod["spec"]["securityContext"]
    assert pod_sc["runAsNonRoot"] is True and pod_sc["runAsUser"] == 10001
    assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = scenario.container["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    # The read-only root needs writable emptyDirs for the data dir and /tmp.
    mounts = {m["mountPath"]: m["name"] for m in scenario.container["volumeMounts"]}
    volumes = {v["name"]: v for v in scenario.pod["spec"]["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    assert "emptyDir" in volumes[mounts["/var/lib/sandbox-gateway"]]
    assert scenario.pod["spec"]["enableServiceLinks"] is False


def test_shutdown_outlasts_pre_stop_and_drain(scenario: Rendered) -> None:
    env = {e["name"]: e.get("value") for e in scenario.container["env"]}
    drain = float(env.get("SANDBOX_GATEWAY_DRAIN_TIMEOUT") or 20)
    command = scenario.container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    grace = scenario.pod["spec"]["terminationGracePeriodSeconds"]
    assert grace > float(command[1]) + drain


def test_topology_spread_selects_the_gateway_pods(scenario: Rendered) -> None:
    selector = scenario.deployment["spec"]["selector"]["matchLabels"]
    constraints = scenario.pod["spec"]["topologySpreadConstraints"]
    assert {c["topologyKey"] for c in constraints} == {"topology.kubernetes.io/zone", "kubernetes.io/hostname"}
    for c in constraints:
        assert c["labelSelector"]["matchLabels"] == selector
    assert selector.items() <= scenario.pod["metadata"]["labels"].items()


def test_rendered_env_is_accepted_by_the_gateway_settings(scenario: Rendered, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every literal env var the chart sets parses into Settings (types, names, ranges)."""
    for name in list(os.environ):
        if name.startswith("SANDBOX_GATEWAY_") or name in ("REDIS_URL", "PER_SESSION_SANDBOX_ORG_IDS"):
            monkeypatch.delenv(name)
    env = scenario.container["env"]
    for var in env:
        if "value" in var:
            monkeypatch.setenv(var["name"], var["value"])
    # With the host the chart passes as a flag: Settings refuses 0.0.0.0 without an explicit auth mode.
    args = scenario.container["args"]
    settings = Settings(host=args[args.index("--host") + 1])
    assert settings.host == "0.0.0.0"
    assert settings.auth_mode in ("token", "trusted-headers")
    assert str(settings.auth_keys_file) == AUTH_KEYS_FILE
    assert settings.data_port == 8080 and settings.control_port == 8081
    assert str(settings.data_dir) == "/var/lib/sandbox-gateway"
    replica = next(v for v in env if v["name"] == "SANDBOX_GATEWAY_REPLICA_ID")
    assert replica["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_production_settings_and_redis_secret(chart: helm_python.Chart, monkeypatch: pytest.MonkeyPatch) -> None:
    values = production_values()
    r = render(chart, values, namespace="agent-sandbox-system")
    env = {e["name"]: e for e in r.container["env"]}
    assert env["SANDBOX_GATEWAY_PER_ORG_METRICS"]["value"] == "true"
    assert env["SANDBOX_GATEWAY_MAX_HEADER_BYTES"]["value"] == "1048576"  # no 1.048576e+06
    ref = env["REDIS_URL"]["valueFrom"]["secretKeyRef"]
    secret = r.one("Secret", ref["name"])
    assert base64.b64decode(secret["data"][ref["key"]]).decode() == values["redis"]["url"]
    assert "checksum/redis-url" in r.pod["metadata"]["annotations"]
    assert r.pod["metadata"]["labels"]["app"] == "sandbox-router"
    assert not r.of_kind("Deployment")[1:], "no embedded Redis in production"
    # Production keys come from a Secret managed outside the chart: nothing generated or inline.
    assert values["auth"] == {"mode": "token", "keysSecret": "sandbox-gateway-auth-keys"}
    assert env["SANDBOX_GATEWAY_AUTH_MODE"]["value"] == "token"
    assert r.auth_secret_name == "sandbox-gateway-auth-keys"
    assert r.chart_auth_secret is None and [s["metadata"]["name"] for s in r.of_kind("Secret")] == [ref["name"]]
    assert "checksum/auth-keys" not in r.pod["metadata"]["annotations"]


def test_kitchen_sink_names_and_knobs(chart: helm_python.Chart, monkeypatch: pytest.MonkeyPatch) -> None:
    r = render(chart, copy.deepcopy(KITCHEN_SINK))
    for obj in r.objects:
        name = obj["metadata"]["name"]
        assert len(name) <= 63 and not name.endswith("-"), name
    assert r.container["image"] == "registry.example/sgw@sha256:" + "a" * 64
    assert r.pod["spec"]["serviceAccountName"] == "existing"
    assert not r.of_kind("ServiceAccount") and not r.of_kind("ConfigMap")[1:]
    assert r.pod["metadata"]["annotations"]["prometheus.io/port"] == "8081"
    env = {e["name"]: e.get("value") for e in r.container["env"]}
    assert env["PER_SESSION_SANDBOX_ORG_IDS"] == "org-a,org-b"
    assert env["SANDBOX_GATEWAY_KUBECONFIG"] == "/etc/kube/config"
    assert env["SANDBOX_GATEWAY_ROUTE_CACHE_TTL"] == "2.5"
    assert env["SANDBOX_GATEWAY_CREATION_LEASE"] == "240"
    assert env["EXTRA"] == "1"

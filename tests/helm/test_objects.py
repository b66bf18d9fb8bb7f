"""The Helm chart: Services, optional objects, the dashboard, and bad values refused (see tests/helm/harness.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.helm.harness import (
    DASHBOARD, INLINE_KEYS, NAMESPACE, RELEASE, helm_python, production_values, render, Rendered, suffixed,
)

# --------------------------------------------------------------------------------------
# Services, optional objects, dashboard
# --------------------------------------------------------------------------------------


def test_services(scenario: Rendered) -> None:
    data = scenario.one("Service", scenario.fullname)
    control = scenario.one("Service", suffixed(scenario.fullname, "control"))
    ports = {p["name"]: (p["port"], p["targetPort"]) for p in data["spec"]["ports"]}
    assert ports == {"http": (data["spec"]["ports"][0]["port"], "http"), "grpc": (50051, "grpc")}
    assert ports["http"][0] in (8080, 80)
    assert {p["name"]: (p["port"], p["targetPort"]) for p in control["spec"]["ports"]} == {
        "control": (8081, "control")}
    pod_labels = scenario.pod["metadata"]["labels"]
    for svc in (data, control):
        assert svc["spec"]["selector"].items() <= pod_labels.items()


def test_defaults_render_only_the_basic_objects(chart: helm_python.Chart) -> None:
    r = render(chart)
    kinds = sorted(o["kind"] for o in r.objects)
    assert kinds == sorted(["ConfigMap", "ConfigMap", "Deployment", "Deployment", "PersistentVolumeClaim",
                            "PodDisruptionBudget", "Role", "RoleBinding", "Secret", "Service", "Service", "Service",
                            "ServiceAccount"])
    assert r.one("Secret")["metadata"]["name"] == f"{RELEASE}-sandbox-gateway-auth", "the generated token key"
    assert r.deployment["spec"]["replicas"] == 2
    assert r.one("PodDisruptionBudget")["spec"]["minAvailable"] == 1
    env = {e["name"]: e.get("value") for e in r.container["env"]}
    assert env["REDIS_URL"] == f"redis://{RELEASE}-sandbox-gateway-redis:6379/0"
    assert "WARNING: redis.embedded is enabled" in r.notes
    assert "app: sandbox-router" in r.notes


def test_production_optional_objects(chart: helm_python.Chart) -> None:
    r = render(chart, production_values(), namespace="agent-sandbox-system")
    assert "replicas" not in r.deployment["spec"], "the HPA owns the replica count"
    hpa = r.one("HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = {"apiVersion": "apps/v1", "kind": "Deployment", "name": r.deployment["metadata"]["name"]}
    assert hpa["spec"]["scaleTargetRef"] == target
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    assert r.one("PodDisruptionBudget")["spec"]["minAvailable"] == 2

    monitor = r.one("ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["endpoints"][0]["port"] == "control"
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    control = r.one("Service", f"{RELEASE}-sandbox-gateway-control")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= control["metadata"]["labels"].items()
    data = r.one("Service", f"{RELEASE}-sandbox-gateway")
    assert not monitor["spec"]["selector"]["matchLabels"].items() <= data["metadata"]["labels"].items()

    policy = r.one("NetworkPolicy")
    data_rule, control_rule = policy["spec"]["ingress"]
    assert {p["port"] for p in data_rule["ports"]} == {"http", "grpc"}
    assert {p["port"] for p in control_rule["ports"]} == {"control"}
    sources = [peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for peer in control_rule["from"]]
    assert "monitoring" in sources
    assert "WARNING" not in r.notes


@pytest.mark.parametrize(("persistence", "volume", "warned"), [
    pytest.param({}, "persistentVolumeClaim", False, id="default: AOF on a PersistentVolumeClaim"),
    pytest.param({"enabled": True, "size": "5Gi", "storageClass": "fast"}, "persistentVolumeClaim", False,
                 id="sized, on a storage class"),
    pytest.param({"enabled": False}, "emptyDir", True, id="off: AOF on an emptyDir, and the notes say why it matters"),
])
def test_the_embedded_redis_persists_its_bindings(chart: helm_python.Chart, persistence: dict[str, Any],
                                                  volume: str, warned: bool) -> None:
    """A Redis that restarts empty forgets every binding while sandboxes run on (issue #13)."""
    r = render(chart, {"redis": {"embedded": {"enabled": True, "persistence": persistence}}})
    name = f"{RELEASE}-sandbox-gateway-redis"
    redis = r.one("Deployment", name)
    args = redis["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    assert args[args.index("--dir") + 1] == "/data"
    assert redis["spec"]["strategy"]["type"] == "Recreate", "never two pods on one AOF"
    data = next(v for v in redis["spec"]["template"]["spec"]["volumes"] if v["name"] == "data")
    assert volume in data
    claims = r.of_kind("PersistentVolumeClaim")
    if volume == "persistentVolumeClaim":
        claim = r.one("PersistentVolumeClaim", name)
        assert data["persistentVolumeClaim"]["claimName"] == name
        assert claim["spec"]["resources"]["requests"]["storage"] == persistence.get("size", "1Gi")
        assert claim["spec"].get("storageClassName") == persistence.get("storageClass")
    else:
        assert claims == []
    assert ("persistence.enabled is false" in r.notes and "starts EMPTY" in r.notes) is warned


def test_an_external_redis_replaces_the_embedded_one(chart: helm_python.Chart) -> None:
    r = render(chart, {"redis": {"existingSecret": {"name": "redis", "key": "url"}}})
    assert [d["metadata"]["name"] for d in r.of_kind("Deployment")] == [f"{RELEASE}-sandbox-gateway"]
    env = {e["name"]: e for e in r.container["env"]}
    assert env["REDIS_URL"]["valueFrom"]["secretKeyRef"] == {"name": "redis", "key": "url"}
    assert "WARNING" not in r.notes


def test_optional_objects_are_off_by_default(chart: helm_python.Chart) -> None:
    r = render(chart)
    for kind in ("HorizontalPodAutoscaler", "ServiceMonitor", "NetworkPolicy"):
        assert not r.of_kind(kind), kind
    # The only Secret is the generated token key (no redis-url Secret with the embedded Redis).
    assert [s["metadata"]["name"] for s in r.of_kind("Secret")] == [f"{RELEASE}-sandbox-gateway-auth"]


def test_dashboard_configmap_carries_the_sidecar_label(chart: helm_python.Chart) -> None:
    r = render(chart)
    cm = r.one("ConfigMap", f"{RELEASE}-sandbox-gateway-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["sandbox-gateway.json"]) == json.loads(DASHBOARD.read_text(encoding="utf-8"))

    custom = render(chart, {"dashboards": {"enabled": True, "label": "example.com/dashboard", "labelValue": "yes",
                                           "namespace": "monitoring"}})
    cm = custom.one("ConfigMap", f"{RELEASE}-sandbox-gateway-dashboard")
    assert cm["metadata"]["labels"]["example.com/dashboard"] == "yes"
    assert cm["metadata"]["namespace"] == "monitoring"
    assert not render(chart, {"dashboards": {"enabled": False}}).of_kind("ConfigMap")[1:]


# --------------------------------------------------------------------------------------
# Bad values are refused: by values.schema.json, or by the chart's own checks
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("values", "needle"), [
    pytest.param({"replicaCount": "two"}, "replicaCount", id="replicas is a string"),
    pytest.param({"replicas": 2}, "replicas", id="unknown top-level key"),
    pytest.param({"config": {"host": "::"}}, "host", id="chart-managed setting in config"),
    pytest.param({"config": {"log_level": "verbose"}}, "log_level", id="bad enum in config"),
    pytest.param({"policy": {"pools": {"p": {"provider": "docker"}}}}, "provider", id="unknown provider"),
    pytest.param({"policy": {"pools": {"p": {"provider": "kubernetes"}}}}, "kubernetes",
                 id="kubernetes pool without options"),
    pytest.param({"policy": {"routing": {"prefix_pools": {"default": "x"}}}}, "pools", id="policy without pools"),
    pytest.param({"redis": {"url": "http://redis:6379"}}, "url", id="redis url scheme"),
    pytest.param({"service": {"type": "ExternalName", "ports": {"http": 8080, "grpc": 50051}}}, "type", id="service type"),
    pytest.param({"rbac": {"create": True, "extraNamespaces": ["Not_A_Namespace"]}}, "extraNamespaces", id="bad namespace"),
    pytest.param({"config": {"creation_lease": 0}}, "creation_lease", id="creation lease not positive"),
    pytest.param({"config": {"auth_mode": "token"}}, "auth_mode", id="auth_mode belongs under auth"),
    pytest.param({"config": {"auth_keys_file": "/k.yaml"}}, "auth_keys_file", id="auth_keys_file belongs under auth"),
    pytest.param({"auth": {"mode": "none"}}, "mode", id="unknown auth mode"),
    pytest.param({"auth": {"mode": None}}, "mode", id="auth mode unset"),
    pytest.param({"auth": {"mode": "token", "keys": [{"kid": "k", "alg": "HS256", "secret": "short"}]}}, "secret",
                 id="HS256 secret under 32 characters"),
    pytest.param({"auth": {"mode": "token", "keys": [{"kid": "k", "alg": "RS256"}]}}, "public_key",
                 id="RS256 without a public key"),
    pytest.param({"auth": {"mode": "token", "keys": [{"kid": "k", "alg": "none", "secret": "x" * 40}]}}, "alg",
                 id="alg none"),
    pytest.param({"auth": {"mode": "token", "keys": [dict(INLINE_KEYS[1], private_key="PEM")]}}, "private_key",
                 id="private key handed to the gateway"),
    pytest.param({"auth": {"mode": "token", "keys": [dict(INLINE_KEYS[0], public_key="PEM")]}}, "/auth/keys/0",
                 id="HS256 key with a public key"),
    pytest.param({"auth": {"mode": "token", "keysSecret": "Bad_Name"}}, "keysSecret", id="bad Secret name"),
    pytest.param({"routerCompat": {"namespaces": ["Agents_1"]}}, "/routerCompat/namespaces/0", id="router compat bad namespace"),
    pytest.param({"routerCompat": {"namespaces": ["agents", "agents"]}}, "/routerCompat/namespaces",
                 id="router compat duplicate namespace"),
    pytest.param({"routerCompat": {"namespaces": ["agents"], "ports": [0]}}, "/routerCompat/ports/0", id="router compat port 0"),
    pytest.param({"routerCompat": {"namespaces": ["agents"], "ports": [65536]}}, "/routerCompat/ports/0",
                 id="router compat port too high"),
    pytest.param({"routerCompat": {"namespaces": ["agents"], "ports": []}}, "/routerCompat/ports", id="router compat no ports"),
    pytest.param({"routerCompat": {"namespaces": ["agents"], "apiVersion": "v1"}}, "/routerCompat/apiVersion",
                 id="router compat bad apiVersion"),
    pytest.param({"routerCompat": {"enabled": True}}, "'enabled' not allowed", id="router compat unknown key"),
    pytest.param({"config": {"router_compat_namespaces": ["agents"]}}, "router_compat_namespaces",
                 id="router compat belongs under routerCompat"),
    pytest.param({"grpc": {"tls": {"secretName": "Bad_Name"}}}, "secretName", id="bad gRPC TLS Secret name"),
    pytest.param({"config": {"grpc_tls_cert_file": "/c.pem"}}, "grpc_tls_cert_file",
                 id="gRPC TLS files come from grpc.tls"),
])
def test_schema_rejects_bad_values(chart: helm_python.Chart, values: dict[str, Any], needle: str) -> None:
    with pytest.raises(helm_python.HelmError) as excinfo:
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    assert isinstance(excinfo.value, helm_python.HelmValuesError | helm_python.HelmRenderError)
    assert needle in str(excinfo.value)


@pytest.mark.parametrize(("values", "needle"), [
    pytest.param({"redis": {"embedded": {"enabled": False}}}, "needs a shared session store",
                 id="two replicas without redis"),
    pytest.param({"replicaCount": 1, "config": {"workers": 4}, "redis": {"embedded": {"enabled": False}}},
                 "needs a shared session store", id="workers without redis"),
    pytest.param({"redis": {"url": "redis://r:6379/0", "existingSecret": {"name": "s", "key": "k"}}}, "only one of",
                 id="two redis sources"),
    pytest.param({"policy": {"pools": {"l": {"provider": "local"}}, "routing": {"prefix_pools": {"default": "l"}}}},
                 "policy.pools.l: provider 'local'", id="local pool with two replicas"),
    pytest.param({"terminationGracePeriodSeconds": 20}, "terminationGracePeriodSeconds", id="grace shorter than drain"),
    pytest.param({"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 3}}, "maxReplicas",
                 id="hpa max below min"),
    pytest.param({"auth": {"mode": "token", "keysSecret": "keys", "keys": INLINE_KEYS}},
                 "set only one of auth.keysSecret", id="two key sources"),
    pytest.param({"auth": {"mode": "token", "keys": [INLINE_KEYS[0], dict(INLINE_KEYS[1], kid="try-hs")]}},
                 'kid "try-hs" appears more than once', id="duplicate kid"),
])
def test_chart_refuses_broken_deployments(chart: helm_python.Chart, values: dict[str, Any], needle: str) -> None:
    with pytest.raises(helm_python.HelmRenderError) as excinfo:
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    assert needle in str(excinfo.value)

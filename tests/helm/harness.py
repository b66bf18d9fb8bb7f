"""The Helm chart tests' harness: the chart rendered offline by Helm's own engine, validated against
Kubernetes' schemas (fixtures in conftest.py, tests by part of the chart in test_*.py).

Rendering uses ``helm_python`` (PyPI ``helm-python-sdk``: Helm's Go code as a shared library,
no binary, no network); every rendered built-in object is validated strictly (unknown fields
are errors) with ``kubernetes_validate``. Both packages are dev-only; when one is missing (the
helm-python-sdk wheel exists for x86_64 Linux only) every test module is skipped with the reason.
"""

from __future__ import annotations

import base64
import copy
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.compat_locator import LOCATOR_RBAC_RULES
from gateway.providers.kubernetes_api import RBAC_RULES, rbac_rules

try:
    import helm_python
except Exception as exc:  # ImportError, or OSError when the native library cannot load
    reason = f"helm_python (PyPI helm-python-sdk) is unavailable here: {exc!r}"
    print(reason)
    pytest.skip(reason, allow_module_level=True)
try:
    import kubernetes_validate
except Exception as exc:
    reason = f"kubernetes_validate (PyPI kubernetes-validate) is unavailable here: {exc!r}"
    print(reason)
    pytest.skip(reason, allow_module_level=True)

from gateway.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "sandbox-gateway"
PRODUCTION_VALUES = CHART / "ci" / "production-values.yaml"
DASHBOARD = CHART / "dashboards" / "sandbox-gateway.json"
KUBE_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
RELEASE = "sgw"
NAMESPACE = "sandbox-gateway"

# The API calls of the Kubernetes provider: exactly what the chart's Roles grant
# (helper "sandbox-gateway.providerRules"). Each rule is (apiGroup, resources, verbs).
# The chart's Role must grant exactly what the Kubernetes provider calls, no more.
EXPECTED_RBAC_RULES: frozenset[tuple[str, frozenset[str], frozenset[str]]] = frozenset(
    (group, frozenset(rule["resources"]), frozenset(rule["verbs"]))
    for rule in RBAC_RULES for group in rule["apiGroups"]
)


def expected_rbac_rules(modes: Any) -> frozenset[tuple[str, frozenset[str], frozenset[str]]]:
    """What the Role of a namespace whose pools have these modes must grant: exactly rbac_rules(modes)."""
    return frozenset((group, frozenset(rule["resources"]), frozenset(rule["verbs"]))
                     for rule in rbac_rules(modes) for group in rule["apiGroups"])


def namespace_modes(policy_text: str) -> dict[str, set[str]]:
    """The pool modes per namespace of a rendered policy (the chart fills in each pool's namespace)."""
    modes: dict[str, set[str]] = {}
    for pool in (yaml.safe_load(policy_text).get("pools") or {}).values():
        if (pool or {}).get("provider") == "kubernetes":
            section = pool["kubernetes"]
            modes.setdefault(section["namespace"], set()).add(section.get("mode", "sandbox"))
    return modes


# What the router headers' SandboxLocator calls: exactly what the router-compat Roles grant
# (helper "sandbox-gateway.locatorRules").
EXPECTED_LOCATOR_RULES: frozenset[tuple[str, frozenset[str], frozenset[str]]] = frozenset(
    (group, frozenset(rule["resources"]), frozenset(rule["verbs"]))
    for rule in LOCATOR_RBAC_RULES for group in rule["apiGroups"]
)

# Settings the chart sets itself (flags, ports, mounts, Secret, downward API, `auth:`,
# `routerCompat:`) or the platform does (Kubernetes, serve --workers), so `config` must not offer them.
CHART_MANAGED_SETTINGS = {"host", "data_port", "control_port", "grpc_port", "policy_file", "data_dir", "redis_url",
                          "replica_id", "auth_mode", "auth_keys_file", "kubernetes_service_host",
                          "prometheus_multiproc_dir", "allowed_hosts",  # the Service's names + allowedHosts
                          "router_compat_namespaces", "router_compat_ports", "router_compat_api_version",
                          # from grpc.tls.secretName (the chart mounts the Secret)
                          "grpc_tls_cert_file", "grpc_tls_key_file"}
LIFECYCLE_POOL_OPTIONS = ("on_idle", "retention", "wake_timeout", "request_timeout")
GRPC_TLS_DIR = "/etc/sandbox-gateway/grpc-tls"
ROUTER_COMPAT_ENV = ("SANDBOX_GATEWAY_ROUTER_COMPAT_NAMESPACES", "SANDBOX_GATEWAY_ROUTER_COMPAT_PORTS",
                     "SANDBOX_GATEWAY_ROUTER_COMPAT_API_VERSION")

# The router headers on, in a namespace that is also the default policy's pool namespace and one
# that is not, on two ports and the other Sandbox API version.
ROUTER_COMPAT: dict[str, Any] = {"namespaces": ["agents", NAMESPACE], "ports": [8888, 9000], "apiVersion": "v1alpha1"}

# Where the chart mounts the keys Secret, and the key file the gateway is pointed at.
AUTH_KEYS_DIR = "/etc/sandbox-gateway/auth"
AUTH_KEYS_FILE = f"{AUTH_KEYS_DIR}/keys.yaml"
SECRET_AUTH = "sandbox-gateway/templates/secret-auth.yaml"
GENERATED_KEYS = "sandbox-gateway/generated-keys"

# Inline keys as auth.keys takes them: an HS256 secret and an EdDSA public key (no private key).
INLINE_KEYS: list[dict[str, str]] = [
    {"kid": "try-hs", "alg": "HS256", "secret": "0123456789abcdef0123456789abcdef-inline"},
    {"kid": "try-ed", "alg": "EdDSA", "public_key": "-----BEGIN PUBLIC KEY-----\n"
     "MCowBQYDK2VwAyEA3RNJXrPaXFK5EzGvFW2fZBiMx2edXX0LoiLsZak6PT8=\n-----END PUBLIC KEY-----\n"},
]

# A single replica may use local pools; mixes every provider and a kubernetes pool
# without a namespace (the chart places it in the release namespace).
MIXED_POLICY: dict[str, Any] = {
    "pools": {
        "local": {"provider": "local", "idle_timeout": "10m"},
        "fleet": {"provider": "static", "upstreams": ["http://10.0.0.1:8888", "http://10.0.0.2:8888"]},
        "claims": {"provider": "kubernetes", "kubernetes": {"mode": "claim", "api_version": "v1beta1", "warm_pool": "warm"}},
        "boxes": {"provider": "kubernetes",
                  "kubernetes": {"namespace": "boxes", "api_version": "v1alpha1", "mode": "claim", "template": "t"}},
    },
    "routing": {"prefix_pools": {"ses": "local", "bot": "fleet", "org": "claims", "default": "boxes"}},
}



def production_values() -> dict[str, Any]:
    return yaml.safe_load(PRODUCTION_VALUES.read_text(encoding="utf-8"))


class Rendered:
    """One render: the raw files and the parsed objects."""

    def __init__(self, files: dict[str, str], namespace: str) -> None:
        self.files = files
        self.namespace = namespace
        self.objects: list[dict[str, Any]] = []
        for path, text in sorted(files.items()):
            if path.endswith("NOTES.txt"):
                continue
            self.objects.extend(doc for doc in yaml.safe_load_all(text) if doc)

    @property
    def notes(self) -> str:
        return next(text for path, text in self.files.items() if path.endswith("NOTES.txt"))

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [o for o in self.of_kind(kind) if name is None or o["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name or ''}, got {[o['metadata']['name'] for o in found]}"
        return found[0]

    @property
    def deployment(self) -> dict[str, Any]:
        deployments = self.of_kind("Deployment")
        return next(o for o in deployments if o["metadata"]["labels"]["app.kubernetes.io/component"] == "gateway")

    @property
    def pod(self) -> dict[str, Any]:
        return self.deployment["spec"]["template"]

    @property
    def container(self) -> dict[str, Any]:
        containers = self.pod["spec"]["containers"]
        return next(c for c in containers if c["name"] == "gateway")

    @property
    def fullname(self) -> str:
        return self.deployment["metadata"]["name"]

    @property
    def policy_text(self) -> str:
        return self.one("ConfigMap", suffixed(self.fullname, "policy"))["data"]["policy.yaml"]

    @property
    def env(self) -> dict[str, Any]:
        return {e["name"]: e.get("value", e.get("valueFrom")) for e in self.container["env"]}

    @property
    def auth_secret_name(self) -> str:
        """The Secret mounted as the key directory."""
        volumes = {v["name"]: v for v in self.pod["spec"]["volumes"]}
        return volumes["auth-keys"]["secret"]["secretName"]

    @property
    def chart_auth_secret(self) -> dict[str, Any] | None:
        """The chart's own keys Secret (auth.keys or generated), if rendered."""
        found = [o for o in self.of_kind("Secret") if o["metadata"]["name"] == suffixed(self.fullname, "auth")]
        return found[0] if found else None

    def key_file(self) -> str:
        secret = self.chart_auth_secret
        assert secret is not None, "no chart-managed keys Secret"
        return base64.b64decode(secret["data"]["keys.yaml"]).decode()


def suffixed(fullname: str, suffix: str) -> str:
    """The chart's name for a suffixed object: stays a 63-character DNS label."""
    return fullname[: 62 - len(suffix)].rstrip("-") + "-" + suffix


def render(chart: helm_python.Chart, values: dict[str, Any] | None = None, namespace: str = NAMESPACE) -> Rendered:
    return Rendered(chart.render(values, name=RELEASE, namespace=namespace), namespace)


def with_values(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    values = copy.deepcopy(base)
    values.update(changes)
    return values


# Every optional knob at once, with a 63-character fullname (suffixed names must stay DNS labels).
KITCHEN_SINK: dict[str, Any] = {
    "fullnameOverride": "g" * 63,
    "image": {"repository": "registry.example/sgw", "digest": "sha256:" + "a" * 64, "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "pull"}],
    "redis": {"existingSecret": {"name": "redis", "key": "url"}},
    "serviceAccount": {"create": False, "name": "existing"},
    "service": {"type": "LoadBalancer", "annotations": {"a": "b"}, "labels": {"c": "d"},
                "ports": {"http": 80, "grpc": 50051}, "loadBalancerSourceRanges": ["10.0.0.0/8"],
                "externalTrafficPolicy": "Local"},
    "metrics": {"podAnnotations": True, "serviceMonitor": {"enabled": True, "relabelings": [{"action": "keep"}]}},
    "extraEnv": [{"name": "EXTRA", "value": "1"}],
    "envFrom": [{"configMapRef": {"name": "more"}}],
    "extraVolumes": [{"name": "kube", "secret": {"secretName": "kubeconfig"}}],
    "extraVolumeMounts": [{"name": "kube", "mountPath": "/etc/kube", "readOnly": True}],
    "config": {"kubeconfig": "/etc/kube/config", "per_session_org_ids": "org-a,org-b", "route_cache_ttl": 2.5,
               "creation_lease": 240},
    "auth": {"mode": "token", "keys": copy.deepcopy(INLINE_KEYS)},
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gateway", "effect": "NoSchedule"}],
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gw"]}]}]}}},
    "priorityClassName": "high",
    "dashboards": {"enabled": False},
    "networkPolicy": {"enabled": True, "extraDataFrom": [{"ipBlock": {"cidr": "10.0.0.0/8"}}],
                      "extraControlFrom": [{"podSelector": {"matchLabels": {"app": "prometheus"}}}],
                      "egress": {"enabled": True, "redis": {"to": [{"ipBlock": {"cidr": "10.1.2.3/32"}}]},
                                 "extraTo": [{"to": [{"ipBlock": {"cidr": "10.9.0.0/16"}}], "ports": [{"port": 4317}]}]}},
    "routerCompat": copy.deepcopy(ROUTER_COMPAT),
    "grpc": {"tls": {"secretName": "grpc-tls"}},
}

SCENARIOS = {
    "default": lambda: None,
    "kitchen-sink": lambda: copy.deepcopy(KITCHEN_SINK),
    "production": production_values,
    "mixed-single-replica": lambda: {"replicaCount": 1, "redis": {"embedded": {"enabled": False}},
                                     "policy": MIXED_POLICY, "networkPolicy": {"enabled": True},
                                     "auth": {"mode": "trusted-headers"}},
    "router-compat": lambda: {"auth": {"mode": "trusted-headers"}, "routerCompat": copy.deepcopy(ROUTER_COMPAT)},
}


def settings_from(r: Rendered, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings as the gateway would read them from the rendered container's literal env."""
    for name in list(os.environ):
        if name.startswith("SANDBOX_GATEWAY_") or name in ("REDIS_URL", "PER_SESSION_SANDBOX_ORG_IDS"):
            monkeypatch.delenv(name)
    for var in r.container["env"]:
        if "value" in var:
            monkeypatch.setenv(var["name"], var["value"])
    args = r.container["args"]
    return Settings(host=args[args.index("--host") + 1])


def role_rules(role: dict[str, Any]) -> frozenset[tuple[str, frozenset[str], frozenset[str]]]:
    out = set()
    for rule in role["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, rule
        for group in rule["apiGroups"]:
            out.add((group, frozenset(rule["resources"]), frozenset(rule["verbs"])))
    return frozenset(out)

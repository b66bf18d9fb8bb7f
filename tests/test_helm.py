"""The Helm chart, rendered offline by Helm's own engine and validated against Kubernetes' schemas.

Rendering uses ``helm_python`` (PyPI ``helm-python-sdk``: Helm's Go code as a shared library,
no binary, no network); every rendered built-in object is validated strictly (unknown fields
are errors) with ``kubernetes_validate``. Both packages are dev-only; when one is missing (the
helm-python-sdk wheel exists for x86_64 Linux only) the module is skipped with the reason.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.compat_locator import LOCATOR_RBAC_RULES
from gateway.providers.kubernetes_api import RBAC_RULES
import yaml

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

from gateway.auth import KeySet, TokenAuth, issue_token
from gateway.settings import Settings
from gateway.policy import parse_policy
from gateway.providers.kubernetes_options import KubernetesPoolOptions, pool_options
from routing.policy import OrgRule, PolicyDocument, PoolSpec, RoutingRules

ROOT = Path(__file__).resolve().parents[1]
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
                          "prometheus_multiproc_dir",
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


# --------------------------------------------------------------------------------------
# Rendering helpers
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chart() -> Iterator[helm_python.Chart]:
    try:
        loaded = helm_python.Chart.load(str(CHART))
    except Exception as exc:  # the native library may fail to load on an unsupported platform
        reason = f"helm_python cannot load charts here: {exc!r}"
        print(reason)
        pytest.skip(reason)
    with loaded:
        yield loaded


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
                      "extraControlFrom": [{"podSelector": {"matchLabels": {"app": "prometheus"}}}]},
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


@pytest.fixture(params=sorted(SCENARIOS))
def scenario(request: pytest.FixtureRequest, chart: helm_python.Chart) -> Rendered:
    return render(chart, SCENARIOS[request.param]())


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


# --------------------------------------------------------------------------------------
# Authentication: always an explicit mode, always a key file
# --------------------------------------------------------------------------------------


def test_every_render_sets_an_auth_mode_and_mounts_the_key_file(scenario: Rendered) -> None:
    env = scenario.env
    assert env["SANDBOX_GATEWAY_AUTH_MODE"] in ("token", "trusted-headers")
    assert env["SANDBOX_GATEWAY_AUTH_KEYS_FILE"] == AUTH_KEYS_FILE
    mount = next(m for m in scenario.container["volumeMounts"] if m["name"] == "auth-keys")
    assert mount == {"name": "auth-keys", "mountPath": AUTH_KEYS_DIR, "readOnly": True}, "whole Secret, no subPath"
    secret = scenario.chart_auth_secret
    if secret is not None:
        assert scenario.auth_secret_name == secret["metadata"]["name"]
        # The gateway reads keys at startup, so the pods roll when the chart's keys change.
        checksum = scenario.pod["metadata"]["annotations"]["checksum/auth-keys"]
        assert checksum == hashlib.sha256(scenario.files[SECRET_AUTH].encode()).hexdigest()


def test_default_install_is_token_mode_with_a_generated_kept_key(chart: helm_python.Chart, tmp_path: Path) -> None:
    """No keys given: token mode still renders, with a random HS256 key the gateway accepts."""
    r = render(chart)
    assert r.env["SANDBOX_GATEWAY_AUTH_MODE"] == "token"
    secret = r.chart_auth_secret
    assert secret is not None and r.auth_secret_name == f"{RELEASE}-sandbox-gateway-auth"
    assert secret["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep", GENERATED_KEYS: "true"}
    document = yaml.safe_load(r.key_file())
    [key] = document["keys"]
    assert key["kid"] == "generated-1" and key["alg"] == "HS256"
    assert len(key["secret"]) == 64 and key["secret"].isalnum()
    # Loaded by the gateway's own key loader; tokens issued with it (as NOTES shows) verify.
    (tmp_path / "keys.yaml").write_text(r.key_file(), encoding="utf-8")
    keys = KeySet.load(tmp_path / "keys.yaml")
    token = issue_token(keys.first(), user="u", org="o")
    assert TokenAuth(keys).identify(None, None, "s", None, f"Bearer {token}").org_id == "o"
    # Without a cluster the lookup finds nothing: each offline render makes a new key.
    assert render(chart).key_file() != r.key_file()
    notes = r.notes
    assert "generated a random HS256 key" in notes and "auth.keysSecret" in notes
    assert "token issue --keys /etc/sandbox-gateway/auth/keys.yaml --admin" in notes
    assert "trusted-headers" not in notes


def test_inline_keys_render_into_the_chart_secret(chart: helm_python.Chart, tmp_path: Path) -> None:
    def rendered(keys: list[dict[str, str]]) -> Rendered:
        return render(chart, {"auth": {"mode": "token", "keys": keys}})

    r = rendered(INLINE_KEYS)
    secret = r.chart_auth_secret
    assert secret is not None and "annotations" not in secret["metadata"], "inline keys are not kept on uninstall"
    assert yaml.safe_load(r.key_file()) == {"keys": INLINE_KEYS}
    (tmp_path / "keys.yaml").write_text(r.key_file(), encoding="utf-8")
    keys = KeySet.load(tmp_path / "keys.yaml")
    assert keys.get("try-hs") is not None and keys.get("try-ed") is not None
    assert "auth.keys" in r.notes and "auth.keysSecret" in r.notes
    # Deterministic, and a key change rolls the pods.
    checksum = r.pod["metadata"]["annotations"]["checksum/auth-keys"]
    assert rendered(INLINE_KEYS).pod["metadata"]["annotations"]["checksum/auth-keys"] == checksum
    rotated = [dict(INLINE_KEYS[0], secret="another-secret-of-at-least-32-characters")]
    assert rendered(rotated).pod["metadata"]["annotations"]["checksum/auth-keys"] != checksum


@pytest.mark.parametrize("mode", ["token", "trusted-headers"])
def test_keys_secret_is_mounted_and_nothing_is_generated(chart: helm_python.Chart, mode: str) -> None:
    r = render(chart, {"auth": {"mode": mode, "keysSecret": "gateway-keys"}})
    assert r.env["SANDBOX_GATEWAY_AUTH_MODE"] == mode
    assert r.env["SANDBOX_GATEWAY_AUTH_KEYS_FILE"] == AUTH_KEYS_FILE
    assert r.auth_secret_name == "gateway-keys"
    assert not r.of_kind("Secret") and SECRET_AUTH not in {k for k, v in r.files.items() if v.strip()}
    assert "checksum/auth-keys" not in r.pod["metadata"]["annotations"]
    assert f"rollout restart deployment/{r.fullname}" in r.notes


def test_trusted_headers_is_explicit_and_warned(chart: helm_python.Chart) -> None:
    warning = "ANYONE WHO CAN REACH PORT 8080 CAN CLAIM ANY IDENTITY"
    # Still given a key file: the control API needs admin tokens in this mode too.
    r = render(chart, {"auth": {"mode": "trusted-headers"}})
    assert r.env["SANDBOX_GATEWAY_AUTH_MODE"] == "trusted-headers"
    assert r.env["SANDBOX_GATEWAY_AUTH_KEYS_FILE"] == AUTH_KEYS_FILE and r.chart_auth_secret is not None
    assert "WARNING: auth.mode is trusted-headers" in r.notes and warning in r.notes
    assert "networkPolicy.enabled is false" in r.notes
    # A NetworkPolicy admitting only the agent backend silences the NetworkPolicy hints, not the warning.
    fenced = render(chart, {"auth": {"mode": "trusted-headers"},
                            "networkPolicy": {"enabled": True, "dataNamespaces": ["agents"]}})
    assert warning in fenced.notes
    assert "networkPolicy.enabled is false" not in fenced.notes and "admits any source" not in fenced.notes
    open_policy = render(chart, {"auth": {"mode": "trusted-headers"}, "networkPolicy": {"enabled": True}})
    assert "the data plane admits any source" in open_policy.notes
    assert "trusted-headers" not in render(chart, {"auth": {"mode": "token", "keys": INLINE_KEYS}}).notes


def test_creation_lease_is_a_config_setting(chart: helm_python.Chart) -> None:
    assert "SANDBOX_GATEWAY_CREATION_LEASE" not in render(chart).env, "null: the gateway default applies"
    assert render(chart, {"config": {"creation_lease": 300}}).env["SANDBOX_GATEWAY_CREATION_LEASE"] == "300"
    assert render(chart, {"config": {"creation_lease": 90.5}}).env["SANDBOX_GATEWAY_CREATION_LEASE"] == "90.5"


def test_installation_defaults_to_the_release_name(chart: helm_python.Chart) -> None:
    def installation(values: dict[str, Any] | None) -> str:
        env = render(chart, values).container["env"]
        return next(e["value"] for e in env if e["name"] == "SANDBOX_GATEWAY_INSTALLATION")

    assert installation(None) == RELEASE
    assert installation({"config": {"installation": "blue"}}) == "blue"


@pytest.mark.parametrize("values", ["default", "production", "kitchen-sink"])
def test_values_schema_is_draft7_and_accepts_the_shipped_values(chart: helm_python.Chart, values: str) -> None:
    """A second JSON Schema engine (Helm 3 and Helm 4 use different ones): the schema is valid
    draft-07 and the shipped values, coalesced by Helm, satisfy it."""
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    jsonschema.Draft7Validator.check_schema(schema)
    data = chart.merge_values(SCENARIOS[values]())
    jsonschema.Draft7Validator(schema).validate(data)
    assert not jsonschema.Draft7Validator(schema).is_valid(with_values(data, replicaCount="two"))
    # The key rules hold in this engine too: HS256 takes a secret only, the others a public key only.
    hs, ed = INLINE_KEYS
    for bad in ([dict(hs, public_key="PEM")], [dict(ed, secret="s" * 32)], [{"kid": "k", "alg": "HS256"}]):
        assert not jsonschema.Draft7Validator(schema).is_valid(with_values(data, auth={"mode": "token", "keys": bad}))
    compat = {"namespaces": ["agents"], "ports": [8888], "apiVersion": "v1alpha1"}
    assert jsonschema.Draft7Validator(schema).is_valid(with_values(data, routerCompat=compat))
    for bad_compat in (dict(compat, namespaces=["Agents_1"]), dict(compat, ports=[0]), dict(compat, extra=1)):
        assert not jsonschema.Draft7Validator(schema).is_valid(with_values(data, routerCompat=bad_compat))


def test_config_keys_are_exactly_the_gateway_settings() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    offered = set(schema["properties"]["config"]["properties"])
    assert offered.isdisjoint(CHART_MANAGED_SETTINGS)
    assert offered | CHART_MANAGED_SETTINGS == set(Settings.model_fields)
    defaults = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    assert set(defaults["config"]) == offered


def test_policy_schema_matches_the_policy_models() -> None:
    defs = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))["definitions"]
    policy = defs["policy"]["properties"]
    assert set(policy) == set(PolicyDocument.model_fields)
    assert set(defs["pool"]["properties"]) == set(PoolSpec.model_fields)
    assert set(defs["kubernetesPool"]["properties"]) == set(KubernetesPoolOptions.model_fields)
    assert set(policy["routing"]["properties"]) == set(RoutingRules.model_fields)
    assert set(policy["orgs"]["additionalProperties"]["properties"]) == set(OrgRule.model_fields)


def test_lifecycle_pool_options_are_offered_and_checked(chart: helm_python.Chart) -> None:
    """on_idle, retention, wake_timeout and request_timeout pass through to the policy file as given."""
    pool = {"provider": "kubernetes", "idle_timeout": "30m", "on_idle": "suspend", "retention": "7d",
            "wake_timeout": "90s", "request_timeout": "15m", "kubernetes": {"mode": "claim", "warm_pool": "w"}}
    r = render(chart, {"policy": {"pools": {"p": pool}, "routing": {"prefix_pools": {"default": "p"}}}})
    rendered = yaml.safe_load(r.policy_text)["pools"]["p"]
    assert {k: rendered[k] for k in LIFECYCLE_POOL_OPTIONS} == {k: pool[k] for k in LIFECYCLE_POOL_OPTIONS}
    for field, bad in (("on_idle", "sleep"), ("retention", "soon"), ("wake_timeout", 0), ("request_timeout", "-1")):
        with pytest.raises(helm_python.HelmValuesError) as excinfo:
            render(chart, {"policy": {"pools": {"p": dict(pool, **{field: bad})}}})
        assert field in str(excinfo.value)


# --------------------------------------------------------------------------------------
# gRPC TLS
# --------------------------------------------------------------------------------------


def test_grpc_tls_mounts_the_secret_and_points_the_gateway_at_it(chart: helm_python.Chart,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    r = render(chart, {"grpc": {"tls": {"secretName": "sgw-grpc-cert"}}})
    volume = next(v for v in r.pod["spec"]["volumes"] if v["name"] == "grpc-tls")
    assert volume == {"name": "grpc-tls", "secret": {"secretName": "sgw-grpc-cert"}}
    mount = next(m for m in r.container["volumeMounts"] if m["name"] == "grpc-tls")
    assert mount == {"name": "grpc-tls", "mountPath": GRPC_TLS_DIR, "readOnly": True}
    settings = _settings_from(r, monkeypatch)
    assert settings.grpc_tls_cert_file == Path(GRPC_TLS_DIR, "tls.crt")
    assert settings.grpc_tls_key_file == Path(GRPC_TLS_DIR, "tls.key")
    grpc_port = next(p for p in r.one("Service", r.fullname)["spec"]["ports"] if p["name"] == "grpc")
    assert "appProtocol" not in grpc_port, "TLS is not h2c"
    assert "TLS, Secret sgw-grpc-cert" in r.notes


def test_grpc_is_h2c_without_a_tls_secret(chart: helm_python.Chart, monkeypatch: pytest.MonkeyPatch) -> None:
    r = render(chart)
    assert not [v for v in r.pod["spec"]["volumes"] if v["name"] == "grpc-tls"]
    settings = _settings_from(r, monkeypatch)
    assert settings.grpc_tls_cert_file is None and settings.grpc_tls_key_file is None
    grpc_port = next(p for p in r.one("Service", r.fullname)["spec"]["ports"] if p["name"] == "grpc")
    assert grpc_port["appProtocol"] == "kubernetes.io/h2c"


# --------------------------------------------------------------------------------------
# Policy ConfigMap, checksum, RBAC
# --------------------------------------------------------------------------------------


def test_policy_configmap_is_a_valid_policy_file(scenario: Rendered) -> None:
    policy = parse_policy(scenario.policy_text, "configmap:policy.yaml")
    assert policy.default_pool in policy.pools
    kubernetes = [name for name, pool in policy.pools.items() if pool.provider == "kubernetes"]
    for name, options in pool_options(policy, kubernetes).items():
        assert options.namespace != "default", name


def test_production_policy_is_the_values_policy(chart: helm_python.Chart) -> None:
    values = production_values()
    r = render(chart, values, namespace="agent-sandbox-system")
    assert yaml.safe_load(r.policy_text) == values["policy"]


def test_production_pod_template_is_a_valid_pod_template() -> None:
    """The example's Sandbox pod template is a PodTemplateSpec: validate it as one."""
    pool = production_values()["policy"]["pools"]["shared"]["kubernetes"]
    obj = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "shared"}, "template": pool["pod_template"]}
    kubernetes_validate.validate(obj, KUBE_VERSIONS[0], strict=True)


def test_kubernetes_pool_without_namespace_gets_the_release_namespace(chart: helm_python.Chart) -> None:
    r = render(chart, SCENARIOS["mixed-single-replica"]())
    pools = yaml.safe_load(r.policy_text)["pools"]
    assert pools["claims"]["kubernetes"]["namespace"] == NAMESPACE
    assert pools["boxes"]["kubernetes"]["namespace"] == "boxes"


def test_a_supplied_policy_replaces_the_builtin_one(chart: helm_python.Chart) -> None:
    """Helm deep-merges maps; the built-in pools must not leak into a supplied policy."""
    policy = {"pools": {"only": {"provider": "static", "upstreams": ["http://h:1"]}},
              "routing": {"prefix_pools": {"default": "only"}}}
    r = render(chart, {"policy": policy})
    doc = yaml.safe_load(r.policy_text)
    assert doc == policy
    parse_policy(r.policy_text)
    assert not r.of_kind("Role")


def test_checksum_annotation_follows_the_policy(chart: helm_python.Chart) -> None:
    def checksum(values: dict[str, Any]) -> str:
        return render(chart, values).pod["metadata"]["annotations"]["checksum/config"]

    base = production_values()
    changed = copy.deepcopy(base)
    changed["policy"]["pools"]["small"]["max_sandboxes"] = 401
    same = copy.deepcopy(base)
    same["config"]["log_level"] = "debug"
    assert checksum(base) != checksum(changed)
    assert checksum(base) == checksum(same)


def _rules(role: dict[str, Any]) -> frozenset[tuple[str, frozenset[str], frozenset[str]]]:
    out = set()
    for rule in role["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, rule
        for group in rule["apiGroups"]:
            out.add((group, frozenset(rule["resources"]), frozenset(rule["verbs"])))
    return frozenset(out)


@pytest.mark.parametrize(("name", "expected"), [
    ("default", {NAMESPACE}),
    ("production", {"sandboxes", "sandboxes-small", "sandboxes-canary"}),
    ("mixed-single-replica", {NAMESPACE, "boxes"}),
])
def test_a_role_and_binding_per_kubernetes_pool_namespace(chart: helm_python.Chart, name: str, expected: set[str]) -> None:
    r = render(chart, SCENARIOS[name]())
    roles, bindings = r.of_kind("Role"), r.of_kind("RoleBinding")
    assert sorted(o["metadata"]["namespace"] for o in roles) == sorted(expected)
    assert sorted(o["metadata"]["namespace"] for o in bindings) == sorted(expected)
    sa = r.one("ServiceAccount")
    for role in roles:
        assert _rules(role) == EXPECTED_RBAC_RULES
    for binding in bindings:
        role_ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": roles[0]["metadata"]["name"]}
        assert binding["roleRef"] == role_ref
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": NAMESPACE}]
    assert not r.of_kind("ClusterRole") and not r.of_kind("ClusterRoleBinding")
    assert r.pod["spec"]["serviceAccountName"] == sa["metadata"]["name"]
    assert r.pod["spec"]["automountServiceAccountToken"] is True


def test_no_rbac_and_no_token_without_kubernetes_pools(chart: helm_python.Chart) -> None:
    r = render(chart, {"replicaCount": 1, "redis": {"embedded": {"enabled": False}},
                       "policy": {"pools": {"small": {"provider": "local"}, "shared": {"provider": "local"}}}})
    assert not r.of_kind("Role") and not r.of_kind("RoleBinding")
    assert r.pod["spec"]["automountServiceAccountToken"] is False
    assert not any(e["name"] == "REDIS_URL" for e in r.container["env"])
    assert not r.of_kind("PodDisruptionBudget"), "no PDB for a single replica"


# --------------------------------------------------------------------------------------
# agent-sandbox router headers (routerCompat)
# --------------------------------------------------------------------------------------

# A single replica with local pools only: no pool Roles, so every Role is a router-compat one.
NO_POOL_NAMESPACES: dict[str, Any] = {
    "replicaCount": 1, "redis": {"embedded": {"enabled": False}},
    "policy": {"pools": {"small": {"provider": "local"}}, "routing": {"prefix_pools": {"default": "small"}}},
}


def _settings_from(r: Rendered, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings as the gateway would read them from the rendered container's literal env."""
    for name in list(os.environ):
        if name.startswith("SANDBOX_GATEWAY_") or name in ("REDIS_URL", "PER_SESSION_SANDBOX_ORG_IDS"):
            monkeypatch.delenv(name)
    for var in r.container["env"]:
        if "value" in var:
            monkeypatch.setenv(var["name"], var["value"])
    args = r.container["args"]
    return Settings(host=args[args.index("--host") + 1])


def _compat_roles(r: Rendered) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    name = suffixed(r.fullname, "router-compat")
    return ([o for o in r.of_kind("Role") if o["metadata"]["name"] == name],
            [o for o in r.of_kind("RoleBinding") if o["metadata"]["name"] == name])


def test_router_compat_is_off_by_default(chart: helm_python.Chart, monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))["routerCompat"]
    fields = Settings.model_fields
    assert defaults == {"namespaces": fields["router_compat_namespaces"].default,
                        "ports": fields["router_compat_ports"].default,
                        "apiVersion": fields["router_compat_api_version"].default}
    assert defaults["namespaces"] == [], "off by default"
    for values in (None, NO_POOL_NAMESPACES):
        r = render(chart, copy.deepcopy(values))
        assert not set(ROUTER_COMPAT_ENV) & set(r.env)
        assert _compat_roles(r) == ([], [])
        assert _settings_from(r, monkeypatch).router_compat_namespaces == []
    # Ports or apiVersion alone do not turn it on.
    r = render(chart, {"routerCompat": {"namespaces": [], "ports": [9000], "apiVersion": "v1beta1"}})
    assert not set(ROUTER_COMPAT_ENV) & set(r.env) and _compat_roles(r) == ([], [])


@pytest.mark.parametrize("mode", ["token", "trusted-headers"])
def test_router_compat_env_is_json_the_gateway_settings_accept(chart: helm_python.Chart, mode: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    r = render(chart, {"auth": {"mode": mode}, "routerCompat": copy.deepcopy(ROUTER_COMPAT)})
    env = r.env
    assert env["SANDBOX_GATEWAY_ROUTER_COMPAT_NAMESPACES"] == f'["agents","{NAMESPACE}"]'
    assert env["SANDBOX_GATEWAY_ROUTER_COMPAT_PORTS"] == "[8888,9000]"
    assert env["SANDBOX_GATEWAY_ROUTER_COMPAT_API_VERSION"] == "v1alpha1"
    assert json.loads(env["SANDBOX_GATEWAY_ROUTER_COMPAT_NAMESPACES"]) == ROUTER_COMPAT["namespaces"]
    assert json.loads(env["SANDBOX_GATEWAY_ROUTER_COMPAT_PORTS"]) == ROUTER_COMPAT["ports"]
    # The gateway refuses the router headers without a key file (admin tokens): the chart always gives one.
    assert env["SANDBOX_GATEWAY_AUTH_KEYS_FILE"] == AUTH_KEYS_FILE
    settings = _settings_from(r, monkeypatch)
    assert settings.auth_mode == mode and str(settings.auth_keys_file) == AUTH_KEYS_FILE
    assert settings.router_compat_namespaces == ROUTER_COMPAT["namespaces"]
    assert settings.router_compat_ports == ROUTER_COMPAT["ports"]
    assert settings.router_compat_api_version == "v1alpha1"
    assert "Router headers" in r.notes and "ADMIN" in r.notes
    # Only namespaces given: the chart's default ports and apiVersion, which are the gateway's.
    only = render(chart, {"routerCompat": {"namespaces": ["agents"]}})
    assert only.env["SANDBOX_GATEWAY_ROUTER_COMPAT_NAMESPACES"] == '["agents"]'
    assert only.env["SANDBOX_GATEWAY_ROUTER_COMPAT_PORTS"] == "[8888]"
    assert only.env["SANDBOX_GATEWAY_ROUTER_COMPAT_API_VERSION"] == "v1beta1"
    assert Settings.model_fields["router_compat_api_version"].default == "v1beta1"


def test_router_compat_gets_a_get_only_role_per_namespace(chart: helm_python.Chart) -> None:
    values = with_values(NO_POOL_NAMESPACES, routerCompat={"namespaces": ["tools", "agents"]})
    r = render(chart, copy.deepcopy(values))
    roles, bindings = r.of_kind("Role"), r.of_kind("RoleBinding")
    name = suffixed(r.fullname, "router-compat")
    assert sorted((o["metadata"]["namespace"], o["metadata"]["name"]) for o in roles) == [
        ("agents", name), ("tools", name)]
    assert sorted((o["metadata"]["namespace"], o["metadata"]["name"]) for o in bindings) == [
        ("agents", name), ("tools", name)]
    sa = r.one("ServiceAccount")["metadata"]["name"]
    for role in roles:
        assert _rules(role) == EXPECTED_LOCATOR_RULES
    for binding in bindings:
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}]
    assert not r.of_kind("ClusterRole") and not r.of_kind("ClusterRoleBinding")
    # The Sandbox lookup needs the API even without a kubernetes pool.
    assert r.pod["spec"]["automountServiceAccountToken"] is True
    for obj in r.objects:
        for kube_version in KUBE_VERSIONS:
            kubernetes_validate.validate(obj, kube_version, strict=True)
    # rbac.create: false leaves the Roles to you; the settings still render.
    unmanaged = render(chart, with_values(values, rbac={"create": False}))
    assert not unmanaged.of_kind("Role") and not unmanaged.of_kind("RoleBinding")
    assert unmanaged.env["SANDBOX_GATEWAY_ROUTER_COMPAT_NAMESPACES"] == '["tools","agents"]'


def test_a_pool_namespace_that_is_also_a_compat_namespace_gets_both_roles(chart: helm_python.Chart) -> None:
    r = render(chart, {"routerCompat": copy.deepcopy(ROUTER_COMPAT)})  # the built-in pools live in NAMESPACE
    keys = [(o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]) for o in r.objects]
    assert len(keys) == len(set(keys)), "two objects with the same kind, namespace and name"
    in_namespace = {o["metadata"]["name"]: o for o in r.of_kind("Role") if o["metadata"]["namespace"] == NAMESPACE}
    compat = suffixed(r.fullname, "router-compat")
    assert set(in_namespace) == {r.fullname, compat}
    assert _rules(in_namespace[r.fullname]) == EXPECTED_RBAC_RULES
    assert _rules(in_namespace[compat]) == EXPECTED_LOCATOR_RULES
    bindings = {o["metadata"]["name"]: o for o in r.of_kind("RoleBinding") if o["metadata"]["namespace"] == NAMESPACE}
    assert {name: b["roleRef"]["name"] for name, b in bindings.items()} == {r.fullname: r.fullname, compat: compat}
    assert [o["metadata"]["namespace"] for o in _compat_roles(r)[0]] == ["agents", NAMESPACE]


def test_router_compat_role_names_stay_dns_labels(chart: helm_python.Chart) -> None:
    r = render(chart, copy.deepcopy(KITCHEN_SINK))  # 63-character fullname, an existing ServiceAccount
    roles, bindings = _compat_roles(r)
    assert len(roles) == len(bindings) == 2
    for obj in roles + bindings:
        name = obj["metadata"]["name"]
        assert len(name) <= 63 and name.endswith("-router-compat"), name
    assert all(b["subjects"][0]["name"] == "existing" for b in bindings)


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

"""The Helm chart: gRPC TLS, the policy ConfigMap and its checksum, RBAC per pool namespace (see tests/helm/harness.py)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.policy import parse_policy
from gateway.providers.kubernetes_options import pool_options
from tests.helm.harness import (
    EXPECTED_RBAC_RULES, GRPC_TLS_DIR, expected_rbac_rules, namespace_modes, KUBE_VERSIONS, NAMESPACE, SCENARIOS, helm_python, kubernetes_validate,
    production_values, render, Rendered, role_rules, settings_from,
)

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
    settings = settings_from(r, monkeypatch)
    assert settings.grpc_tls_cert_file == Path(GRPC_TLS_DIR, "tls.crt")
    assert settings.grpc_tls_key_file == Path(GRPC_TLS_DIR, "tls.key")
    grpc_port = next(p for p in r.one("Service", r.fullname)["spec"]["ports"] if p["name"] == "grpc")
    assert "appProtocol" not in grpc_port, "TLS is not h2c"
    assert "TLS, Secret sgw-grpc-cert" in r.notes


def test_grpc_is_h2c_without_a_tls_secret(chart: helm_python.Chart, monkeypatch: pytest.MonkeyPatch) -> None:
    r = render(chart)
    assert not [v for v in r.pod["spec"]["volumes"] if v["name"] == "grpc-tls"]
    settings = settings_from(r, monkeypatch)
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
    modes = namespace_modes(r.policy_text)
    for role in roles:  # each grants what its namespace's pool modes call, no more
        # (a namespace that only rbac.extraNamespaces names gets every mode's rules)
        assert role_rules(role) == expected_rbac_rules(modes.get(role["metadata"]["namespace"], ("sandbox", "claim")))
    for binding in bindings:
        role_ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": roles[0]["metadata"]["name"]}
        assert binding["roleRef"] == role_ref
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": NAMESPACE}]
    assert not r.of_kind("ClusterRole") and not r.of_kind("ClusterRoleBinding")
    assert r.pod["spec"]["serviceAccountName"] == sa["metadata"]["name"]
    assert r.pod["spec"]["automountServiceAccountToken"] is True


def test_a_claim_only_namespace_cannot_create_or_delete_sandboxes(chart: helm_python.Chart) -> None:
    """Creating a Sandbox amounts to creating any pod: a namespace of claim pools gets sandboxclaims
    and only list, watch and patch (suspend, resume) on the Sandboxes its claims hold; an
    rbac.extraNamespaces namespace, whose pools the chart cannot see, gets every mode's rules."""
    r = render(chart, {"replicaCount": 1, "redis": {"embedded": {"enabled": False}}, "rbac": {"extraNamespaces": ["spare"]},
                       "policy": {"pools": {
                           "small": {"provider": "kubernetes", "kubernetes": {"namespace": "claims", "mode": "claim",
                                                                               "warm_pool": "w"}},
                           "shared": {"provider": "local"}}}})
    roles = {o["metadata"]["namespace"]: role_rules(o) for o in r.of_kind("Role")}
    assert roles["claims"] == {("agents.x-k8s.io", frozenset({"sandboxes"}), frozenset({"list", "watch", "patch"})),
                               ("extensions.agents.x-k8s.io", frozenset({"sandboxclaims"}),
                                frozenset({"get", "list", "watch", "create", "delete"}))}
    assert roles["spare"] == EXPECTED_RBAC_RULES


def test_no_rbac_and_no_token_without_kubernetes_pools(chart: helm_python.Chart) -> None:
    r = render(chart, {"replicaCount": 1, "redis": {"embedded": {"enabled": False}},
                       "policy": {"pools": {"small": {"provider": "local"}, "shared": {"provider": "local"}}}})
    assert not r.of_kind("Role") and not r.of_kind("RoleBinding")
    assert r.pod["spec"]["automountServiceAccountToken"] is False
    assert not any(e["name"] == "REDIS_URL" for e in r.container["env"])
    assert not r.of_kind("PodDisruptionBudget"), "no PDB for a single replica"

"""The Helm chart: the agent-sandbox router headers (routerCompat) (see tests/helm/harness.py)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml

from gateway.settings import Settings
from tests.helm.harness import (
    AUTH_KEYS_FILE, CHART, EXPECTED_LOCATOR_RULES, KITCHEN_SINK, expected_rbac_rules, namespace_modes, KUBE_VERSIONS, NAMESPACE,
    ROUTER_COMPAT, ROUTER_COMPAT_ENV, helm_python, kubernetes_validate, render, Rendered, role_rules,
    settings_from, suffixed, with_values,
)

# --------------------------------------------------------------------------------------
# agent-sandbox router headers (routerCompat)
# --------------------------------------------------------------------------------------

# A single replica with local pools only: no pool Roles, so every Role is a router-compat one.
NO_POOL_NAMESPACES: dict[str, Any] = {
    "replicaCount": 1, "redis": {"embedded": {"enabled": False}},
    "policy": {"pools": {"small": {"provider": "local"}}, "routing": {"prefix_pools": {"default": "small"}}},
}


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
        assert settings_from(r, monkeypatch).router_compat_namespaces == []
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
    settings = settings_from(r, monkeypatch)
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
        assert role_rules(role) == EXPECTED_LOCATOR_RULES
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
    assert role_rules(in_namespace[r.fullname]) == expected_rbac_rules(namespace_modes(r.policy_text)[NAMESPACE])
    assert role_rules(in_namespace[compat]) == EXPECTED_LOCATOR_RULES
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

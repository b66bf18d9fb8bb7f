"""The Helm chart: authentication (always an explicit mode and a key file), config and values schema (see tests/helm/harness.py)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.auth import issue_token, KeySet, TokenAuth
from gateway.providers.kubernetes_options import KubernetesPoolOptions
from gateway.settings import Settings
from routing.policy import OrgRule, PolicyDocument, PoolSpec, RoutingRules
from tests.helm.harness import (
    AUTH_KEYS_DIR, AUTH_KEYS_FILE, CHART, CHART_MANAGED_SETTINGS, GENERATED_KEYS, INLINE_KEYS,
    LIFECYCLE_POOL_OPTIONS, RELEASE, SCENARIOS, SECRET_AUTH, helm_python, render, Rendered, with_values,
)

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

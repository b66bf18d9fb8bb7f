"""Settings refuse the combinations that would leave a listening gateway open."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.settings import Settings

KEYS = Path("examples/auth/keys.yaml")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    import os

    for name in list(os.environ):
        if name.startswith("SANDBOX_GATEWAY_") or name in ("REDIS_URL", "PER_SESSION_SANDBOX_ORG_IDS"):
            monkeypatch.delenv(name)


@pytest.mark.parametrize(("fields", "fragment"), [
    pytest.param({"host": "0.0.0.0"}, "needs an explicit --auth-mode", id="off loopback, no mode"),
    pytest.param({"host": "0.0.0.0", "auth_mode": "trusted-headers"}, "control API",
                 id="off loopback, no keys: the control API would be open"),
    pytest.param({"host": "10.1.2.3", "auth_mode": "token"}, "needs --auth-keys", id="token without keys"),
    pytest.param({"router_compat_namespaces": ["agents"]}, "admin token", id="router headers without keys"),
    pytest.param({"host": "0.0.0.0", "auth_mode": "token", "auth_keys_file": KEYS}, "needs --allowed-hosts / SANDBOX_GATEWAY_ALLOWED_HOSTS",
                 id="off loopback, no allowed hosts: DNS rebinding"),
])
def test_refused(fields, fragment):
    with pytest.raises(ValidationError, match=fragment):
        Settings(**fields)


@pytest.mark.parametrize("fields", [
    pytest.param({}, id="the embedded default on loopback"),
    pytest.param({"host": "::1"}, id="IPv6 loopback"),
    pytest.param({"host": "0.0.0.0", "auth_mode": "trusted-headers", "auth_keys_file": KEYS, "allowed_hosts": ["gw"]},
                 id="keys guard the control API"),
    pytest.param({"host": "0.0.0.0", "auth_mode": "token", "auth_keys_file": KEYS, "allowed_hosts": ["*"]}, id="token mode"),
])
def test_accepted(fields):
    assert Settings(**fields).effective_auth_mode in ("token", "trusted-headers")


@pytest.mark.parametrize(("raw", "names"), [
    pytest.param("gw.example.com, .internal.example", ["gw.example.com", ".internal.example"], id="comma-separated"),
    pytest.param('["gw.example.com"]', ["gw.example.com"], id="JSON"),
    pytest.param("*", ["*"], id="any"),
])
def test_allowed_hosts_from_the_environment(monkeypatch, raw, names):
    monkeypatch.setenv("SANDBOX_GATEWAY_ALLOWED_HOSTS", raw)
    assert Settings().allowed_hosts == names

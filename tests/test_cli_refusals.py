"""What an operator reads when a command refuses its input: one line naming the flag and the
environment variable to change (never pydantic's field paths), and what is in force at startup.

The CLI runs as a real subprocess, as an operator runs it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.app import tenant_limits
from gateway.settings import Settings
from routing import default_policy
from tests.gateway_process import GatewayProcess

KEYS = Path(__file__).resolve().parents[1] / "examples" / "auth" / "keys.yaml"


def _clean_env(extra: dict[str, str]) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items()
           if not name.startswith("SANDBOX_GATEWAY_") and name not in ("REDIS_URL", "PER_SESSION_SANDBOX_ORG_IDS")}
    return {**env, **extra}


def _cli(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway.cli", *args], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path, env=_clean_env(env or {}))


REFUSALS = [
    pytest.param(["serve", "--host", "0.0.0.0"], {},
                 "listening on 0.0.0.0 needs an explicit --auth-mode / SANDBOX_GATEWAY_AUTH_MODE: 'token'",
                 id="off loopback without an auth mode: a check across settings names its flags"),
    pytest.param(["serve", "--host", "0.0.0.0", "--auth-mode", "token"], {},
                 "--auth-mode / SANDBOX_GATEWAY_AUTH_MODE 'token' needs --auth-keys / SANDBOX_GATEWAY_AUTH_KEYS_FILE",
                 id="token mode without keys"),
    pytest.param(["serve", "--host", "0.0.0.0", "--auth-mode", "token", "--auth-keys", "keys.yaml"], {},
                 "listening on 0.0.0.0 needs --allowed-hosts / SANDBOX_GATEWAY_ALLOWED_HOSTS: the host names",
                 id="off loopback without the names it answers for (DNS rebinding)"),
    pytest.param(["serve", "--data-port", "70000"], {},
                 "--data-port / SANDBOX_GATEWAY_DATA_PORT: must be less than or equal to 65535 (got 70000)",
                 id="a flag out of range"),
    pytest.param(["serve"], {"SANDBOX_GATEWAY_WORKERS": "many"},
                 "--workers / SANDBOX_GATEWAY_WORKERS: must be a number of worker processes from 1 to 64, or 'auto' "
                 "(got 'many')", id="an environment variable not a number"),
    pytest.param(["serve"], {"SANDBOX_GATEWAY_ROUTER_COMPAT_NAMESPACES": "agents"},
                 "SANDBOX_GATEWAY_ROUTER_COMPAT_NAMESPACES: must be a JSON list", id="a list setting that is not JSON"),
    pytest.param(["route", "--user", "u", "--session", "s"], {"SANDBOX_GATEWAY_SESSION_TTL": "soon"},
                 "SANDBOX_GATEWAY_SESSION_TTL: must be a valid number", id="route: a bad environment variable"),
    pytest.param(["check-policy", "{policy}"], {"SANDBOX_GATEWAY_SESSION_TTL": "-5"},
                 "--session-ttl / SANDBOX_GATEWAY_SESSION_TTL: must be greater than 0 (got '-5')",
                 id="check-policy: names its own flag for the setting"),
    pytest.param(["token", "issue", "--keys", str(KEYS), "--user", "u", "--ttl", "1y"], {},
                 "--ttl: must be a duration such as 30s, 10m or 1h (got '1y')", id="token issue: a bad --ttl"),
    pytest.param(["token", "issue", "--keys", "missing.yaml", "--user", "u"], {},
                 "--keys: cannot read missing.yaml", id="token issue: no key file"),
]


@pytest.mark.parametrize(("args", "env", "expected"), REFUSALS)
def test_a_refusal_is_one_line_naming_the_flag_and_variable(tmp_path: Path, args: list[str], env: dict[str, str],
                                                            expected: str) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("pools:\n  small: {}\n  shared: {}\n")
    result = _cli(tmp_path, *[a.replace("{policy}", str(policy)) for a in args], env=env)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"sandbox-gateway: error: {expected}"), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    for noise in ("Value error", "errors.pydantic.dev", "Traceback", "validation error", "auth_keys_file"):
        assert noise not in result.stderr


def test_tenant_limits_line_names_what_is_in_force() -> None:
    settings = Settings(org_rate_limit=50, max_streams_per_org=20, max_body_bytes=1_048_576)
    line = tenant_limits(settings, default_policy())
    assert line.startswith("tenant limits (per replica): org rate 50/s (burst 50), streams/org 20, body 1048576 B, "
                           "ws message unlimited, head 32768 B in 10s; sandbox caps (store-wide): ")
    assert "pool small unlimited" in line and "\n" not in line
    assert tenant_limits(Settings(), default_policy()).startswith(
        "tenant limits (per replica): org rate unlimited, streams/org unlimited, body unlimited")


async def test_the_startup_log_lists_the_tenant_limits(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("pools:\n  small: {max_sandboxes: 40}\n  shared: {}\n"
                      "orgs:\n  acme: {max_sandboxes: 3}\n")
    process = GatewayProcess(tmp_path / "gw", "--policy", str(policy),
                             env={"SANDBOX_GATEWAY_ORG_RATE_LIMIT": "7.5", "SANDBOX_GATEWAY_ORG_RATE_BURST": "15",
                                  "SANDBOX_GATEWAY_MAX_STREAMS_PER_ORG": "4"})
    await process.start()
    try:
        lines = [line for line in process.log if "tenant limits" in line]
    finally:
        assert await process.stop() == 0
    assert len(lines) == 1, process.log
    assert ("tenant limits (per replica): org rate 7.5/s (burst 15), streams/org 4, body unlimited, "
            "ws message unlimited, head 32768 B in 10s; sandbox caps (store-wide): pool small 40, "
            "pool shared unlimited, org acme 3") in lines[0]


def test_every_setting_is_named_by_the_variable_it_is_read_from() -> None:
    from pydantic import AliasChoices

    from gateway.settings import SERVE_FLAGS, env_var

    for name, field in Settings.model_fields.items():
        if isinstance(field.validation_alias, AliasChoices):
            assert env_var(name) in field.validation_alias.choices, name
        else:
            assert env_var(name) == "SANDBOX_GATEWAY_" + name.upper()
    assert set(SERVE_FLAGS) <= set(Settings.model_fields)


def test_a_broken_policy_is_reported_even_while_another_gateway_holds_the_ports(tmp_path: Path) -> None:
    """An operator's own ``serve`` holds 8080/8081/50051: a second one with a broken policy must say
    what is wrong with the policy, not that a port is taken (the policy is checked before any port)."""
    policy = tmp_path / "policy.yaml"
    policy.write_text("pools:\n  small: {max_sandboxes: lots}\n  shared: {}\n")
    with socket.socket() as held:  # stands in for the other gateway, on a port the kernel chose
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = str(held.getsockname()[1])
        result = _cli(tmp_path, "serve", "--policy", str(policy), "--data-port", port, "--control-port", port,
                      "--grpc-port", port, "--data-dir", str(tmp_path / "data"))
    assert result.returncode == 2, result.stderr
    assert "pools.small.max_sandboxes" in result.stderr, result.stderr
    assert "already in use" not in result.stderr and "Traceback" not in result.stderr


def test_the_published_example_keys_are_refused_off_loopback(tmp_path: Path) -> None:
    """The README's own line (``--host 0.0.0.0 --auth-keys examples/auth/keys.yaml``) would let anyone
    who has read the README mint an admin token; a copy of the file under another name is no better."""
    copy = tmp_path / "mine.yaml"
    copy.write_text(KEYS.read_text().replace("example-hs-1", "prod-1"))
    for keys in (KEYS, copy):
        result = _cli(tmp_path, "serve", "--host", "0.0.0.0", "--auth-mode", "token", "--auth-keys", str(keys),
                      "--data-port", "0", "--control-port", "0", "--grpc-port", "0",
                      env={"SANDBOX_GATEWAY_ALLOWED_HOSTS": "localhost"})
        assert result.returncode == 2, result.stderr
        assert "secret published in examples/auth/keys.yaml" in result.stderr, result.stderr
        assert "--allow-example-keys / SANDBOX_GATEWAY_ALLOW_EXAMPLE_KEYS" in result.stderr
        assert "serving" not in result.stderr


@pytest.mark.parametrize(("host", "secret", "demo", "refused"), [
    pytest.param("0.0.0.0", "change-me-change-me-change-me-change-me", False, True, id="example secret off loopback"),
    pytest.param("0.0.0.0", "change-me-change-me-change-me-change-me", True, False, id="a demo says so"),
    pytest.param("127.0.0.1", "change-me-change-me-change-me-change-me", False, False, id="loopback: the walkthrough"),
    pytest.param("0.0.0.0", "f" * 64, False, False, id="an operator's own secret"),
])
def test_which_key_files_may_serve_off_loopback(tmp_path: Path, host: str, secret: str, demo: bool,
                                                refused: bool) -> None:
    from gateway.app import example_keys_problem

    keys = tmp_path / "keys.yaml"
    keys.write_text(f"keys:\n  - {{kid: k1, alg: HS256, secret: '{secret}'}}\n")
    settings = Settings(host=host, auth_mode="token", auth_keys_file=keys, allow_example_keys=demo,
                        allowed_hosts=["localhost"])
    assert (example_keys_problem(settings) is not None) is refused


async def test_a_demo_off_loopback_starts_with_the_example_keys(tmp_path: Path) -> None:
    process = GatewayProcess(tmp_path / "gw", "--host", "0.0.0.0", "--auth-mode", "token", "--auth-keys", str(KEYS),
                             env={"SANDBOX_GATEWAY_ALLOW_EXAMPLE_KEYS": "1", "SANDBOX_GATEWAY_ALLOWED_HOSTS": "localhost"})
    await process.start()
    assert await process.stop() == 0

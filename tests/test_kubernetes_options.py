"""A Kubernetes pool's options: validated by the gateway (not by routing), with errors that name the
file and the field path, reported with every other error in the file at once (also by check-policy)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gateway.policy import parse_policy
from gateway.providers.kubernetes_options import pool_options
from routing import PolicyError
from routing import parse_policy as parse_routing_policy

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SOURCE = "policies/test.yaml"

K8S_SANDBOX_NO_TEMPLATE = """\
pools:
  small:
    provider: kubernetes
    kubernetes: {mode: sandbox, namespace: ns}
  shared: {}
"""


def errors_of(text: str) -> list[str]:
    with pytest.raises(PolicyError) as excinfo:
        parse_policy(text, SOURCE)
    for line in excinfo.value.errors:
        assert line.startswith(SOURCE + ": "), line
    return excinfo.value.errors


def test_kubernetes_example_has_a_sandbox_pool_and_a_claim_pool() -> None:
    path = EXAMPLES / "policy-kubernetes.yaml"
    policy = parse_policy(path.read_text(encoding="utf-8"), str(path))
    names = [name for name, pool in policy.pools.items() if pool.provider == "kubernetes"]
    k8s = pool_options(policy, names)
    assert sorted(opts.mode for opts in k8s.values()) == ["claim", "sandbox"]
    for opts in k8s.values():
        if opts.mode == "sandbox":
            assert opts.pod_template and opts.pod_template["spec"]["containers"]
        else:
            assert opts.template or opts.warm_pool


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        pytest.param(
            K8S_SANDBOX_NO_TEMPLATE, ["pools.small.kubernetes", "pod_template"], id="kubernetes mode sandbox without pod_template"
        ),
        pytest.param(
            "pools:\n  small: {provider: kubernetes, kubernetes: {mode: claim}}\n  shared: {}\n",
            ["pools.small.kubernetes", "v1beta1", "warm_pool"],
            id="kubernetes mode claim without warm_pool (v1beta1 by default)",
        ),
        pytest.param(
            "pools:\n  small: {provider: kubernetes, kubernetes: {mode: claim, api_version: v1alpha1, warm_pool: w}}\n"
            "  shared: {}\n",
            ["pools.small.kubernetes", "v1alpha1", "template"],
            id="kubernetes v1alpha1 claim without template",
        ),
        pytest.param(
            "pools:\n  small: {provider: kubernetes, kubernetes: {mode: claim, api_version: v1beta1, template: t}}\n"
            "  shared: {}\n",
            ["pools.small.kubernetes", "warm_pool"],
            id="kubernetes v1beta1 claim without warm_pool",
        ),
        pytest.param(
            "pools:\n  small: {provider: kubernetes, kubernetes: {mode: claim, template: t, api_version: v2}}\n  shared: {}\n",
            ["pools.small.kubernetes.api_version"],
            id="kubernetes unknown api_version",
        ),
        pytest.param(
            "pools:\n  small: {provider: kubernetes, kubernetes: {mode: claim, template: t, lifetime: soon}}\n  shared: {}\n",
            ["pools.small.kubernetes.lifetime", "duration"],
            id="kubernetes bad lifetime",
        ),
        pytest.param(
            "pools:\n  small: {provider: kubernetes, kubernetes: {mode: claim, template: t, colour: red}}\n  shared: {}\n",
            ["pools.small.kubernetes.colour", "Extra inputs"],
            id="kubernetes unknown key",
        ),
    ],
)
def test_invalid_kubernetes_options(text: str, fragments: list[str]) -> None:
    errors = errors_of(text)
    assert len(errors) == 1, errors
    for fragment in fragments:
        assert fragment in errors[0], (fragment, errors[0])


@pytest.mark.parametrize(("mode_fields", "refused"), [
    pytest.param("{mode: claim, warm_pool: w, template: t}", "template does not apply to mode 'claim' at api_version "
                 "v1beta1", id="a v1beta1 claim's template (dropped before)"),
    pytest.param("{mode: sandbox, pod_template: {}, warm_pool: w}", "warm_pool does not apply to mode 'sandbox'",
                 id="a sandbox pool's warm_pool"),
    pytest.param("{mode: claim, warm_pool: w, service: true}", "service does not apply to mode 'claim'",
                 id="a claim pool's service"),
])
def test_options_that_do_not_apply_are_refused_not_dropped(mode_fields: str, refused: str) -> None:
    [error] = errors_of(f"pools:\n  small: {{provider: kubernetes, kubernetes: {mode_fields}}}\n  shared: {{}}\n")
    assert error.startswith(f"{SOURCE}: pools.small.kubernetes: ") and refused in error, error


@pytest.mark.parametrize(("name", "suggested"), [
    pytest.param("GPU Pool", "gpu-pool", id="a space and capitals"),
    pytest.param("p" * 64, "p" * 63, id="longer than a label value"),
    pytest.param("-edge", "edge", id="starts with '-'"),
    pytest.param("gpu_pool", "gpu-pool", id="an underscore (a label value, not a DNS label)"),
])
def test_a_kubernetes_pool_name_that_cannot_be_a_label_value_is_refused(name: str, suggested: str) -> None:
    """Refused by the parse that check-policy and serve both run, naming the pool, instead of a 422 on
    every create. Other providers' pools keep any name."""
    text = (f"pools:\n  '{name}': {{provider: kubernetes, kubernetes: {{mode: claim, warm_pool: w}}}}\n"
            f"  shared: {{}}\n  'Local Pool': {{}}\nrouting: {{prefix_pools: {{default: shared}}}}\n")
    [error] = errors_of(text)
    assert error.startswith(f"{SOURCE}: pools.{name}: a kubernetes pool's name becomes a label value")
    assert repr(suggested) in error
    parse_policy(text.replace(f"'{name}'", "gpu-pool-1"), SOURCE)  # a DNS label is fine


BAD_EVERYWHERE = """\
pools:
  small: {provider: kubernetes, idle_timeout: 10x, kubernetes: {mode: claim, api_version: v2}}
  shared: {provider: kubernetes, kubernetes: {mode: sandbox}}
orgs:
  acme: {pool: nope}
"""


def test_kubernetes_errors_come_with_every_other_error() -> None:
    errors = errors_of(BAD_EVERYWHERE)
    for path in ("pools.small.idle_timeout", "pools.small.kubernetes.api_version", "pools.shared.kubernetes",
                 "orgs.acme.pool"):
        assert any(line.startswith(f"{SOURCE}: {path}:") for line in errors), (path, errors)
    assert len(errors) == 4, errors


def test_check_policy_reports_them_all(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(BAD_EVERYWHERE, encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "gateway.cli", "check-policy", str(policy)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert f"{policy}: pools.small.kubernetes.api_version:" in done.stderr
    assert f"{policy}: pools.shared.kubernetes: Value error, mode 'sandbox' needs pod_template" in done.stderr
    assert "4 error(s)" in done.stderr


def test_routing_holds_no_provider_configuration() -> None:
    """Routing keeps the section as the provider's own mapping and leaves it to the provider's check."""
    text = "pools:\n  small: {provider: kubernetes, kubernetes: {anything: [1, 2]}}\n  shared: {}\n"
    policy = parse_routing_policy(text, SOURCE)
    assert policy.pools["small"].kubernetes == {"anything": [1, 2]}
    seen: list[dict] = []
    with pytest.raises(PolicyError) as excinfo:
        parse_routing_policy(text, SOURCE, option_checks={"kubernetes": lambda s: seen.append(dict(s)) or [("x.y", "bad")]})
    assert seen == [{"anything": [1, 2]}]
    assert excinfo.value.errors == [f"{SOURCE}: pools.small.kubernetes.x.y: bad"]

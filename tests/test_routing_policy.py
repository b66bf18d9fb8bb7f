"""The routing policy: example files, the built-in default, the env merge, and
validation (every error names the source and the field path, all reported at once).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from pydantic import ValidationError

from routing import Policy, PolicyError, PoolSpec, default_policy, parse_org_list, parse_policy
from routing.policy import Isolation, RoutingRules, parse_duration

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SOURCE = "policies/test.yaml"

# A minimal valid document the invalid cases below start from.
BASE = """\
pools:
  small: {}
  shared: {}
"""


def load(name: str, extra: tuple[str, ...] = ()) -> Policy:
    path = EXAMPLES / name
    return parse_policy(path.read_text(encoding="utf-8"), str(path), extra)


def errors_of(text: str) -> list[str]:
    with pytest.raises(PolicyError) as excinfo:
        parse_policy(textwrap.dedent(text), SOURCE)
    errors = excinfo.value.errors
    assert errors, "a PolicyError must carry at least one error line"
    assert str(excinfo.value) == "\n".join(errors)
    for line in errors:
        assert line.startswith(SOURCE + ": "), line
    return errors


# --------------------------------------------------------------------------------------
# Example files
# --------------------------------------------------------------------------------------


def example_files() -> list[Path]:
    return sorted(EXAMPLES.glob("*.yaml"))


def test_examples_exist() -> None:
    names = {p.name for p in example_files()}
    assert {"policy.yaml", "policy-kubernetes.yaml"} <= names


@pytest.mark.parametrize("path", example_files(), ids=lambda p: p.name)
def test_every_example_parses(path: Path) -> None:
    policy = parse_policy(path.read_text(encoding="utf-8"), str(path))
    assert policy.source == str(path)
    assert policy.default_pool in policy.pools
    assert all(pool in policy.pools for pool in policy.prefix_pools.values())
    assert policy.summary().startswith(f"policy {path}:")


def test_laptop_example_exercises_every_feature() -> None:
    policy = load("policy.yaml")
    providers = {name: pool.provider for name, pool in policy.pools.items()}
    assert providers["small"] == "local"
    assert providers["shared"] == "local"
    assert "kubernetes" not in providers.values(), "the laptop example must not need a cluster"
    static = [pool for pool in policy.pools.values() if pool.provider == "static"]
    assert static and all(pool.upstreams for pool in static)
    assert policy.per_session_orgs
    assert policy.prefix_pools["ses"] == "small"
    assert policy.default_pool == "shared"
    assert set(policy.prefix_pools) - {"ses", "default"}, "a custom prefix mapping"
    rules = policy.orgs.values()
    assert any(r.isolation is Isolation.PER_SESSION for r in rules)
    assert any(r.isolation is Isolation.SHARED for r in rules)
    assert any(r.pool is not None for r in rules)
    assert any(r.max_sandboxes is not None for r in rules)


def test_laptop_example_values() -> None:
    policy = load("policy.yaml")
    assert policy.pools["small"].idle_timeout == 600.0
    assert policy.pools["small"].provisioning_timeout == 30.0
    assert policy.pools["shared"].idle_timeout == 1800.0
    assert policy.pools["bots"].idle_timeout == 5400.0
    assert policy.pools["bots"].provisioning_timeout == 90.0
    assert policy.per_session_orgs == frozenset({"org-a", "org-b"})


# --------------------------------------------------------------------------------------
# Default policy and the env merge
# --------------------------------------------------------------------------------------


def test_default_policy() -> None:
    policy = default_policy()
    assert set(policy.pools) == {"small", "shared"}
    assert all(pool.provider == "local" for pool in policy.pools.values())
    assert policy.per_session_orgs == frozenset()
    assert dict(policy.prefix_pools) == {"ses": "small", "default": "shared"}
    assert policy.default_pool == "shared"
    assert policy.orgs == {}
    assert policy.pools["small"].idle_timeout < policy.pools["shared"].idle_timeout
    assert policy.source == "<built-in default>"


def test_default_policy_takes_the_env_list() -> None:
    policy = default_policy(parse_org_list(" org-a , ,org-b "))
    assert policy.per_session_orgs == frozenset({"org-a", "org-b"})


def test_env_list_merges_with_the_file() -> None:
    text = BASE + "routing:\n  per_session_orgs: [' org-a ', org-b, '']\n"
    policy = parse_policy(text, SOURCE, parse_org_list("org-c, org-a"))
    assert policy.per_session_orgs == frozenset({"org-a", "org-b", "org-c"})


def test_env_wildcard_merges_with_the_file() -> None:
    policy = load("policy.yaml", tuple(parse_org_list("*")))
    assert "*" in policy.per_session_orgs
    assert {"org-a", "org-b"} <= policy.per_session_orgs


def test_missing_routing_section_uses_the_default_prefix_pools() -> None:
    policy = parse_policy(BASE, SOURCE)
    assert dict(policy.prefix_pools) == {"ses": "small", "default": "shared"}
    assert policy.per_session_orgs == frozenset()


def test_policy_document_is_immutable() -> None:
    policy = parse_policy(BASE, SOURCE)
    with pytest.raises(ValueError, match="frozen"):
        policy.pools["small"].max_sandboxes = 3  # type: ignore[misc]


# --------------------------------------------------------------------------------------
# Durations
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        pytest.param("30s", 30.0, id="30s"),
        pytest.param("10m", 600.0, id="10m"),
        pytest.param("1.5h", 5400.0, id="1.5h"),
        pytest.param(90, 90.0, id="int 90"),
        pytest.param(2.5, 2.5, id="float 2.5"),
        pytest.param("90", 90.0, id="string without unit"),
        pytest.param("500ms", 0.5, id="500ms"),
        pytest.param("1d", 86400.0, id="1d"),
        pytest.param(" 5 m ", 300.0, id="spaces"),
    ],
)
def test_parse_duration(value: object, seconds: float) -> None:
    assert parse_duration(value) == seconds


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("10x", id="unknown unit"),
        pytest.param("", id="empty"),
        pytest.param("-5s", id="negative string"),
        pytest.param(-1, id="negative number"),
        pytest.param(0, id="zero"),
        pytest.param("0s", id="zero with unit"),
        pytest.param(True, id="bool"),
        pytest.param(None, id="None"),
        pytest.param("1e3", id="exponent"),
        pytest.param("10 minutes", id="long unit"),
        pytest.param(float("nan"), id="NaN"),
    ],
)
def test_parse_duration_rejects(value: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(value)


@pytest.mark.parametrize(("value", "seconds"), [("30s", 30.0), ("10m", 600.0), ("1.5h", 5400.0), ("90", 90.0)])
def test_durations_in_a_document(value: str, seconds: float) -> None:
    policy = parse_policy(f"pools:\n  small: {{idle_timeout: {value}}}\n  shared: {{provisioning_timeout: {value}}}\n")
    assert policy.pools["small"].idle_timeout == seconds
    assert policy.pools["shared"].provisioning_timeout == seconds


def test_pool_defaults() -> None:
    pool = PoolSpec()
    assert pool.provider == "local"
    assert pool.max_sandboxes is None
    assert pool.idle_timeout == 1800.0
    assert pool.provisioning_timeout == 120.0


# --------------------------------------------------------------------------------------
# Invalid documents: one error each, naming the source and the field path
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        pytest.param(BASE + "bogus: 1\n", ["bogus", "Extra inputs"], id="unknown top-level key"),
        pytest.param("pools:\n  small: {sizee: 1}\n  shared: {}\n", ["pools.small.sizee", "Extra inputs"], id="unknown pool key"),
        pytest.param(
            "pools:\n  small: {idle_timeout: 10x}\n  shared: {}\n", ["pools.small.idle_timeout", "duration"], id="bad duration"
        ),
        pytest.param(
            "pools:\n  small: {}\n  shared: {provisioning_timeout: 0}\n",
            ["pools.shared.provisioning_timeout", "positive"],
            id="zero duration",
        ),
        pytest.param(
            "pools:\n  small: {idle_timeout: .nan}\n  shared: {}\n", ["pools.small.idle_timeout"], id="NaN duration"
        ),
        pytest.param(
            "pools:\n  small: {max_sandboxes: -1}\n  shared: {}\n",
            ["pools.small.max_sandboxes", "greater than or equal to 1"],
            id="negative max_sandboxes",
        ),
        pytest.param(
            "pools:\n  small: {max_sandboxes: 0}\n  shared: {}\n", ["pools.small.max_sandboxes"], id="zero max_sandboxes"
        ),
        pytest.param("pools:\n  small: {provider: docker}\n  shared: {}\n", ["pools.small.provider"], id="unknown provider"),
        pytest.param(
            "pools:\n  small: {provider: static}\n  shared: {}\n",
            ["pools.small", "static", "upstreams"],
            id="static without upstreams",
        ),
        pytest.param(
            "pools:\n  small: {provider: static, upstreams: []}\n  shared: {}\n",
            ["pools.small", "upstreams"],
            id="static with empty upstreams",
        ),
        pytest.param(
            "pools:\n  small: {provider: static, upstreams: ['ftp://h']}\n  shared: {}\n",
            ["pools.small", "upstreams", "ftp://h"],
            id="static with a non-http upstream",
        ),
        pytest.param(
            "pools:\n  small: {provider: static, upstreams: ['http://h', 'http://h']}\n  shared: {}\n",
            ["pools.small", "distinct"],
            id="static with duplicate upstreams",
        ),
        pytest.param(
            "pools:\n  small: {upstreams: ['http://h']}\n  shared: {}\n",
            ["pools.small", "upstreams", "local"],
            id="upstreams on a local pool",
        ),
        pytest.param(
            "pools:\n  small: {provider: kubernetes}\n  shared: {}\n",
            ["pools.small", "kubernetes section"],
            id="kubernetes without its section",
        ),
        pytest.param(
            BASE + "routing:\n  prefix_pools: {ses: tiny, default: shared}\n",
            ["routing.prefix_pools.ses", "'tiny'", "not defined"],
            id="prefix_pools naming a missing pool",
        ),
        pytest.param(
            BASE + "routing:\n  prefix_pools: {ses: small, default: huge}\n",
            ["routing.prefix_pools.default", "'huge'"],
            id="default naming a missing pool",
        ),
        pytest.param(
            BASE + "orgs:\n  acme: {pool: nope}\n",
            ["orgs.acme.pool", "'nope'", "not defined"],
            id="org override naming a missing pool",
        ),
        pytest.param(BASE + "orgs:\n  acme: {isolation: solo}\n", ["orgs.acme.isolation"], id="org override bad isolation"),
        pytest.param(BASE + "orgs:\n  acme: {max_sandboxes: 0}\n", ["orgs.acme.max_sandboxes"], id="org override zero cap"),
        pytest.param(BASE + "orgs:\n  acme: {color: red}\n", ["orgs.acme.color", "Extra inputs"], id="org override unknown key"),
        pytest.param(BASE + "orgs:\n  '*': {isolation: shared}\n", ["orgs.*", "per_session_orgs"], id="wildcard org override"),
        pytest.param(
            BASE + "routing:\n  prefix_pools: {xyz: small, default: shared}\n",
            ["routing", "prefix_pools", "'xyz'"],
            id="unknown prefix",
        ),
        pytest.param(
            BASE + "routing:\n  prefix_pools: {ses: small}\n", ["routing", "prefix_pools", "'default'"], id="missing default"
        ),
        pytest.param(
            BASE + "routing:\n  per_session_orgs: org-a\n", ["routing.per_session_orgs"], id="per_session_orgs not a list"
        ),
        pytest.param(BASE + "routing:\n  colour: 1\n", ["routing.colour", "Extra inputs"], id="unknown routing key"),
        pytest.param("routing: {}\n", ["pools", "required"], id="missing pools"),
        pytest.param("pools: [small, shared]\n", ["pools"], id="pools not a mapping"),
        pytest.param("- pools\n- routing\n", ["mapping"], id="not a mapping (list)"),
        pytest.param("just a string\n", ["mapping"], id="not a mapping (scalar)"),
        pytest.param("", ["mapping"], id="empty file"),
        pytest.param(
            "pools:\n  small: {}\n  shared: {a: b: c}\n", ["not valid YAML", "line 3"], id="invalid YAML with line number"
        ),
        pytest.param("pools:\n  small: {}\n\tshared: {}\n", ["not valid YAML", "line 3"], id="tab indentation with line number"),
        pytest.param("pools:\n  small: {}\n  small: {provider: local}\n", ["duplicate key 'small'", "line 3"],
                     id="a pool given twice"),
        pytest.param("pools: {small: {}, shared: {}}\norgs:\n  acme: {pool: small}\n  acme: {max_sandboxes: 2}\n",
                     ["duplicate key 'acme'", "line 4"], id="an org given twice (the first would be lost)"),
        pytest.param("pools:\n  ? [a]\n  : {}\n", ["unhashable key"], id="a list as a key"),
    ],
)
def test_invalid_document(text: str, fragments: list[str]) -> None:
    errors = errors_of(text)
    assert len(errors) == 1, errors
    for fragment in fragments:
        assert fragment in errors[0], (fragment, errors[0])


# --------------------------------------------------------------------------------------
# Several errors: all reported at once
# --------------------------------------------------------------------------------------


def test_all_schema_errors_reported_at_once() -> None:
    errors = errors_of(
        """\
        pools:
          small: {idle_timeout: 10x, max_sandboxes: 0}
          shared: {sizee: 1}
          fleet: {provider: static}
        orgs:
          acme: {isolation: solo}
        bogus: 1
        """
    )
    paths = [
        "pools.small.idle_timeout",
        "pools.small.max_sandboxes",
        "pools.shared.sizee",
        "pools.fleet",
        "orgs.acme.isolation",
        "bogus",
    ]
    assert len(errors) == len(paths), errors
    for path in paths:
        assert sum(f"{SOURCE}: {path}:" in line for line in errors) == 1, (path, errors)


def test_all_cross_reference_errors_reported_at_once() -> None:
    errors = errors_of(
        BASE
        + """\
routing:
  prefix_pools: {ses: tiny, bot: robots, default: shared}
orgs:
  acme: {pool: nope}
  beta: {pool: gone}
"""
    )
    for path in ("routing.prefix_pools.ses", "routing.prefix_pools.bot", "orgs.acme.pool", "orgs.beta.pool"):
        assert any(f"{SOURCE}: {path}:" in line for line in errors), (path, errors)
    assert len(errors) == 4, errors


def test_implicit_prefix_pools_checked_against_renamed_pools() -> None:
    errors = errors_of("pools:\n  a: {}\n  b: {}\n")
    assert errors == [
        f"{SOURCE}: routing.prefix_pools.ses: pool 'small' is not defined under pools",
        f"{SOURCE}: routing.prefix_pools.default: pool 'shared' is not defined under pools",
    ]


def test_schema_and_cross_reference_errors_reported_at_once() -> None:
    """A bad duration must not hide a dangling pool reference (fix one, find the next)."""
    errors = errors_of(
        """\
        pools:
          small: {idle_timeout: 10x}
          shared: {}
        orgs:
          acme: {pool: nope}
        """
    )
    assert any(f"{SOURCE}: pools.small.idle_timeout:" in line for line in errors), errors
    assert any(f"{SOURCE}: orgs.acme.pool:" in line for line in errors), errors


def test_routing_level_and_field_errors_reported_at_once() -> None:
    """Unknown prefixes and a missing default come with the field errors, not after them
    (a routing section with a bad field, or one bad prefix, hid the rest)."""
    errors = errors_of(
        """\
        pools:
          small: {max_sandboxes: 0}
        routing:
          per_session_orgs: org-a
          prefix_pools: {sess: small, bots: small, ses: nope}
        """
    )
    assert errors == [
        f"{SOURCE}: pools.small.max_sandboxes: Input should be greater than or equal to 1",
        f"{SOURCE}: routing.per_session_orgs: Input should be a valid list",
        f"{SOURCE}: routing.prefix_pools.sess: unknown prefix 'sess' (allowed: ses, org, usr, bot, ubt, default)",
        f"{SOURCE}: routing.prefix_pools.bots: unknown prefix 'bots' (allowed: ses, org, usr, bot, ubt, default)",
        f"{SOURCE}: routing.prefix_pools: needs a 'default' entry (the pool for every prefix not listed)",
        f"{SOURCE}: routing.prefix_pools.ses: pool 'nope' is not defined under pools",
    ]


def test_prefix_keys_checked_without_pools() -> None:
    errors = errors_of("routing: {prefix_pools: {xyz: a}}\n")
    assert [line.split(": ")[1] for line in errors] == ["pools", "routing.prefix_pools.xyz", "routing.prefix_pools"]


def test_routing_rules_built_directly_are_checked_too() -> None:
    """Only parse_policy hands the prefix checks to its raw pass; a model built in code checks itself."""
    with pytest.raises(ValidationError, match=r"unknown prefix 'xyz'.*needs a 'default' entry"):
        RoutingRules(prefix_pools={"xyz": "small"})

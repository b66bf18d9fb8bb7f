"""Placement: identity + policy -> sandbox ID, pool, isolation.

Org overrides win over the per-session list (and over ``*``), an org pool
override wins over the prefix mapping, and the prefix mapping is configurable.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing import (
    Identity,
    Isolation,
    Placement,
    Policy,
    default_policy,
    parse_policy,
    per_session_sandbox_id,
    place,
    pool_for,
    shared_sandbox_id,
)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "policy.yaml"

POLICY = """\
pools:
  small: {}
  shared: {}
  robots: {}
  vip: {max_sandboxes: 5}
routing:
  per_session_orgs: ["*"]
  prefix_pools: {ses: small, bot: robots, default: shared}
orgs:
  org-forced: {isolation: per_session}
  org-shared: {isolation: shared}
  org-vip: {pool: vip}
  org-vip-shared: {isolation: shared, pool: vip}
  org-capped: {max_sandboxes: 2}
"""


def policy_with(text: str, extra: tuple[str, ...] = ()) -> Policy:
    return parse_policy(text, "test.yaml", extra)


def ident(org: str | None = "org-x", user: str = "u1", session: str = "s1", bot: str | None = None) -> Identity:
    return Identity(user_id=user, session_id=session, org_id=org, bot_id=bot)


SES = per_session_sandbox_id


# --------------------------------------------------------------------------------------
# Org overrides
# --------------------------------------------------------------------------------------


def test_org_override_per_session_forces_ses_even_when_not_listed() -> None:
    policy = policy_with("pools: {small: {}, shared: {}}\norgs:\n  org-forced: {isolation: per_session}\n")
    assert policy.per_session_orgs == frozenset()
    assert place(ident("org-forced"), policy) == Placement(SES("s1"), "small", Isolation.PER_SESSION)
    # ... and only that org.
    assert place(ident("org-other"), policy) == Placement(shared_sandbox_id("org-other", "u1"), "shared", Isolation.SHARED)


def test_org_override_per_session_with_bot() -> None:
    policy = policy_with("pools: {small: {}, shared: {}}\norgs:\n  org-forced: {isolation: per_session}\n")
    placement = place(ident("org-forced", bot="reviewer"), policy)
    assert placement == Placement(SES("s1"), "small", Isolation.PER_SESSION)


@pytest.mark.parametrize(
    "extra",
    [pytest.param((), id="'*' in the file"), pytest.param(("*", "org-shared"), id="'*' and the org itself from the env")],
)
def test_shared_override_wins_over_wildcard(extra: tuple[str, ...]) -> None:
    policy = policy_with(POLICY, extra)
    assert place(ident("org-shared"), policy) == Placement(shared_sandbox_id("org-shared", "u1"), "shared", Isolation.SHARED)
    # Everyone else is per-session under '*'.
    assert place(ident("org-x"), policy).isolation is Isolation.PER_SESSION
    assert place(ident(None), policy).isolation is Isolation.PER_SESSION


def test_shared_override_wins_over_listing_the_org() -> None:
    policy = policy_with(
        "pools: {small: {}, shared: {}}\nrouting: {per_session_orgs: [org-a]}\norgs:\n  org-a: {isolation: shared}\n"
    )
    assert place(ident("org-a"), policy).sandbox_id == shared_sandbox_id("org-a", "u1")


@pytest.mark.parametrize(
    ("identity", "expected"),
    [
        pytest.param(
            ident("org-vip"), Placement(SES("s1"), "vip", Isolation.PER_SESSION), id="pool override, per-session via '*'"
        ),
        pytest.param(
            ident("org-vip-shared"),
            Placement(shared_sandbox_id("org-vip-shared", "u1"), "vip", Isolation.SHARED),
            id="pool override, shared",
        ),
        pytest.param(
            ident("org-vip-shared", bot="reviewer"),
            Placement(shared_sandbox_id("org-vip-shared", "u1", "reviewer"), "vip", Isolation.SHARED),
            id="pool override beats the bot prefix mapping",
        ),
        pytest.param(
            ident("org-capped"), Placement(SES("s1"), "small", Isolation.PER_SESSION), id="cap-only override changes nothing"
        ),
        pytest.param(ident("org-forced"), Placement(SES("s1"), "small", Isolation.PER_SESSION), id="forced per-session"),
    ],
)
def test_org_pool_overrides(identity: Identity, expected: Placement) -> None:
    assert place(identity, policy_with(POLICY)) == expected


def test_org_override_does_not_apply_to_personal_accounts() -> None:
    # A personal account has org None: no org rule can match it, even one keyed "None".
    policy = policy_with("pools: {small: {}, shared: {}}\norgs:\n  'None': {isolation: per_session}\n")
    assert place(ident(None), policy).isolation is Isolation.SHARED


def test_empty_org_is_an_org_for_overrides_but_usr_for_the_prefix() -> None:
    policy = policy_with("pools: {small: {}, shared: {}, other: {}}\norgs:\n  '': {pool: other}\n")
    placement = place(ident(""), policy)
    assert placement.sandbox_id.startswith("usr-")
    assert placement.pool == "other"


# --------------------------------------------------------------------------------------
# prefix_pools
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("identity", "pool"),
    [
        pytest.param(ident("org-x", bot="reviewer"), "robots", id="bot- -> third pool"),
        pytest.param(ident(None, bot="reviewer"), "shared", id="ubt- not mapped -> default"),
        pytest.param(ident("org-x"), "shared", id="org- -> default"),
        pytest.param(ident(None), "shared", id="usr- -> default"),
        pytest.param(ident("org-per-session"), "small", id="ses- -> small"),
        pytest.param(ident("org-per-session", bot="reviewer"), "small", id="per-session bot -> small, not robots"),
    ],
)
def test_custom_prefix_pools(identity: Identity, pool: str) -> None:
    policy = policy_with(
        "pools: {small: {}, shared: {}, robots: {}}\n"
        "routing: {per_session_orgs: [org-per-session], prefix_pools: {ses: small, bot: robots, default: shared}}\n"
    )
    assert place(identity, policy).pool == pool


def test_every_prefix_can_be_mapped() -> None:
    policy = policy_with(
        "pools: {p-ses: {}, p-org: {}, p-usr: {}, p-bot: {}, p-ubt: {}, p-def: {}}\n"
        "routing: {prefix_pools: {ses: p-ses, org: p-org, usr: p-usr, bot: p-bot, ubt: p-ubt, default: p-def}}\n"
    )
    assert pool_for(SES("s"), policy) == "p-ses"
    assert pool_for(shared_sandbox_id("o", "u"), policy) == "p-org"
    assert pool_for(shared_sandbox_id(None, "u"), policy) == "p-usr"
    assert pool_for(shared_sandbox_id("o", "u", "b"), policy) == "p-bot"
    assert pool_for(shared_sandbox_id(None, "u", "b"), policy) == "p-ubt"
    assert pool_for("o__u", policy) == "p-def"


def test_without_a_ses_mapping_per_session_sandboxes_go_to_the_default_pool() -> None:
    policy = policy_with("pools: {only: {}}\nrouting: {per_session_orgs: ['*'], prefix_pools: {default: only}}\n")
    assert place(ident("org-x"), policy) == Placement(SES("s1"), "only", Isolation.PER_SESSION)


# --------------------------------------------------------------------------------------
# The laptop example behaves as its comments say
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("identity", "isolation", "pool"),
    [
        pytest.param(ident("org-a"), Isolation.PER_SESSION, "small", id="listed org"),
        pytest.param(ident("org-b", bot="reviewer"), Isolation.PER_SESSION, "small", id="listed org with bot"),
        pytest.param(ident("org-secure"), Isolation.PER_SESSION, "small", id="forced per-session"),
        pytest.param(ident("org-trusted"), Isolation.SHARED, "shared", id="forced shared"),
        pytest.param(ident("org-fleet"), Isolation.SHARED, "fleet", id="static fleet org"),
        pytest.param(ident("org-x"), Isolation.SHARED, "shared", id="other org"),
        pytest.param(ident(None), Isolation.SHARED, "shared", id="personal"),
        pytest.param(ident("org-x", bot="reviewer"), Isolation.SHARED, "bots", id="org bot"),
        pytest.param(ident(None, bot="reviewer"), Isolation.SHARED, "bots", id="personal bot"),
    ],
)
def test_example_policy(identity: Identity, isolation: Isolation, pool: str) -> None:
    policy = parse_policy(EXAMPLE.read_text(encoding="utf-8"), str(EXAMPLE))
    placement = place(identity, policy)
    assert (placement.isolation, placement.pool) == (isolation, pool)


def test_example_policy_trusted_org_stays_shared_under_env_wildcard() -> None:
    policy = parse_policy(EXAMPLE.read_text(encoding="utf-8"), str(EXAMPLE), ["*"])
    assert place(ident("org-trusted"), policy).isolation is Isolation.SHARED
    assert place(ident("org-x"), policy).isolation is Isolation.PER_SESSION


def test_placement_as_dict() -> None:
    placement = place(ident("org-x"), default_policy(["org-x"]))
    assert placement.as_dict() == {"sandbox_id": SES("s1"), "pool": "small", "isolation": "per_session"}


# --------------------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------------------

PROPERTY_SETTINGS = settings(max_examples=300, deadline=None)
names = st.text(min_size=1, max_size=30)
identities = st.builds(
    Identity,
    user_id=names,
    session_id=names,
    org_id=st.none() | st.sampled_from(["org-a", "org-b", "org-forced", "org-shared", "org-vip", ""]) | names,
    bot_id=st.none() | names,
)


@PROPERTY_SETTINGS
@given(identity=identities)
def test_place_is_deterministic(identity: Identity) -> None:
    for policy in (default_policy(), default_policy(["org-a"]), policy_with(POLICY)):
        first = place(identity, policy)
        # Same identity rebuilt from its fields, and a policy parsed anew: same answer.
        again = place(Identity(identity.user_id, identity.session_id, identity.org_id, identity.bot_id), policy)
        assert first == again
        assert first.pool in policy.pools


@PROPERTY_SETTINGS
@given(identity=identities)
def test_place_is_deterministic_across_policy_reloads(identity: Identity) -> None:
    assert place(identity, policy_with(POLICY)) == place(identity, policy_with(POLICY))


@settings(max_examples=200, deadline=None)
@given(sessions=st.lists(st.text(min_size=1, max_size=40), min_size=2, max_size=200, unique=True))
def test_distinct_sessions_of_a_per_session_org_get_distinct_ids(sessions: list[str]) -> None:
    policy = default_policy(["org-a"])
    ids = [place(Identity(user_id="u", session_id=s, org_id="org-a"), policy).sandbox_id for s in sessions]
    assert len(set(ids)) == len(sessions)


def test_many_sequential_sessions_never_collide() -> None:
    policy = default_policy(["org-a"])
    sessions = (Identity(user_id="u", session_id=f"agent_session-{i}", org_id="org-a") for i in range(20_000))
    ids = {place(identity, policy).sandbox_id for identity in sessions}
    assert len(ids) == 20_000

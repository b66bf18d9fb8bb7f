"""Tenant security end to end: token auth on a real serve, hostile input, isolation properties."""

from __future__ import annotations

import json
import time
from pathlib import Path

import aiohttp
import jwt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.auth import ADMIN_AUDIENCE, KeySet, issue_token
from routing import Identity, InvalidIdentity, Isolation, default_policy, place
from tests.gateway_process import GatewayProcess

SECRET = "an-hs256-secret-of-at-least-32-bytes!!"


@pytest.fixture
async def token_gateway(tmp_path: Path):
    keys = tmp_path / "keys.yaml"
    keys.write_text(json.dumps({"keys": [{"kid": "k1", "alg": "HS256", "secret": SECRET}]}))
    process = await GatewayProcess(tmp_path / "gw", "--auth-mode", "token", "--auth-keys", str(keys),
                                   env={"PER_SESSION_SANDBOX_ORG_IDS": "org-a"}).start()
    yield process, KeySet.load(keys).first()
    await process.stop()


async def test_token_claims_win_and_credentials_never_reach_the_sandbox(token_gateway):
    gateway, key = token_gateway
    token = issue_token(key, user="alice", org="org-a")
    headers = {"Authorization": f"Bearer {token}", "X-Session-Id": "t1", "X-Org-Id": "org-b", "X-User-Id": "mallory"}
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{gateway.data_url}/echo/x", headers=headers) as response:
            assert response.status == 200, await response.text()
            seen = (await response.json())["headers"]
        assert seen["X-Sandbox-Id"] == place(Identity.parse(org_id="org-a", user_id="alice", session_id="t1"),
                                             default_policy(["org-a"])).sandbox_id
        lowered = {k.lower() for k in seen}
        assert not lowered & {"authorization", "x-org-id", "x-user-id", "x-session-id", "x-bot-id"}
        # the session is alice's: a token of another user in the same org gets 404, not the sandbox
        other = issue_token(key, user="bob", org="org-a")
        async with http.get(f"{gateway.data_url}/", headers={"Authorization": f"Bearer {other}",
                                                             "X-Session-Id": "t1"}) as response:
            assert response.status == 404


# Made at collection: the tokens that are not the expired one expire a day later, so each is refused for
# what its case says (forged, unknown kid), not for having expired while the suite ran.
@pytest.mark.parametrize("authorization", [
    pytest.param(None, id="no token"),
    pytest.param("Bearer " + jwt.encode({"sub": "u", "aud": "sandbox-gateway", "exp": int(time.time()) + 86400},
                                        "another-secret-another-secret-another", headers={"kid": "k1"}), id="forged"),
    pytest.param("Bearer " + jwt.encode({"sub": "u", "aud": "sandbox-gateway", "exp": int(time.time()) - 60},
                                        SECRET, headers={"kid": "k1"}), id="expired"),
    pytest.param("Bearer " + jwt.encode({"sub": "u", "aud": "sandbox-gateway", "exp": int(time.time()) + 86400},
                                        SECRET, headers={"kid": "k9"}), id="wrong kid"),
])
async def test_bad_tokens_are_401_and_create_nothing(token_gateway, authorization):
    gateway, _ = token_gateway
    headers = {"X-Session-Id": "t2", "X-User-Id": "u"} | ({"Authorization": authorization} if authorization else {})
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{gateway.data_url}/", headers=headers) as response:
            assert response.status == 401
            assert (await response.json())["error"]["code"] == "unauthorized"
        admin = issue_token(KeySet([_k()]).first(), user="ops", audience=ADMIN_AUDIENCE)
        listing = await http.get(f"{gateway.control_url}/v1/sandboxes", headers={"Authorization": f"Bearer {admin}"})
        assert (await listing.json())["sandboxes"] == []


def _k():
    from gateway.auth import Key

    return Key("k1", "HS256", SECRET.encode(), SECRET.encode())


async def test_control_api_needs_an_admin_token(token_gateway):
    gateway, key = token_gateway
    async with aiohttp.ClientSession() as http:
        assert (await http.get(f"{gateway.control_url}/v1/sandboxes")).status == 401
        data_token = issue_token(key, user="alice", org="org-a")
        assert (await http.get(f"{gateway.control_url}/v1/sandboxes",
                               headers={"Authorization": f"Bearer {data_token}"})).status == 401
        admin = issue_token(key, user="ops", audience=ADMIN_AUDIENCE)
        assert (await http.get(f"{gateway.control_url}/v1/sandboxes",
                               headers={"Authorization": f"Bearer {admin}"})).status == 200
        assert (await http.get(f"{gateway.control_url}/healthz")).status == 200  # probes stay open


def _valid_field(value: str) -> bool:
    """Whatever Identity.parse accepts (it alone says what an identity field may hold)."""
    try:
        Identity.parse(user_id=value, session_id="s")
    except InvalidIdentity:
        return False
    return True


identifiers = st.text(min_size=1, max_size=40).filter(_valid_field)
identities = st.builds(lambda o, u, s, b: Identity.parse(org_id=o, user_id=u, session_id=s, bot_id=b),
                       st.none() | identifiers, identifiers, identifiers, st.none() | identifiers)


def assert_shared_only_by_policy(first: Identity, second: Identity, per_session: tuple[str, ...]) -> None:
    policy = default_policy(per_session)
    pa, pb = place(first, policy), place(second, policy)
    if pa.sandbox_id != pb.sandbox_id:
        return
    if pa.isolation is Isolation.PER_SESSION:
        assert first.session_id == second.session_id  # one session, one sandbox
    else:
        assert first.owner_key() == second.owner_key()  # shared: the same org (or account), user and bot


@settings(max_examples=300, deadline=None)
@given(first=identities, second=identities, per_session=st.sampled_from([(), ("*",)]))
def test_identities_never_share_a_sandbox_unless_policy_says_so(first, second, per_session):
    assert_shared_only_by_policy(first, second, per_session)


def test_hundred_thousand_random_pairs_including_near_misses():
    """100,000 pairs, half of them differing in one field only: the pairs most likely to collide."""
    import random

    rng = random.Random(20261122)
    pool = ["a", "b", "org-a", "ORG-A", "org-a ", "Å", "Å", "user:x", "x__y", "", "7"]

    def pick() -> str:
        return rng.choice(pool) + (str(rng.randrange(50)) if rng.random() < 0.5 else "")

    for i in range(100_000):
        org = None if rng.random() < 0.3 else pick()
        first = Identity.parse(org_id=org, user_id=pick() or "u", session_id=pick() or "s",
                               bot_id=None if rng.random() < 0.6 else pick())
        if i % 2:
            fields = {"org_id": first.org_id, "user_id": first.user_id, "session_id": first.session_id,
                      "bot_id": first.bot_id}
            field = rng.choice(list(fields))
            fields[field] = (None if field in ("org_id", "bot_id") and rng.random() < 0.3 else pick()) or "z"
            second = Identity.parse(**fields)
        else:
            second = Identity.parse(org_id=None if rng.random() < 0.3 else pick(), user_id=pick() or "u",
                                    session_id=pick() or "s", bot_id=None if rng.random() < 0.6 else pick())
        assert_shared_only_by_policy(first, second, ("*",) if i % 3 == 0 else ("org-a",))


async def test_org_rate_limit_and_body_cap_on_a_real_serve(tmp_path):
    process = await GatewayProcess(tmp_path / "gw", env={"SANDBOX_GATEWAY_ORG_RATE_LIMIT": "0.01",
                                                         "SANDBOX_GATEWAY_ORG_RATE_BURST": "2",
                                                         "SANDBOX_GATEWAY_MAX_BODY_BYTES": "1000"}).start()
    try:
        async with aiohttp.ClientSession() as http:
            hdrs = {"X-Org-Id": "busy", "X-User-Id": "u", "X-Session-Id": "r1"}
            statuses = []
            for _ in range(3):
                async with http.get(f"{process.data_url}/", headers=hdrs) as response:
                    statuses.append(response.status)
                    if response.status == 429:
                        assert response.headers["Retry-After"]
                        assert (await response.json())["error"]["code"] == "capacity_exceeded"
            # A burst of 2, then limited. A token per 100 s: none comes back, however slow the first
            # request (it creates the sandbox) is on a loaded machine.
            assert statuses == [200, 200, 429]
            other = {"X-Org-Id": "calm", "X-User-Id": "u", "X-Session-Id": "r2"}
            async with http.post(f"{process.data_url}/echo/x", headers=other, data=b"x" * 1001) as response:
                assert response.status == 413
                assert (await response.json())["error"]["code"] == "payload_too_large"
            listing = await (await http.get(f"{process.control_url}/v1/sandboxes")).json()
            assert [s["sessions"] for s in listing["sandboxes"]] == [1]  # the 413 created nothing
    finally:
        await process.stop()

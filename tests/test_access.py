"""Sandbox access tokens (gateway/access.py): scoped to one sandbox, incarnation, ports and expiry."""

from __future__ import annotations

import json

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from gateway.access import ACCESS_AUDIENCE, AccessTokens, Refusal, incarnation_of
from gateway.auth import ADMIN_AUDIENCE, DATA_AUDIENCE, Key, KeySet, TokenAuth, issue_token
from gateway.errors import BadRequest, Forbidden, GatewayError, Unauthorized
from routing.ports import PortSet
from tests.clock import T0, FakeClock

SECRET = b"0123456789abcdef0123456789abcdef"
OTHER_SECRET = b"fedcba9876543210fedcba9876543210"
A = "usr-" + "a" * 48
B = "usr-" + "b" * 48
INC = incarnation_of(T0)


def hs(kid: str, secret: bytes = SECRET) -> Key:
    return Key(kid, "HS256", secret, secret)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def tokens(clock) -> AccessTokens:
    return AccessTokens(KeySet([hs("k1")]), max_ttl=3600, clock=clock)


def refusal(excinfo: pytest.ExceptionInfo[GatewayError]) -> tuple[int, str]:
    return excinfo.value.status, excinfo.value.code


def test_minted_token_carries_its_scope(tokens, clock):
    token = tokens.mint(A, INC, PortSet.parse([8888, "3000-3999"]), ttl=600)
    claims = tokens.verify(token)
    assert (claims.sandbox_id, claims.incarnation, claims.expires) == (A, INC, T0 + 600)
    claims.check(A, 8888)
    claims.check(A, 3456)
    claims.check_incarnation(INC)
    header = jwt.get_unverified_header(token)
    assert header["kid"] == "k1" and header["alg"] == "HS256"
    assert jwt.decode(token, SECRET, algorithms=["HS256"], audience=ACCESS_AUDIENCE,
                      options={"verify_exp": False})["ports"] == ["3000-3999", 8888]


def test_token_for_one_sandbox_is_refused_on_another(tokens):
    claims = tokens.verify(tokens.mint(A, INC, PortSet.single(8888)))
    with pytest.raises(Forbidden) as excinfo:
        claims.check(B, 8888)
    assert refusal(excinfo) == (403, Refusal.WRONG_SANDBOX)


def test_port_outside_the_token_is_refused_naming_its_ports(tokens):
    claims = tokens.verify(tokens.mint(A, INC, PortSet.parse([8888, "3000-3999"])))
    with pytest.raises(Forbidden) as excinfo:
        claims.check(A, 22)
    assert refusal(excinfo) == (403, Refusal.PORT)
    assert "3000-3999, 8888" in excinfo.value.message


def test_recreated_sandbox_refuses_an_old_token(tokens):
    claims = tokens.verify(tokens.mint(A, incarnation_of(T0), PortSet.single(8888)))
    with pytest.raises(Unauthorized) as excinfo:
        claims.check_incarnation(incarnation_of(T0 + 0.001))  # re-created a millisecond later
    assert refusal(excinfo) == (401, Refusal.STALE)


def test_expired_token_is_refused_even_from_the_cache(tokens, clock):
    token = tokens.mint(A, INC, PortSet.single(8888), ttl=60)
    tokens.verify(token)  # cached now
    clock.advance(60 + 5)  # past expiry and the leeway
    with pytest.raises(Unauthorized) as excinfo:
        tokens.verify(token)
    assert refusal(excinfo) == (401, Refusal.EXPIRED)
    fresh = AccessTokens(KeySet([hs("k1")]), max_ttl=3600, clock=clock)  # never saw it: the codec's check
    with pytest.raises(Unauthorized) as excinfo:
        fresh.verify(token)
    assert refusal(excinfo) == (401, Refusal.EXPIRED)


@pytest.mark.parametrize("ttl", [0, -5, 3601])
def test_ttl_is_bounded_by_the_setting(tokens, ttl):
    with pytest.raises(BadRequest) as excinfo:
        tokens.mint(A, INC, PortSet.single(8888), ttl=ttl)
    assert excinfo.value.code == "invalid_ttl"
    assert "ttl" in excinfo.value.message and "access_token_max_ttl" in excinfo.value.message


def test_default_ttl_never_exceeds_the_maximum(clock):
    short = AccessTokens(KeySet([hs("k1")]), max_ttl=120, clock=clock)
    assert short.verify(short.mint(A, INC, PortSet.single(8888))).expires == T0 + 120


def test_keys_rotate_by_kid(clock):
    old = AccessTokens(KeySet([hs("old")]), max_ttl=3600, clock=clock)
    token = old.mint(A, INC, PortSet.single(8888))
    rotated = AccessTokens(KeySet([hs("new", OTHER_SECRET), hs("old")]), max_ttl=3600, clock=clock)
    assert rotated.verify(token).sandbox_id == A  # the old key still verifies what it signed
    assert jwt.get_unverified_header(rotated.mint(A, INC, PortSet.single(8888)))["kid"] == "new"
    retired = AccessTokens(KeySet([hs("new", OTHER_SECRET)]), max_ttl=3600, clock=clock)
    with pytest.raises(Unauthorized) as excinfo:
        retired.verify(token)
    assert refusal(excinfo) == (401, Refusal.INVALID)


def test_verify_only_keys_cannot_mint(clock):
    public = ed25519.Ed25519PrivateKey.generate().public_key()
    tokens = AccessTokens(KeySet([Key("ed", "EdDSA", public)]), max_ttl=3600, clock=clock)
    assert not tokens.can_mint
    with pytest.raises(BadRequest) as excinfo:
        tokens.mint(A, INC, PortSet.single(8888))
    assert "auth_keys_file" in excinfo.value.message


def test_signed_by_an_asymmetric_key_verifies_with_its_public_half(clock):
    private = ed25519.Ed25519PrivateKey.generate()
    signer = AccessTokens(KeySet([Key("ed", "EdDSA", private.public_key(), private)]), max_ttl=60, clock=clock)
    token = signer.mint(A, INC, PortSet.single(8888))
    pem = private.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    verifier = AccessTokens(KeySet([Key("ed", "EdDSA", jwt.get_algorithm_by_name("EdDSA").prepare_key(pem))]),
                            max_ttl=60, clock=clock)
    assert verifier.verify(token).sandbox_id == A


def test_bearer_and_admin_tokens_are_not_access_tokens_and_back(tokens, clock):
    key = hs("k1")
    for audience in (DATA_AUDIENCE, ADMIN_AUDIENCE):
        bearer = issue_token(key, user="alice", audience=audience, now=clock())
        with pytest.raises(Unauthorized) as excinfo:
            tokens.verify(bearer)
        assert refusal(excinfo) == (401, Refusal.INVALID)
    access = tokens.mint(A, INC, PortSet.single(8888))
    with pytest.raises(Unauthorized):
        TokenAuth(KeySet([key]), clock=clock).claims(f"Bearer {access}")


@pytest.mark.parametrize("claims", [
    pytest.param({"sbx": A, "inc": INC, "ports": "8888"}, id="ports not a list"),
    pytest.param({"sbx": A, "inc": INC, "ports": [70000]}, id="port out of range"),
    pytest.param({"sbx": A, "inc": 5, "ports": [8888]}, id="incarnation not a string"),
    pytest.param({"sbx": ["x"], "inc": INC, "ports": [8888]}, id="sandbox not a string"),
    pytest.param({"inc": INC, "ports": [8888]}, id="no sandbox"),
])
def test_malformed_claims_are_refused(tokens, clock, claims):
    token = jwt.encode({"aud": ACCESS_AUDIENCE, "exp": int(clock() + 60), **claims}, SECRET, algorithm="HS256",
                       headers={"kid": "k1"})
    with pytest.raises(Unauthorized) as excinfo:
        tokens.verify(token)
    assert refusal(excinfo) == (401, Refusal.INVALID)


@pytest.mark.parametrize("token", ["", "not-a-jwt", "a.b.c"])
def test_garbage_is_refused(tokens, token):
    with pytest.raises(Unauthorized) as excinfo:
        tokens.verify(token)
    assert refusal(excinfo) == (401, Refusal.INVALID)


def test_forged_signature_is_refused(tokens, clock):
    forged = jwt.encode({"aud": ACCESS_AUDIENCE, "sbx": A, "inc": INC, "ports": [8888], "exp": int(clock() + 60)},
                        OTHER_SECRET, algorithm="HS256", headers={"kid": "k1"})
    with pytest.raises(Unauthorized) as excinfo:
        tokens.verify(forged)
    assert refusal(excinfo) == (401, Refusal.INVALID)


@pytest.mark.parametrize("items, expected", [
    pytest.param([8888], [8888], id="one port"),
    pytest.param([8888, "3000-3999"], ["3000-3999", 8888], id="sorted"),
    pytest.param(["3000-3100", "3050-3200", 3201], ["3000-3201"], id="overlaps and neighbours merge"),
    pytest.param(["80"], [80], id="a port as a string"),
])
def test_port_sets_parse_and_merge(items, expected):
    assert PortSet.parse(items).to_list() == expected


@pytest.mark.parametrize("items", [[], [0], [65536], ["3999-3000"], ["a-b"], [True], [8.5], "8888", [None]])
def test_bad_port_sets_are_refused(items):
    with pytest.raises(ValueError):
        PortSet.parse(items)


def test_port_subsets():
    pool = PortSet.parse([8888, "3000-3999"])
    assert PortSet.parse(["3000-3010", 8888]).issubset(pool)
    assert not PortSet.parse(["3990-4000"]).issubset(pool)
    assert not PortSet.single(22).issubset(pool)


def test_incarnation_is_stable_and_distinct():
    assert incarnation_of(T0) == incarnation_of(float(json.loads(json.dumps(T0))))
    assert incarnation_of(T0) != incarnation_of(T0 + 1e-6)

"""Token and header authentication: forged, expired, wrong-key and confused tokens are 401."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

from gateway.auth import ADMIN_AUDIENCE, Key, KeySet, TokenAuth, TrustedHeaders, issue_token
from gateway.errors import BadRequest, Unauthorized
from tests.clock import FakeClock

SECRET = b"0123456789abcdef0123456789abcdef"


def pem_pair(private) -> tuple[bytes, bytes]:
    return (private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()),
            private.public_key().public_bytes(serialization.Encoding.PEM,
                                              serialization.PublicFormat.SubjectPublicKeyInfo))


@pytest.fixture(scope="module")
def keyfile(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("keys")
    rsa_priv, rsa_pub = pem_pair(rsa.generate_private_key(public_exponent=65537, key_size=2048))
    ed_priv, ed_pub = pem_pair(ed25519.Ed25519PrivateKey.generate())
    for name, data in {"rsa.pem": rsa_priv, "rsa.pub": rsa_pub, "ed.pem": ed_priv, "ed.pub": ed_pub}.items():
        (folder / name).write_bytes(data)
    (folder / "keys.yaml").write_text(json.dumps({"keys": [
        {"kid": "hs-1", "alg": "HS256", "secret": SECRET.decode()},
        {"kid": "rs-1", "alg": "RS256", "public_key_file": "rsa.pub", "private_key_file": "rsa.pem"},
        {"kid": "ed-1", "alg": "EdDSA", "public_key_file": "ed.pub", "private_key_file": "ed.pem"},
    ]}))
    return folder / "keys.yaml"


@pytest.fixture(scope="module")
def keys(keyfile) -> KeySet:
    return KeySet.load(keyfile)


@pytest.mark.parametrize("kid", ["hs-1", "rs-1", "ed-1"])
def test_valid_token_of_every_algorithm(keys, kid):
    token = issue_token(keys.get(kid), user="alice", org="org-a", bot="reviewer")
    identity = TokenAuth(keys).identify(None, None, "s1", None, f"Bearer {token}")
    assert (identity.org_id, identity.user_id, identity.bot_id, identity.session_id) == ("org-a", "alice", "reviewer", "s1")


def test_claims_win_over_headers(keys):
    token = issue_token(keys.get("hs-1"), user="alice", org="org-a")
    identity = TokenAuth(keys).identify("org-b", "mallory", "s1", "evil-bot", f"Bearer {token}")
    assert (identity.org_id, identity.user_id, identity.bot_id) == ("org-a", "alice", None)


def test_rotation_two_kids_both_verify(keys):
    auth = TokenAuth(keys)
    for kid in ("hs-1", "rs-1"):
        assert auth.identify(None, None, "s", None, f"Bearer {issue_token(keys.get(kid), user='u')}").user_id == "u"


def _forge(claims: dict, key, alg: str, kid: str) -> str:
    return jwt.encode(claims, key, algorithm=alg, headers={"kid": kid})


def _unsigned(claims: dict, kid: str) -> str:
    segment = lambda data: base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()  # noqa: E731
    return f"{segment({'alg': 'none', 'typ': 'JWT', 'kid': kid})}.{segment(claims)}."


# Made at collection: its expiry is a day away, not minutes, so that however long the suite runs before
# this file, a case that must fail for its audience or its claims does not fail for its expiry instead.
GOOD = {"sub": "alice", "org": "org-a", "aud": "sandbox-gateway", "exp": int(time.time()) + 86400}


@pytest.mark.parametrize(("make", "fragment"), [
    pytest.param(lambda k: None, "Bearer", id="no Authorization header"),
    pytest.param(lambda k: "Basic YTpi", "Bearer", id="wrong scheme"),
    pytest.param(lambda k: "Bearer not-a-jwt", "malformed", id="malformed token"),
    pytest.param(lambda k: "Bearer " + _forge(GOOD, b"another-secret-another-secret-xx", "HS256", "hs-1"), "signature", id="forged HS256 signature"),
    pytest.param(lambda k: "Bearer " + _forge(GOOD, SECRET, "HS256", "nope"), "kid", id="unknown kid"),
    pytest.param(lambda k: "Bearer " + _forge({**GOOD, "exp": int(time.time()) - 3600}, SECRET, "HS256", "hs-1"), "expired", id="expired"),
    pytest.param(lambda k: "Bearer " + _forge({**GOOD, "aud": "someone-else"}, SECRET, "HS256", "hs-1"), "audience", id="wrong audience"),
    pytest.param(lambda k: "Bearer " + _forge({k2: v for k2, v in GOOD.items() if k2 != "exp"}, SECRET, "HS256", "hs-1"), "invalid", id="no exp"),
    pytest.param(lambda k: "Bearer " + _unsigned(GOOD, "hs-1"), "invalid", id="alg none"),
    pytest.param(lambda k: "Bearer " + _forge(GOOD, SECRET, "HS256", "rs-1"), "invalid",
                 id="alg confusion: HS256 under an RS256 kid"),
    pytest.param(lambda k: "Bearer " + _forge({**GOOD, "org": 7}, SECRET, "HS256", "hs-1"), "strings", id="non-string org claim"),
    pytest.param(lambda k: "Bearer " + issue_token(k.get("hs-1"), user="u", audience=ADMIN_AUDIENCE), "audience", id="admin token on the data plane"),
])
def test_bad_tokens_are_401(keys, make, fragment):
    with pytest.raises(Unauthorized) as info:
        TokenAuth(keys).identify(None, None, "s1", None, make(keys))
    assert info.value.status == 401 and fragment in info.value.message


def test_cached_token_still_expires(keys):
    clock = FakeClock(time.time())
    auth = TokenAuth(keys, clock=clock, leeway=0)
    token = issue_token(keys.get("hs-1"), user="u", ttl=60)
    assert auth.identify(None, None, "s", None, f"Bearer {token}").user_id == "u"
    clock.advance(120)
    with pytest.raises(Unauthorized, match="expired"):
        auth.identify(None, None, "s", None, f"Bearer {token}")


def test_token_needs_a_valid_session_header(keys):
    token = issue_token(keys.get("hs-1"), user="u")
    with pytest.raises(BadRequest, match="X-Session-Id"):
        TokenAuth(keys).identify(None, None, None, None, f"Bearer {token}")


def test_trusted_headers_name_the_bad_header():
    with pytest.raises(BadRequest, match="X-User-Id: is required"):
        TrustedHeaders().identify("o", None, "s", None, None)
    assert TrustedHeaders().identify(None, "u", "s", "", "Bearer ignored").bot_id is None


@pytest.mark.parametrize("entry", [
    pytest.param({"kid": "k", "alg": "HS256", "secret": "short"}, id="short HS256 secret"),
    pytest.param({"kid": "k", "alg": "none", "secret": "x" * 40}, id="alg none"),
    pytest.param({"kid": "k", "alg": "RS256"}, id="RS256 without a public key"),
    pytest.param({"alg": "HS256", "secret": "x" * 40}, id="no kid"),
])
def test_bad_key_files_are_refused(tmp_path, entry):
    path = tmp_path / "keys.yaml"
    path.write_text(json.dumps({"keys": [entry]}))
    with pytest.raises(ValueError):
        KeySet.load(path)


def test_key_without_private_part_cannot_issue(keyfile, tmp_path):
    data = json.loads(keyfile.read_text())
    data["keys"] = [{k: v for k, v in data["keys"][1].items() if k != "private_key_file"}]
    path = keyfile.parent / "public-only.yaml"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="no private key"):
        issue_token(KeySet.load(path).first(), user="u")
    assert Key("k", "HS256", SECRET, SECRET).sign == SECRET

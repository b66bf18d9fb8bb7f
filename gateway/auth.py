"""Who is calling: the identity from trusted headers, or from a signed token.

Two modes, chosen by settings (``auth_mode``):

``trusted-headers``
    ``X-Org-Id``, ``X-User-Id``, ``X-Session-Id``, ``X-Bot-Id`` are believed as
    sent. Only safe behind an agent backend on a private network, so it must be
    chosen explicitly, except by the embedded default listening on loopback.
``token``
    ``Authorization: Bearer <JWT>`` carries ``org`` (optional), ``sub`` (the
    user), ``bot`` (optional) and ``exp``; the session still comes from
    ``X-Session-Id``. The token's claims always win over identity headers,
    which are then ignored. Keys carry a ``kid`` so they rotate without
    downtime: publish the new key next to the old one, switch the issuers,
    retire the old key once its tokens have expired. The algorithm is pinned
    per key, so a token cannot choose how it is checked (no ``alg`` confusion,
    no ``none``).

Verified tokens are cached until they expire (bounded), so the hot path pays
one signature check per token, not per request.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import jwt
import yaml

from gateway.errors import BadRequest, Unauthorized
from routing import Identity, InvalidIdentity

DATA_AUDIENCE = "sandbox-gateway"
ADMIN_AUDIENCE = "sandbox-gateway-admin"
ALGORITHMS = ("HS256", "RS256", "EdDSA")
_HEADER_OF = {"org_id": "X-Org-Id", "user_id": "X-User-Id", "session_id": "X-Session-Id", "bot_id": "X-Bot-Id"}
_CACHE_LIMIT = 10_000


class Authenticator(Protocol):
    # True when the identity depends only on the header bytes (so a connection may reuse it);
    # False for tokens, which expire.
    memoizable: bool

    def identify(self, org: str | None, user: str | None, session: str | None, bot: str | None,
                 authorization: str | None) -> Identity:
        """The caller's identity; ``BadRequest`` names a bad header, ``Unauthorized`` a bad token."""


def parse_headers(org: str | None, user: str | None, session: str | None, bot: str | None) -> Identity:
    try:
        return Identity.parse(org_id=org, user_id=user, session_id=session, bot_id=bot)
    except InvalidIdentity as exc:
        raise BadRequest(f"{_HEADER_OF[exc.field]}: {exc.reason}", code="invalid_identity") from None


class TrustedHeaders:
    """Believes the identity headers: for a private network behind an agent backend."""

    memoizable = True

    def identify(self, org: str | None, user: str | None, session: str | None, bot: str | None,
                 authorization: str | None) -> Identity:
        return parse_headers(org, user, session, bot)


@dataclass(frozen=True, slots=True)
class Key:
    kid: str
    alg: str
    verify: Any          # secret bytes or a public key object
    sign: Any = None     # secret bytes or a private key object (only where tokens are issued)


PUBLISHED_SECRETS = frozenset({b"change-me-change-me-change-me-change-me"})
"""Secrets published in this repository (examples/auth/keys.yaml): anyone who has read the README
can sign any token with them, so ``serve`` refuses them off loopback unless told it is a demo."""


class KeySet:
    """Signing keys by ``kid``; loaded from a YAML/JSON file (see ``examples/auth/keys.yaml``)."""

    def __init__(self, keys: Iterable[Key]) -> None:
        self._keys = {key.kid: key for key in keys}
        if not self._keys:
            raise ValueError("the key set is empty")

    def get(self, kid: str | None) -> Key | None:
        return self._keys.get(kid) if kid is not None else None

    def first(self) -> Key:
        return next(iter(self._keys.values()))

    def published(self) -> list[str]:
        """The kids of keys whose secret is one of the ``PUBLISHED_SECRETS``."""
        return [kid for kid, key in self._keys.items() if isinstance(key.verify, bytes)
                and key.verify in PUBLISHED_SECRETS]

    def signer(self) -> Key | None:
        """The key the gateway signs its own tokens with (sandbox access tokens): the first in the
        file that has a secret or private key. To rotate, put the new key first and keep the old
        one (verify-only is enough) until its tokens have expired."""
        return next((key for key in self._keys.values() if key.sign is not None), None)

    @classmethod
    def load(cls, path: Path) -> KeySet:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
        if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
            raise ValueError(f"{path}: expected a mapping with a 'keys' list")
        return cls(_load_key(path.parent, entry, index) for index, entry in enumerate(document["keys"]))


def _load_key(base: Path, entry: Any, index: int) -> Key:
    where = f"keys[{index}]"
    if not isinstance(entry, dict) or not isinstance(entry.get("kid"), str) or entry.get("alg") not in ALGORITHMS:
        raise ValueError(f"{where}: needs a string kid and alg one of {', '.join(ALGORITHMS)}")
    alg = entry["alg"]

    def read(name: str) -> bytes | None:
        if name in entry:
            return str(entry[name]).encode()
        if f"{name}_file" in entry:
            return (base / entry[f"{name}_file"]).read_bytes()
        return None

    if alg == "HS256":
        secret = read("secret")
        if secret is None or len(secret) < 32:
            raise ValueError(f"{where}: HS256 needs a secret (or secret_file) of at least 32 bytes")
        return Key(entry["kid"], alg, secret, secret)
    public, private = read("public_key"), read("private_key")
    if public is None:
        raise ValueError(f"{where}: {alg} needs public_key or public_key_file")
    algorithm = jwt.get_algorithm_by_name(alg)
    return Key(entry["kid"], alg, algorithm.prepare_key(public), algorithm.prepare_key(private) if private else None)


def bearer_token(authorization: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` value, or ``Unauthorized``.

    The scheme is case-insensitive (RFC 9110 section 11.1: ``bearer``, ``BEARER``), and one or
    more spaces may follow it; the token itself is taken as sent.
    """
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized("an Authorization: Bearer <token> header is required")
    return token


class TokenAuth:
    """Verifies bearer JWTs; claims win over headers, the session comes from ``X-Session-Id``."""

    memoizable = False  # a token expires: every request is checked (against the verified-token cache)

    def __init__(self, keys: KeySet, *, audience: str = DATA_AUDIENCE, clock: Callable[[], float] = time.time,
                 leeway: float = 5.0) -> None:
        self._keys = keys
        self._audience = audience
        self._clock = clock
        self._leeway = leeway
        self._cache: dict[str, tuple[str | None, str, str | None, float]] = {}

    def claims(self, authorization: str | None) -> tuple[str | None, str, str | None]:
        """(org, user, bot) from a valid token, or ``Unauthorized`` saying what is wrong."""
        token = bearer_token(authorization)
        now = self._clock()
        cached = self._cache.get(token)
        if cached is not None:
            if cached[3] + self._leeway > now:
                return cached[0], cached[1], cached[2]
            del self._cache[token]
            raise Unauthorized("the token has expired")
        org, user, bot, expires = self._verify(token, now)
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.pop(next(iter(self._cache)))
        self._cache[token] = (org, user, bot, expires)
        return org, user, bot

    def _verify(self, token: str, now: float) -> tuple[str | None, str, str | None, float]:
        claims = decode_token(self._keys, token, audience=self._audience, leeway=self._leeway, require=("exp", "sub"))
        expires = float(claims["exp"])
        if expires + self._leeway <= now:
            raise Unauthorized("the token has expired")
        org, user, bot = claims.get("org"), claims.get("sub"), claims.get("bot")
        if not all(v is None or isinstance(v, str) for v in (org, user, bot)):
            raise Unauthorized("the token's org, sub and bot claims must be strings")
        return org, user, bot, expires  # type: ignore[return-value]

    def identify(self, org: str | None, user: str | None, session: str | None, bot: str | None,
                 authorization: str | None) -> Identity:
        token_org, token_user, token_bot = self.claims(authorization)
        return parse_headers(token_org, token_user, session, token_bot)


class AdminCheck(Protocol):
    def check(self, authorization: str | None) -> None:
        """Raise ``Unauthorized`` unless the caller holds an admin token."""


class AllowAll:
    """The null object: no admin keys configured (embedded default on loopback)."""

    def check(self, authorization: str | None) -> None:
        return None


class AdminTokens:
    """Admin tokens are ordinary tokens with their own audience, so a data-plane token is never one."""

    def __init__(self, keys: KeySet) -> None:
        self._tokens = TokenAuth(keys, audience=ADMIN_AUDIENCE)

    def check(self, authorization: str | None) -> None:
        self._tokens.claims(authorization)


def issue_token(key: Key, *, user: str, org: str | None = None, bot: str | None = None, ttl: float = 3600.0,
                audience: str = DATA_AUDIENCE, now: float | None = None) -> str:
    """A signed token for ``sandbox-gateway token issue`` (and tests)."""
    issued = time.time() if now is None else now
    claims: dict[str, Any] = {"sub": user, "aud": audience, "iat": int(issued), "exp": int(issued + ttl)}
    if org is not None:
        claims["org"] = org
    if bot is not None:
        claims["bot"] = bot
    return sign_claims(key, claims)


def sign_claims(key: Key, claims: dict[str, Any]) -> str:
    """``claims`` as a JWT signed with ``key`` (its ``kid`` in the header): every token the gateway issues."""
    if key.sign is None:
        raise ValueError(f"key {key.kid!r} has no private key or secret to sign with")
    return jwt.encode(claims, key.sign, algorithm=key.alg, headers={"kid": key.kid})


def decode_token(keys: KeySet, token: str, *, audience: str, leeway: float, require: tuple[str, ...],
                 invalid_code: str | None = None, expired_code: str | None = None,
                 check_exp: bool = True) -> dict[str, Any]:
    """The verified claims of ``token``: its ``kid`` picks the key, the key pins the algorithm, the
    audience must match. ``Unauthorized`` says what is wrong (with ``expired_code`` for an expired
    token and ``invalid_code`` for anything else, when given). ``check_exp=False`` leaves the expiry
    to a caller that reads its own (injected) clock."""
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError:
        raise Unauthorized("the bearer token is malformed", code=invalid_code) from None
    key = keys.get(header.get("kid"))
    if key is None:
        raise Unauthorized("the token's kid names no known key", code=invalid_code)
    try:
        return jwt.decode(token, key.verify, algorithms=[key.alg], audience=audience,
                          leeway=leeway, options={"require": list(require), "verify_iat": False, "verify_exp": check_exp})
    except jwt.ExpiredSignatureError:
        raise Unauthorized("the token has expired", code=expired_code) from None
    except jwt.InvalidAudienceError:
        raise Unauthorized(f"the token is not meant for this service (audience must be {audience!r})",
                           code=invalid_code) from None
    except jwt.PyJWTError:
        raise Unauthorized("the token's signature or claims are invalid", code=invalid_code) from None

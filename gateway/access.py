"""Sandbox access tokens: what authorises the host and path keys of the data plane.

Contract (ARCHITECTURE.md, "Wire contract"):

- A token opens **one sandbox** (``sbx``, its ID), in **one incarnation** (``inc``), on **a set
  of ports** (``ports``, the policy's notation: ``[8888, "3000-3999"]``), **until it expires**
  (``exp``). It carries no identity: whoever holds it reaches that sandbox on those ports, so it
  is minted only for the owner of a session bound to the sandbox (the control API checks that),
  and its lifetime is bounded by ``access_token_max_ttl``.
- **Incarnation** is :func:`incarnation_of` the sandbox record's ``created_at``. A sandbox that
  is destroyed and created again (reaped, died, session deleted and re-bound) gets a new record
  and a new ``created_at``, so every token minted for the old one is refused
  (``access_token_stale``). Suspending and resuming keeps the record, and so the incarnation:
  tokens survive a wake. (Whoever changes a record across a resume must keep ``created_at``.)
- Signed with the gateway's own keys (``auth_keys_file``) through ``gateway.auth``'s codec: the
  ``kid`` header names the key and the key pins the algorithm. The first key that can sign
  signs (``KeySet.signer``); rotation as for bearer tokens: put the new key first, keep the old
  one until its tokens have expired. The audience is ``sandbox-gateway-access``, so a data-plane
  or admin bearer token is never an access token and an access token is never either of those.
- :meth:`AccessTokens.verify` gives :class:`AccessClaims` or raises a typed refusal: a
  ``GatewayError`` whose ``code`` is a :class:`Refusal` (401 for a token that is no good at all,
  403 for a good token used where it does not reach). The data plane then checks the sandbox and
  port it was asked for (:meth:`AccessClaims.check`) and the sandbox's current incarnation
  (:meth:`AccessClaims.check_incarnation`).
- Accepted on the data plane as ``Authorization: Bearer``, as the cookie :data:`COOKIE_NAME`
  (scoped to the preview host or the path prefix), or once as the query parameter
  :data:`QUERY_PARAM` (answered with that cookie and a redirect without it). Never forwarded.

Pure: no I/O, no asyncio. The clock is injected.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import jwt

from gateway.auth import KeySet, decode_token, sign_claims
from gateway.errors import BadRequest, Forbidden, Unauthorized
from routing.ports import PortSet

ACCESS_AUDIENCE = "sandbox-gateway-access"
COOKIE_NAME = "sgw_access"       # the access-token cookie (HttpOnly, SameSite=Lax)
QUERY_PARAM = "access_token"     # accepted once, then swapped for the cookie by a redirect
DEFAULT_TTL = 3600.0
MAX_TTL_SETTING = "access_token_max_ttl (SANDBOX_GATEWAY_ACCESS_TOKEN_MAX_TTL)"
_CACHE_LIMIT = 10_000


class Refusal(StrEnum):
    """Why a token was refused: the ``code`` of the error raised (and what logs and tests match)."""

    INVALID = "access_token_invalid"          # 401: malformed, unknown kid, bad signature or claims
    EXPIRED = "access_token_expired"          # 401
    STALE = "access_token_stale"              # 401: the sandbox was re-created after the token was minted
    WRONG_SANDBOX = "access_token_wrong_sandbox"  # 403: a good token for another sandbox
    PORT = "port_not_allowed"                 # 403: a port the token (or the pool) does not open


def incarnation_of(created_at: float) -> str:
    """The incarnation of a sandbox whose record says ``created_at`` (microseconds, hex)."""
    return format(round(created_at * 1_000_000), "x")


@dataclass(frozen=True, slots=True)
class AccessClaims:
    """A verified token: which sandbox, which incarnation, which ports, until when (epoch seconds)."""

    sandbox_id: str
    incarnation: str
    ports: PortSet
    expires: float

    def check(self, sandbox_id: str, port: int) -> None:
        """Raise ``Forbidden`` unless this token opens ``port`` of ``sandbox_id``."""
        if sandbox_id != self.sandbox_id:
            raise Forbidden("the access token is for another sandbox; mint one for this sandbox's session",
                            code=Refusal.WRONG_SANDBOX)
        if port not in self.ports:
            raise Forbidden(f"port {port} is not open to this access token (it opens {self.ports.describe()}); "
                            "mint one with that port in 'ports'", code=Refusal.PORT)

    def check_incarnation(self, current: str) -> None:
        """Raise ``Unauthorized`` unless the sandbox is still the one the token was minted for."""
        if current != self.incarnation:
            raise stale()


def stale() -> Unauthorized:
    """The refusal of a token minted for an earlier incarnation of its sandbox."""
    return Unauthorized("the sandbox was re-created after this access token was minted; mint a new one",
                        code=Refusal.STALE)


class AccessTokens:
    """Mints and verifies sandbox access tokens with the gateway's keys.

    ``verify`` caches verified tokens until they expire (bounded), so the data plane pays one
    signature check per token, not per request.
    """

    def __init__(self, keys: KeySet, *, max_ttl: float, default_ttl: float = DEFAULT_TTL,
                 clock: Callable[[], float] = time.time, leeway: float = 5.0) -> None:
        if max_ttl <= 0:
            raise ValueError("max_ttl must be positive")
        self._keys = keys
        self._signer = keys.signer()
        self.max_ttl = max_ttl
        self.default_ttl = min(default_ttl, max_ttl)
        self._clock = clock
        self._leeway = leeway
        self._cache: dict[str, AccessClaims] = {}

    @property
    def can_mint(self) -> bool:
        """False when every key is verify-only (public keys): this gateway can check tokens, not issue them."""
        return self._signer is not None

    def mint(self, sandbox_id: str, incarnation: str, ports: PortSet, ttl: float | None = None) -> str:
        """A token for ``ports`` of ``sandbox_id`` in ``incarnation``, valid ``ttl`` seconds (default
        ``default_ttl``). The caller has checked that the requester owns the sandbox and that
        ``ports`` are among its pool's (``PortSet.issubset``). ``BadRequest`` names a bad ``ttl``.
        Its expiry is ``verify(token).expires``."""
        if ttl is None:
            ttl = self.default_ttl
        if not 1 <= ttl <= self.max_ttl:
            raise BadRequest(f"ttl: must be between 1 and {self.max_ttl:g} seconds (the gateway's {MAX_TTL_SETTING})",
                             code="invalid_ttl")
        if self._signer is None:
            raise BadRequest("this gateway's keys are all verify-only: add a key with a secret or private key to "
                             "auth_keys_file to mint access tokens", code="cannot_sign")
        now = self._clock()
        claims: dict[str, Any] = {"aud": ACCESS_AUDIENCE, "sbx": sandbox_id, "inc": incarnation,
                                  "ports": ports.to_list(), "iat": int(now), "exp": int(now + ttl)}
        return sign_claims(self._signer, claims)

    def verify(self, token: str) -> AccessClaims:
        """The claims of a good, unexpired token; else ``Unauthorized`` with a :class:`Refusal` code."""
        now = self._clock()
        claims = self._cache.get(token)
        if claims is None:
            claims = self._decode(token)
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.pop(next(iter(self._cache)))
            self._cache[token] = claims
        if claims.expires + self._leeway <= now:
            self._cache.pop(token, None)
            raise Unauthorized("the access token has expired; mint a new one", code=Refusal.EXPIRED)
        return claims

    def claims_audience(self, token: str) -> bool:
        """Whether ``token`` says (unverified) that it is an access token: tells a bad access token
        from another credential in the same place (an admin token with the router headers)."""
        try:
            return jwt.decode(token, options={"verify_signature": False}).get("aud") == ACCESS_AUDIENCE
        except jwt.PyJWTError:
            return False

    def _decode(self, token: str) -> AccessClaims:
        raw = decode_token(self._keys, token, audience=ACCESS_AUDIENCE, leeway=self._leeway,
                           require=("exp", "sbx", "inc", "ports"),
                           invalid_code=Refusal.INVALID, expired_code=Refusal.EXPIRED, check_exp=False)
        sandbox_id, incarnation, exp = raw.get("sbx"), raw.get("inc"), raw.get("exp")
        if not isinstance(sandbox_id, str) or not isinstance(incarnation, str) or not isinstance(exp, int | float):
            raise Unauthorized("the access token's sbx, inc and exp claims are malformed", code=Refusal.INVALID)
        try:
            ports = PortSet.parse(raw.get("ports"))
        except ValueError:
            raise Unauthorized("the access token's ports claim is malformed", code=Refusal.INVALID) from None
        return AccessClaims(sandbox_id, incarnation, ports, float(exp))


__all__ = ["ACCESS_AUDIENCE", "COOKIE_NAME", "QUERY_PARAM", "AccessClaims", "AccessTokens", "Refusal",
           "incarnation_of", "stale"]

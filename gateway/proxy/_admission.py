"""Admission: who is this, may they, and which route, answered synchronously where it can be.

Every front door (the HTTP data plane today; the host, path and access-token
keys and the gRPC front next) asks the same three questions before it carries a
byte, and asks them in this order:

1. :meth:`Admission.identify`: the identity from the raw credentials
   (identity headers or an ``Authorization`` value) through the configured
   authenticator, memoised per connection when the authenticator allows it (a
   keep-alive connection repeats the same headers on every request);
2. :meth:`Admission.admit`: the org's request rate and, for a request that
   declares itself a stream, a stream slot (``gateway.limits``);
3. ``Admission.cached_route``: the route from the session layer's cache, or
   None when it has to be resolved (a task: creation, a store round trip). It
   is the resolver's own bound method, not a wrapper: it runs on every request.

Each raises a :class:`~gateway.errors.GatewayError` to refuse. Nothing here
allocates beyond what the answer needs: the memo lives in slots of the caller's
connection object, and an admitted request with no limits configured costs one
attribute check.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from gateway.auth import Authenticator
from gateway.errors import BadRequest
from gateway.limits import OrgLimits, limit_key

if TYPE_CHECKING:
    from gateway.model import Route
    from routing import Identity

# The raw credentials of one request: X-Org-Id, X-User-Id, X-Session-Id, X-Bot-Id, Authorization.
Credentials = tuple[bytes | None, bytes | None, bytes | None, bytes | None, bytes | None]


class IdentityMemo(Protocol):
    """Where a connection keeps its last credentials and the identity they gave (two slots)."""

    ident_key: Credentials | None
    ident: Identity | None


class Admission:
    """The authenticator, the org limits and the route cache behind one front door."""

    __slots__ = ("authenticator", "limits", "limited", "caps_streams", "cached_route")

    def __init__(self, authenticator: Authenticator, limits: OrgLimits,
                 cached_route: Callable[[Identity], Route | None]) -> None:
        self.authenticator = authenticator
        self.limits = limits
        self.limited = limits.active            # read by callers to skip admit() when no limit is set
        self.caps_streams = limits.caps_streams  # ... and to skip working out whether a request is a stream
        # Which route: the route for an identity from the session layer's cache, synchronously; None
        # on a miss (resolve it in a task). A GatewayError (a foreign session, say) refuses.
        self.cached_route = cached_route

    def identify(self, memo: IdentityMemo, credentials: Credentials) -> Identity:
        """Who is this: the identity for ``credentials``, the memo's when they repeat (and may be memoised)."""
        if credentials == memo.ident_key and self.authenticator.memoizable:
            return memo.ident  # type: ignore[return-value]
        identity = identify(self.authenticator, *credentials)
        memo.ident_key = credentials
        memo.ident = identity
        return identity

    def admit(self, identity: Identity, stream: bool) -> str | None:
        """May they: take a request token and, for a declared ``stream``, a stream slot.

        Returns the key the stream slot is held under (give it back with
        :meth:`stream_closed`), or None. Raises ``CapacityExceeded``, whose
        ``scope`` names the limit.
        """
        return self.admit_key(limit_key(identity), stream)

    def admit_key(self, key: str, stream: bool) -> str | None:
        """:meth:`admit` by limit key: a request addressed by an access token counts against its
        sandbox owner (``limit_key(route.owner)``), as the token carries no identity."""
        limits = self.limits
        limits.admit(key)
        if stream and self.caps_streams:
            limits.open_stream(key)
            return key
        return None

    def stream_began(self, key: str) -> str | None:
        """A stream that did not declare itself: too late for a 429, so it takes a slot regardless
        (it counts against the org's next streams). ``key``: ``limit_key`` of the identity (or the
        owner); returns it, as :meth:`admit` does."""
        if not self.caps_streams:
            return None
        self.limits.open_stream(key, force=True)
        return key

    def stream_closed(self, key: str) -> None:
        self.limits.close_stream(key)


def identify(authenticator: Authenticator, org: bytes | None, user: bytes | None, session: bytes | None,
             bot: bytes | None, authorization: bytes | None) -> Identity:
    """Identity from the raw header values through the configured authenticator.

    Every error names the header to fix (``BadRequest``) or the token problem (``Unauthorized``).
    """
    return authenticator.identify(_decode(b"X-Org-Id", org), _decode(b"X-User-Id", user),
                                  _decode(b"X-Session-Id", session), _decode(b"X-Bot-Id", bot),
                                  _decode(b"Authorization", authorization))


def _decode(header: bytes, value: bytes | None) -> str | None:
    if value is None:
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest(f"{header.decode()}: must be valid UTF-8", code="invalid_identity") from None


__all__ = ["Admission", "Credentials", "IdentityMemo"]

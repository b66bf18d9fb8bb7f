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


# -- header hygiene: one set of rules for every way in ------------------------------------------------------
# What each request header means to the gateway, by lower-cased name: identity and credentials (read by
# :meth:`Admission.identify`, never forwarded), the agent-sandbox router's X-Sandbox-* vocabulary (read or
# dropped, never forwarded: every other x-sandbox-* and x_sandbox_* name too), what the gateway sets itself
# (X-Forwarded-*), hop-by-hop fields. The HTTP data plane applies them as it parses a head
# (gateway/proxy/_request.py, through gateway/proxy/_wire.py), the gRPC front to each call's metadata
# (gateway/grpcfront/call.py), both case-insensitively: HTTP/1.1 by lower-casing what the exact-spelling table
# misses, gRPC because HTTP/2 names are lower-case (an upper-case one is a malformed request, refused
# before this: gateway/grpcfront/headers.py). tests/test_admission_rules.py checks no other module names them.
# Lower-cased names with a meaning to the proxy; every other header passes through.
R_DROP = 1          # never forwarded
R_ORG = 2
R_USER = 3
R_SESSION = 4
R_BOT = 5
R_HOST = 6          # becomes X-Forwarded-Host; the upstream gets its own Host
R_CONNECTION = 7    # hop-by-hop, and names more hop-by-hop headers
R_TE = 8            # Transfer-Encoding: the body is re-framed
R_UPGRADE = 9       # kept for a WebSocket upgrade only
R_XFF = 10          # dropped, or appended to when settings.trust_forwarded_for
R_REQUEST_ID = 11   # taken when it is a sane token
R_EXPECT = 12       # 100-continue is answered by the gateway itself
R_CL = 13           # Content-Length: forwarded, and tells us a body follows
R_AUTH = 14         # Authorization: read by the authenticator, never forwarded
R_SANDBOX_ID = 15   # the agent-sandbox router's headers (gateway/compat.py), never forwarded;
R_SANDBOX_NS = 16   # ... their order matches Exchange.compat
R_SANDBOX_PORT = 17
R_TIMEOUT = 18      # X-Sandbox-Timeout: the client's limit on the time to the response head, never forwarded
R_COOKIE = 19       # Cookie: forwarded without the access-token cookie (gateway/proxy/_keys.py)

REQUEST_HEADERS: dict[bytes, int] = {
    b"x-org-id": R_ORG,
    b"x-user-id": R_USER,
    b"x-session-id": R_SESSION,
    b"x-bot-id": R_BOT,
    b"host": R_HOST,
    b"connection": R_CONNECTION,
    b"transfer-encoding": R_TE,
    b"upgrade": R_UPGRADE,
    b"x-forwarded-for": R_XFF,
    b"x-request-id": R_REQUEST_ID,
    b"expect": R_EXPECT,
    b"content-length": R_CL,
    b"authorization": R_AUTH,
    b"proxy-authorization": R_DROP,
    b"keep-alive": R_DROP,
    b"te": R_DROP,
    b"trailer": R_DROP,
    b"proxy-connection": R_DROP,
    # Set by the gateway; a caller must not be able to forge them.
    b"x-forwarded-proto": R_DROP,
    b"x-forwarded-host": R_DROP,
    b"forwarded": R_DROP,
    b"x-sandbox-id": R_SANDBOX_ID,
    b"x-sandbox-namespace": R_SANDBOX_NS,
    b"x-sandbox-port": R_SANDBOX_PORT,
    b"x-sandbox-timeout": R_TIMEOUT,
    b"x-forwarded-prefix": R_DROP,  # set by the gateway in path mode
    b"cookie": R_COOKIE,
}
# Every other X-Sandbox-* header a client sends is dropped too (X-Sandbox-Pod-IP, ...): it is the
# router's vocabulary, and a sandbox must never take a client's word for one (on_header's fallback).
SANDBOX_HEADER_PREFIXES = (b"x-sandbox-", b"x_sandbox_")

R_PASS = 0          # forwarded as is

# The same table keyed by the spellings clients actually send, so the common case
# costs one dict lookup and no lower(); anything else falls back to REQUEST_HEADERS.
REQUEST_HEADERS_EXACT: dict[bytes, int] = {name: code for name, code in REQUEST_HEADERS.items()}
REQUEST_HEADERS_EXACT.update({b"-".join(part.capitalize() for part in name.split(b"-")): code
                              for name, code in REQUEST_HEADERS.items()})
REQUEST_HEADERS_EXACT.update({
    b"X-Org-Id": R_ORG, b"X-User-Id": R_USER, b"X-Session-Id": R_SESSION, b"X-Bot-Id": R_BOT,
    b"X-Org-ID": R_ORG, b"X-User-ID": R_USER, b"X-Session-ID": R_SESSION, b"X-Bot-ID": R_BOT,
    b"X-Request-ID": R_REQUEST_ID, b"TE": R_DROP, b"WWW-Authenticate": R_PASS,
})
# Underscore spellings of the names above that carry identity or trust (X_Org_Id, X_Sandbox_Id,
# X_Forwarded_For, ...): never forwarded, as nginx drops every such header by default
# (underscores_in_headers off). An upstream that maps "_" to "-" (CGI and WSGI servers make both
# HTTP_X_ORG_ID) would otherwise read them as the real ones. Only in the lower-cased table: the
# exact-spelling lookup misses, so they cost nothing on the common path.
REQUEST_HEADERS.update({name.replace(b"-", b"_"): R_DROP for name in (
    b"x-org-id", b"x-user-id", b"x-session-id", b"x-bot-id", b"x-sandbox-id", b"x-sandbox-namespace",
    b"x-sandbox-port", b"x-sandbox-timeout", b"x-forwarded-for", b"x-forwarded-proto", b"x-forwarded-host",
    b"x-forwarded-prefix")})

for _name in (b"Accept", b"Accept-Encoding", b"Accept-Language", b"User-Agent", b"Content-Type",
              b"Cache-Control", b"Pragma", b"Origin", b"Referer", b"If-None-Match", b"If-Modified-Since", b"Range",
              b"Sec-WebSocket-Key", b"Sec-WebSocket-Version", b"Sec-WebSocket-Extensions",
              b"Sec-WebSocket-Protocol", b"Accept-Charset", b"Last-Event-ID", b"Traceparent"):
    REQUEST_HEADERS_EXACT[_name] = R_PASS
    REQUEST_HEADERS_EXACT[_name.lower()] = R_PASS

IDENTITY_HEADER_NAMES = {R_ORG: "X-Org-Id", R_USER: "X-User-Id", R_SESSION: "X-Session-Id", R_BOT: "X-Bot-Id"}
# The header the gateway itself sets towards a sandbox: the sandbox's ID (never the client's).
SANDBOX_ID_HEADER = b"x-sandbox-id"


def header_role(name: bytes) -> int:
    """The role of a lower-case header name (``R_PASS``: forwarded as it is); X-Sandbox-* are ``R_DROP``."""
    role = REQUEST_HEADERS.get(name, R_PASS)
    if role == R_PASS and name.startswith(SANDBOX_HEADER_PREFIXES):
        return R_DROP
    return role

# The raw credentials of one request: X-Org-Id, X-User-Id, X-Session-Id, X-Bot-Id, Authorization.
Credentials = tuple[bytes | None, bytes | None, bytes | None, bytes | None, bytes | None]


class IdentityMemo(Protocol):
    """Where a connection keeps its last credentials and the identity they gave (two slots)."""

    ident_key: Credentials | None
    ident: Identity | None


class Admission:
    """The authenticator, the org limits and the route cache behind one front door."""

    __slots__ = ("authenticator", "memoizable", "limits", "limited", "caps_streams", "cached_route")

    def __init__(self, authenticator: Authenticator, limits: OrgLimits,
                 cached_route: Callable[..., Route | None]) -> None:
        self.authenticator = authenticator
        self.memoizable = authenticator.memoizable  # a property of the mode (trusted headers: yes; tokens expire)
        self.limits = limits
        self.limited = limits.active            # read by callers to skip admit() when no limit is set
        self.caps_streams = limits.caps_streams  # ... and to skip working out whether a request is a stream
        # Which route: the route for an identity from the session layer's cache, synchronously; None
        # on a miss (resolve it in a task). A GatewayError (a foreign session, say) refuses.
        self.cached_route = cached_route

    def identify(self, memo: IdentityMemo, credentials: Credentials) -> Identity:
        """Who is this: the identity for ``credentials``, the memo's when they repeat (and may be memoised)."""
        if credentials == memo.ident_key and self.memoizable:
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


__all__ = ["Admission", "Credentials", "IdentityMemo", "header_role"]

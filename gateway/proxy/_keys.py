"""Host and path keys: requests that name their sandbox in the URL, authorised by an access token.

Two shapes (ARCHITECTURE.md, "Wire contract"), each on only when its setting is:

- **host** ``{port}-{sandbox_id}.{preview_domain}`` (``preview_domain``): forwarded as it came,
  nothing rewritten;
- **path** ``{preview_path_prefix}/{sandbox_id}/{port}/...``: the prefix is stripped before
  forwarding (the sandbox sees ``/...`` and ``X-Forwarded-Prefix``), and a response's
  ``Location`` and ``Set-Cookie`` ``Path`` are put back under it.

A request whose Host or URL is a key is always keyed, identity headers or not: on a preview host a
sandbox's own page could send any ``X-User-Id``, and trusted headers would believe it. A keyed request needs a sandbox access token (``gateway.access``) for that sandbox and port:
``Authorization: Bearer``, the :data:`~gateway.access.COOKIE_NAME` cookie, or ``?access_token=``
once, which is answered with the cookie and a redirect to the same URL without it. The token
never reaches the sandbox: ``Authorization`` is never forwarded, the cookie is cut out of
``Cookie`` as the header is read, and a URL carrying the parameter is redirected, not forwarded.

The same token also admits the agent-sandbox router headers (``X-Sandbox-ID``, ``X-Sandbox-Port``)
for its sandbox (:meth:`PreviewKeys.router_key`), so that client's router mode needs no admin token.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING
from urllib.parse import unquote_to_bytes

from gateway.access import QUERY_PARAM, AccessClaims, AccessTokens
from gateway.auth import bearer_token
from gateway.compat import DEFAULT_PORT
from gateway.errors import BadRequest, Forbidden, GatewayError, Unauthorized
from gateway.proxy import _wire as w
from gateway.proxy._browser import browser_document, cross_site_refusal, referer_without_token
from gateway.proxy._refusals import Refusals
from gateway.proxy._state import M_UPGRADED, PAUSE_WAIT

if TYPE_CHECKING:
    from gateway.model import Route
    from gateway.proxy._exchange import Exchange
    from gateway.proxy._upstream import UpstreamConnection
    from routing import Identity

_SANDBOX_ID = re.compile(rb"(ses|org|usr|bot|ubt)-[0-9a-f]{48}")
_PORT = re.compile(rb"[1-9][0-9]{0,4}")
_QUERY = QUERY_PARAM.encode() + b"="
_LOOPBACK_HOSTS = (b"localhost", b"127.0.0.1", b"[::1]")
_NOT_CACHED = 10_000  # tokens remembered as "not an access token" (router headers with a bearer token)


class Keyed:
    """Where a keyed request goes: ``prefix`` is the path prefix (path mode) or None (host mode and
    router headers); ``rest`` the URL to forward, None when the path ends at the port (redirected to
    ``prefix/``); ``incarnation`` is filled from the token that admitted it."""

    __slots__ = ("sandbox_id", "port", "prefix", "rest", "incarnation", "shared_origin")

    def __init__(self, sandbox_id: str, port: int, prefix: bytes | None, rest: bytes | None) -> None:
        self.sandbox_id = sandbox_id
        self.port = port
        self.prefix = prefix
        self.rest = rest
        self.incarnation = ""
        # Path mode without preview_path_cookies: its responses may never become pages on the origin
        # every sandbox shares (gateway.proxy._browser.PATH_MODE_HEADERS).
        self.shared_origin = False


class PreviewKeys:
    """The host and path keys of one data plane, and the access tokens that authorise them."""

    def __init__(self, access: AccessTokens, *, domain: str | None = None, path_prefix: str | None = None,
                 path_cookies: bool = False) -> None:
        self.access = access
        self.domain = domain.lower().strip(".") if domain else None
        self.path_cookies = path_cookies  # preview_path_cookies: a single-tenant installation accepts the risk
        self.suffix = ("." + domain.lower().strip(".")).encode() if domain else None
        self.prefix = (path_prefix.rstrip("/") + "/").encode() if path_prefix else None
        self.routes = self.suffix is not None or self.prefix is not None  # read by the plane per request
        self._not_access: dict[str, None] = {}

    def match(self, host: bytes | None, url: bytes) -> Keyed | None:
        """The key in a request's Host or URL, None when it has none; ``BadRequest`` for one malformed."""
        suffix = self.suffix
        if suffix is not None and host is not None:
            name = host.lower()
            colon = name.rfind(b":")
            if colon > name.rfind(b"]"):
                name = name[:colon]
            name = name.rstrip(b".")  # "80-x.preview.example." is the same host to DNS and allowed_hosts
            if name.endswith(suffix):
                return _host_key(name[:-len(suffix)], url, suffix)
        prefix = self.prefix
        if prefix is not None and url.startswith(prefix):
            return _path_key(url, prefix)
        return None

    def authorize(self, ex: Exchange, keyed: Keyed) -> bytes | None:
        """Check the request's token against ``keyed`` (which it fills in), or raise. Returns the
        ``Location`` to redirect to (the token came in the URL, or the path ends at the port) or None."""
        url = ex.url
        from_query = query_token(url) if _QUERY in url else None
        cookies = keyed.prefix is None or self.path_cookies  # path mode: one origin for all (gateway.proxy._browser)
        if not cookies:
            keyed.shared_origin = True
            if browser_document(ex.headers):
                raise Forbidden("path URLs share one browser origin among every sandbox, so a browser may not "
                                "open them as pages (or frames, or workers); open the sandbox's host URL "
                                "(urls[].host of POST /v1/sessions/<session_id>/access), or send the request "
                                "from a program", code="path_url_not_for_browsers")
        claims = self._first_good(self._candidates(ex, keyed, from_query, cookies), keyed)
        keyed.incarnation = claims.incarnation
        return self._location(ex, keyed, from_query, cookies)

    def _candidates(self, ex: Exchange, keyed: Keyed, from_query: str | None, cookies: bool) -> list[str]:
        """The tokens the request offers, from the one place it may: the URL, else Authorization, else
        (when this kind of key keeps one, and Fetch Metadata allows) the access-token cookies."""
        if from_query is not None:
            return [from_query]
        if ex.auth is not None and ex.auth[:7].lower() == b"bearer ":
            return [bearer_token(ex.auth.decode("latin-1"))]
        if ex.cookie_tokens and cookies:
            refusal = cross_site_refusal(ex.method, ex.headers, ex.host)
            if refusal is not None:
                raise refusal
            return [token.decode("latin-1") for token in ex.cookie_tokens]
        raise self._token_required(keyed)

    @staticmethod
    def _location(ex: Exchange, keyed: Keyed, from_query: str | None, cookies: bool) -> bytes | None:
        """Where an authorized request is redirected (None: served as it is)."""
        url = ex.url
        if ex.websocket or (from_query is not None and not (cookies and _navigation(ex))):
            # Only a browser's navigation is redirected (the token leaves its address bar and history
            # for a cookie). A WebSocket handshake (browsers do not follow) and a program that sends the
            # token in every URL (an MCP client given kagent's mcp_url, curl; every path-mode request)
            # are served as they are, the token cut from the URL forwarded.
            rest = keyed.rest if keyed.rest is not None else b"/" + url[len(keyed.prefix or b""):]
            keyed.rest = _without_token(rest, None) if from_query is not None else rest
            return None
        if from_query is not None or keyed.rest is None:
            return _without_token(url, keyed)
        return None

    def _token_required(self, keyed: Keyed) -> Unauthorized:
        if keyed.prefix is None:
            how = f"or open it once with ?{QUERY_PARAM}=<token>"
        elif self.path_cookies:
            how = f"or open it once with ?{QUERY_PARAM}=<token>"
        else:  # no cookie in path mode: every request carries the token
            how = (f"or ?{QUERY_PARAM}=<token> in every request (path URLs share one browser origin, so they keep "
                   "no cookie; browsers should use the preview host URL)")
        where = "this preview URL" if keyed.prefix is None else "this path"
        return Unauthorized(f"{where} needs a sandbox access token: send Authorization: Bearer <token>, {how} "
                            "(POST /v1/sessions/<session_id>/access mints one)", code="access_token_required")

    def _first_good(self, candidates: list[str], keyed: Keyed) -> AccessClaims:
        error: GatewayError | None = None
        for token in candidates:  # several cookies only when paths overlap: the one for this sandbox wins
            try:
                claims = self.access.verify(token)
                claims.check(keyed.sandbox_id, keyed.port)
                return claims
            except GatewayError as exc:
                error = exc
        raise error  # type: ignore[misc]

    def cookie(self, token: str, keyed: Keyed, host: bytes | None, now: float) -> bytes:
        """The ``Set-Cookie`` value that carries ``token`` from now on: HttpOnly, SameSite=Lax, Secure
        unless the client came by a loopback name, scoped to the host (host mode) or the prefix. Where it
        is Secure in host mode it is named ``__Host-sgw_access``: the browser then refuses the name from
        anyone but this host itself, over https, for Path=/ (no sibling can set or shadow it)."""
        claims = self.access.verify(token)
        secure = not _is_loopback(host)
        path = keyed.prefix if keyed.prefix is not None else b"/"
        name = w.HOST_ACCESS_COOKIE if secure and keyed.prefix is None else w.ACCESS_COOKIE
        parts = [name, token.encode("latin-1"), b"; Path=", path, b"; Max-Age=%d" % max(1, int(claims.expires - now)),
                 b"; HttpOnly; SameSite=Lax"]
        if secure:
            parts.append(b"; Secure")
        return b"".join(parts)

    def router_key(self, compat: list[bytes | None], authorization: bytes) -> Keyed | None:
        """The router headers' target when ``authorization`` holds an access token that opens it;
        None when it holds some other credential (an admin token: the router headers' own mode)."""
        if authorization[:7].lower() != b"bearer ":
            return None
        token = bearer_token(authorization.decode("latin-1"))
        if token in self._not_access:
            return None
        try:
            claims = self.access.verify(token)
        except Unauthorized:
            if self.access.claims_audience(token):
                raise  # an access token, but no good (expired, forged): say so
            if len(self._not_access) >= _NOT_CACHED:
                self._not_access.pop(next(iter(self._not_access)))
            self._not_access[token] = None
            return None
        sandbox, _, port = compat
        if sandbox is None or not _SANDBOX_ID.fullmatch(sandbox):
            raise BadRequest("X-Sandbox-ID: must be a sandbox ID (the one the access token was minted for)",
                             code="invalid_sandbox_header")
        if port is None:
            number = DEFAULT_PORT
        elif _PORT.fullmatch(port):
            number = int(port)
        else:
            raise BadRequest("X-Sandbox-Port: must be a port number", code="invalid_sandbox_header")
        keyed = Keyed(sandbox.decode("ascii"), number, None, b"")
        claims.check(keyed.sandbox_id, number)
        keyed.incarnation = claims.incarnation
        return keyed


class KeyedRequests(Refusals):
    """Serving keyed requests: a base of :class:`~gateway.proxy._downstream.DownstreamConnection`
    (as ``RequestReader`` is), kept here beside the keys it serves."""

    __slots__ = ()

    if TYPE_CHECKING:
        def fail(self, ex: Exchange, exc: GatewayError) -> None: ...
        def attach(self, ex: Exchange, route: Route, conn: UpstreamConnection, batch: bool) -> None: ...
        def pause(self, bit: int) -> None: ...
        def finish(self, ex: Exchange, close: bool) -> None: ...
        def _send(self, data: bytes) -> None: ...
        async def _begin_slow(self, ex: Exchange, identity: Identity | None, route: Route | None,
                              fresh: bool) -> None: ...

    def _begin_keyed(self, ex: Exchange, batch: bool) -> bool:
        """A request addressed by a preview host or a sandbox path (gateway.proxy._keys); False when
        its Host and URL are neither: it routes by identity."""
        keys = self.plane.keys
        try:
            keyed = keys.match(ex.host, ex.url)  # type: ignore[union-attr]
            if keyed is None:
                return False
            location = keys.authorize(ex, keyed)  # type: ignore[union-attr]
        except GatewayError as exc:
            self.fail(ex, exc)
            return True
        if location is not None:
            self._redirect(ex, keyed, location)
            return True
        ex.url = keyed.rest  # type: ignore[assignment]  # path mode: the prefix stripped
        if keyed.prefix is not None:
            # One origin for every path: a page's full URL (a token in it) goes out as Referer to the others.
            ex.headers = referer_without_token(ex.headers)
            ex.headers += (b"X-Forwarded-Prefix", w.COLON, keyed.prefix, w.CRLF)
        self._serve_keyed(ex, keyed, batch)
        return True

    def _serve_keyed(self, ex: Exchange, keyed: Keyed, batch: bool) -> None:
        """Forward a request admitted by an access token to the sandbox and port it names."""
        ex.keyed = keyed
        plane = self.plane
        try:
            route = plane.resolver.cached_sandbox_route(keyed.sandbox_id, keyed.port, keyed.incarnation)
            if route is not None and plane.admission.limited:
                plane.admit_keyed(ex, route)
        except GatewayError as exc:
            self.fail(ex, exc)
            return
        if route is not None:
            endpoint = route.endpoint
            pool = plane.pools.get((endpoint.host, endpoint.port))
            conn = pool.take() if pool is not None else None
            if conn is not None:
                self.attach(ex, route, conn, batch)
                return
        self.pause(PAUSE_WAIT)
        ex.task = plane.loop.create_task(self._begin_slow(ex, None, route, False))

    def _redirect(self, ex: Exchange, keyed: Keyed, location: bytes) -> None:
        """Answer with a redirect to ``location``, setting the access-token cookie when the token came
        in the URL (``?access_token=``): the token leaves the address bar and never reaches the sandbox."""
        keys = self.plane.keys
        token = query_token(ex.url)
        cookie = (keys.cookie(token, keyed, ex.host, time.time())  # type: ignore[union-attr]
                  if token is not None and (keyed.prefix is None or keys.path_cookies) else None)  # type: ignore[union-attr]
        ex.status = 303 if ex.method in (b"GET", b"HEAD") else 307
        close = not ex.req_done or not ex.keep_alive or self.plane.draining or bool(self.mode & M_UPGRADED)
        self._send(w.redirect_response(ex.status, location, cookie, ex.request_id or b"-", close=close))
        self.finish(ex, close)


def _host_key(label: bytes, url: bytes, suffix: bytes) -> Keyed:
    port, dash, sandbox = label.partition(b"-")
    if not dash or not _PORT.fullmatch(port) or not _SANDBOX_ID.fullmatch(sandbox) or int(port) > 65535:
        raise BadRequest(f"Host: a preview host is <port>-<sandbox_id>{suffix.decode()}", code="invalid_preview_host")
    return Keyed(sandbox.decode("ascii"), int(port), None, url)


def _path_key(url: bytes, prefix: bytes) -> Keyed:
    start = len(prefix)
    slash = url.find(b"/", start)
    sandbox = url[start:slash] if slash >= 0 else b""
    end = slash + 1
    while end < len(url) and url[end] not in b"/?#":
        end += 1
    port = url[slash + 1:end] if slash >= 0 else b""
    if not _SANDBOX_ID.fullmatch(sandbox) or not _PORT.fullmatch(port) or int(port) > 65535:
        raise BadRequest(f"a sandbox path is {prefix.decode()}<sandbox_id>/<port>/...", code="invalid_preview_path")
    rest = url[end:]
    forwarded = rest if rest.startswith(b"/") else None  # "" or "?...": redirected to the prefix with a slash
    return Keyed(sandbox.decode("ascii"), int(port), url[:end], forwarded)


def query_token(url: bytes) -> str | None:
    """The ``access_token`` query parameter of ``url``, or None."""
    _, mark, query = url.partition(b"?")
    for pair in query.split(b"&") if mark else ():
        if pair.startswith(_QUERY):
            return unquote_to_bytes(pair[len(_QUERY):]).decode("latin-1")
    return None


def _without_token(url: bytes, keyed: Keyed | None) -> bytes:
    """The URL to redirect to: the same, without ``access_token`` (and with the slash after the port)."""
    path, mark, query = url.partition(b"?")
    kept = b"&".join(pair for pair in query.split(b"&") if pair and not pair.startswith(_QUERY)) if mark else b""
    if keyed is not None and keyed.prefix is not None and keyed.rest is None:
        path = keyed.prefix + b"/"
    return path + (b"?" + kept if kept else b"")


def _is_loopback(host: bytes | None) -> bool:
    if host is None:
        return False
    name = host.lower()
    colon = name.rfind(b":")
    if colon > name.rfind(b"]"):
        name = name[:colon]
    return name in _LOOPBACK_HOSTS or name.endswith(b".localhost") or name.startswith(b"127.")


__all__ = ["Keyed", "KeyedRequests", "PreviewKeys", "query_token"]


def _navigation(ex: Exchange) -> bool:
    return ex.method in (b"GET", b"HEAD") and w.navigation(ex.headers)

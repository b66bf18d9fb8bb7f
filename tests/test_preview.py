"""Host and path keys on the data plane, authorised by sandbox access tokens (#17.1-3, #17.6).

A real SessionRouter (memory store, static provider) in front of two recording loopback servers:
the sandbox's runtime port and a dev server on another port of the same host.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver

from gateway.access import AccessTokens, incarnation_of
from gateway.app import plane_options
from gateway.auth import Key, KeySet
from gateway.limits import OrgLimits
from gateway.policy import parse_policy
from gateway.providers.base import PoolProviders
from gateway.providers.static import StaticProvider
from gateway.proxy import DataPlane, PlaneOptions, PreviewKeys
from gateway.proxy._keys import Keyed
from gateway.sessions import SessionRouter
from gateway.store.memory import MemoryStore
from routing import Identity
from routing.ports import PortSet
from tests.clock import FakeClock
from tests.proxy_helpers import aiohttp_backend, eventually, listening_socket

SECRET = b"preview-test-secret-of-32-bytes!!"
DOMAIN = "preview.localhost"
NAVIGATE = {"Sec-Fetch-Mode": "navigate"}  # what a browser sends following a link: a URL token is swapped for a cookie
OTHER = "usr-" + "b" * 48  # a well-formed ID that no session created


@dataclass
class Seen:
    """What the sandbox side received."""

    requests: list[dict[str, Any]] = field(default_factory=list)

    @property
    def last(self) -> dict[str, Any]:
        return self.requests[-1]


def recording(seen: Seen, name: str):  # type: ignore[no-untyped-def]
    async def handler(request: web.Request) -> web.StreamResponse:
        seen.requests.append({"server": name, "path": request.raw_path, "headers": dict(request.headers),
                              "header_names": [k.lower() for k in request.headers]})
        if request.headers.get("Upgrade", "").lower() == "websocket":
            ws = web.WebSocketResponse()
            await ws.prepare(request)
            async for msg in ws:
                await ws.send_str(f"{name}:{msg.data}")
            return ws
        if request.path == "/redirect":
            response = web.Response(status=302, headers={"Location": "/login?next=1"})
            response.headers.add("Set-Cookie", "sid=1; Path=/; HttpOnly")
            response.headers.add("Set-Cookie", "deep=2; path=/app; Secure")
            return response
        if request.path == "/absolute":
            return web.Response(status=302, headers={"Location": f"http://{request.host}/elsewhere",
                                                     "Set-Cookie": "plain=3"})
        if request.path == "/external":
            return web.Response(status=302, headers={"Location": "https://example.com/x"})
        if request.path == "/events":
            stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await stream.prepare(request)
            await stream.write(b"data: one\n\n")
            await stream.write(b"data: two\n\n")
            return stream
        return web.json_response({"server": name, "path": request.raw_path})
    return handler


class Loopback(AbstractResolver):
    """Every name is 127.0.0.1: preview hosts reach the gateway, as a wildcard DNS record would."""

    def __init__(self, port: int) -> None:
        self.port = port

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[dict[str, Any]]:
        return [{"hostname": host, "host": "127.0.0.1", "port": self.port, "family": socket.AF_INET,
                 "proto": 0, "flags": socket.AI_NUMERICHOST}]

    async def close(self) -> None:
        pass


@dataclass
class Preview:
    router: SessionRouter
    plane: DataPlane
    tokens: AccessTokens
    clock: FakeClock
    seen: Seen
    port: int        # the gateway's
    runtime: int     # the sandbox's runtime port
    dev: int         # another port the pool opens
    sandbox_id: str
    identity: Identity

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def incarnation(self, sandbox_id: str | None = None) -> str:
        record = await self.router.store.get_sandbox(sandbox_id or self.sandbox_id)
        assert record is not None
        return incarnation_of(record.created_at)

    async def mint(self, ports: list[int | str] | None = None, *, sandbox_id: str | None = None,
                   ttl: float = 600) -> str:
        sandbox = sandbox_id or self.sandbox_id
        incarnation = await self.incarnation(sandbox) if sandbox != OTHER else incarnation_of(0)
        return self.tokens.mint(sandbox, incarnation, PortSet.parse(ports or [self.dev, self.runtime]), ttl)

    def host(self, port: int | None = None, sandbox_id: str | None = None) -> str:
        return f"{port or self.dev}-{sandbox_id or self.sandbox_id}.{DOMAIN}:{self.port}"

    def path(self, rest: str = "/", port: int | None = None, sandbox_id: str | None = None) -> str:
        return f"/s/{sandbox_id or self.sandbox_id}/{port or self.dev}{rest}"


@pytest.fixture
async def preview() -> AsyncIterator[Preview]:
    seen = Seen()
    async with aiohttp_backend(recording(seen, "runtime")) as runtime, \
            aiohttp_backend(recording(seen, "dev")) as dev:
        policy = parse_policy(json.dumps({
            "pools": {"shared": {"provider": "static", "upstreams": [f"http://127.0.0.1:{runtime.port}"],
                                 "ports": [runtime.port, f"{dev.port}-{dev.port}"]}},
            "routing": {"prefix_pools": {"default": "shared"}}}), "test-policy")
        store = MemoryStore()
        router = SessionRouter(store, PoolProviders({"shared": StaticProvider({"shared": policy.pools["shared"].upstreams})}),
                               policy, replica_id="t")
        identity = Identity.parse(user_id="alice", session_id="s1")
        route = await router.resolve(identity)  # the sandbox exists: created through its session
        clock = FakeClock(time.time())
        tokens = AccessTokens(KeySet([Key("k1", "HS256", SECRET, SECRET)]), max_ttl=3600, clock=clock)
        plane = DataPlane(router, PlaneOptions(upstream_connect_retries=0),
                          keys=PreviewKeys(tokens, domain=DOMAIN, path_prefix="/s"))
        sock = listening_socket()
        await plane.start(sock)
        try:
            yield Preview(router, plane, tokens, clock, seen, sock.getsockname()[1], runtime.port, dev.port,
                          route.sandbox_id, identity)
        finally:
            await plane.stop(0.5)
            await store.close()


def refused(body: dict[str, Any]) -> str:
    return body["error"]["code"]  # type: ignore[no-any-return]


async def get(preview: Preview, target: str, **kwargs: Any) -> tuple[int, dict[str, Any], Any]:
    async with aiohttp.ClientSession() as client, \
            client.get(preview.url + target, allow_redirects=False, **kwargs) as response:
        body = await response.json() if response.content_type == "application/json" else await response.text()
        return response.status, dict(response.headers), body


def assert_clean(request: dict[str, Any]) -> None:
    """No credential and no router header of the client's reached the sandbox."""
    names = request["header_names"]
    assert "authorization" not in names
    assert [n for n in names if n.startswith(("x-sandbox-", "x_sandbox_")) and n != "x-sandbox-id"] == []
    assert "sgw_access" not in request["headers"].get("Cookie", "")
    assert "access_token" not in request["path"]


async def test_host_key_reaches_the_port_it_names_and_rewrites_nothing(preview):
    token = await preview.mint()
    status, headers, _ = await get(preview, "/redirect?x=1", headers={
        "Host": preview.host(), "Authorization": f"Bearer {token}"})
    assert status == 302
    assert headers["Location"] == "/login?next=1"  # host mode: as the sandbox said
    assert preview.seen.last["server"] == "dev" and preview.seen.last["path"] == "/redirect?x=1"
    assert preview.seen.last["headers"]["Host"] == f"127.0.0.1:{preview.dev}"  # the provider's host, that port
    assert preview.seen.last["headers"]["X-Sandbox-Id"] == preview.sandbox_id
    assert_clean(preview.seen.last)
    status, _, body = await get(preview, "/", headers={"Host": preview.host(preview.runtime),
                                                       "Authorization": f"Bearer {token}"})
    assert (status, body["server"]) == (200, "runtime")


async def test_path_key_strips_the_prefix_and_rewrites_location_and_cookie_paths(preview):
    token = await preview.mint()
    auth = {"Authorization": f"Bearer {token}"}
    prefix = preview.path("")
    status, headers, _ = await get(preview, preview.path("/redirect?x=1"), headers=auth)
    assert status == 302
    assert preview.seen.last["path"] == "/redirect?x=1"
    assert preview.seen.last["headers"]["X-Forwarded-Prefix"] == prefix
    assert headers["Location"] == f"{prefix}/login?next=1"
    async with aiohttp.ClientSession() as client, \
            client.get(preview.url + preview.path("/redirect"), headers=auth, allow_redirects=False) as response:
        cookies = response.headers.getall("Set-Cookie")
    assert cookies == [f"sid=1; Path={prefix}/; HttpOnly", f"deep=2; Path={prefix}/app; Secure"]
    status, headers, _ = await get(preview, preview.path("/absolute"), headers=auth)
    assert headers["Location"] == f"{prefix}/elsewhere"  # an absolute URL on the sandbox's own host
    assert headers["Set-Cookie"] == "plain=3"  # no Path: the browser's default is already under the prefix
    status, headers, _ = await get(preview, preview.path("/external"), headers=auth)
    assert headers["Location"] == "https://example.com/x"


async def test_path_ending_at_the_port_is_redirected_under_it(preview):
    token = await preview.mint()
    status, headers, _ = await get(preview, preview.path("?q=1"), headers={"Authorization": f"Bearer {token}"})
    assert (status, headers["Location"]) == (303, preview.path("/?q=1"))
    assert "Set-Cookie" not in headers


async def test_a_browser_follows_a_preview_url_by_host_with_cookies(preview):
    token = await preview.mint()
    jar = aiohttp.CookieJar(unsafe=True)
    connector = aiohttp.TCPConnector(resolver=Loopback(preview.port))
    async with aiohttp.ClientSession(connector=connector, cookie_jar=jar, headers=NAVIGATE) as browser:
        start = f"http://{preview.host()}/page?a=1&access_token={token}&b=2"
        async with browser.get(start, headers={"Cookie": "theirs=1"}) as response:
            assert response.status == 200
            assert [str(r.headers["Location"]) for r in response.history] == ["/page?a=1&b=2"]
            set_cookie = response.history[0].headers["Set-Cookie"]
        assert preview.seen.last["path"] == "/page?a=1&b=2"
        assert set_cookie.startswith(f"sgw_access={token}; Path=/; Max-Age=")
        assert "HttpOnly" in set_cookie and "SameSite=Lax" in set_cookie and "Secure" not in set_cookie  # loopback
        async with browser.get(f"http://{preview.host()}/again") as response:  # the cookie alone now
            assert (response.status, (await response.json())["path"]) == (200, "/again")
        async with browser.ws_connect(f"http://{preview.host()}/ws") as ws:  # the cookie opens WebSocket too
            await ws.send_str("hi")
            assert (await ws.receive_str()) == "dev:hi"
        async with browser.get(f"http://{preview.host(preview.runtime)}/") as response:
            assert response.status == 401  # host-only: the cookie is not sent to another preview host
    for request in preview.seen.requests:
        assert_clean(request)


async def test_a_browser_follows_a_preview_url_by_path_with_cookies_where_one_origin_is_accepted(preview):
    preview.plane.keys.path_cookies = True  # preview_path_cookies: a single-tenant installation
    token = await preview.mint()
    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(cookie_jar=jar, headers=NAVIGATE) as browser:
        async with browser.get(preview.url + preview.path(f"?access_token={token}")) as response:
            assert response.status == 200
            assert str(response.history[0].headers["Location"]) == preview.path("/")
            assert f"Path={preview.path('')};" in response.history[0].headers["Set-Cookie"]
        async with browser.get(preview.url + preview.path("/redirect")) as response:  # follows the rewritten Location
            assert (response.status, (await response.json())["path"]) == (200, "/login?next=1")
        async with browser.ws_connect(preview.url + preview.path("/ws")) as ws:
            await ws.send_str("hi")
            assert (await ws.receive_str()) == "dev:hi"
        async with browser.get(preview.url + preview.path("/", port=preview.runtime)) as response:
            assert response.status == 401  # the cookie is scoped to the path of one port
    for request in preview.seen.requests:
        assert_clean(request)


async def test_a_program_sending_the_token_in_every_url_is_served_without_a_redirect(preview):
    """kagent's mcp_url carries its token: an MCP client posts to it on every call. Only a browser's
    navigation is redirected; a program is served at once, the token cut from the URL forwarded."""
    token = await preview.mint()
    for method in ("GET", "POST"):
        async with aiohttp.ClientSession() as client, client.request(
                method, preview.url + preview.path(f"/mcp?a=1&access_token={token}"), data=b"{}",
                allow_redirects=False) as response:
            assert response.status == 200 and not response.cookies
        request = preview.seen.last
        assert request["path"] == "/mcp?a=1" and token not in json.dumps(request)
        assert_clean(request)


async def test_secure_cookie_off_loopback(preview):
    preview.plane.keys.path_cookies = True
    token = await preview.mint()
    status, headers, _ = await get(preview, preview.path(f"/x?access_token={token}"),
                                   headers={"Host": "gateway.example.com", **NAVIGATE})
    assert status == 303 and headers["Location"] == preview.path("/x")
    assert headers["Set-Cookie"].startswith("sgw_access=")  # a path: no __Host- prefix (it needs Path=/)
    assert headers["Set-Cookie"].endswith("; HttpOnly; SameSite=Lax; Secure")


async def test_secure_cookie_of_a_preview_host_is_a_host_prefixed_cookie(preview):
    token = await preview.mint()
    keyed = Keyed(preview.sandbox_id, preview.dev, None, b"/")
    cookie = preview.plane.keys.cookie(token, keyed, b"80-x.preview.example.com", time.time()).decode()
    assert cookie.startswith("__Host-sgw_access=") and "; Path=/;" in cookie and "Domain" not in cookie
    assert cookie.endswith("; HttpOnly; SameSite=Lax; Secure")
    status, _, _ = await get(preview, "/x", headers={"Host": preview.host(), "Cookie": f"__Host-sgw_access={token}; app=1",
                                                     **NAVIGATE})
    assert status == 200
    assert preview.seen.last["headers"]["Cookie"] == "app=1"  # the token never reaches the sandbox


@pytest.mark.parametrize("headers", [
    pytest.param(NAVIGATE, id="a navigation"),
    pytest.param({"Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "iframe"}, id="a frame"),
    pytest.param({"Sec-Fetch-Mode": "same-origin", "Sec-Fetch-Dest": "serviceworker", "Service-Worker": "script"},
                 id="a service worker's script"),
    pytest.param({"Sec-Fetch-Mode": "same-origin", "Sec-Fetch-Dest": "worker"}, id="a worker"),
    pytest.param({"Accept": "text/html,application/xhtml+xml"}, id="HTML, from a browser without Fetch Metadata"),
])
async def test_path_urls_never_become_pages_on_the_origin_every_sandbox_shares(preview, headers):
    token = await preview.mint()
    before = len(preview.seen.requests)
    status, answer, body = await get(preview, preview.path(f"/x?access_token={token}"), headers=headers)
    assert status == 403 and "path_url_not_for_browsers" in str(body) and "Set-Cookie" not in answer
    assert len(preview.seen.requests) == before


async def test_path_mode_keeps_no_cookie_and_makes_no_page(preview):
    """Every path URL is one browser origin: a cookie there would let one sandbox's page drive another's,
    and a page there could read the others' URLs, storage and frames."""
    token = await preview.mint()
    status, headers, _ = await get(preview, preview.path(f"/x?a=1&access_token={token}"))
    assert status == 200 and "Set-Cookie" not in headers  # a program: served, the token cut, none kept
    assert preview.seen.last["path"] == "/x?a=1"
    assert headers["Content-Security-Policy"] == "sandbox" and headers["Referrer-Policy"] == "no-referrer"
    assert headers["Cache-Control"] == "private"  # opened by a credential: no shared cache keeps it
    status, _, body = await get(preview, preview.path("/x"), headers={"Cookie": f"sgw_access={token}"})
    assert status == 401 and "access_token_required" in str(body)  # a cookie is no credential here
    status, _, _ = await get(preview, preview.path("/y"), headers={
        "Authorization": f"Bearer {token}", "Referer": f"http://h{preview.path('/p')}?access_token={token}&q=1"})
    assert status == 200 and preview.seen.last["headers"]["Referer"] == f"http://h{preview.path('/p')}?q=1"


async def test_websocket_takes_the_token_in_its_url_without_a_redirect(preview):
    token = await preview.mint()
    async with aiohttp.ClientSession() as client, \
            client.ws_connect(preview.url + preview.path(f"/ws?access_token={token}&room=1")) as ws:
        await ws.send_str("hi")
        assert (await ws.receive_str()) == "dev:hi"
    assert preview.seen.last["path"] == "/ws?room=1"


async def test_sse_streams_through_a_path_key(preview):
    token = await preview.mint()
    async with aiohttp.ClientSession() as client, \
            client.get(preview.url + preview.path("/events"), headers={"Authorization": f"Bearer {token}"}) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        assert await response.content.readuntil(b"\n\n") == b"data: one\n\n"
        assert await response.content.readuntil(b"\n\n") == b"data: two\n\n"


async def test_refusals(preview):
    good = await preview.mint()
    cases = [
        ("no token", preview.path("/"), {}, 401, "access_token_required"),
        ("forged", preview.path("/"), {"Authorization": "Bearer a.b.c"}, 401, "access_token_invalid"),
        ("token for another sandbox", preview.path("/", sandbox_id=OTHER), {"Authorization": f"Bearer {good}"},
         403, "access_token_wrong_sandbox"),
        ("port not in the token", preview.path("/", port=22), {"Authorization": f"Bearer {good}"},
         403, "port_not_allowed"),
        ("malformed path", "/s/not-an-id/80/", {"Authorization": f"Bearer {good}"}, 400, "invalid_preview_path"),
        ("malformed host", "/", {"Host": f"x-{preview.sandbox_id}.{DOMAIN}"}, 400, "invalid_preview_host"),
    ]
    for name, target, headers, status, code in cases:
        got, _, body = await get(preview, target, headers=headers)
        assert (got, refused(body)) == (status, code), name
    assert preview.seen.requests == []


async def test_a_port_the_pool_does_not_open_is_403_naming_its_list(preview):
    token = await preview.mint([22, preview.dev])  # the control API would refuse; the data plane checks again
    status, _, body = await get(preview, preview.path("/", port=22), headers={"Authorization": f"Bearer {token}"})
    assert (status, refused(body)) == (403, "port_not_allowed")
    assert f"{preview.runtime}" in body["error"]["message"] and "pools.shared.ports" in body["error"]["message"]
    assert preview.seen.requests == []


async def test_expired_token_is_refused(preview):
    token = await preview.mint(ttl=60)
    assert (await get(preview, preview.path("/"), headers={"Authorization": f"Bearer {token}"}))[0] == 200
    preview.clock.advance(66)
    status, _, body = await get(preview, preview.path("/"), headers={"Authorization": f"Bearer {token}"})
    assert (status, refused(body)) == (401, "access_token_expired")


async def test_recreated_sandbox_refuses_the_old_token(preview):
    token = await preview.mint()
    auth = {"Authorization": f"Bearer {token}"}
    assert (await get(preview, preview.path("/"), headers=auth))[0] == 200  # cached now
    record = await preview.router.store.get_sandbox(preview.sandbox_id)
    await preview.router.lifecycle.destroy(record, reason="test")
    await preview.router.resolve(preview.identity)  # its session re-creates it
    status, _, body = await get(preview, preview.path("/"), headers=auth)
    assert (status, refused(body)) == (401, "access_token_stale")
    assert (await get(preview, preview.path("/"), headers={"Authorization": f"Bearer {await preview.mint()}"}))[0] == 200


async def test_a_key_never_creates_a_sandbox(preview):
    token = await preview.mint(sandbox_id=OTHER)
    status, _, body = await get(preview, preview.path("/", sandbox_id=OTHER), headers={"Authorization": f"Bearer {token}"})
    assert (status, refused(body)) == (404, "sandbox_not_found")
    assert await preview.router.store.get_sandbox(OTHER) is None


async def test_router_headers_with_an_access_token_reach_that_sandbox_only(preview):
    token = await preview.mint()
    headers = {"Authorization": f"Bearer {token}", "X-Sandbox-ID": preview.sandbox_id,
               "X-Sandbox-Namespace": "default", "X-Sandbox-Port": str(preview.dev), "X-Sandbox-Timeout": "30"}
    status, _, body = await get(preview, "/execute", headers=headers)
    assert (status, body["server"], body["path"]) == (200, "dev", "/execute")
    assert_clean(preview.seen.last)
    status, _, body = await get(preview, "/", headers={**headers, "X-Sandbox-ID": OTHER})
    assert (status, refused(body)) == (403, "access_token_wrong_sandbox")
    status, _, body = await get(preview, "/", headers={**headers, "X-Sandbox-Port": "22"})
    assert (status, refused(body)) == (403, "port_not_allowed")


async def test_a_key_wins_over_identity_headers_and_identity_requests_keep_their_hygiene(preview):
    """A preview path or host is keyed whatever else the request says: on a preview host a sandbox's own
    page could send any X-User-Id, and trusted headers would believe it. Elsewhere identity routes, and
    every X-Sandbox-* header and the access cookie are dropped on that path too."""
    headers = {"X-User-Id": "alice", "X-Session-Id": "s1", "X-Sandbox-Timeout": "5", "X-Sandbox-Pod-IP": "10.0.0.9",
               "X-Sandbox-Anything": "x", "X_Sandbox_Port": "22", "X-Forwarded-Prefix": "/forged",
               "Cookie": "a=1; sgw_access=secret; b=2", "X-Sandbox-ID": OTHER}
    before = len(preview.seen.requests)
    for target, host in ((preview.path("/"), None), ("/", preview.host()), ("/", preview.host() .replace(":", ".:"))):
        status, _, body = await get(preview, target, headers={**headers, **({"Host": host} if host else {})})
        # (The forged cookie is tried on a preview host, and refused; path mode reads no cookie.)
        assert status == 401 and refused(body) in ("access_token_required", "access_token_invalid"), (target, host)
    assert len(preview.seen.requests) == before
    status, _, body = await get(preview, "/x", headers=headers)
    assert (status, body["server"], body["path"]) == (200, "runtime", "/x")
    seen = preview.seen.last
    assert_clean(seen)
    assert seen["headers"]["X-Sandbox-Id"] == preview.sandbox_id  # the gateway's, never the client's
    assert seen["headers"]["Cookie"] == "a=1; b=2"
    assert "x-forwarded-prefix" not in seen["header_names"]
    status, _, _ = await get(preview, "/", headers={**headers, "Cookie": "sgw_access=secret"})
    assert status == 200 and "cookie" not in preview.seen.last["header_names"]


def test_off_by_default():
    from gateway.settings import Settings

    plane = DataPlane(_NeverResolver(), plane_options(Settings()))
    assert plane.keys is None and not plane.keyed
    with pytest.raises(ValueError, match="need --auth-keys / SANDBOX_GATEWAY_AUTH_KEYS_FILE"):
        Settings(preview_domain="preview.example.com")
    with pytest.raises(ValueError, match="not a DNS name"):
        Settings(preview_domain="bad_domain!", auth_keys_file="k.yaml")
    with pytest.raises(ValueError):
        Settings(preview_path_prefix="s/", auth_keys_file="k.yaml")


class _NeverResolver:
    def cached_route(self, identity: Identity, owned: object = None) -> None:
        return None


async def test_pending_key_requests_share_no_state(preview):
    """Concurrent keyed requests resolve the sandbox once per process and all arrive."""
    token = await preview.mint()
    auth = {"Authorization": f"Bearer {token}"}
    preview.router.invalidate(preview.sandbox_id)
    results = await asyncio.gather(*(get(preview, preview.path(f"/{i}"), headers=auth) for i in range(8)))
    assert [status for status, _, _ in results] == [200] * 8


async def test_keyed_requests_count_against_the_owners_rate(preview):
    limits = OrgLimits(rate=0.001, burst=2, clock=FakeClock())
    plane = DataPlane(preview.router, PlaneOptions(), limits=limits, keys=preview.plane.keys)
    sock = listening_socket()
    await plane.start(sock)
    try:
        url = f"http://127.0.0.1:{sock.getsockname()[1]}" + preview.path("/")
        auth = {"Authorization": f"Bearer {await preview.mint()}"}
        async with aiohttp.ClientSession() as client:
            statuses = []
            for _ in range(3):
                async with client.get(url, headers=auth) as response:
                    statuses.append(response.status)
                    body = await response.json()
        assert statuses == [200, 200, 429]
        assert "user:alice" in body["error"]["message"]  # the sandbox owner's bucket
    finally:
        await plane.stop(0.5)


async def test_keyed_streams_take_the_owners_stream_slots(preview):
    """A keyed WebSocket or event stream holds one of its sandbox owner's max_streams_per_org slots,
    as an identity-routed one does: a second is refused while the first is open, and a slot comes
    back when the stream ends."""
    limits = OrgLimits(max_streams=1)
    plane = DataPlane(preview.router, PlaneOptions(), limits=limits, keys=preview.plane.keys)
    sock = listening_socket()
    await plane.start(sock)
    try:
        base = f"http://127.0.0.1:{sock.getsockname()[1]}"
        token = await preview.mint()
        events = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
        async with aiohttp.ClientSession() as client:
            async with client.ws_connect(base + preview.path(f"/ws?access_token={token}")) as ws:
                await ws.send_str("hi")
                assert (await ws.receive_str()) == "dev:hi"
                async with client.get(base + preview.path("/events"), headers=events) as second:
                    assert second.status == 429
                    body = await second.json()
                assert "max_streams_per_org 1" in body["error"]["message"] and "user:alice" in body["error"]["message"]
            await eventually(lambda: limits.open_streams("user:alice") == 0)  # the WebSocket's slot comes back
            async with client.get(base + preview.path("/events"), headers=events) as third:
                assert third.status == 200
                assert await third.content.readuntil(b"\n\n") == b"data: one\n\n"
    finally:
        await plane.stop(0.5)


def test_the_gateway_wires_keys_from_settings(tmp_path):
    from gateway.app import Gateway
    from gateway.settings import Settings

    keyfile = tmp_path / "keys.yaml"
    keyfile.write_text(json.dumps({"keys": [{"kid": "k1", "alg": "HS256", "secret": SECRET.decode()}]}))
    gateway = Gateway.create(Settings(data_dir=tmp_path / "data", auth_keys_file=keyfile, preview_path_prefix="/s",
                                      access_token_max_ttl=600))
    keys = gateway._preview_keys()
    assert keys.prefix == b"/s/" and keys.suffix is None and keys.routes
    assert gateway.access_tokens.max_ttl == 600 and gateway.access_tokens.can_mint
    assert Gateway.create(Settings(data_dir=tmp_path / "data2")).access_tokens is None


async def test_an_ownerless_suspended_sandbox_is_not_woken_by_a_token(preview):
    """A record from a version that kept no owner: a token wakes nothing, for it is unknown whose
    sandbox a wake (or, were the record gone meanwhile, a creation) would be. Its session wakes it."""
    from gateway.errors import NotFound
    from gateway.model import Endpoint, SandboxRecord, SandboxState
    from gateway.store.base import Caps

    store, sandbox_id = preview.router.store, "usr-" + "c" * 48
    made = SandboxRecord(sandbox_id, "shared", None, SandboxState.CREATING, created_at=time.time())
    await store.reserve_sandbox(made, Caps(), 30)
    await store.mark_ready(sandbox_id, Endpoint("127.0.0.1", preview.runtime))
    await store.begin_suspend(sandbox_id, 30)
    await store.mark_suspended(sandbox_id)
    with pytest.raises(NotFound, match="a request through its session wakes it"):
        await preview.router.route_for_sandbox(sandbox_id, preview.runtime, incarnation_of(made.created_at))
    record = await store.get_sandbox(sandbox_id)
    assert record is not None and record.state is SandboxState.SUSPENDED and record.owner is None

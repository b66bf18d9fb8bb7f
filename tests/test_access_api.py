"""The control side of sandbox access (#17.3, #17.4): POST /v1/sessions/{id}/access mints a token for
the session's owner with ready-made host and path URLs, and kagent's POST/GET
/api/sessions/{id}/sandbox answers its SandboxResponse. A whole gateway, local sandboxes running
the reference runtime; the URLs it hands out are opened as a browser would (cookies, redirects,
WebSocket)."""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import aiohttp
import pytest

from routing import Identity, default_policy, place
from tests.client_gateway import PATH_PREFIX, PREVIEW_DOMAIN, ClientGateway, Loopback, client_gateway

NAVIGATE = {"Sec-Fetch-Mode": "navigate"}  # what a browser sends following a link: a URL token is swapped for a cookie


@pytest.fixture
async def gw(tmp_path):
    async with client_gateway(tmp_path, access_token_max_ttl=600) as gateway:
        yield gateway


async def access(gw: ClientGateway, session: str, *, user: str = "alice", body=None, expect: int = 200) -> dict:
    return await gw.control("POST", f"/v1/sessions/{session}/access", headers=gw.owner(user), body=body,
                            expect=expect)


async def test_the_owner_gets_a_token_and_urls_that_open_in_a_browser(gw):
    bound = await gw.bind("alice", "s1")
    before = time.time()
    grant = await access(gw, "s1", body={"ttl": 120})
    sandbox_id, port = grant["sandbox_id"], grant["ports"][0]
    assert sandbox_id == bound["sandbox_id"] and grant["session_id"] == "s1"
    assert before + 119 <= grant["expires_at"] <= time.time() + 121
    assert grant["headers"] == {"Authorization": f"Bearer {grant['token']}"}
    [urls] = grant["urls"]
    assert urls["port"] == port
    assert urls["path"] == f"{gw.data_url}{PATH_PREFIX}/{sandbox_id}/{port}/?access_token={grant['token']}"
    assert urls["host"] == f"http://{port}-{sandbox_id}.{PREVIEW_DOMAIN}:{gw.data_port}/?access_token={grant['token']}"

    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(cookie_jar=jar, headers=NAVIGATE, connector=aiohttp.TCPConnector(resolver=Loopback())) as browser:
        # Path URLs share one origin: they never become a browser's page, and keep no cookie (SECURITY.md,
        # "Browsers"); a program sends the token in each request.
        async with browser.get(urls["path"]) as response:
            assert response.status == 403 and "path_url_not_for_browsers" in await response.text()
            assert response.content_type == "text/html" and not jar.filter_cookies(response.url)
        async with aiohttp.ClientSession() as program, program.post(urls["path"].replace("/?", "/echo/x?"),
                                                                    data=b"hello") as response:
            echoed = await response.json()
            assert (echoed["raw_path"], echoed["sandbox_id"]) == ("/echo/x", sandbox_id)
            assert response.headers["Content-Security-Policy"] == "sandbox"
        for kind in ("host",):
            async with browser.get(urls[kind]) as response:  # the token swapped for a cookie, then the page
                assert response.status == 200, await response.text()
                assert len(response.history) == 1 and "access_token" not in str(response.url)
                assert (await response.json())["status"] == "ok"  # the runtime's health page
            base = str(response.url).rstrip("/")
            async with browser.post(f"{base}/echo/x?y=1", data=b"hello") as response:  # the cookie alone now
                echoed = await response.json()
            assert (echoed["raw_path"], echoed["body_len"], echoed["sandbox_id"]) == ("/echo/x?y=1", 5, sandbox_id)
            assert "sgw_access" not in echoed["headers"].get("Cookie", "")
            assert "Authorization" not in echoed["headers"]
            async with browser.ws_connect(f"{base}/ws") as ws:
                await ws.send_str(f"over the {kind} URL")
                assert await ws.receive_str() == f"over the {kind} URL"


async def test_bearer_token_and_router_headers_reach_only_that_sandbox(gw):
    grant_a = await access(gw, (await gw.bind("alice", "a"))["session_id"])
    await gw.bind("bob", "b")
    grant_b = await access(gw, "b", user="bob")
    async with aiohttp.ClientSession() as http:
        path_b = urlsplit(grant_b["urls"][0]["path"]).path
        async with http.get(gw.data_url + path_b, headers=grant_a["headers"]) as response:
            assert response.status == 403 and (await response.json())["error"]["code"] == "access_token_wrong_sandbox"
        async with http.get(gw.data_url + path_b, headers=grant_b["headers"]) as response:
            assert response.status == 200


@pytest.mark.parametrize(("user", "session", "headers", "body", "status", "code"), [
    pytest.param("mallory", "s1", None, None, 404, "not_found", id="another tenant: as if no session"),
    pytest.param("alice", "nope", None, None, 404, "not_found", id="unknown session"),
    pytest.param(None, "s1", {}, None, 400, "invalid_identity", id="no identity: the owner is required"),
    pytest.param("alice", "s1", None, {"ports": [22]}, 403, "port_not_allowed", id="a port the pool does not open"),
    pytest.param("alice", "s1", None, {"ports": "8888"}, 400, "invalid_ports", id="ports not a list"),
    pytest.param("alice", "s1", None, {"ttl": 601}, 400, "invalid_ttl", id="ttl over access_token_max_ttl"),
    pytest.param("alice", "s1", None, {"ttl": "1h"}, 400, "invalid_ttl", id="ttl not a number"),
    pytest.param("alice", "s1", None, {"port": 1}, 400, "bad_request", id="unknown field"),
])
async def test_refusals_name_what_to_change(gw, user, session, headers, body, status, code):
    await gw.bind("alice", "s1")
    if headers is None:
        headers = gw.owner(user)
    else:
        headers = {"Authorization": f"Bearer {gw.admin}"}
    error = await gw.control("POST", f"/v1/sessions/{session}/access", headers=headers, body=body, expect=status)
    assert error["error"]["code"] == code
    if code == "port_not_allowed":
        assert "22" in error["error"]["message"] and "ports" in error["error"]["message"]


async def test_without_an_admin_token_nothing_is_minted(gw):
    await gw.bind("alice", "s1")
    error = await gw.control("POST", "/v1/sessions/s1/access", headers={"X-User-Id": "alice"}, expect=401)
    assert error["error"]["code"] == "unauthorized"


async def test_a_gateway_without_signing_keys_says_which_setting_mints_tokens(tmp_path):
    from gateway.app import Gateway
    from gateway.settings import Settings
    from tests.proxy_helpers import listening_socket

    gateway = Gateway.create(Settings(data_dir=tmp_path / "data"))
    await gateway.start(listening_socket(), listening_socket())
    try:
        host, port = gateway.control_address  # type: ignore[misc]
        async with aiohttp.ClientSession() as http:
            await (await http.post(f"http://{host}:{port}/v1/sessions", json={"user_id": "u", "session_id": "s"})).read()
            async with http.post(f"http://{host}:{port}/v1/sessions/s/access", headers={"X-User-Id": "u"}) as response:
                assert response.status == 501
                error = (await response.json())["error"]
    finally:
        await gateway.stop()
    assert error["code"] == "access_tokens_off" and "auth_keys_file" in error["message"]


# -- kagent -----------------------------------------------------------------------------------
async def test_kagent_binds_per_policy_and_answers_its_sandbox_response(gw):
    headers = gw.owner("alice", org="acme")
    created = await gw.control("POST", "/api/sessions/k1/sandbox", headers=headers,
                               body={"agent_name": "coder", "namespace": "kagent", "workspace": {}})
    expected = place(Identity.parse(org_id="acme", user_id="alice", session_id="k1"), default_policy()).sandbox_id
    assert set(created) == {"sandbox_id", "mcp_url", "protocol", "headers", "ready"}
    assert (created["sandbox_id"], created["protocol"], created["ready"]) == (expected, "streamable-http", True)
    url = urlsplit(created["mcp_url"])
    assert url.path.startswith(f"{PATH_PREFIX}/{expected}/") and url.path.endswith("/mcp")
    assert url.query.startswith("access_token=")
    assert created["headers"]["Authorization"] == "Bearer " + url.query.removeprefix("access_token=")
    status = await gw.control("GET", "/api/sessions/k1/sandbox", headers=headers)
    assert (status["sandbox_id"], status["ready"]) == (expected, True)
    # the same session as the control API sees it
    session = await gw.control("GET", "/v1/sessions/k1", headers=headers)
    assert session["sandbox_id"] == expected


async def test_kagent_without_a_body_and_its_refusals(gw):
    created = await gw.control("POST", "/api/sessions/k2/sandbox", headers=gw.owner("alice"))
    assert created["ready"] is True
    for user, session in (("mallory", "k2"), ("alice", "never-bound")):
        error = await gw.control("GET", f"/api/sessions/{session}/sandbox", headers=gw.owner(user), expect=404)
        assert error["error"]["code"] == "not_found"
    error = await gw.control("POST", "/api/sessions/k2/sandbox", headers=gw.owner("mallory"), expect=404)
    assert error["error"]["code"] == "not_found"  # another tenant's session: never a hint it exists
    error = await gw.control("POST", "/api/sessions/k2/sandbox", headers=gw.owner("alice"),
                             body={"image": "x"}, expect=400)
    assert "image" in error["error"]["message"]

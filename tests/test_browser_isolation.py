"""Two tenants in one real browser (headless Chromium): one sandbox's pages can neither read nor drive
another's, in path mode or host mode; cookies a sandbox tosses never reach another; a cookie bomb
costs one request; the gateway answers only the hosts it serves (DNS rebinding). And the victim's
own page, fetches, cookies and WebSocket still work. (SECURITY.md, "Browsers"; issue #26.)

One whole gateway (app.py's wiring, signing keys, host and path keys), its sandboxes a static pool
whose one upstream is a fake fleet in this process: it tells sandboxes apart by the ``X-Sandbox-Id``
the gateway adds, records every request and every ``/execute`` each sandbox received, and serves the
attacker's sandbox pages like any dev server would. What "the attacker's page does" is script run in
that page through the DevTools protocol: the same origin, the same cookie jar, the same rules.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.browser import Browser, Page, chromium_binary, launch
from tests.client_gateway import PATH_PREFIX, PREVIEW_DOMAIN, ClientGateway, client_gateway
from tests.proxy_helpers import aiohttp_backend

REBINDING_NAME = "rebind.example"
BOMB = 40        # cookies of 3,900 bytes each: a head of ~156 KB, far past max_header_bytes
VICTIM = ("iso", "alice", "victim-session")
ATTACKER = ("evil", "mallory", "attacker-session")


@dataclass
class Fleet:
    """What every sandbox received, by sandbox ID."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    executed: list[tuple[str, str]] = field(default_factory=list)

    def to(self, sandbox_id: str) -> list[dict[str, Any]]:
        """What ``sandbox_id`` received, but the favicon its own tab asks for whenever it likes."""
        return [r for r in self.requests if r["sandbox"] == sandbox_id and r["path"] != "/favicon.ico"]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        sandbox = request.headers.get("X-Sandbox-Id", "?")
        self.requests.append({"sandbox": sandbox, "path": request.path, "cookie": request.headers.get("Cookie", ""),
                              "site": request.headers.get("Sec-Fetch-Site")})
        if request.headers.get("Upgrade", "").lower() == "websocket":
            ws = web.WebSocketResponse()
            await ws.prepare(request)
            async for message in ws:
                await ws.send_str(f"{sandbox}:{message.data}")
            return ws
        if request.path.endswith("/note.txt"):
            return web.Response(text=f"secret of {sandbox}")
        if request.path.endswith("/execute"):
            self.executed.append((sandbox, await request.text()))
            return web.json_response({"stdout": "ran", "exit_code": 0})
        if request.path.endswith("/echo"):
            return web.json_response({"cookie": request.headers.get("Cookie", ""), "sandbox": sandbox})
        if request.path.endswith("/set-cookies"):
            response = web.Response(text="set")
            for cookie in (f"tossed=1; Domain={PREVIEW_DOMAIN}; Path=/", f"tossed_dot=1; domain=.{PREVIEW_DOMAIN}",
                           "spaced=1; Path =/", "own=1; Path=/", "sgw_access=forged; Path=/"):
                response.headers.add("Set-Cookie", cookie)
            return response
        return web.Response(text=f"<html><body><h1>page of {sandbox}</h1></body></html>", content_type="text/html")


@dataclass
class Tenant:
    sandbox_id: str
    token: str
    host_url: str   # the grant's host URL (?access_token= once)
    path_url: str   # the grant's path URL

    def host(self, gw: Scene, path: str = "/") -> str:
        return f"http://{gw.fleet_port}-{self.sandbox_id}.{PREVIEW_DOMAIN}:{gw.gw.data_port}{path}"

    def path(self, gw: Scene, rest: str = "/") -> str:
        return f"{gw.gw.data_url}{PATH_PREFIX}/{self.sandbox_id}/{gw.fleet_port}{rest}"


@dataclass
class Scene:
    gw: ClientGateway
    fleet: Fleet
    fleet_port: int
    browser: Browser
    victim: Tenant
    attacker: Tenant


@pytest.fixture
async def chromium() -> AsyncIterator[Browser]:
    binary = chromium_binary()
    if binary is None:
        pytest.skip("no chromium here (./scripts/test installs Debian's chromium; CHROMIUM names another): "
                    "the real-browser isolation tests need one")
    async with launch(binary, map_to_loopback=(f"*.{PREVIEW_DOMAIN}", REBINDING_NAME)) as browser:
        yield browser


async def _tenant(gw: ClientGateway, org: str, user: str, session: str) -> Tenant:
    await gw.bind(user, session, org)
    grant = await gw.control("POST", f"/v1/sessions/{session}/access", headers=gw.owner(user, org=org), body={})
    [urls] = grant["urls"]
    return Tenant(grant["sandbox_id"], grant["token"], urls["host"], urls["path"])


@pytest.fixture
async def scene(tmp_path, chromium: Browser) -> AsyncIterator[Scene]:
    fleet = Fleet()
    async with aiohttp_backend(fleet.handle) as backend:
        policy = json.dumps({
            "pools": {"shared": {"provider": "static", "upstreams": [f"http://127.0.0.1:{backend.port}"],
                                 "ports": [backend.port]}},
            "routing": {"prefix_pools": {"default": "shared"}}})
        async with client_gateway(tmp_path, policy=policy, access_token_max_ttl=600) as gw:
            victim = await _tenant(gw, *VICTIM)
            attacker = await _tenant(gw, *ATTACKER)
            assert victim.sandbox_id != attacker.sandbox_id
            yield Scene(gw, fleet, backend.port, chromium, victim, attacker)


async def fetch(page: Page, url: str, **options: Any) -> list[Any]:
    """``fetch`` from ``page``'s own script: [status, body], or ["blocked", why] when the browser refused."""
    return await page.evaluate(  # type: ignore[no-any-return]
        f"fetch({json.dumps(url)}, {json.dumps(options)})"
        ".then(async r => [r.status, r.type === 'opaque' ? 'opaque' : await r.text()])"
        ".catch(e => ['blocked', String(e)])")


async def websocket(page: Page, url: str) -> str:
    """A WebSocket from ``page``: the echo of "hi", or "failed"."""
    return await page.evaluate(  # type: ignore[no-any-return]
        f"new Promise(done => {{ const ws = new WebSocket({json.dumps(url)});"
        " ws.onopen = () => ws.send('hi'); ws.onmessage = e => { done(e.data); ws.close(); };"
        " ws.onerror = () => done('failed'); })")


async def test_path_mode_no_sandbox_content_becomes_a_page_on_the_origin_every_sandbox_shares(scene: Scene):
    """Path URLs are one origin for every sandbox: a page there could read the others' URLs (tokens in
    them), storage and frames, or register a service worker over all of them. So none is made."""
    victim, attacker, fleet = scene.victim, scene.attacker, scene.fleet
    mine = await scene.browser.new_page()
    response = await mine.goto(victim.path_url)  # the grant's path URL, opened in a browser
    assert response["status"] == 403 and "host URL" in await mine.text()
    theirs = await scene.browser.new_page()
    # A page on that origin with script of its own, as an attacker would want one: the gateway's refusal
    # page, its CSP lifted, stands in for it.
    await scene.browser.call("Page.setBypassCSP", {"enabled": True}, session=theirs.session)
    response = await theirs.goto(attacker.path(scene, f"/page?access_token={attacker.token}"))
    assert response["status"] == 403 and "page of" not in await theirs.text()
    assert not [r for r in fleet.requests if r["path"] != "/favicon.ico"]  # neither sandbox served a page
    assert not [c for c in await scene.browser.cookies() if c["name"].endswith("sgw_access")]  # no ambient credential
    # Even from a page on that origin, a sandbox's script cannot become a service worker (its fetch is
    # refused), and another sandbox's path answers nothing without that sandbox's token.
    registered = await theirs.evaluate(
        f"navigator.serviceWorker.register({json.dumps(attacker.path(scene, f'/sw.js?access_token={attacker.token}'))})"
        ".then(() => 'registered', e => 'refused: ' + e)")
    assert registered.startswith("refused"), registered
    assert not [r for r in fleet.requests if r["path"] == "/sw.js"]  # refused by the gateway, not the browser
    read = await fetch(theirs, victim.path(scene, "/note.txt"), credentials="include")
    drive = await fetch(theirs, victim.path(scene, "/execute"), method="POST", credentials="include",
                        body='{"command": "id; echo pwned > pwned.txt"}')
    assert read[0] == 401 and drive[0] == 401 and not fleet.executed, (read, drive)
    # A program that sends the token is served; the answer is marked so no browser makes it a page.
    async with aiohttp.ClientSession() as program, program.get(victim.path(scene, "/note.txt"),
                                                             headers={"Authorization": f"Bearer {victim.token}"}) as got:
        assert (got.status, await got.text()) == (200, f"secret of {victim.sandbox_id}")
        assert got.headers["Content-Security-Policy"] == "sandbox" and got.headers["Referrer-Policy"] == "no-referrer"


async def test_host_mode_cookie_rides_only_on_the_sandboxs_own_requests(scene: Scene):
    victim, attacker, fleet = scene.victim, scene.attacker, scene.fleet
    mine = await scene.browser.new_page()
    response = await mine.goto(victim.host_url)  # ?access_token= swapped for a cookie, then the page
    assert response["status"] == 200 and "access_token" not in await mine.url()
    # The victim's own page: same-origin reads and writes, its own cookies, a WebSocket, a form.
    assert await fetch(mine, "/note.txt") == [200, f"secret of {victim.sandbox_id}"]
    assert (await fetch(mine, "/execute", method="POST", body='{"command": "ls"}'))[0] == 200
    await mine.evaluate("document.cookie = 'theme=dark; path=/'")
    assert json.loads((await fetch(mine, "/echo"))[1])["cookie"] == "theme=dark"  # the access cookie cut out
    assert await websocket(mine, victim.host(scene, "/ws").replace("http://", "ws://")) == f"{victim.sandbox_id}:hi"
    executed = len(fleet.executed)
    await mine.evaluate("const f = document.createElement('form'); f.method = 'POST'; f.action = '/execute';"
                        " document.body.appendChild(f); setTimeout(() => f.submit(), 0); true")
    await _until(lambda: len(fleet.executed) == executed + 1)

    theirs = await scene.browser.new_page()
    assert (await theirs.goto(attacker.host_url))["status"] == 200
    before = len(fleet.to(victim.sandbox_id))
    read = await fetch(theirs, victim.host(scene, "/note.txt"), credentials="include")
    assert read[0] == "blocked"  # CORS hides the answer; the gateway refused it anyway (below)
    drive = await fetch(theirs, victim.host(scene, "/execute"), method="POST", mode="no-cors", credentials="include",
                        body='{"command": "id; echo pwned > pwned.txt"}')
    assert drive == [0, "opaque"]
    assert await websocket(theirs, victim.host(scene, "/ws").replace("http://", "ws://")) == "failed"
    await theirs.evaluate(f"new Promise(done => {{ const f = document.createElement('iframe');"
                          f" f.src = {json.dumps(victim.host(scene, '/note.txt'))}; f.onload = done;"
                          " document.body.appendChild(f); })")
    assert fleet.to(victim.sandbox_id)[before:] == []  # not one of them reached the victim's sandbox
    scene.gw.gateway.metrics.exposition()  # folds what the data plane batched
    denied = scene.gw.gateway.metrics.registry.get_sample_value("sgw_security_denials_total",
                                                                {"reason": "cross_site_request"})
    assert denied is not None and denied >= 4  # read, drive, WebSocket, iframe: each refused, each counted
    assert [e for e in fleet.executed if e[0] == victim.sandbox_id] == [(victim.sandbox_id, '{"command": "ls"}'),
                                                                         (victim.sandbox_id, "")]
    # A link the user follows (a top-level navigation) still opens the victim's own page with its cookie.
    assert (await theirs.goto(victim.host(scene, "/page")))["status"] == 200


async def test_host_mode_tossed_cookies_stay_home_and_a_cookie_bomb_costs_one_request(scene: Scene):
    victim, attacker = scene.victim, scene.attacker
    mine = await scene.browser.new_page()
    assert (await mine.goto(victim.host_url))["status"] == 200
    theirs = await scene.browser.new_page()
    assert (await theirs.goto(attacker.host_url))["status"] == 200
    assert (await fetch(theirs, "/set-cookies"))[0] == 200
    jar = {c["name"]: c for c in await scene.browser.cookies()}
    attacker_host = f"{scene.fleet_port}-{attacker.sandbox_id}.{PREVIEW_DOMAIN}"
    assert jar["tossed"]["domain"] == jar["tossed_dot"]["domain"] == attacker_host  # host-only: Domain dropped
    assert jar["own"]["domain"] == attacker_host and jar["sgw_access"]["value"] != "forged"
    assert json.loads((await fetch(mine, "/echo"))[1])["cookie"] == ""

    # A cookie bomb set by script on the parent domain (no gateway can stop a script doing that)...
    await theirs.evaluate(f"for (let i = 0; i < {BOMB}; i++) document.cookie = 'bomb' + i + '=' + 'x'.repeat(3900)"
                          f" + '; domain={PREVIEW_DOMAIN}; path=/'")
    # (document.cookie hands them to the browser's cookie store, which takes them in its own time.)
    await _until_async(lambda: _bombs(scene.browser), BOMB)
    # ...costs the victim one request: 431 with every cookie it carried expired, the access cookie kept.
    # (Chromium's cookie store takes script writes in its own time: the bomb may ride from the first
    # request or a later one. Either way one answer of 431, at most, and the pages after it are served.)
    statuses = []
    for _ in range(3):
        statuses.append((await mine.goto(victim.host(scene, "/page")))["status"])
        if statuses[-1] == 431:
            assert "cookies were expired" in await mine.text()
            await _until_async(lambda: _bombs(scene.browser), 0)
    assert statuses.count(431) <= 1 and statuses[-1] == 200, statuses
    assert "page of " + victim.sandbox_id in await mine.text()


async def test_the_gateway_answers_only_the_hosts_it_serves(scene: Scene):
    page = await scene.browser.new_page()
    control_port = scene.gw.gateway.control_address[1]  # type: ignore[index]
    for port in (control_port, scene.gw.data_port):  # a page whose own name now points at 127.0.0.1
        response = await page.goto(f"http://{REBINDING_NAME}:{port}/healthz")
        assert response["status"] == 421 and "host_not_allowed" in await page.text()
    assert (await page.goto(f"http://localhost:{control_port}/healthz"))["status"] == 200


async def _bombs(browser: Browser) -> int:
    return len([c for c in await browser.cookies() if c["name"].startswith("bomb")])


async def _until_async(read: Any, wanted: Any, timeout: float = 10.0) -> None:
    """Poll the browser until ``read()`` gives ``wanted`` (its cookie store sends no event to await)."""
    async with asyncio.timeout(timeout):
        while await read() != wanted:
            await asyncio.sleep(0.05)


async def _until(condition: Any, timeout: float = 10.0) -> None:
    """Wait for a condition the fleet's handler makes true (it runs on this loop: no event to await)."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)

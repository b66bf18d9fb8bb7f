"""The browser rules in raw HTTP (SECURITY.md, "Browsers"; tests/test_browser_isolation.py drives a real
Chromium through the same cases): each Fetch Metadata combination and its Origin/Referer fallbacks
on a request that carries only the preview cookie, a sandbox's Set-Cookie spellings, a cookie-bombed
head, and the Host values the gateway answers or refuses."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from gateway.hosts import AllowedHosts, default_allowed_hosts
from gateway.proxy._browser import (
    CookieNames, host_only_cookies, private_to_caches, rewrite_under_prefix, sandbox_cookie, without_clear_site_data,
)
from tests.client_gateway import ClientGateway, client_gateway
from tests.test_preview import DOMAIN, Preview, get, preview  # noqa: F401  (the fixture)

ALLOWED = 200
CROSS_SITE = 403


@pytest.mark.parametrize(("method", "headers", "expected"), [
    pytest.param("GET", {"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors"}, ALLOWED, id="same-origin fetch"),
    pytest.param("POST", {"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "navigate"}, ALLOWED, id="same-origin form"),
    pytest.param("GET", {"Sec-Fetch-Site": "none", "Sec-Fetch-Mode": "navigate"}, ALLOWED, id="typed address"),
    pytest.param("GET", {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"},
                 ALLOWED, id="link from a sibling, top-level"),
    pytest.param("HEAD", {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}, ALLOWED,
                 id="link from elsewhere, no dest"),
    pytest.param("GET", {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "cors"}, CROSS_SITE, id="sibling's fetch"),
    pytest.param("POST", {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "no-cors"}, CROSS_SITE,
                 id="sibling's blind no-cors POST"),
    pytest.param("POST", {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"},
                 CROSS_SITE, id="cross-site form POST"),
    pytest.param("GET", {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "iframe"},
                 CROSS_SITE, id="framed by a sibling"),
    pytest.param("GET", {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "websocket"}, CROSS_SITE,
                 id="sibling's WebSocket"),
    pytest.param("GET", {"sec-fetch-site": "SAME-SITE", "SEC-FETCH-MODE": "CORS"}, CROSS_SITE, id="any case"),
    pytest.param("GET", {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "cors", "Origin": "{own}"}, CROSS_SITE,
                 id="metadata wins over a matching Origin"),
    # No Fetch Metadata (an older browser, or plain http to a name it does not trust): Origin, then Referer.
    pytest.param("POST", {"Origin": "{own}"}, ALLOWED, id="own Origin"),
    pytest.param("POST", {"Origin": "http://80-other.preview.localhost"}, CROSS_SITE, id="sibling's Origin"),
    pytest.param("GET", {"Origin": "null"}, CROSS_SITE, id="opaque Origin"),
    pytest.param("POST", {"Referer": "{own}/page"}, ALLOWED, id="own Referer"),
    pytest.param("POST", {"Referer": "http://evil.example/x"}, CROSS_SITE, id="foreign Referer on a POST"),
    pytest.param("GET", {"Referer": "http://evil.example/x"}, ALLOWED, id="foreign Referer on a GET: a navigation"),
    pytest.param("POST", {}, ALLOWED, id="nothing: a program with a cookie jar"),
])
async def test_the_cookie_alone_opens_a_preview_host_only_for_its_own_pages(preview: Preview, method: str,  # noqa: F811
                                                                            headers: dict[str, str], expected: int):
    token = await preview.mint()
    own = f"http://{preview.host()}"
    sent = {name: value.replace("{own}", own) for name, value in headers.items()}
    async with aiohttp.ClientSession() as client, client.request(
            method, preview.url + "/x", allow_redirects=False,
            headers={"Host": preview.host(), "Cookie": f"sgw_access={token}", **sent}) as response:
        body = await response.text()
        assert response.status == expected, body
    if expected == CROSS_SITE and method != "HEAD":
        assert "cross_site_request" in body
    # A bearer token is never held to this: no browser attaches one by itself.
    async with aiohttp.ClientSession() as client, client.request(
            method, preview.url + "/x", allow_redirects=False,
            headers={"Host": preview.host(), "Authorization": f"Bearer {token}", **sent}) as response:
        assert response.status == ALLOWED


async def test_a_refused_navigation_is_a_page(preview: Preview):  # noqa: F811
    token = await preview.mint()
    status, headers, body = await get(preview, "/x", headers={
        "Host": preview.host(), "Cookie": f"sgw_access={token}", "Sec-Fetch-Site": "same-site",
        "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "iframe"})
    assert status == 403 and headers["Content-Type"].startswith("text/html") and "cross_site_request" in body


PREFIX = b"/s/ses-x/80"


@pytest.mark.parametrize(("value", "host_mode", "path_mode"), [
    pytest.param(b"a=1; Domain=preview.localhost; Path=/", b"a=1; Path=/", b"a=1; Path=/s/ses-x/80/", id="Domain"),
    pytest.param(b"a=1; domain=.preview.localhost", b"a=1", b"a=1", id="domain with a dot, lower case"),
    pytest.param(b"a=1;DOMAIN = preview.localhost ;path=/app", b"a=1; Path=/app", b"a=1; Path=/s/ses-x/80/app",
                 id="spaces and upper case"),
    pytest.param(b"k=1; Path =/", b"k=1; Path=/", b"k=1; Path=/s/ses-x/80/", id="space before ="),
    pytest.param(b"k=1; Path=/a; Path=/b", b"k=1; Path=/b", b"k=1; Path=/s/ses-x/80/b", id="the last Path counts"),
    pytest.param(b"k=1; Path=relative", b"k=1; Path=relative", b"k=1; Path=relative",
                 id="a Path not starting with /: the browser's default, under the prefix"),
    pytest.param(b"k=1; HttpOnly; Secure; SameSite=None", b"k=1; HttpOnly; Secure; SameSite=None",
                 b"k=1; HttpOnly; Secure; SameSite=None", id="no Path: other attributes kept"),
    pytest.param(b"sgw_access=forged; Path=/", None, None, id="the gateway's own cookie"),
    pytest.param(b"__Host-sgw_access=forged; Path=/; Secure", None, None, id="its host-prefixed name"),
    pytest.param(b" SGW_ACCESS =x", None, None, id="its name in any case and spacing"),
    pytest.param(b"novalue", None, None, id="no name-value pair"),
])
def test_a_sandbox_sets_cookies_for_itself_alone(value: bytes, host_mode: bytes | None, path_mode: bytes | None):
    assert sandbox_cookie(value, None) == host_mode
    assert sandbox_cookie(value, PREFIX) == path_mode
    head = b"HTTP/1.1 200 OK\r\nSet-COOKIE:  " + value + b"\r\nX-Other: 1"
    expected_host = b"HTTP/1.1 200 OK" + (b"\r\nSet-COOKIE: " + host_mode if host_mode else b"") + b"\r\nX-Other: 1"
    assert host_only_cookies(head) == expected_host
    expected_path = b"HTTP/1.1 200 OK" + (b"\r\nSet-COOKIE: " + path_mode if path_mode else b"") + b"\r\nX-Other: 1"
    assert rewrite_under_prefix(head, PREFIX, ()) == expected_path


@pytest.mark.parametrize(("head", "added"), [
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 0", True, id="no Cache-Control"),
    pytest.param(b"HTTP/1.1 200 OK\r\nCache-Control: public, max-age=3600", True, id="public: private wins"),
    pytest.param(b"HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\ncache-control: Private", False, id="private"),
    pytest.param(b"HTTP/1.1 200 OK\r\nCache-Control: no-store", False, id="no-store"),
])
def test_a_response_a_preview_credential_opened_is_private_to_caches(head: bytes, added: bool):
    assert private_to_caches(head, head.lower()) == (head + b"\r\nCache-Control: private" if added else head)


def test_a_sandbox_cannot_clear_the_sites_data():
    head = b"HTTP/1.1 200 OK\r\nClear-Site-Data: \"cookies\", \"storage\"\r\nclear-site-data: *\r\nX-Kept: 1"
    assert without_clear_site_data(head) == b"HTTP/1.1 200 OK\r\nX-Kept: 1"


def test_cookie_names_are_read_from_a_head_in_any_pieces():
    head = (b"GET /x HTTP/1.1\r\nHost: h\r\nX-Long: " + b"y" * 3000 + b"\r\nSec-Fetch-Mode: navigate\r\nCookie: a=1; b=" + b"x" * 5000
            + b"; __Host-sgw_access=t; sgw_access=t; c=3\r\ncookie: d=4; SGW_ACCESS=bomb\r\n\r\nGET /next HTTP/1.1\r\nCookie: e=5\r\n\r\n")
    for size in (1, 7, 100, 4096, len(head)):
        names = CookieNames()
        ended = False
        for start in range(0, len(head), size):
            if names.feed(head[start:start + size]):
                ended = True
                break
        assert ended and list(names.names) == [b"a", b"b", b"c", b"d", b"SGW_ACCESS"] and names.navigation, size
    assert names.paths == [b"/", b"/x", b"/x/"]
    assert names.clearing("sbx.p.example") == [
        name + b"=; Max-Age=0; Path=" + path + scope for name in (b"a", b"b", b"c", b"d", b"SGW_ACCESS")
        for path in names.paths for scope in (b"", b"; Domain=sbx.p.example", b"; Domain=p.example")]


@pytest.mark.parametrize(("request_line", "paths"), [
    pytest.param(b"GET / HTTP/1.1", [b"/"], id="root"),
    pytest.param(b"GET /app HTTP/1.1", [b"/", b"/app", b"/app/"], id="a page at the root"),
    pytest.param(b"GET /app/x/y?q=/a/b HTTP/1.1",
                 [b"/", b"/app", b"/app/", b"/app/x", b"/app/x/", b"/app/x/y", b"/app/x/y/"],
                 id="the path and its ancestors"),
    pytest.param(b"GET /1/2/3/4/5/6/7/8/9/10 HTTP/1.1",
                 [b"/"] + [b"/" + b"/".join(b"%d" % n for n in range(1, depth + 1)) + end
                           for depth in range(1, 9) for end in (b"", b"/")], id="at most eight deep"),
    pytest.param(b"GET /a/b;Domain=evil/c HTTP/1.1", [b"/", b"/a", b"/a/"],
                 id="no segment that would add an attribute to our Set-Cookie"),
    pytest.param(b"GET http://h:1/app/x HTTP/1.1", [b"/", b"/app", b"/app/", b"/app/x", b"/app/x/"], id="absolute-form"),
])
def test_a_bomb_is_expired_on_every_path_it_may_be_scoped_to(request_line: bytes, paths: list[bytes]):
    names = CookieNames()
    assert names.feed(request_line + b"\r\nCookie: bomb=1\r\n\r\n")
    assert names.paths == paths
    assert names.clearing(None) == [b"bomb=; Max-Age=0; Path=" + path for path in paths]


async def test_a_cookie_bombed_head_is_answered_with_its_cookies_expired(preview: Preview):  # noqa: F811
    token = await preview.mint()
    bomb = "; ".join(f"bomb{i}={'x' * 3900}" for i in range(40))
    head = (f"GET /x HTTP/1.1\r\nHost: {preview.host()}\r\nCookie: sgw_access={token}; {bomb}\r\n"
            "Accept: application/json\r\n\r\n").encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", preview.port)
    try:
        for start in range(0, len(head), 20_000):  # in pieces, as a slow network delivers it
            writer.write(head[start:start + 20_000])
            await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)  # the gateway closes after answering
    finally:
        writer.close()
    status_line, _, rest = answer.partition(b"\r\n")
    head_lines, _, body = rest.partition(b"\r\n\r\n")
    assert status_line.startswith(b"HTTP/1.1 431 ") and b"header_too_large" in body
    cleared = [line[len("set-cookie: "):].decode() for line in head_lines.split(b"\r\n")
               if line.lower().startswith(b"set-cookie: ")]
    assert len(cleared) == 40 * 3 * 2 and not [c for c in cleared if "sgw_access" in c]  # paths /, /x, /x/; two scopes
    assert f"bomb39=; Max-Age=0; Path=/; Domain={DOMAIN}" in cleared and "bomb0=; Max-Age=0; Path=/" in cleared


@pytest.mark.parametrize(("host", "answered"), [
    pytest.param(None, True, id="no Host (HTTP/1.0)"),
    pytest.param(b"localhost", True, id="localhost"),
    pytest.param(b"LOCALHOST:8080", True, id="localhost, any case, a port"),
    pytest.param(b"localhost.", True, id="a trailing dot"),
    pytest.param(b"app.localhost:1", True, id="a name under localhost"),
    pytest.param(b"127.0.0.1:8080", True, id="an IPv4 literal"),
    pytest.param(b"10.1.2.3", True, id="a pod IP (probes): rebinding needs a name"),
    pytest.param(b"[::1]:8080", True, id="an IPv6 literal"),
    pytest.param(b"80-ses-x.preview.localhost:9", True, id="a preview host"),
    pytest.param(b"gw.example.com", True, id="public_url's host"),
    pytest.param(b"attacker.example", False, id="a foreign name: DNS rebinding"),
    pytest.param(b"localhost.attacker.example", False, id="localhost as a label of a foreign name"),
    pytest.param(b"preview.localhost.evil.example", False, id="the preview domain inside a foreign name"),
    pytest.param(b"[::1", False, id="a broken IPv6 literal"),
    pytest.param(b"localhost:http", False, id="a port that is not a number"),
    pytest.param(b"\xffhost", False, id="not ASCII"),
])
def test_the_hosts_answered(host: bytes | None, answered: bool):
    hosts = AllowedHosts(default_allowed_hosts("127.0.0.1") or [], preview_domain="preview.localhost",
                         public_url="https://gw.example.com")
    assert hosts.allows(host) is answered
    assert hosts.allows(host) is answered  # cached
    assert AllowedHosts(["*"]).allows(host)
    assert default_allowed_hosts("0.0.0.0") is None  # off loopback the operator must say


@pytest.fixture
async def gw(tmp_path: Any) -> Any:
    async with client_gateway(tmp_path) as gateway:
        yield gateway


@pytest.mark.parametrize("port", ["data", "control"])
async def test_a_foreign_host_is_refused_on_both_ports(gw: ClientGateway, port: str):
    url = gw.data_url if port == "data" else gw.control_url
    registry = gw.gateway.metrics.registry
    async with aiohttp.ClientSession() as client:
        async with client.get(url + "/healthz", headers={"Host": "attacker.example"}) as response:
            assert response.status == 421
            assert (await response.json())["error"]["code"] == "host_not_allowed"
            assert "allowed_hosts" in (await response.json())["error"]["message"]
        gw.gateway.metrics.exposition()  # folds what the data plane batched
        assert registry.get_sample_value("sgw_security_denials_total", {"reason": "host_not_allowed"}) == 1.0
        async with client.get(url + "/healthz", headers={"Host": "localhost"}) as response:
            assert response.status != 421
    reader, writer = await asyncio.open_connection(*url.removeprefix("http://").split(":"))
    writer.write(b"GET http://attacker.example/healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 421 ") and b"host_not_allowed" in answer  # absolute-form names the host

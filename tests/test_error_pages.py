"""Errors for browsers: a navigation gets the same status, code and message as a small HTML page
(everything it quotes escaped); every other client keeps the JSON shape. One rendering
(gateway.errors.render) serves the data plane and the control API."""

from __future__ import annotations

import html
import json

import aiohttp
import pytest

from gateway import errors
from gateway.api import create_control_app
from gateway.errors import BadRequest, NotFound
from gateway.metrics import Metrics
from gateway.model import Endpoint
from tests.proxy_helpers import FakeResolver, dead_port, identity_headers, resolver_class, start_gateway

__all__ = ["resolver_class", "start_gateway"]  # fixtures

CHROME_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8"
HOSTILE = '<script>alert("x")</script> & \'quoted\''


@pytest.mark.parametrize(("fetch_mode", "accept", "html_page"), [
    pytest.param("navigate", None, True, id="fetch metadata says navigate"),
    pytest.param(b"Navigate", b"*/*", True, id="navigate wins over accept (bytes, any case)"),
    pytest.param(None, CHROME_ACCEPT, True, id="browser accept without fetch metadata"),
    pytest.param(None, "text/html, application/json", False, id="accept names json too"),
    pytest.param("cors", "*/*", False, id="fetch() from a page"),
    pytest.param(None, "application/json", False, id="an SDK"),
    pytest.param(None, "*/*", False, id="curl"),
    pytest.param(None, None, False, id="no headers at all"),
    pytest.param(None, "", False, id="empty accept"),
])
def test_what_counts_as_a_navigation(fetch_mode, accept, html_page):
    assert errors.wants_html(fetch_mode, accept) is html_page


def test_the_page_escapes_what_it_quotes():
    exc = BadRequest(f"bad header {HOSTILE}", code="invalid_identity", sandbox_id="ses-<b>")
    content_type, body, headers = errors.render(exc, as_html=True)
    page = body.decode()
    assert content_type == "text/html; charset=utf-8"
    assert "<script>" not in page and "<b>" not in page
    assert html.escape(f"bad header {HOSTILE}") in page and "ses-&lt;b&gt;" in page
    assert "<title>400 invalid_identity</title>" in page
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Content-Security-Policy"].startswith("default-src 'none'")


def test_headers_of_the_error_survive_in_both_shapes():
    exc = errors.CapacityExceeded("pool small is full", scope="pool", retry_after=7)
    for as_html in (False, True):
        assert errors.render(exc, as_html=as_html)[2]["Retry-After"] == "7"
    assert json.loads(errors.render(exc)[1]) == {"error": {"code": "capacity_exceeded", "message": "pool small is full"}}


# -- data plane -------------------------------------------------------------------------------
async def test_data_plane_answers_a_navigation_with_a_page(start_gateway) -> None:
    resolver = FakeResolver(Endpoint("127.0.0.1", dead_port()))
    resolver.error = NotFound(f"no session {HOSTILE} for this identity")
    gw = await start_gateway(resolver)
    async with aiohttp.ClientSession() as client:
        browser = identity_headers(**{"Sec-Fetch-Mode": "navigate", "Accept": CHROME_ACCEPT})
        async with client.get(f"{gw.url}/app/", headers=browser) as response:
            assert response.status == 404
            assert response.headers["Content-Type"] == "text/html; charset=utf-8"
            assert response.headers["X-Request-Id"]
            page = await response.text()
        assert "<h1>404 not_found</h1>" in page and html.escape(resolver.error.message) in page
        assert "<script>" not in page
        # the same connection, a program: JSON as before
        async with client.get(f"{gw.url}/app/", headers=identity_headers(Accept="application/json")) as response:
            assert response.status == 404 and response.headers["Content-Type"] == "application/json"
            assert await response.json() == {"error": {"code": "not_found", "message": resolver.error.message}}


async def test_data_plane_upstream_failure_page_names_the_sandbox(start_gateway, resolver_class) -> None:
    gw = await start_gateway(resolver_class(Endpoint("127.0.0.1", dead_port()), sandbox_id="ses-gone"))
    async with aiohttp.ClientSession() as client:
        async with client.get(f"{gw.url}/", headers=identity_headers(Accept=CHROME_ACCEPT)) as response:
            assert response.status == 502
            page = await response.text()
    assert "502 upstream_unreachable" in page and "<code>ses-gone</code>" in page


# -- control API ------------------------------------------------------------------------------
class _NoSessions:
    """The control API needs only ``lookup`` here: every session is unknown."""

    async def lookup(self, session_id, caller):  # type: ignore[no-untyped-def]
        raise NotFound(f"no session {session_id!r}")


@pytest.fixture
async def control(aiohttp_client):
    async def ready() -> list[str]:
        return []

    return await aiohttp_client(create_control_app(_NoSessions(), ready, Metrics()))  # type: ignore[arg-type]


async def test_control_api_answers_a_navigation_with_a_page(control) -> None:
    response = await control.get("/v1/sessions/a<i>b", headers={"Sec-Fetch-Mode": "navigate"})
    assert response.status == 404 and response.content_type == "text/html"
    page = await response.text()
    assert "404 not_found" in page and "a&lt;i&gt;b" in page and "<i>" not in page
    response = await control.get("/v1/sessions/a<i>b")
    assert response.status == 404 and await response.json() == {"error": {"code": "not_found",
                                                                          "message": "no session 'a<i>b'"}}


async def test_control_api_routing_errors_are_pages_too(control) -> None:
    response = await control.get("/no/such/call", headers={"Accept": CHROME_ACCEPT})
    assert response.status == 404 and response.content_type == "text/html"
    assert "404 not_found" in await response.text()
    response = await control.post("/v1/route", headers={"Accept": CHROME_ACCEPT})
    assert response.status == 405 and "method_not_allowed" in await response.text()

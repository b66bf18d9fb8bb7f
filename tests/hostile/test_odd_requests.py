"""Odd but valid requests (traversal, forged routing headers, absolute forms, odd versions) reach only
the caller's own sandbox."""

from __future__ import annotations

from typing import Any

import pytest

from tests.hostile.harness import (
    HOST, MAX_BODY, W, body_length, Build, echoed, forwarded_only_by_the_gateway, Hostile, no_credentials, Own,
    send, walker, Err, get, check_rejected,
)

FOREIGN_HOST = Err(421, "host_not_allowed", "this gateway does not answer for Host")


def _with_host(host: bytes, target: bytes = b"/echo/x") -> Build:
    """A request of the case's own session whose Host (or absolute target) names ``host``."""
    return lambda s: get(target)(s).replace(b"Host: gw\r\n", b"Host: " + host + b"\r\n")


# DNS rebinding: a page whose own name now points at the gateway sends that name; only the names the
# gateway serves (allowed_hosts: here "gw" and "gateway") are answered, whatever else the request says.
FOREIGN_HOST_CASES = [
    pytest.param(_with_host(b"evil.example:22"), id="host-header-names-another-host"),
    pytest.param(_with_host(b"gw.evil.example"), id="an-allowed-name-as-a-label-of-another"),
    pytest.param(_with_host(b"evil-gw"), id="an-allowed-name-as-a-suffix"),
    pytest.param(_with_host(b"gw", b"http://evil.example:22/echo/x?q=1"), id="absolute-form-caller-chosen-host"),
    pytest.param(_with_host(b"gw\xc3\xa9"), id="an-allowed-name-with-non-ascii"),
]


@pytest.mark.parametrize("build", FOREIGN_HOST_CASES)
async def test_hosts_the_gateway_does_not_serve_are_refused(gw: Hostile, request: pytest.FixtureRequest,
                                                           build: Build) -> None:
    await check_rejected(gw, request, build, FOREIGN_HOST)

pytestmark = pytest.mark.asyncio(loop_scope="package")

ECHO = b"/echo/"
TRAVERSALS = [
    ("dotdot", "/echo/../../../etc/passwd"),
    ("dotdot-back-into-echo", "/echo/a/../../echo/b"),
    ("percent-2e2e", "/echo/%2e%2e/%2e%2e/etc/passwd"),
    ("percent-2E2E-uppercase", "/echo/%2E%2E%2F%2E%2E%2Fetc"),
    ("percent-2f-slash", "/echo/..%2f..%2f..%2fetc%2fpasswd"),
    ("double-encoded", "/echo/%252e%252e%252f%252e%252e%252fetc"),
    ("overlong-utf8-dots", "/echo/%c0%ae%c0%ae%c0%af%c0%ae%c0%ae"),
    ("backslashes", "/echo/..\\..\\..\\windows"),
    ("semicolon-path-param", "/echo/..;/..;/etc"),
    ("percent-00", "/echo/%00/../x"),
    ("traversal-in-query", "/echo/x?file=../../etc/passwd&to=%2e%2e%2f"),
    ("fragment", "/echo/x#/../../y"),
]
OWN_CASES: list[Any] = [
    *(pytest.param(walker(b"GET " + path.encode() + b" HTTP/1.1"), Own(200, raw_path=path), id=f"path-{name}")
      for name, path in TRAVERSALS),
    pytest.param(walker(b"GET /download/..%2F..%2F..%2Fetc%2Fpasswd HTTP/1.1"), Own(403, code="path_outside_root"),
                 id="download-percent-encoded-traversal"),
    pytest.param(walker(b"GET /download/../../etc/passwd HTTP/1.1"), Own(403, code="path_outside_root"),
                 id="download-dotdot"),
    pytest.param(walker(b"GET /download/%2e%2e/%2e%2e/etc/passwd HTTP/1.1"), Own(403, code="path_outside_root"),
                 id="download-percent-2e2e"),
    pytest.param(walker(b"GET /list/..%2F..%2F HTTP/1.1"), Own(403, code="path_outside_root"), id="list-traversal"),
    pytest.param(walker(b"GET /exists/..%2F..%2Fetc%2Fpasswd HTTP/1.1"), Own(403, code="path_outside_root"),
                 id="exists-traversal"),
    # Absolute-form goes upstream in origin-form; its authority replaces Host (RFC 9112 3.2.2), which the
    # sandbox sees only as X-Forwarded-Host: the gateway never connects where a caller says. A name the
    # gateway does not answer for (allowed_hosts: DNS rebinding) is refused, in Host or in the target.
    pytest.param(walker(b"GET http://gw:22/echo/x?q=1 HTTP/1.1"),
                 Own(200, raw_path="/echo/x?q=1", check=echoed("X-Forwarded-Host", lambda v: v == "gw:22")),
                 id="absolute-form-caller-chosen-port"),
    pytest.param(walker(b"GET http://127.0.0.1:1/echo/x HTTP/1.1"), Own(200, raw_path="/echo/x"),
                 id="absolute-form-loopback-port"),
    pytest.param(walker(b"GET HTTPS://gateway?x=1 HTTP/1.1"), Own(200),  # the runtime's own "/"
                 id="absolute-form-without-a-path"),
    pytest.param(walker(b"GET //evil.example/echo/x HTTP/1.1"), Own(404, code="not_found"),
                 id="scheme-relative-target"),
    pytest.param(walker(b"OPTIONS * HTTP/1.1"), Own(404, code="not_found"), id="asterisk-form"),
    pytest.param(lambda s: walker(b"GET /echo/x HTTP/1.1")(s).replace(b"Host: gw\r\n", b"Host: GW.\r\n"),
                 Own(200, raw_path="/echo/x"), id="host-header-allowed-name-any-case-trailing-dot"),
    pytest.param(walker(b"GET /echo/x HTTP/1.1", b"X-Sandbox-Id: org-0000\r\nX-Sandbox-ID: ses-1\r\n"
                                                 b"X-Sandbox-Namespace: kube-system\r\nX-Sandbox-Port: 22\r\n"),
                 Own(200, raw_path="/echo/x"), id="forged-sandbox-routing-headers"),
    pytest.param(walker(b"GET /echo/x HTTP/1.1", b"Connection: keep-alive, X-Sandbox-Id, X-Forwarded-For\r\n"),
                 Own(200, raw_path="/echo/x", check=echoed("X-Forwarded-For", lambda v: v == HOST)),
                 id="connection-names-gateway-headers"),
    pytest.param(walker(b"GET /echo/x HTTP/1.1", b"X-Forwarded-For: 10.0.0.1\r\nForwarded: for=10.0.0.1\r\n"),
                 Own(200, check=forwarded_only_by_the_gateway), id="spoofed-forwarded-for"),
    pytest.param(walker(b"GET /echo/x HTTP/1.1", b"X-Request-Id: evil\xff\r\n"),
                 Own(200, check=echoed("X-Request-Id", lambda v: v is not None and "evil" not in v)),
                 id="non-token-request-id-replaced"),
    pytest.param(walker(b"TRACE /echo/x HTTP/1.1", b"Authorization: Bearer secret\r\nProxy-Authorization: Basic x\r\n"),
                 Own(200, check=no_credentials), id="trace-with-credentials"),
    pytest.param(walker(b"GET /echo/x HTTP/1.0"), Own(200, raw_path="/echo/x"), id="http-1.0"),
    pytest.param(walker(b"GET /echo/x"), Own(200, raw_path="/echo/x"), id="http-0.9-style-line-with-headers"),
    pytest.param(lambda s: b"\r\n\r\nGET /echo/x HTTP/1.1\r\n" + W + b"\r\n", Own(200, raw_path="/echo/x"),
                 id="empty-lines-before-request"),
    pytest.param(walker(b"GET  /echo/x HTTP/1.1"), Own(200, raw_path="/echo/x"), id="double-space-in-request-line"),
    pytest.param(walker(b"GET /echo/x HTTP/1.1", b"Upgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\n"
                                                 b"HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n"),
                 Own(200, raw_path="/echo/x"), id="h2c-upgrade-ignored"),
    pytest.param(walker(b"GET /ws HTTP/1.1", b"Upgrade: websocket\r\nConnection: Upgrade\r\n"),
                 Own(400, code="bad_request"), id="websocket-upgrade-without-key"),
    pytest.param(walker(b"POST /echo/x HTTP/1.1", b"Expect: 999-nonsense\r\nContent-Length: 2\r\n", b"ab"),
                 Own(417), id="unknown-expectation"),
    pytest.param(walker(b"GET /echo/x HTTP/1.1", "X-Note: caf\u00e9 \u202e\r\n".encode()),
                 Own(200, check=echoed("X-Note", lambda v: v is not None and "caf" in v)), id="utf8-in-plain-header"),
    pytest.param(walker(b"POST /echo/x HTTP/1.1", b"Transfer-Encoding: chunked\r\n", b"3\r\nabc\r\n0\r\n\r\n"),
                 Own(200, check=body_length(3)), id="valid-chunked-body"),
    pytest.param(walker(b"POST /echo/x HTTP/1.1", b"Content-Length: %d\r\n" % MAX_BODY, b"x" * MAX_BODY),
                 Own(200, check=body_length(MAX_BODY)), id="body-at-max-body"),
]


@pytest.mark.parametrize(("build", "expected"), OWN_CASES)
async def test_odd_but_valid_requests_reach_only_the_callers_sandbox(gw: Hostile, build: Build, expected: Own) -> None:
    own = gw.bound["walker"]
    response, _ = await send(gw.data_port, build(b""))
    assert response is not None, "the gateway closed the connection without an answer"
    assert response.status == expected.status, (response.status, response.body[:300])
    assert response.headers.get(b"x-runtime-sandbox-id") == own.encode(), "answered by another sandbox (or none)"
    if expected.code is not None:
        assert response.json()["error"]["code"] == expected.code
    if response.status == 200 and response.headers.get(b"content-type", b"").startswith(b"application/json"):
        report = response.json()
        if "raw_path" in report:  # an /echo report
            assert report["sandbox_id"] == own
            assert report["headers"]["X-Sandbox-Id"] == own
            if expected.raw_path is not None:
                assert report["raw_path"] == expected.raw_path, "the path was rewritten on the way"
            if expected.check is not None:
                expected.check(report)

"""Credentials are read one way: hostile spellings of Authorization, Host and the identity headers
against one real ``sandbox-gateway serve``.

One gateway serves the module in token mode (one HS256 key: data tokens for the data plane, admin
tokens for the control API) with a static pool whose only upstream is a recording raw server in
this process, so every test can see the exact head a sandbox would have received.

* A request the gateway refuses gets the documented ``{"error": {"code", "message"}}`` with its
  status and code, and the recorder proves nothing reached a sandbox.
* A request that is odd but allowed (a lower-case ``bearer``, HTTP/1.0 without ``Host``,
  underscore look-alikes of the identity headers) is forwarded, and the recorder proves that no
  credential, identity or look-alike header went with it.
* The control port answers malformed HTTP in the same JSON shape (aiohttp's own answer is plain
  text that quotes the request bytes back) and refuses duplicate credentials too.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio

from gateway.auth import ADMIN_AUDIENCE, KeySet, issue_token
from tests.gateway_process import GatewayProcess
from tests.proxy_helpers import raw_backend, raw_client, read_head, read_response

pytestmark = pytest.mark.asyncio(loop_scope="module")

SECRET = "hostile-credentials-secret-of-32+-bytes"
IO_TIMEOUT = 10.0
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


@dataclass
class Recorder:
    """The sandbox: answers 200 to every request and keeps each request head as it arrived."""

    heads: list[bytes] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")  # every request here is body-less
            self.heads.append(head)
            writer.write(OK)
            await writer.drain()

    def head_for(self, marker: bytes) -> bytes | None:
        """The head of the request whose target contains ``marker``, if one arrived."""
        found = [head for head in self.heads if marker in head.split(b"\r\n", 1)[0]]
        assert len(found) <= 1, found
        return found[0] if found else None


@dataclass
class Gateway:
    process: GatewayProcess
    data_port: int
    control_port: int
    recorder: Recorder
    user_token: str
    other_token: str
    admin_token: str


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Gateway]:
    root = tmp_path_factory.mktemp("credentials")
    recorder = Recorder()
    async with raw_backend(recorder.handle) as backend:
        upstream = f"http://127.0.0.1:{backend.port}"
        (root / "policy.yaml").write_text(
            f"pools:\n  small: {{provider: static, upstreams: ['{upstream}']}}\n"
            f"  shared: {{provider: static, upstreams: ['{upstream}']}}\n")
        (root / "keys.yaml").write_text(json.dumps({"keys": [{"kid": "k1", "alg": "HS256", "secret": SECRET}]}))
        process = await GatewayProcess(root / "gw", env={
            "SANDBOX_GATEWAY_AUTH_MODE": "token",
            "SANDBOX_GATEWAY_AUTH_KEYS_FILE": str(root / "keys.yaml"),
            "SANDBOX_GATEWAY_POLICY_FILE": str(root / "policy.yaml"),
            "SANDBOX_GATEWAY_ALLOWED_HOSTS": "gw,gateway",  # the names its raw requests use
        }).start()
        key = KeySet.load(root / "keys.yaml").first()
        try:
            yield Gateway(process, int(process.data_url.rsplit(":", 1)[1]),
                          int(process.control_url.rsplit(":", 1)[1]), recorder,
                          issue_token(key, user="alice", org="acme"), issue_token(key, user="eve", org="evil"),
                          issue_token(key, user="ops", audience=ADMIN_AUDIENCE))
        finally:
            await process.stop()


async def exchange(port: int, data: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
    async with raw_client(port) as (reader, writer):
        writer.write(data)
        return await asyncio.wait_for(read_response(reader), IO_TIMEOUT)


def assert_error(response: tuple[int, dict[bytes, bytes], bytes], status: int, code: str, message: str) -> None:
    got, headers, body = response
    assert got == status, (got, body[:300])
    assert headers.get(b"content-type", b"").split(b";")[0] == b"application/json", headers
    error = json.loads(body)
    assert set(error) == {"error"} and set(error["error"]) == {"code", "message"}, error
    assert error["error"]["code"] == code, error
    assert error["error"]["message"].startswith(message), error


# -- the data plane -------------------------------------------------------------------------------
# {token}, {other}: two different users' data tokens. Each case's request target is unique, so the
# recorder can tell whether that very request reached the sandbox.
REFUSED = [
    pytest.param(b"GET /{case} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {token}\r\n"
                 b"Authorization: Bearer {other}\r\nX-Session-Id: s1\r\n\r\n",
                 400, "invalid_authorization", "Authorization: must be given once",
                 id="two Authorization headers (the last used to win silently)"),
    pytest.param(b"GET /{case} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {token}\r\n"
                 b"authorization: Bearer {token}\r\nX-Session-Id: s1\r\n\r\n",
                 400, "invalid_authorization", "Authorization: must be given once",
                 id="the same Authorization twice, spelled differently"),
    pytest.param(b"GET /{case} HTTP/1.1\r\nHost: gw\r\nHost: elsewhere\r\nAuthorization: Bearer {token}\r\n"
                 b"X-Session-Id: s1\r\n\r\n",
                 400, "invalid_host", "Host: must be given once",
                 id="two Host headers"),
    pytest.param(b"GET /{case} HTTP/1.1\r\nAuthorization: Bearer {token}\r\nX-Session-Id: s1\r\n\r\n",
                 400, "invalid_host", "Host: an HTTP/1.1 request must carry one",
                 id="HTTP/1.1 without Host (RFC 9112)"),
    pytest.param(b"GET /{case} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {token}\r\nX-Session-Id: s1\r\n"
                 b"X-Session-Id: s2\r\n\r\n",
                 400, "invalid_identity", "X-Session-Id: must be given once",
                 id="two X-Session-Id headers"),
    pytest.param(b"GET /{case} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {token}\r\nX-Session-Id: s1\r\n"
                 b"X-User-Id: a\r\nX-User-Id: b\r\n\r\n",
                 400, "invalid_identity", "X-User-Id: must be given once",
                 id="two X-User-Id headers (ignored in token mode, refused all the same)"),
    pytest.param(b"GET /{case} HTTP/1.1\r\nHost: gw\r\nAuthorization: Basic {token}\r\nX-Session-Id: s1\r\n\r\n",
                 401, "unauthorized", "an Authorization: Bearer <token> header is required",
                 id="another scheme"),
    pytest.param(b"GET /{case} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer{token}\r\nX-Session-Id: s1\r\n\r\n",
                 401, "unauthorized", "an Authorization: Bearer <token> header is required",
                 id="no space after the scheme"),
]


def fill(template: bytes, gw: Gateway, case: str) -> bytes:
    return (template.replace(b"{case}", b"case/" + case.encode()).replace(b"{token}", gw.user_token.encode())
            .replace(b"{other}", gw.other_token.encode()))


def case_name(request: pytest.FixtureRequest, table: list[Any]) -> str:
    """A path-safe name for the running case: its index in ``table``."""
    return f"{request.node.originalname}-{[param.id for param in table].index(request.node.callspec.id)}"


@pytest.mark.parametrize(("template", "status", "code", "message"), REFUSED)
async def test_data_plane_refuses(gw: Gateway, request: pytest.FixtureRequest, template: bytes, status: int,
                                  code: str, message: str) -> None:
    case = case_name(request, REFUSED)
    assert_error(await exchange(gw.data_port, fill(template, gw, case)), status, code, message)
    # Refused before an upstream connection was taken: the answer came after the decision, so a
    # forwarded head would be in the recorder by now.
    assert gw.recorder.head_for(b"/case/" + case.encode() + b" ") is None


# Names that must never reach a sandbox, however spelled (compared lower-cased, with "_" as "-").
FORBIDDEN = {b"authorization", b"x-org-id", b"x-user-id", b"x-session-id", b"x-bot-id", b"x-sandbox-namespace",
             b"x-sandbox-port"}
UNDERSCORED = [b"X_Org_Id: evil", b"X_User_Id: eve", b"X_Session_Id: other", b"X_Bot_Id: b", b"x_org_id: evil",
               b"X_Sandbox_Id: ses-0000", b"X_Sandbox_Namespace: kube-system", b"X_Sandbox_Port: 22",
               b"X_Forwarded_For: 10.0.0.1", b"X_Forwarded_Proto: https", b"X_Forwarded_Host: bank.example"]


def header_lines(head: bytes) -> list[tuple[bytes, bytes]]:
    lines = head[:-4].split(b"\r\n")[1:]
    return [(name.strip().lower(), value.strip()) for name, _, value in (line.partition(b":") for line in lines)]


def assert_nothing_forbidden(head: bytes) -> None:
    names = [name for name, _ in header_lines(head)]
    for name in names:
        assert name.replace(b"_", b"-") not in FORBIDDEN, head
        assert b"_" not in name or name == b"x_custom", head  # only the unrelated one passes
    assert names.count(b"x-sandbox-id") == 1 and names.count(b"host") == 1, head
    assert names.count(b"x-forwarded-for") == 1 and names.count(b"x-forwarded-proto") == 1, head
    values = dict(header_lines(head))
    assert values[b"x-forwarded-for"] == b"127.0.0.1" and values[b"x-forwarded-proto"] == b"http", head


FORWARDED = [
    pytest.param(b"GET /{case} HTTP/1.1\r\nHost: gw\r\nAuthorization: bearer {token}\r\nX-Session-Id: s1\r\n\r\n",
                 id="lower-case bearer (RFC 9110: the scheme is case-insensitive)"),
    pytest.param(b"GET /{case} HTTP/1.1\r\nHost: gw\r\nAuthorization: BEARER   {token}\r\nX-Session-Id: s1\r\n\r\n",
                 id="upper-case BEARER and several spaces"),
    pytest.param(b"GET /{case} HTTP/1.0\r\nAuthorization: Bearer {token}\r\nX-Session-Id: s1\r\n\r\n",
                 id="HTTP/1.0 without Host is allowed"),
    pytest.param(b"GET /{case} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {token}\r\nX-Session-Id: s1\r\n"
                 + b"\r\n".join(UNDERSCORED) + b"\r\nX_Custom: kept\r\n\r\n",
                 id="underscore spellings of identity, X-Sandbox-* and X-Forwarded-* are dropped"),
]


@pytest.mark.parametrize("template", FORWARDED)
async def test_data_plane_forwards_without_credentials(gw: Gateway, request: pytest.FixtureRequest,
                                                       template: bytes) -> None:
    case = case_name(request, FORWARDED)
    status, _, body = await exchange(gw.data_port, fill(template, gw, case))
    assert (status, body) == (200, b"ok")
    head = gw.recorder.head_for(b"/case/" + case.encode() + b" ")
    assert head is not None
    assert_nothing_forbidden(head)
    values = dict(header_lines(head))
    assert values[b"x-sandbox-id"].startswith(b"ses-") or values[b"x-sandbox-id"].startswith(b"org-"), head
    assert values[b"host"].startswith(b"127.0.0.1:"), head  # the sandbox's own, never the client's
    if b"X_Custom" in template:
        assert values[b"x_custom"] == b"kept"


async def test_underscore_identity_does_not_choose_the_sandbox(gw: Gateway) -> None:
    """The token's org and user pick the sandbox; X_Org_Id and X_User_Id change nothing."""
    heads = []
    for case, extra in (("plain", b""), ("spoofed", b"X_Org_Id: evil\r\nX_User_Id: eve\r\n")):
        data = fill(b"GET /{case} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {token}\r\nX-Session-Id: s9\r\n"
                    + extra + b"\r\n", gw, "sandbox-" + case)
        assert (await exchange(gw.data_port, data))[0] == 200
        heads.append(dict(header_lines(gw.recorder.head_for(b"/case/sandbox-" + case.encode() + b" ") or b"")))
    assert heads[0][b"x-sandbox-id"] == heads[1][b"x-sandbox-id"]


# -- the control API ------------------------------------------------------------------------------
def control_request(target: str, *lines: bytes) -> bytes:
    return (f"GET {target} HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n".encode()
            + b"".join(line + b"\r\n" for line in lines) + b"\r\n")


async def test_control_api_refuses_two_authorization_headers(gw: Gateway) -> None:
    admin = f"Authorization: Bearer {gw.admin_token}".encode()
    assert (await exchange(gw.control_port, control_request("/v1/sandboxes", admin)))[0] == 200
    response = await exchange(gw.control_port, control_request("/v1/sandboxes", admin, admin))
    assert_error(response, 400, "invalid_authorization", "Authorization: must be given once")


@pytest.mark.parametrize("header", [b"X-User-Id", b"X-Org-Id", b"X-Session-Id", b"X-Bot-Id"])
async def test_control_api_refuses_two_identity_headers(gw: Gateway, header: bytes) -> None:
    admin = f"Authorization: Bearer {gw.admin_token}".encode()
    response = await exchange(gw.control_port, control_request("/v1/sessions/s1", admin, header + b": a",
                                                               header + b": b"))
    assert_error(response, 400, "invalid_identity", header.decode() + ": must be given once")


async def test_control_api_takes_a_lower_case_bearer(gw: Gateway) -> None:
    for scheme in (b"bearer", b"BEARER"):
        line = scheme + b" " + gw.admin_token.encode()
        status, _, body = await exchange(gw.control_port, control_request("/v1/sandboxes", b"Authorization: " + line))
        assert status == 200, body
        assert "sandboxes" in json.loads(body)


MALFORMED_CONTROL = [
    pytest.param(b"GARBAGE<script>alert(1)</script>\r\n\r\n", "bad_request", id="not HTTP"),
    pytest.param(b"GET /healthz HTTP/1.1\r\nHost: gw\r\nHost: other\r\n\r\n", "bad_request", id="two Host headers"),
    pytest.param(b"GET /healthz HTTP/1.1\r\n\r\n", "bad_request", id="HTTP/1.1 without Host"),
    pytest.param(b"GET /healthz HTTP/1.1\r\nHost: gw\r\nBad Header<script>: x\r\n\r\n", "bad_request",
                 id="a header name with a space"),
    pytest.param(b"GET /healthz HTTP/1.1\r\nHost: gw\r\nX-Long: " + b"<script>" * 2000 + b"\r\n\r\n",
                 "header_too_large", id="a header over aiohttp's line limit"),
    pytest.param(b"GET /healthz HTTP/1.1\r\nHost: gw\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
                 "bad_request", id="two Content-Length headers"),
]


@pytest.mark.parametrize(("data", "code"), MALFORMED_CONTROL)
async def test_control_port_answers_malformed_http_as_json(gw: Gateway, data: bytes, code: str) -> None:
    async with raw_client(gw.control_port) as (reader, writer):
        writer.write(data)
        line, headers = await asyncio.wait_for(read_head(reader), IO_TIMEOUT)
        body = await asyncio.wait_for(reader.readexactly(int(headers[b"content-length"])), IO_TIMEOUT)
        assert await asyncio.wait_for(reader.read(), IO_TIMEOUT) == b""  # then it closes
    assert line.split()[1] == b"400", line
    assert_error((400, headers, body), 400, code, "")
    assert b"script" not in body.lower() and b"garbage" not in body.lower(), body  # no bytes echoed back


async def test_control_port_still_serves_http_1_0_without_host(gw: Gateway) -> None:
    status, _, body = await exchange(gw.control_port, b"GET /healthz HTTP/1.0\r\n\r\n")
    assert (status, json.loads(body)) == (200, {"status": "ok"})


async def test_the_gateway_logged_no_internal_error(gw: Gateway) -> None:
    bad = [line for line in gw.process.log if "Traceback" in line or "internal error" in line]
    assert not bad, bad[:5]

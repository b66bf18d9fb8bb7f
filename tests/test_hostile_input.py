"""Hostile input against one real ``sandbox-gateway serve``: the documented 4xx JSON, no 500, no crash,
nothing created.

One gateway serves the whole module (local pools, trusted headers on loopback, an admin key so the
control API is guarded, small limits: 16 KiB request heads, 4 KiB bodies, a 0.5 s head deadline).
The data plane gets raw bytes over plain sockets, so malformed HTTP reaches it unmodified; the
control API gets raw bytes too wherever a client library would normalise the request.

Every case pins its outcome:

* ``Err``: the gateway answers itself: the status, the ``{"error": {"code", "message"}}`` body with
  the documented code, no sandbox involved, and (for requests it cannot parse) a closed connection.
  Afterwards the caller's session is still unbound: nothing was created.
* ``Own``: valid but odd input (traversal in a path, forged routing headers, look-alike identities)
  reaches the caller's own sandbox and no other one: the reference runtime stamps every response with
  ``X-Runtime-Sandbox-Id`` and ``/echo`` reports the ``X-Sandbox-Id`` and raw path it received.

The last tests check that the process survived the table, that the sandbox listing holds exactly the
sandboxes the valid cases were meant to use, and that nothing was logged as an internal error.

Nothing here is skipped or xfailed: a failing case is a gateway bug. Bugs this table found, now
fixed: a request rejected with 400 because of its body framing still created its binding and
sandbox; the same bytes on a warm route were cut off without an answer; deeply nested JSON on the
control API was a 500; a header split across reads escaped the head-size limit; aiohttp logged
every malformed control-API request as an ERROR with a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import aiohttp
import jwt
import pytest
import pytest_asyncio

from gateway.auth import ADMIN_AUDIENCE, DATA_AUDIENCE, KeySet, issue_token
from tests.gateway_process import GatewayProcess

pytestmark = pytest.mark.asyncio(loop_scope="module")

HOST = "127.0.0.1"
MAX_HEAD = 16_384
MAX_BODY = 4_096
HEAD_TIMEOUT = 0.5
SECRET = "hostile-input-admin-secret-of-32+-bytes"
IO_TIMEOUT = 10.0

POLICY = """\
pools:
  small:  {provider: local, max_sandboxes: 60, idle_timeout: 10m}
  shared: {provider: local, max_sandboxes: 60, idle_timeout: 10m}
routing:
  per_session_orgs: ["iso-org"]
  prefix_pools: {ses: small, default: shared}
"""

# Identities (org, user, session) bound through the control API before the table runs: the valid
# cases must land in exactly these sandboxes, and the listing at the end must hold nothing else.
WALKER = ("walk-org", "walker", "walk-1")
REFERENCES = {
    "acme": ("acme", "alice", "ref-acme"),
    "cafe": ("caf\u00e9", "jos\u00e9", "ref-cafe"),          # NFC
    "angstrom": ("\u00c5ngstr\u00f6m", "alice", "ref-angstrom"),  # NFC
    "iso": ("iso-org", "alice", "ref-iso"),                  # a per-session org
    "seance": ("iso-org", "alice", "s\u00e9ance"),           # a per-session org, NFC session
}
BOUNDARY = {
    "empty-org": ("", "walker", "empty-org-1"),               # "" is an org segment, not a personal account
    "max-length-org": ("\u00e9" * 256, "walker", "maxlen-1"),  # 256 characters, 512 UTF-8 bytes
}


# -- raw HTTP -------------------------------------------------------------------------------------
@dataclass
class Resp:
    status: int
    headers: dict[bytes, bytes]
    body: bytes
    status_line: bytes

    def json(self) -> Any:
        return json.loads(self.body)


async def read_response(reader: asyncio.StreamReader) -> Resp | None:
    """One response (by Content-Length); None when the server closed without answering."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        assert not exc.partial, f"the connection ended inside a response head: {exc.partial[:300]!r}"
        return None
    except ConnectionResetError:
        return None
    lines = head[:-4].split(b"\r\n")
    status_line = lines[0]
    match = re.match(rb"HTTP/1\.[01] (\d{3})", status_line)
    assert match, f"not an HTTP response: {head[:300]!r}"
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    if b"content-length" in headers:
        body = await reader.readexactly(int(headers[b"content-length"]))
    else:
        body = await reader.read()
    return Resp(int(match.group(1)), headers, body, status_line)


async def closed_by_server(reader: asyncio.StreamReader, timeout: float = IO_TIMEOUT) -> bool:
    try:
        rest = await asyncio.wait_for(reader.read(), timeout)
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    assert rest == b"", f"unexpected bytes after the response: {rest[:300]!r}"
    return True


@contextlib.asynccontextmanager
async def connection(port: int):
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def send(port: int, data: bytes, *, expect_close: bool = False) -> tuple[Resp | None, bool | None]:
    """Write ``data`` at once; the first response, and whether the server then closed the connection."""
    async with connection(port) as (reader, writer):
        writer.write(data)
        response = await asyncio.wait_for(read_response(reader), IO_TIMEOUT)
        closed = await closed_by_server(reader) if expect_close and response is not None else None
        return response, closed


def ident(session: bytes, org: bytes | None = b"rej-org", user: bytes | None = b"mallory",
          bot: bytes | None = None) -> bytes:
    lines = b""
    if org is not None:
        lines += b"X-Org-Id: " + org + b"\r\n"
    if user is not None:
        lines += b"X-User-Id: " + user + b"\r\n"
    lines += b"X-Session-Id: " + session + b"\r\n"
    if bot is not None:
        lines += b"X-Bot-Id: " + bot + b"\r\n"
    return lines


def ident_of(identity: tuple[str, str, str]) -> bytes:
    org, user, session = identity
    return ident(session.encode(), org.encode(), user.encode())


W = ident_of(WALKER)


# -- expectations ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Err:
    """The gateway answers itself with the documented JSON error."""

    status: int
    code: str
    message: str | None = None   # prefix of the message, where it names what to fix

    @property
    def closes(self) -> bool:
        # Requests the gateway could not parse, or whose body it will not read, end the connection.
        return self.code in ("bad_request", "header_too_large", "payload_too_large", "method_not_supported")


@dataclass(frozen=True)
class Own:
    """The request reaches the caller's own sandbox (the walker's), which answers ``status``."""

    status: int = 200
    raw_path: str | None = None          # for /echo: the path must arrive byte for byte
    code: str | None = None              # for the runtime's own JSON errors
    check: Callable[[dict[str, Any]], None] | None = None  # more checks on the /echo report


def assert_error_shape(response: Resp, expected: Err) -> None:
    body_text = response.body.decode(errors="replace")
    assert response.status < 500, f"5xx for hostile input: {response.status_line!r} {body_text[:300]}"
    assert response.status == expected.status, f"{response.status_line!r} {body_text[:300]}"
    assert response.headers.get(b"content-type", b"").split(b";")[0] == b"application/json", response.headers
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) <= {"code", "message", "sandbox_id"}, body
    assert body["error"]["code"] == expected.code, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"], body
    if expected.message is not None:
        assert body["error"]["message"].startswith(expected.message), body
    assert "Traceback" not in body_text


# -- the gateway ----------------------------------------------------------------------------------
@dataclass
class Hostile:
    process: GatewayProcess
    data_port: int
    control_port: int
    http: aiohttp.ClientSession
    admin: dict[str, str]
    bound: dict[str, str] = field(default_factory=dict)        # name -> sandbox ID
    expected: set[str] = field(default_factory=set)            # every sandbox a valid case may use
    rejected: list[str] = field(default_factory=list)          # sessions of rejected requests

    @property
    def control_url(self) -> str:
        return self.process.control_url

    async def bind(self, org: str | None, user: str, session: str, bot: str | None = None) -> str:
        body = {"org_id": org, "user_id": user, "session_id": session} | ({"bot_id": bot} if bot else {})
        async with self.http.post(f"{self.control_url}/v1/sessions", json=body, headers=self.admin) as response:
            assert response.status == 200, await response.text()
            sandbox_id = (await response.json())["sandbox_id"]
        self.expected.add(sandbox_id)
        return sandbox_id

    async def dry_run(self, org: str | None, user: str, session: str) -> dict[str, Any]:
        params = {"user_id": user, "session_id": session} | ({"org_id": org} if org is not None else {})
        async with self.http.get(f"{self.control_url}/v1/route", params=params, headers=self.admin) as response:
            assert response.status == 200, await response.text()
            return await response.json()

    async def session_status(self, session: str) -> tuple[int, Any]:
        target = "/v1/sessions/" + quote(session, safe="")
        response = await control(self, "GET", target)
        assert response is not None
        return response.status, response.json()

    async def assert_unbound(self, session: str) -> None:
        """Nothing was created for ``session``: no binding (so no sandbox was made for it either)."""
        self.rejected.append(session)
        status, body = await self.session_status(session)
        assert status == 404 and body["error"]["code"] == "not_found", (
            f"a rejected request left a binding behind for session {session!r}: {body}")


async def control(gw: Hostile, method: str, target: str, *, body: bytes | None = None,
                  headers: dict[str, str] | None = None, admin: bool = True) -> Resp | None:
    """A raw control-API request (the target is sent exactly as given)."""
    lines = [f"{method} {target} HTTP/1.1", "Host: gateway", "Connection: close"]
    if admin:
        lines += [f"{k}: {v}" for k, v in gw.admin.items()]
    for name, value in (headers or {}).items():
        lines.append(f"{name}: {value}")
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    data = ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + (body or b"")
    response, _ = await send(gw.control_port, data)
    return response


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("hostile")
    (root / "policy.yaml").write_text(POLICY)
    (root / "keys.yaml").write_text(json.dumps({"keys": [{"kid": "admin", "alg": "HS256", "secret": SECRET}]}))
    process = await GatewayProcess(root / "gw", env={
        "SANDBOX_GATEWAY_AUTH_MODE": "trusted-headers",
        "SANDBOX_GATEWAY_AUTH_KEYS_FILE": str(root / "keys.yaml"),   # guards the control API
        "SANDBOX_GATEWAY_POLICY_FILE": str(root / "policy.yaml"),
        "SANDBOX_GATEWAY_MAX_HEADER_BYTES": str(MAX_HEAD),
        "SANDBOX_GATEWAY_MAX_BODY_BYTES": str(MAX_BODY),
        "SANDBOX_GATEWAY_HEADER_READ_TIMEOUT": str(HEAD_TIMEOUT),
        "PER_SESSION_SANDBOX_ORG_IDS": "iso-org",
    }).start()
    key = KeySet.load(root / "keys.yaml").first()
    admin = {"Authorization": "Bearer " + issue_token(key, user="ops", audience=ADMIN_AUDIENCE)}
    http = aiohttp.ClientSession()
    state = Hostile(process, int(process.data_url.rsplit(":", 1)[1]), int(process.control_url.rsplit(":", 1)[1]),
                    http, admin)
    try:
        named = {"walker": WALKER, **REFERENCES, **BOUNDARY,
                 **{f"alike:{a.id}": a.identity for a in LOOKALIKES if a.bind}}
        ids = await asyncio.gather(*(state.bind(*identity) for identity in named.values()))
        state.bound = dict(zip(named, ids))
        yield state
    finally:
        await http.close()
        await process.stop()


# -- the data-plane table -------------------------------------------------------------------------
# Each request is built from the case's own session (rej-<n>), so that "nothing created" is checked
# per case; valid-but-odd requests use the walker's identity, whose sandbox is already bound.
Build = Callable[[bytes], bytes]


def get(target: bytes, extra: bytes = b"", *, version: bytes = b"HTTP/1.1") -> Build:
    return lambda s: b"GET " + target + b" " + version + b"\r\n" + ident(s) + extra + b"\r\n"


def post(extra: bytes, body: bytes = b"") -> Build:
    return lambda s: b"POST /echo/x HTTP/1.1\r\n" + ident(s) + extra + b"\r\n" + body


def head_with(lines: bytes) -> Build:
    """A GET whose identity lines are ``lines`` (with {s} replaced by the case's session)."""
    return lambda s: b"GET / HTTP/1.1\r\n" + lines.replace(b"{s}", s) + b"\r\n"


def walker(request_line: bytes, extra: bytes = b"", body: bytes = b"") -> Build:
    return lambda s: request_line + b"\r\n" + W + extra + b"\r\n" + body


def org_value(value: bytes) -> Build:
    return head_with(b"X-Org-Id: " + value + b"\r\nX-User-Id: mallory\r\nX-Session-Id: {s}\r\n")


def user_value(value: bytes) -> Build:
    return head_with(b"X-Org-Id: rej-org\r\nX-User-Id: " + value + b"\r\nX-Session-Id: {s}\r\n")


def session_value(value: bytes) -> Build:
    return head_with(b"X-Org-Id: rej-org\r\nX-User-Id: mallory\r\nX-Session-Id: " + value + b"\r\n")


def bot_value(value: bytes) -> Build:
    return head_with(b"X-Org-Id: rej-org\r\nX-User-Id: mallory\r\nX-Session-Id: {s}\r\nX-Bot-Id: " + value + b"\r\n")


MALFORMED = Err(400, "bad_request", "malformed HTTP request: ")
TOO_LARGE = Err(400, "header_too_large", f"the request head exceeds {MAX_HEAD} bytes")
BODY_TOO_LARGE = Err(413, "payload_too_large")


def bad_identity(header: str, reason: str) -> Err:
    return Err(400, "invalid_identity", f"{header}: {reason}")


CONTROL_CHARS = "must not contain control characters"
NOT_UTF8 = "must be valid UTF-8"


def echoed(name: str, predicate: Callable[[str | None], bool]) -> Callable[[dict[str, Any]], None]:
    def check(report: dict[str, Any]) -> None:
        headers = {k.lower(): v for k, v in report["headers"].items()}
        assert predicate(headers.get(name.lower())), (name, headers.get(name.lower()), report)
    return check


def body_length(expected: int) -> Callable[[dict[str, Any]], None]:
    def check(report: dict[str, Any]) -> None:
        assert report["body_len"] == expected, report
    return check


def forwarded_only_by_the_gateway(report: dict[str, Any]) -> None:
    headers = {k.lower(): v for k, v in report["headers"].items()}
    assert headers.get("x-forwarded-for") == HOST and "forwarded" not in headers, headers


def no_credentials(report: dict[str, Any]) -> None:
    lowered = {k.lower() for k in report["headers"]}
    assert not lowered & {"authorization", "proxy-authorization", "x-org-id", "x-user-id", "x-session-id",
                          "x-bot-id"}, report["headers"]


DATA_CASES: list[Any] = [
    # -- CR / LF / CRLF in header names, values, request lines ------------------------------------
    pytest.param(get(b"/", b"X-Note: a\rb\r\n"), MALFORMED, id="cr-in-header-value"),
    pytest.param(get(b"/", b"X-Note: a\nb\r\n"), MALFORMED, id="lf-in-header-value"),
    pytest.param(get(b"/", b"X-Note: a\r\n b\r\n"), MALFORMED, id="obs-fold-continuation-line"),
    pytest.param(get(b"/", b"X-No\rte: b\r\n"), MALFORMED, id="cr-in-header-name"),
    pytest.param(get(b"/", b"X-No\nte: b\r\n"), MALFORMED, id="lf-in-header-name"),
    pytest.param(get(b"/", b"X-No\r\nte: b\r\n"), MALFORMED, id="crlf-in-header-name"),
    pytest.param(user_value(b"mal\rlory"), MALFORMED, id="cr-in-user-id"),
    pytest.param(org_value(b"rej\norg"), MALFORMED, id="lf-in-org-id"),
    pytest.param(session_value(b"rej\r\nX-User-Id: victim"), bad_identity("X-User-Id", "must be given once"),
                 id="crlf-injected-second-user"),
    pytest.param(org_value(b"rej-org\r\nX-Org-Id: victim-org"), bad_identity("X-Org-Id", "must be given once"),
                 id="crlf-injected-second-org"),
    pytest.param(lambda s: b"GET /a\r\nX-User-Id: victim HTTP/1.1\r\n" + ident(s) + b"\r\n",
                 bad_identity("X-User-Id", "must be given once"), id="crlf-injected-header-via-url"),
    pytest.param(get(b"/a\rb"), MALFORMED, id="cr-in-url"),
    pytest.param(get(b"/a\nb"), MALFORMED, id="lf-in-url"),
    pytest.param(lambda s: (b"GET / HTTP/1.1\r\n" + ident(s) + b"\r\n").replace(b"\r\n", b"\n"), MALFORMED,
                 id="bare-lf-line-endings"),
    pytest.param(lambda s: (b"GET / HTTP/1.1\r\n" + ident(s) + b"\r\n").replace(b"\r\n", b"\r"), MALFORMED,
                 id="bare-cr-line-endings"),
    pytest.param(lambda s: b"GE\r\nT / HTTP/1.1\r\n" + ident(s) + b"\r\n", MALFORMED, id="crlf-in-method"),
    pytest.param(lambda s: b"GET / HTTP/1.1\r\n X-User-Id: victim\r\n" + ident(s) + b"\r\n", MALFORMED,
                 id="whitespace-before-first-header"),
    pytest.param(get(b"/", b"Not A Header Line\r\n"), MALFORMED, id="header-line-without-colon"),
    pytest.param(get(b"/", b": no-name\r\n"), MALFORMED, id="empty-header-name"),
    pytest.param(get(b"/", b"X-\xc3\x84: 1\r\n"), MALFORMED, id="non-ascii-header-name"),
    pytest.param(get(b"/", b"X Note: 1\r\n"), MALFORMED, id="space-in-header-name"),
    pytest.param(lambda s: b"GET / HTTP/1.1\r\nX-User-Id : victim\r\n" + ident(s) + b"\r\n", MALFORMED,
                 id="space-before-colon-identity-header"),
    # -- NUL bytes --------------------------------------------------------------------------------
    pytest.param(get(b"/", b"X-Note: a\x00b\r\n"), MALFORMED, id="nul-in-header-value"),
    pytest.param(get(b"/", b"X-No\x00te: b\r\n"), MALFORMED, id="nul-in-header-name"),
    pytest.param(get(b"/a\x00b"), MALFORMED, id="nul-in-url"),
    pytest.param(org_value(b"rej\x00org"), MALFORMED, id="nul-in-org-id"),
    pytest.param(user_value(b"mallory\x00"), MALFORMED, id="nul-in-user-id"),
    pytest.param(session_value(b"\x00rej"), MALFORMED, id="nul-in-session-id"),
    pytest.param(lambda s: b"G\x00ET / HTTP/1.1\r\n" + ident(s) + b"\r\n", MALFORMED, id="nul-in-method"),
    pytest.param(lambda s: b"\x00" * 100, MALFORMED, id="nul-bytes-only"),
    pytest.param(lambda s: b"\x00GET / HTTP/1.1\r\n" + ident(s) + b"\r\n", MALFORMED, id="nul-before-request"),
    # -- control characters and odd unicode in identity values -----------------------------------
    pytest.param(org_value(b"rej\torg"), bad_identity("X-Org-Id", CONTROL_CHARS), id="tab-in-org-id"),
    pytest.param(org_value("\u202eemca".encode()), bad_identity("X-Org-Id", "must not contain bidirectional"),
                 id="bidi-override-in-org-id"),
    pytest.param(user_value("\u2066mallory\u2069".encode()), bad_identity("X-User-Id", "must not contain bidirectional"),
                 id="bidi-isolates-in-user-id"),
    pytest.param(user_value(b"mal\tlory"), bad_identity("X-User-Id", CONTROL_CHARS), id="tab-in-user-id"),
    pytest.param(session_value(b"rej\tsession"), bad_identity("X-Session-Id", CONTROL_CHARS), id="tab-in-session-id"),
    pytest.param(bot_value(b"b\tot"), bad_identity("X-Bot-Id", CONTROL_CHARS), id="tab-in-bot-id"),
    pytest.param(org_value(b"rej\x01org"), MALFORMED, id="soh-in-org-id"),
    pytest.param(user_value(b"mal\x1b[31mlory"), MALFORMED, id="ansi-escape-in-user-id"),
    pytest.param(org_value(b"rej\x7forg"), MALFORMED, id="del-in-org-id"),
    pytest.param(org_value(b"rej\x0borg"), MALFORMED, id="vertical-tab-in-org-id"),
    pytest.param(org_value(b"rej\xc2\x85org"), bad_identity("X-Org-Id", CONTROL_CHARS), id="c1-nel-in-org-id"),
    pytest.param(user_value(b"mal\xc2\x9blory"), bad_identity("X-User-Id", CONTROL_CHARS), id="c1-csi-in-user-id"),
    pytest.param(org_value(b"rej\xe2\x80\xa8org"), bad_identity("X-Org-Id", CONTROL_CHARS),
                 id="line-separator-in-org-id"),
    pytest.param(session_value(b"rej\xe2\x80\xa9s"), bad_identity("X-Session-Id", CONTROL_CHARS),
                 id="paragraph-separator-in-session-id"),
    # -- invalid UTF-8: lone surrogates, overlong forms, truncated and out-of-range sequences --------
    pytest.param(org_value(b"rej\xed\xa0\x80org"), bad_identity("X-Org-Id", NOT_UTF8), id="lone-high-surrogate-org"),
    pytest.param(user_value(b"\xed\xbf\xbfmallory"), bad_identity("X-User-Id", NOT_UTF8),
                 id="lone-low-surrogate-user"),
    pytest.param(session_value(b"rej\xed\xa0\xbd\xed\xb8\x80"), bad_identity("X-Session-Id", NOT_UTF8),
                 id="cesu8-surrogate-pair-session"),
    pytest.param(org_value(b"rej\xc0\xaforg"), bad_identity("X-Org-Id", NOT_UTF8), id="overlong-2-byte-slash-org"),
    pytest.param(user_value(b"\xe0\x80\xafmallory"), bad_identity("X-User-Id", NOT_UTF8), id="overlong-3-byte-user"),
    pytest.param(bot_value(b"\xf0\x80\x80\xafbot"), bad_identity("X-Bot-Id", NOT_UTF8), id="overlong-4-byte-bot"),
    pytest.param(org_value(b"rej\xc0\x80org"), bad_identity("X-Org-Id", NOT_UTF8), id="overlong-nul-org"),
    pytest.param(org_value(b"rej\xe2\x82"), bad_identity("X-Org-Id", NOT_UTF8), id="truncated-sequence-org"),
    pytest.param(org_value(b"\xf4\x90\x80\x80"), bad_identity("X-Org-Id", NOT_UTF8), id="beyond-u10ffff-org"),
    pytest.param(user_value(b"mall\xe9ry"), bad_identity("X-User-Id", NOT_UTF8), id="latin-1-byte-user"),
    pytest.param(session_value(b"\xff\xferej"), bad_identity("X-Session-Id", NOT_UTF8), id="ff-fe-bytes-session"),
    # -- sizes --------------------------------------------------------------------------------------
    pytest.param(get(b"/", b"X-Big: " + b"a" * 65_536 + b"\r\n"), TOO_LARGE, id="64kb-single-header"),
    pytest.param(get(b"/" + b"a" * 65_536), TOO_LARGE, id="64kb-url"),
    pytest.param(get(b"/", b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 200) for i in range(100))), TOO_LARGE,
                 id="100-headers-totalling-20kb"),
    pytest.param(get(b"/", b"a: b\r\n" * 3000), TOO_LARGE, id="3000-tiny-headers"),
    pytest.param(org_value(b"o" * 65_536), TOO_LARGE, id="64kb-org-id"),
    pytest.param(org_value(b"o" * 10_000), bad_identity("X-Org-Id", "must be at most 256 characters (got 10000)"),
                 id="10k-char-org-id"),
    pytest.param(user_value(b"u" * 257), bad_identity("X-User-Id", "must be at most 256 characters (got 257)"),
                 id="257-char-user-id"),
    pytest.param(session_value(b"s" * 257), bad_identity("X-Session-Id", "must be at most 256"),
                 id="257-char-session-id"),
    pytest.param(org_value("\u00e9".encode() * 257),
                 bad_identity("X-Org-Id", "must be at most 256 characters (got 257)"),
                 id="257-two-byte-chars-org-id"),
    pytest.param(bot_value(b"b" * 300), bad_identity("X-Bot-Id", "must be at most 256"), id="300-char-bot-id"),
    pytest.param(lambda s: b"A" * 10_000 + b" / HTTP/1.1\r\n" + ident(s) + b"\r\n", MALFORMED, id="10k-method"),
    # -- duplicated, empty and missing identity headers ---------------------------------------------
    pytest.param(get(b"/", b"X-User-Id: victim\r\n"), bad_identity("X-User-Id", "must be given once"),
                 id="duplicated-user-id"),
    pytest.param(get(b"/", b"X-Session-Id: walk-1\r\n"), bad_identity("X-Session-Id", "must be given once"),
                 id="duplicated-session-id"),
    pytest.param(get(b"/", b"X-Org-Id: walk-org\r\n"), bad_identity("X-Org-Id", "must be given once"),
                 id="duplicated-org-id"),
    pytest.param(bot_value(b"b1\r\nX-Bot-Id: b2"), bad_identity("X-Bot-Id", "must be given once"),
                 id="duplicated-bot-id"),
    pytest.param(head_with(b"x-user-id: a\r\nX-USER-ID: b\r\nX-Session-Id: {s}\r\n"),
                 bad_identity("X-User-Id", "must be given once"), id="duplicated-user-id-other-case"),
    pytest.param(get(b"/", b"X-User-Id: mallory\r\n"), bad_identity("X-User-Id", "must be given once"),
                 id="duplicated-user-id-same-value"),
    pytest.param(user_value(b""), bad_identity("X-User-Id", "must not be empty"), id="empty-user-id"),
    pytest.param(session_value(b""), bad_identity("X-Session-Id", "must not be empty"), id="empty-session-id"),
    pytest.param(user_value(b"   \t "), bad_identity("X-User-Id", "must not be empty"), id="whitespace-only-user-id"),
    pytest.param(head_with(b"X-Org-Id: rej-org\r\nX-Session-Id: {s}\r\n"), bad_identity("X-User-Id", "is required"),
                 id="missing-user-id"),
    pytest.param(head_with(b"X-Org-Id: rej-org\r\nX-User-Id: mallory\r\n"), bad_identity("X-Session-Id", "is required"),
                 id="missing-session-id"),
    pytest.param(head_with(b"X-Note: {s}\r\n"), bad_identity("X-User-Id", "is required"), id="no-identity-at-all"),
    # -- request lines: HTTP/0.9, garbage, absurd methods and versions ---------------------------
    pytest.param(lambda s: b"GET /\r\n\r\n", bad_identity("X-User-Id", "is required"), id="http-0.9-request"),
    pytest.param(lambda s: b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(32)), MALFORMED,
                 id="tls-client-hello"),
    # The HTTP/2 preface is answered in HTTP/2 (GOAWAY naming the gRPC port): tests/test_grpc_h2_refusal.py
    pytest.param(lambda s: b"HELLO\r\n\r\n", MALFORMED, id="garbage-request-line"),
    pytest.param(lambda s: b"SSH-2.0-OpenSSH_9.6\r\n", MALFORMED, id="ssh-banner"),
    pytest.param(lambda s: b"FOOBAR / HTTP/1.1\r\n" + ident(s) + b"\r\n", MALFORMED, id="absurd-method"),
    pytest.param(lambda s: b"get / HTTP/1.1\r\n" + ident(s) + b"\r\n", MALFORMED, id="lowercase-method"),
    pytest.param(get(b"/", version=b"HTTP/1.2"), MALFORMED, id="http-1.2"),
    pytest.param(get(b"/", version=b"HTTP/9.9"), MALFORMED, id="http-9.9"),
    pytest.param(get(b"/", version=b"http/1.1"), MALFORMED, id="lowercase-version"),
    pytest.param(get(b"/", version=b""), MALFORMED, id="empty-version"),
    pytest.param(get(b"echo/x"), MALFORMED, id="target-without-slash"),
    pytest.param(get(b"?a=b"), MALFORMED, id="query-only-target"),
    pytest.param(get(b"/a\tb"), MALFORMED, id="tab-in-url"),
    pytest.param(get("/caf\u00e9".encode()), MALFORMED, id="raw-utf8-in-url"),
    pytest.param(get(b"/\xff\xfe"), MALFORMED, id="raw-high-bytes-in-url"),
    pytest.param(lambda s: b"CONNECT 127.0.0.1:22 HTTP/1.1\r\n" + ident(s) + b"\r\n",
                 Err(400, "method_not_supported", "CONNECT is not supported"), id="connect-to-caller-chosen-port"),
    # -- Content-Length: negative, non-numeric, huge, duplicated -----------------------------------
    pytest.param(post(b"Content-Length: -1\r\n"), MALFORMED, id="content-length-negative"),
    pytest.param(post(b"Content-Length: abc\r\n"), MALFORMED, id="content-length-non-numeric"),
    pytest.param(post(b"Content-Length: 0x10\r\n"), MALFORMED, id="content-length-hex"),
    pytest.param(post(b"Content-Length: +2\r\n", b"ab"), MALFORMED, id="content-length-plus-sign"),
    pytest.param(post(b"Content-Length: 2, 2\r\n", b"ab"), MALFORMED, id="content-length-list"),
    pytest.param(post(b"Content-Length: 2 2\r\n", b"ab"), MALFORMED, id="content-length-inner-space"),
    pytest.param(post(b"Content-Length: 1.5\r\n", b"ab"), MALFORMED, id="content-length-fraction"),
    pytest.param(post(b"Content-Length: 18446744073709551616\r\n"), MALFORMED, id="content-length-2**64"),
    pytest.param(post(b"Content-Length: " + b"9" * 40 + b"\r\n"), MALFORMED, id="content-length-40-digits"),
    pytest.param(post(b"Content-Length: 9223372036854775808\r\n"), BODY_TOO_LARGE, id="content-length-2**63"),
    pytest.param(post(b"Content-Length: 18446744073709551615\r\n"), BODY_TOO_LARGE, id="content-length-2**64-1"),
    pytest.param(post(b"Content-Length: %d\r\n" % (MAX_BODY + 1)), BODY_TOO_LARGE, id="content-length-over-max-body"),
    pytest.param(post(b"Content-Length: %d\r\n" % (MAX_BODY + 1), b"x" * (MAX_BODY + 1)), BODY_TOO_LARGE,
                 id="body-over-max-body"),
    pytest.param(post(b"Expect: 100-continue\r\nContent-Length: %d\r\n" % (MAX_BODY + 1)), BODY_TOO_LARGE,
                 id="expect-continue-over-max-body"),
    pytest.param(post(b"Content-Length: 1\r\nContent-Length: 2\r\n", b"ab"), MALFORMED,
                 id="content-length-duplicated-conflicting"),
    pytest.param(post(b"Content-Length: 2\r\nContent-Length: 2\r\n", b"ab"), MALFORMED,
                 id="content-length-duplicated-equal"),
    # -- smuggling: Content-Length with Transfer-Encoding, odd codings --------------------------------
    pytest.param(post(b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", b"0\r\n\r\n"), MALFORMED,
                 id="content-length-then-chunked"),
    pytest.param(post(b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n", b"0\r\n\r\n"), MALFORMED,
                 id="chunked-then-content-length"),
    pytest.param(post(b"Transfer-Encoding: chunked, gzip\r\n", b"0\r\n\r\n"), MALFORMED, id="chunked-not-last"),
    pytest.param(post(b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", b"0\r\n\r\n"), MALFORMED,
                 id="transfer-encoding-duplicated"),
    pytest.param(post(b"Transfer-Encoding : chunked\r\n", b"0\r\n\r\n"), MALFORMED,
                 id="transfer-encoding-space-before-colon"),
    pytest.param(post(b"Transfer-Encoding:\r\n chunked\r\n", b"0\r\n\r\n"), MALFORMED,
                 id="transfer-encoding-obs-fold"),
    pytest.param(post(b"Transfer-Encoding: xchunked\r\n", b"0\r\n\r\n"), MALFORMED, id="transfer-encoding-xchunked"),
    pytest.param(post(b"Transfer-Encoding: gzip\r\n", b"ab"), MALFORMED, id="transfer-encoding-gzip-only"),
    pytest.param(post(b"Transfer-Encoding: identity\r\n", b"ab"), MALFORMED, id="transfer-encoding-identity"),
    # -- invalid chunk framing (found only after the head was accepted) ----------------------------
    # These and the three Transfer-Encoding cases just above are reported by llhttp after
    # on_headers_complete, when begin() has already started the task that resolves the route: the
    # 400 must not leave that task running to bind the session and create its sandbox.
    pytest.param(post(b"Transfer-Encoding: chunked\r\n", b"zz\r\nab\r\n0\r\n\r\n"), MALFORMED, id="chunk-size-not-hex"),
    pytest.param(post(b"Transfer-Encoding: chunked\r\n", b"-1\r\nab\r\n0\r\n\r\n"), MALFORMED,
                 id="chunk-size-negative"),
    pytest.param(post(b"Transfer-Encoding: chunked\r\n", b"f" * 20 + b"\r\nab\r\n0\r\n\r\n"), MALFORMED,
                 id="chunk-size-overflow"),
    pytest.param(post(b"Transfer-Encoding: chunked\r\n", b"2\r\nabX\r\n0\r\n\r\n"), MALFORMED,
                 id="chunk-data-without-crlf"),
]

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
    pytest.param(walker(b"GET http://evil.example:22/echo/x HTTP/1.1"),
                 Own(200, raw_path="http://evil.example:22/echo/x"), id="absolute-form-caller-chosen-host"),
    pytest.param(walker(b"GET http://127.0.0.1:1/echo/x HTTP/1.1"), Own(200, raw_path="http://127.0.0.1:1/echo/x"),
                 id="absolute-form-loopback-port"),
    pytest.param(walker(b"GET //evil.example/echo/x HTTP/1.1"), Own(404, code="not_found"),
                 id="scheme-relative-target"),
    pytest.param(walker(b"OPTIONS * HTTP/1.1"), Own(404, code="not_found"), id="asterisk-form"),
    pytest.param(walker(b"GET /echo/x HTTP/1.1", b"Host: evil.example:22\r\n"),
                 Own(200, raw_path="/echo/x", check=echoed("X-Forwarded-Host", lambda v: v == "evil.example:22")),
                 id="host-header-names-another-host"),
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


def case_session(request: pytest.FixtureRequest) -> str:
    return "rej-" + re.sub(r"[^a-z0-9]+", "-", request.node.callspec.id.lower()).strip("-")


@pytest.mark.parametrize(("build", "expected"), DATA_CASES)
async def test_data_plane_rejects_hostile_input(gw: Hostile, request: pytest.FixtureRequest, build: Build,
                                                expected: Err) -> None:
    session = case_session(request)
    response, closed = await send(gw.data_port, build(session.encode()), expect_close=expected.closes)
    assert response is not None, "the gateway closed the connection without an answer"
    assert_error_shape(response, expected)
    assert b"x-runtime-sandbox-id" not in response.headers, "a sandbox answered: the request was forwarded"
    assert response.headers.get(b"x-request-id"), "the gateway's own answers carry a request ID"
    if expected.closes:
        assert closed, "the gateway kept a connection open after a request it could not parse"
    await gw.assert_unbound(session)


@pytest.mark.parametrize(("build", "expected"), OWN_CASES)
async def test_odd_but_valid_requests_reach_only_the_callers_sandbox(gw: Hostile, build: Build, expected: Own) -> None:
    own = gw.bound["walker"]
    response, _ = await send(gw.data_port, build(b""))
    assert response is not None, "the gateway closed the connection without an answer"
    assert response.status == expected.status, (response.status_line, response.body[:300])
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


# -- identities that only look alike are distinct tenants ------------------------------------------
@dataclass(frozen=True)
class LookAlike:
    id: str
    ref: str             # key into REFERENCES
    field: str           # org, user or session
    value: str
    bind: bool = False   # also bound up front, and reached through the data plane

    @property
    def identity(self) -> tuple[str, str, str]:
        org, user, session = REFERENCES[self.ref]
        if self.field == "org":
            return self.value, user, f"lk-{self.id}"
        if self.field == "user":
            return org, self.value, f"lk-{self.id}"
        return org, user, self.value


LOOKALIKES = [
    LookAlike("cyrillic-a-org", "acme", "org", "\u0430cme", bind=True),
    LookAlike("cyrillic-c-org", "acme", "org", "a\u0441me"),
    LookAlike("cyrillic-e-org", "acme", "org", "acm\u0435"),
    LookAlike("all-cyrillic-org", "acme", "org", "\u0430\u0441\u043c\u0435", bind=True),
    LookAlike("greek-alpha-org", "acme", "org", "\u03b1cme"),
    LookAlike("fullwidth-org", "acme", "org", "\uff41\uff43\uff4d\uff45", bind=True),
    LookAlike("math-bold-a-org", "acme", "org", "\U0001d41acme", bind=True),
    LookAlike("uppercase-org", "acme", "org", "ACME"),
    LookAlike("zero-width-space-org", "acme", "org", "ac\u200bme", bind=True),
    LookAlike("zero-width-joiner-org", "acme", "org", "acme\u200d"),
    LookAlike("bom-prefixed-org", "acme", "org", "\ufeffacme", bind=True),
    LookAlike("soft-hyphen-org", "acme", "org", "ac\u00adme"),
    LookAlike("combining-mark-org", "acme", "org", "acme\u0301"),
    LookAlike("trailing-nbsp-org", "acme", "org", "acme\u00a0"),
    LookAlike("cyrillic-a-user", "acme", "user", "\u0430lice", bind=True),
    LookAlike("nfd-org", "cafe", "org", unicodedata.normalize("NFD", "caf\u00e9"), bind=True),
    LookAlike("nfd-user", "cafe", "user", unicodedata.normalize("NFD", "jos\u00e9"), bind=True),
    LookAlike("angstrom-sign-org", "angstrom", "org", "\u212bngstr\u00f6m", bind=True),  # NFC folds it to U+00C5
    LookAlike("nfd-angstrom-org", "angstrom", "org", unicodedata.normalize("NFD", "\u00c5ngstr\u00f6m")),
    LookAlike("ukrainian-i-per-session-org", "iso", "org", "\u0456so-org", bind=True),
    LookAlike("nfd-session-per-session-org", "seance", "session", unicodedata.normalize("NFD", "s\u00e9ance"),
              bind=True),
]
assert all(a.value != REFERENCES[a.ref][("org", "user", "session").index(a.field)] for a in LOOKALIKES)


@pytest.mark.parametrize("alike", LOOKALIKES, ids=lambda a: a.id)
async def test_look_alike_identity_routes_to_a_different_sandbox(gw: Hostile, alike: LookAlike) -> None:
    """The dry run (which creates nothing) never places a look-alike in the original's sandbox."""
    reference = await gw.dry_run(*REFERENCES[alike.ref])
    assert reference["sandbox_id"] == gw.bound[alike.ref]
    placed = await gw.dry_run(*alike.identity)
    assert placed["sandbox_id"] != reference["sandbox_id"]
    if alike.ref == "iso" and alike.field == "org":
        # A look-alike of a per-session org is another org: shared, not per-session (and its own sandbox).
        assert placed["sandbox_id"].startswith("org-") and reference["sandbox_id"].startswith("ses-")


async def test_look_alikes_are_pairwise_distinct(gw: Hostile) -> None:
    placed = [(await gw.dry_run(*a.identity))["sandbox_id"] for a in LOOKALIKES]
    references = [gw.bound[name] for name in REFERENCES]
    assert len(set(placed) | set(references)) == len(placed) + len(references)


@pytest.mark.parametrize("alike", [a for a in LOOKALIKES if a.bind], ids=lambda a: a.id)
async def test_look_alike_headers_reach_their_own_sandbox(gw: Hostile, alike: LookAlike) -> None:
    """UTF-8 header bytes decode to the same identity as the JSON that bound it, and to no other."""
    org, user, session = alike.identity
    head = b"GET /echo/lookalike HTTP/1.1\r\n" + ident(session.encode(), org.encode(), user.encode()) + b"\r\n"
    response, _ = await send(gw.data_port, head)
    assert response is not None and response.status == 200, response
    sandbox = response.json()["headers"]["X-Sandbox-Id"]
    assert sandbox == gw.bound[f"alike:{alike.id}"]
    assert response.headers[b"x-runtime-sandbox-id"] == sandbox.encode()
    assert sandbox not in {gw.bound[name] for name in REFERENCES}


@pytest.mark.parametrize("alike", [a for a in LOOKALIKES if a.field != "session"], ids=lambda a: a.id)
async def test_look_alike_replaying_the_originals_session_is_404(gw: Hostile, alike: LookAlike) -> None:
    """A look-alike org or user sending the original's session ID gets the unknown-session 404."""
    org, user, _ = alike.identity
    session = REFERENCES[alike.ref][2]
    head = b"GET /echo/x HTTP/1.1\r\n" + ident(session.encode(), org.encode(), user.encode()) + b"\r\n"
    response, _ = await send(gw.data_port, head)
    assert response is not None
    assert_error_shape(response, Err(404, "not_found"))
    assert b"x-runtime-sandbox-id" not in response.headers


@pytest.mark.parametrize("name", list(BOUNDARY))
async def test_boundary_identities_reach_their_own_sandbox(gw: Hostile, name: str) -> None:
    org, user, session = BOUNDARY[name]
    response, _ = await send(gw.data_port, b"GET /echo/b HTTP/1.1\r\n" + ident_of(BOUNDARY[name]) + b"\r\n")
    assert response is not None and response.status == 200, response
    assert response.json()["headers"]["X-Sandbox-Id"] == gw.bound[name]
    personal = await gw.dry_run(None, user, session)
    assert personal["sandbox_id"] != gw.bound[name]  # an empty org is not a personal account


async def test_empty_bot_id_is_absent_and_identity_does_not_carry_over_a_connection(gw: Hostile) -> None:
    """Two pipelined requests: the first (walker, empty X-Bot-Id) is served; the second, without identity
    headers on the same connection, is 400 (identity is per request, never per connection)."""
    first = b"GET /echo/1 HTTP/1.1\r\n" + W + b"X-Bot-Id:\r\n\r\n"
    second = b"GET /echo/2 HTTP/1.1\r\nX-Note: no identity\r\n\r\n"
    async with connection(gw.data_port) as (reader, writer):
        writer.write(first + second)
        one = await asyncio.wait_for(read_response(reader), IO_TIMEOUT)
        two = await asyncio.wait_for(read_response(reader), IO_TIMEOUT)
    assert one is not None and one.status == 200 and one.json()["sandbox_id"] == gw.bound["walker"]
    assert two is not None
    assert_error_shape(two, bad_identity("X-User-Id", "is required"))


# -- errors found after the head was accepted, when the route is already warm ----------------------
POST_HEAD_ERRORS = [
    pytest.param(b"Transfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n", id="chunk-size-not-hex"),
    pytest.param(b"Transfer-Encoding: chunked\r\n\r\n" + b"f" * 20 + b"\r\nab\r\n0\r\n\r\n", id="chunk-size-overflow"),
    pytest.param(b"Transfer-Encoding: gzip\r\n\r\nab", id="transfer-encoding-gzip-only"),
]


@pytest.mark.parametrize("tail", POST_HEAD_ERRORS)
async def test_malformed_body_on_a_warm_route_is_still_400(gw: Hostile, tail: bytes) -> None:
    """The same bytes as the cold cases in the table, after a request that left the walker's route cached
    and an idle pooled connection to its sandbox: the answer must still be the documented 400."""
    warm, _ = await send(gw.data_port, b"GET /echo/warm HTTP/1.1\r\n" + W + b"\r\n")
    assert warm is not None and warm.status == 200
    response, closed = await send(gw.data_port, b"POST /echo/x HTTP/1.1\r\n" + W + tail, expect_close=True)
    assert response is not None, ("the gateway cut the connection without the documented 400 (the request had "
                                  "already been attached to a pooled upstream connection)")
    assert_error_shape(response, MALFORMED)
    assert closed


# -- slowloris --------------------------------------------------------------------------------------
async def read_until_closed(reader: asyncio.StreamReader, timeout: float) -> bytes:
    try:
        return await asyncio.wait_for(reader.read(), timeout)
    except ConnectionResetError:
        return b""


async def trickle(writer: asyncio.StreamWriter, data: bytes, interval: float, sent: list[int]) -> None:
    """Pacing, not synchronisation: one byte per ``interval`` until done or cut off."""
    with contextlib.suppress(ConnectionError):
        for byte in data:
            writer.write(bytes([byte]))
            await writer.drain()
            sent[0] += 1
            await asyncio.sleep(interval)


SLOW_HEAD = b"GET /echo/slow HTTP/1.1\r\n" + W + b"X-Padding: " + b"p" * 40 + b"\r\n\r\n"


@pytest.mark.parametrize(("prefix", "slow"), [
    pytest.param(b"", b"", id="silent-connection"),
    pytest.param(b"GET /ec", b"", id="half-a-request-line"),
    pytest.param(SLOW_HEAD[:-20], b"", id="head-without-its-end"),
    pytest.param(b"", b"\r\n" * 200, id="endless-empty-lines"),
    pytest.param(b"", SLOW_HEAD, id="head-a-byte-at-a-time"),
    pytest.param(b"GET /echo/x HTTP/1.1\r\n" + W, b"".join(b"X-H%d: v\r\n" % i for i in range(200)),
                 id="endless-header-lines"),
])
async def test_slowloris_is_cut_off(gw: Hostile, prefix: bytes, slow: bytes) -> None:
    async with connection(gw.data_port) as (reader, writer):
        started = time.monotonic()
        writer.write(prefix)
        sent = [0]
        pacer = asyncio.create_task(trickle(writer, slow, 0.02, sent))
        try:
            data = await read_until_closed(reader, HEAD_TIMEOUT + 4)
        finally:
            pacer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pacer
        elapsed = time.monotonic() - started
    assert data == b"", f"expected a silent close, got {data[:200]!r}"
    assert elapsed < HEAD_TIMEOUT + 2, f"closed after {elapsed:.2f}s (header_read_timeout {HEAD_TIMEOUT}s)"
    if slow:
        assert sent[0] < len(slow), "the whole head got through before the deadline: the pacing is too fast"


async def test_slowloris_after_a_served_request_on_a_kept_alive_connection(gw: Hostile) -> None:
    async with connection(gw.data_port) as (reader, writer):
        writer.write(b"GET /echo/first HTTP/1.1\r\n" + W + b"\r\n")
        first = await asyncio.wait_for(read_response(reader), IO_TIMEOUT)
        assert first is not None and first.status == 200
        started = time.monotonic()
        sent = [0]
        pacer = asyncio.create_task(trickle(writer, SLOW_HEAD, 0.02, sent))
        try:
            data = await read_until_closed(reader, HEAD_TIMEOUT + 4)
        finally:
            pacer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pacer
    assert data == b"" and time.monotonic() - started < HEAD_TIMEOUT + 2
    assert sent[0] < len(SLOW_HEAD)


# -- the control API --------------------------------------------------------------------------------
def js(value: Any) -> bytes:
    return json.dumps(value).encode()


INVALID_JSON = Err(400, "invalid_json", "the request body is not valid JSON")
NOT_OBJECT = Err(400, "invalid_json", "the request body must be a JSON object")
UNKNOWN_FIELD = Err(400, "bad_request", "unknown field")
CTL_TOO_LARGE = Err(413, "payload_too_large")
UNKNOWN_SESSION = Err(404, "not_found", "no such session for this identity")


def ctl_identity(**fields: Any) -> bytes:
    return js({"user_id": "mallory", "session_id": "ctl-rejected"} | fields)


SESSIONS = "/v1/sessions"
CONTROL_CASES: list[Any] = [
    # -- huge and deeply nested JSON ---------------------------------------------------------------
    # Nesting 1000 deep fits easily in the 64 KiB body limit; json.loads raises RecursionError for it,
    # which is not a ValueError: it must still be invalid_json, never the 500 of an unhandled error.
    pytest.param("POST", SESSIONS, ctl_identity(org_id="o" * 100_000), CTL_TOO_LARGE, id="json-100kb-string"),
    pytest.param("POST", SESSIONS, b"[" + b"1," * 500_000 + b"1]", CTL_TOO_LARGE, id="json-1mb-array"),
    pytest.param("POST", SESSIONS, b" " * (64 * 1024) + ctl_identity(), CTL_TOO_LARGE, id="json-just-over-64kb"),
    pytest.param("POST", SESSIONS, b"[" * 1000 + b"]" * 1000, INVALID_JSON, id="json-array-nested-1000-deep"),
    pytest.param("POST", SESSIONS, b'{"a":' * 1000 + b"1" + b"}" * 1000, INVALID_JSON,
                 id="json-object-nested-1000-deep"),
    pytest.param("POST", SESSIONS, b"[" * 60_000, INVALID_JSON, id="json-60000-unclosed-brackets"),
    pytest.param("POST", SESSIONS, b"[" * 50 + b"]" * 50, NOT_OBJECT, id="json-array-nested-50-deep"),
    # -- malformed JSON ---------------------------------------------------------------------------------
    pytest.param("POST", SESSIONS, b'{"user_id": "u",', INVALID_JSON, id="json-truncated"),
    pytest.param("POST", SESSIONS, b"", INVALID_JSON, id="json-empty-body"),
    pytest.param("POST", SESSIONS, ctl_identity() + b" trailing", INVALID_JSON, id="json-trailing-garbage"),
    pytest.param("POST", SESSIONS, b"{'user_id': 'u', 'session_id': 's'}", INVALID_JSON, id="json-single-quotes"),
    pytest.param("POST", SESSIONS, b'{"user_id": "u", /* c */ "session_id": "s"}', INVALID_JSON, id="json-comment"),
    pytest.param("POST", SESSIONS, b"\xef\xbb\xbf" + ctl_identity(), INVALID_JSON, id="json-utf8-bom"),
    pytest.param("POST", SESSIONS, b'{"user_id": "\xff", "session_id": "s"}', INVALID_JSON, id="json-invalid-utf8"),
    pytest.param("POST", SESSIONS, b'{"user_id": "\xed\xa0\x80", "session_id": "s"}', INVALID_JSON,
                 id="json-raw-surrogate-bytes"),
    pytest.param("POST", SESSIONS, ctl_identity().decode().encode("utf-16"), INVALID_JSON, id="json-utf16"),
    pytest.param("POST", SESSIONS, b'{"user_id": "a\x00b", "session_id": "s"}', INVALID_JSON,
                 id="json-raw-nul-in-string"),
    pytest.param("POST", SESSIONS, b'{"user_id": ' + b"9" * 5000 + b', "session_id": "s"}', INVALID_JSON,
                 id="json-5000-digit-integer"),
    # -- JSON that is not an object ---------------------------------------------------------------------
    pytest.param("POST", SESSIONS, b'["mallory", "s"]', NOT_OBJECT, id="json-array"),
    pytest.param("POST", SESSIONS, b'"mallory"', NOT_OBJECT, id="json-string"),
    pytest.param("POST", SESSIONS, b"null", NOT_OBJECT, id="json-null"),
    pytest.param("POST", SESSIONS, b"true", NOT_OBJECT, id="json-true"),
    pytest.param("POST", SESSIONS, b"1e999999", NOT_OBJECT, id="json-infinite-number"),
    # -- wrong types ------------------------------------------------------------------------------------
    pytest.param("POST", SESSIONS, b'{"user_id": NaN, "session_id": "s"}',
                 bad_identity("user_id", "must be a string"), id="nan-user-id"),
    pytest.param("POST", SESSIONS, b'{"user_id": "u", "session_id": Infinity}',
                 bad_identity("session_id", "must be a string"), id="infinity-session-id"),
    pytest.param("POST", SESSIONS, ctl_identity(user_id=1), bad_identity("user_id", "must be a string"),
                 id="integer-user-id"),
    pytest.param("POST", SESSIONS, ctl_identity(session_id=1.5), bad_identity("session_id", "must be a string"),
                 id="float-session-id"),
    pytest.param("POST", SESSIONS, ctl_identity(user_id=["mallory"]), bad_identity("user_id", "must be a string"),
                 id="list-user-id"),
    pytest.param("POST", SESSIONS, ctl_identity(org_id={"$ne": None}), bad_identity("org_id", "must be a string"),
                 id="object-org-id"),
    pytest.param("POST", SESSIONS, ctl_identity(bot_id=True), bad_identity("bot_id", "must be a string"),
                 id="boolean-bot-id"),
    pytest.param("POST", SESSIONS, ctl_identity(user_id=None), bad_identity("user_id", "is required"),
                 id="null-user-id"),
    pytest.param("POST", SESSIONS, js({"user_id": "mallory"}), bad_identity("session_id", "is required"),
                 id="missing-session-id"),
    pytest.param("POST", SESSIONS, ctl_identity(user_id=""), bad_identity("user_id", "must not be empty"),
                 id="empty-user-id"),
    pytest.param("POST", SESSIONS, ctl_identity(session_id="s" * 257),
                 bad_identity("session_id", "must be at most 256"),
                 id="257-char-session-id"),
    pytest.param("POST", SESSIONS, ctl_identity(user_id="a\u0000b"), bad_identity("user_id", CONTROL_CHARS),
                 id="escaped-nul-in-user-id"),
    pytest.param("POST", SESSIONS, b'{"user_id": "\\ud800", "session_id": "s"}',
                 bad_identity("user_id", "must be valid UTF-8 (found a lone surrogate)"), id="escaped-lone-surrogate"),
    pytest.param("POST", SESSIONS, b'{"user_id": "u", "session_id": "\\udfff"}',
                 bad_identity("session_id", "must be valid UTF-8"), id="escaped-lone-low-surrogate"),
    pytest.param("POST", SESSIONS, ctl_identity(org_id="a\u2028b"), bad_identity("org_id", CONTROL_CHARS),
                 id="escaped-line-separator-in-org-id"),
    pytest.param("POST", SESSIONS, ctl_identity(org_id="a\u0085b"), bad_identity("org_id", CONTROL_CHARS),
                 id="escaped-c1-in-org-id"),
    pytest.param("POST", SESSIONS, ctl_identity(org_id="a\r\nX-Org-Id: victim"), bad_identity("org_id", CONTROL_CHARS),
                 id="escaped-crlf-in-org-id"),
    # -- extra fields -----------------------------------------------------------------------------------
    pytest.param("POST", SESSIONS, ctl_identity(sandbox_id="org-0000"), UNKNOWN_FIELD, id="extra-field-sandbox-id"),
    pytest.param("POST", SESSIONS, ctl_identity(pool="small"), UNKNOWN_FIELD, id="extra-field-pool"),
    pytest.param("POST", SESSIONS, ctl_identity(endpoint="http://127.0.0.1:22"), UNKNOWN_FIELD,
                 id="extra-field-endpoint"),
    pytest.param("POST", SESSIONS, ctl_identity(__proto__={"admin": True}), UNKNOWN_FIELD, id="extra-field-proto"),
    pytest.param("POST", SESSIONS, js({"USER_ID": "mallory", "session_id": "ctl-rejected"}), UNKNOWN_FIELD,
                 id="field-name-other-case"),
    pytest.param("PUT", SESSIONS, ctl_identity(), Err(405, "method_not_allowed"), id="put-sessions"),
    pytest.param("PATCH", "/v1/sessions/walk-1", ctl_identity(), Err(405, "method_not_allowed"), id="patch-session"),
    # -- traversal and hostile bytes in path parameters ------------------------------------------------
    pytest.param("GET", "/v1/sessions/..%2F..%2Fsandboxes", None, UNKNOWN_SESSION, id="get-encoded-dotdot-slash"),
    pytest.param("GET", "/v1/sessions/%2e%2e%2f%2e%2e%2fsandboxes", None, UNKNOWN_SESSION,
                 id="get-encoded-dots-and-slash"),
    pytest.param("GET", "/v1/sessions/%252e%252e%252fsandboxes", None, UNKNOWN_SESSION, id="get-double-encoded"),
    pytest.param("GET", "/v1/sessions/walk-1%2F..%2F..", None, UNKNOWN_SESSION, id="get-real-session-plus-dotdot"),
    pytest.param("GET", "/v1/sessions/../sandboxes", None, Err(404, "not_found"), id="get-raw-dotdot"),
    pytest.param("GET", "/v1/sessions/%00", None, bad_identity("session_id", CONTROL_CHARS), id="get-encoded-nul"),
    pytest.param("GET", "/v1/sessions/a%0d%0aSet-Cookie:%20x=1", None, bad_identity("session_id", CONTROL_CHARS),
                 id="get-encoded-crlf"),
    pytest.param("GET", "/v1/sessions/" + "a" * 300, None, bad_identity("session_id", "must be at most 256"),
                 id="get-300-char-session"),
    pytest.param("GET", "/v1/sessions/%c0%ae%c0%ae", None, UNKNOWN_SESSION, id="get-overlong-utf8-dots"),
    pytest.param("GET", "/v1/sessions/%ED%A0%80", None, UNKNOWN_SESSION, id="get-encoded-lone-surrogate"),
    pytest.param("DELETE", "/v1/sessions/..%2F..%2Fsandboxes", None, UNKNOWN_SESSION, id="delete-encoded-dotdot"),
    pytest.param("DELETE", "/v1/sessions/%2e%2e", None, Err(404, "not_found"), id="delete-encoded-dots"),
    pytest.param("DELETE", "/v1/sessions/walk-1%2F..", None, UNKNOWN_SESSION, id="delete-real-session-plus-dotdot"),
    pytest.param("DELETE", "/v1/sessions/walk-1%00", None, bad_identity("session_id", CONTROL_CHARS),
                 id="delete-real-session-plus-nul"),
    # -- the dry run's query --------------------------------------------------------------------------
    pytest.param("GET", "/v1/route?session_id=s", None, bad_identity("user_id", "is required"), id="route-no-user"),
    pytest.param("GET", "/v1/route?user_id=u&session_id=s&sandbox_id=org-0", None,
                 Err(400, "bad_request", "unknown query parameter 'sandbox_id'"), id="route-unknown-parameter"),
    pytest.param("GET", "/v1/route?user_id=u%00&session_id=s", None, bad_identity("user_id", CONTROL_CHARS),
                 id="route-encoded-nul"),
    pytest.param("GET", "/v1/route?user_id=u&session_id=s&org_id=a%0d%0ab", None, bad_identity("org_id", CONTROL_CHARS),
                 id="route-encoded-crlf"),
    pytest.param("GET", "/v1/route?user_id=" + "u" * 300 + "&session_id=s", None,
                 bad_identity("user_id", "must be at most 256"), id="route-300-char-user"),
    # Like duplicated identity headers on the data plane: neither "the first" nor "the last" wins.
    pytest.param("GET", "/v1/route?user_id=first&user_id=second&session_id=s", None,
                 Err(400, "invalid_identity", "query parameter 'user_id' is given more than once"),
                 id="route-duplicated-parameter"),
    pytest.param("POST", SESSIONS, b'{"user_id": "mallory", "session_id": "ctl-rejected", "user_id": "victim"}',
                 Err(400, "invalid_json", "field 'user_id' is given more than once"), id="json-duplicated-key"),
    # Bidirectional overrides: "\u202eemca" would display as "acme" in listings and logs.
    pytest.param("POST", SESSIONS, ctl_identity(org_id="\u202eemca"),
                 bad_identity("org_id", "must not contain bidirectional text controls"), id="bidi-override-org-id"),
    pytest.param("POST", SESSIONS, ctl_identity(user_id="\u2066acme\u2069"),
                 bad_identity("user_id", "must not contain bidirectional text controls"), id="bidi-isolates-user-id"),
    pytest.param("GET", "/v1/route?user_id=u&session_id=s&org_id=%E2%80%AEemca", None,
                 bad_identity("org_id", "must not contain bidirectional text controls"), id="route-bidi-override"),
]


@pytest.mark.parametrize(("method", "target", "body", "expected"), CONTROL_CASES)
async def test_control_api_rejects_hostile_input(gw: Hostile, method: str, target: str, body: bytes | None,
                                                 expected: Err) -> None:
    response = await control(gw, method, target, body=body)
    assert response is not None, "the control API closed the connection without an answer"
    assert_error_shape(response, expected)
    await gw.assert_unbound("ctl-rejected")
    if method == "DELETE":  # a traversal never deletes the session it names or any other
        status, bound = await gw.session_status(WALKER[2])
        assert status == 200 and bound["sandbox_id"] == gw.bound["walker"]


async def test_control_api_owner_mismatch_is_404_and_deletes_nothing(gw: Hostile) -> None:
    for method in ("GET", "DELETE"):
        response = await control(gw, method, "/v1/sessions/ref-acme",
                                 headers={"X-Org-Id": "acme", "X-User-Id": "mallory"})
        assert response is not None
        assert_error_shape(response, UNKNOWN_SESSION)
    status, bound = await gw.session_status("ref-acme")
    assert status == 200 and bound["sandbox_id"] == gw.bound["acme"]


async def test_json_sent_as_a_form_or_text_is_415(gw: Hostile) -> None:
    """A web page can POST text/plain or a form to localhost without a CORS preflight: never a bind."""
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        lines = [f"POST {SESSIONS} HTTP/1.1", "Host: gateway", "Connection: close",
                 *(f"{k}: {v}" for k, v in gw.admin.items()), f"Content-Type: {content_type}"]
        body = ctl_identity()
        data = ("\r\n".join(lines + [f"Content-Length: {len(body)}"]) + "\r\n\r\n").encode() + body
        response, _ = await send(gw.control_port, data)
        assert response is not None
        assert_error_shape(response, Err(415, "unsupported_media_type", "send the body as Content-Type: application/json"))
    await gw.assert_unbound("ctl-rejected")


# Malformed HTTP on the control port: aiohttp's low-level server answers these itself, before any
# middleware runs, with a plain-text 400 (the one place the JSON shape is not kept; SECURITY.md says
# so). What must hold: a 400, a closed connection, no 5xx, and no ERROR in the log (an INFO line
# instead: anyone who reaches the port could otherwise fill the log with tracebacks).
@pytest.mark.parametrize("data", [
    pytest.param(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\nX-Note: a\x00b\r\n\r\n", id="nul-in-header-value"),
    pytest.param(b"POST /v1/sessions HTTP/1.1\r\nHost: gateway\r\nContent-Length: -1\r\n\r\n",
                 id="negative-content-length"),
    pytest.param(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\nX-Big: " + b"a" * 65_536 + b"\r\n\r\n", id="64kb-header"),
])
async def test_control_api_malformed_http_is_400_and_closed(gw: Hostile, data: bytes) -> None:
    response, closed = await send(gw.control_port, data, expect_close=True)
    assert response is not None, "the control API closed the connection without an answer"
    assert response.status == 400, response.status_line
    assert closed


# -- control-API authentication -----------------------------------------------------------------------
def _token(**claims: Any) -> str:
    base = {"sub": "ops", "aud": ADMIN_AUDIENCE, "exp": int(time.time()) + 600} | claims
    return jwt.encode(base, SECRET, algorithm="HS256", headers={"kid": "admin"})


@pytest.mark.parametrize(("method", "target", "authorization"), [
    pytest.param("GET", "/v1/sandboxes", None, id="no-token"),
    pytest.param("POST", SESSIONS, None, id="bind-without-token"),
    pytest.param("GET", "/v1/route?user_id=u&session_id=s", None, id="dry-run-without-token"),
    pytest.param("GET", "/v1/sandboxes", "Bearer " + _token(aud=DATA_AUDIENCE), id="data-plane-token"),
    pytest.param("GET", "/v1/sandboxes", "Bearer " + _token(exp=int(time.time()) - 600), id="expired-token"),
    pytest.param("GET", "/v1/sandboxes", "Bearer not.a.jwt", id="garbage-token"),
    pytest.param("GET", "/v1/sandboxes", "Basic b3BzOm9wcw==", id="basic-auth"),
    pytest.param("GET", "/v1/sandboxes", "Bearer " + jwt.encode({"sub": "ops", "aud": ADMIN_AUDIENCE}, None,
                                                                algorithm="none", headers={"kid": "admin"}),
                 id="alg-none-token"),
    pytest.param("GET", "/healthz/../v1/sandboxes", None, id="dotdot-out-of-an-open-path"),
    pytest.param("GET", "/healthz/%2e%2e/v1/sandboxes", None, id="encoded-dotdot-out-of-an-open-path"),
    pytest.param("GET", "/metrics/./../v1/sandboxes", None, id="dot-segments-out-of-metrics"),
    pytest.param("GET", "//v1/sandboxes", None, id="double-slash"),
])
async def test_control_api_without_an_admin_token_is_401(gw: Hostile, method: str, target: str,
                                                         authorization: str | None) -> None:
    headers = {"Authorization": authorization} if authorization else {}
    body = js({"user_id": "mallory", "session_id": "ctl-rejected"}) if method == "POST" else None
    response = await control(gw, method, target, body=body, headers=headers, admin=False)
    assert response is not None
    assert_error_shape(response, Err(401, "unauthorized"))
    await gw.assert_unbound("ctl-rejected")


# -- afterwards ---------------------------------------------------------------------------------------
async def test_zz_gateway_survived_the_table(gw: Hostile) -> None:
    assert gw.process.proc is not None and gw.process.proc.returncode is None, "the gateway process died"
    async with gw.http.get(f"{gw.control_url}/healthz") as response:
        assert response.status == 200 and await response.json() == {"status": "ok"}
    async with gw.http.get(f"{gw.control_url}/readyz") as response:
        assert response.status == 200, await response.text()
    response, _ = await send(gw.data_port, b"GET /echo/still-here HTTP/1.1\r\n" + W + b"\r\n")
    assert response is not None and response.status == 200
    assert response.json()["sandbox_id"] == gw.bound["walker"]


async def test_zz_nothing_created_for_rejected_requests(gw: Hostile) -> None:
    async with gw.http.get(f"{gw.control_url}/v1/sandboxes", headers=gw.admin) as response:
        assert response.status == 200
        listing = {s["sandbox_id"] for s in (await response.json())["sandboxes"]}
    unexpected = listing - gw.expected
    assert not unexpected, f"sandboxes no valid case asked for: {sorted(unexpected)}"
    leftovers = []
    for session in sorted(set(gw.rejected)):
        status, body = await gw.session_status(session)
        if status != 404:
            leftovers.append((session, body))
    assert not leftovers, f"rejected requests left bindings behind: {leftovers}"


async def test_zz_no_internal_error_was_logged(gw: Hostile) -> None:
    errors = [line for line in gw.process.log if re.search(r"\b(ERROR|CRITICAL)\b", line)]
    assert not errors, "\n".join(errors[:20])

"""The shared harness of the hostile-input tests: one real ``sandbox-gateway serve`` (tests/hostile/conftest.py
starts it once for the whole package), the raw requests sent to it, and what each case expects.

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

Raw HTTP goes through tests/proxy_helpers.py (``raw_client``, ``read_response``, ``closed_by_server``).
"""

from __future__ import annotations

import asyncio
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest

from tests.gateway_process import GatewayProcess
from tests.proxy_helpers import RawResponse, closed_by_server, raw_client, read_response

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
Resp = RawResponse


async def answer(reader: asyncio.StreamReader) -> Resp | None:
    """One response; None when the server closed without answering (never half a head)."""
    try:
        return await read_response(reader)
    except asyncio.IncompleteReadError as exc:
        assert not exc.partial, f"the connection ended inside a response head: {exc.partial[:300]!r}"
        return None
    except ConnectionResetError:
        return None


async def send(port: int, data: bytes, *, expect_close: bool = False) -> tuple[Resp | None, bool | None]:
    """Write ``data`` at once; the first response, and whether the server then closed the connection."""
    async with raw_client(port) as (reader, writer):
        writer.write(data)
        response = await asyncio.wait_for(answer(reader), IO_TIMEOUT)
        closed = await closed_by_server(reader, IO_TIMEOUT) if expect_close and response is not None else None
        return response, closed


def ident(session: bytes, org: bytes | None = b"rej-org", user: bytes | None = b"mallory",
          bot: bytes | None = None) -> bytes:
    lines = b"Host: gw\r\n"  # HTTP/1.1 needs one (RFC 9112): without it the data plane answers 400 invalid_host
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
        return self.code in ("bad_request", "header_too_large", "uri_too_long", "unsupported_transfer_encoding", "payload_too_large", "method_not_supported")


@dataclass(frozen=True)
class Own:
    """The request reaches the caller's own sandbox (the walker's), which answers ``status``."""

    status: int = 200
    raw_path: str | None = None          # for /echo: the path must arrive byte for byte
    code: str | None = None              # for the runtime's own JSON errors
    check: Callable[[dict[str, Any]], None] | None = None  # more checks on the /echo report


def assert_error_shape(response: Resp, expected: Err) -> None:
    body_text = response.body.decode(errors="replace")
    # 501 is no failure of ours: the request is valid HTTP the gateway declines to carry (a transfer coding).
    assert response.status < 500 or response.status == expected.status == 501, \
        f"5xx for hostile input: {response.status} {body_text[:300]}"
    assert response.status == expected.status, f"{response.status} {body_text[:300]}"
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
    return lambda s: b"GET / HTTP/1.1\r\nHost: gw\r\n" + lines.replace(b"{s}", s) + b"\r\n"


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
TOO_LARGE = Err(431, "header_too_large", f"the request head exceeds {MAX_HEAD} bytes")
URI_TOO_LONG = Err(414, "uri_too_long", f"the request target makes the request head exceed {MAX_HEAD} bytes")
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



def case_session(request: pytest.FixtureRequest) -> str:
    return "rej-" + re.sub(r"[^a-z0-9]+", "-", request.node.callspec.id.lower()).strip("-")


async def check_rejected(gw: Hostile, request: pytest.FixtureRequest, build: Build, expected: Err) -> None:
    """A data-plane case of the rejection tables: the documented error, from the gateway itself, nothing bound."""
    session = case_session(request)
    response, closed = await send(gw.data_port, build(session.encode()), expect_close=expected.closes)
    assert response is not None, "the gateway closed the connection without an answer"
    assert_error_shape(response, expected)
    assert b"x-runtime-sandbox-id" not in response.headers, "a sandbox answered: the request was forwarded"
    assert response.headers.get(b"x-request-id"), "the gateway's own answers carry a request ID"
    if expected.closes:
        assert closed, "the gateway kept a connection open after a request it could not parse"
    await gw.assert_unbound(session)


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

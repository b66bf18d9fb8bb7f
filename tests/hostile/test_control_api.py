"""Hostile input on the control API: JSON bodies, types, extra fields, path parameters, the dry run's
query, content types, malformed HTTP and missing or wrong admin tokens."""

from __future__ import annotations

import json
import time
from typing import Any

import jwt
import pytest

from gateway.auth import ADMIN_AUDIENCE, DATA_AUDIENCE
from tests.hostile.harness import (
    CONTROL_CHARS, SECRET, WALKER, assert_error_shape, bad_identity, control, Err, Hostile, send,
)

pytestmark = pytest.mark.asyncio(loop_scope="package")

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

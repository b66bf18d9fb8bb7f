"""A call's request head as the gateway reads it, and the sandbox's head and trailers as the client may get them.

Pure functions of header lists (bytes, as HPACK decoded them): the call (``call.py``) reads a request head
once per distinct head (``Call._admit`` remembers it) and passes each answer's head and trailers
through :func:`forwardable`.
"""

from __future__ import annotations

import math
import re
from typing import Any

from grpclib.metadata import decode_timeout

from gateway.errors import BadRequest, Unauthorized, UnsupportedMediaType
from gateway.proxy._admission import (R_AUTH, R_BOT, R_CL, R_COOKIE, R_EXPECT, R_ORG, R_REQUEST_ID, REQUEST_HEADERS,
                                      SANDBOX_HEADER_PREFIXES, SANDBOX_ID_HEADER, Credentials)
from gateway.proxy._wire import ACCESS_COOKIE, HOST_ACCESS_COOKIE, cut_access_cookie

# Header names and values are bytes as HPACK decoded them: forwarded as received,
# with no per-header decoding; only what the gateway reads itself is decoded (ASCII, else INVALID_ARGUMENT).
# Which are read, dropped or forwarded is the admission's rules (gateway/proxy/_admission.py), the data
# plane's too: of the names they know, these roles are forwarded (the rest are identity, credentials,
# hop-by-hop, X-Forwarded-* or the router's X-Sandbox-* vocabulary); grpc-timeout is re-sent by the gateway.
_FORWARDED_ROLES = frozenset((R_CL, R_REQUEST_ID, R_EXPECT, R_COOKIE))
# Never in an HTTP/2 message (RFC 9113 8.2.2): dropped from what the sandbox answers, so that a sandbox
# sending them cannot make the gateway send the client a malformed response.
_CONNECTION_SPECIFIC = frozenset((b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding",
                                  b"upgrade", b"te"))
# A proto service and method name: also what keeps the access log and metric labels free of odd bytes.
_METHOD_PATH = re.compile(rb"/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+").fullmatch
HEAD_REMEMBERED_SIZE = 8192  # bytes of names and values: a larger head is built every time (a memo holds 128 KiB)
_SANDBOX_HEADS_REMEMBERED = 64  # sandboxes' request heads, front-wide (sandbox_head); more, and the memo starts over
# gRPC status codes the gateway answers with itself; INTERNAL is also what a grpc-status that is not a number reads as
CANCELLED, UNKNOWN, DEADLINE_EXCEEDED, PERMISSION_DENIED, RESOURCE_EXHAUSTED = 1, 2, 4, 7, 8
INTERNAL, UNAVAILABLE = 13, 14


def grpc_content_type(value: bytes | None) -> bool:
    """application/grpc, or application/grpc+codec, or with parameters (;): not merely its prefix."""
    return value is not None and (value == b"application/grpc" or value[16:17] in (b"+", b";")
                                  and value.startswith(b"application/grpc"))


Headers = list[tuple[bytes, bytes]]
# A request head as read (read_head): forwarded headers, method path, grpc-timeout and seconds, credentials.
Head = tuple[tuple[tuple[bytes, bytes], ...], str, tuple[bytes, float] | None, Credentials]


def header_text(value: bytes) -> str:
    """A header value the gateway reads; shown in an error message, so never raises."""
    return value.decode("ascii", "backslashreplace")


def status_of(headers: Headers) -> int | None:
    for name, value in headers:
        if name == b"grpc-status":
            return int(value) if value.isdigit() else INTERNAL
    return None


def http_status(headers: Headers) -> bytes:
    """A response head's ``:status`` (b"" without one)."""
    for name, value in headers:
        if name == b":status":
            return value
    return b""


# Names already found allowed (forwardable), for heads and for trailers: a sandbox sends the same few every
# call, so each is checked once, not per call. Bounded: a sandbox inventing names starts it over.
_ALLOWED_NAMES: tuple[set[bytes], set[bytes]] = (set(), set())  # [head]
_ALLOWED_REMEMBERED = 256


def forwardable(headers: Headers, head: bool) -> Headers:
    """The sandbox's response head (``head``) or trailers as the client may get them: without
    connection-specific fields, pseudo-headers other than a head's ``:status``, or upper-case names
    (each makes an HTTP/2 message malformed). The list itself when nothing is dropped, as is usual."""
    known = _ALLOWED_NAMES[head]
    for name, _ in headers:
        if name in known:
            continue
        if not _allowed(name, head):
            return [(name, value) for name, value in headers if _allowed(name, head)]
        if len(known) >= _ALLOWED_REMEMBERED:
            known.clear()
        known.add(name)
    return headers


def _allowed(name: bytes, head: bool) -> bool:
    if name[:1] == b":":
        return head and name == b":status"
    return name not in _CONNECTION_SPECIFIC and name == name.lower()


def encode_timeout_ms(seconds: float) -> str:
    """A grpc-timeout value (at most 8 digits) for ``seconds``, rounded up so it never shortens to 0."""
    # rounded to the microsecond first: a float's last bits must not turn 701 ms into 702
    millis = max(1, math.ceil(round(seconds * 1000, 3)))
    return f"{millis}m" if millis < 100_000_000 else f"{min(99_999_999, math.ceil(seconds))}S"


def timeout_left(timeout: tuple[bytes, float], left: float) -> bytes:
    """grpc-timeout for the sandbox, ``left`` seconds before the deadline of the client's ``timeout`` (as sent, and
    in seconds): its own value while the gateway has spent under a millisecond of it (as is usual: passed on
    exactly, not re-rounded), else the time left."""
    value, seconds = timeout
    return value if seconds - left < 0.001 else encode_timeout_ms(left).encode()


def _take_credential(credentials: list[bytes | None], role: int, name: bytes, value: bytes) -> None:
    """Identity and credentials (``x-org-id`` .. ``x-bot-id``, ``authorization``) are read, never forwarded;
    each may be given once, in ASCII. The admission's other roles that are not forwarded are dropped."""
    if not (R_ORG <= role <= R_BOT or role == R_AUTH):
        return
    index = 4 if role == R_AUTH else role - R_ORG
    if credentials[index] is not None:
        raise BadRequest(f"{name.decode()}: must be given once", code="invalid_identity")
    if not value.isascii():
        raise BadRequest(f"{name.decode()}: must be ASCII", code="invalid_identity")
    credentials[index] = value


def _checked_path(content_type: bytes | None, method: bytes | None, path: bytes | None) -> str:
    """The call's method path, once the head is a gRPC request: else UnsupportedMediaType or BadRequest."""
    if not grpc_content_type(content_type):  # first: whatever its method, an HTTP request gets HTTP 415
        shown = repr(header_text(content_type)) if content_type is not None else None
        raise UnsupportedMediaType(f"content-type must be application/grpc[+codec], got {shown}")
    if method != b"POST":
        raise BadRequest(f":method must be POST for gRPC, got {header_text(method) if method else method!r}")
    if path is None or len(path) > 512 or not _METHOD_PATH(path):
        raise BadRequest(f":path must be /package.Service/Method, got {header_text(path[:100]) if path else path!r}")
    return path.decode()


def _timeout_seconds(timeout: bytes) -> float:
    """A grpc-timeout value in seconds; BadRequest when it is not one."""
    try:
        if len(timeout) > 9:  # TimeoutValue is at most 8 digits
            raise ValueError(timeout)
        return float(decode_timeout(timeout.decode("ascii")))
    except (ValueError, UnicodeDecodeError):
        raise BadRequest(f"grpc-timeout: {header_text(timeout)!r} is not a gRPC timeout (such as 100m or 5S)") from None


def read_head(headers: Headers, call: Any) -> Head:
    """What the request head reads as: the headers to forward, the method path, grpc-timeout (as sent and
    in seconds) and the credentials; raises the client's error for a head that is not admissible. The method
    path is set on ``call`` (its ``path``) once checked: a refusal after that is logged under it."""
    method = path = content_type = timeout = None
    credentials: list[bytes | None] = [None, None, None, None, None]  # the order of admission's Credentials
    out: Headers = []
    roles = REQUEST_HEADERS  # the admission's rules, by lower-case name (HTTP/2 names are: headers.py)
    for name, value in headers:
        if name.startswith(b":"):
            if name == b":path":
                path = value
            elif name == b":method":
                method = value
            continue
        role = roles.get(name)
        if role is None:
            if name == b"grpc-timeout":
                timeout = value  # re-sent by the gateway (timeout_left)
                continue
            if name.startswith(SANDBOX_HEADER_PREFIXES):
                continue  # the router's vocabulary: never a client's word
            if name == b"content-type":
                content_type = value
        elif role not in _FORWARDED_ROLES:
            _take_credential(credentials, role, name, value)  # else hop-by-hop, X-Forwarded-*, the router's
            continue                                          # headers: dropped, as on the HTTP data plane
        elif role == R_COOKIE and (ACCESS_COOKIE in value or HOST_ACCESS_COOKIE in value):
            value = cut_access_cookie(value)[0]  # the access token stays with the gateway
            if not value:
                continue
        if not value.isascii():  # gRPC metadata values are ASCII (-bin ones base64): refused here, per call,
            raise BadRequest(f"{header_text(name)}: a metadata value must be ASCII (binary ones base64, in -bin keys)")
        out.append((name, value))  # rather than killing the sandbox's connection, shared by other calls
    checked = call.path = _checked_path(content_type, method, path)
    timeout_read = (timeout, _timeout_seconds(timeout)) if timeout is not None else None
    if credentials[1] is None and credentials[4] is None:
        raise Unauthorized("no identity: send x-user-id and x-session-id metadata (x-org-id, x-bot-id "
                           "optional), or authorization: Bearer <token> with x-session-id")
    return tuple(out), checked, timeout_read, tuple(credentials)  # type: ignore[return-value]


def sandbox_head(heads: dict[Any, Any], out: Any, path: str, target: tuple[str, int | None],
                 sandbox_id: str, timeout: bytes | None, exact: bool) -> tuple[tuple[bytes, bytes], ...]:
    """The request head for the sandbox but for traceparent (``out`` is what :func:`read_head` forwards), with
    grpc-timeout ``timeout``, remembered in ``heads`` (the front's) when the timeout is the client's, passed on
    as it came (``exact``), or none: a client calls one method with one head call after call, and building it
    was about 4k instructions a call. The time left, counted down, is a value of the call's own: not kept."""
    key = (out, path, target, sandbox_id, timeout)
    head = heads.get(key) if exact else None
    if head is None:
        host, port = target
        authority = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
        head = ((b":method", b"POST"), (b":scheme", b"http"), (b":path", path.encode()),
                (b":authority", authority.encode()), (b"te", b"trailers"), *out,
                (SANDBOX_ID_HEADER, sandbox_id.encode()))
        if timeout is not None:
            head += ((b"grpc-timeout", timeout),)
        if exact:
            remember(heads, key, head, out, _SANDBOX_HEADS_REMEMBERED)
    return head


def remember(memo: dict[Any, Any], key: Any, entry: Any, headers: Any, most: int) -> None:
    """``memo[key] = entry`` for a head whose ``headers`` (name, value pairs) hold at most HEAD_REMEMBERED_SIZE
    bytes, the memo starting over at ``most`` entries: the one bound of the front's head memos."""
    if sum(len(name) + len(value) for name, value in headers) <= HEAD_REMEMBERED_SIZE:
        if len(memo) >= most:
            memo.clear()
        memo[key] = entry

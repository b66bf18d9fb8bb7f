"""One request/response exchange, and the record reported when it ends."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio

    from gateway.proxy._downstream import DownstreamConnection
    from gateway.proxy._upstream import UpstreamConnection
    from gateway.model import Route
    from gateway.proxy._keys import Keyed
    from routing import Identity

# Exchange.state
PARSED = 0       # head parsed, waiting behind a pipelined request
RESOLVING = 1    # resolving the route / getting an upstream connection
WAITING = 2      # request sent (or being sent), waiting for the response head
BODY = 3         # response head sent to the client, body streaming
TUNNEL = 4       # WebSocket: raw bytes both ways
DONE = 5

# Request body framing (Exchange.body)
NO_BODY = 0
LENGTH = 1
CHUNKED = 2
CODED = 3        # a Transfer-Encoding without chunked last: llhttp answers 400, or a later chunked makes it 501

# How response body bytes go to the client (UpstreamConnection.framing)
F_NONE = 0       # no body (HEAD, 1xx, 204, 304)
F_PASS = 1       # as received: Content-Length or chunked framing kept, bytes written through untouched
F_RECHUNK = 2    # the upstream delimits by closing; the client gets chunks
F_RAW = 3        # the upstream delimits by closing; so does the client (HTTP/1.0)
F_DECHUNK = 4    # the upstream sends chunks; the client (HTTP/1.0) cannot take them: decoded, then closed


class Exchange:
    """Mutable per-request state shared by the client side and the upstream side."""

    __slots__ = (
        "client", "url", "method", "headers", "hsize", "org", "user", "session", "bot", "auth", "host", "xff",
        "request_id", "tokens", "body", "expect", "upgrade", "websocket", "version10", "keep_alive",
        "conn_ka", "req_done", "pending", "early", "reject", "identity", "route", "upstream", "task", "state",
        "status", "started", "close_after", "bytes_in", "bytes_out", "t0", "active_at", "stream",
        "protocol", "error", "retried", "stream_key", "refused", "compat", "timeout", "deadline", "keyed",
        "cookie_tokens", "code", "sent_at", "upstream_time", "trailers", "trace",
    )

    def __init__(self, client: DownstreamConnection) -> None:
        self.client = client
        self.url = b""
        self.method = b""
        self.headers: list[bytes] = []        # groups of (name, b": ", value, CRLF)
        self.hsize = 0                        # head bytes counted (only for reads larger than a head may be)
        self.org: bytes | None = None         # the identity headers, raw
        self.user: bytes | None = None
        self.session: bytes | None = None
        self.bot: bytes | None = None
        self.auth: bytes | None = None        # Authorization, for the authenticator only
        self.host: bytes | None = None        # the inbound Host, forwarded as X-Forwarded-Host
        self.xff: bytes | None = None         # inbound X-Forwarded-For (used when trusted)
        self.request_id: bytes | None = None
        self.tokens: set[bytes] | None = None  # header names listed in Connection
        self.body = NO_BODY
        self.expect = False                   # Expect: 100-continue
        self.upgrade: bytes | None = None     # the Upgrade header
        self.websocket = False
        self.version10 = False
        self.keep_alive = True
        self.conn_ka = False                  # the request said "Connection: keep-alive"
        self.req_done = False
        self.pending: list[bytes] | None = None  # body bytes read before an upstream was attached
        self.early: list[bytes] | None = None    # bytes sent after an upgrade request, before the 101
        self.reject: Exception | None = None     # a problem found while parsing, reported at begin
        self.identity: Identity | None = None
        self.route: Route | None = None
        self.upstream: UpstreamConnection | None = None
        self.task: asyncio.Task[Any] | None = None
        self.state = PARSED
        self.status = 0
        self.started = False                  # response bytes were committed to the client
        self.close_after = False
        self.bytes_in = 0
        self.bytes_out = 0
        self.t0 = 0.0                         # time.perf_counter() at begin
        self.active_at = 0.0
        self.stream = False
        self.protocol = "http"
        self.error: str | None = None
        self.retried = False
        self.stream_key: str | None = None    # the OrgLimits key this exchange holds a stream slot under
        self.refused: str | None = None       # the tenant limit that refused or cut it (RequestLog.refused)
        self.compat: Any = None               # router headers [id, namespace, port], then a compat.Target
        self.timeout = 0.0                    # X-Sandbox-Timeout (seconds; 0: not sent)
        self.deadline = 0.0                   # loop time by which the response head is due (0: none)
        self.keyed: Keyed | None = None       # addressed by host, path or router headers with an access token
        self.cookie_tokens: list[bytes] | None = None  # access-token cookies, cut out of Cookie
        self.code: str | None = None          # the error code of an answer the gateway gave itself
        self.sent_at = 0.0                    # perf_counter() when the head went to the sandbox
        self.trailers: list[bytes] | None = None  # a chunked body's trailer fields, as (name, ": ", value, CRLF)
        self.upstream_time: float | None = None  # from then to the sandbox's response head
        self.trace: Any = None                # a gateway.tracing.RequestTrace when tracing is on


class RequestLog:
    """What ``on_request`` receives for every finished request.

    ``bytes_in`` counts request body bytes, ``bytes_out`` response body bytes as
    forwarded (a chunked body with its chunk framing; raw bytes both ways for a
    WebSocket). ``status`` is what the client got (101 for a WebSocket; 499 when
    it left before any response byte). ``error`` is None, or why the sandbox
    side failed: an UpstreamError code (``upstream_unreachable``,
    ``upstream_timeout``, ``upstream_error``), or ``upstream_closed`` /
    ``upstream_protocol_error`` after the response had started. Problems on the
    client's side show in ``status`` only. ``refused`` names the data plane's own
    tenant limit that refused or cut the request (``org_rate``, ``org_streams``,
    ``max_body``, ``ws_message``), else None.

    For the access log: ``target`` is the request target as received (query
    string included; ``-`` when the request was too malformed to have one, as is
    ``method``), ``session_id`` the caller's session, ``upstream`` the seconds from
    the request head leaving for the sandbox to its response head (None when no
    response head came), ``code`` the error code of an answer the gateway gave
    itself (an error page: ``bad_request``, ``not_found``, ``upstream_timeout``...).
    """

    __slots__ = ("method", "pool", "sandbox_id", "status", "duration", "bytes_in", "bytes_out", "protocol",
                 "request_id", "error", "org_id", "refused", "target", "session_id", "upstream", "code", "trace_id")

    def __init__(self, method: str, pool: str | None, sandbox_id: str | None, status: int, duration: float,
                 bytes_in: int, bytes_out: int, protocol: str, request_id: str, error: str | None,
                 org_id: str | None = None, refused: str | None = None, target: str = "-",
                 session_id: str | None = None, upstream: float | None = None, code: str | None = None,
                 trace_id: str | None = None) -> None:
        self.method = method
        self.pool = pool
        self.sandbox_id = sandbox_id
        self.status = status
        self.duration = duration
        self.bytes_in = bytes_in
        self.bytes_out = bytes_out
        self.protocol = protocol
        self.request_id = request_id
        self.error = error
        self.org_id = org_id  # for per-org metrics (when enabled); None for personal accounts
        self.refused = refused
        self.target = target
        self.session_id = session_id
        self.upstream = upstream
        self.code = code
        self.trace_id = trace_id  # the request's trace (hex) when tracing is on and it was sampled

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"RequestLog({fields})"


def request_log(ex: Exchange, duration: float) -> RequestLog:
    """The record of a finished exchange (``PlaneState.finished``). Filled in field by field rather than
    through ``RequestLog``'s 17 arguments: compiled, a C allocation and C stores, no argument parsing."""
    route = ex.route
    identity = ex.identity
    trace = ex.trace
    request_id = ex.request_id or b""
    record = RequestLog.__new__(RequestLog)
    record.method = ex.method.decode("latin-1") or "-"
    record.target = ex.url.decode("latin-1") or "-"
    record.status = ex.status
    record.duration = duration
    record.bytes_in = ex.bytes_in
    record.bytes_out = ex.bytes_out
    record.protocol = ex.protocol
    record.request_id = request_id.decode("latin-1")
    record.error = ex.error
    record.refused = ex.refused
    record.upstream = ex.upstream_time
    record.code = ex.code
    record.pool = route.pool if route is not None else None
    record.sandbox_id = route.sandbox_id if route is not None else None
    record.org_id = identity.org_id if identity is not None else None
    record.session_id = identity.session_id if identity is not None else None
    record.trace_id = trace.trace_id if trace is not None else None
    return record

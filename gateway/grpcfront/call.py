"""One gRPC call through the front: admit it, open a stream to the sandbox, relay both ways.

Messages are relayed as the bytes of their length-prefixed frames (compression
flag included), taken from one HTTP/2 stream's receive buffer and written to the
other's (``relay``: a received DATA frame's bytes are acknowledged, opening the
sender's window, only when the relay takes them, and ``send_data`` waits for the
peer's window and for the transport's write buffer): so a slow reader on either
side stops the writer on the other, end to end, and what the gateway holds per
call is bounded by the HTTP/2 windows plus one relay piece. A large message is
relayed piece by piece and is never held whole.

Termination is reported through a stream's ``owner``: the call gives each of
its two streams a :class:`_Side`, which records which side
ended (the client reset or left, the sandbox reset or its connection dropped)
and cancels the call's task; the task then settles the other side.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from grpclib.metadata import decode_timeout, encode_grpc_message

from gateway.errors import BadRequest, GatewayError, Unauthorized, UnsupportedMediaType, UpstreamError, error_body
from gateway.grpcfront.frames import CANCEL, ENHANCE_YOUR_CALM, ERROR_NAMES, INADEQUATE_SECURITY, NO_ERROR
from gateway.grpcfront.relay import CHUNK, Truncated, relay, relay_now
from gateway.grpcfront.stream import Stream, StreamClosed
from gateway.grpcfront.upstream import Target, grpc_target
from gateway.proxy._admission import (R_AUTH, R_BOT, R_CL, R_COOKIE, R_EXPECT, R_ORG, R_REQUEST_ID, REQUEST_HEADERS,
                                      SANDBOX_HEADER_PREFIXES, SANDBOX_ID_HEADER, Credentials)
from gateway.proxy._wire import ACCESS_COOKIE, HOST_ACCESS_COOKIE, cut_access_cookie

if TYPE_CHECKING:
    from gateway.grpcfront.connection import Connection
    from gateway.grpcfront.front import GrpcFront, _ServerSide
    from routing import Identity

log = logging.getLogger("gateway.grpc")

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
_CANCELLED = 1
_UNKNOWN = 2
_DEADLINE_EXCEEDED = 4
_PERMISSION_DENIED = 7
_RESOURCE_EXHAUSTED = 8
_INTERNAL = 13
_UNAVAILABLE = 14
# A sandbox's RST_STREAM as the client's gRPC status (gRPC over HTTP/2, "Errors"): CANCEL is passed on as
# CANCEL, REFUSED_STREAM is retried or answered UNAVAILABLE (_ended_early); every other code is INTERNAL.
_RESET_STATUS = {ENHANCE_YOUR_CALM: _RESOURCE_EXHAUSTED, INADEQUATE_SECURITY: _PERMISSION_DENIED}


def _grpc_content_type(value: bytes | None) -> bool:
    """application/grpc, or application/grpc+codec, or with parameters (;): not merely its prefix."""
    return value is not None and (value == b"application/grpc" or value[16:17] in (b"+", b";")
                                  and value.startswith(b"application/grpc"))


class _Side:
    """The owner of one of the call's streams: told when that stream ends early."""

    __slots__ = ("call", "name")

    def __init__(self, call: Call, name: str) -> None:
        self.call = call
        self.name = name

    def stream_ended(self, reset: bool) -> None:
        call = self.call
        if self.name == "sandbox":
            if call.up is not None and call.may_resend(call.up):
                return  # the call sends it again (_response_head): nothing has ended for the client
            call.sandbox_reset = call.sandbox_reset or reset
        call.terminated(self.name)


Headers = list[tuple[bytes, bytes]]
# A request head as read (Call._read_head): forwarded headers, method path, grpc-timeout and seconds, credentials.
_Head = tuple[tuple[tuple[bytes, bytes], ...], str, tuple[bytes, float] | None, Credentials]
_HEADS_REMEMBERED = 16  # distinct request heads per client connection; more and the memo starts over
_HEAD_REMEMBERED_SIZE = 8192  # bytes of names and values: a larger head is read every time (the memo holds 128 KiB)


def _text(value: bytes) -> str:
    """A header value the gateway reads; shown in an error message, so never raises."""
    return value.decode("ascii", "backslashreplace")


def status_of(headers: Headers) -> int | None:
    for name, value in headers:
        if name == b"grpc-status":
            return int(value) if value.isdigit() else _INTERNAL
    return None


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
    if not _grpc_content_type(content_type):  # first: whatever its method, an HTTP request gets HTTP 415
        shown = repr(_text(content_type)) if content_type is not None else None
        raise UnsupportedMediaType(f"content-type must be application/grpc[+codec], got {shown}")
    if method != b"POST":
        raise BadRequest(f":method must be POST for gRPC, got {_text(method) if method else method!r}")
    if path is None or len(path) > 512 or not _METHOD_PATH(path):
        raise BadRequest(f":path must be /package.Service/Method, got {_text(path[:100]) if path else path!r}")
    return path.decode()


def _timeout_seconds(timeout: bytes) -> float:
    """A grpc-timeout value in seconds; BadRequest when it is not one."""
    try:
        if len(timeout) > 9:  # TimeoutValue is at most 8 digits
            raise ValueError(timeout)
        return float(decode_timeout(timeout.decode("ascii")))
    except (ValueError, UnicodeDecodeError):
        raise BadRequest(f"grpc-timeout: {_text(timeout)!r} is not a gRPC timeout (such as 100m or 5S)") from None


class Call:
    __slots__ = ("front", "conn", "down", "headers", "task", "up", "pump", "side",
                 "sandbox_reset", "head_sent", "done", "status", "path", "t0", "route", "deadline", "stream_key",
                 "to_sandbox", "to_client", "org_id", "refused", "running", "identity", "request", "resent",
                 "error", "code", "sent_at", "upstream", "timeout", "trace")

    def __init__(self, front: GrpcFront, conn: _ServerSide, down: Stream) -> None:
        self.front = front
        self.conn = conn
        self.down = down
        self.headers: Headers = down.headers  # type: ignore[assignment]  # a stream is accepted with its head
        self.task: asyncio.Task[None] | None = None
        self.up: Stream | None = None
        self.pump: asyncio.Task[None] | None = None
        self.side: str | None = None        # who ended the call early: "client", "sandbox", "stopping"
        self.sandbox_reset = False          # the sandbox reset its stream (rather than its connection dropping)
        self.head_sent = False
        self.done = False                   # the client has its final status (or is gone)
        self.status = _INTERNAL
        self.path = "-"
        self.t0 = time.perf_counter()
        self.route = None
        self.deadline: float | None = None
        self.timeout: tuple[bytes, float] | None = None  # the client's grpc-timeout, and in seconds
        self.stream_key: str | None = None
        self.to_sandbox = 0
        self.to_client = 0
        self.org_id: str | None = None
        self.refused: str | None = None
        self.identity: Identity | None = None
        self.running = False                # run() has begun (a task cancelled before it starts never runs)
        self.request: bytes | None = None   # the whole request, when it was sent at once (kept to resend)
        self.resent = False
        self.error: str | None = None       # why the sandbox side failed: an UpstreamError code (access log)
        self.code: str | None = None        # the error code of an answer the gateway gave itself
        self.sent_at = 0.0                  # perf_counter() when the head went to the sandbox
        self.upstream: float | None = None  # from then to the sandbox's response head
        self.trace: Any = None              # a gateway.tracing.RequestTrace when tracing is on
        down.owner = _Side(self, "client")

    # -- termination reported by the streams ----------------------------------------
    def terminated(self, side: str) -> None:
        if self.done or self.side is not None:
            return
        if side == "sandbox" and self._sandbox_answered():
            return  # the sandbox reset after its final status: the call is complete as far as it goes
        self.side = side
        if self.running and self.task is not None:
            self.task.cancel()

    def _sandbox_answered(self) -> bool:
        up = self.up
        return up is not None and (up.trailers is not None or (up.headers is not None and
                                                                 status_of(up.headers) is not None))

    # -- the call -----------------------------------------------------------------
    async def run(self) -> None:
        self.running = True
        if self.front.tracer is not None:
            self.trace = self.front.tracer.begin_call(self)  # gateway/tracing.py
        try:
            if self.side is not None:  # ended before it began (the client reset at once, or we are draining)
                self._ended_early()
                return
            out = self._admit_headers()
            if self.deadline is None:
                await self._forward(out)
            else:
                async with asyncio.timeout_at(self.deadline):
                    await self._forward(out)
        except asyncio.CancelledError:
            if self.side is None:
                self.side = "stopping"
            self.task.uncancel()  # type: ignore[union-attr]
            self._ended_early()
        except TimeoutError:
            self._reset_up()
            self.code = "deadline_exceeded"
            self._answer(_DEADLINE_EXCEEDED, "deadline exceeded (grpc-timeout) at the gateway")
        except UnsupportedMediaType as exc:
            self.code = exc.code
            await self._answer_http(exc)
        except GatewayError as exc:
            self._reset_up()
            self.refused = getattr(exc, "scope", None)
            self.code = exc.code
            if isinstance(exc, UpstreamError):
                self.error = exc.code
            self._refuse(exc)
        except Truncated:
            self._reset_up()
            self.error = "upstream_protocol_error"
            self._answer(_INTERNAL, "the sandbox's stream ended in the middle of a message")
        except ConnectionError as exc:
            self._reset_up()
            log.info("gRPC call %s: %s", self.path, exc)
            self.error = "upstream_closed"
            self._answer(_UNAVAILABLE, "the connection to the sandbox failed")
        except Exception:
            log.exception("gRPC call %s failed", self.path)
            self._reset_up()
            self._answer(_INTERNAL, "internal error in the gateway")
        finally:
            self._cleanup()

    def _admit_headers(self) -> Headers:
        """Validate the request head; take the identity metadata out; returns the headers to forward.

        A client sends the same head call after call: what a head of up to 8 KiB reads as is remembered per
        connection (``_ServerSide.heads``, keyed by the head itself), so a repeated one is validated and sorted
        once (reading it cost about 14 us a call on the 2-core VM at load 12). Only the identity is looked up per
        call (the admission's own memo), and the deadline is counted from now; a refused head is never kept."""
        heads = self.conn.heads
        key = tuple(self.headers)
        head = heads.get(key)
        if head is None:
            head = self._read_head()
            if sum(len(name) + len(value) for name, value in key) <= _HEAD_REMEMBERED_SIZE:
                if len(heads) >= _HEADS_REMEMBERED:
                    heads.clear()
                heads[key] = head
        out, self.path, timeout, credentials = head
        if timeout is not None:
            self.deadline = self.down.conn.loop.time() + timeout[1]
            self.timeout = timeout
        self.identity = self.front.admission.identify(self.conn, credentials)
        self.org_id = self.identity.org_id
        return out

    def _read_head(self) -> _Head:
        """What the request head reads as: the headers to forward, the method path, grpc-timeout (as sent and
        in seconds) and the credentials; raises the client's error for a head that is not admissible."""
        method = path = content_type = timeout = None
        credentials: list[bytes | None] = [None, None, None, None, None]  # the order of admission's Credentials
        out: Headers = []
        roles = REQUEST_HEADERS  # the admission's rules, by lower-case name (HTTP/2 names are: headers.py)
        for name, value in self.headers:
            if name.startswith(b":"):
                if name == b":path":
                    path = value
                elif name == b":method":
                    method = value
                continue
            role = roles.get(name)
            if role is None:
                if name == b"grpc-timeout":
                    timeout = value  # re-sent by the gateway (_timeout_left)
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
                raise BadRequest(f"{_text(name)}: a metadata value must be ASCII (binary ones base64, in -bin keys)")
            out.append((name, value))  # rather than killing the sandbox's connection, shared by other calls
        self.path = _checked_path(content_type, method, path)
        timeout_read = (timeout, _timeout_seconds(timeout)) if timeout is not None else None
        if credentials[1] is None and credentials[4] is None:
            raise Unauthorized("no identity: send x-user-id and x-session-id metadata (x-org-id, x-bot-id "
                               "optional), or authorization: Bearer <token> with x-session-id")
        return tuple(out), self.path, timeout_read, tuple(credentials)  # type: ignore[return-value]

    async def _forward(self, out: Sequence[tuple[bytes, bytes]]) -> None:
        front = self.front
        identity = self.identity
        admission = front.admission
        if admission.limited:  # every call is a stream (it holds a slot for as long as it runs)
            self.stream_key = admission.admit(identity, True)  # type: ignore[arg-type]
        if self.trace is None:
            route = self.route = await front.router.resolve(identity)
        else:
            with self.trace.resolving():
                route = self.route = await front.router.resolve(identity)
        front.router.stream_opened(route.sandbox_id)
        host, port = target = grpc_target(route, front.router.view.pool(route.pool))
        connection = await front.channels.connection(target)
        authority = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
        head = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", self.path.encode()),
                (b":authority", authority.encode()), (b"te", b"trailers"), *out,
                (SANDBOX_ID_HEADER, route.sandbox_id.encode())]
        if self.deadline is not None:
            head.append((b"grpc-timeout", self._timeout_left()))
        if self.trace is not None:
            head = self.trace.grpc_head(head, route)  # the sandbox continues the trace (traceparent)
        self.sent_at = time.perf_counter()
        self._alone(connection, self._open_up, connection, head)
        response = await self._response_head(target, head)
        self.upstream = time.perf_counter() - self.sent_at
        down = self.down
        status = self._alone(down.conn, self._answer_now, response, route.sandbox_id)
        if status is None:  # the rest of the answer is still to come (a stream, typically): relayed as it comes
            self.to_client = await relay(self.up, down)  # type: ignore[arg-type]
            status = self._alone(down.conn, self._send_trailers, route.sandbox_id)
        self._settled(status)

    def _open_up(self, connection: Connection, head: Headers) -> None:
        """The sandbox's stream, with the request sent at once where it fits (else by a task of its own)."""
        up = self.up = connection.open_stream(head, _Side(self, "sandbox"))
        if self._request_fits(up):
            self.request = self.down.buffer.peek()  # kept until the sandbox answers: see _response_head
            self._send_request_now(up)  # nothing in it can wait: no task needed (a unary call, typically)
        else:
            self.pump = self.down.conn.loop.create_task(self._send_request(up))

    def _answer_now(self, response: Headers, sandbox_id: str) -> int | None:
        """What of the sandbox's answer (``response`` is its head) can be sent the client now: a trailers-only
        answer, or the head and, when the whole answer is here (a unary one, typically), its message and its
        trailers. Returns the call's gRPC status once the client has all of it, else None."""
        status = status_of(response)
        down = self.down
        if status is not None:  # trailers-only: the whole answer is this one HEADERS frame
            down.send_headers(forwardable(response, head=True), end_stream=True)
            return status
        code = next((value for name, value in response if name == b":status"), b"")
        if code != b"200":
            raise UpstreamError(f"the sandbox answered HTTP {_text(code) or '?'} without a gRPC status",
                                sandbox_id=sandbox_id)
        down.send_headers(forwardable(response, head=True))
        self.head_sent = True
        relayed = relay_now(self.up, down)  # type: ignore[arg-type]
        if relayed is None:
            return None
        self.to_client = relayed
        return self._send_trailers(sandbox_id)

    def _send_trailers(self, sandbox_id: str) -> int:
        trailers = self.up.trailers  # type: ignore[union-attr]
        if trailers is None:
            raise UpstreamError("the sandbox ended its response without a gRPC status", sandbox_id=sandbox_id)
        self.down.send_headers(forwardable(trailers, head=False), end_stream=True)
        return status_of(trailers) or 0

    def _alone(self, conn: Connection, write: Callable[..., Any], *args: Any) -> Any:
        """``write(*args)``; when this is the front's only call, what it writes to ``conn`` goes out at once, in one
        ``send()`` (``Connection.hold``, ``flush``): nothing else this loop step does could join it, and no flush
        is left queued to cost the loop a turn. With other calls running, a step's writes go out together at its
        end (flushing per call split those batches: 1.1-1.5 sends per call instead of 0.3-0.7 at 10 and 50)."""
        if len(self.front.calls) != 1:
            return write(*args)
        conn.hold()
        try:
            return write(*args)
        finally:
            conn.flush()

    def _timeout_left(self) -> bytes:
        """grpc-timeout for the sandbox: the client's own value while the gateway has spent under a
        millisecond of it (as is usual: passed on exactly, not re-rounded), else the time left."""
        value, seconds = self.timeout  # type: ignore[misc]
        left = self.deadline - self.down.conn.loop.time()  # type: ignore[operator]
        if seconds - left < 0.001:
            return value
        return encode_timeout_ms(left).encode()

    async def _response_head(self, target: Target, head: Headers) -> Headers:
        """The sandbox's response head. A request it ended unprocessed (REFUSED_STREAM, or a GOAWAY below
        the stream: it is restarting or shedding load) is sent once more, on a connection that takes it,
        when the gateway has the whole of it (RFC 9113 8.7); the client never learns of the first try."""
        up: Stream = self.up  # type: ignore[assignment]
        try:
            response = await up.recv_headers()
        except StreamClosed:
            if not self.may_resend(up):
                raise
            self.resent = True
            up.release()
            connection = await self.front.channels.connection(target)
            up = self.up = connection.open_stream(head, _Side(self, "sandbox"))
            await up.send_data(self.request, end_stream=True)  # type: ignore[arg-type]
            response = await up.recv_headers()
        self.request = None  # answered: processed, never to be sent again
        return response

    def may_resend(self, up: Stream) -> bool:
        """``up`` was refused unprocessed, and its request can be sent again (whole, and not sent twice)."""
        return up.refused and self.request is not None and not self.resent and self.side is None

    def _request_fits(self, up: Stream) -> bool:
        """The client's whole request is here and the sandbox's stream takes it now (``relay_now``).

        Then relaying it cannot wait (not for the client, not for a window, not for the transport), so
        it is sent before the response is awaited, without a task of its own; otherwise a task sends it
        while the response is relayed (a sandbox may answer before it has read the request).
        """
        buffer = self.down.buffer
        return buffer.complete and buffer.size <= CHUNK and up.takes_now(buffer.size)

    def _send_request_now(self, up: Stream) -> None:
        try:
            self.to_sandbox = relay_now(self.down, up, end_stream=True)  # type: ignore[assignment]  # it fits
        except Truncated:
            self.terminated("client")

    async def _send_request(self, up: Stream) -> None:
        try:
            self.to_sandbox = await relay(self.down, up, end_stream=True)
        except asyncio.CancelledError:
            raise
        except ConnectionError:
            pass  # the sandbox's stream is closed already: it answered, or it is gone (the response side says which)
        except Truncated:
            self.terminated("client")

    def _settled(self, status: int) -> None:
        """The client has its final status. A client still sending is told to stop (RST_STREAM NO_ERROR)."""
        self.status = status
        self.done = True
        pump = self.pump
        if pump is not None and not pump.done():
            pump.cancel()
            if self.down.closable:
                self.down.reset(NO_ERROR)

    # -- endings --------------------------------------------------------------------
    def _ended_early(self) -> None:
        side = self.side
        if side == "client":
            self.status = _CANCELLED
            self.done = True
            self._reset_up()
        elif side == "sandbox" and self.up is not None and self.up.refused:
            self._answer(_UNAVAILABLE, "the sandbox refused the call unprocessed (restarting or overloaded); retry")
        elif side == "sandbox" and self.sandbox_reset:
            code = self.up.reset_code if self.up is not None else None
            self.error = "upstream_reset"
            if code == CANCEL:  # the sandbox cancelled the call: so does the client
                self.status = _CANCELLED
                self.done = True
                if self.down.closable:
                    self.down.reset(CANCEL)
                return
            name = ERROR_NAMES.get(code, hex(code)) if code is not None else "?"
            status = _RESET_STATUS.get(code, _INTERNAL) if code is not None else _INTERNAL
            self._answer(status, f"the sandbox reset the call ({name})")
        elif side == "sandbox":
            self.error = "upstream_closed"
            self._answer(_UNAVAILABLE, "the connection to the sandbox was lost")
        else:
            self._reset_up()
            self._answer(_UNAVAILABLE, "the gateway is shutting down; retry")

    def _refuse(self, exc: GatewayError) -> None:
        extra: list[tuple[str, str]] = []
        if exc.retry_after is not None:
            seconds = max(1, round(exc.retry_after))
            extra = [("retry-after", str(seconds)), ("grpc-retry-pushback-ms", str(seconds * 1000))]
        if exc.sandbox_id:
            extra.append((SANDBOX_ID_HEADER.decode(), exc.sandbox_id))
        self._answer(int(exc.grpc_status.value), f"{exc.code}: {exc.message}", extra)

    async def _answer_http(self, exc: GatewayError) -> None:
        """Not a gRPC request: answered in plain HTTP (415 for a content-type that is not gRPC's, as gRPC over
        HTTP/2 says), so that an HTTP client does not take a 200 for success; the body is the JSON error."""
        self.status = _UNKNOWN  # what a gRPC client makes of an HTTP status it has no mapping for
        down = self.down
        try:
            # The request is read to its end first (dropped; within a second and 1 MiB): a malformation
            # further on (a content-length its DATA does not match) is then still answered as one.
            async with asyncio.timeout(1.0):
                taken = 0
                while taken < 1 << 20 and (data := await down.buffer.take()):
                    taken += len(data)
        except TimeoutError:
            pass
        except asyncio.CancelledError:  # the client reset the stream (or broke it) meanwhile: nothing to answer
            self.task.uncancel()  # type: ignore[union-attr]
            self.status = _CANCELLED
            return
        if self.done or not down.closable:
            return
        self.done = True
        down.send_headers([(":status", str(exc.status)), ("content-type", "application/json")], end_stream=False)
        try:
            await down.send_data(error_body(exc), end_stream=True)
        except ConnectionError:
            pass  # reset meanwhile

    def _answer(self, status: int, message: str, extra: list[tuple[str, str]] | None = None) -> None:
        """The call's final status from the gateway itself: trailers, or a trailers-only response."""
        self.status = status
        if self.done:
            return
        self.done = True
        down = self.down
        if not down.closable:
            return
        head = [] if self.head_sent else [(":status", "200"), ("content-type", "application/grpc")]
        head += [("grpc-status", str(status)), ("grpc-message", encode_grpc_message(message))]
        if extra:
            head += extra
        down.send_headers(head, end_stream=True)  # a client still sending is told to stop when it is released

    def _reset_up(self) -> None:
        """Close our end of the sandbox's stream: CANCEL unless the sandbox has answered (then NO_ERROR)."""
        up = self.up
        if up is not None and not up.gone and not (up.local_closed and up.remote_closed):
            up.reset(NO_ERROR if self._sandbox_answered() else CANCEL)

    def _cleanup(self) -> None:
        pump = self.pump
        if pump is not None and not pump.done():
            pump.cancel()
        self._reset_up()
        if self.up is not None:
            self.up.release()
        self.down.release()
        front = self.front
        if self.stream_key is not None:
            front.admission.stream_closed(self.stream_key)
        if self.route is not None:
            front.router.stream_closed(self.route.sandbox_id)
        if self.trace is not None:
            self.trace.finish(self.route, self.identity, ("rpc.grpc.status_code", self.status),
                              self.refused or self.code or self.error, self.upstream, self.status not in (0, 1, 3, 5))
        front.finished(self)
        # Break the call <-> stream cycles (Call -> Stream -> _Side -> Call): the call, its streams and
        # their buffers and headers are then freed as the call ends, by reference counting, rather
        # than left to the cyclic GC, whose collections cost the gateway about a tenth of its time.
        self.down.owner = None
        if self.up is not None:
            self.up.owner = None

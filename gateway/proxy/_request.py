"""Reading requests off a downstream connection: the httptools callbacks.

As the parser reports them, headers are classified one by one through the
tables in ``_wire`` (identity headers and credentials taken out, hop-by-hop
headers dropped, everything else kept as raw byte groups), the head size is
bounded, and a complete head becomes the current request (``begin``) or waits
behind the one in flight. Body bytes go to the attached upstream connection, or
are held until one is attached. A head that does not arrive in one read is bounded
here in bytes across reads and in time (``header_read_timeout``; a slow one is held
between the data plane's ticks): ``RequestReader``'s second part.

:class:`RequestReader` is a base of :class:`~gateway.proxy._downstream.DownstreamConnection`
(httptools calls back into the protocol object itself), kept apart so that the
connection module reads as serving and this one as parsing.
"""

from __future__ import annotations

import re
from collections import deque

import logging

from httptools import HttpParserCallbackError, HttpParserError

from gateway.errors import BadRequest, GatewayError, NotImplementedByGateway, PayloadTooLarge
from gateway.proxy._admission import header_role
from gateway.proxy._exchange import CHUNKED, CODED, DONE, LENGTH, Exchange
from gateway.proxy._keys import KeyedRequests
from gateway.proxy._state import (
    M_CLOSING, M_DISCARD, M_IN_HEAD, M_TUNNEL, M_UPGRADED, PAUSE_PIPELINE, PAUSE_SLOW_HEAD, PAUSE_WAIT, SLOW_HEAD_AFTER,
)
from gateway.proxy._wire import (
    ACCESS_COOKIE, COLON, CRLF, FRAMING_HEADERS, H2_PREFACE, IDENTITY_HEADER_NAMES, R_AUTH, R_BOT, R_CL, R_CONNECTION, R_COOKIE,
    R_DROP, R_EXPECT, R_HOST, R_ORG, R_REQUEST_ID, R_SANDBOX_ID, R_SESSION, R_TE, R_TIMEOUT, R_UPGRADE, R_USER, R_XFF,
    REQUEST_HEADERS, REQUEST_HEADERS_EXACT, SANDBOX_HEADER_PREFIXES, connection_tokens, cut_access_cookie, last_chunk,
    h2_refusal, plain_request, sane_request_id, without_headers,
)

log = logging.getLogger("gateway.proxy")

_INF = float("inf")


class _HeadTooLarge(Exception):
    pass


class _BodyTooLarge(Exception):
    pass


class _StopParsing(Exception):
    pass


_ABSOLUTE_FORM = re.compile(rb"https?://([^/?#@]*)(.*)", re.I | re.S)


def _other_target_form(ex: Exchange) -> None:
    """An absolute-form target (``GET http://host/x``, as sent to a proxy) goes upstream in origin-form
    (``/x``), and its authority replaces Host (RFC 9112 3.2.2). ``*`` (OPTIONS) passes as it is;
    CONNECT's authority-form is refused in on_headers_complete."""
    url = ex.url
    if url == b"*" or ex.method == b"CONNECT":
        return
    match = _ABSOLUTE_FORM.fullmatch(url)
    rest = match.group(2) if match is not None else b""
    if match is None or not match.group(1) or (rest and rest[0] not in b"/?"):
        ex.reject = BadRequest("the request target must be a path (/...) or an absolute http(s) URL without "
                               "user information", code="bad_request")
        return
    ex.url = rest if rest[:1] == b"/" else b"/" + rest
    ex.host = match.group(1)


def _no_host(ex: Exchange) -> None:
    ex.reject = BadRequest("Host: an HTTP/1.1 request must carry one (RFC 9112)", code="invalid_host")


def _trailer(ex: Exchange, name: bytes, value: bytes) -> None:
    """A trailer field of a chunked request body (llhttp reports them as headers after the head).
    Forwarded with the body's last chunk, except what the gateway reads or sets itself (identity,
    credentials, Host, framing, hop-by-hop, X-Forwarded-*, X-Sandbox-*): those are never taken from a
    trailer, which arrives after admission and, before this, could land in the forwarded head."""
    low = name.lower()
    if REQUEST_HEADERS.get(low, 0) or low.startswith(SANDBOX_HEADER_PREFIXES) or low in FRAMING_HEADERS:
        return
    if ex.trailers is None:
        ex.trailers = []
    ex.trailers += (name, COLON, value, CRLF)


def _transfer_encoding(ex: Exchange, codings: bytes) -> None:
    """A (lower-cased) Transfer-Encoding: chunked last is re-framed; any other coding is refused."""
    if b"chunked" in codings and codings.rsplit(b",", 1)[-1].strip() == b"chunked":
        if ex.body == CODED or codings.strip() != b"chunked":
            # gzip, chunked: the gateway would have to drop the gzip coding (it re-frames the body)
            # or pass a coding sandboxes do not decode; nginx answers 501 as well.
            ex.reject = NotImplementedByGateway(
                "Transfer-Encoding: only chunked is supported; send a compressed body with "
                "Content-Encoding instead", code="unsupported_transfer_encoding")
        ex.body = CHUNKED
    elif ex.body == CHUNKED:
        ex.reject = BadRequest("Transfer-Encoding: chunked must be the last coding (RFC 9112)")
    else:
        ex.body = CODED


_WS_EXTENSIONS = frozenset({b"sec-websocket-extensions"})  # declined while a message size limit is set


class RequestReader(KeyedRequests):
    """The httptools request callbacks; the state they use is :class:`~gateway.proxy._state.ClientState`."""

    __slots__ = ()

    def begin(self, ex: Exchange, batch: bool = False) -> None:
        """Serve ``ex``: :meth:`DownstreamConnection.begin <gateway.proxy._downstream.DownstreamConnection.begin>`
        (declared here so that on_headers_complete calls it as a C method in the compiled build)."""
        raise NotImplementedError

    def on_message_begin(self) -> None:
        if self.mode & M_DISCARD:
            raise _StopParsing  # a request was refused mid-body: nothing after it is served
        self.parsing = self.last = Exchange(self)
        self.mode |= M_IN_HEAD
        self.head_seen = 0
        self.head_raw = None

    def on_url(self, url: bytes) -> None:
        ex = self.parsing
        ex.url += url  # type: ignore[union-attr]
        if self.big:
            self._count(len(url))

    def _count(self, size: int) -> None:
        ex = self.parsing
        ex.hsize += size  # type: ignore[union-attr]
        if ex.hsize > self.plane.max_head:  # type: ignore[union-attr]
            raise _HeadTooLarge

    def on_header(self, name: bytes, value: bytes) -> None:
        """One request header, by what it means to the gateway (the admission's table, _admission.py):
        most are forwarded as they came; the others go to the method for their kind."""
        ex = self.parsing
        assert ex is not None
        if self.big:
            self._count(len(name) + len(value) + 4)
        if not self.mode & M_IN_HEAD:
            _trailer(ex, name, value)
            return
        code = REQUEST_HEADERS_EXACT.get(name, -1)  # compiled: a C dict lookup, and code a C int (_request.pxd)
        if code < 0:
            code = header_role(name.lower())  # an unusual spelling; every other X-Sandbox-* is R_DROP
        if not code:
            ex.headers += (name, COLON, value, CRLF)
        elif code == R_DROP:
            return  # hop-by-hop, or what only the gateway may set: never forwarded
        elif code <= R_BOT or code == R_AUTH:
            self.credential_header(ex, code, value)
        elif code == R_CL or code == R_TE or code == R_EXPECT:
            self.framing_header(ex, code, name, value)
        elif code == R_CONNECTION or code == R_UPGRADE:
            self.hop_by_hop_header(ex, code, value)
        elif code == R_HOST or code == R_XFF or code == R_REQUEST_ID:
            self.forwarding_header(ex, code, value)
        else:
            self.keys_header(ex, code, name, value)

    def credential_header(self, ex: Exchange, code: int, value: bytes) -> None:
        """X-Org-Id, X-User-Id, X-Session-Id, X-Bot-Id and Authorization: read by the authenticator,
        never forwarded, each given once (which one would count? the last used to, silently)."""
        if code == R_USER:
            previous, ex.user = ex.user, value
        elif code == R_SESSION:
            previous, ex.session = ex.session, value
        elif code == R_ORG:
            previous, ex.org = ex.org, value
        elif code == R_BOT:
            previous, ex.bot = ex.bot, value
        else:
            if ex.auth is not None:
                ex.reject = BadRequest("Authorization: must be given once", code="invalid_authorization")
            ex.auth = value
            return
        if previous is not None:
            ex.reject = BadRequest(f"{IDENTITY_HEADER_NAMES[code]}: must be given once", code="invalid_identity")

    def framing_header(self, ex: Exchange, code: int, name: bytes, value: bytes) -> None:
        """Content-Length (forwarded; max_body_bytes checked against it), Transfer-Encoding (the body is
        re-framed: only chunked, last) and Expect (100-continue is answered by the gateway)."""
        if code == R_CL:
            if value != b"0":
                ex.body = LENGTH
                limit = self.plane.max_body
                if limit is not None and value.isdigit() and int(value) > limit:
                    ex.refused = "max_body"
                    ex.reject = PayloadTooLarge(f"the request body ({int(value)} bytes) exceeds max_body_bytes ({limit})")
            ex.headers += (name, COLON, value, CRLF)
        elif code == R_TE:
            _transfer_encoding(ex, value.lower())
        elif value.lower() == b"100-continue":  # R_EXPECT
            ex.expect = True
        else:
            ex.headers += (name, COLON, value, CRLF)

    def hop_by_hop_header(self, ex: Exchange, code: int, value: bytes) -> None:
        """Connection (it may name more hop-by-hop headers, dropped at the end of the head) and Upgrade
        (kept for a WebSocket upgrade only)."""
        if code == R_UPGRADE:
            ex.upgrade = value
            return
        value = value.lower()
        if b"keep-alive" in value:
            ex.conn_ka = True
        tokens = connection_tokens(value)
        if tokens:
            ex.tokens = tokens if ex.tokens is None else ex.tokens | tokens

    def forwarding_header(self, ex: Exchange, code: int, value: bytes) -> None:
        """Host (becomes X-Forwarded-Host), X-Forwarded-For (appended to when trusted) and X-Request-Id
        (taken when it is a sane token): the gateway sets each itself towards the sandbox."""
        if code == R_HOST:
            if ex.host is not None:
                ex.reject = BadRequest("Host: must be given once (RFC 9112)", code="invalid_host")
            ex.host = value
        elif code == R_XFF:
            ex.xff = value if ex.xff is None else ex.xff + b", " + value
        elif sane_request_id(value):  # R_REQUEST_ID
            ex.request_id = value

    def keys_header(self, ex: Exchange, code: int, name: bytes, value: bytes) -> None:
        """What addresses a sandbox or bounds the wait for it: the agent-sandbox router's X-Sandbox-Id,
        -Namespace and -Port, X-Sandbox-Timeout, and Cookie (forwarded without the access-token cookie)."""
        if code == R_COOKIE:
            if ACCESS_COOKIE in value:  # the access token stays with the gateway
                value, tokens = cut_access_cookie(value)
                ex.cookie_tokens = tokens if ex.cookie_tokens is None else ex.cookie_tokens + tokens
                if not value:
                    return
            ex.headers += (name, COLON, value, CRLF)
        elif code == R_TIMEOUT:
            self._client_timeout(ex, value)
        else:  # R_SANDBOX_ID, R_SANDBOX_NS, R_SANDBOX_PORT, in Exchange.compat's order
            if ex.compat is None:
                ex.compat = [None, None, None]
            ex.compat[code - R_SANDBOX_ID] = value

    @staticmethod
    def _client_timeout(ex: Exchange, value: bytes) -> None:
        """X-Sandbox-Timeout: seconds the client will wait for the response head (the pool's
        request_timeout still caps it, in ``attach``)."""
        try:
            seconds = float(value)
        except ValueError:
            seconds = 0.0
        if ex.timeout or not 0.0 < seconds < _INF:  # also refuses nan
            ex.reject = BadRequest("X-Sandbox-Timeout: must be given once, as a positive number of seconds "
                                   "(such as 130)", code="invalid_timeout")
        ex.timeout = seconds

    def on_headers_complete(self) -> None:
        ex = self.parsing
        assert ex is not None
        parser = self.parser
        self.mode &= ~M_IN_HEAD
        ex.method = parser.get_method()
        if ex.host is None and ex.reject is None and parser.get_http_version() not in ("1.0", "0.9"):
            _no_host(ex)
        if ex.url[0] != 47:  # not origin-form ("/...")
            _other_target_form(ex)
        if not parser.should_keep_alive():
            ex.keep_alive = False
            ex.version10 = parser.get_http_version() == "1.0"
        elif ex.conn_ka:
            # Keep-alive and a "Connection: keep-alive": could be HTTP/1.0, which cannot take chunks.
            ex.version10 = parser.get_http_version() == "1.0"
        if parser.should_upgrade():
            ex.keep_alive = False  # the parser is done with this connection either way
            if ex.method == b"CONNECT":
                ex.reject = BadRequest("CONNECT is not supported by the data plane", code="method_not_supported")
            elif ex.upgrade is not None and ex.upgrade.strip().lower() == b"websocket":
                ex.websocket = True
                if self.plane.ws_max_message is not None:  # type: ignore[union-attr]
                    # ws_max_message_bytes bounds what the sandbox receives, and a compressed frame's
                    # header tells only its wire size: no extension is offered, so none is negotiated
                    # (and MessageSizeGuard refuses a frame that claims one with 1002).
                    ex.tokens = _WS_EXTENSIONS if ex.tokens is None else ex.tokens | _WS_EXTENSIONS
        if ex.tokens:
            ex.headers = without_headers(ex.headers, ex.tokens)
        self.head_read(ex)

    def head_read(self, ex: Exchange) -> None:
        """A whole head read: ``ex`` is served now, or queued behind the request in flight."""
        if self.current is None and not self.mode & M_CLOSING:
            self.current = ex
            self.begin(ex, True)
        else:
            if self.queue is None:
                self.queue = deque()
            self.queue.append(ex)
            self.pause(PAUSE_PIPELINE)

    def read_plain(self, data: bytes) -> bool:
        """The compiled build's way to read a read that is one plain request head (``_wire.plain_request``):
        the callbacks llhttp would make, in its order, without llhttp (which stays at the start of a message,
        as it would be after reading it); False, with nothing done, for any other read. Only between
        messages on a keep-alive connection (after a ``Connection: close`` or an upgrade llhttp refuses more)."""
        last = self.last
        if self.parsing is not None or (last is not None and not last.keep_alive):
            return False
        parts = plain_request(data)
        if parts is None:
            return False
        try:  # what llhttp's HttpParserCallbackError is to feed_data: the caller catches only the parser's errors
            self.on_message_begin()
            ex = self.parsing
            ex.url = parts[1]
            for i in range(2, len(parts), 2):
                self.on_header(parts[i], parts[i + 1])
            self.mode &= ~M_IN_HEAD
            ex.method = parts[0]
            if ex.host is None and ex.reject is None:  # HTTP/1.1, origin-form, keep-alive, no Connection/Upgrade
                _no_host(ex)
            self.head_read(ex)
            self.on_message_complete()
        except Exception as exc:
            self.up_out.clear()
            self.callback_failed(exc)
        return True

    def on_body(self, chunk: bytes) -> None:
        ex = self.parsing
        assert ex is not None
        ex.bytes_in += len(chunk)
        if ex.bytes_in > self.plane.body_cap:  # only a chunked body gets here: a declared length was checked
            raise _BodyTooLarge
        if ex.upstream is not None:
            ex.active_at = self.plane.now
            if ex.body == CHUNKED:
                self.up_out += (b"%x\r\n" % len(chunk), chunk, CRLF)
            else:
                self.up_out.append(chunk)
        elif ex.state != DONE:
            if ex.pending is None:
                ex.pending = [chunk]
            else:
                ex.pending.append(chunk)

    def on_message_complete(self) -> None:
        ex = self.parsing
        assert ex is not None
        self.parsing = None
        ex.req_done = True
        if ex.upstream is not None and ex.body == CHUNKED:
            self.up_out.append(last_chunk(ex.trailers))

    # -- the slow path of a read; a head over several reads: its bytes, its time --------------------------------------------
    def _head_pending(self, data: bytes) -> None:
        """A head is still incomplete after this read: count it from its first read; a slow one (a
        slowloris) is paused until the tick wakes it (DataPlane.wake_slow_heads)."""
        if not self.head_seen:
            self._head_begun(data)
        elif self.slow_head():
            self.hold_slow_head()

    def _unparsable(self, exc: HttpParserError, data: bytes) -> None:
        """The parser stopped in ``data``: a bound our callbacks enforce, or a malformed request."""
        if isinstance(exc, HttpParserCallbackError):
            reason = exc.__context__
            if isinstance(reason, _HeadTooLarge):
                self._head_too_large(data)
            elif isinstance(reason, _BodyTooLarge):
                self._body_too_large()
            else:
                self.callback_failed(reason or exc)
        elif data.startswith(H2_PREFACE):  # llhttp stops on it ("Pause on PRI/Upgrade"): say where h2 goes
            self._malformed(h2_refusal(self.plane.options.grpc_port), h2=True)
        else:
            self._malformed(BadRequest(f"malformed HTTP request: {exc}", code="bad_request"))

    def callback_failed(self, exc: BaseException) -> None:
        """One of our callbacks raised while a read was parsed: logged, and the connection answered 500-like."""
        log.error("proxy callback failed", exc_info=exc)
        self._malformed(GatewayError("internal error while reading the request"))

    def _head_begun(self, data: bytes) -> None:
        """A head began in this read and is not complete. The callbacks only see whole headers, so
        one split across reads is never counted by them: count this whole read towards the head
        instead (an upper bound) and every later read in _special. Its time starts now: the data
        plane's wheel looks at it again when it would be a slow head (DataPlane._next_check)."""
        plane = self.plane
        self.head_seen = len(data)
        self.head_at = plane.now
        plane.watch(self, plane.now + SLOW_HEAD_AFTER)
        if len(data) > plane.max_head:
            self._head_too_large(data)
        elif plane.keyed:
            self.head_raw = [data]

    def _special(self, data: bytes) -> bool:
        """The slow path of data_received; True when ``data`` should still be parsed."""
        mode = self.mode
        if mode & M_TUNNEL:
            ex = self.current
            up = self.up_conn
            if ex is not None and up is not None and not up.closed:
                guard = self.ws_guard
                if guard is not None and guard.feed(data) is not None:
                    self._ws_refused(ex, guard.verdict)  # type: ignore[arg-type]
                    return False
                ex.bytes_in += len(data)
                ex.active_at = self.plane.now
                try:
                    up.transport.write(data)
                except RuntimeError:  # uvloop: the upstream's transport closed; its connection_lost settles it
                    pass
            return False
        if mode & (M_CLOSING | M_DISCARD):
            if self.cookie_scan is not None:
                self.cookie_bomb_read(data)
            return False
        if mode & M_UPGRADED:
            ex = self.last
            if ex is not None and ex.state != DONE:
                if ex.early is None:
                    ex.early = [data]
                else:
                    ex.early.append(data)
            self.pause(PAUSE_WAIT)
            return False
        # M_IN_HEAD: a head spread over several reads; bound its size.
        self.head_seen += len(data)
        if self.head_seen > self.plane.max_head:
            self._head_too_large(data)
            return False
        if self.head_raw is not None:
            self.head_raw.append(data)
        return True

    def head_overdue(self, now: float, timeout: float) -> bool:
        """Called by the tick while a request head is awaited: True when it dawdled past ``timeout``
        (slowloris), counted from the connection's start or its last response, or from the head's first
        read when that came later. The connection is then marked closing; the tick closes it (in slices,
        one log line)."""
        if now - self.head_began() > timeout and not self.mode & M_CLOSING:
            self.mode |= M_CLOSING
            self.plane.gate.release(self.peer, self)  # its slot is free now, not when its slice closes it
            return True
        return False

    def head_began(self) -> float:
        """When the awaited head's time began: the connection's start or its last response, or the head's
        first read when that came later (the one rule for header_read_timeout, here and in the wheel)."""
        return self.idle_since if self.parsing is None else max(self.idle_since, self.head_at)

    def slow_head(self) -> bool:
        """A head begun more than SLOW_HEAD_AFTER ago, still incomplete, not yet held."""
        return (self.mode & (M_IN_HEAD | M_CLOSING) == M_IN_HEAD and not self.rpause & PAUSE_SLOW_HEAD
                and self.plane.now - self.head_at > SLOW_HEAD_AFTER)

    def hold_slow_head(self) -> None:
        """Stop reading a slow head until a tick finds bytes waiting on it (gateway/proxy/_ready.py) and wakes
        it: a slowloris's thousands of connections, each sending a line at the same moment, are then read a
        slice per loop turn, not all in one."""
        plane = self.plane
        if plane.ready_heads.watch(self):  # else nothing would wake it: read as it comes
            self.pause(PAUSE_SLOW_HEAD)
            plane.slow_heads[self] = None



__all__ = ["RequestReader"]

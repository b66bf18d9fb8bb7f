"""How a client connection's request ends when it does not end well: the answers the gateway gives
itself (a 504 naming the limit that fired, 408, 413/414/431, 400 for bytes that are not HTTP) and the
ways a stream is ended (WebSocket close frames, 1001 at shutdown).

A base of :class:`~gateway.proxy._downstream.DownstreamConnection`, as ``RequestReader`` and
``KeyedRequests`` are: none of this is on the common path, so it lives apart from the code that is.
"""

from __future__ import annotations

import logging
from time import perf_counter
from typing import TYPE_CHECKING

from gateway.errors import (
    GatewayError, HeaderTooLarge, PayloadTooLarge, RequestTimeout, UpstreamTimeout, UriTooLong, error_body,
)
from gateway.proxy import _wire as w
from gateway.proxy._browser import CookieNames
from gateway.proxy._exchange import DONE, RESOLVING, TUNNEL, Exchange
from gateway.proxy._state import M_DISCARD, PAUSE_DISCARD, ClientState
from gateway.proxy._wsframe import CLOSE_GOING_AWAY, CLOSE_MESSAGE_TOO_BIG, close_frame

log = logging.getLogger("gateway.proxy")


class Refusals(ClientState):
    """The gateway's own answers and stream endings, for :class:`DownstreamConnection`."""

    __slots__ = ()

    if TYPE_CHECKING:
        def fail(self, ex: Exchange, exc: GatewayError) -> None: ...
        def abort(self, ex: Exchange, reason: str | None, detail: str) -> None: ...
        def finish(self, ex: Exchange, close: bool) -> None: ...
        def pause(self, bit: int) -> None: ...
        def close(self) -> None: ...
        def linger(self) -> None: ...
        def _send(self, data: bytes) -> None: ...

    def _ws_refused(self, ex: Exchange, code: int) -> None:
        """The client sent a WebSocket message over ws_max_message_bytes (1009) or broke the framing
        (1002): it gets a close frame with that code; the sandbox's connection is dropped (it sees
        an abnormal closure, 1006), since the offending frame may already be partly on its way."""
        reason = "message too big" if code == CLOSE_MESSAGE_TOO_BIG else "protocol error"
        log.info("closing WebSocket %s to sandbox %s: %s", (ex.request_id or b"").decode(),
                 ex.route.sandbox_id if ex.route else None, reason)
        ex.refused = "ws_message"
        up = ex.upstream
        if up is not None:
            up.abort()
        self._send(close_frame(code, reason, masked=False))
        self.finish(ex, True)

    def end_streams(self) -> None:
        """Shutdown began: a WebSocket whose sandbox-side bytes end between frames gets close 1001 now; one
        mid-frame gets it once that frame is through (UpstreamConnection). Event streams end at their next
        event boundary (UpstreamConnection._end_stream_at_event). What is left is cut at drain_timeout."""
        ex = self.current
        if ex is not None and ex.state == TUNNEL and ex.upstream is not None and ex.upstream.at_frame_boundary():
            self.going_away(ex)

    def going_away(self, ex: Exchange) -> None:
        """Close 1001 Going Away to the client; the sandbox's connection is dropped (it sees 1006), since
        a frame from the client may be partly on its way to it."""
        up = ex.upstream
        if up is not None:
            up.abort()
        self._send(close_frame(CLOSE_GOING_AWAY, "gateway shutting down", masked=False))
        self.finish(ex, True)

    def timed_out(self, ex: Exchange, deadline: bool) -> None:
        """No response head in time: ``deadline`` (X-Sandbox-Timeout or the pool's request_timeout,
        whichever is shorter), else upstream_read_timeout. The 504 names the one that fired."""
        route = ex.route
        sandbox_id = route.sandbox_id if route else None
        if not deadline:
            why = (f"for {self.plane.options.upstream_read_timeout:g}s after the request (upstream_read_timeout); "
                   "raise or unset upstream_read_timeout (SANDBOX_GATEWAY_UPSTREAM_READ_TIMEOUT) to wait longer")
        else:
            pool = route.pool if route else ""
            pool_limit = self.plane.request_timeouts.get(pool)
            if ex.timeout and (pool_limit is None or ex.timeout <= pool_limit):
                most = f" (pool {pool} allows up to {pool_limit:g}s)" if pool_limit is not None else ""
                why = (f"within {ex.timeout:g}s, the X-Sandbox-Timeout this request sent; send a larger "
                       f"X-Sandbox-Timeout to wait longer{most}")
            else:  # (pool_limit is None only if a policy reload removed it meanwhile)
                within = f"{pool_limit:g}s" if pool_limit is not None else "the time"
                why = (f"within {within}, pool {pool}'s request_timeout; raise pools.{pool}.request_timeout "
                       "in the policy to wait longer")
        self.fail(ex, UpstreamTimeout(f"sandbox {sandbox_id} sent no response {why}", sandbox_id=sandbox_id))

    def body_stalled(self, ex: Exchange) -> None:
        """The client stopped sending its request body: its fault, not the sandbox's (408, not 504)."""
        self.fail(ex, RequestTimeout(
            f"the request body stopped arriving: no bytes for {self.plane.options.stream_idle_timeout:g}s "
            "(stream_idle_timeout); send the rest of the body, or Content-Length: 0 when there is none"))

    def idled_out(self, ex: Exchange) -> None:
        self.abort(ex, None, f"no bytes either way for {self.plane.options.stream_idle_timeout:g}s")

    def _body_too_large(self) -> None:
        """A chunked request body passed max_body_bytes: 413 if the response has not started (the
        sandbox's connection is dropped mid-body either way); nothing more is read."""
        ex = self.parsing
        assert ex is not None
        self.parsing = None
        self.mode |= M_DISCARD
        if ex.state == DONE:
            return  # already answered (a declared length over the cap, say); the rest is dropped
        exc = PayloadTooLarge(f"the request body exceeds max_body_bytes ({self.plane.max_body})")
        ex.refused = "max_body"
        if ex is self.current:
            self.fail(ex, exc)
        else:
            ex.reject = exc  # pipelined behind the current request: answered in turn, then closed
            self.pause(PAUSE_DISCARD)

    def _head_too_large(self, data: bytes) -> None:
        """A request head over max_header_bytes: 414 when its target is the bulk of it, else 431. With
        preview keys on, a head that is large for its cookies (a sibling sandbox's cookie bomb on the
        preview domain) is answered with Set-Cookie lines that expire them (gateway.proxy._browser), so
        it costs the user one request. ``data`` is the read that passed the limit."""
        limit = self.plane.max_head
        ex = self.parsing
        if ex is not None and len(ex.url) * 2 > limit:
            exc: GatewayError = UriTooLong(
                f"the request target makes the request head exceed {limit} bytes (max_header_bytes); "
                "send long data in the request body")
        else:
            exc = HeaderTooLarge(f"the request head exceeds {limit} bytes (max_header_bytes)")
            if self.plane.keyed:
                self._cookie_bomb(exc, data)
                return
        self._malformed(exc, linger=True)  # the client may still be sending its head

    def _cookie_bomb(self, exc: GatewayError, data: bytes) -> None:
        names = CookieNames()
        ended = names.feed(b"".join(self.head_raw) + data if self.head_raw else data)
        self.head_raw = None
        if not ended:
            # Read the rest of the head for its names (bounded: CookieNames.MAX_HEAD, header_read_timeout).
            self.parsing = None
            self.mode |= M_DISCARD
            self.cookie_scan = (names, exc)
            self.linger_until = self.plane.now + self.plane.options.header_read_timeout
            self.plane.watch(self, self.linger_until)
            return
        self._answer_cookie_bomb(names, exc)

    def cookie_bomb_read(self, data: bytes) -> None:
        """More of a refused head (see ``_cookie_bomb``)."""
        names, exc = self.cookie_scan
        if names.feed(data):
            self.cookie_scan = None
            self.linger_until = 0.0
            self._answer_cookie_bomb(names, exc)

    def _answer_cookie_bomb(self, names: CookieNames, exc: GatewayError) -> None:
        if not names.names:
            self._malformed(exc, linger=True)
            return
        keys = self.plane.keys
        clearing = names.clearing(keys.domain if keys is not None else None)
        exc = HeaderTooLarge(f"{exc.message}: its {len(names.names)} cookies were expired (Set-Cookie), the "
                             "sandbox access cookie kept; reload to carry on")
        extra = b"".join(b"Set-Cookie: " + line + w.CRLF for line in clearing)
        self._malformed(exc, linger=True, as_html=names.navigation, extra=extra)

    def _malformed(self, exc: GatewayError, h2: bool = False, linger: bool = False, as_html: bool = False,
                   extra: bytes = b"") -> None:
        """Bytes that are not HTTP: answer 400 if nothing is in flight, then close.

        ``h2``: the client spoke HTTP/2 (prior knowledge); it gets the error in HTTP/2 frames it can read.
        ``linger``: the client is likely still sending; close as ``linger`` does, so it reads the answer.
        """
        self.parsing = None
        ex = self.current
        if ex is not None and ex.state != DONE:
            ex.req_done = False
            if ex.started:
                self.abort(ex, None, exc.message)
            else:
                self.fail(ex, exc)  # drops the sandbox's connection (it has part of the request) too
            return
        bad = Exchange(self)
        bad.t0 = perf_counter()
        bad.request_id = self.plane.ids.next()
        bad.status = exc.status
        bad.code = exc.code
        bad.state = RESOLVING
        self.plane.inflight += 1
        if h2:
            self._send(_h2_goaway(exc))
            self.linger()  # the client is still sending its request: a plain close could reset our answer away
        else:
            response = w.error_response(exc, bad.request_id, close=True, as_html=as_html, extra=extra)
            bad.bytes_out = w.body_length(response)
            self._send(response)
            if linger:
                self.linger()
            else:
                self.close()
        self.plane.finished(bad)


def _h2_goaway(exc: GatewayError) -> bytes:
    """An HTTP/2 server preface (empty SETTINGS) and GOAWAY HTTP_1_1_REQUIRED carrying the JSON error as its
    debug data, which HTTP/2 and gRPC clients show (grpcio: "GOAWAY received ... debug data")."""
    body = error_body(exc)
    settings = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
    goaway = (len(body) + 8).to_bytes(3, "big") + b"\x07\x00\x00\x00\x00\x00" + b"\x00\x00\x00\x00\x00\x00\x00\x0d"
    return settings + goaway + body


__all__ = ["Refusals"]

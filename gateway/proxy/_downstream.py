"""The downstream side: one protocol per client connection, serving the requests it reads.

Per request (:meth:`DownstreamConnection.begin`): admission answers who, may
they and which route (``_admission``), synchronously when the route is cached;
then an idle pooled upstream connection is taken (``UpstreamPool.take``) and
the rebuilt head leaves in one write together with any body bytes that came in
the same read. Anything slower (resolving, creating, connecting) runs in one
task. Body bytes are then written through as they arrive; reading from the
client pauses while the upstream's write buffer is full. Pipelined requests
wait, in order, behind the one in flight. Requests are parsed by the httptools
callbacks of :class:`~gateway.proxy._request.RequestReader` (which also bounds a head
that takes several reads, in bytes and time); the answers the
gateway gives itself when a request ends badly are :class:`~gateway.proxy._refusals.Refusals`.

This module is the hot path: the common case is written out inline rather than
spread over small helpers, because every Python call shows in the throughput.
"""

from __future__ import annotations

import asyncio
import logging
from time import perf_counter
from typing import TYPE_CHECKING

from httptools import HttpParserError, HttpParserUpgrade

from gateway._compiled import COMPILED
from gateway.errors import CapacityExceeded, GatewayError, NotFound, UpstreamError
from gateway.hosts import host_not_allowed
from gateway.proxy._exchange import CHUNKED, DONE, NO_BODY, PARSED, RESOLVING, TUNNEL, WAITING, Exchange
from gateway.proxy._request import RequestReader
from gateway.proxy._state import (
    M_CLOSING, M_DISCARD, M_EOF, M_IN_HEAD, M_LINGER, M_TUNNEL, M_UPGRADED, NEVER, PAUSE_PIPELINE, PAUSE_SLOW_HEAD,
    PAUSE_WAIT,
)
from gateway.proxy._wire import (
    CONTINUE_100, CRLF, HTTP11_CRLF, SP, TE_CHUNKED, WS_UPGRADE, XFP_HTTP, body_length, declares_stream,
    error_response, last_chunk, navigation, refusal_response,
)
from gateway.proxy._wsframe import MessageSizeGuard

if TYPE_CHECKING:
    from gateway.model import Route
    from gateway.proxy._upstream import UpstreamConnection
    from routing import Identity

log = logging.getLogger("gateway.proxy")

LINGER_TIME = 2.0    # how long a refused upload is read and dropped before the connection closes


_NO_FAVICON = NotFound("the gateway has no favicon; a sandbox's own is reached through its URL",
                       code="not_found")


class DownstreamConnection(RequestReader):
    """The protocol of one client connection (uvloop, or asyncio, calls it; it is not an
    ``asyncio.Protocol`` subclass so that the compiled build can make it an extension type)."""

    __slots__ = ()

    # -- asyncio.Protocol ---------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(high=self.plane.write_high)  # type: ignore[attr-defined]
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and peer:
            self.peer = str(peer[0]).encode()
            self.conn_line = b"X-Forwarded-For: " + self.peer + CRLF + XFP_HTTP
        self.idle_since = self.plane.now
        bound = self.plane.gate.admit(self.peer, self)
        if bound is not None:
            self.refuse_connection(bound)
            return
        self.plane.clients.add(self)
        self.plane.watch(self, self.idle_since + self.head_timeout)

    def refuse_connection(self, bound: str) -> None:
        """Past a listener bound (gateway/gate.py): a 503 before any request is read, then the close."""
        self.mode |= M_CLOSING
        self.transport.write(refusal_response(self.plane.gate.refusal(bound), self.plane.ids.next()))
        self.transport.close()

    def pause_writing(self) -> None:
        self.wpaused = True
        ex = self.current
        if ex is not None and ex.upstream is not None:
            ex.upstream.pause_for_client()

    def resume_writing(self) -> None:
        self.wpaused = False
        ex = self.current
        if ex is not None and ex.upstream is not None:
            ex.upstream.resume_for_client()

    def data_received(self, data: bytes) -> None:
        if self.mode and not self._special(data):
            return
        self.big = len(data) > self.plane.max_head
        try:
            if not (COMPILED and not self.mode and not self.big and self.read_plain(data)):
                self.parser.feed_data(data)
        except HttpParserUpgrade as exc:
            self._flush_up()
            self._upgrade_requested(data[exc.args[0]:])
            return
        except HttpParserError as exc:  # HttpParserCallbackError too: one of our callbacks raised
            self.up_out.clear()
            if not self.mode & M_DISCARD:  # else answered already (refused at its head): the rest is dropped
                self._unparsable(exc, data)
            return
        out = self.up_out
        if out:
            conn = self.up_conn
            if conn is not None and not conn.closed:
                try:
                    conn.transport.write(out[0] if len(out) == 1 else b"".join(out))
                except RuntimeError:  # uvloop: the upstream's transport closed; its connection_lost settles it
                    pass
            out.clear()
        if self.mode & M_IN_HEAD:
            self._head_pending(data)

    def eof_received(self) -> bool | None:
        # A client that half-closes after sending its request still gets the response, unless
        # it is an event stream: a client closing one has gone (a half-close looks the same),
        # and the stream must not stay open until the sandbox next writes. A lingering close
        # ends here too (returning None closes the transport).
        ex = self.current
        if (ex is not None and ex.state != DONE and ex.req_done and not self.mode & M_TUNNEL
                and ex.protocol != "sse"):
            self.mode |= M_EOF
            return True
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.mode |= M_CLOSING
        plane = self.plane
        self.watch_tick = NEVER  # its entry in the deadline wheel is stale now
        # Break the cycles through this connection: its parser holds its bound callbacks, and its requests
        # name it (ex.client). Left to the cyclic GC, thousands of connections closing together (a head
        # deadline wave) made a full collection of 40-230 ms in one loop turn; dropped here, the connection
        # is freed by its reference count when its transport lets go of it.
        self.parser = self.last = self.parsing = None
        if self.rpause & PAUSE_SLOW_HEAD:
            plane.slow_heads.pop(self, None)
        plane.ready_heads.forget(self)
        if self not in plane.clients:
            return  # refused at connection_made: never counted
        plane.clients.discard(self)
        plane.gate.release(self.peer, self)
        pending = [self.current] if self.current is not None else []
        if self.queue:
            pending += self.queue
            self.queue.clear()
        self.current = None
        for ex in pending:
            if ex.state == DONE:
                continue
            if ex.task is not None:
                ex.task.cancel()
                ex.task = None
            up = ex.upstream
            if up is not None:
                up.abort()
            if ex.state == PARSED:
                ex.state = DONE  # never begun: nothing to report
                continue
            if not ex.started:
                ex.status = 499  # nginx's "client closed request"
            plane.finished(ex)

    # -- flow control -------------------------------------------------------
    def pause(self, bit: int) -> None:
        if not self.rpause and not self.mode & M_CLOSING:
            self.transport.pause_reading()
        self.rpause |= bit

    def resume(self, bit: int) -> None:
        if self.rpause & bit:
            self.rpause &= ~bit
            if not self.rpause and not self.mode & M_CLOSING:
                self.transport.resume_reading()

    def _flush_up(self) -> None:
        out = self.up_out
        if out:
            conn = self.up_conn
            if conn is not None and not conn.closed:
                try:
                    conn.transport.writelines(out)
                except RuntimeError:  # uvloop: the upstream's transport closed; its connection_lost settles it
                    pass
            out.clear()

    # -- serving a request --------------------------------------------------
    def begin(self, ex: Exchange, batch: bool = False) -> None:
        """Serve ``ex`` (the current request): synchronously when the route is cached and a
        pooled connection is idle, else in a task. ``batch``: called while parsing a read.

        Three steps, each a C call in the compiled build: what is answered before admission
        (:meth:`_answered_early`), admission (:meth:`_admit`), then carrying (:meth:`_carry`)."""
        plane = self.plane
        if ex.state != PARSED or self.mode & M_CLOSING:
            return
        ex.state = RESOLVING
        ex.t0 = perf_counter()  # durations need better than uvloop's millisecond loop clock
        ex.active_at = plane.now
        plane.inflight += 1
        if self.watch_tick > plane.begin_tick:  # its bucket is later than this request's first deadline can be
            plane.enter(self, plane.begin_tick)
        if ex.request_id is None:
            ex.request_id = plane.ids.next()
        if plane.tracer is not None:
            plane.tracer.begin(ex)  # gateway/tracing.py
        if self._answered_early(ex, batch):
            return
        identity = self._admit(ex)
        if identity is not None:
            self._carry(ex, identity, batch)

    def _answered_early(self, ex: Exchange, batch: bool) -> bool:
        """True when ``ex`` is refused or served before admission: a problem found while parsing, a
        Host that is not ours, the router headers or a sandbox key (host, path), a browser's favicon."""
        if ex.reject is not None:
            self.fail(ex, ex.reject)  # type: ignore[arg-type]
            return True
        host = ex.host
        if host != self.host_ok:  # checked once per Host value a connection sends (it repeats)
            if not self.plane.hosts.allows(host):
                self.fail(ex, host_not_allowed(host))
                return True
            self.host_ok = host
        if ex.compat is not None and ex.compat[0] is not None and self._begin_compat(ex):
            return True
        # A preview host or path is keyed whatever else the request says: identity headers there would let
        # a sandbox's page (same origin) or a page its CORS answer admits claim any identity the trusted
        # headers allow (SECURITY.md, "Browsers").
        if self.plane.keyed and self._begin_keyed(ex, batch):
            return True
        if ex.url == b"/favicon.ico" and ex.user is None and ex.auth is None:
            self.fail(ex, _NO_FAVICON)  # a browser's own fetch beside a path URL: no identity, no sandbox
            return True
        return False

    def _admit(self, ex: Exchange) -> Identity | None:
        """Admission: who is this, may they (gateway/proxy/_admission.py). None: refused (answered)."""
        admission = self.plane.admission
        try:
            identity = ex.identity = admission.identify(self, (ex.org, ex.user, ex.session, ex.bot, ex.auth))
            if admission.limited:
                # The stream slot is released by DataPlane.finished.
                ex.stream_key = admission.admit(
                    identity, ex.websocket or (admission.caps_streams and declares_stream(ex.headers)))
        except CapacityExceeded as exc:
            ex.refused = exc.scope
            self.fail(ex, exc)
            return None
        except GatewayError as exc:
            self.fail(ex, exc)
            return None
        return identity

    def _carry(self, ex: Exchange, identity: Identity, batch: bool) -> None:
        """Which route (the session layer's cache) and an idle pooled connection to it: attached now;
        else resolving and connecting run in a task."""
        plane = self.plane
        admission = plane.admission
        try:
            # The last route the cache gave this same identity object: its owner check is not repeated.
            route = admission.cached_route(identity, self.owned if identity is self.owned_by else None)
        except GatewayError as exc:
            self.fail(ex, exc)
            return
        except Exception:
            log.exception("route cache lookup failed")  # a bug in the cache: resolve as on a miss
            route = None
        if route is not None:
            self.owned_by = identity
            self.owned = route
            if route is self.route_key:
                pool = self.route_pool
            else:
                endpoint = route.endpoint
                pool = plane.pools.get((endpoint.host, endpoint.port))
            if pool is not None:
                conn = pool.take()
                if conn is not None:
                    self.attach(ex, route, conn, batch)
                    return
        self.pause(PAUSE_WAIT)
        ex.task = plane.loop.create_task(self._begin_slow(ex, identity, route, False))

    def _begin_compat(self, ex: Exchange) -> bool:
        """A request addressed with the agent-sandbox router's headers (gateway.compat); False when
        the plane does not honour them (the default): the request routes by identity. With an access
        token for the sandbox they name, they reach it (and only it) whatever the router settings."""
        keys = self.plane.keys
        try:
            if keys is not None and ex.auth is not None:
                keyed = keys.router_key(ex.compat, ex.auth)
                if keyed is not None:
                    self._serve_keyed(ex, keyed, False)
                    return True
            target = self.plane.compat.target(*ex.compat, ex.auth)
        except GatewayError as exc:
            self.fail(ex, exc)
            return True
        if target is None:
            ex.compat = None
            return False
        ex.compat = target
        self.pause(PAUSE_WAIT)
        ex.task = self.plane.loop.create_task(self._begin_slow(ex, None, None, False))
        return True

    async def _begin_slow(self, ex: Exchange, identity: Identity | None, route: Route | None, fresh: bool) -> None:
        try:
            if ex.trace is None:
                conn = await self.plane.open_route(ex, identity, route, fresh)
            else:
                with ex.trace.resolving():
                    conn = await self.plane.open_route(ex, identity, route, fresh)
        except GatewayError as exc:
            ex.task = None
            self.fail(ex, exc)
            return
        except Exception:
            ex.task = None
            log.exception("routing request %s failed", (ex.request_id or b"").decode())
            self.fail(ex, GatewayError("internal error while routing the request"))
            return
        ex.task = None
        if ex.state == DONE or self.mode & M_CLOSING:
            if not conn.closed:
                conn.pool.release(conn)
            return
        self.attach(ex, ex.route, conn, False)  # type: ignore[arg-type]

    def attach(self, ex: Exchange, route: Route, conn: UpstreamConnection, batch: bool) -> None:
        """Give ``ex`` the upstream connection ``conn`` and send the request head (and any body read so far)."""
        ex.route = route
        ex.upstream = conn
        ex.state = WAITING
        ex.sent_at = perf_counter()
        conn.ex = ex
        if ex.timeout or self.plane.request_timeouts:
            self._deadline(ex, route)
        conn.client_tr = self.transport
        conn.raw = None
        conn.raw_pos = 0
        if self.wpaused or conn.wpaused:
            conn.sync_pauses(self)
        out = [self._request_head(ex, route, conn)]
        if ex.body != NO_BODY:
            self._body_so_far(ex, out)
        if batch:
            if self.up_conn is not conn:
                self._flush_up()
                self.up_conn = conn
            self.up_out += out
        else:
            self._flush_up()
            self.up_conn = conn
            try:
                conn.transport.writelines(out)
            except RuntimeError:  # uvloop: the upstream's transport closed; its connection_lost settles it
                pass
        if self.rpause & PAUSE_WAIT:
            self.resume(PAUSE_WAIT)

    def _deadline(self, ex: Exchange, route: Route) -> None:
        """When the response head is due: X-Sandbox-Timeout, capped by the pool's request_timeout."""
        limit = ex.timeout
        timeouts = self.plane.request_timeouts
        if timeouts:
            pool_limit = timeouts.get(route.pool)
            if pool_limit is not None and (not limit or pool_limit < limit):
                limit = pool_limit  # a client may ask for less than its pool allows, never more
        if limit:
            ex.deadline = self.plane.now + limit
            self.plane.watch(self, ex.deadline)

    def _request_head(self, ex: Exchange, route: Route, conn: UpstreamConnection) -> bytes:
        """The head the sandbox gets: the request line, the headers kept, then the ones the gateway sets
        (Host, X-Sandbox-Id, X-Forwarded-*, X-Request-Id, traceparent) and the body's framing."""
        if route is not self.route_key:
            self.route_key = route
            self.route_pool = conn.pool
            self.route_line = conn.pool.host_line + b"X-Sandbox-Id: " + route.sandbox_id.encode() + CRLF
            self.route_tail = None
        host = ex.host
        if ex.xff is not None and self.plane.trust_xff:
            tail = self._head_tail(b"X-Forwarded-For: " + ex.xff + b", " + self.peer + CRLF + XFP_HTTP, host)
        else:
            # The lines set per route and client, up to X-Request-Id's name, are joined once and kept while
            # the route and the Host stay the same (a connection's requests repeat them): fewer parts a head.
            tail = self.route_tail
            if tail is None or host != self.tail_host:
                tail = self.route_tail = self._head_tail(self.conn_line, host)
                self.tail_host = host
        parts = [ex.method, SP, ex.url, HTTP11_CRLF, *ex.headers, tail]
        parts.append(ex.request_id)  # type: ignore[arg-type]
        parts.append(CRLF)
        if ex.trace is not None:
            parts += ex.trace.upstream(ex)  # the sandbox continues the trace (traceparent)
        if ex.websocket:
            parts.append(WS_UPGRADE)
        elif ex.body == CHUNKED:
            parts.append(TE_CHUNKED)
        parts.append(CRLF)
        return b"".join(parts)  # type: ignore[arg-type]

    def _head_tail(self, forwarded: bytes, host: bytes | None) -> bytes:
        """Host and X-Sandbox-Id (the route's), X-Forwarded-For and -Proto (``forwarded``), X-Forwarded-Host
        (the inbound Host, when there is one) and the name of X-Request-Id, in the order a head has them."""
        if host is None:
            return b"".join((self.route_line, forwarded, b"X-Request-Id: "))
        return b"".join((self.route_line, forwarded, b"X-Forwarded-Host: ", host, CRLF, b"X-Request-Id: "))

    def _body_so_far(self, ex: Exchange, out: list[bytes]) -> None:
        """After the head: the body bytes read before an upstream was attached (re-chunked when the body
        is), its end when it is all here, and 100 Continue for a client waiting for it to send the rest."""
        pending = ex.pending
        if pending is not None:
            ex.pending = None
            if ex.body == CHUNKED:
                for chunk in pending:
                    out += (b"%x\r\n" % len(chunk), chunk, CRLF)
            else:
                out += pending
        if ex.req_done and ex.body == CHUNKED:
            out.append(last_chunk(ex.trailers))
        if not ex.req_done and ex.expect and not ex.bytes_in:
            self._send(CONTINUE_100)

    def retry(self, ex: Exchange) -> None:
        """The pooled connection was stale: send the (body-less, idempotent) request again, fresh."""
        ex.retried = True
        ex.state = RESOLVING
        ex.task = self.plane.loop.create_task(self._begin_slow(ex, ex.identity, ex.route, True))  # type: ignore[arg-type]

    def fail(self, ex: Exchange, exc: GatewayError) -> None:
        """Answer ``ex`` with an error page, or cut the connection if the response already started."""
        if ex.state == DONE:
            return
        if isinstance(exc, UpstreamError):
            ex.error = exc.code
        up = ex.upstream
        if up is not None:
            up.abort()
        if ex.started:
            self.abort(ex, ex.error, exc.message)
            return
        ex.status = exc.status
        ex.code = exc.code
        close = not ex.req_done or not ex.keep_alive or self.plane.draining or bool(self.mode & M_UPGRADED)
        response = error_response(exc, ex.request_id or b"-", close=close, keep_alive_10=ex.version10,
                                    as_html=navigation(ex.headers))
        ex.bytes_out = body_length(response)  # the access log counts the body the gateway wrote
        self._send(response)
        self.finish(ex, close)

    def _send(self, data: bytes) -> None:
        """A response the gateway writes itself (error pages, 100 Continue)."""
        if not self.mode & (M_CLOSING | M_LINGER) and not self.transport.is_closing():
            self.transport.write(data)

    def abort(self, ex: Exchange, reason: str | None, detail: str) -> None:
        """A failure after the response started: no error page (the head is gone), just close.

        ``reason`` is the upstream error reason for the record, or None when the
        upstream is not at fault.
        """
        if ex.state == DONE:
            return
        if ex.error is None:
            ex.error = reason
        up = ex.upstream
        if up is not None:
            up.abort()
        sandbox_id = ex.route.sandbox_id if ex.route else None
        log.warning("request %s to sandbox %s cut short: %s", (ex.request_id or b"").decode(), sandbox_id, detail)
        self.finish(ex, True)

    def start_tunnel(self, ex: Exchange, up: UpstreamConnection) -> None:
        self.mode |= M_TUNNEL
        self.up_conn = up
        if self.plane.ws_max_message is not None:
            self.ws_guard = MessageSizeGuard(self.plane.ws_max_message)
        early = ex.early
        if early:
            ex.early = None
            for data in early:
                if self.ws_guard is not None and self.ws_guard.feed(data) is not None:
                    self._ws_refused(ex, self.ws_guard.verdict)  # type: ignore[arg-type]
                    return
                ex.bytes_in += len(data)
            up.transport.writelines(early)  # type: ignore[union-attr]
        self.resume(PAUSE_WAIT)
        self.resume(PAUSE_PIPELINE)

    def _upgrade_requested(self, rest: bytes) -> None:
        """The parser stopped after an upgrade request; what follows is not HTTP any more."""
        self.mode |= M_UPGRADED
        ex = self.last
        if ex is None or ex.state == DONE or not ex.websocket:
            if self.current is None:
                self.close()
            return
        if rest:
            ex.early = [rest]
        if ex.state != TUNNEL:
            self.pause(PAUSE_WAIT)

    def finish(self, ex: Exchange, close: bool) -> None:
        """``ex`` is over (its response complete, failed or cut): report it, then close or serve the next."""
        if ex.state == DONE:
            return
        task = ex.task
        if task is not None:
            # Still resolving (e.g. the body turned out malformed): no sandbox for a request that
            # is over. A creation other requests also wait for goes on; one that has not started does not.
            ex.task = None
            task.cancel()
        plane = self.plane
        plane.finished(ex)
        if ex is not self.current:
            return
        self.current = None
        if close or self.mode & (M_CLOSING | M_TUNNEL | M_UPGRADED | M_EOF) or plane.draining:
            if not ex.req_done and not self.mode & (M_CLOSING | M_TUNNEL | M_UPGRADED):
                self.linger()
            else:
                self.close()
            return
        self.idle_since = plane.now
        if self.rpause & PAUSE_WAIT:
            self.resume(PAUSE_WAIT)  # failed before an upstream was attached
        queue = self.queue
        if queue:
            nxt = self.current = queue.popleft()
            if not queue:
                self.resume(PAUSE_PIPELINE)
            plane.loop.call_soon(self.begin, nxt)

    def close(self) -> None:
        self.mode |= M_CLOSING
        self.transport.close()

    def linger(self) -> None:
        """Close after answering a request whose body is still on its way (a 413, an early error).

        Closing with unread bytes makes the kernel send a reset, and the client may
        lose the answer it has not read yet. So, as nginx's lingering close does:
        send FIN, then read and drop what still arrives for up to LINGER_TIME.
        """
        transport = self.transport
        if transport.is_closing() or not transport.can_write_eof():
            self.close()
            return
        self.mode |= M_DISCARD | M_LINGER
        self.linger_until = self.plane.now + LINGER_TIME
        self.plane.watch(self, self.linger_until)
        transport.write_eof()
        if self.rpause:
            self.rpause = 0
            transport.resume_reading()

    def abort_connection(self) -> None:
        self.mode |= M_CLOSING
        self.transport.abort()

    def close_if_idle(self) -> None:
        if self.current is None and not self.queue:
            self.close()

    # -- gateway/gate.py's Sheddable: a full listener may close this connection to admit another --
    def sheddable(self) -> bool:
        """No request in flight (between requests, or a head not yet complete: a slowloris)."""
        return self.current is None and not self.queue and not self.mode & (M_CLOSING | M_LINGER)

    def shed(self) -> None:
        self.close()


__all__ = ["DownstreamConnection"]

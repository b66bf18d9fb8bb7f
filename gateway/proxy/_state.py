"""The state the hot path shares: the data plane's (:class:`PlaneState`), one client connection's
(:class:`ClientState`), and the bits that say why a connection reads, pauses or closes.

:class:`PlaneState` is the part of :class:`~gateway.proxy._plane.DataPlane` that connections read
and write on every request (the coarse clock, the counters, the limits, the pools); the data plane
extends it with everything else. :class:`ClientState` is the root of :class:`~gateway.proxy._downstream.DownstreamConnection`'s
single line of bases (``ClientState`` <- ``Refusals`` <- ``KeyedRequests`` <- ``RequestReader``
<- ``DownstreamConnection``): each module adds one kind of behaviour, and the fields they all
use are declared once, here. A single line, not mixins, because the compiled build
(``_state.pxd`` and its neighbours, see ``gateway/_compiled.py``) makes each of these an extension
type, and an extension type has one base whose fields it extends.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from random import random
from time import perf_counter
from typing import TYPE_CHECKING, Any

from httptools import HttpRequestParser

from gateway.limits import limit_key
from gateway.proxy import _wire as w
from gateway.proxy._exchange import DONE, Exchange, RequestLog, request_log

if TYPE_CHECKING:
    from gateway.hosts import AllowedHosts
    from gateway.proxy._ready import ReadyHeads
    import asyncio
    from collections import deque

    from gateway.gate import ConnectionGate
    from gateway.model import Route
    from gateway.proxy._admission import Admission
    from gateway.proxy._keys import PreviewKeys
    from gateway.proxy._plane import DataPlane, PlaneOptions
    from gateway.proxy._seams import RouteResolver, RouterHeaders
    from gateway.proxy._upstream import UpstreamConnection, UpstreamPool
    from gateway.proxy._wire import RequestIds
    from gateway.proxy._wsframe import MessageSizeGuard
    from routing import Identity

log = logging.getLogger("gateway.proxy")

# Why reading from the client is paused (ClientState.rpause bits).
PAUSE_UPSTREAM = 1   # the upstream's write buffer is full
PAUSE_WAIT = 2       # no upstream attached yet (resolving, connecting, upgrading)
PAUSE_PIPELINE = 4   # a pipelined request waits behind the current one
PAUSE_DISCARD = 8    # M_DISCARD: never resumed
PAUSE_SLOW_HEAD = 16  # a head still incomplete SLOW_HEAD_AFTER after it began: read once per tick (DataPlane)

SLOW_HEAD_AFTER = 1.0  # seconds: a head taking longer is a slow one (a slowloris, or a very slow network)
# Each connection's head deadline falls up to a quarter past header_read_timeout, at random (as the gRPC front's
# handshake deadlines: keeper.DEADLINE_SPREAD). A slowloris's 4,000 connections, admitted together, otherwise all
# reached it in the same tick and were closed together (paced: about 45% of the loop for a second), reconnected
# together and sent their lines together, every 10 s; a victim whose calls fell in that second saw its p99
# double (issue 28). Drawn anew for each connection, the waves also drift apart from one cycle to the next.
HEAD_DEADLINE_SPREAD = 0.25
NEVER = sys.maxsize    # ClientState.watch_tick of a connection in no bucket of the deadline wheel

# ClientState.mode bits: anything set sends data_received down the slow path.
M_TUNNEL = 1         # spliced to an upstream (WebSocket)
M_CLOSING = 2        # closing: ignore further bytes
M_UPGRADED = 4       # after an upgrade request the bytes are not HTTP any more
M_IN_HEAD = 8        # a request head is being parsed (its size is counted across reads)
M_EOF = 16           # the client half-closed: answer the request in flight, then close
M_DISCARD = 32       # a request was refused mid-body: bytes are dropped, no request is parsed any more
M_LINGER = 64        # our side is shut (FIN sent): nothing may be written


def ignore_requests(record: RequestLog) -> None:
    """The null ``on_request`` hook; the plane then builds no RequestLog at all."""


class RequestHooks:
    """Several ``on_request`` hooks as one (the metrics batch and the access log): compiled, it calls
    them without a Python frame of its own per request, which a closure would cost."""

    __slots__ = ("hooks",)

    def __init__(self, *hooks: Callable[[RequestLog], None]) -> None:
        self.hooks = hooks

    def __call__(self, record: RequestLog) -> None:
        self.report(record)

    def report(self, record: RequestLog) -> None:
        """The hooks, in order (``PlaneState.finished`` calls this directly: compiled, a C call)."""
        for hook in self.hooks:
            hook(record)


class PlaneState:
    """The data plane's per-request fields (set by ``DataPlane.__init__``; see the module docstring)."""

    now: float                  # the loop's clock, refreshed by the tick (uvloop's is in milliseconds)
    draining: bool              # shutting down: finish what is in flight, keep nothing alive
    closed: bool                # stopped: pooled connections are closed, not kept
    inflight: int               # requests begun and not finished
    streams: int                # event streams and WebSockets open
    max_head: int               # max_header_bytes
    max_body: int | None        # max_body_bytes
    body_cap: int               # max_body_bytes, or no limit as a number
    ws_max_message: int | None  # ws_max_message_bytes
    trust_xff: bool             # trust_forwarded_for
    write_high: int             # a transport's write buffer limit
    keyed: bool                 # a host or path key is on: requests without a session may name a sandbox
    tracer: Any                 # a gateway.tracing.Tracer, None when tracing is off (one check per request)
    request_timeouts: dict[str, float]
    pools: dict[tuple[str, int], UpstreamPool]
    clients: set[Any]
    slow_heads: dict[Any, None]  # client connections paused in a slow head (PAUSE_SLOW_HEAD), woken by the tick
    ready_heads: ReadyHeads      # which of slow_heads have bytes waiting (asked by the tick)
    gate: ConnectionGate        # this listener's connection bounds (gateway/gate.py)
    admission: Admission
    ids: RequestIds
    loop: asyncio.AbstractEventLoop
    keys: PreviewKeys | None
    hosts: AllowedHosts         # the Host values answered (gateway/hosts.py)
    compat: RouterHeaders
    options: PlaneOptions
    resolver: RouteResolver
    on_request: Callable[[RequestLog], None]  # called with a RequestLog for every finished request (settable)
    drained: asyncio.Future[None] | None      # set while stop() waits for the requests in flight
    # The deadline wheel (DataPlane's clock, gateway/proxy/_plane.py): tick number -> the connections to
    # look at then. Each connection is in the bucket of the earliest moment something of it may be due.
    wheel: dict[int, list[Any]]
    tick_len: float             # seconds per tick
    wheel_at: int               # the last tick whose bucket was taken
    begin_tick: int             # the bucket a request begun now must be looked at by (see DownstreamConnection.begin)

    def watch(self, client: ClientState, when: float) -> None:
        """Look at ``client`` at the first tick at or after ``when`` (not before the next one), unless it is
        due to be looked at sooner already. Its entries in later buckets go stale: a bucket skips a client
        whose ``watch_tick`` is not its own (lazy invalidation), so nothing is ever searched or removed."""
        self.enter(client, int(when / self.tick_len) + 1)

    def enter(self, client: ClientState, tick: int) -> None:
        """``watch`` by tick number."""
        if tick <= self.wheel_at:
            tick = self.wheel_at + 1
        if tick < client.watch_tick:
            client.watch_tick = tick
            bucket = self.wheel.get(tick)
            if bucket is None:
                self.wheel[tick] = [client]
            else:
                bucket.append(client)

    # -- exchange bookkeeping -------------------------------------------------
    def stream_began(self, ex: Exchange) -> None:
        if ex.stream or ex.route is None:
            return
        ex.stream = True
        self.streams += 1
        if ex.identity is None:
            if ex.keyed is not None:
                self.resolver.stream_opened(ex.route.sandbox_id)  # a sandbox of ours, reached by a key
                if ex.stream_key is None:
                    ex.stream_key = self.admission.stream_began(limit_key(ex.route.owner))
            return  # else addressed by the router headers: not a sandbox of ours
        self.resolver.stream_opened(ex.route.sandbox_id)
        if ex.stream_key is None:
            ex.stream_key = self.admission.stream_began(limit_key(ex.identity))

    def finished(self, ex: Exchange) -> None:
        """Bookkeeping for an exchange that is over: counters, streams, the on_request record."""
        ex.state = DONE
        self.inflight -= 1
        if ex.stream:
            ex.stream = False
            self.streams -= 1
            if ex.identity is not None or ex.keyed is not None:
                self.resolver.stream_closed(ex.route.sandbox_id)  # type: ignore[union-attr]
        if ex.stream_key is not None:
            self.admission.stream_closed(ex.stream_key)
            ex.stream_key = None
        trace = ex.trace
        if trace is not None:
            trace.end(ex)
        hook = self.on_request
        if hook is not ignore_requests:  # the null hook needs no record: none is built (hot path)
            try:
                record = request_log(ex, perf_counter() - ex.t0)
                if type(hook) is RequestHooks:  # serve's (the metrics and the access log): compiled, a C call
                    hooks = hook
                    hooks.report(record)
                else:
                    hook(record)
            except Exception:
                log.exception("on_request hook failed")
        if self.drained is not None and not self.inflight and not self.drained.done():
            self.drained.set_result(None)


class ClientState:
    """One client connection's fields (see the module docstring for who uses them)."""

    __slots__ = (
        "big", "conn_line", "cookie_scan", "current", "head_at", "head_raw", "head_seen", "host_ok",
        "head_timeout", "ident", "ident_key", "idle_since",
        "last", "linger_until", "mode", "owned", "owned_by", "parser", "parsing", "peer", "plane", "queue", "route_key",
        "route_line",
        "route_pool", "route_tail", "rpause", "tail_host", "transport", "up_conn", "up_out", "watch_tick", "wpaused",
        "ws_guard",
    )

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane
        self.transport: Any = None             # the asyncio.Transport, set by connection_made
        self.parser = HttpRequestParser(self)
        self.parsing: Exchange | None = None   # the request being parsed
        self.last: Exchange | None = None      # the most recent request parsed
        self.current: Exchange | None = None   # the request being served
        self.queue: deque[Exchange] | None = None
        self.mode = 0
        self.rpause = 0
        self.wpaused = False
        self.big = False                       # this read is larger than a head may be: count head bytes
        self.head_seen = 0
        self.cookie_scan: Any = None          # a refused head still being read for its cookie names (_refusals)
        self.head_raw: list[bytes] | None = None  # a head spread over reads, kept (keys on) to find a cookie bomb's names
        self.host_ok: bytes | None = None      # the last Host value the allowed hosts answered for (None: allowed)
        self.up_out: list[bytes] = []          # bytes for up_conn, written once the current read is parsed
        self.up_conn: UpstreamConnection | None = None
        self.ident_key: tuple[bytes | None, ...] | None = None
        self.ident: Identity | None = None
        self.owned: Route | None = None       # the route cache's last answer for owned_by (cached_route's memo)
        self.owned_by: Identity | None = None
        self.peer = b""
        self.conn_line = w.XFP_HTTP            # X-Forwarded-For + X-Forwarded-Proto for this client
        self.route_key: Route | None = None   # the last route served, and what it costs to look up
        self.route_pool: UpstreamPool | None = None
        self.route_line = b""                  # Host + X-Sandbox-Id for route_key
        self.route_tail: bytes | None = None   # route_line, conn_line, X-Forwarded-Host for tail_host, "X-Request-Id: "
        self.tail_host: bytes | None = None    # the Host value route_tail was made for
        self.idle_since = 0.0
        self.head_at = 0.0                     # when the head being read began (its first incomplete read)
        # header_read_timeout for this connection: spread (HEAD_DEADLINE_SPREAD)
        self.head_timeout = plane.options.header_read_timeout * (1.0 + HEAD_DEADLINE_SPREAD * random())
        self.linger_until = 0.0                # set by linger(): the tick closes the connection then
        self.watch_tick = NEVER                # the bucket of the deadline wheel it is in (PlaneState.watch)
        self.ws_guard: MessageSizeGuard | None = None  # watches client frames in a tunnel (ws_max_message_bytes)


__all__ = ["ClientState", "PlaneState", "RequestHooks", "ignore_requests"]

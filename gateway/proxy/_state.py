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

from typing import TYPE_CHECKING, Any

from httptools import HttpRequestParser

from gateway.proxy import _wire as w

if TYPE_CHECKING:
    import asyncio
    from collections import deque

    from gateway.model import Route
    from gateway.proxy._admission import Admission
    from gateway.proxy._exchange import Exchange
    from gateway.proxy._keys import PreviewKeys
    from gateway.proxy._plane import DataPlane, PlaneOptions, RouterHeaders
    from gateway.proxy._upstream import UpstreamConnection, UpstreamPool
    from gateway.proxy._wire import RequestIds
    from gateway.proxy._wsframe import MessageSizeGuard
    from routing import Identity

# Why reading from the client is paused (ClientState.rpause bits).
PAUSE_UPSTREAM = 1   # the upstream's write buffer is full
PAUSE_WAIT = 2       # no upstream attached yet (resolving, connecting, upgrading)
PAUSE_PIPELINE = 4   # a pipelined request waits behind the current one
PAUSE_DISCARD = 8    # M_DISCARD: never resumed

# ClientState.mode bits: anything set sends data_received down the slow path.
M_TUNNEL = 1         # spliced to an upstream (WebSocket)
M_CLOSING = 2        # closing: ignore further bytes
M_UPGRADED = 4       # after an upgrade request the bytes are not HTTP any more
M_IN_HEAD = 8        # a request head is being parsed (its size is counted across reads)
M_EOF = 16           # the client half-closed: answer the request in flight, then close
M_DISCARD = 32       # a request was refused mid-body: bytes are dropped, no request is parsed any more
M_LINGER = 64        # our side is shut (FIN sent): nothing may be written


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
    request_timeouts: dict[str, float]
    pools: dict[tuple[str, int], UpstreamPool]
    clients: set[Any]
    admission: Admission
    ids: RequestIds
    loop: asyncio.AbstractEventLoop
    keys: PreviewKeys | None
    compat: RouterHeaders
    options: PlaneOptions


class ClientState:
    """One client connection's fields (see the module docstring for who uses them)."""

    __slots__ = (
        "big", "conn_line", "current", "head_at", "head_key", "head_seen", "ident", "ident_key", "idle_since",
        "last", "linger_until", "mode", "parser", "parsing", "peer", "plane", "queue", "route_key", "route_line",
        "route_pool", "rpause", "transport", "up_conn", "up_out", "wpaused", "ws_guard",
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
        self.up_out: list[bytes] = []          # bytes for up_conn, written once the current read is parsed
        self.up_conn: UpstreamConnection | None = None
        self.ident_key: tuple[bytes | None, ...] | None = None
        self.ident: Identity | None = None
        self.peer = b""
        self.conn_line = w.XFP_HTTP            # X-Forwarded-For + X-Forwarded-Proto for this client
        self.route_key: Route | None = None   # the last route served, and what it costs to look up
        self.route_pool: UpstreamPool | None = None
        self.route_line = b""                  # Host + X-Sandbox-Id for route_key
        self.idle_since = 0.0
        self.head_key: object = None           # the head the tick is timing (header_read_timeout)
        self.head_at = 0.0
        self.linger_until = 0.0                # set by linger(): the tick closes the connection then
        self.ws_guard: MessageSizeGuard | None = None  # watches client frames in a tunnel (ws_max_message_bytes)


__all__ = ["ClientState", "PlaneState"]

"""DataPlane: wiring. Serves the proxy on a listening socket, owns the upstream pools and the clock."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import logging
import socket
import sys
from collections.abc import Callable
from time import perf_counter
from typing import TYPE_CHECKING, Any

from gateway.auth import Authenticator, TrustedHeaders
from gateway.errors import CapacityExceeded, UpstreamConnectError
from gateway.gate import ConnectionGate
from gateway.hosts import AllowedHosts
from gateway.limits import OrgLimits, limit_key
from gateway.model import Route
from gateway.proxy._admission import Admission
from gateway.proxy._downstream import DownstreamConnection
from gateway.proxy._exchange import BODY, DONE, TUNNEL, WAITING, Exchange, RequestLog
from gateway.proxy._keys import PreviewKeys
from gateway.proxy._ready import ReadyHeads
from gateway.proxy._seams import NoRouterHeaders, RouteResolver, RouterHeaders
from gateway.proxy._state import (
    M_CLOSING, M_IN_HEAD, NEVER, PAUSE_SLOW_HEAD, PAUSE_UPSTREAM, SLOW_HEAD_AFTER, PlaneState, ignore_requests,
)
from gateway.proxy._upstream import UpstreamConnection, UpstreamPool
from gateway.proxy._wire import RequestIds, declares_stream
from routing import Identity

if TYPE_CHECKING:
    from gateway.policy import PolicyView

log = logging.getLogger("gateway.proxy")

CLIENT_KEEPALIVE_TIMEOUT = 75.0   # an idle client connection is closed after this long (nginx's default)
LONG_REQUEST_AFTER = 10.0         # an exchange open this long counts as a stream for the reaper
WRITE_BUFFER_HIGH = 256 * 1024    # per transport; reading from the other side pauses above this
# Client connections the tick closes or wakes at a time, about 0.25 ms of work (a close and the accept of its
# reconnect, about 30 us), and one such slice every SLICE_EVERY seconds. A victim's call on a new connection
# needs 3-4 loop turns; when every turn ran a slice of an attack's wave (4,000 heads overdue together, closed
# and reconnected), each of those turns grew by the slice and its reconnects' accepts, and the calls that
# overlapped the wave doubled the victim's p99 (issue 28). Paced, a wave of 4,000 takes a second (about 45% of
# the loop meanwhile), and the loop turns between slices are the other connections' own; the head deadlines
# are spread besides (_state.HEAD_DEADLINE_SPREAD).
SLICE = 8
SLICE_EVERY = 0.002
READY_SLICE = 256  # held heads asked about at a time (gateway/proxy/_ready.py): a pass wakes them, then asks again
CHECK_SLICE = 64  # connections of the due buckets the tick checks at a time (about 0.3 ms), see _check_slice
_INF = float("inf")
EAGAIN_BACKOFF_CAP = 0.1          # the longest pause between connects to a Unix socket whose backlog is full


def _unix_connected(path: str) -> socket.socket:
    """A socket connected to ``path``, or BlockingIOError when its listen backlog is full.

    Connected here, not by the loop: a Unix connect never waits (it succeeds or fails at once), but
    the standard loop takes EAGAIN for "in progress", waits for writability and hands back a socket
    that was never connected; uvloop raises it. Either way :meth:`DataPlane.connect` sees EAGAIN."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        sock.connect(path)
    except BaseException:
        sock.close()
        raise
    return sock


@dataclasses.dataclass(frozen=True, slots=True)
class PlaneOptions:
    """The settings the data plane reads (the defaults are ``Settings``' own; ``gateway.app.plane_options``
    takes them from the settings, each field from the setting of its name); see ``gateway.settings``."""

    max_header_bytes: int = 32_768
    max_body_bytes: int | None = None
    ws_max_message_bytes: int | None = None
    trust_forwarded_for: bool = False
    header_read_timeout: float = 10.0
    upstream_connect_timeout: float = 5.0
    upstream_connect_retries: int = 3
    upstream_connect_backoff: float = 0.05
    upstream_read_timeout: float | None = None  # no cap on the wait for a response head by default
    upstream_pool_size: int = 256
    upstream_keepalive_timeout: float = 30.0
    stream_idle_timeout: float = 300.0
    grpc_port: int = 50051  # named in the answer to an HTTP/2 preface


class DataPlane(PlaneState):
    """The HTTP/1.1, SSE and WebSocket reverse proxy in front of the sandboxes."""

    def __init__(self, resolver: RouteResolver, options: PlaneOptions = PlaneOptions(), *,
                 on_request: Callable[[RequestLog], None] = ignore_requests,
                 authenticator: Authenticator = TrustedHeaders(),
                 limits: OrgLimits | None = None,
                 compat: RouterHeaders = NoRouterHeaders(),
                 keys: PreviewKeys | None = None,
                 gate: ConnectionGate | None = None,
                 on_heads_overdue: Callable[[int], None] | None = None,
                 hosts: AllowedHosts = AllowedHosts(["*"]),
                 tracer: Any = None,
                 client_keepalive_timeout: float = CLIENT_KEEPALIVE_TIMEOUT,
                 long_request_after: float = LONG_REQUEST_AFTER) -> None:
        self.resolver = resolver
        self.options = options
        self.limits = limits if limits is not None else OrgLimits()  # no limits
        self.admission = Admission(authenticator, self.limits, resolver.cached_route)
        self.compat = compat
        # Host and path keys and the access tokens behind them (None: no keys to check tokens with).
        self.keys = keys
        self.keyed = keys is not None and keys.routes  # read per request: is a host or path key on?
        self.tracer = tracer  # a gateway.tracing.Tracer, or None: tracing off
        self.hosts = hosts  # the Host values answered (DNS rebinding): checked per request, cached per value
        self.max_body = options.max_body_bytes
        self.ws_max_message = options.ws_max_message_bytes
        self.body_cap = options.max_body_bytes if options.max_body_bytes is not None else sys.maxsize
        self.on_request = on_request  # called with a RequestLog for every finished request (settable)
        self.client_keepalive_timeout = client_keepalive_timeout
        self.long_request_after = long_request_after
        self.max_head = options.max_header_bytes
        self.trust_xff = options.trust_forwarded_for
        self.write_high = WRITE_BUFFER_HIGH
        self.ids = RequestIds()
        # Pool name -> request_timeout (seconds to the response head), for the pools that set one;
        # kept in step with the policy by policy_replaced. Empty: no pool caps a request.
        self.request_timeouts: dict[str, float] = {}
        self.clients: set[DownstreamConnection] = set()
        self.slow_heads: dict[DownstreamConnection, None] = {}
        self.ready_heads = ReadyHeads()
        self.heads_woken = 0  # held slow heads woken by a tick (bytes were waiting on them)
        self.waking = False  # a pass of wake_slow_heads is under way
        self.due_buckets: collections.deque[tuple[int, list[DownstreamConnection]]] = collections.deque()
        self.due_at = 0  # how far the pass of _check_slice is into due_buckets[0]
        self.checking = False  # a pass of _check_slice is under way (its next slice is armed)
        self.overdue: list[DownstreamConnection] = []  # the pass's overdue heads so far
        self.heads_overdue = 0  # connections closed for no complete head within header_read_timeout
        self.on_heads_overdue = on_heads_overdue  # told each tick's count (the metric)
        self.gate = gate if gate is not None else ConnectionGate("data")  # unbounded unless given one
        self.inflight = 0
        self.pools: dict[tuple[str, int], UpstreamPool] = {}
        self.streams = 0
        self.draining = False
        self.closed = False
        self.now = 0.0
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # set by start()
        self._server: asyncio.Server | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.drained: asyncio.Future[None] | None = None
        self.tick_len = max(0.01, min(0.5, (options.upstream_read_timeout or 2.0) / 4,
                                      options.stream_idle_timeout / 4, options.header_read_timeout / 4))
        self.wheel = {}
        self.wheel_at = 0
        self.begin_tick = 0

    def policy_replaced(self, view: PolicyView) -> None:
        """The policy view's subscriber (``PolicyView.subscribe``): the pools' request timeouts in force."""
        self.request_timeouts = view.request_timeouts

    # -- lifecycle ------------------------------------------------------------
    async def start(self, sock: socket.socket) -> None:
        """Serve on an already-bound socket (the caller chooses SO_REUSEPORT, address, backlog)."""
        self.loop = asyncio.get_running_loop()
        self.ids = RequestIds()  # the prefix carries this process's ID
        self.now = self.loop.time()
        self.wheel_at = int(self.now / self.tick_len)
        self._move_begin_tick(self.now)
        self._server = await self.loop.create_server(
            functools.partial(DownstreamConnection, self), sock=sock, backlog=2048)
        self._timer = self.loop.call_later(self.tick_len, self._tick)

    async def stop(self, drain_timeout: float) -> None:
        """Stop accepting, let in-flight requests finish (up to ``drain_timeout``), close everything."""
        if self._server is None:
            return
        self.draining = True
        self._server.close()
        for client in list(self.clients):
            client.close_if_idle()
            client.end_streams()
        if self.inflight:
            self.drained = self.loop.create_future()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.drained), drain_timeout)
        self.closed = True
        for client in list(self.clients):
            client.abort_connection()
        for pool in self.pools.values():
            pool.close_all()
        if self._timer is not None:
            self._timer.cancel()
        await self._server.wait_closed()
        self._server = None
        self.ready_heads.close()
        for _ in range(3):  # let the transports' connection_lost callbacks (and those they cause) run
            await asyncio.sleep(0)

    @property
    def in_flight(self) -> int:
        return self.inflight

    @property
    def open_streams(self) -> int:
        return self.streams

    # -- upstream connections -------------------------------------------------
    def _pool(self, route: Route) -> UpstreamPool:
        endpoint = route.endpoint
        key = (endpoint.host, endpoint.port)
        pool = self.pools.get(key)
        if pool is None:
            pool = self.pools[key] = UpstreamPool(self, endpoint.host, endpoint.port, self.options.upstream_pool_size)
        return pool

    async def open_route(self, ex: Exchange, identity: Identity | None, route: Route | None, fresh: bool
                         ) -> UpstreamConnection:
        """Resolve (unless ``route`` is known) and connect; a sandbox that vanished (refused after the
        connect retries) is re-resolved once, and tried again if it moved. Sets ``ex.route``.

        ``identity`` is None for a request addressed by the router headers (``ex.compat``)."""
        resolver = self.resolver
        keyed = ex.keyed
        if route is None:
            if identity is not None:
                route = await resolver.resolve(identity)
            elif keyed is not None:
                route = await resolver.route_for_sandbox(keyed.sandbox_id, keyed.port, keyed.incarnation)
                if self.admission.limited:
                    self.admit_keyed(ex, route)
            else:
                route = await self.compat.route(ex.compat)
        ex.route = route
        limit = ex.timeout  # the request's own time limit bounds connects to a busy sandbox (see connect)
        pool_limit = self.request_timeouts.get(route.pool)
        if pool_limit is not None and (not limit or pool_limit < limit):
            limit = pool_limit
        try:
            return await self.connect(route, fresh, limit)
        except UpstreamConnectError:
            if keyed is not None:
                # Nothing is re-created for a key: forget the route, let the provider say whether the
                # sandbox is gone (its next request through a session re-creates it).
                resolver.invalidate(route.sandbox_id)
                await resolver.unreachable(route)
                raise
            if identity is None:
                self.compat.forget(ex.compat)
                raise
            await resolver.unreachable(route)  # forgets the route; a sandbox gone is re-created by resolve
            again = await resolver.resolve(identity)
            if again.endpoint == route.endpoint:
                raise
            ex.route = again
            return await self.connect(again, fresh, limit)

    def admit_keyed(self, ex: Exchange, route: Route) -> None:
        """A keyed request counts against its sandbox owner's limits (the token carries no identity):
        the request rate, and a stream slot for a declared stream (released by :meth:`finished`)."""
        admission = self.admission
        stream = ex.websocket or (admission.caps_streams and declares_stream(ex.headers))
        try:
            ex.stream_key = admission.admit_key(limit_key(route.owner), stream)
        except CapacityExceeded as exc:
            ex.refused = exc.scope
            raise

    async def connect(self, route: Route, fresh: bool, limit: float = 0.0) -> UpstreamConnection:
        """A pooled connection, or a new one (retrying refused connects with exponential backoff).

        A Unix socket whose listen backlog is full fails a connect at once with EAGAIN, where TCP would
        retry its SYN inside the connect timeout: the sandbox is alive and busy (a first-use burst).
        Those connects are retried, the backoff capped at ``EAGAIN_BACKOFF_CAP``, until the request's
        own time limit (``limit``, X-Sandbox-Timeout or the pool's request_timeout) or, without one,
        ``upstream_connect_timeout`` has passed since the first attempt; they do not use up
        ``upstream_connect_retries``, which count the other failures (refused, timed out)."""
        pool = self._pool(route)
        if not fresh:
            conn = pool.take()
            if conn is not None:
                return conn
        options = self.options
        endpoint = route.endpoint
        factory = functools.partial(UpstreamConnection, self, pool)
        ssl = True if endpoint.scheme == "https" else None
        delay = options.upstream_connect_backoff
        failures = options.upstream_connect_retries + 1
        busy_until = self.loop.time() + max(limit, options.upstream_connect_timeout)
        busy_delay = 0.005
        reason = ""
        while True:
            try:
                async with asyncio.timeout(options.upstream_connect_timeout):
                    if endpoint.unix is not None:
                        _, conn = await self.loop.create_unix_connection(
                            factory, sock=_unix_connected(endpoint.unix), ssl=ssl,
                            server_hostname=endpoint.host if ssl else None)
                    else:
                        _, conn = await self.loop.create_connection(factory, endpoint.host, endpoint.port, ssl=ssl)
                return conn
            except TimeoutError:
                reason = f"connect timed out after {options.upstream_connect_timeout:g}s"
            except BlockingIOError as exc:  # EAGAIN: a full backlog (Unix sockets)
                reason = (exc.strerror or "Resource temporarily unavailable") + " (its listen backlog stayed full)"
                if self.loop.time() + busy_delay < busy_until:
                    await asyncio.sleep(busy_delay)
                    busy_delay = min(busy_delay * 2, EAGAIN_BACKOFF_CAP)
                    continue
                break
            except OSError as exc:
                reason = exc.strerror or type(exc).__name__
            failures -= 1
            if failures <= 0:
                break
            await asyncio.sleep(delay)
            delay *= 2
        where = "its Unix socket" if endpoint.unix else f"{endpoint.host}:{endpoint.port}"
        raise UpstreamConnectError(
            f"sandbox {route.sandbox_id} is unreachable at {where}: {reason}",
            sandbox_id=route.sandbox_id)

    # -- the clock ------------------------------------------------------------
    # Each connection sits in one bucket of a wheel keyed by tick (PlaneState.watch): the earliest moment
    # any of its deadlines may fall (its request head's, its keep-alive's, its request's). A tick looks only
    # at the buckets that are due, and each connection there is checked against what it is doing then, and
    # put back at its next such moment. What moves a deadline later (a byte read, a request finished) only
    # writes a time: the check finds it later than it was. What makes one sooner puts the connection in an
    # earlier bucket at once: a connection opened, a head that did not arrive in one read, a request begun
    # (only when its bucket is later than the request's first deadline could be), a request deadline, a
    # lingering close. So the tick costs what is due, not a pass over every connection (1.2-2.8 ms per
    # pass at 4,000 connections, every 0.5 s, before).
    def _tick(self) -> None:
        self.now = self.loop.time()
        try:
            self._check_deadlines(self.now)
            if self.slow_heads and not self.waking:
                ready = self.ready_heads.ready(self.slow_heads, READY_SLICE)
                if ready:  # from the next loop turn on (uvloop runs timers before I/O, ready callbacks after)
                    self.waking = True
                    self.loop.call_soon(self.wake_slow_heads, ready, 0, [], [])
        except Exception:
            log.exception("data plane housekeeping failed")
        finally:
            if not self.closed:
                self._timer = self.loop.call_later(self.tick_len, self._tick)

    @property
    def long_request_after(self) -> float:
        return self._long_request_after

    @long_request_after.setter
    def long_request_after(self, seconds: float) -> None:
        """Settable (tests scale it down on a running plane): requests begun from now on are timed by it."""
        self._long_request_after = seconds
        if getattr(self, "loop", None) is not None:  # started
            self._move_begin_tick(self.now)

    def _move_begin_tick(self, now: float) -> None:
        """``begin_tick``: the bucket by which a request begun from ``now`` on must be looked at, the soonest
        its own deadlines (not X-Sandbox-Timeout's) can fall after it begins."""
        options = self.options
        horizon = min(self.long_request_after, options.stream_idle_timeout, options.upstream_read_timeout or _INF)
        self.begin_tick = int((now + horizon) / self.tick_len) + 1

    def _check_deadlines(self, now: float) -> None:
        """Timeouts (request heads, upstream answers, idle streams), long-request promotion and idle clients
        for the connections whose bucket is due (looked at in slices: :meth:`_check_slice`); idle pools; a
        few times a second."""
        due = int(now / self.tick_len)
        self._move_begin_tick(now)
        wheel = self.wheel
        pending = self.due_buckets
        while self.wheel_at < due:
            self.wheel_at += 1
            bucket = wheel.pop(self.wheel_at, None)
            if bucket is not None:
                pending.append((self.wheel_at, bucket))
        if pending and not self.checking:
            self._check_slice()
        keepalive = self.options.upstream_keepalive_timeout
        for pool in self.pools.values():
            if pool.idle:
                pool.expire(now - keepalive)

    def _check_slice(self) -> None:
        """Check up to CHECK_SLICE connections of the due buckets, and the rest a slice every SLICE_EVERY.
        Connections opened together share a bucket: a slowloris's 4,000 were all checked in one loop turn
        (held, or found overdue: 3-20 ms of CPU, every tick while they dribbled), and every other
        connection on the loop waited for it (issue 28). A bucket once due takes no new entries (``enter``
        files from the next tick on), and a connection refiled or lost meanwhile is skipped as stale. The
        pass's overdue heads are logged and closed once it is over (their slots are free when marked)."""
        self.checking = False
        if self.closed:
            return
        now = self.now = self.loop.time()
        perf_now = perf_counter()  # Exchange.t0 is on the perf_counter clock
        pending = self.due_buckets
        overdue = self.overdue
        budget = CHECK_SLICE
        while pending and budget:
            tick, bucket = pending[0]
            at, end = self.due_at, len(bucket)
            while at < end and budget:
                client = bucket[at]
                at += 1
                if client.watch_tick == tick:  # else a stale entry: it is in another bucket, or gone
                    client.watch_tick = NEVER
                    budget -= 1
                    try:
                        self._check_client(client, now, perf_now, overdue)
                    except Exception:  # one connection's failure must not leave the others unwatched
                        log.exception("data plane housekeeping failed for a client connection")
                        self.watch(client, now)  # looked at again next tick
            if at < end:
                self.due_at = at
            else:
                pending.popleft()
                self.due_at = 0
        if pending:
            self.checking = True
            self.loop.call_later(SLICE_EVERY, self._check_slice)
        elif overdue:
            self.overdue = []
            self.heads_overdue += len(overdue)
            if self.on_heads_overdue is not None:
                self.on_heads_overdue(len(overdue))
            log.info("closing %d client connection(s): no complete request head within %gs", len(overdue),
                     self.options.header_read_timeout)
            self.close_slices(overdue)

    def _check_client(self, client: DownstreamConnection, now: float, perf_now: float,
                      overdue: list[DownstreamConnection]) -> None:
        """What is due of one connection; then into the bucket of its next deadline (none once closing)."""
        ex = client.current
        if ex is None:
            self._check_waiting_client(client, now, overdue)
        elif not self._timed_out(client, ex, now) and not ex.stream and ex.state != DONE and (
                perf_now - ex.t0 > self.long_request_after):
            self.stream_began(ex)
        if client.mode & M_CLOSING and not client.linger_until:
            return
        self.watch(client, self._next_check(client, now, perf_now))

    def _next_check(self, client: DownstreamConnection, now: float, perf_now: float) -> float:
        """The earliest any deadline of ``client`` can fall, from what it is doing now (a deadline that may
        move later is taken at its earliest: the check then finds it moved and puts the client back)."""
        if client.linger_until:
            return client.linger_until
        options = self.options
        ex = client.current
        if ex is None:
            if client.parsing is None and client.last is not None:  # between requests (keep-alive)
                return client.idle_since + self.client_keepalive_timeout
            begun = client.head_began()
            if client.mode & M_IN_HEAD and not client.rpause & PAUSE_SLOW_HEAD and now - begun <= SLOW_HEAD_AFTER:
                return begun + SLOW_HEAD_AFTER  # to hold it if it is still incomplete then
            return begun + client.head_timeout
        due = ex.active_at + min(options.stream_idle_timeout, options.upstream_read_timeout or _INF)
        if ex.deadline:
            due = min(due, ex.deadline)
        if not ex.stream:
            due = min(due, now + self.long_request_after - (perf_now - ex.t0))
        return due

    def _check_waiting_client(self, client: DownstreamConnection, now: float,
                              overdue: list[DownstreamConnection]) -> None:
        """A client with no request being served: a lingering close that is over, a head that dawdles
        (slowloris: added to ``overdue``), or a keep-alive connection idle past client_keepalive_timeout."""
        if client.linger_until:
            if now > client.linger_until:
                client.close()
        elif client.parsing is not None or client.last is None:  # a head on its way (or not yet begun)
            if client.head_overdue(now, client.head_timeout):
                overdue.append(client)
            elif client.slow_head():  # held before its next line: a burst of them is then read in slices
                client.hold_slow_head()
        elif now - client.idle_since > self.client_keepalive_timeout:
            client.close_if_idle()

    def close_slices(self, clients: list[DownstreamConnection], start: int = 0) -> None:
        """Close ``clients[start:]``, a slice every SLICE_EVERY: connections opened together reach their head
        deadline in the same tick, and thousands of closes in one turn would stall every other connection
        (and the gRPC front, on the same loop) for tens of milliseconds."""
        end = start + SLICE
        for client in clients[start:end]:
            client.close()
        if len(clients) > end:
            self.loop.call_later(SLICE_EVERY, self.close_slices, clients, end)

    def wake_slow_heads(self, todo: list[DownstreamConnection], start: int, woken: list[DownstreamConnection],
                        before: list[DownstreamConnection]) -> None:
        """Read the slow heads a tick found bytes waiting on (DownstreamConnection.hold_slow_head), a slice
        every SLICE_EVERY: wake ``todo[start:start + SLICE]``, and hold again those woken two slices ago
        (``before``) that read nothing since (a loop turn is enough for uvloop, asyncio needs two). A head
        completed meanwhile is not held again. One pass at a time: a tick finds the heads still ready when
        it is over (``waking`` is set again only once this slice has run, so a failure cannot leave it set)."""
        self.waking = False
        for client in before:
            if client.slow_head():
                client.hold_slow_head()
        held = self.slow_heads
        batch = todo[start:start + SLICE]
        for client in batch:
            if client in held:
                del held[client]
                self.heads_woken += 1
                client.resume(PAUSE_SLOW_HEAD)
        if batch or woken:
            self.waking = True
            self.loop.call_later(SLICE_EVERY, self.wake_slow_heads, todo, start + SLICE, batch, woken)
        elif len(todo) >= READY_SLICE and held and not self.closed:  # the kernel may have more ready: the next
            more = self.ready_heads.ready(held, READY_SLICE)
            if more:
                self.waking = True
                self.loop.call_later(SLICE_EVERY, self.wake_slow_heads, more, 0, [], [])

    def _timed_out(self, client: DownstreamConnection, ex: Exchange, now: float) -> bool:
        """True when ``ex`` was ended for taking too long: its response head past its deadline or
        upstream_read_timeout, its body stalled, its stream idle past stream_idle_timeout."""
        state = ex.state
        idle_timeout = self.options.stream_idle_timeout
        if state == BODY or state == TUNNEL:
            if now - ex.active_at > idle_timeout:
                client.idled_out(ex)
                return True
            return False
        if state != WAITING:
            return False
        if ex.deadline and now > ex.deadline:
            client.timed_out(ex, True)
            return True
        up = ex.upstream
        if up is None or up.rpaused:
            return False
        if not ex.req_done:
            # The body is still coming: idle while the sandbox reads it means the client stopped
            # sending (with the sandbox not reading, the client is paused: not its fault).
            if not client.rpause & PAUSE_UPSTREAM and now - ex.active_at > idle_timeout:
                client.body_stalled(ex)
                return True
            return False
        read_timeout = self.options.upstream_read_timeout
        if read_timeout is not None and now - ex.active_at > read_timeout:
            client.timed_out(ex, False)
            return True
        return False

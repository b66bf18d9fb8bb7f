"""GrpcFront: the listener on :50051 and the per-connection handler that starts calls."""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import os
import secrets
import socket
import ssl
import time
from typing import Any

from gateway.auth import Authenticator, TrustedHeaders
from gateway.gate import ConnectionGate
from gateway.grpcfront.call import Call
from gateway.grpcfront.connection import Connection
from gateway.grpcfront.frames import ENHANCE_YOUR_CALM, ERROR_NAMES, NO_ERROR
from gateway.grpcfront.host import CallHost
from gateway.grpcfront.keeper import Keeper, Timing
from gateway.grpcfront.metrics import GrpcMetrics
from gateway.grpcfront.stream import Stream
from gateway.grpcfront.upstream import UpstreamChannels, grpc_target
from gateway.limits import OrgLimits
from gateway.model import Route
from gateway.proxy import RequestLog
from gateway.proxy._admission import Admission, Credentials
from gateway.sessions import SessionRouter
from gateway.settings import Settings
from routing import Identity

log = logging.getLogger("gateway.grpc")


# How long a finished call's metrics and access line may wait for the next call to be sent (GrpcFront.finished)
ACCOUNT_WITHIN = 0.1
TARGETS_REMEMBERED = 1024  # routes whose gRPC target the front keeps (GrpcFront.target); more and it starts over


def call_log(call: Call, request_id: str, duration: float) -> RequestLog:
    """The access-log entry for one call (the data plane's record; ``status`` is the gRPC code)."""
    route = call.route
    return RequestLog(
        "POST", route.pool if route is not None else None, route.sandbox_id if route is not None else None,
        call.status, duration, call.to_sandbox, call.to_client, "grpc", request_id, call.error,
        org_id=call.org_id, refused=call.refused,
        target=call.path,  # passed Call's check (two slashes, no space); the log escapes it
        session_id=call.identity.session_id if call.identity is not None else None, upstream=call.upstream,
        code=call.code, trace_id=call.trace.trace_id if call.trace is not None else None)


class _ServerSide:
    """One client connection's handler: starts a Call per stream; the admission's identity memo (the last
    credentials it checked, as a keep-alive HTTP/1.1 connection's).

    Each call keeps its own identity (``Call.identity``): calls on one connection may carry different ones.
    """

    def __init__(self, front: GrpcFront) -> None:
        self.front = front
        self.client: str | None = None  # the address the front's gate counted this connection under
        self.connection: Connection | None = None
        self.ident_key: Credentials | None = None
        self.ident: Identity | None = None
        self.heads: dict[int, Any] = {}  # heads as read, by the decoded head's id (Call._admit)
        self.owned: Route | None = None  # the route cache's last answer for owned_by (cached_route's memo, Call._start)
        self.owned_by: Identity | None = None

    def connection_made(self, connection: Connection) -> None:
        front = self.front
        client = connection.peer_host
        bound = front.gate.admit(client, self)
        if bound is not None:  # past a listener bound: refused at once (gateway/gate.py)
            front.closed_by_policy(bound)
            connection.close(ENHANCE_YOUR_CALM, front.gate.refusal(bound))
            return
        self.client = client
        self.connection = connection
        front.connections.add(connection)
        connection.keeper = Keeper(connection, front.timing, front.closed_by_policy)

    def accept(self, stream: Stream) -> None:
        self.front.begin(Call(self.front, self, stream))

    def connection_lost(self, connection: Connection) -> None:
        self.front.connections.discard(connection)  # its streams' calls were told through their owners
        if self.client is not None:
            self.front.gate.release(self.client, self)
            self.client = None
        self.connection = None

    # -- gateway/gate.py's Sheddable: a full listener may close this connection to admit another --
    def sheddable(self) -> bool:
        """No call open (before the preface, or between calls)."""
        conn = self.connection
        return conn is not None and not conn.streams and not conn.closed

    def shed(self) -> None:
        conn = self.connection
        assert conn is not None  # sheddable() said so
        self.front.closed_by_policy("shed")
        conn.close(NO_ERROR, "the port is full: an idle connection of the address holding the most is closed "
                             "to admit another (max_connections); reconnect")

    def connection_failed(self, code: int) -> None:
        self.front.connection_failed("client", code)

    def malformed(self, problem: str) -> None:
        log.debug("a malformed request head, reset PROTOCOL_ERROR: %s", problem)
        if self.front.metrics is not None:
            self.front.metrics.malformed_requests.inc()


class GrpcFront(CallHost):
    """Forwards any gRPC call to the caller's sandbox; see the package docstring."""

    def __init__(self, router: SessionRouter, settings: Settings, *, authenticator: Authenticator = TrustedHeaders(),
                 limits: OrgLimits | None = None, metrics: GrpcMetrics | None = None, access: Any = None,
                 admission: Admission | None = None, gate: ConnectionGate | None = None, tracer: Any = None) -> None:
        self.router = router
        self.tracer = tracer  # a gateway.tracing.Tracer, or None: tracing off
        self.settings = settings
        # Who, may they: the data plane's own admission (app.py), so identity, credentials, org limits and
        # header hygiene are one set of rules for HTTP and gRPC; its own only where none is given.
        if admission is None:
            limits = limits if limits is not None else OrgLimits.from_settings(settings)
            admission = Admission(authenticator, limits, router.cached_route)
        self.admission = admission
        self.authenticator = admission.authenticator
        self.limits = admission.limits
        self.metrics = metrics
        if metrics is not None:
            metrics.unobserved = self.account  # a scrape counts the calls that have ended (finished)
        self.access = access  # a gateway.logs.AccessLog, or None
        self.timing = Timing.from_settings(settings)
        self.gate = gate if gate is not None else ConnectionGate("grpc")  # unbounded unless given one
        self.channels = UpstreamChannels(connect_timeout=settings.upstream_connect_timeout,
                                         on_failure=functools.partial(self.connection_failed, "sandbox"))
        self.calls: set[Call] = set()
        self.sandbox_heads: dict[tuple[Any, ...], tuple[tuple[bytes, bytes], ...]] = {}  # head.sandbox_head
        self.targets: dict[int, tuple[Route, Any]] = {}  # see target
        router.view.subscribe(self._policy_replaced)
        self.connections: set[Connection] = set()
        self.address: tuple[str, int] | None = None
        self._server: asyncio.Server | None = None
        self._draining = False
        self._idle: asyncio.Future[None] | None = None  # while stopping: resolved as the last call ends
        self._ids = itertools.count(1)
        self.unaccounted: list[tuple[Call, float]] = []  # finished calls, and their durations: see finished
        self._account_timer: asyncio.TimerHandle | None = None
        self._id_prefix = f"g{secrets.token_hex(4)}{os.getpid():x}-"

    async def start(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        tls = self._tls()
        self._server = await loop.create_server(
            self._protocol, sock=sock, backlog=2048, ssl=tls,
            ssl_handshake_timeout=self.timing.handshake_timeout if tls is not None else None)
        self.address = sock.getsockname()[:2]

    def _tls(self) -> ssl.SSLContext | None:
        """TLS with ALPN h2 when a certificate is configured; h2c (prior knowledge) otherwise."""
        cert, key = self.settings.grpc_tls_cert_file, self.settings.grpc_tls_key_file
        if cert is None or key is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(cert, key)
        context.set_alpn_protocols(["h2"])
        return context

    def _protocol(self) -> Connection:
        # pause_reading: a client that floods PINGs or SETTINGS and reads nothing stops being read
        return Connection(_ServerSide(self), client_side=False, pause_reading=True,
                          window=self.settings.grpc_connection_window)

    def begin(self, call: Call) -> None:
        if self._draining:
            call.side = "stopping"
        self.calls.add(call)
        call.down.conn.soon(call.start)  # once the frames read with the head are handled (its DATA)
        if self.metrics is not None:  # after: with workers, the fold it queues (which accounts) runs after start
            self.metrics.started()

    def target(self, route: Route) -> Any:
        """Where ``route``'s sandbox answers gRPC (``upstream.grpc_target``), remembered by the route's identity (a
        route is immutable and the entry holds it, so its ``id`` names nothing else meanwhile) until the policy is
        replaced: ``Call._routed`` finds it with one dict lookup, not a policy lookup and an endpoint property (two
        interpreted Python frames per call, before its request could go out)."""
        targets = self.targets
        if len(targets) >= TARGETS_REMEMBERED:
            targets.clear()
        target = grpc_target(route, self.router.view.pool(route.pool))
        targets[id(route)] = (route, target)
        return target

    def _policy_replaced(self, view: Any) -> None:
        """A hot reload may move a pool's ``grpc_port``: every remembered target is found again."""
        self.targets.clear()

    async def _calls_ended(self, timeout: float) -> None:
        """Until no call is left (each ends in ``finished``), or ``timeout``."""
        if self.calls:
            self._idle = asyncio.get_running_loop().create_future()
            await asyncio.wait([self._idle], timeout=timeout)

    def connection_failed(self, peer: str, code: int) -> None:
        if self.metrics is not None:
            self.metrics.connection_errors.labels(peer, ERROR_NAMES.get(code, hex(code))).inc()

    def closed_by_policy(self, reason: str) -> None:
        """A client connection ended by a time bound (keeper.py) or refused by a count bound."""
        if self.metrics is not None:
            self.metrics.closed(reason)

    def finished(self, call: Call) -> None:
        """``call`` has ended. Its metrics and access line (about a tenth of a unary call's instructions) are
        left for :meth:`account`, which the next call runs once it has sent its request (``Call.start``), or a
        timer within ``ACCOUNT_WITHIN``: at one call in flight the client's next request is already waiting when
        the answer has been written, so whatever runs between that write and the next read adds to every call's
        latency, while the sandbox's time to answer is idle time for the gateway."""
        calls = self.calls
        calls.discard(call)
        if not calls and self._idle is not None and not self._idle.done():
            self._idle.set_result(None)
        if self.metrics is None and self.access is None:
            return
        self.unaccounted.append((call, time.perf_counter() - call.t0))
        if self._account_timer is None:
            self._account_timer = call.down.conn.loop.call_later(ACCOUNT_WITHIN, self._account_late)

    def _account_late(self) -> None:
        self._account_timer = None
        self.account()

    def account(self) -> None:
        """The metrics and access lines of the calls that have ended (``finished``), now."""
        unaccounted, self.unaccounted = self.unaccounted, []
        metrics = self.metrics
        access = self.access
        for call, duration in unaccounted:
            if metrics is not None:
                metrics.observe(call.path, call.status, duration, call.to_sandbox, call.to_client)
            if access is not None:
                access.log(call_log(call, f"{self._id_prefix}{next(self._ids):x}", duration))

    async def stop(self, drain_timeout: float) -> None:
        """Stop accepting, tell clients to go elsewhere (GOAWAY), let calls finish (up to ``drain_timeout``),
        then end the rest with UNAVAILABLE."""
        if self._server is None:
            return
        self._draining = True
        self._server.close()
        for connection in list(self.connections):
            connection.shut_down("gateway stopping")
        await self._calls_ended(drain_timeout)
        for call in list(self.calls):
            call.stop()
        await self._calls_ended(2.0)
        for connection in list(self.connections):
            connection.close(message="gateway stopping")
        self.channels.close()
        await self._server.wait_closed()
        self._server = None
        self.account()


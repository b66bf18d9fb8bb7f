"""HTTP/2 connections to sandboxes' gRPC servers: multiplexed, as few per target as its stream limit allows.

A gRPC server takes many concurrent streams on one connection, so the front
opens a stream per call on a connection it keeps per (host, port). The calls
of every client of a sandbox share it, where direct each client would have a
connection of its own: so when one is at the server's
SETTINGS_MAX_CONCURRENT_STREAMS (grpclib's and h2's default is 100), the next
call opens another rather than wait, and the limit never caps what clients may
run together. A new connection is used only once the server's SETTINGS have
arrived (a burst of calls must not overrun a limit not yet known); one that is
lost is forgotten at once. Connecting is bounded by
``upstream_connect_timeout`` and failures become ``UpstreamConnectError``
(UNAVAILABLE at the client).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from gateway.errors import UpstreamConnectError
from gateway.grpcfront.connection import Connection

if TYPE_CHECKING:
    from gateway.model import Route
    from routing.policy import PoolSpec

log = logging.getLogger("gateway.grpc")

Target = tuple[str, int | None]  # (host, port), or (Unix socket path, None)


def grpc_target(route: Route, pool: PoolSpec | None) -> Target:
    """Where the sandbox behind ``route`` answers gRPC: its endpoint's host, its pool's ``grpc_port``;
    a confined local sandbox, its gRPC socket beside its HTTP one (``Endpoint.grpc_unix``).

    The one place that picks the address, always from the provider's endpoint.
    """
    endpoint = route.endpoint
    if endpoint.grpc_unix is not None:
        return endpoint.grpc_unix, None
    return endpoint.host, pool.grpc_port if pool is not None else 50051


class _ClientSide:
    """The handler of a connection to a sandbox: a sandbox opens no streams (the connection refuses them)."""

    __slots__ = ("channels", "target")

    def __init__(self, channels: UpstreamChannels, target: Target) -> None:
        self.channels = channels
        self.target = target

    def connection_made(self, connection: Connection) -> None:
        pass

    def accept(self, stream: object) -> None:
        raise AssertionError("a client-side connection accepts no streams")

    def connection_lost(self, connection: Connection) -> None:
        # its streams' calls were told through their owners; it is forgotten at once, so that what is kept
        # is bounded by the sandboxes in use, not by every sandbox ever called
        self.channels.forget(self.target, connection)

    def connection_failed(self, code: int) -> None:
        if self.channels.on_failure is not None:
            self.channels.on_failure(code)


class UpstreamChannels:
    """Client HTTP/2 connections to sandboxes, keyed by target."""

    def __init__(self, *, connect_timeout: float, on_failure: Callable[[int], None] | None = None) -> None:
        self._connect_timeout = connect_timeout
        self.on_failure = on_failure  # told the code of each connection a sandbox ends by breaking the protocol
        self._connections: dict[Target, list[Connection]] = {}
        self._connecting: dict[Target, asyncio.Task[Connection]] = {}

    def __len__(self) -> int:
        """Connections kept, to every target."""
        return sum(len(connections) for connections in self._connections.values())

    async def connection(self, target: Target) -> Connection:
        """A connection to ``target`` with a free stream slot (returned without yielding once it is found:
        the caller's ``open_stream`` takes the slot before any other call can)."""
        while True:
            ready = self.ready(target)
            if ready is not None:
                return ready
            attempt = self._connecting.get(target)
            if attempt is None:  # calls that find no slot meanwhile share one connection attempt, a task of
                # its own: a caller cancelled while it connects (its client left) does not fail the others
                attempt = self._connecting[target] = asyncio.ensure_future(self._add(target))
                attempt.add_done_callback(functools.partial(self._attempted, target))
            connection = await asyncio.shield(attempt)
            if connection.has_slot:
                return connection
            if connection.usable and connection.peer_max_streams:
                continue  # taken by the calls that waited with us: the next attempt adds a connection
            # A connection just settled that takes no stream at all: the sandbox allows none, sent GOAWAY
            # or closed it. Looping would open connection after connection (thousands a second) for as
            # long as the client waits: the call fails instead, and that connection is closed.
            connection.close(message="no stream allowed")
            raise UpstreamConnectError(f"the sandbox's gRPC server at {_where(target)} takes no new streams ("
                                       f"{_refusal(connection)})")

    def ready(self, target: Target) -> Connection | None:
        """A connection to ``target`` with a free stream slot now, or None (then :meth:`connection` makes one)."""
        connections = self._connections.get(target)
        if connections:
            for connection in connections:
                if connection.has_slot:
                    return connection
        return None

    async def _add(self, target: Target) -> Connection:
        connection = await self._connect(target)
        if not connection.closed:
            self._connections.setdefault(target, []).append(connection)
        return connection

    def _attempted(self, target: Target, attempt: asyncio.Task[Connection]) -> None:
        if self._connecting.get(target) is attempt:
            del self._connecting[target]
        if not attempt.cancelled():
            attempt.exception()  # retrieved: a failure whose callers have all left must not warn

    def forget(self, target: Target, connection: Connection) -> None:
        connections = self._connections.get(target)
        if connections is not None and connection in connections:
            connections.remove(connection)
            if not connections:
                del self._connections[target]

    async def _connect(self, target: Target) -> Connection:
        host, port = target
        where = _where(target)
        loop = asyncio.get_running_loop()
        # A partial, not a nested function: compiled, a nested function holds this coroutine's locals, which
        # hold it: a cycle per connection made, left to the cyclic GC (tests/test_no_cycles.py).
        protocol_factory = functools.partial(self._protocol, target)
        connection: Connection | None = None
        try:
            async with asyncio.timeout(self._connect_timeout):
                if port is None:
                    _, connection = await loop.create_unix_connection(protocol_factory, host)
                else:
                    _, connection = await loop.create_connection(protocol_factory, host, port)
                await connection.settled()
        except BaseException as exc:
            # connected but never settled (no SETTINGS in time, or the caller was cancelled): nobody will
            # use it, so it is closed here; else every call to a silent sandbox would leave a socket open
            if connection is not None:
                connection.close(message="no SETTINGS in time")
            if isinstance(exc, TimeoutError):
                raise UpstreamConnectError(
                    f"the sandbox's gRPC server at {where} did not accept a connection within "
                    f"{self._connect_timeout:g}s") from None
            if isinstance(exc, OSError):
                raise UpstreamConnectError(
                    f"the sandbox's gRPC server at {where} is unreachable: {exc.strerror or exc}") from None
            raise
        return connection

    def _protocol(self, target: Target) -> Connection:
        return Connection(_ClientSide(self, target), client_side=True)

    def close(self) -> None:
        for attempt in list(self._connecting.values()):
            attempt.cancel()  # its connection, if made, is closed as it is cancelled (_connect)
        for connections in list(self._connections.values()):
            for connection in list(connections):
                connection.close(message="gateway stopping")
        self._connections.clear()


def _where(target: Target) -> str:
    host, port = target
    return f"{host}:{port}" if port is not None else f"unix:{host}"


def _refusal(connection: Connection) -> str:
    """Why a connection that just settled takes no stream, as the sandbox's server made it so."""
    if connection.goaway_received:
        return "it sent GOAWAY"
    if connection.closed:
        return "it closed the connection"
    return f"its SETTINGS_MAX_CONCURRENT_STREAMS is {connection.peer_max_streams}"

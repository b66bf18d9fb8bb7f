"""HTTP/2 connections to sandboxes' gRPC servers: one multiplexed connection per target.

A gRPC server takes many concurrent streams on one connection, so the front
keeps one client connection per (host, port) and opens a stream on it per call;
a connection that was lost is replaced on the next call. Connecting is bounded
by ``upstream_connect_timeout`` and failures become ``UpstreamConnectError``
(UNAVAILABLE at the client).
"""

from __future__ import annotations

import asyncio
import logging
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

    def accept(self, stream: object) -> None:
        raise AssertionError("a client-side connection accepts no streams")

    def connection_lost(self, connection: Connection) -> None:
        pass  # its streams' calls were told through their owners; the next call connects anew


class UpstreamChannels:
    """Client HTTP/2 connections to sandboxes, keyed by target."""

    def __init__(self, *, connect_timeout: float) -> None:
        self._connect_timeout = connect_timeout
        self._connections: dict[Target, Connection] = {}
        self._connecting: dict[Target, asyncio.Future[Connection]] = {}

    async def connection(self, target: Target) -> Connection:
        connection = self._connections.get(target)
        if connection is not None and connection.usable:
            return connection
        pending = self._connecting.get(target)
        if pending is not None:  # concurrent first calls share one connection attempt
            return await asyncio.shield(pending)
        future: asyncio.Future[Connection] = asyncio.get_running_loop().create_future()
        self._connecting[target] = future
        try:
            connection = await self._connect(target)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: a failure nobody else waited for must not warn
            raise
        finally:
            del self._connecting[target]
        future.set_result(connection)
        self._connections[target] = connection
        return connection

    async def _connect(self, target: Target) -> Connection:
        host, port = target
        where = f"{host}:{port}" if port is not None else f"unix:{host}"
        loop = asyncio.get_running_loop()

        def protocol_factory() -> Connection:
            return Connection(_ClientSide(), client_side=True)

        try:
            async with asyncio.timeout(self._connect_timeout):
                if port is None:
                    _, connection = await loop.create_unix_connection(protocol_factory, host)
                else:
                    _, connection = await loop.create_connection(protocol_factory, host, port)
        except TimeoutError:
            raise UpstreamConnectError(
                f"the sandbox's gRPC server at {where} did not accept a connection within "
                f"{self._connect_timeout:g}s") from None
        except OSError as exc:
            raise UpstreamConnectError(
                f"the sandbox's gRPC server at {where} is unreachable: {exc.strerror or exc}") from None
        return connection

    def close(self) -> None:
        for connection in self._connections.values():
            connection.close(message="gateway stopping")
        self._connections.clear()

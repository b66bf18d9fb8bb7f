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

from grpclib.config import Configuration
from grpclib.protocol import AbstractHandler, H2Protocol, Stream
from h2.config import H2Configuration

from gateway.errors import UpstreamConnectError
from gateway.grpcfront.wire import BatchingProtocol

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


class _ClientSide(AbstractHandler):
    """The client end of a connection never accepts streams; it only notes that it was lost."""

    def __init__(self) -> None:
        self.lost = False

    def accept(self, stream: Stream, headers: object, release_stream: object) -> None:
        raise NotImplementedError("a sandbox cannot open streams towards the gateway")

    def cancel(self, stream: Stream) -> None:
        wrapper = stream.wrapper
        if wrapper is not None and hasattr(wrapper, "upstream_reset"):
            wrapper.upstream_reset()

    def close(self) -> None:
        self.lost = True


class UpstreamChannels:
    """Client HTTP/2 connections to sandboxes, keyed by target."""

    def __init__(self, *, connect_timeout: float) -> None:
        self._connect_timeout = connect_timeout
        self._connections: dict[Target, H2Protocol] = {}
        self._connecting: dict[Target, asyncio.Future[H2Protocol]] = {}
        # header_encoding=None: the sandbox's headers and trailers stay bytes, forwarded as received
        self._h2 = H2Configuration(client_side=True, header_encoding=None, validate_inbound_headers=False,
                                   validate_outbound_headers=False, normalize_inbound_headers=False,
                                   normalize_outbound_headers=False)
        self._config = Configuration().__for_client__()

    async def connection(self, target: Target) -> H2Protocol:
        protocol = self._connections.get(target)
        if protocol is not None and not protocol.handler.lost:  # type: ignore[attr-defined]
            return protocol
        pending = self._connecting.get(target)
        if pending is not None:  # concurrent first calls share one connection attempt
            return await asyncio.shield(pending)
        future: asyncio.Future[H2Protocol] = asyncio.get_running_loop().create_future()
        self._connecting[target] = future
        try:
            protocol = await self._connect(target)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: a failure nobody else waited for must not warn
            raise
        finally:
            del self._connecting[target]
        future.set_result(protocol)
        self._connections[target] = protocol
        return protocol

    async def _connect(self, target: Target) -> H2Protocol:
        host, port = target
        where = f"{host}:{port}" if port is not None else f"unix:{host}"
        loop = asyncio.get_running_loop()

        def protocol_factory() -> H2Protocol:
            return BatchingProtocol(_ClientSide(), self._config, self._h2)

        try:
            async with asyncio.timeout(self._connect_timeout):
                if port is None:
                    _, protocol = await loop.create_unix_connection(protocol_factory, host)
                else:
                    _, protocol = await loop.create_connection(protocol_factory, host, port)
        except TimeoutError:
            raise UpstreamConnectError(
                f"the sandbox's gRPC server at {where} did not accept a connection within "
                f"{self._connect_timeout:g}s") from None
        except OSError as exc:
            raise UpstreamConnectError(
                f"the sandbox's gRPC server at {where} is unreachable: {exc.strerror or exc}") from None
        return protocol

    def close(self) -> None:
        for protocol in self._connections.values():
            protocol.processor.close("gateway stopping")
        self._connections.clear()

"""What the data plane needs from the layers around it, as Protocols it owns: the session layer's routes
(``RouteResolver``) and agent-sandbox's router headers (``RouterHeaders``, with its null object). Apart from
``_plane`` so that the wiring stays one module's size; nothing here is on the hot path but the calls themselves."""

from __future__ import annotations

from typing import Any, Protocol

from gateway.errors import NotFound
from gateway.model import Route
from routing import Identity


class RouteResolver(Protocol):
    """What the data plane needs from the session layer (``SessionRouter`` satisfies it)."""

    def cached_route(self, identity: Identity, owned: Route | None = None) -> Route | None:
        """A synchronous answer from the resolver's cache, None on a miss; may raise a GatewayError
        just like ``resolve``. A hit is served without creating a task for the request. ``owned``: the
        route it returned last for this same ``identity`` object (a client connection's memo), whose
        owner check need not be repeated."""

    async def resolve(self, identity: Identity) -> Route: ...

    def cached_sandbox_route(self, sandbox_id: str, port: int, incarnation: str) -> Route | None:
        """The route to ``port`` of a sandbox by its ID from the cache (host and path keys), None on a
        miss; raises a GatewayError for a stale incarnation or a port its pool does not open."""

    async def route_for_sandbox(self, sandbox_id: str, port: int, incarnation: str) -> Route:
        """The same, resolved: never creates a sandbox (a suspended one wakes)."""

    def invalidate(self, key: str) -> None: ...

    async def unreachable(self, route: Route) -> None: ...

    def stream_opened(self, sandbox_id: str) -> None: ...

    def stream_closed(self, sandbox_id: str) -> None: ...


class RouterHeaders(Protocol):
    """agent-sandbox's router headers (``gateway.compat.RouterCompat`` satisfies it)."""

    def target(self, sandbox: bytes, namespace: bytes | None, port: bytes | None,
               authorization: bytes | None) -> Any:
        """Where the headers point (checked), or None when they are not honoured: route by identity."""

    async def route(self, target: Any) -> Route: ...

    def forget(self, target: Any) -> None: ...


class NoRouterHeaders:
    """The null object (router headers off, the default): the headers are dropped, the request routes by identity."""

    def target(self, sandbox: bytes, namespace: bytes | None, port: bytes | None,
               authorization: bytes | None) -> None:
        return None

    async def route(self, target: Any) -> Route:
        raise NotFound("router headers are not enabled")  # unreachable: target() never gives one

    def forget(self, target: Any) -> None:
        pass

"""The per-process route cache: what lets a request for a known session skip the store.

Two maps, both bounded (oldest first out) and both forgotten by the store's
invalidations on every replica: routes by session ID (identity-routed
requests, owner checked on each hit by :class:`RouteLookup`) and
routes by sandbox ID (host, path and token keyed requests, one per port asked
for). :class:`RouteCache` owns how entries come and go; :class:`RouteLookup` is the
hit path every identity-routed request takes (``SessionRouter.cached_route``),
compiled with the data plane (gateway/_compiled.py): it runs once per request.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from gateway.access import Refusal
from gateway.errors import Forbidden
from gateway.model import Route
from gateway.store.base import INVALIDATE_ALL
from routing.ports import PortSet

if TYPE_CHECKING:
    from routing import Identity


class CachedRoute:
    """A session's route in the cache (an extension type in the compiled build: :class:`RouteLookup` reads
    it with C loads)."""

    __slots__ = ("route", "fresh_until", "stale_until")

    def __init__(self, route: Route, fresh_until: float, stale_until: float) -> None:
        self.route = route
        self.fresh_until = fresh_until  # served from the cache until then
        self.stale_until = stale_until  # and, while the store is down, until then (stale-if-error)


@dataclass(slots=True)
class SandboxRoutes:
    """A sandbox's routes by port, for ``route_for_sandbox``: one per port asked for, made once."""

    route: Route           # at the runtime port
    incarnation: str
    ports: PortSet         # what the pool opens (gateway.policy.allowed_ports)
    fresh_until: float
    at_port: dict[int, Route] = field(default_factory=dict)

    def at(self, port: int) -> Route:
        route = self.at_port.get(port)
        if route is not None:
            return route
        if port not in self.ports:
            raise Forbidden(f"port {port} is not open on sandbox {self.route.sandbox_id}: pool {self.route.pool!r} "
                            f"opens {self.ports.describe()} (pools.{self.route.pool}.ports)", code=Refusal.PORT)
        endpoint = self.route.endpoint
        # Only the port varies: the host is always the provider's.
        route = self.route if port == endpoint.port else replace(self.route, endpoint=replace(endpoint, port=port))
        self.at_port[port] = route
        return route


class RouteCache:
    __slots__ = ("by_session", "by_sandbox", "_sessions_of", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.by_session: dict[str, CachedRoute] = {}
        self.by_sandbox: dict[str, SandboxRoutes] = {}
        self._sessions_of: dict[str, set[str]] = {}  # sandbox ID -> its cached sessions, to invalidate them

    def __len__(self) -> int:
        return len(self.by_session)

    def remember(self, route: Route, fresh_until: float, stale_until: float) -> None:
        if len(self.by_session) >= self.size:
            self.invalidate(next(iter(self.by_session)))
        self.by_session[route.session_id] = CachedRoute(route, fresh_until, stale_until)
        self._sessions_of.setdefault(route.sandbox_id, set()).add(route.session_id)

    def remember_sandbox(self, entry: SandboxRoutes) -> None:
        if len(self.by_sandbox) >= self.size:
            self.by_sandbox.pop(next(iter(self.by_sandbox)))
        self.by_sandbox[entry.route.sandbox_id] = entry

    def invalidate(self, key: str) -> None:
        """Forget cached routes for a session ID or a sandbox ID (store pub/sub calls this)."""
        if key == INVALIDATE_ALL:
            # Invalidations may have been missed: re-read every route from the store on next use,
            # but keep them for stale-if-error in case the store goes away again.
            for cached in self.by_session.values():
                cached.fresh_until = 0.0
            self.by_sandbox.clear()
            return
        self.by_sandbox.pop(key, None)
        cached = self.by_session.pop(key, None)
        if cached is not None:
            sessions = self._sessions_of.get(cached.route.sandbox_id)
            if sessions is not None:
                sessions.discard(key)
                if not sessions:
                    del self._sessions_of[cached.route.sandbox_id]
        for session_id in self._sessions_of.pop(key, ()):
            self.by_session.pop(session_id, None)


class RouteLookup:
    """The route for an identity from this process's cache, synchronously, or None on a miss.

    ``SessionRouter.cached_route`` is :meth:`route`: the data plane calls it first so that a request
    for a known session costs no task and no store round trip, and the session layer's ``resolve``
    before it goes to the store. The owner check applies to every hit (a session of someone else's
    is answered as one that does not exist: ``refusal()``), and a hit is counted (``events``) and
    marks the sandbox and session active (``activity``, an ``ActivityLog``, flushed in batches).

    ``owned`` is the caller's memo: a route this lookup returned before for this same ``identity``
    object (a client connection keeps its identity and its last route). Both are immutable, so
    ``Owner.matches``, a function of the two, passed for them once and is not asked again (a Python
    frame per request); any other route, or another identity object, is checked.
    """

    __slots__ = ("by_session", "clock", "events", "counted", "activity", "refusal")

    def __init__(self, routes: RouteCache, clock: Callable[[], float], events: Any, activity: Any,
                 refusal: Callable[[], Exception]) -> None:
        self.by_session = routes.by_session  # the same dict (RouteCache never replaces it)
        self.clock = clock
        self.events = events        # a sessions.RouterEvents
        self.counted = events.route_cache  # its hit count, looked up once: a call per hit, not a method lookup too
        self.activity = activity    # a sessions.ActivityLog (its dicts are swapped at each flush: not kept here)
        self.refusal = refusal

    def route(self, identity: Identity, owned: Route | None = None) -> Route | None:
        cached = self.by_session.get(identity.session_id)
        if cached is None:
            return None
        now = self.clock()
        if now >= cached.fresh_until:
            return None
        route = cached.route
        if route is not owned and not route.owner.matches(identity):
            self.events.denied("owner_mismatch")
            raise self.refusal()
        self.counted(True)
        activity = self.activity
        activity.sandboxes[route.sandbox_id] = now
        activity.sessions[route.session_id] = now
        return route

    def stream_opened(self, sandbox_id: str) -> None:
        """``SessionRouter.stream_opened``: a stream (a gRPC call, a streamed response) to ``sandbox_id`` began. Here,
        compiled, beside the hit's own marks: an interpreted method was a Python frame per call."""
        streams = self.activity.streams
        streams[sandbox_id] = streams.get(sandbox_id, 0) + 1

    def stream_closed(self, sandbox_id: str) -> None:
        """``SessionRouter.stream_closed``: that stream ended; the sandbox was active until now."""
        activity = self.activity
        streams = activity.streams
        streams[sandbox_id] = streams.get(sandbox_id, 0) - 1
        activity.sandboxes[sandbox_id] = self.clock()


__all__ = ["CachedRoute", "RouteCache", "RouteLookup", "SandboxRoutes"]

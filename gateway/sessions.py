"""SessionRouter: identity -> binding -> sandbox -> endpoint.

The hot path is :meth:`SessionRouter.resolve`: a request for a known session
is answered from a per-process route cache (``gateway.route_cache``: no store
round trip), with the owner checked on every hit; activity is recorded in
memory and flushed to the store in batches (:class:`ActivityLog`), never one write per request.

The slow path binds the session (a stored binding wins over re-derivation, so a
policy change never moves a live session), then makes sure its sandbox exists,
exactly once however many requests race for it: in-process callers share one
task per sandbox, and across processes the store's atomic reservation decides
who creates while everyone else waits for the outcome. A suspended sandbox is
woken the same way, once, while its requests are held (``gateway.lifecycle``,
which also reaps, suspends and sweeps).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Coroutine, Hashable
from typing import Any, TypeVar

from gateway import tracing
from gateway.access import incarnation_of, stale
from gateway.errors import (
    CapacityExceeded, Conflict, GatewayError, NotFound, ProvisionFailed, ProvisionTimeout, StoreUnavailable,
)
from gateway.lifecycle import (
    WAKING_STATES, Lifecycle, Provisioning, ReaperLease, foreign, unknown_sandbox, unknown_session,
)
from gateway.model import (
    ANY_SANDBOX, Binding, Endpoint, Owner, Position, Route, SandboxFilter, SandboxRecord, SandboxState, may_claim,
)
from gateway.policy import PolicyView
from gateway.providers.base import Probe, SandboxProvider
from gateway.route_cache import CachedRoute, RouteCache, RouteLookup, SandboxRoutes
from gateway.router_base import NoEvents, RouterEvents, RouterTuning
from gateway.store.base import (
    Caps, FleetCounts, LeaseLost, Released, Reserved, SandboxPage, SessionStore, Settled, Settlement, SettleTimeout,
)
from routing import Identity, Isolation, Placement, Policy, place

log = logging.getLogger(__name__)

_K = TypeVar("_K", bound=Hashable)
_T = TypeVar("_T")

__all__ = ["NoEvents", "RouterEvents", "RouterTuning", "SessionRouter"]

FILTERED_SCAN = 2_000  # index entries a filtered listing examines per page at most


class ActivityLog:
    """Last-use times and stream deltas gathered in memory, flushed in one batch."""

    __slots__ = ("sandboxes", "sessions", "streams")

    def __init__(self) -> None:
        self.sandboxes: dict[str, float] = {}
        self.sessions: dict[str, float] = {}
        self.streams: dict[str, int] = {}

    def take(self) -> tuple[dict[str, float], dict[str, float], dict[str, int]]:
        taken = (self.sandboxes, self.sessions, {k: v for k, v in self.streams.items() if v})
        self.sandboxes, self.sessions, self.streams = {}, {}, {}
        return taken


class SessionRouter:
    def __init__(
        self,
        store: SessionStore,
        provider: SandboxProvider,
        policy: Policy | PolicyView,
        *,
        replica_id: str,
        tuning: RouterTuning = RouterTuning(),
        clock: Callable[[], float] = time.time,
        events: RouterEvents = NoEvents(),
        lifecycle: Lifecycle | None = None,
    ) -> None:
        """``policy``: the policy, or the :class:`PolicyView` this router is to own (``router.view``,
        which every other part reads and subscribes to). ``lifecycle``: what wakes, suspends and
        deletes sandboxes, built by ``gateway.app`` from the same store, provider and view; a router
        made without one (tests, benchmarks) makes its own from its parts."""
        self.events = events
        self.store = store
        self.provider = provider
        self.view = policy if isinstance(policy, PolicyView) else PolicyView(policy)
        self.replica_id = replica_id
        self.tuning = tuning
        self.clock = clock
        self.routes = RouteCache(tuning.route_cache_size)
        self._cache = self.routes.by_session  # the same dicts, read directly on the hot path
        self._by_sandbox = self.routes.by_sandbox  # routes by sandbox ID (route_for_sandbox)
        # Per sandbox *and* owner: a foreign claimant never shares (nor spoils) the owner's creation.
        self._inflight: dict[tuple[str, Owner], asyncio.Task[SandboxRecord]] = {}
        self._resolving: dict[tuple[str, str | None, str, str | None], asyncio.Future[Route]] = {}
        self._healing: dict[tuple[str, Endpoint], asyncio.Task[None]] = {}
        self.activity = ActivityLog()
        # The hot path: the route from this process's cache, or None on a miss (owner checked), and a stream's
        # count. A compiled object's bound methods (gateway/route_cache.py), not methods here: once per request.
        lookup = RouteLookup(self.routes, clock, events, self.activity, unknown_session)
        self.cached_route: Callable[..., Route | None] = lookup.route
        self.stream_opened: Callable[[str], None] = lookup.stream_opened
        self.stream_closed: Callable[[str], None] = lookup.stream_closed
        self.lifecycle = lifecycle if lifecycle is not None else Lifecycle(
            store, provider, self.view, lease=ReaperLease(store, replica_id, tuning.reaper_lease_ttl),
            tuning=tuning, clock=clock, events=events)
        store.subscribe(self.routes.invalidate)

    async def resolve(self, identity: Identity) -> Route:
        """The route for a request; creates the session's sandbox on first use."""
        route = self.cached_route(identity)
        if route is not None:
            return route
        self.events.route_cache(False)
        now = self.clock()
        route = await self._resolve_uncached(identity, self._cache.get(identity.session_id), now)
        self.activity.sandboxes[route.sandbox_id] = now
        self.activity.sessions[route.session_id] = now
        return route

    async def _resolve_uncached(self, identity: Identity, cached: CachedRoute | None, now: float) -> Route:
        """One store conversation per session and owner at a time: concurrent misses share it."""
        key = (identity.session_id, identity.org_id, identity.user_id, identity.bot_id)
        pending = self._resolving.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[Route] = asyncio.get_running_loop().create_future()
        self._resolving[key] = future
        try:
            route = await self._resolve_from_store(identity, cached, now)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: a miss nobody else shared must not warn
            raise
        else:
            future.set_result(route)
            return route
        finally:
            del self._resolving[key]

    async def _resolve_from_store(self, identity: Identity, cached: CachedRoute | None, now: float) -> Route:
        try:
            binding, record = await self.bind(identity)
        except StoreUnavailable:
            if cached is not None and now < cached.stale_until and cached.route.owner.matches(identity):
                return cached.route  # bounded stale-if-error while the store is down
            raise
        assert record.endpoint is not None
        route = Route(binding.session_id, binding.sandbox_id, binding.pool, record.endpoint, binding.owner)
        self.routes.remember(route, now + self.tuning.route_ttl, now + self.tuning.route_stale_ttl)
        return route

    # by sandbox ID (the data plane's host and path keys, authorised by an access token) ------------
    def cached_sandbox_route(self, sandbox_id: str, port: int, incarnation: str) -> Route | None:
        """The route to ``port`` of ``sandbox_id`` from this process's cache, or None on a miss.
        ``Unauthorized`` (stale) when the sandbox is no longer ``incarnation``; ``Forbidden`` for a
        port its pool does not open."""
        cached = self._by_sandbox.get(sandbox_id)
        if cached is None:
            return None
        now = self.clock()
        if now >= cached.fresh_until:
            return None
        if cached.incarnation != incarnation:
            raise stale()
        route = cached.at(port)
        self.activity.sandboxes[sandbox_id] = now
        return route

    async def route_for_sandbox(self, sandbox_id: str, port: int, incarnation: str) -> Route:
        """The route to ``port`` of an existing sandbox, by its ID alone (no session, no owner check:
        the caller holds an access token for it). Never creates a sandbox: one that does not exist is
        ``NotFound``; one being created is waited for; any other state (suspended) takes the path
        :meth:`ensure_sandbox` takes for a binding, which wakes it."""
        route = self.cached_sandbox_route(sandbox_id, port, incarnation)
        if route is not None:
            return route
        record = await self.store.get_sandbox(sandbox_id)
        if record is None:
            raise NotFound(f"sandbox {sandbox_id} does not exist; a request through its session creates it",
                           code="sandbox_not_found")
        if incarnation_of(record.created_at) != incarnation:
            raise stale()
        record = await self._running(record)
        if incarnation_of(record.created_at) != incarnation or record.endpoint is None:
            raise stale()  # re-created meanwhile (it vanished between the two reads)
        now = self.clock()
        base = Route("", sandbox_id, record.pool, record.endpoint, record.owner or _NO_OWNER)
        entry = SandboxRoutes(base, incarnation, self.view.allowed_ports(record.pool, record.endpoint),
                              now + self.tuning.route_ttl)
        self.routes.remember_sandbox(entry)
        self.activity.sandboxes[sandbox_id] = now
        return entry.at(port)

    async def _settled(self, sandbox_id: str, timeout: float) -> Settlement:
        """How a creation or wake another caller runs ended; ProvisionTimeout past ``timeout``."""
        try:
            return await self.store.wait_settled(sandbox_id, timeout)
        except SettleTimeout:
            raise ProvisionTimeout(f"sandbox {sandbox_id} was not ready within {timeout:g}s",
                                   sandbox_id=sandbox_id) from None

    async def _running(self, record: SandboxRecord) -> SandboxRecord:
        if record.state is SandboxState.READY:
            return record
        if record.state is SandboxState.CREATING:
            pool = self.view.pool(record.pool)
            timeout = pool.provisioning_timeout if pool is not None else 120.0
            settlement = await self._settled(record.sandbox_id, timeout)
            if settlement.outcome is Settled.READY and settlement.record is not None:
                return settlement.record
            raise NotFound(f"sandbox {record.sandbox_id} did not come up; a request through its session re-creates it",
                           code="sandbox_not_found")
        if record.state in (SandboxState.FAILED, SandboxState.DELETING):  # being reaped (failed: a defence)
            raise NotFound(f"sandbox {record.sandbox_id} is not running ({record.state.value}); a request through "
                           "its session re-creates it", code="sandbox_not_found")
        # Suspended (or on its way there or back): woken the way a binding's request wakes it, as its
        # recorded owner (were the record gone meanwhile, what ensure_sandbox creates is that owner's).
        # A record with no owner is not woken by a token: only a request through its session proves whose it is.
        if record.owner is None:
            raise NotFound(f"sandbox {record.sandbox_id} is suspended; a request through its session wakes it",
                           code="sandbox_not_found")
        isolation = Isolation.PER_SESSION if record.sandbox_id.startswith("ses-") else Isolation.SHARED
        return await self.ensure_sandbox(Binding("", record.sandbox_id, record.pool, isolation,
                                                 record.owner, record.created_at))

    # binding ----------------------------------------------------------------
    def dry_run(self, identity: Identity) -> Placement:
        return place(identity, self.view.policy)

    async def bind(self, identity: Identity) -> tuple[Binding, SandboxRecord]:
        """Bind the session (idempotent) and return it with its ready sandbox."""
        binding = await self.store.get_binding(identity.session_id)
        created_binding = False
        if binding is None:
            placement = place(identity, self.view.policy)
            fresh = Binding(identity.session_id, placement.sandbox_id, placement.pool, placement.isolation,
                            Owner.of(identity), self.clock())
            binding = await self.store.put_binding(fresh)
            created_binding = binding == fresh
        if not binding.owner.matches(identity):
            self.events.denied("owner_mismatch")
            raise unknown_session()
        try:
            record = await self.ensure_sandbox(binding)
        except GatewayError:
            if created_binding:
                # Nothing half-created: a session whose sandbox could not be had is not bound.
                with contextlib.suppress(GatewayError):
                    await self.store.delete_binding(binding.session_id)
            raise
        return binding, record

    async def lookup(self, session_id: str, identity: Identity | None = None) -> Binding:
        binding = await self.store.get_binding(session_id)
        if binding is None or (identity is not None and not binding.owner.matches(identity)):
            raise unknown_session()
        return binding

    async def close_session(self, session_id: str, identity: Identity | None = None) -> Binding:
        """Unbind a session; its per-session sandbox is destroyed with it."""
        binding = await self.lookup(session_id, identity)
        await self.store.delete_binding(session_id)
        if binding.isolation is Isolation.PER_SESSION and not await self.store.sessions_of(binding.sandbox_id):
            record = await self.store.get_sandbox(binding.sandbox_id)
            if record is not None:
                await self.lifecycle.destroy(record, reason="session_deleted")
                self.events.reaped("session_deleted")
        return binding

    # read side (the control API reads through these, never through the store) --------
    async def sandbox_of(self, binding: Binding) -> SandboxRecord | None:
        """The record of a binding's sandbox, or None while it has none (released, not yet created)."""
        return await self.store.get_sandbox(binding.sandbox_id)

    async def sandboxes(self, after: Position | None = None, *, limit: int = 100,
                        where: SandboxFilter = ANY_SANDBOX) -> SandboxPage:
        """One page of sandboxes, oldest activity first. A filtered page examines at most
        ``FILTERED_SCAN`` index entries, so it may be short (even empty) with a next position."""
        scan = limit if where.any else max(limit, FILTERED_SCAN)
        return await self.store.scan_sandboxes(after, limit=limit, scan=scan, where=where)

    async def fleet_counts(self) -> FleetCounts:
        return await self.store.fleet_counts()

    # create once ------------------------------------------------------------
    async def ensure_sandbox(self, binding: Binding) -> SandboxRecord:
        """The binding's ready sandbox, created (or woken) once; ``NotFound`` when it is another identity's."""
        record = await self.store.get_sandbox(binding.sandbox_id)
        if record is None or record.state is not SandboxState.READY:
            if record is not None and not self._claims(binding, record):
                raise foreign(self.events, binding)  # before anything is woken for a caller it will never serve
            ensure = functools.partial(_shared, self._inflight, (binding.sandbox_id, binding.owner),
                                       functools.partial(self._ensure_once, binding))
            if record is not None and record.state in WAKING_STATES:
                record = await self.lifecycle.held(ensure, binding.pool, binding.sandbox_id)
            else:
                # Shielded: one caller giving up must not abort a creation others wait for.
                record = await asyncio.shield(ensure())
        if not self._claims(binding, record):
            # The binding was lost (store reset, session_ttl) and re-made by someone else: never share.
            raise foreign(self.events, binding)
        return record

    @staticmethod
    def _claims(binding: Binding, record: SandboxRecord) -> bool:
        return may_claim(record.sandbox_id, record.owner, record.created_at, binding.owner, binding.created_at)

    async def _ensure_once(self, binding: Binding) -> SandboxRecord:
        pool = self.view.pool(binding.pool)
        timeout = pool.provisioning_timeout if pool is not None else 120.0
        attempts = 3  # a record that keeps disappearing; a lease taken over is no such attempt (it took a lease's time)
        while attempts:
            attempts -= 1
            template = SandboxRecord(binding.sandbox_id, binding.pool, binding.owner.org_id,
                                     SandboxState.CREATING, created_at=self.clock(), owner=binding.owner)
            try:
                reservation = await self.store.reserve_sandbox(template, self._caps(binding),
                                                               self.lifecycle.lease_for(binding.pool))
            except CapacityExceeded as exc:
                self.events.capacity_rejected(exc.scope)
                raise
            try:
                if reservation.created:
                    with tracing.phase("sandbox.provision", binding.sandbox_id, binding.pool):
                        return await self._create(reservation.record, binding, timeout)
                if reservation.outcome is Reserved.RESUME:
                    with tracing.phase("sandbox.wake", binding.sandbox_id, binding.pool):
                        return await self.lifecycle.resume(reservation.record, binding, timeout)
            except LeaseLost:
                # Taken over while ours ran late: reserving again finds the new holder's reservation (or
                # its ready record), and this task's callers, held requests included, share its outcome.
                attempts += 1
                continue
            if reservation.record.state is SandboxState.READY:
                return reservation.record
            settlement = await self._settled(binding.sandbox_id, timeout)
            if settlement.outcome is Settled.READY and settlement.record is not None:
                return settlement.record
            if settlement.outcome is Settled.FAILED:
                raise ProvisionFailed(settlement.error or "sandbox creation failed", sandbox_id=binding.sandbox_id)
            # REMOVED, ABANDONED or SUSPENDED: reserve again (taking an abandoned one over, waking a suspended one)
        raise ProvisionFailed(f"sandbox {binding.sandbox_id} kept disappearing while being created; retry",
                              sandbox_id=binding.sandbox_id)

    async def _create(self, record: SandboxRecord, binding: Binding, timeout: float) -> SandboxRecord:
        started, pool = time.perf_counter(), record.pool
        return await self.lifecycle.provision(record, binding, timeout, Provisioning(
            self.provider.ensure, self.store.release_sandbox,
            lambda outcome: self.events.provisioned(pool, time.perf_counter() - started, outcome),
            "creating", "created", "sandbox creation was interrupted"))

    def _caps(self, binding: Binding) -> Caps:
        pool = self.view.pool(binding.pool)
        org = self.view.policy.orgs.get(binding.owner.org_id) if binding.owner.org_id is not None else None
        return Caps(pool_max=pool.max_sandboxes if pool else None, org_max=org.max_sandboxes if org else None)

    # operator controls (carried out by gateway.lifecycle) ---------------------
    async def suspend_sandbox(self, sandbox_id: str, *, grace: float | None = None) -> SandboxRecord:
        """Operator control: suspend a ready sandbox (idempotent: one suspending or suspended already
        is answered as it is). 409 while it is being created or woken. With ``grace``, it waits up to
        that long for the sandbox's open exchanges to end (409 naming them past it,
        ``Lifecycle.suspend_when_quiet``); without, it suspends now and cuts them."""
        record = await self.store.get_sandbox(sandbox_id)
        if record is None:
            raise unknown_sandbox(sandbox_id)
        if record.state is SandboxState.READY and grace is not None:
            await self.lifecycle.suspend_when_quiet(record, grace, self.flush_activity)
        elif record.state is SandboxState.READY:
            record = await self.lifecycle.suspend(record, reason="requested (forced)") or record
        elif record.state not in (SandboxState.SUSPENDING, SandboxState.SUSPENDED):
            raise Conflict(f"sandbox {sandbox_id} is {record.state}; suspend it once it is ready",
                           sandbox_id=sandbox_id)
        return await self.store.get_sandbox(sandbox_id) or record

    async def delete_sandbox(self, sandbox_id: str) -> SandboxRecord:
        """Operator control: destroy a sandbox of any kind (``ses-``, and the shared ``usr-``/``org-``
        ones that no session's DELETE destroys). Its sessions stay bound: the next request of one
        creates it afresh. 409 while it is being created or changing state."""
        record = await self.store.get_sandbox(sandbox_id)
        if record is None:
            raise unknown_sandbox(sandbox_id)
        if record.state not in (SandboxState.READY, SandboxState.SUSPENDED):
            raise Conflict(f"sandbox {sandbox_id} is {record.state}; delete it once it is ready or suspended",
                           sandbox_id=sandbox_id)
        await self.lifecycle.destroy(record, reason="requested")
        self.events.reaped("requested")
        return record

    async def resume_sandbox(self, sandbox_id: str) -> SandboxRecord:
        """Operator control: wake a suspended sandbox (idempotent: a ready one is answered as it is),
        through the same wake-once path as a request, held up to its pool's ``wake_timeout``."""
        record = await self.store.get_sandbox(sandbox_id)
        if record is None:
            raise unknown_sandbox(sandbox_id)
        if record.state is SandboxState.READY:
            return record
        if record.state not in WAKING_STATES or record.owner is None:
            raise Conflict(f"sandbox {sandbox_id} is {record.state}: there is nothing to resume", sandbox_id=sandbox_id)
        sessions = await self.store.sessions_of(sandbox_id)
        isolation = Isolation.PER_SESSION if sandbox_id.startswith("ses-") else Isolation.SHARED
        # As its owner, bound when it was made: the wake a request of that owner would cause.
        owner_binding = Binding(sessions[0] if sessions else "", sandbox_id, record.pool, isolation, record.owner,
                                record.created_at)
        return await self.ensure_sandbox(owner_binding)

    async def unreachable(self, route: Route) -> None:
        """The data plane could not connect to ``route`` (after its retries): forget the cached route
        and, when the provider says the sandbox is gone, release its record so that the next resolve
        re-creates it through create-once, on whichever replica finds it first.

        Any replica heals any sandbox: the provider's own view (the local registry and process, the
        Kubernetes object) decides, not the memory of the replica that created it. Only the dead
        incarnation (ready at that endpoint) is released, once across every replica; one probe per
        sandbox runs at a time in this process, and the callers that pile up share it.
        """
        self.invalidate(route.session_id)
        await asyncio.shield(_shared(self._healing, (route.sandbox_id, route.endpoint), lambda: self._heal(route)))

    async def _heal(self, route: Route) -> None:
        probe = await self.provider.probe(route.sandbox_id, route.pool)
        if probe is not Probe.GONE:
            return  # alive (a transient failure) or unknowable: never re-create on a guess
        outcome = await self.store.release_unreachable(route.sandbox_id, route.endpoint)
        self.invalidate(route.sandbox_id)
        if outcome is Released.RELEASED:
            log.warning("sandbox %s (pool %s) is gone at its provider; it will be re-created on its next request",
                        route.sandbox_id, route.pool)
            self.events.reaped("gone")

    def sandbox_lost(self, sandbox_id: str) -> None:
        """Provider callback: a sandbox died; forget it so the next request re-creates it."""
        self.invalidate(sandbox_id)
        task = asyncio.get_running_loop().create_task(self._forget_lost(sandbox_id))
        task.add_done_callback(_log_task_error)

    async def _forget_lost(self, sandbox_id: str) -> None:
        record = await self.store.get_sandbox(sandbox_id)
        if record is not None and record.state is SandboxState.READY:
            await self.store.release_sandbox(sandbox_id, error="sandbox died")

    async def flush_activity(self) -> None:
        sandboxes, sessions, streams = self.activity.take()
        if streams:
            await self.store.add_streams(streams)
        if sandboxes or sessions:
            await self.store.touch(sandboxes, sessions)

    # route cache ------------------------------------------------------------
    def invalidate(self, key: str) -> None:
        """Forget cached routes for a session ID or a sandbox ID (store pub/sub calls this)."""
        self.routes.invalidate(key)

    def cached_route_count(self) -> int:
        return len(self.routes)


def _shared(tasks: dict[_K, asyncio.Task[_T]], key: _K, start: Callable[[], Coroutine[Any, Any, _T]]) -> asyncio.Task[_T]:
    """The task in flight for ``key``, else a new one from ``start``: concurrent callers share one
    piece of work, and the entry goes when the task ends."""
    task = tasks.get(key)
    if task is None:
        task = tasks[key] = asyncio.create_task(start())
        task.add_done_callback(lambda _t: tasks.pop(key, None))
    return task


_NO_OWNER = Owner(None, "-", None)  # a record written by a version that kept no owner


def _log_task_error(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("background task failed: %s", task.exception())

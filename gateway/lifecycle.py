"""What happens to a sandbox between requests: idle reaping, suspend, wake, retention, orphan sweeps.

The :class:`Lifecycle` of a :class:`~gateway.sessions.SessionRouter` acts on the
router's store and provider; the router calls it, never the data plane.

- **Idle.** A ready sandbox idle past its pool's ``idle_timeout`` (and at least
  ``RouterTuning.activity_grace``, see below) with no exchange open on any replica
  is deleted (``on_idle: delete``) or suspended (``on_idle: suspend``). A suspended
  sandbox idle past ``retention`` since its suspend is deleted.
- **Suspend.** ``ready`` -> ``suspending`` (every replica drops its cached route)
  -> the provider takes the compute away -> ``suspended``.
- **Wake once.** A request for a suspended sandbox reserves it exactly as a first
  request reserves a creation (``Reserved.RESUME``: on any replica, one caller
  resumes; the others wait for the outcome), and is held up to the pool's
  ``wake_timeout``, then answered 503 + ``Retry-After`` while the wake goes on.

Activity: requests are recorded when they start (batched, ``ActivityLog``) and an
exchange still open after the data plane's ``LONG_REQUEST_AFTER`` counts as a
stream, in the store's per-replica, heartbeat-backed stream counts. Between the
two, a request younger than that is covered only by its start time, so no sandbox
is reaped sooner than ``activity_grace`` after its last request began, whatever
its pool's ``idle_timeout``. A replica that dies stops heartbeating, and its
streams stop counting: it pins nothing for longer than its heartbeat's TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from gateway.errors import (
    Conflict, GatewayError, NotFound, ProvisionFailed, ProvisionTimeout, StoreUnavailable, WakeTimeout,
)
from gateway.model import Binding, SandboxRecord, SandboxRequest, SandboxState
from gateway.providers.base import ForeignSandbox
from gateway.reaper import ReapPass
from gateway.store.base import NotReserved

if TYPE_CHECKING:
    from gateway.sessions import SessionRouter

log = logging.getLogger(__name__)

REAPER_LEASE = "reaper"
DEFAULT_WAKE_TIMEOUT = 60.0  # for a pool no longer in the policy
STORE_RETRY = 0.2  # the pause before a request held by a wake tries again after a store error
QUIET_POLL = 0.25  # how often an operator's suspend looks again for the sandbox's exchanges to end
MIN_LEASE = 0.5  # a lease renewed every quarter of it: shorter would be all renewals
RENEWALS_PER_LEASE = 4  # a holder renews its lease this often per lease: one late renewal does not lose it
WAKING_STATES = frozenset({SandboxState.SUSPENDING, SandboxState.SUSPENDED, SandboxState.RESUMING})
"""A request for a sandbox in one of these is held for a wake (bounded by ``wake_timeout``)."""


class Lifecycle:
    """Suspend, wake, reaping and sweeps for one router (see the module docstring)."""

    def __init__(self, router: SessionRouter) -> None:
        self._router = router
        # Where the next orphan sweep resumes: each pass does a bounded share.
        self._sweep_from: str | None = None

    # wake -------------------------------------------------------------------
    async def held(self, wake: Callable[[], asyncio.Future[SandboxRecord]], pool: str,
                   sandbox_id: str) -> SandboxRecord:
        """Hold a request for the wake in flight (``wake()`` gives the shared task) up to the pool's
        ``wake_timeout``; past it, ``WakeTimeout`` (503 + Retry-After) while the wake goes on.

        A request is held until its own deadline, whatever the wake it joined does: when that
        wait gives up first (it joined another replica's wake with its provisioning timeout, or a
        waker that died), it joins the next one (reserving again takes a lapsed lease over), and
        only its own deadline answers it, with 503 and Retry-After, never a 504. A store error while
        it waits is tried again until then too (and is the answer if the store stays away)."""
        events = self._router.events
        spec = self._router.policy.pools.get(pool)
        budget = spec.wake_timeout if spec is not None else DEFAULT_WAKE_TIMEOUT
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        deadline = loop.time() + budget
        events.wake_waiting(pool, 1)
        store_error: StoreUnavailable | None = None
        try:
            while True:
                try:
                    async with asyncio.timeout_at(deadline):
                        record = await asyncio.shield(wake())
                    break
                except ProvisionTimeout:
                    store_error = None
                    pause = 0.0  # the shared task's entry goes with its done callback: join the next
                except StoreUnavailable as exc:
                    # One slow store call (a replica starved in a wake storm) must not end a hold that
                    # has time left; a store that stays away is answered as such at the deadline.
                    store_error, pause = exc, STORE_RETRY
                if loop.time() + pause >= deadline:
                    if store_error is not None:
                        raise store_error
                    raise TimeoutError
                await asyncio.sleep(pause)
        except TimeoutError:
            raise WakeTimeout(
                f"sandbox {sandbox_id} is waking up and was not ready within {budget:g}s "
                f"(pools.{pool}.wake_timeout); retry after the Retry-After delay",
                sandbox_id=sandbox_id, retry_after=min(max(budget, 1.0), 5.0)) from None
        finally:
            events.wake_waiting(pool, -1)
        events.woken(pool, time.perf_counter() - started)
        return record

    def lease_for(self, pool: str) -> float:
        """The lease of a creation, suspend or wake in ``pool``: ``creation_lease``, and at most half
        the pool's ``wake_timeout``, so that a wake whose replica died is taken over (its lease
        lapsed) while its requests are still held. Renewed while its holder runs (:meth:`renewing`)."""
        spec = self._router.policy.pools.get(pool)
        wake_timeout = spec.wake_timeout if spec is not None else DEFAULT_WAKE_TIMEOUT
        return max(MIN_LEASE, min(self._router.tuning.lease_seconds, wake_timeout / 2))

    @contextlib.asynccontextmanager
    async def renewing(self, record: SandboxRecord, lease_seconds: float) -> AsyncIterator[None]:
        """Renew the lease of the reservation ``record`` (as reserved: its ``lease_until``) every
        quarter of ``lease_seconds`` (sooner after a failed renewal) while the body runs: a live
        holder keeps it however long the provider takes, a dead one loses it within ``lease_seconds``.

        Stopped by a flag as well as cancelled, and not awaited: a cancellation that lands on a
        store call can be swallowed by the Redis client (asyncio.wait_for on Python 3.11), and the
        body's outcome must never wait for a renewal."""
        done = asyncio.Event()
        renewal = asyncio.create_task(self._renew(record.sandbox_id, record.lease_until, lease_seconds, done),
                                      name=f"lease-{record.sandbox_id}")
        renewal.add_done_callback(_renewal_ended)
        try:
            yield
        finally:
            done.set()
            renewal.cancel()

    async def _renew(self, sandbox_id: str, held_until: float, lease_seconds: float, done: asyncio.Event) -> None:
        store = self._router.store
        pause = lease_seconds / RENEWALS_PER_LEASE
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause):
                    await done.wait()
            if done.is_set():
                return
            try:
                renewed = await store.extend_lease(sandbox_id, held_until, lease_seconds)
            except GatewayError as exc:
                # One slow store call must not cost the lease (a takeover while we live: two resumes):
                # try again soon; a store away past the lease lets it lapse, and it is taken over.
                log.warning("could not renew the lease on sandbox %s: %s", sandbox_id, exc.message)
                pause = min(STORE_RETRY, lease_seconds / RENEWALS_PER_LEASE)
                continue
            pause = lease_seconds / RENEWALS_PER_LEASE
            if renewed is None:
                if not done.is_set():
                    log.warning("the lease on sandbox %s was lost (it lapsed and was taken over)", sandbox_id)
                return
            held_until = renewed

    async def resume(self, record: SandboxRecord, binding: Binding, timeout: float) -> SandboxRecord:
        """Resume a sandbox this caller reserved (``Reserved.RESUME``); on failure it goes back to
        ``suspended`` with the error, which every waiter shares."""
        router, store = self._router, self._router.store
        request = SandboxRequest(record.sandbox_id, record.pool, binding.isolation, binding.owner,
                                 binding.session_id, timeout, bound_at=binding.created_at)
        try:
            async with self.renewing(record, self.lease_for(record.pool)):
                endpoint = await router.provider.resume(request)
        except ForeignSandbox:
            router.events.resumed(record.pool, "not_found")
            with contextlib.suppress(GatewayError):
                await store.mark_suspended(record.sandbox_id)  # no error: a waiter (the owner) wakes it
            raise router.foreign(binding) from None
        except BaseException as exc:
            router.events.resumed(record.pool, outcome_of(exc))
            message = exc.message if isinstance(exc, GatewayError) else "resuming the sandbox was interrupted"
            with contextlib.suppress(GatewayError):
                await store.mark_suspended(record.sandbox_id, error=message)
            if isinstance(exc, GatewayError | asyncio.CancelledError):
                raise
            log.exception("provider failed resuming %s", record.sandbox_id)
            raise ProvisionFailed(f"resuming sandbox {record.sandbox_id} failed", sandbox_id=record.sandbox_id) from exc
        try:
            ready = await store.mark_ready(record.sandbox_id, endpoint)
        except NotReserved:
            router.events.resumed(record.pool, "removed")
            raise ProvisionFailed(f"sandbox {record.sandbox_id} was removed while it was being resumed; retry",
                                  sandbox_id=record.sandbox_id) from None
        router.events.resumed(record.pool, "ready")
        log.info("resumed sandbox %s (pool %s)", record.sandbox_id, record.pool)
        return ready

    # suspend ----------------------------------------------------------------
    async def suspend(self, record: SandboxRecord, *, reason: str,
                      idle_before: float = math.inf) -> SandboxRecord | None:
        """Suspend a ready sandbox; None when it was not ready (any more), or was active at or after
        ``idle_before`` (the store's compare-and-set: the reaper's view may be stale), and nothing was done."""
        router, store = self._router, self._router.store
        if not router.provider.can_suspend(record.pool):
            raise Conflict(f"sandboxes of pool {record.pool!r} cannot be suspended (its provider keeps no "
                           f"state to wake); delete the session instead", sandbox_id=record.sandbox_id)
        lease = self.lease_for(record.pool)
        suspending = await store.begin_suspend(record.sandbox_id, lease, idle_before)
        if suspending is None:
            return None
        log.info("suspending sandbox %s (pool %s): %s", record.sandbox_id, record.pool, reason)
        outcome = "suspended"
        try:
            async with self.renewing(suspending, lease):
                await router.provider.suspend(record.sandbox_id, record.pool)
        except BaseException as exc:
            outcome = outcome_of(exc)
            # Recorded as suspended all the same: its next request resumes it, and resume is
            # idempotent (a sandbox that kept running just answers). Never left half-way.
            log.warning("suspending sandbox %s failed (%s); it is woken by its next request",
                        record.sandbox_id, exc)
            if not isinstance(exc, Exception):
                with contextlib.suppress(GatewayError):
                    await store.mark_suspended(record.sandbox_id)
                raise
        finally:
            router.events.suspended(record.pool, outcome)
        return await store.mark_suspended(record.sandbox_id)

    async def suspend_when_quiet(self, record: SandboxRecord, grace: float) -> SandboxRecord | None:
        """The operator's suspend: wait up to ``grace`` seconds for the sandbox's open exchanges to
        end, then suspend it; ``Conflict`` (409) naming them when they outlast the grace.

        "Open" is what protects a sandbox from idle reaping, on every replica: a long request or
        stream counted in the store, or a request begun within ``activity_grace`` (one younger than
        the data plane's LONG_REQUEST_AFTER is known only by its start). The suspend itself is the
        store's compare-and-set on that activity, so a request that starts meanwhile wins."""
        router, store, tuning = self._router, self._router.store, self._router.tuning
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        quiet_at: float | None = None  # when it was first seen quiet (loop time)
        while True:
            await router.flush_activity()  # this replica's own requests count at once
            current = await store.get_sandbox(record.sandbox_id)
            if current is None or current.state is not SandboxState.READY:
                return None
            quiet_since = router.clock() - tuning.activity_grace
            streams = await store.open_streams(record.sandbox_id)
            if streams == 0 and current.last_active < quiet_since:
                # Quiet twice, an activity flush apart: a request that began on another replica just
                # before the first look is in the store by the second (replicas flush in batches).
                if quiet_at is None:
                    quiet_at = loop.time()
                elif loop.time() - quiet_at >= tuning.activity_flush:
                    suspended = await self.suspend(current, reason="requested", idle_before=quiet_since)
                    if suspended is not None:
                        return suspended
                    quiet_at = None  # used (or changed) in between: judge again
                if quiet_at is not None:
                    await asyncio.sleep(QUIET_POLL)
                continue
            quiet_at = None
            left = deadline - loop.time()
            if left <= 0:
                raise Conflict(
                    f"sandbox {record.sandbox_id} has open exchanges: {streams} long request(s) or stream(s) "
                    f"open, its last request began {max(0.0, router.clock() - current.last_active):.1f}s ago "
                    f"(a request counts as open for activity_grace, {router.tuning.activity_grace:g}s); "
                    f"retry later, wait longer with ?grace=SECONDS, or cut them with ?force=true",
                    sandbox_id=record.sandbox_id)
            await asyncio.sleep(min(QUIET_POLL, left))

    # reaping ----------------------------------------------------------------
    async def destroy(self, record: SandboxRecord, *, reason: str) -> None:
        """Delete a sandbox at its provider, then forget it (and its per-session bindings)."""
        router, store = self._router, self._router.store
        log.info("destroying sandbox %s (pool %s): %s", record.sandbox_id, record.pool, reason)
        await router.provider.delete(record.sandbox_id, record.pool)
        if record.sandbox_id.startswith("ses-"):
            for session_id in await store.sessions_of(record.sandbox_id):
                await store.delete_binding(session_id)
        await store.release_sandbox(record.sandbox_id, error=f"sandbox destroyed: {reason}")

    async def reap_once(self) -> list[str]:
        """One reaper pass, only on the replica holding the reaper lease. Returns the IDs it
        destroyed (suspended ones are logged and counted, not returned).

        Sized by what is due (``gateway.reaper``): it reads each pool's due records from the store's
        state-and-pool indexes and claims, acts on and settles them a chunk of ``reap_concurrency``
        at a time, while more is due and within ``reap_budget`` seconds; a fleet with nothing due
        costs one short read per pool and state. Then idle sessions' bindings go.
        """
        # -- reaping (issue 27.5: batches, gateway.reaper) --
        router, store, tuning = self._router, self._router.store, self._router.tuning
        now = router.clock()
        if not await router.renew_reaper_lease():
            return []
        reaped = await ReapPass(store, router.provider, router.events, tuning, now, lease_for=self.lease_for,
                                renewing=self.renewing, keep_lease=router.renew_reaper_lease,
                                clock=router.clock).run(router.policy.pools)
        # -- end of reaping --
        for session_id in await store.idle_sessions(now - tuning.session_ttl, tuning.reap_batch):
            await store.delete_binding(session_id)
        return reaped

    async def sweep_orphans(self, grace: float) -> list[str]:
        """Delete provider objects of this installation that the store does not know (lease holder only).

        Incremental: each pass checks one page of the provider's objects (``sweep_batch``) against
        the store in one batched lookup, and the next pass resumes after it. ``grace`` protects
        objects whose creation is in flight on a replica that has not written its record yet, and
        objects of a store that was just reset.
        """
        router, store, provider = self._router, self._router.store, self._router.provider
        if not await router.renew_reaper_lease():
            return []
        cutoff = router.clock() - grace
        if await store.epoch() > cutoff:
            return []  # the store began (or lost its data) within the grace: sessions may yet come back
        page = await provider.managed_page(self._sweep_from, router.tuning.sweep_batch)
        self._sweep_from = page.next
        known = await store.existing_sandboxes([managed.sandbox_id for managed in page.items])
        swept = []
        for managed in page.items:
            if managed.sandbox_id not in known and managed.created_at < cutoff:
                log.info("sweeping orphaned sandbox %s (pool %s)", managed.sandbox_id, managed.pool)
                await provider.delete(managed.sandbox_id, managed.pool)
                router.events.reaped("orphan")
                swept.append(managed.sandbox_id)
        return swept


def _renewal_ended(task: asyncio.Task[None]) -> None:
    """A renewal task is never awaited (``Lifecycle.renewing``): an unexpected error is logged here."""
    if not task.cancelled() and task.exception() is not None:
        log.error("renewing a lease failed", exc_info=task.exception())


def outcome_of(exc: BaseException) -> str:
    """A failure as a metrics outcome label (an error code, never a message)."""
    if isinstance(exc, asyncio.CancelledError):
        return "cancelled"
    return exc.code if isinstance(exc, GatewayError) else "error"


def unknown_sandbox(sandbox_id: str) -> NotFound:
    return NotFound(f"no sandbox {sandbox_id}", sandbox_id=sandbox_id)

"""What happens to a sandbox between requests: idle reaping, suspend, wake, retention, orphan sweeps.

A :class:`Lifecycle` acts on the store and provider it is given (``gateway.app`` builds it
from the same parts as the :class:`~gateway.sessions.SessionRouter`, and runs its loops); the
router calls it for wakes, suspends and deletes, never the reverse, and never the data plane.
What is due is decided in ``routing.reaping`` (pure); this module carries it out.

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
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from gateway.errors import (
    Conflict, GatewayError, NotFound, ProvisionFailed, ProvisionTimeout, StoreUnavailable, WakeTimeout,
)
from gateway.model import Binding, Endpoint, SandboxRecord, SandboxRequest, SandboxState
from gateway.policy import PolicyView
from gateway.providers.base import ForeignSandbox, SandboxProvider
from gateway.reaper import ReapPass
from gateway.router_base import RouterEvents, RouterTuning
from gateway.store.base import LeaseLost, NotReserved, SessionStore
from routing.reaping import orphaned

log = logging.getLogger(__name__)

REAPER_LEASE = "reaper"
DEFAULT_WAKE_TIMEOUT = 60.0  # for a pool no longer in the policy
STORE_RETRY = 0.2  # the pause before a request held by a wake tries again after a store error
QUIET_POLL = 0.25  # how often an operator's suspend looks again for the sandbox's exchanges to end
MIN_LEASE = 0.5  # a lease renewed every quarter of it: shorter would be all renewals
RENEWALS_PER_LEASE = 4  # a holder renews its lease this often per lease: one late renewal does not lose it
LEASE_LOST = "lease_lost"  # the outcome of a creation or wake whose lease was taken over: not ready by its caller
WAKING_STATES = frozenset({SandboxState.SUSPENDING, SandboxState.SUSPENDED, SandboxState.RESUMING})
"""A request for a sandbox in one of these is held for a wake (bounded by ``wake_timeout``)."""


class ReaperLease:
    """The installation's one reaper lease, as this replica takes, keeps and gives it up."""

    def __init__(self, store: SessionStore, replica_id: str, ttl: float) -> None:
        self._store, self.replica_id, self.ttl = store, replica_id, ttl

    async def renew(self) -> bool:
        """Take or keep the reaper lease; True while this replica holds it. Called every
        ``reaper_lease_renew`` seconds besides each pass, so the lease can be much shorter than the
        reap interval (or a long pass) and a dead holder's lease lapses quickly."""
        return await self._store.acquire_lease(REAPER_LEASE, self.replica_id, ttl=self.ttl)

    async def release(self) -> None:
        """Give the reaper lease up (this replica stops): another replica reaps from its next renewal,
        not once the lease lapses. Best effort: a store that is down lets the lease lapse instead."""
        try:
            await self._store.release_lease(REAPER_LEASE, self.replica_id)
        except StoreUnavailable as exc:
            log.warning("could not give up the reaper lease (it lapses within %gs): %s", self.ttl, exc.message)


@dataclass(frozen=True, slots=True)
class Provisioning:
    """What differs between creating a sandbox and waking one (:meth:`Lifecycle.provision`)."""

    run: Callable[[SandboxRequest], Awaitable[Endpoint]]  # the provider's ensure or resume
    undo: Callable[..., Awaitable[object]]  # (sandbox_id, error=..., held=...): release the record, or suspend it
    report: Callable[[str], None]  # an outcome, for the metrics: "ready" once marked ready, never before
    doing: str  # "creating", "resuming"
    done: str  # "created", "resumed"
    interrupted: str  # the error recorded when the caller was cancelled


class HeldLease:
    """The lease deadlines a holder may hold its reservation under, while :meth:`Lifecycle.renewing` renews
    it: the last one the store confirmed, and those of renewals sent since whose answer has not come (a
    reply lost to a socket timeout after the script ran included). While nobody took the reservation over,
    the record's lease is one of them; what the holder writes (renewals, ready, undo) is fenced by them."""

    __slots__ = ("deadlines",)

    def __init__(self, until: float) -> None:
        self.deadlines: frozenset[float] = frozenset((until,))

    def sent(self, until: float) -> float:
        """A renewal to ``until`` is being sent: held from now (it may run even if its reply never comes)."""
        self.deadlines |= {until}
        return until

    def confirmed(self, until: float) -> None:
        """The store renewed the lease to ``until``: the earlier deadlines are not the record's any more."""
        self.deadlines = frozenset((until,))


class Lifecycle:
    """Suspend, wake, reaping and sweeps over one store and provider (see the module docstring)."""

    def __init__(self, store: SessionStore, provider: SandboxProvider, view: PolicyView, *,
                 lease: ReaperLease, tuning: RouterTuning, clock: Callable[[], float], events: RouterEvents) -> None:
        self.store, self.provider, self.view, self.lease = store, provider, view, lease
        self.tuning, self.clock, self.events = tuning, clock, events
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
        events = self.events
        spec = self.view.pool(pool)
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
        spec = self.view.pool(pool)
        wake_timeout = spec.wake_timeout if spec is not None else DEFAULT_WAKE_TIMEOUT
        return max(MIN_LEASE, min(self.tuning.lease_seconds, wake_timeout / 2))

    @contextlib.asynccontextmanager
    async def renewing(self, record: SandboxRecord, lease_seconds: float) -> AsyncIterator[HeldLease]:
        """Renew the lease of the reservation ``record`` (as reserved: its ``lease_until``) every
        quarter of ``lease_seconds`` (sooner after a failed renewal) while the body runs: a live
        holder keeps it however long the provider takes, a dead one loses it within ``lease_seconds``.
        Yields the deadlines the holder may hold it under (:class:`HeldLease`), the fence of what it
        writes when the body is done.

        Stopped by a flag as well as cancelled, and not awaited: a cancellation that lands on a
        store call can be swallowed by the Redis client (asyncio.wait_for on Python 3.11), and the
        body's outcome must never wait for a renewal."""
        done = asyncio.Event()
        lease = HeldLease(record.lease_until)
        renewal = asyncio.create_task(self._renew(record.sandbox_id, lease, lease_seconds, done),
                                      name=f"lease-{record.sandbox_id}")
        renewal.add_done_callback(_renewal_ended)
        try:
            yield lease
        finally:
            done.set()
            renewal.cancel()

    async def _renew(self, sandbox_id: str, lease: HeldLease, lease_seconds: float, done: asyncio.Event) -> None:
        store = self.store
        pause = lease_seconds / RENEWALS_PER_LEASE
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause):
                    await done.wait()
            if done.is_set():
                return
            until = lease.sent(self.clock() + lease_seconds)
            try:
                renewed = await store.extend_lease(sandbox_id, lease.deadlines, until)
            except GatewayError as exc:
                # One slow store call must not cost the lease (a takeover while we live: two resumes):
                # try again soon (the deadline sent stays held: its reply may be what was lost); a store
                # away past the lease lets it lapse, and it is taken over.
                log.warning("could not renew the lease on sandbox %s: %s", sandbox_id, exc.message)
                pause = min(STORE_RETRY, lease_seconds / RENEWALS_PER_LEASE)
                continue
            pause = lease_seconds / RENEWALS_PER_LEASE
            if not renewed:
                if not done.is_set():
                    log.warning("the lease on sandbox %s was lost (it lapsed and was taken over)", sandbox_id)
                return
            lease.confirmed(until)

    async def provision(self, record: SandboxRecord, binding: Binding, timeout: float,
                        step: Provisioning) -> SandboxRecord:
        """Create or wake the sandbox this caller reserved (``record``), under its renewed lease, and
        mark it ready. On failure the reservation is undone with the error, which every waiter
        shares; a sandbox the provider says is another identity's is undone without one (a waiter,
        the owner perhaps, reserves again) and answered as an unknown session.

        Everything it writes is fenced by its lease: when the lease lapsed and another caller took the
        reservation over, its ready (or undo) is refused and ``LeaseLost`` raised: the caller joins the
        new holder's outcome. What the provider did is left as it is: creating or resuming one sandbox
        is idempotent at the provider (the new holder's call finds or replaces the same runtime), so
        undoing it would take the new holder's sandbox away."""
        request = SandboxRequest(record.sandbox_id, record.pool, binding.isolation, binding.owner,
                                 binding.session_id, timeout, bound_at=binding.created_at)
        try:
            async with self.renewing(record, self.lease_for(record.pool)) as lease:
                endpoint = await step.run(request)
        except ForeignSandbox:
            step.report("not_found")
            with contextlib.suppress(GatewayError):
                await step.undo(record.sandbox_id, held=lease.deadlines)
            raise foreign(self.events, binding) from None
        except BaseException as exc:
            step.report(outcome_of(exc))
            message = exc.message if isinstance(exc, GatewayError) else step.interrupted
            with contextlib.suppress(GatewayError):
                await step.undo(record.sandbox_id, error=message, held=lease.deadlines)
            if isinstance(exc, GatewayError | asyncio.CancelledError):
                raise
            log.exception("provider failed %s %s", step.doing, record.sandbox_id)
            raise ProvisionFailed(f"{step.doing} sandbox {record.sandbox_id} failed",
                                  sandbox_id=record.sandbox_id) from exc
        try:
            ready = await self.store.mark_ready(record.sandbox_id, endpoint, held=lease.deadlines)
        except LeaseLost:
            # Its renewals came too late (a starved loop): another caller took the reservation over and
            # provisions the same sandbox. Not ready by us: counted apart, joined by the caller.
            step.report(LEASE_LOST)
            log.warning("the lease on sandbox %s was taken over while it was being %s; joining its new holder",
                        record.sandbox_id, step.done)
            raise
        except NotReserved:
            # Destroyed (reaped, session deleted) while it was being provisioned.
            step.report("removed")
            raise ProvisionFailed(f"sandbox {record.sandbox_id} was removed while it was being {step.done}; retry",
                                  sandbox_id=record.sandbox_id) from None
        step.report("ready")
        return ready

    async def resume(self, record: SandboxRecord, binding: Binding, timeout: float) -> SandboxRecord:
        """Resume a sandbox this caller reserved (``Reserved.RESUME``); on failure it goes back to
        ``suspended`` with the error, which every waiter shares."""
        pool = record.pool
        ready = await self.provision(record, binding, timeout, Provisioning(
            self.provider.resume, self.store.mark_suspended, lambda outcome: self.events.resumed(pool, outcome),
            "resuming", "resumed", "resuming the sandbox was interrupted"))
        log.info("resumed sandbox %s (pool %s)", record.sandbox_id, record.pool)
        return ready

    # suspend ----------------------------------------------------------------
    async def suspend(self, record: SandboxRecord, *, reason: str,
                      idle_before: float = math.inf) -> SandboxRecord | None:
        """Suspend a ready sandbox; None when it was not ready (any more), or was active at or after
        ``idle_before`` (the store's compare-and-set: the reaper's view may be stale), and nothing was done."""
        store = self.store
        if not self.provider.can_suspend(record.pool):
            raise Conflict(f"sandboxes of pool {record.pool!r} cannot be suspended (its provider keeps no "
                           f"state to wake); delete the session instead", sandbox_id=record.sandbox_id)
        lease = self.lease_for(record.pool)
        suspending = await store.begin_suspend(record.sandbox_id, lease, idle_before)
        if suspending is None:
            return None
        log.info("suspending sandbox %s (pool %s): %s", record.sandbox_id, record.pool, reason)
        outcome = "suspended"
        try:
            async with self.renewing(suspending, lease) as held:
                await self.provider.suspend(record.sandbox_id, record.pool)
        except BaseException as exc:
            outcome = outcome_of(exc)
            # Recorded as suspended all the same: its next request resumes it, and resume is
            # idempotent (a sandbox that kept running just answers). Never left half-way.
            log.warning("suspending sandbox %s failed (%s); it is woken by its next request",
                        record.sandbox_id, exc)
            if not isinstance(exc, Exception):
                with contextlib.suppress(GatewayError):
                    await store.mark_suspended(record.sandbox_id, held=held.deadlines)
                raise
        finally:
            self.events.suspended(record.pool, outcome)
        # Fenced: a suspend whose lease lapsed and was taken over by a wake leaves the wake's record alone.
        return await store.mark_suspended(record.sandbox_id, held=held.deadlines)

    async def suspend_when_quiet(self, record: SandboxRecord, grace: float,
                                 flush_activity: Callable[[], Awaitable[None]]) -> SandboxRecord | None:
        """The operator's suspend: wait up to ``grace`` seconds for the sandbox's open exchanges to
        end, then suspend it; ``Conflict`` (409) naming them when they outlast the grace.
        ``flush_activity`` writes this replica's own recorded requests to the store first.

        "Open" is what protects a sandbox from idle reaping, on every replica: a long request or
        stream counted in the store, or a request begun within ``activity_grace`` (one younger than
        the data plane's LONG_REQUEST_AFTER is known only by its start). The suspend itself is the
        store's compare-and-set on that activity, so a request that starts meanwhile wins."""
        store, tuning = self.store, self.tuning
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        quiet_at: float | None = None  # when it was first seen quiet (loop time)
        while True:
            await flush_activity()  # this replica's own requests count at once
            current = await store.get_sandbox(record.sandbox_id)
            if current is None or current.state is not SandboxState.READY:
                return None
            quiet_since = self.clock() - tuning.activity_grace
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
                    f"open, its last request began {max(0.0, self.clock() - current.last_active):.1f}s ago "
                    f"(a request counts as open for activity_grace, {tuning.activity_grace:g}s); "
                    f"retry later, wait longer with ?grace=SECONDS, or cut them with ?force=true",
                    sandbox_id=record.sandbox_id)
            await asyncio.sleep(min(QUIET_POLL, left))

    # reaping ----------------------------------------------------------------
    async def destroy(self, record: SandboxRecord, *, reason: str) -> None:
        """Delete a sandbox at its provider, then forget it (and its per-session bindings)."""
        store = self.store
        log.info("destroying sandbox %s (pool %s): %s", record.sandbox_id, record.pool, reason)
        await self.provider.delete(record.sandbox_id, record.pool)
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
        # -- reaping (issue 27.5: batches sized by the backlog, gateway.reaper) --
        store, tuning = self.store, self.tuning
        now = self.clock()
        if not await self.lease.renew():
            return []
        reaped = await ReapPass(store, self.provider, self.events, tuning, now, lease_for=self.lease_for,
                                renewing=self.renewing, keep_lease=self.lease.renew,
                                clock=self.clock).run(self.view.pools)
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
        store, provider = self.store, self.provider
        if not await self.lease.renew():
            return []
        now = self.clock()
        if await store.epoch() > now - grace:
            return []  # the store began (or lost its data) within the grace: sessions may yet come back
        page = await provider.managed_page(self._sweep_from, self.tuning.sweep_batch)
        self._sweep_from = page.next
        known = await store.existing_sandboxes([managed.sandbox_id for managed in page.items])
        swept = []
        for managed in page.items:
            if orphaned(managed.sandbox_id in known, managed.created_at, now, grace):
                log.info("sweeping orphaned sandbox %s (pool %s)", managed.sandbox_id, managed.pool)
                await provider.delete(managed.sandbox_id, managed.pool)
                self.events.reaped("orphan")
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


def unknown_session() -> NotFound:
    # The same answer whether the session does not exist or belongs to someone else.
    return NotFound("no such session for this identity")


def foreign(events: RouterEvents, binding: Binding) -> NotFound:
    """A sandbox that is another identity's, asked for through ``binding``: counted, logged, and
    answered as an unknown session (never saying whose it is)."""
    events.denied("sandbox_owner_mismatch")
    log.warning("denied: session %r asked for sandbox %s, which belongs to another identity",
                binding.session_id, binding.sandbox_id)
    return unknown_session()

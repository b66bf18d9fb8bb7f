"""The embedded default store: one process, everything in dictionaries.

Atomicity comes for free: no method awaits between reading and writing, so on
one event loop every method is a critical section. Waiters for a creation are
futures resolved by ``mark_ready``/``release_sandbox``.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter, defaultdict
import bisect
from collections.abc import Callable, Collection, Mapping, Sequence

from gateway.model import Binding, Endpoint, SandboxRecord, SandboxState
from gateway.store.base import (
    ANY_SANDBOX, LIVE_STATES, UNSETTLED_STATES, Caps, Claim, Due, FleetCounts, Invalidation, LeaseLost, NotReserved,
    Position, Released, Reservation, Reserved, SandboxFilter, SandboxPage, Settled, Settlement, SettleTimeout,
)
from routing import Isolation, per_session_sandbox_id

class MemoryStore:
    """``SessionStore`` for a single gateway process."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._bindings: dict[str, Binding] = {}
        self._session_seen: dict[str, float] = {}
        self._sandboxes: dict[str, SandboxRecord] = {}
        # Live records (LIVE_STATES) per pool and per org, kept with _sandboxes: a cap check costs no scan.
        self._per_pool: Counter[str] = Counter()
        self._per_org: Counter[str | None] = Counter()
        self._per_state: Counter[tuple[str, SandboxState]] = Counter()  # the gauges, kept like the caps
        self._sessions_per_pool: Counter[str] = Counter()
        self._sandbox_sessions: dict[str, set[str]] = defaultdict(set)
        self._streams: dict[str, int] = defaultdict(int)
        self._leases: dict[str, tuple[str, float]] = {}
        self._claims: dict[str, str] = {}  # sandbox ID -> the reaper claim (token) it is suspending or deleting under
        self._epoch = clock()
        self._waiters: dict[str, list[asyncio.Future[Settlement]]] = defaultdict(list)
        self._subscribers: list[Invalidation] = []

    # bindings ------------------------------------------------------------
    async def get_binding(self, session_id: str) -> Binding | None:
        return self._bindings.get(session_id)

    async def put_binding(self, binding: Binding) -> Binding:
        stored = self._bindings.setdefault(binding.session_id, binding)
        if stored is binding:
            self._session_seen[binding.session_id] = binding.created_at
            self._sessions_per_pool[binding.pool] += 1
            self._sandbox_sessions[binding.sandbox_id].add(binding.session_id)
        return stored

    async def delete_binding(self, session_id: str) -> Binding | None:
        binding = self._bindings.pop(session_id, None)
        self._session_seen.pop(session_id, None)
        if binding is not None:
            self._sessions_per_pool[binding.pool] -= 1
            sessions = self._sandbox_sessions.get(binding.sandbox_id)
            if sessions is not None:
                sessions.discard(session_id)
                if not sessions:
                    del self._sandbox_sessions[binding.sandbox_id]
            self._publish(session_id)
        return binding

    async def sessions_of(self, sandbox_id: str) -> list[str]:
        return sorted(self._sandbox_sessions.get(sandbox_id, ()))

    # sandboxes -----------------------------------------------------------
    async def get_sandbox(self, sandbox_id: str) -> SandboxRecord | None:
        return self._with_sessions(self._sandboxes.get(sandbox_id))

    async def scan_sandboxes(self, after: Position | None, *, limit: int, scan: int,
                             before: float = float("inf"), where: SandboxFilter = ANY_SANDBOX) -> SandboxPage:
        # One process, a few sandboxes: sorting per call is the simple way to the same order as Redis. A
        # state or pool filter reads only its matches, as Redis reads its state-and-pool indexes.
        indexed = SandboxFilter(where.pool, where.state)
        order = sorted((r.last_active, r.sandbox_id) for r in self._sandboxes.values() if indexed.matches(r))
        start = 0 if after is None else bisect.bisect_right(order, after.key())
        stop = min(start + scan, bisect.bisect_left(order, (before, "")))
        found: list[SandboxRecord] = []
        for index in range(start, stop):
            record = self._sandboxes[order[index][1]]
            if where.matches(record):
                found.append(self._with_sessions(record))  # type: ignore[arg-type]
                if len(found) == limit:
                    stop = index + 1
                    break
        more = stop < len(order) and order[stop][0] < before
        return SandboxPage(found, Position(*order[stop - 1]) if more and stop > start else None)

    async def existing_sandboxes(self, sandbox_ids: Sequence[str]) -> set[str]:
        return {sandbox_id for sandbox_id in sandbox_ids if sandbox_id in self._sandboxes}

    async def fleet_counts(self) -> FleetCounts:
        return FleetCounts({k: v for k, v in self._per_state.items() if v},
                           {k: v for k, v in self._sessions_per_pool.items() if v})

    async def reserve_sandbox(self, record: SandboxRecord, caps: Caps, lease_seconds: float) -> Reservation:
        now = self._clock()
        existing = self._sandboxes.get(record.sandbox_id)
        if existing is not None:
            expired = existing.lease_until < now
            if existing.state is SandboxState.SUSPENDED or (
                    expired and existing.state in (SandboxState.SUSPENDING, SandboxState.RESUMING)):
                return self._reserve_resume(existing, caps, now, lease_seconds)
            if not (existing.state in (SandboxState.CREATING, SandboxState.DELETING) and expired):
                return Reservation(self._with_sessions(existing), Reserved.EXISTING)  # type: ignore[arg-type]
            self._claims.pop(record.sandbox_id, None)
        # An expired creation (or reaper's delete) is taken over: it does not count against its own takeover.
        stale = 1 if existing is not None and existing.state in LIVE_STATES else 0
        in_pool = self._per_pool[record.pool] - (stale if existing and existing.pool == record.pool else 0)
        in_org = self._per_org[record.org_id] - (stale if existing and existing.org_id == record.org_id else 0)
        scope = caps.scope_reached(record, in_pool, in_org)
        if scope is not None:
            raise caps.exceeded(record, scope)
        if existing is not None:
            self._count(existing, -1)
        fresh = record.with_(state=SandboxState.CREATING, lease_until=now + lease_seconds,
                             last_active=max(record.last_active, record.created_at))
        self._sandboxes[record.sandbox_id] = fresh
        self._count(fresh, 1)
        return Reservation(self._with_sessions(fresh),  # type: ignore[arg-type]
                           Reserved.CREATED if existing is None else Reserved.TAKEN_OVER)

    def _reserve_resume(self, existing: SandboxRecord, caps: Caps, now: float, lease_seconds: float) -> Reservation:
        """Wake a suspended record (or take over a suspend or resume whose holder's lease expired)."""
        counted = 1 if existing.state in LIVE_STATES else 0  # it does not count against its own wake
        scope = caps.scope_reached(existing, self._per_pool[existing.pool] - counted,
                                   self._per_org[existing.org_id] - counted)
        if scope is not None:
            raise caps.exceeded(existing, scope)
        resuming = existing.with_(state=SandboxState.RESUMING, lease_until=now + lease_seconds)
        self._replace(existing, resuming)
        self._claims.pop(existing.sandbox_id, None)
        return Reservation(self._with_sessions(resuming), Reserved.RESUME)  # type: ignore[arg-type]

    def _count(self, record: SandboxRecord, delta: int) -> None:
        if record.state in LIVE_STATES:
            self._per_pool[record.pool] += delta
            self._per_org[record.org_id] += delta
        self._per_state[record.pool, record.state] += delta

    def _replace(self, current: SandboxRecord, new: SandboxRecord) -> None:
        self._count(current, -1)
        self._sandboxes[new.sandbox_id] = new
        self._count(new, 1)

    async def begin_suspend(self, sandbox_id: str, lease_seconds: float,
                            idle_before: float = math.inf) -> SandboxRecord | None:
        current = self._sandboxes.get(sandbox_id)
        if current is None or current.state is not SandboxState.READY or current.last_active >= idle_before:
            return None
        suspending = current.with_(state=SandboxState.SUSPENDING, lease_until=self._clock() + lease_seconds)
        self._replace(current, suspending)
        self._publish(sandbox_id)
        return self._with_sessions(suspending)

    async def extend_lease(self, sandbox_id: str, held: Collection[float], until: float) -> bool:
        current = self._sandboxes.get(sandbox_id)
        if current is None or current.state not in UNSETTLED_STATES or current.lease_until not in held:
            return False
        self._sandboxes[sandbox_id] = current.with_(lease_until=until)
        return True

    async def mark_suspended(self, sandbox_id: str, error: str | None = None,
                             held: Collection[float] | None = None) -> SandboxRecord | None:
        current = self._sandboxes.get(sandbox_id)
        if current is None or current.state not in (SandboxState.SUSPENDING, SandboxState.RESUMING):
            return None
        if held is not None and current.lease_until not in held:
            return None
        suspended = current.with_(state=SandboxState.SUSPENDED, endpoint=None, lease_until=0.0,
                                  last_active=self._clock())
        self._replace(current, suspended)
        suspended = self._with_sessions(suspended)  # type: ignore[assignment]
        self._settle(sandbox_id, Settlement(Settled.FAILED, error=error) if error
                     else Settlement(Settled.SUSPENDED, suspended))
        self._publish(sandbox_id)
        return suspended

    async def mark_ready(self, sandbox_id: str, endpoint: Endpoint,
                         held: Collection[float] | None = None) -> SandboxRecord:
        current = self._sandboxes.get(sandbox_id)
        if current is None:
            raise NotReserved(sandbox_id)
        if held is not None:
            if current.state not in (SandboxState.CREATING, SandboxState.RESUMING) or current.lease_until not in held:
                raise LeaseLost(sandbox_id)
        elif current.state in (SandboxState.SUSPENDING, SandboxState.SUSPENDED, SandboxState.DELETING):
            raise NotReserved(sandbox_id)
        # Becoming ready is activity: a creation or wake slower than an idle timeout is not idle at once.
        ready = current.with_(state=SandboxState.READY, endpoint=endpoint, lease_until=0.0,
                              last_active=max(current.last_active, self._clock()))
        self._count(current, -1)
        self._sandboxes[sandbox_id] = ready
        self._count(ready, 1)
        ready = self._with_sessions(ready)  # type: ignore[assignment]
        self._settle(sandbox_id, Settlement(Settled.READY, ready))
        if current.state is SandboxState.RESUMING:
            self._publish(sandbox_id)  # a resumed sandbox may answer at a new endpoint
        return ready

    async def release_sandbox(self, sandbox_id: str, error: str | None = None,
                              held: Collection[float] | None = None) -> SandboxRecord | None:
        if held is not None:
            current = self._sandboxes.get(sandbox_id)
            if current is None or current.state is not SandboxState.CREATING or current.lease_until not in held:
                return None  # not this caller's reservation (any more): left alone, nobody woken
        record = self._sandboxes.pop(sandbox_id, None)
        self._streams.pop(sandbox_id, None)
        self._claims.pop(sandbox_id, None)
        self._settle(sandbox_id, Settlement.removed(error))
        if record is not None:
            self._count(record, -1)
            for session_id in self._sandbox_sessions.get(sandbox_id, ()):
                if self._kept_by(session_id) == sandbox_id:
                    self._session_seen[session_id] = self._clock()  # it outlived its sandbox: idle from now
            self._publish(sandbox_id)
        return record

    async def backfill_indexes(self, limit: int) -> bool:
        return True  # nothing written before the indexes: scan_sandboxes filters as it reads

    async def claim_due(self, due: Sequence[Due], lease_until: float, token: str) -> list[Claim]:
        return [self._claim(one, lease_until, token) for one in due]

    def _claim(self, due: Due, lease_until: float, token: str) -> Claim:
        current = self._sandboxes.get(due.sandbox_id)
        if current is None or current.state is not due.state:
            return Claim.CHANGED
        if current.state in (SandboxState.DELETING, SandboxState.SUSPENDING):
            if current.lease_until >= self._clock():
                return Claim.CHANGED  # its holder still holds it
        elif current.last_active >= due.before:
            return Claim.CHANGED
        if due.check_streams and self._streams.get(due.sandbox_id):
            return Claim.BUSY
        self._replace(current, current.with_(state=due.to, lease_until=lease_until))
        self._claims[due.sandbox_id] = token
        self._publish(due.sandbox_id)
        return Claim.CLAIMED

    async def finish_due(self, suspended: Sequence[str], deleted: Sequence[str], token: str) -> list[str]:
        ours = {sandbox_id for sandbox_id, held in self._claims.items() if held == token}
        for sandbox_id in suspended:
            if sandbox_id in ours and self._sandboxes[sandbox_id].state is SandboxState.SUSPENDING:
                del self._claims[sandbox_id]
                await self.mark_suspended(sandbox_id)
        still_bound = []
        for sandbox_id in deleted:
            if sandbox_id in ours and self._sandboxes[sandbox_id].state is SandboxState.DELETING:
                await self.release_sandbox(sandbox_id)
                for session_id in list(self._sandbox_sessions.get(sandbox_id, ())):
                    if self._kept_by(session_id) == sandbox_id:
                        await self.delete_binding(session_id)  # its own session's binding goes with it
                if self._sandbox_sessions.get(sandbox_id):
                    still_bound.append(sandbox_id)
        return still_bound

    async def release_unreachable(self, sandbox_id: str, endpoint: Endpoint) -> Released:
        record = self._sandboxes.get(sandbox_id)
        if record is None:
            return Released.ABSENT
        if record.state is not SandboxState.READY or record.endpoint != endpoint:
            return Released.CHANGED
        await self.release_sandbox(sandbox_id)  # no error: a waiter reserves again
        return Released.RELEASED

    async def wait_settled(self, sandbox_id: str, timeout: float) -> Settlement:
        record = self._sandboxes.get(sandbox_id)
        if record is None:
            return Settlement(Settled.REMOVED)
        if record.state is SandboxState.SUSPENDED:
            return Settlement(Settled.SUSPENDED, self._with_sessions(record))
        if record.state not in UNSETTLED_STATES:
            return Settlement(Settled.READY, self._with_sessions(record))
        future: asyncio.Future[Settlement] = asyncio.get_running_loop().create_future()
        self._waiters[sandbox_id].append(future)
        try:
            async with asyncio.timeout(timeout):
                return await future
        except TimeoutError:
            raise SettleTimeout(sandbox_id, timeout) from None
        finally:
            waiters = self._waiters.get(sandbox_id)
            if waiters and future in waiters:
                waiters.remove(future)

    def waiting(self, sandbox_id: str) -> int:
        """How many ``wait_settled`` calls wait for the record's next settlement."""
        return len(self._waiters.get(sandbox_id, ()))

    # activity and streams -----------------------------------------------
    async def touch(self, sandboxes: Mapping[str, float], sessions: Mapping[str, float]) -> None:
        for sandbox_id, at in sandboxes.items():
            record = self._sandboxes.get(sandbox_id)
            if record is not None and at > record.last_active:
                self._sandboxes[sandbox_id] = record.with_(last_active=at)
        for session_id, at in sessions.items():
            if session_id in self._session_seen and at > self._session_seen[session_id]:
                self._session_seen[session_id] = at

    async def idle_sessions(self, before: float, limit: int) -> list[str]:
        idle = sorted((seen, s) for s, seen in self._session_seen.items()
                      if seen < before and self._kept_by(s) not in self._sandboxes)
        return [s for _seen, s in idle[:limit]]

    def _kept_by(self, session_id: str) -> str | None:
        """The sandbox a session's binding lives as long as: its own per-session sandbox (whose record
        keeps it from being idle; its release starts its idle time), else None."""
        binding = self._bindings.get(session_id)
        if binding is None or binding.isolation is not Isolation.PER_SESSION:
            return None
        if binding.sandbox_id != per_session_sandbox_id(session_id):
            return None
        return binding.sandbox_id

    async def add_streams(self, deltas: Mapping[str, int]) -> None:
        for sandbox_id, delta in deltas.items():
            count = self._streams[sandbox_id] + delta
            if count > 0:
                self._streams[sandbox_id] = count
            else:
                self._streams.pop(sandbox_id, None)

    async def open_streams(self, sandbox_id: str) -> int:
        return self._streams.get(sandbox_id, 0)

    # coordination -------------------------------------------------------
    async def epoch(self) -> float:
        return self._epoch

    async def acquire_lease(self, name: str, holder: str, ttl: float) -> bool:
        now = self._clock()
        current = self._leases.get(name)
        if current is None or current[0] == holder or current[1] < now:
            self._leases[name] = (holder, now + ttl)
            return True
        return False

    async def release_lease(self, name: str, holder: str) -> None:
        current = self._leases.get(name)
        if current is not None and current[0] == holder:
            del self._leases[name]

    def subscribe(self, callback: Invalidation) -> None:
        self._subscribers.append(callback)

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        for waiters in self._waiters.values():
            for future in waiters:
                if not future.done():
                    future.cancel()
        self._waiters.clear()

    # internals ----------------------------------------------------------
    def _with_sessions(self, record: SandboxRecord | None) -> SandboxRecord | None:
        if record is None:
            return None
        return record.with_(sessions=len(self._sandbox_sessions.get(record.sandbox_id, ())))

    def _settle(self, sandbox_id: str, outcome: Settlement) -> None:
        for future in self._waiters.pop(sandbox_id, []):
            if not future.done():
                future.set_result(outcome)

    def _publish(self, key: str) -> None:
        for callback in self._subscribers:
            callback(key)


"""The ``SessionStore`` seam: what the SessionRouter needs from shared state.

The router owns this seam: the protocol, its outcomes and its errors are
declared here, beside nothing else, and both stores speak only these types (no
outcome strings, no sentinel texts, no builtin exceptions as signals).

Two implementations run the very same contract tests (``tests/store_contract.py``):
``memory`` (one process, the embedded default) and ``redis`` (any number of
replicas). Every method is atomic on its own; nothing requires the caller to
read, modify and write.

Create-once protocol (what makes concurrent first requests cause exactly one
creation, on any replica):

1. ``reserve_sandbox`` atomically either returns the existing record
   (``Reserved.EXISTING``) or inserts a ``creating`` record holding a lease and
   counting against the caps (``Reserved.CREATED``). A ``creating`` record whose
   lease has expired (its creator died) is taken over by the next caller
   (``Reserved.TAKEN_OVER``: the caller creates, as for ``CREATED``).
2. The creator calls ``mark_ready`` with the endpoint, or ``release_sandbox``
   with an error; either wakes every waiter, on every replica.
3. Everyone else calls ``wait_settled`` and shares the outcome (a ``Settled``).

Wake-once is the same reservation: ``reserve_sandbox`` on a ``suspended`` record
(or one whose suspend or resume holder's lease expired) moves it to ``resuming``
under the caller's lease, counted against the caps again (``Reserved.RESUME``:
the caller resumes it). The resumer calls ``mark_ready`` with the (perhaps new)
endpoint, or ``mark_suspended`` with an error; everyone else waits in
``wait_settled`` as for a creation. Suspending is ``begin_suspend`` (``ready`` ->
``suspending``, every replica's cached route dropped) then ``mark_suspended``
(no compute, not counted by the caps; its "last activity" becomes the time it
was suspended, from which ``retention`` counts).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from gateway.errors import CapacityExceeded
from gateway.model import ANY_SANDBOX, Binding, Endpoint, Position, SandboxFilter, SandboxRecord, SandboxState

Invalidation = Callable[[str], None]
"""Called with a session ID or sandbox ID whose cached route is no longer valid."""

LIVE_STATES = frozenset({SandboxState.CREATING, SandboxState.READY, SandboxState.SUSPENDING, SandboxState.RESUMING})
"""States that hold (or are about to hold) compute: counted by the caps. ``suspended`` is not."""
UNSETTLED_STATES = frozenset({SandboxState.CREATING, SandboxState.SUSPENDING, SandboxState.RESUMING,
                              SandboxState.DELETING})
"""States under a lease, that ``wait_settled`` waits out (``deleting``: the reaper deletes it; then reserve again)."""

INVALIDATE_ALL = "*"
"""Passed to an ``Invalidation`` when invalidations may have been missed (a pub/sub reconnect)."""


class StoreSignal(Exception):
    """Base of what the seam signals to its caller; never reaches a client (the router maps each)."""


class NotReserved(StoreSignal):
    """``mark_ready`` found no record to complete: it was released (reaped, deleted) meanwhile."""

    def __init__(self, sandbox_id: str) -> None:
        super().__init__(f"sandbox {sandbox_id} has no reservation")
        self.sandbox_id = sandbox_id


class LeaseLost(StoreSignal):
    """``mark_ready`` found the record no longer reserved under a lease the caller holds: its lease lapsed
    and another caller took the reservation over (or has completed it since). The caller made nothing
    ready: it joins the holder's outcome as any waiter does."""

    def __init__(self, sandbox_id: str) -> None:
        super().__init__(f"the lease on sandbox {sandbox_id} was taken over")
        self.sandbox_id = sandbox_id


class SettleTimeout(StoreSignal):
    """``wait_settled`` gave up: the sandbox was still being created (or woken) when its time ran out."""

    def __init__(self, sandbox_id: str, timeout: float) -> None:
        super().__init__(f"sandbox {sandbox_id} was still being created after {timeout:g}s")
        self.sandbox_id = sandbox_id
        self.timeout = timeout


class CapScope(StrEnum):
    """Which cap refused a reservation (also the metrics label)."""

    POOL = "pool"
    ORG = "org"


@dataclass(frozen=True, slots=True)
class Caps:
    """Limits checked atomically when a sandbox is reserved. None = unlimited."""

    pool_max: int | None = None
    org_max: int | None = None

    def exceeded(self, record: SandboxRecord, scope: CapScope) -> CapacityExceeded:
        """The one ``CapacityExceeded`` both stores raise, naming the cap and the setting to change."""
        if scope is CapScope.POOL:
            return CapacityExceeded(
                f"pool {record.pool!r} is at its cap of {self.pool_max} sandboxes (max_sandboxes); retry later",
                scope=scope,
            )
        return CapacityExceeded(
            f"org {record.org_id!r} is at its cap of {self.org_max} sandboxes "
            f"(orgs.{record.org_id}.max_sandboxes); retry later",
            scope=scope,
        )

    def scope_reached(self, record: SandboxRecord, in_pool: int, in_org: int) -> CapScope | None:
        """The cap reserving ``record`` would exceed, given the live sandboxes already counted
        (``in_pool``/``in_org``, not counting ``record`` itself); None when it fits."""
        if self.pool_max is not None and in_pool >= self.pool_max:
            return CapScope.POOL
        if self.org_max is not None and record.org_id is not None and in_org >= self.org_max:
            return CapScope.ORG
        return None


class Reserved(StrEnum):
    CREATED = "created"        # a new record: the caller creates the sandbox
    TAKEN_OVER = "taken"       # a creation whose creator died (lease expired): the caller creates it
    RESUME = "resume"          # a suspended record, now resuming under the caller's lease: the caller resumes it
    EXISTING = "existing"      # someone else's record (creating, ready, being suspended or resumed)


@dataclass(frozen=True, slots=True)
class Reservation:
    record: SandboxRecord
    outcome: Reserved

    @property
    def created(self) -> bool:
        """True when the caller holds the creation (new or taken over)."""
        return self.outcome is Reserved.CREATED or self.outcome is Reserved.TAKEN_OVER


class Settled(StrEnum):
    READY = "ready"            # the record is ready: use it
    FAILED = "failed"          # the creator failed: share its error
    REMOVED = "removed"        # the record went away without an error: reserve again
    ABANDONED = "abandoned"    # the creator's (or resumer's) lease expired: reserve again (and take it over)
    SUSPENDED = "suspended"    # the record is suspended: reserve again, which wakes it


class Released(StrEnum):
    """The outcome of ``release_unreachable``: whether this caller took the record away."""

    RELEASED = "released"      # it was ready at that endpoint and is gone now: the caller re-creates (create-once)
    CHANGED = "changed"        # it is not that ready incarnation any more (re-created, moved, being created)
    ABSENT = "absent"          # there was no record


@dataclass(frozen=True, slots=True)
class Settlement:
    """The outcome of a creation: the ready record, or the creator's error."""

    outcome: Settled
    record: SandboxRecord | None = None
    error: str | None = None

    @classmethod
    def removed(cls, error: str | None) -> Settlement:
        """A record released with ``error`` (FAILED) or without one (REMOVED)."""
        return cls(Settled.FAILED, error=error) if error else cls(Settled.REMOVED)


@dataclass(frozen=True, slots=True)
class SandboxPage:
    """Records of one bounded scan, and where the next scan starts (None: the index is exhausted)."""

    records: list[SandboxRecord]
    next: Position | None


class Claim(StrEnum):
    """What ``claim_due`` did with one ``Due``."""

    CLAIMED = "claimed"        # moved to its ``to`` state under the reaper's lease and token
    CHANGED = "changed"        # not as the verdict saw it any more (used, woken, released): nothing done
    BUSY = "busy"              # streams are recorded for it (perhaps a dead replica's): nothing done


@dataclass(frozen=True, slots=True)
class Due:
    """A sandbox the reaper's verdict says to suspend or delete, with what the verdict saw: it is claimed
    only while still in ``state`` and not active at or after ``before`` (a compare-and-set in the store, as
    ``begin_suspend``'s): the reaper's page may pair an old activity with a record used since."""

    sandbox_id: str
    state: SandboxState        # ready, suspended; deleting or suspending: one whose holder's lease lapsed
    before: float
    to: SandboxState           # SUSPENDING or DELETING
    check_streams: bool = True  # refuse a record while streams are recorded for it (Claim.BUSY)


@dataclass(frozen=True, slots=True)
class FleetCounts:
    """What the gauges report, kept incrementally by the store (never counted by a scan)."""

    sandboxes: Mapping[tuple[str, SandboxState], int] = field(default_factory=dict)  # (pool, state) -> live
    sessions: Mapping[str, int] = field(default_factory=dict)  # pool -> bound sessions


class SessionStore(Protocol):
    # bindings
    async def get_binding(self, session_id: str) -> Binding | None: ...
    async def put_binding(self, binding: Binding) -> Binding:
        """Store if absent and return what is stored: an existing binding always wins."""
    async def delete_binding(self, session_id: str) -> Binding | None: ...
    async def sessions_of(self, sandbox_id: str) -> list[str]: ...

    # sandboxes and create-once
    async def get_sandbox(self, sandbox_id: str) -> SandboxRecord | None: ...
    async def scan_sandboxes(self, after: Position | None, *, limit: int, scan: int,
                             before: float = float("inf"), where: SandboxFilter = ANY_SANDBOX) -> SandboxPage:
        """Records in (last activity, ID) order after ``after`` whose last activity is < ``before``:
        at most ``limit`` matching ``where``, having examined at most ``scan`` index entries. Bounded
        work whatever the fleet size; a filtered page may be short (even empty) with a ``next``."""
    async def existing_sandboxes(self, sandbox_ids: Sequence[str]) -> set[str]:
        """Those of ``sandbox_ids`` that have a record (one batched check)."""
    async def fleet_counts(self) -> FleetCounts: ...
    async def backfill_indexes(self, limit: int) -> bool:
        """List records written by a version before the state-and-pool indexes in them, up to ``limit``
        per call (the reaper's lease holder, every pass); True once every record was listed. Until then,
        filtered listings read the whole index, and the reaper sees only what the indexes hold; after, a
        call sweeps on only while a replica of that version still writes (a rolling upgrade)."""
    async def claim_due(self, due: Sequence[Due], lease_until: float, token: str) -> list[Claim]:
        """The reaper's batch compare-and-set (one round trip): each ``Due`` still as its verdict saw it
        moves to its ``to`` state (``suspending``, or ``deleting``: not live, not counted by the caps)
        under a lease until ``lease_until`` and ``token``, dropping every replica's cached route.
        A request for a claimed record waits for it to settle (``wait_settled``) as for a creation."""
    async def finish_due(self, suspended: Sequence[str], deleted: Sequence[str], token: str) -> list[str]:
        """Settle what one claim (``token``) did, in one round trip: ``suspended`` sandboxes become
        ``suspended``; ``deleted`` ones lose their record (waiters reserve again: REMOVED) and the
        binding of their own session. A record no longer this claim's (its lease lapsed and it was
        taken over) is left alone. Returns the deleted sandboxes that still have sessions bound."""
    async def reserve_sandbox(self, record: SandboxRecord, caps: Caps, lease_seconds: float) -> Reservation:
        """Raise ``caps.exceeded(...)`` (``CapacityExceeded``) when a cap is reached (a creation, or
        the wake of a suspended record)."""
    async def mark_ready(self, sandbox_id: str, endpoint: Endpoint,
                         held: Collection[float] | None = None) -> SandboxRecord:
        """Raise ``NotReserved`` when there is no creating, resuming (or ready) record to complete.
        Becoming ready is activity: the record's last activity moves to now.

        ``held``: the lease deadlines the caller may hold its reservation under (the last one confirmed,
        and those of renewals sent whose answer did not come): it completes the record only while it is
        creating or resuming under one of them, else raises ``LeaseLost`` (the lease lapsed and was
        taken over; the record may be the new holder's, or ready by now); ``NotReserved`` when there is
        no record. None: no lease to check (a loader that reserves and completes in one go)."""
    async def release_sandbox(self, sandbox_id: str, error: str | None = None,
                              held: Collection[float] | None = None) -> SandboxRecord | None:
        """Remove the record (freeing capacity) and wake waiters: FAILED with ``error``, else REMOVED.
        ``held``: a creator undoing its own creation (the lease deadlines it may hold, as ``mark_ready``):
        only a record creating under one of them goes; else None, nothing changed, nobody woken."""
    async def begin_suspend(self, sandbox_id: str, lease_seconds: float,
                            idle_before: float = math.inf) -> SandboxRecord | None:
        """``ready`` -> ``suspending`` under a lease, dropping every replica's cached route; None
        (nothing changed) when the record is not ready, or was active at or after ``idle_before``.

        The idle check is part of the compare-and-set: the reaper's page of the index may be older
        than the record (a sandbox woken, or used, since), and only the store sees both at once."""
    async def extend_lease(self, sandbox_id: str, held: Collection[float], until: float) -> bool:
        """Renew the lease of a creation, suspend or wake the caller holds (its record is unsettled
        and its lease ends at one of ``held``: the deadline the caller was given or last confirmed, and
        those of renewals whose answer was lost, which may have run) to ``until``, which the caller
        computed (so a renewal whose reply is lost is still known to it). False when the caller holds
        it no more (settled, released, or taken over after it lapsed): it must stop renewing."""
    async def mark_suspended(self, sandbox_id: str, error: str | None = None,
                             held: Collection[float] | None = None) -> SandboxRecord | None:
        """``suspending`` or ``resuming`` -> ``suspended`` (endpoint gone, not counted by the caps,
        last activity = now), waking waiters: FAILED with ``error`` (a resume that failed), else
        SUSPENDED. None (nothing changed) in any other state, or when ``held`` (the lease deadlines
        the caller may hold, as ``mark_ready``) does not hold the record's lease."""
    async def release_unreachable(self, sandbox_id: str, endpoint: Endpoint) -> Released:
        """``release_sandbox``, but only while the record is ready at ``endpoint``: of many replicas
        that found the same incarnation dead, exactly one releases it (the rest get CHANGED/ABSENT)."""
    async def wait_settled(self, sandbox_id: str, timeout: float) -> Settlement:
        """Wait until the record is not ``creating``, ``resuming`` or ``suspending``; raise
        ``SettleTimeout`` past ``timeout``."""
    def waiting(self, sandbox_id: str) -> int:
        """How many of this instance's ``wait_settled`` calls have read the record and wait for its next settlement."""

    # activity and streams
    async def touch(self, sandboxes: Mapping[str, float], sessions: Mapping[str, float]) -> None: ...
    async def idle_sessions(self, before: float, limit: int) -> list[str]:
        """Up to ``limit`` sessions last seen before ``before``, least recently seen first. A session
        bound to its own per-session sandbox is not idle while that sandbox has a record (its binding
        lives as long as the sandbox); from the record's release its idle time starts."""
    async def add_streams(self, deltas: Mapping[str, int]) -> None: ...
    async def open_streams(self, sandbox_id: str) -> int: ...

    # coordination
    async def epoch(self) -> float:
        """When this store's data began: its creation, or the moment a store that lost its data (Redis
        restarted without persistence) was first used again. Sandboxes older than the store are not
        orphans until their sessions had time to come back for them (the orphan sweep's grace)."""
    async def acquire_lease(self, name: str, holder: str, ttl: float) -> bool:
        """Take or renew a named lease; True while ``holder`` holds it."""
    async def release_lease(self, name: str, holder: str) -> None:
        """Give up a lease ``holder`` holds, so the next to ask takes it at once (a replica that
        stops); another holder's lease is left alone."""
    def subscribe(self, callback: Invalidation) -> None: ...
    async def ping(self) -> None:
        """Raise ``StoreUnavailable`` when the store cannot serve."""
    async def close(self) -> None: ...

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

States beyond ``creating``/``ready`` (suspend and resume) extend
``SandboxState`` and ``Settled``; the seam's shape stays.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from gateway.errors import CapacityExceeded
from gateway.model import Binding, Endpoint, SandboxRecord

Invalidation = Callable[[str], None]
"""Called with a session ID or sandbox ID whose cached route is no longer valid."""

INVALIDATE_ALL = "*"
"""Passed to an ``Invalidation`` when invalidations may have been missed (a pub/sub reconnect)."""


class StoreSignal(Exception):
    """Base of what the seam signals to its caller; never reaches a client (the router maps each)."""


class NotReserved(StoreSignal):
    """``mark_ready`` found no record to complete: it was released (reaped, deleted) meanwhile."""

    def __init__(self, sandbox_id: str) -> None:
        super().__init__(f"sandbox {sandbox_id} has no reservation")
        self.sandbox_id = sandbox_id


class SettleTimeout(StoreSignal):
    """``wait_settled`` gave up: the sandbox was still being created when its time ran out."""

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
    EXISTING = "existing"      # someone else's record (creating or ready): the caller does not create


@dataclass(frozen=True, slots=True)
class Reservation:
    record: SandboxRecord
    outcome: Reserved

    @property
    def created(self) -> bool:
        """True when the caller holds the creation (new or taken over)."""
        return self.outcome is not Reserved.EXISTING


class Settled(StrEnum):
    READY = "ready"            # the record is ready: use it
    FAILED = "failed"          # the creator failed: share its error
    REMOVED = "removed"        # the record went away without an error: reserve again
    ABANDONED = "abandoned"    # the creator's lease expired: reserve again (and take it over)


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


class SessionStore(Protocol):
    # bindings
    async def get_binding(self, session_id: str) -> Binding | None: ...
    async def put_binding(self, binding: Binding) -> Binding:
        """Store if absent and return what is stored: an existing binding always wins."""
    async def delete_binding(self, session_id: str) -> Binding | None: ...
    async def sessions_of(self, sandbox_id: str) -> list[str]: ...

    # sandboxes and create-once
    async def get_sandbox(self, sandbox_id: str) -> SandboxRecord | None: ...
    async def list_sandboxes(self) -> list[SandboxRecord]: ...
    async def reserve_sandbox(self, record: SandboxRecord, caps: Caps, lease_seconds: float) -> Reservation:
        """Raise ``caps.exceeded(...)`` (``CapacityExceeded``) when a cap is reached."""
    async def mark_ready(self, sandbox_id: str, endpoint: Endpoint) -> SandboxRecord:
        """Raise ``NotReserved`` when there is no record to complete."""
    async def release_sandbox(self, sandbox_id: str, error: str | None = None) -> SandboxRecord | None:
        """Remove the record (freeing capacity) and wake waiters: FAILED with ``error``, else REMOVED."""
    async def wait_settled(self, sandbox_id: str, timeout: float) -> Settlement:
        """Wait until the record is not ``creating``; raise ``SettleTimeout`` past ``timeout``."""

    # activity and streams
    async def touch(self, sandboxes: Mapping[str, float], sessions: Mapping[str, float]) -> None: ...
    async def idle_sandboxes(self, pool: str, before: float) -> list[SandboxRecord]: ...
    async def idle_sessions(self, before: float) -> list[str]: ...
    async def add_streams(self, deltas: Mapping[str, int]) -> None: ...
    async def open_streams(self, sandbox_id: str) -> int: ...

    # coordination
    async def acquire_lease(self, name: str, holder: str, ttl: float) -> bool:
        """Take or renew a named lease; True while ``holder`` holds it."""
    def subscribe(self, callback: Invalidation) -> None: ...
    async def ping(self) -> None:
        """Raise ``StoreUnavailable`` when the store cannot serve."""
    async def close(self) -> None: ...

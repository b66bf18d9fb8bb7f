"""The ``SessionStore`` seam: what the SessionRouter needs from shared state.

Two implementations run the very same contract tests (``tests/store_contract.py``):
``memory`` (one process, the embedded default) and ``redis`` (any number of
replicas). Every method is atomic on its own; nothing requires the caller to
read, modify and write.

Create-once protocol (what makes concurrent first requests cause exactly one
creation, on any replica):

1. ``reserve_sandbox`` atomically either returns the existing record
   (``created=False``) or inserts a ``creating`` record holding a lease and
   counting against the caps (``created=True``). A ``creating`` record whose
   lease has expired (its creator died) is taken over by the next caller.
2. The creator calls ``mark_ready`` with the endpoint, or ``release_sandbox``
   with an error; either wakes every waiter, on every replica.
3. Everyone else calls ``wait_settled`` and shares the outcome.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from gateway.model import Binding, Endpoint, SandboxRecord

Invalidation = Callable[[str], None]
"""Called with a session ID or sandbox ID whose cached route is no longer valid."""

REMOVED = "the sandbox was removed"
"""A settlement's error when the record went away without a creation error: retry, don't fail."""

INVALIDATE_ALL = "*"
"""Passed to an ``Invalidation`` when invalidations may have been missed (a pub/sub reconnect)."""


@dataclass(frozen=True, slots=True)
class Caps:
    """Limits checked atomically when a sandbox is reserved. None = unlimited."""

    pool_max: int | None = None
    org_max: int | None = None


@dataclass(frozen=True, slots=True)
class Reservation:
    record: SandboxRecord
    created: bool


@dataclass(frozen=True, slots=True)
class Settlement:
    """The outcome of a creation: the ready record, or the creator's error."""

    record: SandboxRecord | None
    error: str | None = None


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
        """Raise ``CapacityExceeded`` (scope ``pool`` or ``org``) when a cap is reached."""
    async def mark_ready(self, sandbox_id: str, endpoint: Endpoint) -> SandboxRecord: ...
    async def release_sandbox(self, sandbox_id: str, error: str | None = None) -> SandboxRecord | None:
        """Remove the record (freeing capacity) and wake waiters with ``error``."""
    async def wait_settled(self, sandbox_id: str, timeout: float) -> Settlement:
        """Wait until the record is not ``creating``; raise ``TimeoutError`` past ``timeout``."""

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

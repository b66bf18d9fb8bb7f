"""The ``SandboxProvider`` seam: create, find and destroy sandboxes.

A provider is idempotent on the sandbox ID: ``ensure`` for an ID that already
exists adopts it, so a creation retried after a crash (on this or another
replica) never makes a second sandbox. It adopts only a sandbox of the same
owner (``SandboxRequest.may_claim``); another owner's sandbox raises
``ForeignSandbox``, never an endpoint. Providers report sandboxes that died
through the ``on_lost`` callback given to ``start``; the router then forgets
the route and the next request re-creates the sandbox. A replica that was not
told (it did not start the sandbox, its watch lagged) and cannot reach it asks
``probe``, which answers from the provider's own view, never from memory of who
created what, so that any replica can heal any sandbox. ``managed_page`` lists
this installation's objects a bounded page at a time, for the orphan sweep.

Pools whose provider ``can_suspend`` may suspend idle sandboxes: ``suspend`` takes
their compute away and keeps their files (a local directory, Kubernetes PVCs),
``resume`` brings them back (perhaps at a new endpoint). Both are idempotent, so
a suspend or resume retried after a replica died finishes the job.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from gateway.errors import ProvisionFailed
from gateway.model import Endpoint, ManagedSandbox, SandboxRequest

LostHandler = Callable[[str], None]


class ForeignSandbox(Exception):
    """``ensure`` found the sandbox, but it belongs to another identity (or cannot be shown to be
    the caller's): it is never adopted. A signal to the router, which answers exactly as for an
    unknown session (``NotFound``) and counts the denial; never shown to a client as such."""

    def __init__(self, sandbox_id: str) -> None:
        super().__init__(f"sandbox {sandbox_id} belongs to another identity")
        self.sandbox_id = sandbox_id


@dataclass(frozen=True, slots=True)
class ManagedPage:
    """One bounded page of a provider's objects, and the opaque cursor of the next (None: the end)."""

    items: list[ManagedSandbox]
    next: str | None


class Probe(StrEnum):
    """What a provider can tell about a sandbox a request could not reach."""

    ALIVE = "alive"        # it exists and answers: the failure was transient
    GONE = "gone"          # it does not exist (or its process died): it may be re-created
    UNKNOWN = "unknown"    # the provider cannot tell (static hosts, an API that did not answer)


class SandboxProvider(Protocol):
    async def start(self, on_lost: LostHandler) -> None: ...
    async def ensure(self, request: SandboxRequest) -> Endpoint:
        """Create (or adopt) the sandbox and return its endpoint once it is ready."""
    async def delete(self, sandbox_id: str, pool: str) -> None:
        """Destroy the sandbox (suspended or not); one that does not exist counts as deleted."""
    async def suspend(self, sandbox_id: str, pool: str) -> None:
        """Take the sandbox's compute away, keep its files (idempotent: a suspended one stays so)."""
    async def resume(self, request: SandboxRequest) -> Endpoint:
        """Run the suspended sandbox again and return its endpoint once ready (idempotent: a
        running one just answers); raises what ``ensure`` raises."""
    def can_suspend(self, pool: str) -> bool:
        """Whether ``suspend`` means anything for this pool's sandboxes."""
    async def list_managed(self) -> list[ManagedSandbox]: ...
    async def managed_page(self, cursor: str | None, limit: int) -> ManagedPage:
        """At most ``limit`` of this installation's objects after ``cursor`` (None: from the start)."""
    async def probe(self, sandbox_id: str, pool: str) -> Probe:
        """Whether the sandbox still exists, by the provider's own view (for healing, any replica)."""
    async def close(self) -> None:
        """Release clients; sandboxes stay alive (shutdown drains, it does not destroy)."""
    def describe(self) -> str:
        """Where this provider's sandboxes live, for the startup log."""


class PoolProviders:
    """Dispatches each pool to the provider that serves it; itself a ``SandboxProvider``."""

    def __init__(self, by_pool: Mapping[str, SandboxProvider]) -> None:
        self._by_pool = dict(by_pool)
        # One provider may serve several pools; start and close it once.
        self._distinct = list({id(p): p for p in self._by_pool.values()}.values())

    @property
    def distinct(self) -> list[SandboxProvider]:
        """Each provider once (``/readyz`` asks those that can say whether their backend answers)."""
        return list(self._distinct)

    def for_pool(self, pool: str) -> SandboxProvider:
        try:
            return self._by_pool[pool]
        except KeyError:
            raise ProvisionFailed(f"no provider serves pool {pool!r}") from None

    async def start(self, on_lost: LostHandler) -> None:
        for provider in self._distinct:
            await provider.start(on_lost)

    async def ensure(self, request: SandboxRequest) -> Endpoint:
        return await self.for_pool(request.pool).ensure(request)

    async def delete(self, sandbox_id: str, pool: str) -> None:
        await self.for_pool(pool).delete(sandbox_id, pool)

    async def suspend(self, sandbox_id: str, pool: str) -> None:
        await self.for_pool(pool).suspend(sandbox_id, pool)

    async def resume(self, request: SandboxRequest) -> Endpoint:
        return await self.for_pool(request.pool).resume(request)

    def can_suspend(self, pool: str) -> bool:
        provider = self._by_pool.get(pool)
        return provider is not None and provider.can_suspend(pool)

    async def list_managed(self) -> list[ManagedSandbox]:
        found: list[ManagedSandbox] = []
        for provider in self._distinct:
            found.extend(await provider.list_managed())
        return found

    async def managed_page(self, cursor: str | None, limit: int) -> ManagedPage:
        # The cursor is [provider index, that provider's cursor]: one provider's page per call.
        index, inner = json.loads(cursor) if cursor else (0, None)
        if index >= len(self._distinct):
            return ManagedPage([], None)
        page = await self._distinct[index].managed_page(inner, limit)
        if page.next is not None:
            return ManagedPage(page.items, json.dumps([index, page.next]))
        following = index + 1
        return ManagedPage(page.items, json.dumps([following, None]) if following < len(self._distinct) else None)

    async def probe(self, sandbox_id: str, pool: str) -> Probe:
        return await self.for_pool(pool).probe(sandbox_id, pool)

    async def close(self) -> None:
        for provider in self._distinct:
            await provider.close()

    def describe(self) -> list[str]:
        """One line per provider for the startup log (each provider says where its sandboxes live)."""
        return [provider.describe() for provider in self._distinct]

"""The ``SandboxProvider`` contract: one set of tests every provider passes.

Use it by subclassing :class:`ProviderContract` in a test module that provides a ``harness``
fixture: a started provider plus the few provider-specific moves the contract needs (hold a
sandbox's readiness, make one that cannot start, lose one behind the provider's back).
``tests/test_providers.py`` runs it over the local provider (real runtime processes), the
static provider (a fleet of one real runtime) and the Kubernetes provider (the fake apiserver
through the real kubernetes_asyncio client), as ``tests/store_contract.py`` runs over the stores.

A provider that cannot do a step says so in its harness (``creates``, ``holds_readiness``,
``reports_lost``, each with a reason): the static provider creates and destroys nothing, so
the contract checks what it does instead (a stable host, a no-op delete) or skips with that
reason, never silently.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from gateway.errors import ProvisionFailed
from gateway.model import Endpoint, Isolation, Owner, SandboxRequest
from gateway.providers.base import SandboxProvider
from tests.proxy_helpers import sandbox_http

POOL = "small"
SETTLE = 0.2  # how long a held creation is watched to check that it does *not* return early


def request(sandbox_id: str, pool: str = POOL, timeout: float = 30.0) -> SandboxRequest:
    return SandboxRequest(sandbox_id, pool, Isolation.PER_SESSION, Owner("acme", "alice", None), "sess-1", timeout)


async def answers(endpoint: Endpoint) -> bool:
    """The reference runtime's health check answers at ``endpoint``."""
    try:
        async with sandbox_http(endpoint.url()) as (http, base), \
                http.get(f"{base}/", timeout=aiohttp.ClientTimeout(total=5)) as response:
            return response.status == 200 and (await response.json())["status"] == "ok"
    except (aiohttp.ClientError, TimeoutError):
        return False


@dataclass
class LostReports:
    """What the provider reported through ``on_lost``; a test awaits a report instead of sleeping."""

    ids: list[str] = field(default_factory=list)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def __call__(self, sandbox_id: str) -> None:
        self.ids.append(sandbox_id)
        self._changed.set()

    async def wait_for(self, sandbox_id: str) -> None:
        while sandbox_id not in self.ids:
            self._changed.clear()
            await self._changed.wait()


@dataclass
class ProviderHarness:
    """A started provider and the provider-specific moves the contract needs.

    ``incarnation(id)`` names the one sandbox currently behind an ID (a pid, an object UID, a
    host), None when there is none: equal values mean the same sandbox was adopted, not re-made.
    """

    provider: SandboxProvider
    lost: LostReports
    incarnation: Callable[[str], Awaitable[Any]]
    replica: Callable[[], Awaitable[SandboxProvider]]      # another provider on the same backing (a replica)
    cannot_start: Callable[[SandboxRequest], Awaitable[object]]  # ensure a sandbox that cannot start
    creates: bool = True
    creates_reason: str = ""
    holds_readiness: bool = True
    holds_reason: str = ""
    hold: Callable[[str], Awaitable[None]] | None = None     # hold this ID's readiness ...
    release: Callable[[str], Awaitable[None]] | None = None  # ... and let it become ready
    reports_lost: bool = True
    lost_reason: str = ""
    lose: Callable[[str], Awaitable[None]] | None = None     # the sandbox dies behind the provider's back


class ProviderContract:
    async def test_ensure_returns_an_endpoint_that_answers(self, harness: ProviderHarness) -> None:
        endpoint = await harness.provider.ensure(request("ses-create"))
        assert await answers(endpoint)
        assert await harness.incarnation("ses-create") is not None

    async def test_ensure_again_adopts_the_same_sandbox(self, harness: ProviderHarness) -> None:
        first = await harness.provider.ensure(request("ses-again"))
        made = await harness.incarnation("ses-again")
        assert await harness.provider.ensure(request("ses-again")) == first
        replica = await harness.replica()  # another replica retrying the creation adopts it too
        assert await replica.ensure(request("ses-again")) == first
        assert await harness.incarnation("ses-again") == made

    async def test_list_managed_holds_what_it_created(self, harness: ProviderHarness) -> None:
        before = time.time()
        await harness.provider.ensure(request("ses-listed"))
        managed = {m.sandbox_id: m for m in await harness.provider.list_managed()}
        if not harness.creates:  # harness.creates_reason
            assert managed == {}, harness.creates_reason
            return
        assert set(managed) == {"ses-listed"}
        assert managed["ses-listed"].pool == POOL
        # Kubernetes keeps whole seconds: allow a second either side.
        assert before - 1 <= managed["ses-listed"].created_at <= time.time() + 1

    async def test_delete_destroys_it_and_ensure_makes_it_anew(self, harness: ProviderHarness) -> None:
        endpoint = await harness.provider.ensure(request("ses-delete"))
        made = await harness.incarnation("ses-delete")
        await harness.provider.delete("ses-delete", POOL)
        if not harness.creates:
            # Nothing to destroy: the fleet host keeps serving, and the ID maps onto it again.
            assert await answers(endpoint), harness.creates_reason
            assert await harness.provider.ensure(request("ses-delete")) == endpoint
            return
        assert await harness.incarnation("ses-delete") is None
        assert "ses-delete" not in {m.sandbox_id for m in await harness.provider.list_managed()}
        again = await harness.provider.ensure(request("ses-delete"))
        assert await answers(again)
        assert await harness.incarnation("ses-delete") not in (None, made)

    async def test_delete_of_a_missing_sandbox_is_no_error(self, harness: ProviderHarness) -> None:
        await harness.provider.delete("ses-never-made", POOL)
        assert "ses-never-made" not in {m.sandbox_id for m in await harness.provider.list_managed()}

    async def test_ensure_returns_only_once_the_sandbox_is_ready(self, harness: ProviderHarness) -> None:
        if not harness.holds_readiness:
            pytest.skip(harness.holds_reason)
        assert harness.hold is not None and harness.release is not None
        await harness.hold("ses-held")
        pending = asyncio.create_task(harness.provider.ensure(request("ses-held")))
        try:
            done, _ = await asyncio.wait([pending], timeout=SETTLE)
            assert not done, "ensure returned before the sandbox was ready"
            await harness.release("ses-held")
            assert await answers(await pending)
        finally:
            pending.cancel()

    async def test_a_sandbox_that_cannot_start_fails_with_a_typed_error(self, harness: ProviderHarness) -> None:
        with pytest.raises(ProvisionFailed) as info:
            await harness.cannot_start(request("ses-broken"))
        assert info.value.status == 503 and info.value.code == "provision_failed"
        assert info.value.sandbox_id == "ses-broken"

    async def test_a_lost_sandbox_is_reported_and_can_be_made_again(self, harness: ProviderHarness) -> None:
        if not harness.reports_lost:
            pytest.skip(harness.lost_reason)
        assert harness.lose is not None
        await harness.provider.ensure(request("ses-lost"))
        made = await harness.incarnation("ses-lost")
        await harness.lose("ses-lost")
        await harness.lost.wait_for("ses-lost")
        assert await answers(await harness.provider.ensure(request("ses-lost")))
        assert await harness.incarnation("ses-lost") not in (None, made)

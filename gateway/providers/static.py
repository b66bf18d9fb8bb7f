"""A fixed fleet: each pool is a list of upstream base URLs.

A sandbox ID maps onto one upstream by rendezvous hashing, so every replica
agrees with no coordination and adding a host moves only ~1/N of the IDs.
There is nothing to create or destroy: ``ensure`` is a pure lookup.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

from gateway.errors import ProvisionFailed
from gateway.model import Endpoint, ManagedSandbox, SandboxRequest
from gateway.providers.base import LostHandler, ManagedPage, Probe
from routing import RendezvousRing


def _endpoint(url: str) -> Endpoint:
    parts = urlsplit(url)
    if parts.hostname is None:
        raise ValueError(f"upstream {url!r} has no host")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return Endpoint(host=parts.hostname, port=port, scheme=parts.scheme)


class StaticProvider:
    def __init__(self, pools: Mapping[str, Sequence[str]]) -> None:
        self._rings = {pool: RendezvousRing(list(urls)) for pool, urls in pools.items()}
        self._endpoints = {url: _endpoint(url) for urls in pools.values() for url in urls}

    async def start(self, on_lost: LostHandler) -> None:
        return None

    async def ensure(self, request: SandboxRequest) -> Endpoint:
        ring = self._rings.get(request.pool)
        if ring is None:
            raise ProvisionFailed(f"pool {request.pool!r} has no static upstreams", sandbox_id=request.sandbox_id)
        return self._endpoints[ring.host_for(request.sandbox_id)]

    async def delete(self, sandbox_id: str, pool: str) -> None:
        return None

    async def suspend(self, sandbox_id: str, pool: str) -> None:
        # The policy refuses on_idle: suspend for static pools, and the router asks can_suspend first.
        raise ProvisionFailed(f"pool {pool!r} is static: its hosts are not the gateway's to suspend",
                              sandbox_id=sandbox_id)

    async def resume(self, request: SandboxRequest) -> Endpoint:
        return await self.ensure(request)

    def can_suspend(self, pool: str) -> bool:
        return False

    async def list_managed(self) -> list[ManagedSandbox]:
        # Static hosts are not created by us, so there is never an orphan to sweep.
        return []

    async def managed_page(self, cursor: str | None, limit: int) -> ManagedPage:
        return ManagedPage([], None)

    async def probe(self, sandbox_id: str, pool: str) -> Probe:
        return Probe.UNKNOWN  # a static host is not ours to judge or re-create

    async def close(self) -> None:
        return None

    def describe(self) -> str:
        return ", ".join(f"{pool}: {len(ring.hosts)} upstream(s)" for pool, ring in self._rings.items())


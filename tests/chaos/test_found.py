"""What the chaos run found in the gateway, each reduced to its smallest reproduction."""

from __future__ import annotations

import asyncio
import fcntl
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from gateway.model import ManagedSandbox
from gateway.providers.base import ManagedPage, PoolProviders
from gateway.providers._locks import FileLock
from gateway.sessions import SessionRouter
from gateway.store.memory import MemoryStore
from routing import Identity, parse_policy
from tests.clock import FakeClock
from tests.conftest import CountingProvider
from tests.fakekube.controller import FakeController
from tests.fakekube.errors import ApiError
from tests.fakekube.fixtures import TOKEN, FakeKube, write_kubeconfig
from tests.fakekube.server import FakeKubeServer

pytestmark = pytest.mark.chaos


@pytest.fixture
async def kube_deleting_after_conflict(tmp_path: Path) -> AsyncIterator[FakeKube]:
    """A fake apiserver where an object that made a create fail with 409 AlreadyExists is deleted
    right after (once): the gateway's create raced someone's delete (an orphan sweep on another
    replica, a session deleted while it is bound again)."""
    server = FakeKubeServer(token=TOKEN)
    sandboxes = server.crds.by_plural("sandboxes")
    raced: list[str] = []

    @web.middleware
    async def delete_after_conflict(request: web.Request, handler):  # type: ignore[no-untyped-def]
        try:
            return await handler(request)
        except ApiError as exc:
            if request.method == "POST" and exc.code == 409 and not raced:
                name = (await request.json())["metadata"]["name"]
                raced.append(name)
                server.api.delete(sandboxes, "v1beta1", "default", name)
            raise

    server.app.middlewares.append(delete_after_conflict)
    url = await server.start()
    controller = FakeController(server, ready_delay=0.0)
    await controller.start()
    kube = FakeKube(url, server, controller, write_kubeconfig(tmp_path / "kubeconfig", url, TOKEN))
    yield kube
    await kube.close()
    assert raced, "the race was never set up"


async def test_a_create_that_races_a_delete_creates_again(kube_deleting_after_conflict: FakeKube) -> None:
    """Create -> 409 (the object exists) -> GET finds nothing (it was deleted in between). The
    sandbox must be created again, not refused with 409 'not managed by installation': the chaos run
    saw that answer for a live session right after an orphan sweep."""
    # Imported here, not at collection: tests/test_errors.py lists GatewayError's subclasses when it is
    # collected, and the Kubernetes provider's KubeApiError, absent from gateway/errors.py's tree, would join.
    from tests.test_kubernetes import pool_options, request, started

    kube = kube_deleting_after_conflict
    provider = await started(kube, pool_options("sandbox", "v1beta1", 9))
    try:
        await provider.ensure(request("ses-race"))  # the object exists, ours ...
        endpoint = await provider.ensure(request("ses-race"))  # ... and is deleted under the next create
        assert endpoint.port == 9
        assert kube.server.create_count("sandboxes", "default", "ses-race") == 2
        assert kube.server.get_object("sandboxes", "default", "ses-race") is not None
    finally:
        await provider.close()


class ListingProvider(CountingProvider):
    """The counting fake, with a provider-side listing (what an orphan sweep reads)."""

    def __init__(self) -> None:
        super().__init__()
        self.managed: list[ManagedSandbox] = []

    async def managed_page(self, cursor: str | None, limit: int) -> ManagedPage:
        return ManagedPage(list(self.managed), None)


async def test_orphan_grace_counts_from_a_store_reset() -> None:
    """Lifecycle.sweep_orphans says ``grace`` protects "objects of a store that was just reset".
    A sandbox an hour old whose store was reset a moment ago is swept at once today."""
    clock = FakeClock(1_000_000.0)
    provider = ListingProvider()
    providers = PoolProviders({"small": provider, "shared": provider})
    policy = parse_policy("pools: {small: {}, shared: {}}\nrouting: {per_session_orgs: ['*']}", "t")
    before = SessionRouter(MemoryStore(clock=clock), providers, policy, replica_id="r", clock=clock)
    route = await before.resolve(Identity.parse(org_id="acme", user_id="alice", session_id="s1"))
    provider.managed = [ManagedSandbox(route.sandbox_id, route.pool, clock() - 3600)]
    after_reset = SessionRouter(MemoryStore(clock=clock), providers, policy, replica_id="r", clock=clock)
    assert await after_reset.lifecycle.sweep_orphans(grace=600) == []  # the session may still come back for it
    clock.advance(601)
    assert await after_reset.lifecycle.sweep_orphans(grace=600) == [route.sandbox_id]


async def test_a_lock_whose_file_a_delete_removed_is_taken_again(tmp_path: Path) -> None:
    """The local registry's per-sandbox lock: a delete removes the sandbox's directory (its lock file
    with it) while holding the lock. A caller that was waiting must not end up holding a lock on the
    removed file while the next caller locks a new file beside it: two creations of one sandbox at
    once. (The chaos run saw the neighbouring race: the directory removed between the waiter's mkdir
    and its open, and the create failing with FileNotFoundError, a 503 for a live session.)"""
    lock = tmp_path / "ses-x" / "lock"
    deleting = FileLock(lock)
    await deleting.__aenter__()
    waiter = FileLock(lock)
    waiting = asyncio.create_task(waiter.__aenter__())
    await asyncio.sleep(0)  # the waiter opens the lock file and finds it taken (it tries again later)
    shutil.rmtree(lock.parent)  # what LocalProvider.delete does under the lock
    await deleting.__aexit__()
    await waiting
    try:
        lock.parent.mkdir(exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)  # as the next caller opens it
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    finally:
        await waiter.__aexit__()

"""The reaper's batches (issue 27.5, ``gateway.reaper``): due records read from the state-and-pool
indexes, claimed and settled a chunk per store call, on the memory store and a real Redis.

The provider is the hand-written ``CountingProvider``; one subclass fails deletes on demand.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gateway.errors import ProvisionFailed
from gateway.metrics import Metrics
from gateway.model import SandboxState
from gateway.providers.base import PoolProviders
from gateway.sessions import RouterTuning, SessionRouter
from gateway.store.base import SessionStore
from gateway.store.memory import MemoryStore
from gateway.store.redis import RedisStore
from routing import Identity, parse_policy
from tests.clock import FakeClock
from tests.conftest import CountingProvider
from tests.redis_server import RedisServer
from tests.store_contract_fleet import assert_listings_match_records, wipe_state_indexes

POLICY = parse_policy("pools:\n  small: {idle_timeout: 10m}\n"
                      "  shared: {idle_timeout: 20m, on_idle: suspend, retention: 1h}\n"
                      "routing: {per_session_orgs: [acme]}\n", "test")


def user(i: int, org: str = "acme") -> Identity:
    return Identity.parse(org_id=org, user_id=f"u{i}", session_id=f"{org}-s{i}")


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest, clock: FakeClock) -> AsyncIterator[SessionStore]:
    if request.param == "memory":
        made: SessionStore = MemoryStore(clock=clock)
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        made = RedisStore(server.url, f"reap-{id(clock)}", "r1", clock=clock)
    yield made
    await made.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def router_on(store: SessionStore, provider: CountingProvider, clock: FakeClock, **tuning: float) -> SessionRouter:
    return SessionRouter(store, PoolProviders({"small": provider, "shared": provider}), POLICY, replica_id="r1",
                         clock=clock, events=Metrics(), tuning=RouterTuning(**tuning))  # type: ignore[arg-type]


async def test_one_pass_reaps_what_is_due_in_every_pool_and_nothing_else(
        store: SessionStore, clock: FakeClock, counting_provider: CountingProvider) -> None:
    """Per-session sandboxes idle past small's 10 minutes are deleted with their bindings, shared ones
    past 20 minutes suspended, and a suspended one past its retention deleted; one with a stream open
    and ones not idle long enough stay. Many chunks, one pass; the indexes still match the records."""
    router = router_on(store, counting_provider, clock, reap_batch=7, reap_concurrency=3)
    per_session = [await router.resolve(user(i)) for i in range(20)]  # small, one sandbox each
    shared = [await router.resolve(user(i, org="globex")) for i in range(5)]  # shared pool
    await router.flush_activity()
    await router.suspend_sandbox(shared[0].sandbox_id)
    clock.advance(3601)  # shared[0] past its retention; everything else idle
    streaming = per_session[0].sandbox_id
    router.stream_opened(streaming)
    await router.flush_activity()
    await router.resolve(user(1))  # in use again: not due
    await router.flush_activity()
    reaped = await router.lifecycle.reap_once()
    assert sorted(reaped) == sorted([r.sandbox_id for r in per_session[2:]] + [shared[0].sandbox_id])
    assert sorted(counting_provider.suspended) == sorted([shared[0].sandbox_id] + [r.sandbox_id for r in shared[1:]])
    states = {r.sandbox_id: r.state for r in (await store.scan_sandboxes(None, limit=100, scan=100)).records}
    assert states == {streaming: SandboxState.READY, per_session[1].sandbox_id: SandboxState.READY,
                      **{r.sandbox_id: SandboxState.SUSPENDED for r in shared[1:]}}
    assert await store.get_binding("acme-s5") is None  # a deleted per-session sandbox's binding went with it
    assert await store.get_binding("acme-s0") is not None
    await assert_listings_match_records(store)
    metrics = router.events
    assert isinstance(metrics, Metrics)
    assert (metrics.registry.get_sample_value("sgw_reap_rate") or 0) > 0
    assert metrics.registry.get_sample_value("sgw_reaps_total", {"reason": "idle"}) == 18
    assert metrics.registry.get_sample_value("sgw_reaps_total", {"reason": "retention"}) == 1
    assert await router.lifecycle.reap_once() == []  # nothing due any more


async def test_a_request_for_a_sandbox_being_deleted_gets_a_new_one(
        store: SessionStore, clock: FakeClock, counting_provider: CountingProvider) -> None:
    """Deleting is a compare-and-set and a stored state: a request that comes while the provider
    deletes waits for it, then creates the sandbox anew (never the half-deleted one)."""
    router = router_on(store, counting_provider, clock)
    first = await router.resolve(user(1))
    await router.flush_activity()
    clock.advance(601)
    arrived: list[SandboxState] = []
    request: list[asyncio.Task[object]] = []

    async def delete_while_a_request_comes(sandbox_id: str, pool: str) -> None:
        record = await store.get_sandbox(sandbox_id)
        assert record is not None
        arrived.append(record.state)
        request.append(asyncio.create_task(router.resolve(user(1))))
        await asyncio.sleep(0.05)
        counting_provider.deleted.append(sandbox_id)

    counting_provider.delete = delete_while_a_request_comes  # type: ignore[method-assign]
    assert await router.lifecycle.reap_once() == [first.sandbox_id]
    route = await request[0]
    assert arrived == [SandboxState.DELETING]
    assert route.sandbox_id == first.sandbox_id  # type: ignore[attr-defined]
    assert counting_provider.created[first.sandbox_id] == 2  # created anew after the delete
    fresh = await store.get_sandbox(first.sandbox_id)
    assert fresh is not None and fresh.state is SandboxState.READY


class FailingDeletes(CountingProvider):
    def __init__(self) -> None:
        super().__init__()
        self.failures = 1

    async def delete(self, sandbox_id: str, pool: str) -> None:
        if self.failures:
            self.failures -= 1
            raise ProvisionFailed("the provider could not delete it")
        await super().delete(sandbox_id, pool)


async def test_a_failed_delete_is_tried_again_once_its_lease_lapses(store: SessionStore, clock: FakeClock) -> None:
    provider = FailingDeletes()
    router = router_on(store, provider, clock)
    first = await router.resolve(user(1))
    await router.flush_activity()
    clock.advance(601)
    assert await router.lifecycle.reap_once() == []
    record = await store.get_sandbox(first.sandbox_id)
    assert record is not None and record.state is SandboxState.DELETING
    assert await router.lifecycle.reap_once() == []  # its lease still runs
    clock.advance(router.lifecycle.lease_for("small") + 1)
    assert await router.lifecycle.reap_once() == [first.sandbox_id]
    assert provider.deleted == [first.sandbox_id] and await store.get_sandbox(first.sandbox_id) is None
    await assert_listings_match_records(store)


async def test_sandboxes_of_an_earlier_version_are_reaped_after_an_upgrade(
        redis_server: RedisServer, counting_provider: CountingProvider) -> None:
    """Records written before the state-and-pool indexes are in none: the lease holder's pass lists
    them (the backfill) before it reads the indexes, so they are reaped like any other."""
    clock = FakeClock()
    store = RedisStore(redis_server.url, f"upgrade-{id(clock)}", "r1", clock=clock)
    try:
        router = router_on(store, counting_provider, clock)
        routes = [await router.resolve(user(i)) for i in range(12)]
        await router.flush_activity()
        await wipe_state_indexes(store)
        clock.advance(601)
        upgraded = RedisStore(redis_server.url, f"upgrade-{id(clock)}", "r2", clock=clock)
        try:
            reaped = await router_on(upgraded, counting_provider, clock).lifecycle.reap_once()
            assert sorted(reaped) == sorted(r.sandbox_id for r in routes)
        finally:
            await upgraded.close()
    finally:
        await store.close()


async def test_a_suspend_whose_replica_died_is_finished_by_the_next_pass(
        store: SessionStore, clock: FakeClock, counting_provider: CountingProvider) -> None:
    """A replica killed mid-suspend leaves the record ``suspending``: counted by the caps, and with no
    request to take it over, nothing else would ever finish it."""
    router = router_on(store, counting_provider, clock)
    route = await router.resolve(user(1, org="globex"))  # shared: on_idle suspend
    await router.flush_activity()
    assert await store.begin_suspend(route.sandbox_id, 10) is not None  # ...and that replica dies
    assert await router.lifecycle.reap_once() == [] and counting_provider.suspended == []  # its lease runs
    clock.advance(11)
    assert await router.lifecycle.reap_once() == []
    assert counting_provider.suspended == [route.sandbox_id]
    record = await store.get_sandbox(route.sandbox_id)
    assert record is not None and record.state is SandboxState.SUSPENDED
    assert (await store.fleet_counts()).sandboxes == {("shared", SandboxState.SUSPENDED): 1}

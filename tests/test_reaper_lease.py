"""The reaper lease is short and renewed: while its holder lives it keeps the lease however long it
runs; once the holder stops, another replica reaps as soon as the short lease lapses (not a minute
later). Two routers on one store: one real Redis (two RedisStores, as two replicas), or one
MemoryStore; time from the FakeClock."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable

import pytest

from gateway.providers.base import PoolProviders
from gateway.sessions import RouterTuning, SessionRouter
from gateway.store.base import SessionStore
from gateway.store.memory import MemoryStore
from gateway.store.redis import RedisStore
from routing import Identity, parse_policy

from tests.clock import FakeClock
from tests.conftest import CountingProvider
from tests.redis_server import RedisServer

POLICY = "pools:\n  small: {idle_timeout: 60s}\n  shared: {idle_timeout: 60s}\nrouting:\n  per_session_orgs: [iso]\n"
TUNING = RouterTuning()


@pytest.fixture(params=["memory", "redis"])
async def stores(request: pytest.FixtureRequest) -> AsyncIterator[Callable[[FakeClock], tuple[SessionStore, SessionStore]]]:
    """Two replicas' stores on one shared state."""
    made: list[SessionStore] = []

    def make(clock: FakeClock) -> tuple[SessionStore, SessionStore]:
        if request.param == "memory":
            shared = MemoryStore(clock=clock)
            made.append(shared)
            return shared, shared
        server: RedisServer = request.getfixturevalue("redis_server")
        prefix = f"lease-{uuid.uuid4().hex[:8]}"
        pair = (RedisStore(server.url, prefix, "r1", clock=clock), RedisStore(server.url, prefix, "r2", clock=clock))
        made.extend(pair)
        return pair

    yield make
    for store in made:
        await store.close()


async def test_a_dead_holders_lease_lapses_within_the_short_ttl(stores, counting_provider: CountingProvider) -> None:
    clock = FakeClock()
    store_a, store_b = stores(clock)
    provider = PoolProviders({"small": counting_provider, "shared": counting_provider})
    policy = parse_policy(POLICY, "test")
    holder = SessionRouter(store_a, provider, policy, replica_id="r1", clock=clock, tuning=TUNING)
    other = SessionRouter(store_b, provider, policy, replica_id="r2", clock=clock, tuning=TUNING)
    await provider.start(holder.sandbox_lost)
    created = clock.now
    route = await holder.resolve(Identity.parse(org_id="iso", user_id="u", session_id="s1"))

    assert await holder.lifecycle.lease.renew()
    # Renewed every few seconds, the lease outlives many TTLs: the other replica never gets it.
    for _ in range(int(4 * TUNING.reaper_lease_ttl / TUNING.reaper_lease_renew) + 1):
        clock.advance(TUNING.reaper_lease_renew)
        assert await holder.lifecycle.lease.renew()
        assert not await other.lifecycle.lease.renew()
    assert clock.now - created > 60  # the sandbox is idle now
    assert await other.lifecycle.reap_once() == []  # but it is not the other replica's to reap

    # The holder stops renewing (it died): its lease runs to its deadline, and not a moment longer.
    clock.advance(TUNING.reaper_lease_ttl)
    assert await other.lifecycle.reap_once() == []
    clock.advance(0.01)
    assert await other.lifecycle.reap_once() == [route.sandbox_id]
    assert counting_provider.deleted == [route.sandbox_id]
    assert not await holder.lifecycle.lease.renew()  # came back: the lease has moved on


def test_the_lease_is_renewed_several_times_within_its_ttl() -> None:
    assert TUNING.reaper_lease_ttl >= 3 * TUNING.reaper_lease_renew  # one slow renewal does not lose it
    assert TUNING.reaper_lease_ttl <= 15.0  # reaping pauses at most this long after its holder dies


async def test_a_replica_that_stops_gives_the_lease_up_at_once(redis_server: RedisServer, tmp_path) -> None:
    """Stopping a gateway releases the reaper lease it holds: the other replica takes it on its next
    renewal, not reaper_lease_ttl later."""
    from gateway.app import Gateway
    from gateway.settings import Settings
    from tests.proxy_helpers import listening_socket

    prefix = f"stop-{uuid.uuid4().hex[:8]}"

    def replica(name: str) -> Gateway:
        return Gateway.create(Settings(data_dir=tmp_path / name, redis_url=redis_server.url, replica_id=name,
                                       redis_prefix=prefix, drain_timeout=1.0, access_log=False))

    first, second = replica("a"), replica("b")
    await first.start(listening_socket(), listening_socket())
    await second.start(listening_socket(), listening_socket())
    try:
        assert await first.router.lifecycle.lease.renew()
        assert not await second.router.lifecycle.lease.renew()  # held by the first replica
        await first.stop()
        assert await second.router.lifecycle.lease.renew()  # at once
    finally:
        await second.stop()

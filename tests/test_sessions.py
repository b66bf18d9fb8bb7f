"""SessionRouter: binding, create-once, capacity, ownership, reaping, lost sandboxes."""

from __future__ import annotations

import asyncio

import pytest

from gateway.errors import CapacityExceeded, NotFound, ProvisionFailed
from gateway.model import SandboxState
from gateway.providers.base import PoolProviders
from gateway.sessions import RouterTuning, SessionRouter
from gateway.store.memory import MemoryStore
from routing import Identity, Isolation, default_policy, parse_policy

from tests.clock import FakeClock
from tests.conftest import CountingProvider

POLICY = """
pools:
  small: {max_sandboxes: 50, idle_timeout: 60s}
  shared: {idle_timeout: 120s}
routing:
  per_session_orgs: [iso]
orgs:
  capped: {max_sandboxes: 2, isolation: per_session}
"""


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_000_000.0)


@pytest.fixture
async def router(counting_provider: CountingProvider, clock: FakeClock) -> SessionRouter:
    store = MemoryStore(clock=clock)
    provider = PoolProviders({"small": counting_provider, "shared": counting_provider})
    r = SessionRouter(store, provider, parse_policy(POLICY, "test"), replica_id="r1", clock=clock)
    await provider.start(r.sandbox_lost)
    return r


def ident(session: str, org: str | None = "iso", user: str = "u1", bot: str | None = None) -> Identity:
    return Identity.parse(org_id=org, user_id=user, session_id=session, bot_id=bot)


async def test_hundred_concurrent_binds_of_one_session_create_one_sandbox(router, counting_provider):
    counting_provider.gate = asyncio.Event()
    tasks = [asyncio.create_task(router.resolve(ident("s1"))) for _ in range(100)]
    await counting_provider.wait_started(1)  # the one creation is held at the gate ...
    await asyncio.wait(tasks, timeout=0.05)  # ... while the other 99 pile up behind it (none may finish)
    assert not any(t.done() for t in tasks)
    counting_provider.gate.set()
    routes = await asyncio.gather(*tasks)
    assert {r.sandbox_id for r in routes} == {routes[0].sandbox_id}
    assert counting_provider.created == {routes[0].sandbox_id: 1}


@pytest.mark.parametrize(("org", "expected"), [
    pytest.param("iso", 50, id="per-session org: one sandbox per session"),
    pytest.param("open", 1, id="shared org: one sandbox for all sessions of a user"),
])
async def test_fifty_sessions(router, counting_provider, org, expected):
    await asyncio.gather(*(router.resolve(ident(f"s{i}", org=org)) for i in range(50)))
    assert len(counting_provider.created) == expected
    assert all(n == 1 for n in counting_provider.created.values())


async def test_stored_binding_wins_over_policy_change(router):
    first = await router.resolve(ident("s1", org="open"))
    router.view.replace(default_policy(["*"]))  # now everybody would be per-session
    router.invalidate("s1")
    again = await router.resolve(ident("s1", org="open"))
    assert again.sandbox_id == first.sandbox_id and first.sandbox_id.startswith("org-")
    fresh = await router.resolve(ident("s2", org="open"))
    assert fresh.sandbox_id.startswith("ses-")


async def test_pool_cap_rejects_with_429_and_creates_nothing(router, counting_provider):
    await asyncio.gather(*(router.resolve(ident(f"s{i}")) for i in range(50)))
    with pytest.raises(CapacityExceeded) as info:
        await router.resolve(ident("s50"))
    assert info.value.status == 429 and info.value.headers()["Retry-After"]
    assert "'small'" in info.value.message and "50" in info.value.message
    assert len(counting_provider.created) == 50
    assert await router.store.get_binding("s50") is None  # nothing half-created


async def test_org_cap_counts_creating_sandboxes(router, counting_provider):
    counting_provider.gate = asyncio.Event()
    pending = [asyncio.create_task(router.resolve(ident(f"c{i}", org="capped"))) for i in range(2)]
    await counting_provider.wait_started(2)  # both held at the gate: still creating, not ready
    with pytest.raises(CapacityExceeded) as info:
        await router.resolve(ident("c2", org="capped"))
    assert info.value.scope == "org" and "capped" in info.value.message
    counting_provider.gate.set()
    await asyncio.gather(*pending)


async def test_other_identity_gets_404_not_the_sandbox(router):
    await router.resolve(ident("s1", user="alice"))
    with pytest.raises(NotFound):
        await router.resolve(ident("s1", user="mallory"))  # from the cache
    router.invalidate("s1")
    with pytest.raises(NotFound):
        await router.resolve(ident("s1", user="mallory"))  # from the store
    with pytest.raises(NotFound):
        await router.resolve(ident("s1", user="alice", org="other"))


async def test_failed_creation_is_shared_and_leaves_nothing(router, counting_provider):
    counting_provider.fail_with = ProvisionFailed("image pull failed")
    results = await asyncio.gather(*(router.resolve(ident("s1")) for _ in range(5)), return_exceptions=True)
    assert all(isinstance(r, ProvisionFailed) and "image pull failed" in r.message for r in results)
    assert sum(counting_provider.created.values()) == 1
    assert (await router.sandboxes()).records == []
    assert await router.store.get_binding("s1") is None


async def test_idle_reaping_then_recreation(router, counting_provider, clock):
    per_session = await router.resolve(ident("s1"))
    shared = await router.resolve(ident("s2", org="open"))
    clock.now += 61  # past small's 60s, not shared's 120s
    await router.flush_activity()
    assert await router.lifecycle.reap_once() == [per_session.sandbox_id]
    assert await router.store.get_binding("s1") is None  # a ses- sandbox takes its session with it
    clock.now += 60
    assert await router.lifecycle.reap_once() == [shared.sandbox_id]
    assert await router.store.get_binding("s2") is not None  # shared: the binding survives
    again = await router.resolve(ident("s2", org="open"))
    assert again.sandbox_id == shared.sandbox_id and counting_provider.created[shared.sandbox_id] == 2


async def test_open_stream_keeps_a_sandbox_from_being_reaped(router, clock):
    route = await router.resolve(ident("s1"))
    router.stream_opened(route.sandbox_id)
    await router.flush_activity()
    clock.now += 3600
    assert await router.lifecycle.reap_once() == []
    router.stream_closed(route.sandbox_id)
    await router.flush_activity()
    clock.now += 61
    assert await router.lifecycle.reap_once() == [route.sandbox_id]


async def test_a_reload_reaches_the_lifecycle_and_every_subscriber(router, clock):
    """One view of the policy: what the router's view says after a reload is what its lifecycle reaps
    by, and a subscriber (the data plane's request timeouts) is told at once and at every reload."""
    seen: list[dict[str, float]] = []
    router.view.subscribe(lambda view: seen.append(view.request_timeouts))
    route = await router.resolve(ident("s1"))
    clock.now += 30
    await router.flush_activity()
    assert await router.lifecycle.reap_once() == []  # small's idle_timeout is 60s
    router.view.replace(parse_policy(POLICY.replace("idle_timeout: 60s}", "idle_timeout: 25s, request_timeout: 9s}"),
                                     "test"))
    assert await router.lifecycle.reap_once() == [route.sandbox_id]
    assert seen == [{}, {"small": 9.0}]


async def test_only_the_lease_holder_reaps(router, clock):
    long_lease = RouterTuning(reaper_lease_ttl=1000)
    first = SessionRouter(router.store, router.provider, router.view.policy, replica_id="r1", clock=clock, tuning=long_lease)
    other = SessionRouter(router.store, router.provider, router.view.policy, replica_id="r2", clock=clock, tuning=long_lease)
    await first.resolve(ident("s1"))
    clock.now += 61
    assert len(await first.lifecycle.reap_once()) == 1
    await first.resolve(ident("s2"))
    clock.now += 61
    assert await other.lifecycle.reap_once() == []  # r1 still holds the lease
    clock.now += 1000
    assert len(await other.lifecycle.reap_once()) == 1  # the lease moved once r1 stopped renewing it


async def test_deleting_a_session_destroys_its_per_session_sandbox(router, counting_provider):
    route = await router.resolve(ident("s1"))
    await router.close_session("s1")
    assert counting_provider.deleted == [route.sandbox_id]
    assert await router.store.get_sandbox(route.sandbox_id) is None
    with pytest.raises(NotFound):
        await router.lookup("s1")


async def test_deleting_a_session_keeps_a_shared_sandbox(router, counting_provider):
    await router.resolve(ident("s1", org="open"))
    await router.close_session("s1")
    assert counting_provider.deleted == []


async def test_lost_sandbox_is_recreated_on_next_request(router, counting_provider):
    route = await router.resolve(ident("s1"))
    settled = asyncio.Event()
    router.store.subscribe(lambda key: settled.set() if key == route.sandbox_id else None)
    counting_provider.on_lost(route.sandbox_id)
    await settled.wait()
    again = await router.resolve(ident("s1"))
    assert again.sandbox_id == route.sandbox_id
    assert counting_provider.created[route.sandbox_id] == 2
    record = await router.store.get_sandbox(route.sandbox_id)
    assert record is not None and record.state is SandboxState.READY


def test_dry_run_creates_nothing(router, counting_provider):
    placement = router.dry_run(ident("s1", org="capped"))
    assert placement.isolation is Isolation.PER_SESSION
    assert counting_provider.created == {}


async def test_reaping_is_bounded_per_pass_and_resumes(counting_provider, clock):
    """A pass examines at most reap_batch index entries; shared sandboxes idle past small's
    timeout but not their own are stepped over, never blocking small ones behind them."""
    store = MemoryStore(clock=clock)
    provider = PoolProviders({"small": counting_provider, "shared": counting_provider})
    router = SessionRouter(store, provider, parse_policy(POLICY, "test"), replica_id="r1", clock=clock,
                           tuning=RouterTuning(reap_batch=2))
    shared = [await router.resolve(ident(f"o{i}", org="open", user=f"u{i}")) for i in range(3)]
    clock.now += 1
    small = [await router.resolve(ident(f"s{i}")) for i in range(3)]
    await router.flush_activity()
    clock.now += 61  # small's 60s passed for all of them, shared's 120s for none
    reaped: list[str] = []
    for _ in range(4):
        reaped += await router.lifecycle.reap_once()
    assert sorted(reaped) == sorted(r.sandbox_id for r in small)
    assert [await store.get_sandbox(r.sandbox_id) is not None for r in shared] == [True] * 3


async def test_idle_sessions_are_forgotten_a_batch_per_pass(counting_provider, clock):
    store = MemoryStore(clock=clock)
    router = SessionRouter(store, PoolProviders({"small": counting_provider, "shared": counting_provider}),
                           parse_policy(POLICY, "test"), replica_id="r1", clock=clock,
                           tuning=RouterTuning(reap_batch=2, session_ttl=100))
    for i in range(3):
        await router.bind(ident(f"o{i}", org="open"))
    clock.now += 101
    await router.lifecycle.reap_once()
    assert [await store.get_binding(f"o{i}") is None for i in range(3)] == [True, True, False]
    await router.lifecycle.reap_once()
    assert await store.get_binding("o2") is None

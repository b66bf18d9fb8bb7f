"""A creation's or wake's lease fences what its holder writes (issue #27).

In a wake storm a replica's loop, starved by a hundred runtimes starting on two cores, renewed its
lease late: it lapsed, another replica took the wake over and resumed too, and both marked the
sandbox ready (104 resumes for 100). The holder now knows the deadlines it may hold; a ready (or an
undo) under a lease taken over is refused, counted ``lease_lost``, and its requests join the new
holder. Both stores, the memory store and a real redis-server, run the same cases.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Collection
from typing import Any

import pytest

from gateway.errors import StoreUnavailable
from gateway.metrics import Metrics
from gateway.model import Endpoint, SandboxRecord, SandboxState
from gateway.providers.base import PoolProviders
from gateway.sessions import SessionRouter
from gateway.store.base import Caps, LeaseLost, Reserved, SessionStore
from gateway.store.memory import MemoryStore
from gateway.store.redis import RedisStore
from routing import Identity, Policy, parse_policy
from tests.clock import FakeClock
from tests.conftest import CountingProvider
from tests.redis_server import RedisServer

ALICE = Identity.parse(org_id="acme", user_id="alice", session_id="s1")
WINNER = Endpoint("127.0.0.1", 10)


def _policy(wake_timeout: str) -> Policy:
    return parse_policy("pools:\n  small: {}\n  shared: {on_idle: suspend, wake_timeout: %s}\n" % wake_timeout, "test")


class StallingRenewals:
    """A store whose renewals can be held back (``stall``): a replica whose loop is too starved to
    renew in time. ``renewals`` records each renewal's answer; ``lose_reply`` makes the next renewal
    run and then fail as a reply lost to a socket timeout."""

    stall: asyncio.Event | None = None
    lose_reply = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.renewals: list[str] = []
        self.renewed = asyncio.Condition()

    async def extend_lease(self, sandbox_id: str, held: Collection[float], until: float) -> bool:
        if self.stall is not None:
            await self.stall.wait()
        renewed = await super().extend_lease(sandbox_id, held, until)  # type: ignore[misc]
        lost, self.lose_reply = self.lose_reply, False
        async with self.renewed:
            self.renewals.append("lost" if lost else str(renewed))
            self.renewed.notify_all()
        if lost:
            raise StoreUnavailable("the session store (redis) could not renew a lease: it did not answer in time")
        return bool(renewed)

    async def wait_renewals(self, count: int) -> None:
        async with self.renewed:
            await self.renewed.wait_for(lambda: len(self.renewals) >= count)


class StallingMemory(StallingRenewals, MemoryStore):
    pass


class StallingRedis(StallingRenewals, RedisStore):
    pass


StoreFactory = Callable[[str], SessionStore]


@pytest.fixture(params=["memory", "redis"])
async def stores(request: pytest.FixtureRequest, clock: FakeClock) -> AsyncIterator[StoreFactory]:
    """Stores of one installation, one per replica (the memory store: one shared by every replica)."""
    made: list[SessionStore] = []
    if request.param == "memory":
        shared = StallingMemory(clock=clock)
        yield lambda _replica: shared
        return
    server: RedisServer = request.getfixturevalue("redis_server")
    prefix = f"fence-{uuid.uuid4().hex[:8]}"

    def make(replica: str) -> SessionStore:
        made.append(StallingRedis(server.url, prefix, replica, clock=clock))
        return made[-1]
    yield make
    for store in made:
        await store.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def _router(store: SessionStore, provider: CountingProvider, replica: str, clock: FakeClock,
            metrics: Metrics, wake_timeout: str = "2s") -> SessionRouter:
    return SessionRouter(store, PoolProviders({"small": provider, "shared": provider}), _policy(wake_timeout),
                         replica_id=replica, clock=clock, events=metrics)


def _resumes(metrics: Metrics, outcome: str) -> float:
    return metrics.registry.get_sample_value("sgw_resumes_total", {"pool": "shared", "outcome": outcome}) or 0.0


async def test_a_waker_whose_lease_was_taken_over_marks_nothing_ready(stores: StoreFactory, clock: FakeClock) -> None:
    """The waker's renewals stall while its provider resumes; its lease lapses and another replica
    takes the wake over and finishes it. The waker's ready is refused: one ``ready`` in all, the winner's
    endpoint stands, and the requests the waker held are served by the winner's wake."""
    slow, fast = CountingProvider(), CountingProvider(WINNER)
    waker_metrics, other_metrics = Metrics(), Metrics()
    waker_store = store = stores("r0")
    waker = _router(store, slow, "r0", clock, waker_metrics)
    other = _router(stores("r1"), fast, "r1", clock, other_metrics)
    route = await waker.resolve(ALICE)
    await waker.suspend_sandbox(route.sandbox_id)
    assert isinstance(waker_store, StallingRenewals)
    slow.gate, waker_store.stall = asyncio.Event(), asyncio.Event()
    waking = asyncio.create_task(waker.resolve(ALICE))
    await slow.wait_resumed(1)
    held = asyncio.create_task(waker.resolve(ALICE))  # another request on the waker's replica: held by its wake
    clock.advance(waker.lifecycle.lease_for("shared") + 1)  # no renewal came: the lease lapsed
    taken = await other.resolve(ALICE)  # takes the wake over, resumes, marks it ready
    assert taken.sandbox_id == route.sandbox_id and fast.resumed == [route.sandbox_id]
    slow.gate.set()  # the late waker's provider answers now
    assert (await waking).sandbox_id == route.sandbox_id
    assert (await held).sandbox_id == route.sandbox_id
    waker_store.stall.set()
    record = await other.store.get_sandbox(route.sandbox_id)
    assert record is not None and record.state is SandboxState.READY and record.endpoint == WINNER
    assert _resumes(other_metrics, "ready") == 1 and _resumes(waker_metrics, "ready") == 0
    assert _resumes(waker_metrics, "lease_lost") == 1
    assert slow.suspended == [route.sandbox_id] and slow.deleted == []  # the loser undid nothing at the provider


async def test_a_creator_whose_lease_was_taken_over_marks_nothing_ready(stores: StoreFactory,
                                                                         clock: FakeClock) -> None:
    """The same for a creation: the late creator counts ``lease_lost`` in sgw_provisions_total, and
    its callers get the sandbox the new creator made ready."""
    slow, fast = CountingProvider(), CountingProvider(WINNER)
    creator_metrics, other_metrics = Metrics(), Metrics()
    creator_store = stores("r0")
    assert isinstance(creator_store, StallingRenewals)
    creator = _router(creator_store, slow, "r0", clock, creator_metrics)
    other = _router(stores("r1"), fast, "r1", clock, other_metrics)
    slow.gate, creator_store.stall = asyncio.Event(), asyncio.Event()
    creating = asyncio.create_task(creator.resolve(ALICE))
    await slow.wait_started(1)
    clock.advance(creator.lifecycle.lease_for("shared") + 1)
    taken = await other.resolve(ALICE)
    slow.gate.set()
    assert (await creating).sandbox_id == taken.sandbox_id
    creator_store.stall.set()
    record = await other.store.get_sandbox(taken.sandbox_id)
    assert record is not None and record.state is SandboxState.READY and record.endpoint == WINNER

    def provisions(metrics: Metrics, outcome: str) -> float:
        return metrics.registry.get_sample_value("sgw_provisions_total", {"pool": "shared", "outcome": outcome}) or 0

    assert provisions(other_metrics, "ready") == 1 and provisions(creator_metrics, "ready") == 0
    assert provisions(creator_metrics, "lease_lost") == 1


async def test_a_fenced_write_is_refused_after_a_takeover(stores: StoreFactory, clock: FakeClock) -> None:
    """At the store: the first holder's ready and undo both refuse once its lapsed lease is taken over;
    with the deadline it holds, the new holder's ready goes through."""
    store = stores("r0")
    fresh = await store.reserve_sandbox(_record(clock), Caps(), 5)
    clock.advance(6)
    taken = await store.reserve_sandbox(_record(clock), Caps(), 5)
    assert taken.outcome is Reserved.TAKEN_OVER
    first = {fresh.record.lease_until}
    assert await store.release_sandbox("org-1", error="late", held=first) is None
    with pytest.raises(LeaseLost):
        await store.mark_ready("org-1", WINNER, held=first)
    assert not await store.extend_lease("org-1", first, clock() + 5)
    ready = await store.mark_ready("org-1", WINNER, held={taken.record.lease_until})
    assert ready.state is SandboxState.READY
    with pytest.raises(LeaseLost):  # ready now, and not by this holder's hand: it joins it
        await store.mark_ready("org-1", WINNER, held=first)


def _record(clock: FakeClock) -> SandboxRecord:
    return SandboxRecord("org-1", "small", "acme", SandboxState.CREATING, created_at=clock())


async def test_a_renewal_whose_reply_was_lost_keeps_the_lease(stores: StoreFactory, clock: FakeClock) -> None:
    """A renewal that ran but whose reply timed out moved the lease to a deadline the waker never
    heard of: the next renewal (and the ready) must still be the waker's, not a lost lease."""
    provider = CountingProvider()
    metrics = Metrics()
    store = stores("r0")
    assert isinstance(store, StallingRenewals)
    router = _router(store, provider, "r0", clock, metrics)
    route = await router.resolve(ALICE)
    await router.suspend_sandbox(route.sandbox_id)
    provider.gate = asyncio.Event()
    store.lose_reply = True
    waking = asyncio.create_task(router.resolve(ALICE))
    await store.wait_renewals(2)  # the lost one, then the next (a quarter of the lease later)
    assert store.renewals[:2] == ["lost", "True"]
    provider.gate.set()
    assert (await waking).sandbox_id == route.sandbox_id
    assert provider.resumed == [route.sandbox_id] and _resumes(metrics, "ready") == 1


async def test_a_ready_during_a_renewal_in_flight_is_the_holders(stores: StoreFactory, clock: FakeClock) -> None:
    """A renewal sent and not answered yet: the store may hold either deadline, and both are the
    holder's (the set it passes to ``mark_ready``)."""
    store = stores("r0")
    reserved = await store.reserve_sandbox(_record(clock), Caps(), 5)
    pending = clock() + 7
    assert await store.extend_lease("org-1", {reserved.record.lease_until}, pending)  # ran; its reply not read yet
    ready = await store.mark_ready("org-1", WINNER, held={reserved.record.lease_until, pending})
    assert ready.state is SandboxState.READY

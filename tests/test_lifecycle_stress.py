"""Lifecycle under stress (issue #27), at the router: the reaper never suspends a sandbox it just
woke, a dead waker costs seconds, and a request held by a wake is answered 503 + Retry-After.

The fakes are hand-written: a store whose reaper page is older than its records (what a page of
the index is, under load), and the counting provider with its gate.
"""

from __future__ import annotations

import math

from gateway.model import SandboxState
from gateway.providers.base import PoolProviders
from gateway.sessions import SessionRouter
from gateway.store.base import ANY_SANDBOX, Position, SandboxFilter, SandboxPage
from gateway.store.memory import MemoryStore
from routing import Identity, parse_policy
from tests.clock import FakeClock
from tests.conftest import CountingProvider

ALICE = Identity.parse(org_id="acme", user_id="alice", session_id="s1")
SUSPEND_WHEN_IDLE = "pools:\n  small: {}\n  shared: {idle_timeout: 10m, on_idle: suspend, retention: 2h}\n"


class StalePageStore(MemoryStore):
    """The memory store, except that the reaper's page reports the last activity the test froze
    (``frozen``): the index as read a moment before a wake made the record ready and active again."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock=clock)
        self.frozen: dict[str, float] = {}

    async def scan_sandboxes(self, after: Position | None, *, limit: int, scan: int,
                             before: float = math.inf, where: SandboxFilter = ANY_SANDBOX) -> SandboxPage:
        page = await super().scan_sandboxes(after, limit=limit, scan=scan, where=where)
        stale = [r.with_(last_active=self.frozen.get(r.sandbox_id, r.last_active)) for r in page.records]
        return SandboxPage([r for r in stale if r.last_active < before], page.next)


async def test_the_reaper_never_suspends_a_sandbox_it_just_woke(counting_provider: CountingProvider) -> None:
    """The wake storm's 502s: one sandbox resumed, then suspended again at once, because the reaper
    paired the record's fresh ``ready`` with the index's stale last activity."""
    clock = FakeClock()
    store = StalePageStore(clock)
    router = SessionRouter(store, PoolProviders({"small": counting_provider, "shared": counting_provider}),
                           parse_policy(SUSPEND_WHEN_IDLE, "test"), replica_id="r1", clock=clock)
    route = await router.resolve(ALICE)
    await router.flush_activity()
    idle_since = clock()
    clock.advance(601 + router.tuning.activity_grace)
    await router.reap_once()
    assert counting_provider.suspended == [route.sandbox_id]  # idle: suspended once
    router.invalidate(route.session_id)
    await router.resolve(ALICE)  # woken by its next request: ready, active now
    assert counting_provider.resumed == [route.sandbox_id]
    store.frozen[route.sandbox_id] = idle_since  # ... while the reaper's page still says "idle"
    await router.reap_once()
    assert counting_provider.suspended == [route.sandbox_id]  # not suspended a second time
    record = await store.get_sandbox(route.sandbox_id)
    assert record is not None and record.state is SandboxState.READY

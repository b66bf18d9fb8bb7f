"""Lifecycle under stress (issue #27), at the router: the reaper never suspends a sandbox it just
woke, a dead waker costs seconds, and a request held by a wake is answered 503 + Retry-After.

The fakes are hand-written: a store whose reaper page is older than its records (what a page of
the index is, under load), and the counting provider with its gate.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Collection

import pytest

from gateway.api import create_control_app
from gateway.errors import Conflict, NotFound, StoreUnavailable, WakeTimeout
from gateway.metrics import Metrics
from gateway.model import SandboxState
from gateway.providers.base import PoolProviders
from gateway.sessions import RouterTuning, SessionRouter
from gateway.store.base import ANY_SANDBOX, Caps, Position, Reserved, SandboxFilter, SandboxPage, Settlement
from gateway.store.memory import MemoryStore
from gateway.store.redis import RedisStore
from routing import Identity, Policy, parse_policy
from tests.clock import FakeClock
from tests.conftest import CountingProvider
from tests.redis_server import RedisServer

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
    await router.lifecycle.reap_once()
    assert counting_provider.suspended == [route.sandbox_id]  # idle: suspended once
    router.invalidate(route.session_id)
    await router.resolve(ALICE)  # woken by its next request: ready, active now
    assert counting_provider.resumed == [route.sandbox_id]
    store.frozen[route.sandbox_id] = idle_since  # ... while the reaper's page still says "idle"
    await router.lifecycle.reap_once()
    assert counting_provider.suspended == [route.sandbox_id]  # not suspended a second time
    record = await store.get_sandbox(route.sandbox_id)
    assert record is not None and record.state is SandboxState.READY


def _policy(wake_timeout: str, provisioning_timeout: str = "2m") -> Policy:
    return parse_policy("pools:\n  small: {}\n"
                        "  shared: {on_idle: suspend, wake_timeout: %s, provisioning_timeout: %s}\n"
                        % (wake_timeout, provisioning_timeout), "test")


async def test_a_request_held_by_a_wake_is_503_with_retry_after_at_its_own_deadline(
        counting_provider: CountingProvider) -> None:
    """It joined a wake another replica runs (alive: its lease holds) and waited for it with the
    pool's provisioning_timeout, shorter than wake_timeout: that was a 504 without Retry-After."""
    store = MemoryStore()
    router = SessionRouter(store, PoolProviders({"small": counting_provider, "shared": counting_provider}),
                           _policy("1s", "100ms"), replica_id="r1")
    route = await router.resolve(ALICE)
    await router.suspend_sandbox(route.sandbox_id)
    suspended = await store.get_sandbox(route.sandbox_id)
    assert suspended is not None
    other = await store.reserve_sandbox(suspended, Caps(), 60)  # another replica wakes it, slowly
    assert other.outcome is Reserved.RESUME
    started = time.monotonic()
    with pytest.raises(WakeTimeout) as info:
        await router.resolve(ALICE)
    assert info.value.status == 503 and info.value.headers()["Retry-After"]
    assert time.monotonic() - started >= 0.9  # its own wake_timeout, not the 100 ms of a provisioning wait
    assert counting_provider.resumed == []  # the other replica's wake: never doubled
    await store.mark_ready(route.sandbox_id, counting_provider.endpoint)  # the other replica's wake ends
    assert (await router.resolve(ALICE)).sandbox_id == route.sandbox_id


async def _replicas(redis_url: str, policy: Policy, count: int) -> list[tuple[SessionRouter, CountingProvider]]:
    prefix = f"life-{uuid.uuid4().hex[:8]}"
    made = []
    for index in range(count):
        provider = CountingProvider()
        store = RedisStore(redis_url, prefix, f"r{index}")
        made.append((SessionRouter(store, PoolProviders({"small": provider, "shared": provider}), policy,
                                   replica_id=f"r{index}"), provider))
    return made


async def test_a_waker_that_died_is_taken_over_within_seconds(redis_server: RedisServer) -> None:
    """Killed mid-wake, a replica left the sandbox resuming under a 180 s lease nobody renewed: other
    replicas answered 503, then 504, for three minutes. The lease is short now (at most half of
    wake_timeout) and a live holder renews it: a dead one's lapses, and the next request takes over."""
    (dead, _), (alive, provider) = await _replicas(redis_server.url, _policy("8s"), 2)
    try:
        route = await dead.resolve(ALICE)
        await dead.suspend_sandbox(route.sandbox_id)
        suspended = await dead.store.get_sandbox(route.sandbox_id)
        assert suspended is not None
        lease = dead.lifecycle.lease_for("shared")
        assert lease == 4.0  # creation_lease 10 s, capped at half of wake_timeout
        # The replica reserves the wake and dies before it resumes anything (nothing renews its lease).
        assert (await dead.store.reserve_sandbox(suspended, Caps(), lease)).outcome is Reserved.RESUME
        started = time.monotonic()
        woken = await alive.resolve(ALICE)
        assert woken.sandbox_id == route.sandbox_id
        assert time.monotonic() - started < lease + 3.5  # within wake_timeout, not 180 s
        assert provider.resumed == [route.sandbox_id]
    finally:
        await dead.store.close()
        await alive.store.close()


async def test_a_slow_waker_that_lives_keeps_its_lease(redis_server: RedisServer) -> None:
    """The other side of a short lease: a resume that takes several leases' time is renewed while
    its replica lives, so nobody takes it over (two resumes of one sandbox)."""
    (waker, slow), (other, provider) = await _replicas(redis_server.url, _policy("4s"), 2)
    try:
        route = await waker.resolve(ALICE)
        await waker.suspend_sandbox(route.sandbox_id)
        slow.gate = asyncio.Event()  # the provider takes its time to resume
        waking = asyncio.create_task(waker.resolve(ALICE))
        joining = asyncio.create_task(other.resolve(ALICE))
        await asyncio.sleep(3 * waker.lifecycle.lease_for("shared") / 2)  # past the lease as first granted
        slow.gate.set()
        assert (await waking).sandbox_id == route.sandbox_id
        assert (await joining).sandbox_id == route.sandbox_id
        assert slow.resumed == [route.sandbox_id] and provider.resumed == []  # woken once, not taken over
    finally:
        await waker.store.close()
        await other.store.close()


# the operator's suspend ------------------------------------------------------------------
async def _operator_fixture(counting_provider: CountingProvider) -> tuple[SessionRouter, FakeClock, str]:
    clock = FakeClock()
    router = SessionRouter(MemoryStore(clock=clock), PoolProviders({"small": counting_provider,
                                                                    "shared": counting_provider}),
                           _policy("60s"), replica_id="r1", clock=clock)
    route = await router.resolve(ALICE)
    return router, clock, route.sandbox_id


async def test_an_operator_suspend_waits_for_a_stream_to_end(counting_provider: CountingProvider) -> None:
    """The 20 s /execute the operator's suspend cut at 3 s (502): now the suspend waits for it."""
    router, clock, sandbox_id = await _operator_fixture(counting_provider)
    router.stream_opened(sandbox_id)  # a long request, promoted to a stream, on some replica
    await router.flush_activity()
    clock.advance(router.tuning.activity_grace + 1)
    suspending = asyncio.create_task(router.suspend_sandbox(sandbox_id, grace=30))
    await asyncio.sleep(0.6)  # a few of its looks: the stream holds it
    assert not suspending.done() and counting_provider.suspended == []
    router.stream_closed(sandbox_id)  # the request completes (its end is activity) ...
    clock.advance(router.tuning.activity_grace + 1)  # ... and the sandbox stays quiet
    record = await suspending
    assert record.state is SandboxState.SUSPENDED and counting_provider.suspended == [sandbox_id]


async def test_an_operator_suspend_refuses_409_naming_what_is_open(counting_provider: CountingProvider) -> None:
    router, clock, sandbox_id = await _operator_fixture(counting_provider)
    router.stream_opened(sandbox_id)
    await router.flush_activity()
    with pytest.raises(Conflict) as info:
        await router.suspend_sandbox(sandbox_id, grace=0.3)
    assert info.value.status == 409
    assert "1 long request(s) or stream(s) open" in info.value.message and "?force=true" in info.value.message
    assert counting_provider.suspended == []
    assert (await router.store.get_sandbox(sandbox_id)).state is SandboxState.READY  # type: ignore[union-attr]
    forced = await router.suspend_sandbox(sandbox_id)  # ?force=true: at once, the stream is cut
    assert forced.state is SandboxState.SUSPENDED and counting_provider.suspended == [sandbox_id]


async def test_a_recent_request_counts_as_open(counting_provider: CountingProvider) -> None:
    """A request younger than the data plane's LONG_REQUEST_AFTER is known only by its start: it is
    open, for an operator's suspend as for the reaper, for activity_grace."""
    router, clock, sandbox_id = await _operator_fixture(counting_provider)
    clock.advance(5)
    await router.resolve(ALICE)  # a request began 0 s ago (recorded on the next flush)
    with pytest.raises(Conflict) as info:
        await router.suspend_sandbox(sandbox_id, grace=0)
    assert "0 long request(s)" in info.value.message and "began 0.0s ago" in info.value.message
    clock.advance(router.tuning.activity_grace + 0.5)
    assert (await router.suspend_sandbox(sandbox_id, grace=0)).state is SandboxState.SUSPENDED


@pytest.mark.parametrize(("query", "message"), [
    pytest.param("?force=yes", "force must be true or false", id="force not a boolean"),
    pytest.param("?grace=-1", "grace must be a number of seconds from 0 to 3600", id="negative grace"),
    pytest.param("?grace=soon", "grace must be a number of seconds", id="grace not a number"),
    pytest.param("?grace=nan", "grace must be a number of seconds", id="grace nan"),
    pytest.param("?wait=1", "unknown query parameter 'wait' (allowed: force, grace)", id="unknown parameter"),
])
async def test_the_suspend_endpoint_names_a_bad_parameter(aiohttp_client, counting_provider: CountingProvider,
                                                          query: str, message: str) -> None:
    router, _clock, sandbox_id = await _operator_fixture(counting_provider)
    client = await aiohttp_client(create_control_app(router, _ready, Metrics()))
    response = await client.post(f"/v1/sandboxes/{sandbox_id}/suspend{query}")
    assert response.status == 400
    assert message in (await response.json())["error"]["message"]


async def test_the_suspend_endpoint_waits_refuses_and_forces(aiohttp_client,
                                                             counting_provider: CountingProvider) -> None:
    router, _clock, sandbox_id = await _operator_fixture(counting_provider)
    client = await aiohttp_client(create_control_app(router, _ready, Metrics(), suspend_grace=0.2))
    router.stream_opened(sandbox_id)
    response = await client.post(f"/v1/sandboxes/{sandbox_id}/suspend")  # the setting's grace
    assert response.status == 409
    error = (await response.json())["error"]
    assert error["code"] == "conflict" and "open exchanges" in error["message"]
    response = await client.post(f"/v1/sandboxes/{sandbox_id}/suspend?force=true")
    assert response.status == 200 and (await response.json())["state"] == "suspended"


async def _ready() -> list[str]:
    return []


async def test_a_squatted_session_id_is_refused_and_counted(counting_provider: CountingProvider) -> None:
    """SECURITY.md, squatting in a shared org: after the store lost its bindings, another user of the
    org sends the victim's session ID first. It binds to the squatter's own sandbox (nothing of the
    victim's is exposed); the victim gets 404 and every such request is counted."""
    metrics = Metrics()
    router = SessionRouter(MemoryStore(), PoolProviders({"small": counting_provider, "shared": counting_provider}),
                           _policy("60s"), replica_id="r1", events=metrics)
    mallory = Identity.parse(org_id="acme", user_id="mallory", session_id="s1")
    squatted = await router.resolve(mallory)
    for _ in range(2):
        with pytest.raises(NotFound):
            await router.resolve(ALICE)
    assert squatted.sandbox_id == router.dry_run(mallory).sandbox_id != router.dry_run(ALICE).sandbox_id
    denied = metrics.registry.get_sample_value("sgw_security_denials_total", {"reason": "owner_mismatch"})
    assert denied == 2


# reaping throughput ----------------------------------------------------------------------
async def test_a_reaper_pass_keeps_going_while_more_is_due(counting_provider: CountingProvider) -> None:
    """At a million sandboxes, 58% idle, a pass took 500 every 15 s: 8.3 hours to drain. A pass now
    takes batch after batch while entries are due (within its time budget), several sandboxes at once."""
    clock = FakeClock()
    metrics = Metrics()
    router = SessionRouter(MemoryStore(clock=clock), PoolProviders({"small": counting_provider,
                                                                    "shared": counting_provider}),
                           parse_policy("pools: {small: {idle_timeout: 10m}, shared: {idle_timeout: 10m}}\n"
                                        "routing: {per_session_orgs: [acme]}", "test"),
                           replica_id="r1", clock=clock, events=metrics,
                           tuning=RouterTuning(reap_batch=50, reap_concurrency=8))
    routes = [await router.resolve(Identity.parse(org_id="acme", user_id="u", session_id=f"s{i}")) for i in range(600)]
    await router.flush_activity()
    clock.advance(601)
    busy = routes[-1].sandbox_id
    await router.resolve(Identity.parse(org_id="acme", user_id="u", session_id="s599"))  # one stays in use
    await router.flush_activity()
    reaped = await router.lifecycle.reap_once()
    assert len(reaped) == 599 and busy not in reaped  # twelve batches of 50 in one pass, not one
    assert sorted(counting_provider.deleted) == sorted(r.sandbox_id for r in routes[:-1])
    assert (metrics.registry.get_sample_value("sgw_reap_rate") or 0) > 0
    assert await router.lifecycle.reap_once() == []  # nothing due: one bounded read


async def test_a_reaper_pass_stops_at_its_budget(counting_provider: CountingProvider) -> None:
    clock = FakeClock()
    router = SessionRouter(MemoryStore(clock=clock), PoolProviders({"small": counting_provider,
                                                                    "shared": counting_provider}),
                           parse_policy("pools: {small: {idle_timeout: 10m}, shared: {idle_timeout: 10m}}\n"
                                        "routing: {per_session_orgs: [acme]}", "test"),
                           replica_id="r1", clock=clock, tuning=RouterTuning(reap_batch=10, reap_budget=0.0))
    for i in range(30):
        await router.resolve(Identity.parse(org_id="acme", user_id="u", session_id=f"s{i}"))
    await router.flush_activity()
    clock.advance(601)
    assert len(await router.lifecycle.reap_once()) == 10  # one batch: the budget is spent
    assert len(await router.lifecycle.reap_once()) == 10  # the next pass goes on from there


class OneSlowWaitStore(MemoryStore):
    """The memory store, whose first ``wait_settled`` fails as a Redis call that did not answer in time."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = 0

    async def wait_settled(self, sandbox_id: str, timeout: float) -> Settlement:
        if not self.failed:
            self.failed += 1
            raise StoreUnavailable("the session store (redis) could not wait for a sandbox: it did not answer in time")
        return await super().wait_settled(sandbox_id, timeout)


async def test_a_store_error_while_held_by_a_wake_is_tried_again(counting_provider: CountingProvider) -> None:
    """The wake storm's 503 store_unavailable: one slow store read, on a replica starved by a hundred
    wakes, answered every request sharing that wait."""
    store = OneSlowWaitStore()
    router = SessionRouter(store, PoolProviders({"small": counting_provider, "shared": counting_provider}),
                           _policy("10s"), replica_id="r1")
    route = await router.resolve(ALICE)
    await router.suspend_sandbox(route.sandbox_id)
    suspended = await store.get_sandbox(route.sandbox_id)
    assert suspended is not None
    assert (await store.reserve_sandbox(suspended, Caps(), 60)).outcome is Reserved.RESUME  # another replica wakes it
    held = asyncio.create_task(router.resolve(ALICE))
    await asyncio.sleep(0.5)  # past the failed wait and its retry
    assert store.failed == 1 and not held.done()
    await store.mark_ready(route.sandbox_id, counting_provider.endpoint)
    assert (await held).sandbox_id == route.sandbox_id


@pytest.mark.parametrize("on_idle", ["delete", "suspend"])
async def test_the_reaper_never_deletes_a_sandbox_used_since_its_page(counting_provider: CountingProvider,
                                                                      on_idle: str) -> None:
    """A busy pass may reach an entry seconds after it read the page: the sandbox was used since."""
    clock = FakeClock()
    store = StalePageStore(clock)
    router = SessionRouter(store, PoolProviders({"small": counting_provider, "shared": counting_provider}),
                           parse_policy(f"pools:\n  small: {{}}\n  shared: {{idle_timeout: 10m, on_idle: {on_idle}}}\n",
                                        "test"), replica_id="r1", clock=clock)
    route = await router.resolve(ALICE)
    await router.flush_activity()
    store.frozen[route.sandbox_id] = clock()  # the page, as read before the request below
    clock.advance(601 + router.tuning.activity_grace)
    router.invalidate(route.session_id)
    await router.resolve(ALICE)  # used again
    await router.flush_activity()
    assert await router.lifecycle.reap_once() == []
    assert counting_provider.deleted == [] and counting_provider.suspended == []
    assert (await store.get_sandbox(route.sandbox_id)).state is SandboxState.READY  # type: ignore[union-attr]


class OneSlowRenewalStore(MemoryStore):
    """The memory store, whose first lease renewal fails as a Redis call that did not answer in time."""

    def __init__(self) -> None:
        super().__init__()
        self.renewals: list[str] = []

    async def extend_lease(self, sandbox_id: str, held: Collection[float], until: float) -> bool:
        if not self.renewals:
            self.renewals.append("failed")
            raise StoreUnavailable("the session store (redis) could not renew a lease: it did not answer in time")
        self.renewals.append("renewed")
        return await super().extend_lease(sandbox_id, held, until)


async def test_a_failed_renewal_is_tried_again_before_the_lease_lapses(counting_provider: CountingProvider) -> None:
    """In the wake storm one renewal that timed out, then the next a whole interval later, let the
    lease lapse under a live waker: another replica took the wake over (102 resumes for 100)."""
    store = OneSlowRenewalStore()
    router = SessionRouter(store, PoolProviders({"small": counting_provider, "shared": counting_provider}),
                           _policy("8s"), replica_id="r1")
    route = await router.resolve(ALICE)
    await router.suspend_sandbox(route.sandbox_id)
    assert router.lifecycle.lease_for("shared") == 4.0
    counting_provider.gate = asyncio.Event()
    waking = asyncio.create_task(router.resolve(ALICE))
    await asyncio.sleep(2.0)  # a quarter (1 s: fails), a retry 0.2 s later; the next quarter is at 2.2 s
    record = await store.get_sandbox(route.sandbox_id)
    assert record is not None and record.state is SandboxState.RESUMING
    assert store.renewals[:2] == ["failed", "renewed"]
    assert record.lease_until > time.time()  # still held: nobody could take it over
    counting_provider.gate.set()
    assert (await waking).sandbox_id == route.sandbox_id

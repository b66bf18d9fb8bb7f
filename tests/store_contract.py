"""The ``SessionStore`` contract: one set of tests every store implementation passes.

Use it by subclassing :class:`StoreContract` in a test module that provides two
fixtures: ``store`` (a fresh, empty store built with ``clock=clock``) and
``clock`` (a ``tests.clock.FakeClock``). ``tests/test_store.py`` runs it against the
memory store and the Redis store.

Every time (record times, creation leases, named-lease deadlines) comes from
the injected clock, so no contract test waits for real time to pass.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest

from gateway.errors import CapacityExceeded
from gateway.model import Binding, Endpoint, Owner, SandboxRecord, SandboxState
from gateway.store.base import (
    Caps, CapScope, FleetCounts, LeaseLost, NotReserved, Position, Released, Reserved, SandboxFilter, SessionStore,
    Settled, Settlement, SettleTimeout,
)
from routing import Isolation, per_session_sandbox_id, shared_sandbox_id
from tests.clock import T0, FakeClock

SETTLE = 0.1  # how long a waiter is watched to check that it does *not* return early


def binding(session_id: str, sandbox_id: str = "org-1", *, pool: str = "shared", org_id: str | None = "acme",
            user_id: str = "alice", created_at: float = T0) -> Binding:
    isolation = Isolation.PER_SESSION if sandbox_id.startswith("ses-") else Isolation.SHARED
    return Binding(session_id, sandbox_id, pool, isolation, Owner(org_id, user_id, None), created_at)


def record(sandbox_id: str, *, pool: str = "shared", org_id: str | None = "acme", created_at: float = T0,
           meta: Mapping[str, str] | None = None) -> SandboxRecord:
    return SandboxRecord(sandbox_id, pool, org_id, SandboxState.CREATING, created_at=created_at, meta=dict(meta or {}))


ENDPOINT = Endpoint("10.0.0.7", 8080)


async def still_waiting(store: SessionStore, sandbox_id: str, *tasks: asyncio.Task[Settlement]) -> bool:
    """True when ``tasks``, ``wait_settled`` calls on ``store`` for ``sandbox_id``, wait for its next settlement:
    the store counts them as past their read (``waiting``; one still reading may take a settlement from its read,
    not as a waiter: seen under load), and none returns within ``SETTLE``."""
    deadline = asyncio.get_running_loop().time() + 5
    while store.waiting(sandbox_id) < len(tasks) and not any(task.done() for task in tasks):
        assert asyncio.get_running_loop().time() < deadline, f"{len(tasks)} waiters never parked"
        await asyncio.sleep(0.005)
    done, _ = await asyncio.wait(tasks, timeout=SETTLE)
    return not done


async def ready_at(store: SessionStore, last_active: Mapping[str, float]) -> None:
    """Ready records with these last activity times."""
    for sandbox_id, at in last_active.items():
        await store.reserve_sandbox(record(sandbox_id, created_at=T0 - 10), Caps(), 30)
        await store.mark_ready(sandbox_id, ENDPOINT)
    await store.touch(last_active, {})


async def all_sandboxes(store: SessionStore) -> list[SandboxRecord]:
    """Every record, page by page (what a client of GET /v1/sandboxes does)."""
    found: list[SandboxRecord] = []
    after: Position | None = None
    while True:
        page = await store.scan_sandboxes(after, limit=100, scan=100)
        found += page.records
        if page.next is None:
            return found
        after = page.next


class StoreContract:
    # bindings -------------------------------------------------------------
    async def test_put_binding_stores_it(self, store: SessionStore) -> None:
        stored = await store.put_binding(binding("s1"))
        assert stored == binding("s1")
        assert await store.get_binding("s1") == binding("s1")
        assert await store.get_binding("unknown") is None

    async def test_put_binding_is_idempotent(self, store: SessionStore) -> None:
        assert await store.put_binding(binding("s1")) == binding("s1")
        assert await store.put_binding(binding("s1")) == binding("s1")
        assert await store.sessions_of("org-1") == ["s1"]

    async def test_existing_binding_wins(self, store: SessionStore) -> None:
        first = binding("s1", "org-1")
        await store.put_binding(first)
        stored = await store.put_binding(binding("s1", "org-2", pool="small", created_at=T0 + 5))
        assert stored == first
        assert await store.get_binding("s1") == first
        assert await store.sessions_of("org-2") == []

    @pytest.mark.parametrize("session_id", [
        pytest.param("agent_session-1", id="plain"),
        pytest.param("a:b:c", id="colons"),
        pytest.param("binding:s1", id="looks like a key"),
        pytest.param("{hashtag}:x", id="braces"),
        pytest.param("ünïcødé 会话 🚀", id="unicode"),
        pytest.param("x" * 256, id="256 chars"),
    ])
    async def test_session_ids_are_opaque(self, store: SessionStore, session_id: str) -> None:
        ours, neighbour = binding(session_id, "org-1"), binding(session_id + ":1", "org-2")
        await store.put_binding(ours)
        await store.put_binding(neighbour)
        assert await store.get_binding(session_id) == ours
        assert await store.sessions_of("org-1") == [session_id]
        assert await store.delete_binding(session_id) == ours
        assert await store.get_binding(session_id + ":1") == neighbour
        assert await store.idle_sessions(T0 + 1, 10) == [session_id + ":1"]

    async def test_delete_binding_returns_it_and_unbinds(self, store: SessionStore) -> None:
        await store.put_binding(binding("s1"))
        await store.put_binding(binding("s2"))
        assert await store.delete_binding("s1") == binding("s1")
        assert await store.get_binding("s1") is None
        assert await store.sessions_of("org-1") == ["s2"]
        assert await store.idle_sessions(T0 + 1, 10) == ["s2"]
        assert await store.delete_binding("s1") is None

    async def test_delete_binding_invalidates_the_session(self, store: SessionStore) -> None:
        seen: list[str] = []
        event = asyncio.Event()

        def callback(key: str) -> None:
            seen.append(key)
            event.set()

        store.subscribe(callback)
        await store.put_binding(binding("s1"))
        await store.delete_binding("s1")
        await asyncio.wait_for(event.wait(), 5)
        assert seen == ["s1"]

    async def test_sessions_of_lists_sorted_sessions(self, store: SessionStore) -> None:
        for session_id in ("s3", "s1", "s2"):
            await store.put_binding(binding(session_id))
        await store.put_binding(binding("other", "org-2"))
        assert await store.sessions_of("org-1") == ["s1", "s2", "s3"]
        assert await store.sessions_of("org-unknown") == []

    # reserve and create once ----------------------------------------------
    async def test_reserve_creates_once(self, store: SessionStore, clock: FakeClock) -> None:
        first = await store.reserve_sandbox(record("org-1", meta={"k": "v"}), Caps(), lease_seconds=30)
        assert first.outcome is Reserved.CREATED and first.created
        assert first.record.state is SandboxState.CREATING
        assert first.record.lease_until == clock() + 30
        assert first.record.meta == {"k": "v"}
        second = await store.reserve_sandbox(record("org-1"), Caps(), lease_seconds=30)
        assert second.outcome is Reserved.EXISTING and not second.created
        assert second.record.state is SandboxState.CREATING
        assert await store.get_sandbox("org-1") == second.record

    async def test_concurrent_reserves_create_exactly_once(self, store: SessionStore) -> None:
        results = await asyncio.gather(*(store.reserve_sandbox(record("org-1"), Caps(pool_max=1), 30)
                                         for _ in range(100)))
        assert sum(r.created for r in results) == 1
        assert {r.record.sandbox_id for r in results} == {"org-1"}

    @pytest.mark.parametrize(("caps", "scope", "same_scope", "other_scope"), [
        pytest.param(Caps(pool_max=2), "pool", record("x", pool="shared", org_id="other-org"),
                     record("x", pool="small"), id="pool cap counts the pool, not the org"),
        pytest.param(Caps(org_max=2), "org", record("x", pool="small", org_id="acme"),
                     record("x", pool="shared", org_id="other-org"), id="org cap counts the org, not the pool"),
    ])
    async def test_caps_count_creating_and_ready(self, store: SessionStore, caps: Caps, scope: str,
                                                 same_scope: SandboxRecord, other_scope: SandboxRecord) -> None:
        assert (await store.reserve_sandbox(record("org-1"), caps, 30)).created
        await store.mark_ready("org-1", ENDPOINT)  # ready counts
        assert (await store.reserve_sandbox(record("org-2"), caps, 30)).created  # creating counts
        with pytest.raises(CapacityExceeded) as raised:
            await store.reserve_sandbox(same_scope.with_(sandbox_id="org-3"), caps, 30)
        assert raised.value.scope == scope and isinstance(raised.value.scope, CapScope)
        assert f"{scope}" in raised.value.message and "max_sandboxes" in raised.value.message
        assert raised.value.status == 429 and raised.value.retry_after
        assert (await store.reserve_sandbox(other_scope.with_(sandbox_id="org-4"), caps, 30)).created
        assert not (await store.reserve_sandbox(record("org-1"), caps, 30)).created  # existing: no cap check
        await store.release_sandbox("org-1")
        assert (await store.reserve_sandbox(same_scope.with_(sandbox_id="org-3"), caps, 30)).created

    async def test_org_cap_ignores_records_without_an_org(self, store: SessionStore) -> None:
        caps = Caps(org_max=1)
        assert (await store.reserve_sandbox(record("usr-1", org_id=None), caps, 30)).created
        assert (await store.reserve_sandbox(record("usr-2", org_id=None), caps, 30)).created
        assert (await store.reserve_sandbox(record("org-1", org_id=""), caps, 30)).created  # "" is an org
        with pytest.raises(CapacityExceeded):
            await store.reserve_sandbox(record("org-2", org_id=""), caps, 30)

    async def test_expired_lease_is_taken_over(self, store: SessionStore, clock: FakeClock) -> None:
        caps = Caps(pool_max=1, org_max=1)
        assert (await store.reserve_sandbox(record("org-1"), caps, lease_seconds=10)).created
        clock.advance(5)
        assert not (await store.reserve_sandbox(record("org-1"), caps, lease_seconds=10)).created
        clock.advance(6)  # the creator's lease has expired: it died
        taken = await store.reserve_sandbox(record("org-1"), caps, lease_seconds=10)
        assert taken.outcome is Reserved.TAKEN_OVER and taken.created  # the stale record did not count against its own takeover
        assert taken.record.lease_until == clock() + 10
        with pytest.raises(CapacityExceeded):  # it is still counted once
            await store.reserve_sandbox(record("org-2"), caps, 10)

    @pytest.mark.parametrize("owner", [
        pytest.param(Owner("acme", "alice", "bot-1"), id="org, user and bot"),
        pytest.param(Owner(None, "ünïcødé", None), id="personal account"),
        pytest.param(None, id="a record of an older version: no owner"),
    ])
    async def test_a_record_keeps_its_owner(self, store: SessionStore, owner: Owner | None) -> None:
        reserved = await store.reserve_sandbox(record("ses-1").with_(owner=owner), Caps(), 30)
        assert reserved.record.owner == owner
        await store.mark_ready("ses-1", ENDPOINT)
        fetched = await store.get_sandbox("ses-1")
        assert fetched is not None and fetched.owner == owner
        assert [r.owner for r in await all_sandboxes(store)] == [owner]
        again = await store.reserve_sandbox(record("ses-1").with_(owner=Owner("other", "eve", None)), Caps(), 30)
        assert again.outcome is Reserved.EXISTING and again.record.owner == owner  # the first owner stays

    async def test_mark_ready_wakes_every_waiter(self, store: SessionStore) -> None:
        await store.reserve_sandbox(record("org-1"), Caps(), 30)
        waiters = [asyncio.create_task(store.wait_settled("org-1", timeout=5)) for _ in range(3)]
        assert await still_waiting(store, "org-1", *waiters)
        ready = await store.mark_ready("org-1", ENDPOINT)
        assert ready.state is SandboxState.READY and ready.endpoint == ENDPOINT
        for settlement in await asyncio.gather(*waiters):
            assert settlement.outcome is Settled.READY and settlement.error is None
            assert settlement.record is not None and settlement.record.endpoint == ENDPOINT
            assert settlement.record.state is SandboxState.READY
        assert (await store.get_sandbox("org-1")) == ready

    async def test_release_with_error_wakes_every_waiter_with_it(self, store: SessionStore) -> None:
        await store.reserve_sandbox(record("org-1"), Caps(), 30)
        waiters = [asyncio.create_task(store.wait_settled("org-1", timeout=5)) for _ in range(3)]
        assert await still_waiting(store, "org-1", *waiters)
        released = await store.release_sandbox("org-1", error="image pull failed")
        assert released is not None and released.sandbox_id == "org-1"
        assert await asyncio.gather(*waiters) == [Settlement(Settled.FAILED, error="image pull failed")] * 3
        assert await store.get_sandbox("org-1") is None

    async def test_release_without_error_tells_waiters_to_reserve_again(self, store: SessionStore) -> None:
        await store.reserve_sandbox(record("org-1"), Caps(), 30)
        waiter = asyncio.create_task(store.wait_settled("org-1", timeout=5))
        assert await still_waiting(store, "org-1", waiter)
        await store.release_sandbox("org-1")
        assert await waiter == Settlement(Settled.REMOVED)

    async def test_wait_settled_times_out(self, store: SessionStore) -> None:
        await store.reserve_sandbox(record("org-1"), Caps(), 30)
        with pytest.raises(SettleTimeout):
            await store.wait_settled("org-1", timeout=0.05)

    @pytest.mark.parametrize("ready", [pytest.param(True, id="ready"), pytest.param(False, id="missing")])
    async def test_wait_settled_returns_at_once_when_not_creating(self, store: SessionStore, ready: bool) -> None:
        if ready:
            await store.reserve_sandbox(record("org-1"), Caps(), 30)
            await store.mark_ready("org-1", ENDPOINT)
        settlement = await asyncio.wait_for(store.wait_settled("org-1", timeout=30), 5)
        if ready:
            assert settlement.outcome is Settled.READY
            assert settlement.record is not None and settlement.record.state is SandboxState.READY
        else:
            assert settlement == Settlement(Settled.REMOVED)

    async def test_mark_ready_without_reservation_raises(self, store: SessionStore) -> None:
        with pytest.raises(NotReserved):
            await store.mark_ready("org-1", ENDPOINT)

    async def test_release_removes_and_invalidates(self, store: SessionStore) -> None:
        invalidated: list[str] = []
        store.subscribe(invalidated.append)
        assert await store.release_sandbox("org-1") is None  # nothing to release: no invalidation
        await store.reserve_sandbox(record("org-1"), Caps(), 30)
        await store.mark_ready("org-1", ENDPOINT)
        await store.put_binding(binding("s1", "org-1"))
        released = await store.release_sandbox("org-1", error="idle")
        assert released is not None and released.endpoint == ENDPOINT
        assert await store.get_sandbox("org-1") is None
        assert await all_sandboxes(store) == []
        assert invalidated == ["org-1"]
        assert await store.get_binding("s1") == binding("s1", "org-1")  # bindings outlive a released sandbox

    async def test_release_unreachable_takes_only_that_ready_incarnation_once(self, store: SessionStore) -> None:
        assert await store.release_unreachable("org-1", ENDPOINT) is Released.ABSENT
        await store.reserve_sandbox(record("org-1"), Caps(), 30)
        assert await store.release_unreachable("org-1", ENDPOINT) is Released.CHANGED  # still being created
        await store.mark_ready("org-1", ENDPOINT)
        assert await store.release_unreachable("org-1", Endpoint("10.0.0.8", 8080)) is Released.CHANGED  # moved
        outcomes = await asyncio.gather(*(store.release_unreachable("org-1", ENDPOINT) for _ in range(5)))
        assert sorted(outcomes) == sorted([Released.RELEASED] + [Released.ABSENT] * 4)
        assert await store.get_sandbox("org-1") is None
        await store.reserve_sandbox(record("org-1"), Caps(), 30)
        await store.mark_ready("org-1", ENDPOINT)  # a new incarnation, at the same address even
        assert (await store.get_sandbox("org-1")) is not None
        assert await store.fleet_counts() == FleetCounts({("shared", SandboxState.READY): 1}, {})

    async def test_sessions_outlive_their_sandbox_record(self, store: SessionStore) -> None:
        await store.put_binding(binding("s1", "org-1"))
        await store.reserve_sandbox(record("org-1"), Caps(), 30)
        await store.release_sandbox("org-1")
        assert await store.sessions_of("org-1") == ["s1"]
        again = await store.reserve_sandbox(record("org-1"), Caps(), 30)
        assert again.record.sessions == 1
        await store.delete_binding("s1")
        await store.release_sandbox("org-1")
        assert await store.sessions_of("org-1") == []

    @pytest.mark.parametrize("stored", [
        pytest.param(Binding("agent_1", per_session_sandbox_id("agent_1"), "small", Isolation.PER_SESSION,
                             Owner("acme", "alice", None), T0 + 0.125), id="per-session: the ID derives"),
        pytest.param(Binding("agent_2", shared_sandbox_id(None, "bob", "bot-7"), "shared", Isolation.SHARED,
                             Owner(None, "bob", "bot-7"), T0), id="shared: the ID derives from the owner"),
        pytest.param(Binding("agent_3", "legacy__id", "shared", Isolation.SHARED, Owner("", "carol", None), T0),
                     id="legacy ID, empty org"),
        pytest.param(Binding("agent_4", per_session_sandbox_id("other"), "small", Isolation.PER_SESSION,
                             Owner("acme", "dave", None), T0), id="a ses- ID of another session"),
    ])
    async def test_binding_round_trips(self, store: SessionStore, stored: Binding) -> None:
        await store.put_binding(stored)
        assert await store.get_binding(stored.session_id) == stored
        assert await store.sessions_of(stored.sandbox_id) == [stored.session_id]
        assert await store.delete_binding(stored.session_id) == stored

    # activity and streams -------------------------------------------------
    async def test_touch_moves_activity_forward_only(self, store: SessionStore) -> None:
        await store.reserve_sandbox(record("org-1"), Caps(), 30)
        await store.put_binding(binding("s1"))
        await store.touch({"org-1": T0 + 50, "unknown": T0 + 50}, {"s1": T0 + 40, "ghost": T0 + 40})
        await store.touch({"org-1": T0 + 10}, {"s1": T0 + 10})  # older: ignored
        sandbox = await store.get_sandbox("org-1")
        assert sandbox is not None and sandbox.last_active == T0 + 50
        assert await store.get_sandbox("unknown") is None
        assert await store.idle_sessions(T0 + 40, 10) == []
        assert await store.idle_sessions(T0 + 41, 10) == ["s1"]  # "ghost" was never bound
        await store.touch({}, {})

    async def test_idle_sessions_oldest_first_and_bounded(self, store: SessionStore) -> None:
        await store.put_binding(binding("new", created_at=T0 + 100))
        await store.put_binding(binding("old", created_at=T0))
        await store.put_binding(binding("mid", created_at=T0 + 50))
        assert await store.idle_sessions(T0 + 50, 10) == ["old"]
        assert await store.idle_sessions(T0 + 101, 10) == ["old", "mid", "new"]
        assert await store.idle_sessions(T0 + 101, 2) == ["old", "mid"]
        assert await store.idle_sessions(T0, 10) == []

    async def test_a_session_with_its_own_sandbox_is_idle_only_once_the_sandbox_is_gone(
            self, store: SessionStore, clock: FakeClock) -> None:
        own = per_session_sandbox_id("agent_1")
        await store.put_binding(Binding("agent_1", own, "small", Isolation.PER_SESSION, Owner("acme", "alice", None), T0))
        await store.put_binding(binding("shared_1", created_at=T0))
        assert await store.idle_sessions(T0 + 1, 10) == ["agent_1", "shared_1"]  # no sandbox yet: idle as any
        await store.reserve_sandbox(record(own, pool="small"), Caps(), 30)
        assert await store.idle_sessions(T0 + 1, 10) == ["shared_1"]  # kept by its sandbox's record
        await store.mark_ready(own, Endpoint("10.0.0.1", 8888))
        assert await store.idle_sessions(clock() + 1e6, 10) == ["shared_1"]
        clock.advance(100)
        await store.release_sandbox(own)
        assert await store.idle_sessions(clock(), 10) == ["shared_1"]  # idle from the release, not before
        assert await store.idle_sessions(clock() + 1, 10) == ["shared_1", "agent_1"]
        assert await store.sessions_of(own) == ["agent_1"]  # the binding outlived its sandbox
        assert (await store.get_binding("agent_1")).sandbox_id == own  # type: ignore[union-attr]

    # the activity index: listing and reaping page through it ----------------
    async def test_scan_pages_oldest_activity_first(self, store: SessionStore) -> None:
        await ready_at(store, {"org-c": T0 + 1, "org-a": T0 + 3, "org-b": T0 + 2, "org-d": T0 + 3})
        first = await store.scan_sandboxes(None, limit=2, scan=2)
        assert [r.sandbox_id for r in first.records] == ["org-c", "org-b"]
        assert first.next is not None
        second = await store.scan_sandboxes(first.next, limit=2, scan=2)
        assert [r.sandbox_id for r in second.records] == ["org-a", "org-d"]  # a tie: by ID
        assert second.next is None  # nothing follows: no empty last page
        assert second.records[0].last_active == T0 + 3 and second.records[0].state is SandboxState.READY

    async def test_scan_never_skips_an_entry_touched_or_released_while_paging(self, store: SessionStore) -> None:
        await ready_at(store, {f"org-{i}": T0 + i for i in range(6)})
        first = await store.scan_sandboxes(None, limit=2, scan=2)
        await store.touch({"org-0": T0 + 100, "org-3": T0 + 100}, {})  # one behind the cursor, one ahead
        await store.release_sandbox("org-1")  # the cursor's own entry goes
        seen = [r.sandbox_id for r in first.records]
        after = first.next
        while after is not None:
            page = await store.scan_sandboxes(after, limit=2, scan=2)
            seen += [r.sandbox_id for r in page.records]
            after = page.next
        assert seen == ["org-0", "org-1", "org-2", "org-4", "org-5", "org-0", "org-3"]

    async def test_scan_stops_before(self, store: SessionStore) -> None:
        await ready_at(store, {"org-1": T0 + 1, "org-2": T0 + 2, "org-3": T0 + 3})
        page = await store.scan_sandboxes(None, limit=10, scan=10, before=T0 + 2)
        assert ([r.sandbox_id for r in page.records], page.next) == (["org-1"], None)
        bounded = await store.scan_sandboxes(None, limit=10, scan=1, before=T0 + 3)
        assert [r.sandbox_id for r in bounded.records] == ["org-1"] and bounded.next == Position(T0 + 1, "org-1")

    @pytest.mark.parametrize(("where", "expected", "more"), [
        pytest.param(SandboxFilter(pool="small"), ["ses-1"], False, id="by pool"),
        pytest.param(SandboxFilter(state=SandboxState.CREATING), ["org-3"], False, id="by state"),
        pytest.param(SandboxFilter(org_id="acme", state=SandboxState.READY), ["org-1", "org-2"], True,
                     id="by org and state"),
        pytest.param(SandboxFilter(org_id="nobody"), [], True, id="no match"),
    ])
    async def test_scan_filters(self, store: SessionStore, where: SandboxFilter, expected: list[str],
                                more: bool) -> None:
        for sandbox_id, pool, org in (("org-1", "shared", "acme"), ("org-2", "shared", "acme"),
                                      ("ses-1", "small", None), ("org-3", "shared", "acme")):
            await store.reserve_sandbox(record(sandbox_id, pool=pool, org_id=org), Caps(), 30)
        for sandbox_id in ("org-1", "org-2", "ses-1"):  # org-3 stays creating
            await store.mark_ready(sandbox_id, ENDPOINT)
        await store.touch({"org-1": T0 + 1, "org-2": T0 + 2, "ses-1": T0 + 3, "org-3": T0 + 4}, {})
        page = await store.scan_sandboxes(None, limit=10, scan=10, where=where)
        assert [r.sandbox_id for r in page.records] == expected
        # Bounded: one entry examined. A state or pool is read from its own index, so that entry matches.
        short = await store.scan_sandboxes(None, limit=10, scan=1, where=where)
        assert [r.sandbox_id for r in short.records] == expected[:1]
        # The one examined: org-1 of idx or of the ready index; the one small or creating sandbox, alone in its index.
        assert short.next == (Position(T0 + 1, "org-1") if more else None)

    async def test_existing_sandboxes(self, store: SessionStore) -> None:
        await store.reserve_sandbox(record("org-1"), Caps(), 30)
        await store.reserve_sandbox(record("org-2"), Caps(), 30)
        await store.release_sandbox("org-2")
        assert await store.existing_sandboxes(["org-1", "org-2", "org-3"]) == {"org-1"}
        assert await store.existing_sandboxes([]) == set()

    async def test_fleet_counts_follow_every_transition(self, store: SessionStore, clock: FakeClock) -> None:
        assert await store.fleet_counts() == FleetCounts()
        await store.reserve_sandbox(record("org-1"), Caps(), 30)
        await store.reserve_sandbox(record("ses-1", pool="small"), Caps(), 30)
        await store.reserve_sandbox(record("ses-2", pool="small"), Caps(), 30)
        await store.mark_ready("org-1", ENDPOINT)
        await store.mark_ready("org-1", ENDPOINT)  # again: counted once
        for session_id, sandbox_id, pool in (("s1", "org-1", "shared"), ("s2", "org-1", "shared"),
                                             ("s3", "ses-1", "small")):
            await store.put_binding(binding(session_id, sandbox_id, pool=pool))
        await store.put_binding(binding("s1", "org-9"))  # exists: not counted again
        assert await store.fleet_counts() == FleetCounts(
            {("shared", SandboxState.READY): 1, ("small", SandboxState.CREATING): 2}, {"shared": 2, "small": 1})
        clock.advance(31)
        taken = await store.reserve_sandbox(record("ses-2", pool="small"), Caps(), 30)  # a takeover
        assert taken.outcome is Reserved.TAKEN_OVER
        await store.release_sandbox("ses-1")
        await store.release_sandbox("ses-1")
        await store.delete_binding("s1")
        await store.delete_binding("s1")
        assert await store.fleet_counts() == FleetCounts(
            {("shared", SandboxState.READY): 1, ("small", SandboxState.CREATING): 1}, {"shared": 1, "small": 1})

    @pytest.mark.parametrize(("batches", "expected"), [
        pytest.param([{"a": 2, "b": 1}], {"a": 2, "b": 1, "c": 0}, id="counts per sandbox"),
        pytest.param([{"a": 2}, {"a": -1}], {"a": 1}, id="deltas add up"),
        pytest.param([{"a": 1}, {"a": -1}], {"a": 0}, id="back to zero"),
        pytest.param([{"a": -3}, {"a": 1}], {"a": 1}, id="never below zero"),
    ])
    async def test_streams(self, store: SessionStore, batches: list[dict[str, int]], expected: dict[str, int]) -> None:
        for deltas in batches:
            await store.add_streams(deltas)
        assert {sandbox_id: await store.open_streams(sandbox_id) for sandbox_id in expected} == expected

    async def test_release_forgets_streams(self, store: SessionStore) -> None:
        await store.reserve_sandbox(record("org-1"), Caps(), 30)
        await store.add_streams({"org-1": 2})
        await store.release_sandbox("org-1")
        assert await store.open_streams("org-1") == 0

    # coordination and listing ---------------------------------------------
    async def test_lease_is_exclusive_renewable_and_expires(self, store: SessionStore, clock: FakeClock) -> None:
        assert await store.acquire_lease("reaper", "replica-a", ttl=60)
        assert not await store.acquire_lease("reaper", "replica-b", ttl=60)
        clock.advance(59.7)
        assert await store.acquire_lease("reaper", "replica-a", ttl=0.3)  # renewal: 0.3 s from now
        assert await store.acquire_lease("other", "replica-b", ttl=60)  # leases are independent
        assert not await store.acquire_lease("reaper", "replica-b", ttl=60)
        clock.advance(0.3)
        assert not await store.acquire_lease("reaper", "replica-b", ttl=30)  # the deadline itself still holds
        clock.advance(0.01)
        assert await store.acquire_lease("reaper", "replica-b", ttl=30)  # replica-a stopped renewing
        assert not await store.acquire_lease("reaper", "replica-a", ttl=30)

    async def test_a_released_lease_is_free_at_once_and_only_its_holder_releases_it(self, store: SessionStore) -> None:
        assert await store.acquire_lease("reaper", "replica-a", ttl=60)
        await store.release_lease("reaper", "replica-b")  # not the holder: nothing changes
        assert not await store.acquire_lease("reaper", "replica-b", ttl=60)
        await store.release_lease("reaper", "replica-a")
        assert await store.acquire_lease("reaper", "replica-b", ttl=60)  # at once, not in 60 s
        await store.release_lease("reaper", "replica-a")  # no longer the holder: replica-b keeps it
        assert not await store.acquire_lease("reaper", "replica-a", ttl=60)

    async def test_list_sandboxes_with_session_counts(self, store: SessionStore) -> None:
        await store.reserve_sandbox(record("org-1"), Caps(), 30)
        await store.mark_ready("org-1", ENDPOINT)
        await store.reserve_sandbox(record("ses-1", pool="small", org_id=None), Caps(), 30)
        for session_id in ("s1", "s2"):
            await store.put_binding(binding(session_id, "org-1"))
        await store.put_binding(binding("s3", "ses-1"))
        listed = {r.sandbox_id: r for r in await all_sandboxes(store)}
        assert {k: (r.pool, r.org_id, r.state, r.sessions) for k, r in listed.items()} == {
            "org-1": ("shared", "acme", SandboxState.READY, 2),
            "ses-1": ("small", None, SandboxState.CREATING, 1),
        }
        fetched = await store.get_sandbox("org-1")
        assert fetched is not None and fetched.sessions == 2 and fetched == listed["org-1"]

    async def test_ping(self, store: SessionStore) -> None:
        await store.ping()

    # suspend and wake once ------------------------------------------------
    async def test_suspend_then_wake_once(self, store: SessionStore, clock: FakeClock) -> None:
        await ready_at(store, {"org-1": T0})
        seen: list[str] = []
        store.subscribe(seen.append)
        suspending = await store.begin_suspend("org-1", 30)
        assert suspending is not None and suspending.state is SandboxState.SUSPENDING
        assert await store.begin_suspend("org-1", 30) is None  # only a ready record: done once
        clock.advance(5)
        suspended = await store.mark_suspended("org-1")
        assert suspended is not None and suspended.state is SandboxState.SUSPENDED and suspended.endpoint is None
        assert suspended.last_active == clock()  # retention counts from the suspend
        assert await store.mark_suspended("org-1") is None
        woken = [await store.reserve_sandbox(record("org-1"), Caps(), 30) for _ in range(3)]
        assert [r.outcome for r in woken] == [Reserved.RESUME, Reserved.EXISTING, Reserved.EXISTING]
        assert not woken[0].created and woken[1].record.state is SandboxState.RESUMING
        # This instance's own invalidations are delivered synchronously (others' by pub/sub).
        assert seen == ["org-1", "org-1"]  # routes dropped at the suspend, and once suspended
        moved = Endpoint("10.0.0.8", 8080)
        ready = await store.mark_ready("org-1", moved)
        assert ready.state is SandboxState.READY and ready.endpoint == moved
        assert seen == ["org-1"] * 3  # and once resumed: the endpoint may be new

    async def test_a_suspend_refuses_a_record_active_since_the_caller_looked(self, store: SessionStore,
                                                                              clock: FakeClock) -> None:
        """The reaper reads a page of the index, then suspends: in between, the sandbox may have been
        woken (ready again, active now) or used. The store compares the activity it holds."""
        await ready_at(store, {"org-1": T0, "org-2": T0})
        clock.advance(100)
        idle_before = clock() - 50  # what the reaper judged with: idle since T0 < idle_before
        await store.touch({"org-1": clock()}, {})  # used after the page was read
        assert await store.begin_suspend("org-1", 30, idle_before) is None
        assert (await store.get_sandbox("org-1")).state is SandboxState.READY  # type: ignore[union-attr]
        suspending = await store.begin_suspend("org-2", 30, idle_before)  # truly idle: suspended
        assert suspending is not None and suspending.state is SandboxState.SUSPENDING
        await store.mark_suspended("org-2")
        assert (await store.reserve_sandbox(record("org-2"), Caps(), 30)).outcome is Reserved.RESUME
        await store.mark_ready("org-2", ENDPOINT)  # woken: becoming ready is activity
        assert await store.begin_suspend("org-2", 30, idle_before) is None  # the stale page's verdict
        assert await store.begin_suspend("org-1", 30) is not None  # no idle bound: the operator's suspend

    async def test_a_lease_is_renewed_by_its_holder_only(self, store: SessionStore, clock: FakeClock) -> None:
        """A live creator or waker renews its lease (the deadline it was given is its proof); once
        it lapsed and someone took the work over, or the work settled, a renewal changes nothing."""
        held = (await store.reserve_sandbox(record("org-1"), Caps(), 10)).record.lease_until
        clock.advance(8)
        renewed = clock() + 10
        assert await store.extend_lease("org-1", {held}, renewed)
        assert (await store.get_sandbox("org-1")).lease_until == renewed  # type: ignore[union-attr]
        assert not await store.extend_lease("org-1", {held}, clock() + 10)  # an old deadline proves nothing
        # ... but among those the caller holds (a renewal whose reply was lost ran): still its lease
        assert await store.extend_lease("org-1", {held, renewed}, renewed + 1)
        renewed += 1
        clock.advance(12)  # the holder died: its lease lapsed
        taken = await store.reserve_sandbox(record("org-1"), Caps(), 10)
        assert taken.outcome is Reserved.TAKEN_OVER
        assert not await store.extend_lease("org-1", {held, renewed}, clock() + 10)  # the dead holder's: refused
        with pytest.raises(LeaseLost):  # and so is its ready, and its undo
            await store.mark_ready("org-1", ENDPOINT, held={held, renewed})
        assert await store.release_sandbox("org-1", error="late", held={renewed}) is None
        ours = clock() + 10
        assert await store.extend_lease("org-1", {taken.record.lease_until}, ours)  # the new holder's
        await store.mark_ready("org-1", ENDPOINT, held={ours})
        assert not await store.extend_lease("org-1", {ours}, clock() + 20)  # settled: nothing to renew
        suspending = await store.begin_suspend("org-1", 10)
        assert suspending is not None
        assert await store.extend_lease("org-1", {suspending.lease_until}, clock() + 10)  # a suspend too
        assert not await store.extend_lease("ses-none", {0.0}, clock() + 10)

    async def test_a_resumer_undoes_only_its_own_wake(self, store: SessionStore, clock: FakeClock) -> None:
        """A failed resume whose lease was taken over leaves the new holder's wake alone."""
        await store.reserve_sandbox(record("org-1"), Caps(), 10)
        await store.mark_ready("org-1", ENDPOINT)
        await store.begin_suspend("org-1", 10)
        suspended = await store.mark_suspended("org-1")
        assert suspended is not None
        first = (await store.reserve_sandbox(suspended, Caps(), 10)).record.lease_until
        clock.advance(11)
        second = await store.reserve_sandbox(suspended, Caps(), 10)
        assert second.outcome is Reserved.RESUME
        assert await store.mark_suspended("org-1", error="late", held={first}) is None
        current = await store.get_sandbox("org-1")
        assert current is not None and current.state is SandboxState.RESUMING
        assert await store.mark_suspended("org-1", error="failed", held={second.record.lease_until}) is not None

    async def test_a_filtered_listing_pages_through_every_match_once(self, store: SessionStore) -> None:
        """Filtered pages are short and may be empty, but paging by their cursor returns each match once."""
        await ready_at(store, {f"org-{i}": T0 + i for i in range(7)})
        for i in (1, 2, 5):
            await store.begin_suspend(f"org-{i}", 30)
            await store.mark_suspended(f"org-{i}")
        await store.touch({f"org-{i}": T0 + 100 + i for i in range(7)}, {})  # suspends moved them: order again
        seen: list[str] = []
        after: Position | None = None
        for _ in range(20):
            page = await store.scan_sandboxes(after, limit=2, scan=3, where=SandboxFilter(state=SandboxState.SUSPENDED))
            assert len(page.records) <= 2 and all(r.state is SandboxState.SUSPENDED for r in page.records)
            seen += [r.sandbox_id for r in page.records]
            if page.next is None:
                break
            after = page.next
        assert seen == ["org-1", "org-2", "org-5"]
        page = await store.scan_sandboxes(None, limit=10, scan=10, where=SandboxFilter(pool="shared", org_id="acme"))
        assert [r.sandbox_id for r in page.records] == [f"org-{i}" for i in range(7)] and page.next is None
        assert (await store.scan_sandboxes(None, limit=10, scan=10, where=SandboxFilter(pool="small"))).records == []

    async def test_waiters_share_a_wake_and_its_failure(self, store: SessionStore) -> None:
        await ready_at(store, {"org-1": T0})
        await store.begin_suspend("org-1", 30)
        waiter = asyncio.create_task(store.wait_settled("org-1", timeout=5))  # waits out the suspend
        assert await still_waiting(store, "org-1", waiter)
        await store.mark_suspended("org-1")
        assert (await waiter).outcome is Settled.SUSPENDED
        assert (await store.reserve_sandbox(record("org-1"), Caps(), 30)).outcome is Reserved.RESUME
        waiters = [asyncio.create_task(store.wait_settled("org-1", timeout=5)) for _ in range(3)]
        assert await still_waiting(store, "org-1", *waiters)
        back = await store.mark_suspended("org-1", error="node is gone")
        assert back is not None and back.state is SandboxState.SUSPENDED  # failed: suspended, never stuck
        assert await asyncio.gather(*waiters) == [Settlement(Settled.FAILED, error="node is gone")] * 3
        assert (await store.reserve_sandbox(record("org-1"), Caps(), 30)).outcome is Reserved.RESUME  # retried
        ready = asyncio.create_task(store.wait_settled("org-1", timeout=5))
        assert await still_waiting(store, "org-1", ready)
        await store.mark_ready("org-1", ENDPOINT)
        assert (await ready).outcome is Settled.READY

    async def test_suspended_sandboxes_leave_the_caps_and_a_wake_counts_again(self, store: SessionStore) -> None:
        caps = Caps(pool_max=1)
        await ready_at(store, {"org-1": T0})
        await store.begin_suspend("org-1", 30)
        with pytest.raises(CapacityExceeded):  # suspending still holds its compute
            await store.reserve_sandbox(record("org-2"), caps, 30)
        await store.mark_suspended("org-1")
        assert (await store.reserve_sandbox(record("org-2"), caps, 30)).created
        with pytest.raises(CapacityExceeded) as info:  # waking it would exceed the cap
            await store.reserve_sandbox(record("org-1"), caps, 30)
        assert info.value.scope == CapScope.POOL
        await store.release_sandbox("org-2")
        assert (await store.reserve_sandbox(record("org-1"), caps, 30)).outcome is Reserved.RESUME

    async def test_an_abandoned_wake_is_taken_over(self, store: SessionStore, clock: FakeClock) -> None:
        await ready_at(store, {"org-1": T0})
        await store.begin_suspend("org-1", 30)
        clock.advance(31)  # the suspender died: the next request resumes (resume is idempotent)
        assert (await store.reserve_sandbox(record("org-1"), Caps(pool_max=1), 30)).outcome is Reserved.RESUME
        assert (await store.reserve_sandbox(record("org-1"), Caps(), 30)).outcome is Reserved.EXISTING
        clock.advance(31)  # the resumer died too
        assert (await store.reserve_sandbox(record("org-1"), Caps(pool_max=1), 30)).outcome is Reserved.RESUME
        assert await store.fleet_counts() == FleetCounts({("shared", SandboxState.RESUMING): 1}, {})  # counted once

    async def test_fleet_counts_and_listing_show_the_suspend_states(self, store: SessionStore) -> None:
        await ready_at(store, {"org-1": T0, "org-2": T0})
        await store.begin_suspend("org-1", 30)
        await store.begin_suspend("org-2", 30)
        await store.mark_suspended("org-2")
        assert await store.fleet_counts() == FleetCounts(
            {("shared", SandboxState.SUSPENDING): 1, ("shared", SandboxState.SUSPENDED): 1}, {})
        await store.reserve_sandbox(record("org-2"), Caps(), 30)
        assert {r.sandbox_id: r.state for r in await all_sandboxes(store)} == {
            "org-1": SandboxState.SUSPENDING, "org-2": SandboxState.RESUMING}
        page = await store.scan_sandboxes(None, limit=10, scan=10, where=SandboxFilter(state=SandboxState.RESUMING))
        assert [r.sandbox_id for r in page.records] == ["org-2"]
        await store.release_sandbox("org-1")
        await store.release_sandbox("org-2")
        assert await store.fleet_counts() == FleetCounts()

    async def test_a_suspended_record_is_not_marked_ready(self, store: SessionStore) -> None:
        await ready_at(store, {"org-1": T0})
        await store.begin_suspend("org-1", 30)
        with pytest.raises(NotReserved):
            await store.mark_ready("org-1", ENDPOINT)
        await store.mark_suspended("org-1")
        with pytest.raises(NotReserved):
            await store.mark_ready("org-1", ENDPOINT)

    async def test_becoming_ready_is_activity(self, store: SessionStore, clock: FakeClock) -> None:
        await store.reserve_sandbox(record("org-1"), Caps(), 300)
        clock.advance(120)  # a slow creation: it is not idle the moment it is ready
        assert (await store.mark_ready("org-1", ENDPOINT)).last_active == clock()
        await store.begin_suspend("org-1", 30)
        await store.mark_suspended("org-1")
        clock.advance(3600)  # suspended long ago: woken, it is not idle at once either
        await store.reserve_sandbox(record("org-1"), Caps(), 30)
        assert (await store.mark_ready("org-1", ENDPOINT)).last_active == clock()

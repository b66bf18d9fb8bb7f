"""The ``SessionStore`` contract, fleet half: filtered listings from the state-and-pool indexes, and the
reaper's batch calls (``claim_due``, ``finish_due``). Same fixtures as ``tests/store_contract.py``;
``tests/test_store.py`` runs it against the memory store and the Redis store.
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.errors import CapacityExceeded
from gateway.model import SandboxRecord, SandboxState
from gateway.store.base import (
    Caps, CapScope, Claim, Due, NotReserved, Position, Reserved, SandboxFilter, SessionStore, Settled,
)
from gateway.store.redis import RedisStore
from routing import per_session_sandbox_id
from tests.clock import T0, FakeClock
from tests.store_contract import ENDPOINT, all_sandboxes, binding, ready_at, record, still_waiting

POOLS = ("shared", "small")


async def listed(store: SessionStore, where: SandboxFilter, *, page: int = 2) -> list[SandboxRecord]:
    """Every record ``where`` selects, paged ``page`` at a time (small pages: the cursor crosses indexes)."""
    found: list[SandboxRecord] = []
    after: Position | None = None
    while True:
        got = await store.scan_sandboxes(after, limit=page, scan=page, where=where)
        found += got.records
        if got.next is None:
            return found
        after = got.next


async def assert_listings_match_records(store: SessionStore) -> None:
    """Every filtered listing is exactly the unfiltered one filtered: the indexes have not drifted."""
    everything = await all_sandboxes(store)
    for where in ([SandboxFilter(state=state) for state in SandboxState]
                  + [SandboxFilter(pool=pool) for pool in POOLS]
                  + [SandboxFilter(pool=pool, state=state) for pool in POOLS for state in SandboxState]):
        assert await listed(store, where) == [r for r in everything if where.matches(r)], where


async def every_transition(store: SessionStore, clock: FakeClock) -> None:
    """Records of two pools taken through every state change a store makes (a fresh store)."""
    for i in range(4):
        await store.reserve_sandbox(record(f"org-{i}", pool=POOLS[i % 2]), Caps(), 30)  # creating
    for i in range(3):
        await store.mark_ready(f"org-{i}", ENDPOINT)  # ready; org-3 stays creating
    await store.touch({"org-0": T0 + 5, "org-1": T0 + 3, "org-3": T0 + 4}, {})
    await store.begin_suspend("org-0", 30)  # suspending
    clock.advance(1)
    await store.begin_suspend("org-1", 30)
    await store.mark_suspended("org-1")  # suspended
    await store.reserve_sandbox(record("org-1", pool="small"), Caps(), 30)  # resuming
    await store.mark_ready("org-1", ENDPOINT)  # ready again, active now
    claims = await store.claim_due([Due("org-2", SandboxState.READY, clock() + 1, SandboxState.DELETING)],
                                   clock() + 30, "claim-1")
    assert claims == [Claim.CLAIMED]  # deleting
    await store.reserve_sandbox(record("org-4", pool="small"), Caps(), 30)
    await store.release_sandbox("org-4")  # released
    clock.advance(31)  # the creation of org-3 and the delete of org-2 lapse: both are taken over
    assert (await store.reserve_sandbox(record("org-3", pool="small"), Caps(), 30)).outcome is Reserved.TAKEN_OVER
    assert (await store.reserve_sandbox(record("org-2"), Caps(), 30)).outcome is Reserved.TAKEN_OVER
    await store.reserve_sandbox(record("org-5"), Caps(), 30)
    await store.mark_ready("org-5", ENDPOINT)
    await store.touch({"org-5": clock() + 1, "org-1": clock() + 2}, {})


async def wipe_state_indexes(store: RedisStore) -> None:
    """What a store written by the version before the state-and-pool indexes looks like."""
    base = store.keys.state_index("", "")[:-len(":")]
    async for key in store._redis.scan_iter(match=base.replace("{", "[{]") + "*"):
        await store._redis.delete(key)
    await store._redis.delete(store.keys.indexed)


class FleetContract:
    # filtered listings -------------------------------------------------------
    async def test_filtered_listings_never_drift_from_the_records(self, store: SessionStore,
                                                                  clock: FakeClock) -> None:
        await assert_listings_match_records(store)  # empty
        await every_transition(store, clock)
        states = {r.sandbox_id: r.state for r in await all_sandboxes(store)}
        assert states == {"org-0": SandboxState.SUSPENDING, "org-1": SandboxState.READY,
                          "org-2": SandboxState.CREATING, "org-3": SandboxState.CREATING,
                          "org-5": SandboxState.READY}
        await assert_listings_match_records(store)

    async def test_a_selective_filter_finds_its_matches_however_far_apart(self, store: SessionStore) -> None:
        """A page of ``?state=`` or ``?pool=`` examines only matching entries: a rare match among many
        others comes on the first page (a scan of the whole index would come back empty, twice)."""
        await ready_at(store, {f"org-{i}": T0 + i for i in range(6)})
        await store.reserve_sandbox(record("ses-1", pool="small"), Caps(), 30)
        await store.mark_ready("ses-1", ENDPOINT)
        await store.touch({"ses-1": T0 + 10}, {})
        await store.begin_suspend("org-4", 30)
        for where, expected in ((SandboxFilter(pool="small"), ["ses-1"]),
                                (SandboxFilter(state=SandboxState.SUSPENDING), ["org-4"]),
                                (SandboxFilter(pool="shared", state=SandboxState.SUSPENDING), ["org-4"])):
            page = await store.scan_sandboxes(None, limit=5, scan=2, where=where)
            assert [r.sandbox_id for r in page.records] == expected and page.next is None, where
        ready = await store.scan_sandboxes(None, limit=2, scan=2, where=SandboxFilter(state=SandboxState.READY))
        assert [r.sandbox_id for r in ready.records] == ["org-0", "org-1"] and ready.next == Position(T0 + 1, "org-1")
        due = await store.scan_sandboxes(None, limit=10, scan=10, before=T0 + 3,
                                         where=SandboxFilter(pool="shared", state=SandboxState.READY))
        assert [r.sandbox_id for r in due.records] == ["org-0", "org-1", "org-2"] and due.next is None

    # the reaper's batches ------------------------------------------------------
    async def test_claim_due_is_a_compare_and_set_on_what_the_verdict_saw(self, store: SessionStore,
                                                                          clock: FakeClock) -> None:
        await ready_at(store, {"org-1": T0, "org-2": T0, "org-3": T0, "org-4": T0})
        clock.advance(100)
        before = clock() - 50  # the verdict: idle since T0 < before
        await store.touch({"org-1": clock()}, {})  # used after the page was read
        await store.begin_suspend("org-2", 30)  # suspended by someone else meanwhile
        await store.add_streams({"org-3": 1})  # a stream open
        seen: list[str] = []
        store.subscribe(seen.append)
        due = [Due(f"org-{i}", SandboxState.READY, before, SandboxState.DELETING) for i in range(1, 5)]
        claims = await store.claim_due(due, clock() + 30, "claim-1")
        assert claims == [Claim.CHANGED, Claim.CHANGED, Claim.BUSY, Claim.CLAIMED]
        assert seen == ["org-4"]  # routes dropped for what was claimed only
        assert (await store.get_sandbox("org-4")).state is SandboxState.DELETING  # type: ignore[union-attr]
        assert (await store.get_sandbox("org-1")).state is SandboxState.READY  # type: ignore[union-attr]
        quiet = Due("org-3", SandboxState.READY, before, SandboxState.DELETING, check_streams=False)
        assert await store.claim_due([quiet], clock() + 30, "claim-1") == [Claim.CLAIMED]  # streams judged dead
        assert await store.claim_due(due[3:], clock() + 30, "claim-2") == [Claim.CHANGED]  # claimed once
        counts = (await store.fleet_counts()).sandboxes
        assert counts[("shared", SandboxState.DELETING)] == 2
        # Deleting is not live: the caps count only org-1 (ready) and org-2 (suspending).
        with pytest.raises(CapacityExceeded):
            await store.reserve_sandbox(record("org-9"), Caps(pool_max=2), 30)
        assert (await store.reserve_sandbox(record("org-9"), Caps(pool_max=3), 30)).created
        suspend = Due("org-1", SandboxState.READY, clock() + 1, SandboxState.SUSPENDING)
        assert await store.claim_due([suspend], clock() + 30, "claim-3") == [Claim.CLAIMED]
        assert (await store.get_sandbox("org-1")).state is SandboxState.SUSPENDING  # type: ignore[union-attr]
        with pytest.raises(CapacityExceeded) as refused:  # suspending is live: it still counts
            await store.reserve_sandbox(record("org-8"), Caps(pool_max=3), 30)
        assert refused.value.scope is CapScope.POOL

    async def test_a_claimed_delete_holds_requests_then_they_create_it_anew(self, store: SessionStore,
                                                                           clock: FakeClock) -> None:
        own = per_session_sandbox_id("s-1")  # its own sandbox: the binding lives (and goes) with it
        await store.put_binding(binding("s-1", own, pool="small"))
        await store.put_binding(binding("s-2", own, pool="small"))  # another session bound to it
        await store.reserve_sandbox(record(own, pool="small"), Caps(), 30)
        await store.mark_ready(own, ENDPOINT)
        clock.advance(100)
        due = Due(own, SandboxState.READY, clock(), SandboxState.DELETING)
        assert await store.claim_due([due], clock() + 30, "claim-1") == [Claim.CLAIMED]
        again = await store.reserve_sandbox(record(own, pool="small"), Caps(), 30)
        assert again.outcome is Reserved.EXISTING and again.record.state is SandboxState.DELETING
        waiter = asyncio.create_task(store.wait_settled(own, 5))
        assert await still_waiting(store, own, waiter)
        with pytest.raises(NotReserved):
            await store.mark_ready(own, ENDPOINT)  # being deleted: nobody completes it
        assert await store.finish_due([], [own], "claim-2") == []  # another claim's token: left alone
        assert await still_waiting(store, own, waiter)
        assert await store.finish_due([], [own], "claim-1") == [own]  # s-2 is left for the caller
        assert (await waiter).outcome is Settled.REMOVED  # reserve again: a new sandbox
        assert await store.get_sandbox(own) is None
        assert await store.get_binding("s-1") is None  # its own session's binding went with it
        assert await store.get_binding("s-2") is not None
        assert (await store.fleet_counts()).sessions == {"small": 1}
        assert (await store.reserve_sandbox(record(own, pool="small"), Caps(), 30)).created

    async def test_a_delete_whose_reaper_died_is_taken_over(self, store: SessionStore, clock: FakeClock) -> None:
        await ready_at(store, {"org-1": T0, "org-2": T0})
        clock.advance(100)
        due = [Due(f"org-{i}", SandboxState.READY, clock(), SandboxState.DELETING) for i in (1, 2)]
        assert await store.claim_due(due, clock() + 10, "dead") == [Claim.CLAIMED] * 2
        lapsed = [Due(f"org-{i}", SandboxState.DELETING, clock(), SandboxState.DELETING) for i in (1, 2)]
        assert await store.claim_due(lapsed, clock() + 10, "next") == [Claim.CHANGED] * 2  # its lease runs
        clock.advance(11)  # the reaper died: a request re-creates org-1, the next pass deletes org-2
        assert (await store.reserve_sandbox(record("org-1"), Caps(), 30)).outcome is Reserved.TAKEN_OVER
        assert await store.claim_due(lapsed, clock() + 10, "next") == [Claim.CHANGED, Claim.CLAIMED]
        assert await store.finish_due([], ["org-1", "org-2"], "dead") == []  # the dead reaper's: nothing
        assert await store.get_sandbox("org-2") is not None
        assert await store.finish_due([], ["org-1", "org-2"], "next") == []
        assert [r.sandbox_id for r in await all_sandboxes(store)] == ["org-1"]  # the new creation stays
        await assert_listings_match_records(store)

    async def test_a_claimed_suspend_settles_as_suspended(self, store: SessionStore, clock: FakeClock) -> None:
        await ready_at(store, {"org-1": T0})
        clock.advance(100)
        due = Due("org-1", SandboxState.READY, clock(), SandboxState.SUSPENDING)
        assert await store.claim_due([due], clock() + 30, "claim-1") == [Claim.CLAIMED]
        waiter = asyncio.create_task(store.wait_settled("org-1", 5))
        assert await still_waiting(store, "org-1", waiter)
        clock.advance(1)
        assert await store.finish_due(["org-1"], [], "claim-1") == []
        settled = await waiter
        assert settled.outcome is Settled.SUSPENDED
        suspended = await store.get_sandbox("org-1")
        assert suspended is not None and suspended.state is SandboxState.SUSPENDED and suspended.endpoint is None
        assert suspended.last_active == clock()  # retention counts from the suspend
        assert (await store.reserve_sandbox(record("org-1"), Caps(), 30)).outcome is Reserved.RESUME
        await assert_listings_match_records(store)

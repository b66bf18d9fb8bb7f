"""Both stores against the one contract, then what only the Redis store promises.

The Redis tests run a real ``redis-server`` (``tests/redis_server.py``): two
``RedisStore`` instances on one server are two gateway replicas.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st
from redis import exceptions as redis_errors

from gateway.errors import CapacityExceeded, StoreUnavailable
from gateway.model import Binding, Owner, SandboxState
from gateway.store.base import Caps, Claim, Due, Reserved, SandboxFilter, SessionStore, Settled, Settlement
from gateway.store.memory import MemoryStore
from gateway.store.redis import RedisKeys, RedisStore
from gateway.store.redis_errors import unavailable
from tests.clock import FakeClock
from tests.redis_server import RedisServer, free_port, redis_process, redis_server, redis_server_factory  # noqa: F401
from routing import Isolation, per_session_sandbox_id
from tests.store_contract import ENDPOINT, StoreContract, binding, record, still_waiting
from tests.store_contract_fleet import (
    FleetContract, assert_listings_match_records, every_transition, wipe_state_indexes,
)
from tests.store_contract import all_sandboxes

ServerFactory = Callable[..., RedisServer]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def prefix() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def replicas(redis_server: RedisServer, prefix: str) -> AsyncIterator[Callable[..., RedisStore]]:
    """Build RedisStores ("replicas") of one installation; all closed after the test."""
    made: list[RedisStore] = []

    def make(replica_id: str = "replica-a", **options: object) -> RedisStore:
        store = RedisStore(redis_server.url, prefix, replica_id, **options)  # type: ignore[arg-type]
        made.append(store)
        return store

    yield make
    for store in made:
        await store.close()


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest, clock: FakeClock, prefix: str) -> AsyncIterator[SessionStore]:
    if request.param == "memory":
        made: SessionStore = MemoryStore(clock=clock)
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        made = RedisStore(server.url, prefix, "replica-a", clock=clock)
    yield made
    await made.close()


class TestStoreContract(StoreContract):
    pass


class TestStoreFleetContract(FleetContract):
    pass


# keys -----------------------------------------------------------------------
def test_key_kinds_are_prefix_free() -> None:
    parts = RedisKeys.VARIABLE + RedisKeys.FIXED
    for a in parts:
        for b in parts:
            if a != b:
                assert not b.startswith(a), f"{a!r} is a prefix of {b!r}: keys could collide"


_KINDS = ("binding", "sandbox", "streams", "replica", "lease")


@given(st.sampled_from(_KINDS), st.text(max_size=40), st.sampled_from(_KINDS), st.text(max_size=40))
def test_keys_never_collide(kind_a: str, id_a: str, kind_b: str, id_b: str) -> None:
    keys = RedisKeys("gw")
    fixed = {keys.session_seen, keys.sandboxes, keys.count_pool, keys.count_org, keys.count_state,
             keys.count_sessions, keys.settled, keys.invalidate}
    key_a, key_b = getattr(keys, kind_a)(id_a), getattr(keys, kind_b)(id_b)
    assert (key_a == key_b) == ((kind_a, id_a) == (kind_b, id_b))
    assert key_a not in fixed
    assert key_a.startswith("{gw}:")  # one cluster hash tag per installation


@pytest.mark.parametrize("bad", [pytest.param("", id="empty"), pytest.param("a{b", id="brace")])
def test_prefix_must_be_a_clean_hash_tag(bad: str) -> None:
    with pytest.raises(ValueError, match="prefix"):
        RedisKeys(bad)


@pytest.mark.parametrize(("error", "reason", "retry_after"), [
    pytest.param(redis_errors.BusyLoadingError(), "loading its dataset", 2.0, id="loading"),
    pytest.param(redis_errors.ConnectionError(), "cannot be reached", 5.0, id="connection"),
    pytest.param(redis_errors.TimeoutError(), "did not answer in time", 2.0, id="timeout"),
    pytest.param(redis_errors.ReadOnlyError(), "read-only replica", 5.0, id="read-only"),
    pytest.param(redis_errors.OutOfMemoryError(), "out of memory", 30.0, id="oom"),
    pytest.param(redis_errors.ResponseError(), "refused the command", 5.0, id="other"),
])
def test_redis_errors_become_store_unavailable(error: redis_errors.RedisError, reason: str,
                                               retry_after: float) -> None:
    mapped = unavailable("bind a session", error)
    assert isinstance(mapped, StoreUnavailable) and mapped.status == 503
    assert "could not bind a session" in mapped.message and reason in mapped.message
    assert mapped.retry_after == retry_after


# replicas -------------------------------------------------------------------
async def test_create_once_across_replicas(replicas: Callable[..., RedisStore]) -> None:
    # B never re-reads on a timer here: only the pub/sub message can wake it.
    a, b = replicas("replica-a"), replicas("replica-b", recheck_interval=60)
    assert (await a.reserve_sandbox(record("org-1"), Caps(), 30)).created
    assert not (await b.reserve_sandbox(record("org-1"), Caps(), 30)).created
    waiter = asyncio.create_task(b.wait_settled("org-1", timeout=10))
    assert await still_waiting(b, "org-1", waiter)
    await a.mark_ready("org-1", ENDPOINT)
    settlement = await asyncio.wait_for(waiter, 5)
    assert settlement.record is not None and settlement.record.endpoint == ENDPOINT


async def test_concurrent_reserves_on_two_replicas_create_once(replicas: Callable[..., RedisStore]) -> None:
    a, b = replicas("replica-a"), replicas("replica-b")
    results = await asyncio.gather(*(store.reserve_sandbox(record("org-1"), Caps(pool_max=1), 30)
                                     for _ in range(50) for store in (a, b)))
    assert sum(r.created for r in results) == 1


async def test_creator_error_reaches_the_other_replica(replicas: Callable[..., RedisStore]) -> None:
    a, b = replicas("replica-a"), replicas("replica-b", recheck_interval=60)
    await a.reserve_sandbox(record("org-1"), Caps(), 30)
    waiter = asyncio.create_task(b.wait_settled("org-1", timeout=10))
    assert await still_waiting(b, "org-1", waiter)
    await a.release_sandbox("org-1", error="quota exceeded at the provider")
    assert await asyncio.wait_for(waiter, 5) == Settlement(Settled.FAILED, error="quota exceeded at the provider")


async def test_dead_creator_is_taken_over(replicas: Callable[..., RedisStore]) -> None:
    a, b = replicas("replica-a"), replicas("replica-b", recheck_interval=60)
    invalidated = asyncio.Event()
    a.subscribe(lambda key: invalidated.set() if key == "org-1" else None)
    await a.subscribed()
    assert (await a.reserve_sandbox(record("org-1"), Caps(pool_max=1), lease_seconds=0.3)).created
    # a "dies" here: it never marks the sandbox ready nor releases it
    started = time.monotonic()
    settlement = await asyncio.wait_for(b.wait_settled("org-1", timeout=10), 5)
    assert 0.2 < time.monotonic() - started < 3  # woken by the lease expiry, not the timeout
    assert settlement.record is not None and settlement.record.state is SandboxState.CREATING
    assert settlement.outcome is Settled.ABANDONED  # SessionRouter reads this as "reserve again"
    taken = await b.reserve_sandbox(record("org-1"), Caps(pool_max=1), lease_seconds=30)
    assert taken.outcome is Reserved.TAKEN_OVER  # the stale reservation did not count against the cap
    await asyncio.wait_for(invalidated.wait(), 5)  # the takeover reached the other replica


async def test_invalidations_reach_other_replicas(replicas: Callable[..., RedisStore]) -> None:
    a, b = replicas("replica-a"), replicas("replica-b")
    seen: list[str] = []
    two = asyncio.Event()

    def callback(key: str) -> None:
        seen.append(key)
        if len(seen) == 2:
            two.set()

    b.subscribe(callback)
    await b.subscribed()
    await a.put_binding(binding("s1"))
    await a.reserve_sandbox(record("org-1"), Caps(), 30)
    await a.delete_binding("s1")
    await a.release_sandbox("org-1")
    await asyncio.wait_for(two.wait(), 5)
    assert seen == ["s1", "org-1"]


def test_subscribe_before_any_loop_runs(redis_server: RedisServer, prefix: str) -> None:
    # As when the composition root builds the SessionRouter before the server's loop starts.
    store, other = RedisStore(redis_server.url, prefix, "replica-a"), RedisStore(redis_server.url, prefix, "replica-b")
    seen: list[str] = []
    arrived: list[asyncio.Event] = []  # the event needs the loop, which does not exist yet

    def callback(key: str) -> None:
        seen.append(key)
        arrived[0].set()

    store.subscribe(callback)

    async def scenario() -> None:
        arrived.append(asyncio.Event())
        try:
            assert await store.get_binding("s1") is None  # the first call from a loop starts the listener
            await store.subscribed()
            await other.put_binding(binding("s1"))
            await other.delete_binding("s1")
            await asyncio.wait_for(arrived[0].wait(), 5)
        finally:
            await store.close()
            await other.close()

    asyncio.run(scenario())
    assert seen == ["s1"]


async def test_streams_of_a_silent_replica_stop_counting(replicas: Callable[..., RedisStore]) -> None:
    # a's heartbeat lives 0.3 s and is never refreshed: a behaves like a crashed replica
    a = replicas("replica-a", heartbeat_ttl=0.3, heartbeat_interval=60)
    b = replicas("replica-b")
    await a.add_streams({"org-1": 2})
    await b.add_streams({"org-1": 1})
    assert await b.open_streams("org-1") == 3
    for _ in range(100):
        if await b.open_streams("org-1") == 1:
            break
        await asyncio.sleep(0.02)
    else:
        pytest.fail("the silent replica's streams kept counting")
    await a.add_streams({"org-1": 0})  # a is back: its heartbeat, and so its streams, count again
    assert await b.open_streams("org-1") == 3


async def test_a_closed_replica_stops_counting_at_once(replicas: Callable[..., RedisStore]) -> None:
    a, b = replicas("replica-a"), replicas("replica-b")
    await a.add_streams({"org-1": 2})
    await b.add_streams({"org-1": 1})
    await a.close()
    assert await b.open_streams("org-1") == 1


async def test_redis_expires_a_lease_even_if_the_clock_stands_still(replicas: Callable[..., RedisStore]) -> None:
    still = FakeClock()
    a, b = replicas("replica-a", clock=still), replicas("replica-b", clock=still)
    assert await a.acquire_lease("reaper", "replica-a", ttl=0.2)
    assert not await b.acquire_lease("reaper", "replica-b", ttl=0.2)
    for _ in range(100):  # the key's own TTL (Redis time) is the backstop
        if await b.acquire_lease("reaper", "replica-b", ttl=30):
            break
        await asyncio.sleep(0.02)
    else:
        pytest.fail("the lease never expired")


async def test_installations_do_not_see_each_other(redis_server: RedisServer) -> None:
    one = RedisStore(redis_server.url, "one", "replica-a")
    two = RedisStore(redis_server.url, "two", "replica-a")
    try:
        await one.put_binding(binding("s1"))
        await one.reserve_sandbox(record("org-1"), Caps(pool_max=1), 30)
        assert await two.get_binding("s1") is None
        assert (await two.reserve_sandbox(record("org-1"), Caps(pool_max=1), 30)).created
    finally:
        await one.close()
        await two.close()


# the layout: a per-session binding folded into its sandbox's hash ---------------------------
def _own_binding(session_id: str) -> Binding:
    return Binding(session_id, per_session_sandbox_id(session_id), "small", Isolation.PER_SESSION,
                   Owner("9d278969-5453-4ae3-a51f-a8d2274a7b56", "fd93a81c-63c2-4d14-84b3-60d6ac3b592f", None), 1e9)


async def test_a_per_session_binding_lives_in_its_sandboxs_hash(redis_server: RedisServer, replicas) -> None:
    store = replicas()
    own = _own_binding("agent_1")
    await store.put_binding(own)
    await store.reserve_sandbox(record(own.sandbox_id, pool="small"), Caps(), 30)
    await store.mark_ready(own.sandbox_id, ENDPOINT)
    raw = redis.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        assert not raw.exists(store.keys.binding("agent_1"))  # no key of its own
        assert raw.zscore(store.keys.session_seen, "agent_1") is None  # nor a seen entry, while its record lives
        assert raw.object("encoding", store.keys.sandbox(own.sandbox_id)) == "listpack"
        assert await replicas("replica-b").get_binding("agent_1") == own  # any replica reads it
    finally:
        raw.close()


async def test_a_binding_written_by_the_previous_layout_still_reads_and_deletes(redis_server: RedisServer,
                                                                               replicas) -> None:
    """Before folding, a per-session binding had its own key, a seen entry and an empty session field:
    an upgraded fleet reads it, keeps it (a second put does not fold over it) and deletes it whole."""
    store = replicas()
    own = _own_binding("agent_old")
    keys, sandbox = store.keys, per_session_sandbox_id("agent_old")
    raw = redis.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        raw.set(keys.binding("agent_old"), RedisStore.binding_value(own))  # exactly what the previous PUT_BINDING wrote
        raw.zadd(keys.session_seen, {"agent_old": own.created_at})
        raw.hset(keys.sandbox(sandbox), mapping={"+agent_old": "", "n": 1})
        raw.hincrby(keys.count_sessions, "small", 1)
        assert await store.get_binding("agent_old") == own
        assert await store.put_binding(_own_binding("agent_old")) == own and not raw.hexists(keys.sandbox(sandbox), "=")
        assert await store.sessions_of(sandbox) == ["agent_old"]
        assert await store.delete_binding("agent_old") == own
        assert await store.get_binding("agent_old") is None
        assert not raw.exists(keys.binding("agent_old"), keys.sandbox(sandbox))
        assert raw.zscore(keys.session_seen, "agent_old") is None and not raw.hget(keys.count_sessions, "small")
    finally:
        raw.close()


# Redis trouble ----------------------------------------------------------------
@pytest.mark.parametrize("kill", [pytest.param(False, id="sigterm"), pytest.param(True, id="sigkill")])
async def test_state_survives_a_restart_with_appendonly(redis_server_factory: ServerFactory, prefix: str,
                                                        kill: bool) -> None:
    server = redis_server_factory(appendonly=True)
    store = RedisStore(server.url, prefix, "replica-a")
    try:
        await store.put_binding(binding("s1"))
        await store.reserve_sandbox(record("org-1"), Caps(pool_max=1), 30)
        await store.mark_ready("org-1", ENDPOINT)
        server.restart(kill=kill)
        assert await store.get_binding("s1") == binding("s1")
        sandbox = await store.get_sandbox("org-1")
        assert sandbox is not None and sandbox.endpoint == ENDPOINT and sandbox.sessions == 1
        with pytest.raises(CapacityExceeded):  # the capacity counters survived too
            await store.reserve_sandbox(record("org-2"), Caps(pool_max=1), 30)
    finally:
        await store.close()


@pytest.mark.parametrize("appendonly", [pytest.param(True, id="aof"), pytest.param(False, id="no-persistence")])
async def test_the_epoch_is_when_the_data_began(redis_server_factory: ServerFactory, prefix: str,
                                                appendonly: bool) -> None:
    """The orphan sweep's grace counts from it: a Redis back without its data begins again."""
    server = redis_server_factory(appendonly=appendonly)
    clock = FakeClock(1000.0)
    store, other = RedisStore(server.url, prefix, "replica-a", clock=clock), RedisStore(server.url, prefix, "replica-b")
    try:
        assert await store.epoch() == 1000.0
        clock.advance(50)
        assert await store.epoch() == 1000.0 and await other.epoch() == 1000.0  # the first writer's, for all
        server.restart(kill=True)
        assert await store.epoch() == (1000.0 if appendonly else 1050.0)
    finally:
        await store.close()
        await other.close()


async def test_outage_is_store_unavailable_and_the_store_recovers(redis_server_factory: ServerFactory,
                                                                  prefix: str) -> None:
    server = redis_server_factory(appendonly=True)
    store = RedisStore(server.url, prefix, "replica-a")
    other = RedisStore(server.url, prefix, "replica-b")
    invalidated = asyncio.Event()
    store.subscribe(lambda key: invalidated.set())
    try:
        await store.put_binding(binding("s1"))
        await store.subscribed()
        server.stop()
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: store.get_binding("s1"), lambda: store.put_binding(binding("s2")), store.ping,
            lambda: store.reserve_sandbox(record("org-1"), Caps(), 30), lambda: store.open_streams("org-1"),
            lambda: store.wait_settled("org-1", timeout=5),
        ]
        for call in calls:
            with pytest.raises(StoreUnavailable) as raised:
                await call()
            assert isinstance(raised.value.__cause__, redis_errors.RedisError)
            assert raised.value.retry_after
        server.start()
        await store.ping()  # the same instance reconnects by itself
        assert await store.get_binding("s1") == binding("s1")
        await store.subscribed(timeout=5)  # and so does its pub/sub listener
        await other.delete_binding("s1")
        await asyncio.wait_for(invalidated.wait(), 5)
    finally:
        await store.close()
        await other.close()


async def test_nothing_is_half_written_when_redis_refuses(redis_server_factory: ServerFactory,
                                                          prefix: str) -> None:
    server = redis_server_factory()
    store = RedisStore(server.url, prefix, "replica-a")
    try:
        with redis.Redis(port=server.port) as raw:  # over maxmemory (noeviction): every write is refused
            raw.config_set("maxmemory", max(1, int(raw.info("memory")["used_memory"]) // 2))
        with pytest.raises(StoreUnavailable, match="out of memory"):
            await store.put_binding(binding("s1"))
        assert await store.get_binding("s1") is None
        assert await store.sessions_of("org-1") == []
        assert await store.idle_sessions(float("inf"), 10) == []
    finally:
        await store.close()


async def test_unreachable_redis_fails_fast(prefix: str) -> None:
    store = RedisStore(f"redis://127.0.0.1:{free_port()}/0", prefix, "replica-a")  # nobody listens there
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="cannot be reached"):
            await store.ping()
        assert time.monotonic() - started < 3
    finally:
        await store.close()


async def test_redis_state_indexes_hold_exactly_the_records(replicas: Callable[..., RedisStore]) -> None:
    """Each record is in exactly one ix:<state>:<pool> zset, its own, with idx's score; nothing stale is
    left behind (a listing skips released records, so only the keys themselves show that)."""
    clock = FakeClock()
    store, other = replicas("replica-a", clock=clock), replicas("replica-b", clock=clock)
    await every_transition(store, clock)
    await other.touch({"org-0": clock() + 9}, {})  # another replica's activity moves both indexes too
    activity = dict(await store._redis.zrange(store.keys.sandboxes, 0, -1, withscores=True))
    indexed: dict[str, tuple[str, float]] = {}
    base = store.keys.state_index("", "")[:-len(":")]
    async for key in store._redis.scan_iter(match=base.replace("{", "[{]") + "*"):
        for sandbox_id, score in await store._redis.zrange(key, 0, -1, withscores=True):
            assert sandbox_id not in indexed, f"{sandbox_id} is in two indexes"
            indexed[sandbox_id] = (key, score)
    records = {r.sandbox_id: r for r in await all_sandboxes(store)}
    assert set(indexed) == set(records) == set(activity)
    for sandbox_id, (key, score) in indexed.items():
        record = records[sandbox_id]
        assert key == store.keys.state_index(record.state.value, record.pool)
        assert score == activity[sandbox_id] == record.last_active
    assert activity["org-0"] == clock() + 9


async def test_records_of_an_earlier_version_are_backfilled_into_the_state_indexes(
        replicas: Callable[..., RedisStore]) -> None:
    clock = FakeClock()
    store = replicas("replica-a", clock=clock)
    await every_transition(store, clock)
    for i in range(20):
        await store.reserve_sandbox(record(f"old-{i}", pool="small"), Caps(), 30)
    expected = await all_sandboxes(store)
    await wipe_state_indexes(store)
    upgraded = replicas("replica-b", clock=clock)
    assert not await upgraded.backfill_indexes(7)  # a page of it
    assert not await upgraded.backfill_indexes(7)
    await assert_listings_match_records(upgraded)  # complete (a listing backfills its share, too)
    assert await upgraded.backfill_indexes(7)  # done: the marker says so
    # A replica of the earlier version, still running in a rolling upgrade, writes a record: the sweep goes on.
    old = expected[-1]
    await upgraded._redis.zrem(upgraded.keys.state_index(old.state.value, old.pool), old.sandbox_id)
    for _ in range(len(expected) // 7 + 2):
        assert await upgraded.backfill_indexes(7)
    await assert_listings_match_records(upgraded)
    small = await upgraded.scan_sandboxes(None, limit=100, scan=100, where=SandboxFilter(pool="small"))
    assert [r.sandbox_id for r in small.records] == [r.sandbox_id for r in expected if r.pool == "small"]


async def _sweep_idle(store: RedisStore) -> bool:
    """No sweep round under way ("d", no cursor), and none due next (the drift it stopped at is kept)."""
    return await store._redis.get(store.keys.indexed) == "d" and bool(await store._redis.hget(store.keys.sweep, "sig"))


async def _sweep_until_idle(store: RedisStore, limit: int) -> int:
    """Call the backfill until its sweep is idle; how many calls it took."""
    for calls in range(1, 100):
        assert await store.backfill_indexes(limit)
        if await _sweep_idle(store):
            return calls
    raise AssertionError("the index sweep never went idle")


async def test_the_index_sweep_runs_only_while_an_earlier_version_writes(
        replicas: Callable[..., RedisStore]) -> None:
    """Once every record is indexed, the sweep stops (it walked the whole fleet, 500 a pass, forever:
    a million sandboxes every 8 hours). A replica of the version before the indexes, writing during a
    rolling upgrade, moves the state counts off the indexes: a round lists what it wrote, and the
    sweep stops again."""
    clock = FakeClock()
    store = replicas("replica-a", clock=clock)
    await every_transition(store, clock)
    for i in range(20):
        await store.reserve_sandbox(record(f"new-{i}", pool="small"), Caps(), 30)
    assert await _sweep_until_idle(store, 7) <= 5  # one round at most, of 4 pages: nothing to list
    for _ in range(5):  # idle: no page is read, no cursor moves
        assert await store.backfill_indexes(7)
        assert await _sweep_idle(store)
    # ... until an earlier version's replica suspends a sandbox: its script moves the counts, not the indexes
    ready = next(r for r in await all_sandboxes(store) if r.state is SandboxState.READY)
    async with store._redis.pipeline(transaction=True) as pipe:
        pipe.hset(store.keys.sandbox(ready.sandbox_id), "s", "suspended")
        pipe.hincrby(store.keys.count_state, f"ready:{ready.pool}", -1)
        pipe.hincrby(store.keys.count_state, f"suspended:{ready.pool}", 1)
        await pipe.execute()
    suspended = store.keys.state_index("suspended", ready.pool)
    assert await store._redis.zscore(suspended, ready.sandbox_id) is None  # the reaper would not see it
    assert await store.backfill_indexes(7)
    assert not await _sweep_idle(store)  # a round is under way
    assert await _sweep_until_idle(store, 7) <= 10  # that round, and one that finds nothing more to list
    assert await store._redis.zscore(suspended, ready.sandbox_id) is not None
    for _ in range(3):
        assert await store.backfill_indexes(7)
        assert await _sweep_idle(store)


async def test_a_reaper_batch_reaches_other_replicas_in_a_few_messages(replicas: Callable[..., RedisStore]) -> None:
    """Claims and settlements of a batch are one message per kind, not one per sandbox (every replica
    reads each); another replica still drops every route and session, and its waiters wake at once."""
    clock = FakeClock()
    a, b = replicas("replica-a", clock=clock), replicas("replica-b", clock=clock, recheck_interval=60.0)
    own = [per_session_sandbox_id(f"s-{i}") for i in range(3)]
    for i, sandbox_id in enumerate(own):
        await a.put_binding(binding(f"s-{i}", sandbox_id, pool="small"))
        await a.reserve_sandbox(record(sandbox_id, pool="small"), Caps(), 30)
        await a.mark_ready(sandbox_id, ENDPOINT)
    seen: list[str] = []
    b.subscribe(seen.append)
    await b.subscribed()
    clock.advance(100)
    due = [Due(sandbox_id, SandboxState.READY, clock(), SandboxState.DELETING) for sandbox_id in own]
    async with a._redis.pubsub() as watch:
        await watch.subscribe(a.keys.settled, a.keys.invalidate)
        assert await a.claim_due(due, clock() + 30, "claim-1") == [Claim.CLAIMED] * 3
        waiter = asyncio.create_task(b.wait_settled(own[0], 30))
        await asyncio.sleep(0.2)
        assert not waiter.done()
        assert await a.finish_due([], own, "claim-1") == []
        async with asyncio.timeout(10):
            assert (await waiter).outcome is Settled.REMOVED  # the message, not the 60 s re-check
            while len(seen) < 9:
                await asyncio.sleep(0.01)
        messages = []
        while (message := await watch.get_message(timeout=0.5)) is not None:
            if message["type"] == "message":
                messages.append(message["channel"])
    assert sorted(seen) == sorted(own * 2 + [f"s-{i}" for i in range(3)])  # claimed; deleted with its session
    assert messages == [a.keys.invalidate, a.keys.settled, a.keys.invalidate]  # three for the batch

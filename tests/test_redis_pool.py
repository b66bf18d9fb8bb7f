"""The store's connection pool serves its waiters in order (gateway/store/redis_pool.py), on a real redis-server.

Before it, redis-py's BlockingConnectionPool let a task that had just released a connection take it back
for its next command ahead of the callers already waiting, and on Python 3.11 a waiter cancelled just
after it was notified dropped the notification: in a wake storm (issue 27) requests waited out
``pool_timeout`` (503 "cannot be reached") and a lease renewal queued long enough for the lease to lapse.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from gateway.store.redis import RedisStore
from tests.redis_server import RedisServer

POOL_TIMEOUT = 1.5  # long against a command on loopback, short for a test


@pytest.fixture
async def store(redis_server: RedisServer) -> AsyncIterator[RedisStore]:
    store = RedisStore(redis_server.url, "pool-test", "r1", max_connections=2, pool_timeout=POOL_TIMEOUT)
    yield store
    await store.close()


@contextlib.asynccontextmanager
async def busy_callers(store: RedisStore, counts: list[int]) -> AsyncIterator[None]:
    """``len(counts)`` callers sending one command after another on the pool's two connections, each
    counting what it was served; entered once every one was served (both connections busy, others queued)."""
    stop = asyncio.Event()

    async def busy(i: int) -> None:
        while not stop.is_set():
            await store.ping()
            counts[i] += 1

    tasks = [asyncio.create_task(busy(i)) for i in range(len(counts))]
    try:
        while min(counts) == 0 and sum(counts) < 200:
            await asyncio.sleep(0)
        yield
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_busy_callers_cannot_keep_the_connections_from_one_that_waits(store: RedisStore) -> None:
    """A caller that queues behind four busy ones is served within a round of theirs, and every busy one
    gets its turn, not only the two that hold a connection."""
    counts = [0, 0, 0, 0]
    async with busy_callers(store, counts):
        loop = asyncio.get_running_loop()
        began, before = loop.time(), sum(counts)
        await store.ping()
        waited, served_meanwhile = loop.time() - began, sum(counts) - before
    assert waited < POOL_TIMEOUT / 2, f"it waited {waited:.2f}s for a connection"
    assert served_meanwhile <= 2 * len(counts), f"{served_meanwhile} commands went ahead of it"
    assert min(counts) > 0, f"a caller never got a connection: {counts}"


async def test_lease_renewals_go_ahead_of_the_queue(store: RedisStore) -> None:
    """The reaper's lease and a wake's renewal wait for the commands in flight (two), not the fourteen queued
    (the other connection may serve a few more while the renewal's own round trip runs)."""
    assert await store.acquire_lease("warm-up", "me", 10.0)  # the scripts loaded: one command each, not three
    assert not await store.extend_lease("ses-none", [1.0], 2.0)
    counts = [0] * 16
    async with busy_callers(store, counts):
        for renew in (lambda: store.acquire_lease("reaper", "me", 10.0),
                      lambda: store.extend_lease("ses-none", [1.0], 2.0)):
            before = sum(counts)
            await renew()
            assert sum(counts) - before <= 6, f"{sum(counts) - before} commands went ahead of a renewal"


async def test_a_waiter_cancelled_as_it_is_handed_a_connection_passes_it_on(store: RedisStore) -> None:
    pool = store._pool
    held = [await pool.get_connection(), await pool.get_connection()]  # the pool is empty
    first = asyncio.create_task(pool.get_connection())
    second = asyncio.create_task(pool.get_connection())
    await asyncio.sleep(0)  # both wait, in order
    await pool.release(held.pop())  # goes to the first waiter...
    first.cancel()  # ...which gives up before it runs
    with contextlib.suppress(asyncio.CancelledError):
        await first
    connection = await asyncio.wait_for(second, POOL_TIMEOUT / 2)  # not left free while the second sleeps
    await pool.release(connection)
    await pool.release(held.pop())
    await store.ping()  # the pool still works, and nothing was lost from it
    assert len(pool._in_use_connections) == 0 and len(pool._available_connections) == 2

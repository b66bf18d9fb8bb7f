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


async def test_busy_callers_cannot_keep_the_connections_from_one_that_waits(store: RedisStore) -> None:
    """Four callers send one command after another on two connections; a lease taken meanwhile is served
    within a few of their commands, and every caller gets its turn, not the two that hold a connection."""
    assert await store.acquire_lease("warm-up", "me", 10.0)  # the script loaded: one command, not three
    counts = [0, 0, 0, 0]
    stop = asyncio.Event()

    async def busy(i: int) -> None:
        while not stop.is_set():
            await store.ping()
            counts[i] += 1

    tasks = [asyncio.create_task(busy(i)) for i in range(len(counts))]
    try:
        while min(counts) == 0 and sum(counts) < 200:  # both connections busy, callers queued
            await asyncio.sleep(0)
        loop = asyncio.get_running_loop()
        began, before = loop.time(), sum(counts)
        assert await store.acquire_lease("reaper", "me", 10.0)
        waited, served_meanwhile = loop.time() - began, sum(counts) - before
        assert waited < POOL_TIMEOUT / 2, f"the lease waited {waited:.2f}s for a connection"
        assert served_meanwhile <= 2 * len(counts), f"{served_meanwhile} commands went ahead of it"
        assert min(counts) > 0, f"a caller never got a connection: {counts}"
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)


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

"""The lock on a local sandbox's directory (gateway/providers/_locks.py) is waited for
on the loop, not in a worker thread: another replica holds it through a whole start (seconds),
and the loop's default executor (a few threads) is what ``prepare``, ``rmtree`` and name
resolution run in. A blocking ``flock`` in a thread held one per waiter, so two replicas waiting
on each other's locks could run both executors dry."""

from __future__ import annotations

import asyncio
import fcntl
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gateway.providers._locks import FileLock


async def test_a_lock_held_elsewhere_is_waited_for_with_the_executor_free(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    holder = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)  # another open file: another replica's lock
    fcntl.flock(holder, fcntl.LOCK_EX)
    loop = asyncio.get_running_loop()
    executor = ThreadPoolExecutor(max_workers=1)
    loop.set_default_executor(executor)
    acquired = asyncio.Event()

    async def take() -> None:
        async with FileLock(path):
            acquired.set()

    waiter = asyncio.create_task(take())
    try:
        # The one worker thread stays free while the lock is waited for.
        assert await asyncio.wait_for(asyncio.to_thread(lambda: "free"), 5) == "free"
        assert not acquired.is_set()
        fcntl.flock(holder, fcntl.LOCK_UN)
        await asyncio.wait_for(acquired.wait(), 5)
        await waiter
    finally:
        waiter.cancel()
        os.close(holder)
        executor.shutdown(wait=False)


async def test_a_cancelled_wait_gives_up_its_descriptor(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    holder = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(holder, fcntl.LOCK_EX)
    before = len(os.listdir("/proc/self/fd"))
    lock = FileLock(path)
    waiter = asyncio.create_task(lock.__aenter__())
    await asyncio.sleep(0)  # one turn: it has opened the file and tried the lock
    assert len(os.listdir("/proc/self/fd")) == before + 1
    waiter.cancel()
    try:
        await waiter
    except asyncio.CancelledError:
        pass
    assert len(os.listdir("/proc/self/fd")) == before  # closed; nothing left to lock it later
    fcntl.flock(holder, fcntl.LOCK_UN)
    os.close(holder)

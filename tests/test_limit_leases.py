"""Org limits for the whole installation (gateway/limit_leases.py) on a real redis-server: three
limiters stand for three replicas; one runs in a process of its own that is killed with slots held."""

from __future__ import annotations

import asyncio
import signal
import sys
import textwrap
import time

import pytest

from gateway.errors import CapacityExceeded
from gateway.limit_leases import LimitLedger, SharedOrgLimits
from gateway.store.redis import RedisStore
from tests.redis_server import RedisServer


class Replicas:
    """Three stores and their limiters on one Redis, as three replicas would have them."""

    def __init__(self, url: str, **limits: object) -> None:
        self.stores = [RedisStore(url, "lim", f"replica-{i}") for i in range(3)]
        self.limiters = [SharedOrgLimits(s.limit_ledger(), **limits) for s in self.stores]  # type: ignore[arg-type]

    async def close(self) -> None:
        for limiter in self.limiters:
            await limiter.close()
        for store in self.stores:
            await store.close()


async def offer(limiters: list[SharedOrgLimits], key: str, seconds: float, per_tick: int = 6,
                tick: float = 0.005) -> tuple[list[float], int]:
    """Requests for ``key`` round-robin over ``limiters`` for ``seconds``: when each was admitted, and
    how many were offered."""
    admitted: list[float] = []
    offered = 0
    start = time.monotonic()
    while (now := time.monotonic()) - start < seconds:
        for limiter in limiters:
            for _ in range(per_tick):
                offered += 1
                try:
                    limiter.admit(key)
                    admitted.append(now - start)
                except CapacityExceeded:
                    pass
        await asyncio.sleep(tick)
    return admitted, offered


@pytest.mark.parametrize("spread", [pytest.param(3, id="over three replicas"), pytest.param(1, id="all on one")])
async def test_the_rate_holds_for_the_installation(redis_server: RedisServer, spread):
    replicas = Replicas(redis_server.url, rate=100.0, burst=50)
    try:
        admitted, offered = await offer(replicas.limiters[:spread], "org-a", 4.0)
    finally:
        await replicas.close()
    window = [t for t in admitted if t >= 1.0]  # past the burst
    rate = len(window) / 3.0
    assert offered / 4.0 > 200, offered  # the load was well over the limit
    assert 90 <= rate <= 110, rate  # 100/s +-10% in total (per replica, three replicas admitted ~300/s)


class SlowLedger:
    """A replica's real Redis ledger, answering ``delay`` seconds late: its event loop starved by the
    traffic it carries, or a Redis far away."""

    def __init__(self, ledger: LimitLedger, delay: float) -> None:
        self._ledger = ledger
        self._delay = delay

    async def take_tokens(self, key: str, rate: float, burst: float, want: int) -> tuple[int, float]:
        await asyncio.sleep(self._delay)  # the latency itself is what is under test
        return await self._ledger.take_tokens(key, rate, burst, want)

    async def hold_slots(self, key: str, want: int, used: int, cap: int, lease: float) -> tuple[int, int, int]:
        return await self._ledger.hold_slots(key, want, used, cap, lease)


async def test_the_rate_holds_when_each_round_trip_is_slower_than_a_batch(redis_server: RedisServer):
    """Three replicas whose batches (5 tokens at 100/s) take 500 ms to come back: taking a batch and
    its credit per round trip admitted 48/s while the bucket overflowed; each takes what the bucket held
    as well."""
    stores = [RedisStore(redis_server.url, "slow", f"replica-{i}") for i in range(3)]
    limiters = [SharedOrgLimits(SlowLedger(s.limit_ledger(), 0.5), rate=100.0, burst=50) for s in stores]
    try:
        admitted, offered = await offer(limiters, "org-a", 4.0)
    finally:
        for limiter in limiters:
            await limiter.close()
        for store in stores:
            await store.close()
    rate = len([t for t in admitted if t >= 1.0]) / 3.0
    assert offered / 4.0 > 200, offered
    assert 90 <= rate <= 110, rate


async def test_per_replica_scope_admits_per_replica(redis_server: RedisServer):
    """The old meaning, still there for installations without Redis: each replica its own rate."""
    from gateway.limits import OrgLimits

    limiters = [OrgLimits(rate=100.0, burst=10) for _ in range(3)]
    admitted, _ = await offer(limiters, "org-a", 2.0)  # type: ignore[arg-type]
    assert len([t for t in admitted if t >= 0.5]) / 1.5 > 250


async def settle(limiters: list[SharedOrgLimits]) -> None:
    """Let every limiter's background syncs finish (their tasks are the events to wait for)."""
    async with asyncio.timeout(10):
        while any(limiter._tasks for limiter in limiters):
            await asyncio.wait(set().union(*(limiter._tasks for limiter in limiters)))


async def open_until_refused(limiters: list[SharedOrgLimits], key: str, attempts: int) -> int:
    opened = 0
    for i in range(attempts):
        try:
            limiters[i % len(limiters)].open_stream(key)
            opened += 1
        except CapacityExceeded:
            pass
        await settle(limiters)
    return opened


async def test_streams_hold_for_the_installation(redis_server: RedisServer):
    replicas = Replicas(redis_server.url, max_streams=20)
    try:
        limiters = replicas.limiters
        opened = await open_until_refused(limiters, "org-s", 60)
        assert 18 <= opened <= 22, opened  # 20 +-10% across three replicas, not 60
        for _ in range(5):  # closing some on one replica frees room on the others
            limiters[0].close_stream("org-s")
        await settle(limiters)
        again = await open_until_refused(limiters[1:], "org-s", 20)
        assert 4 <= again <= 6, again
    finally:
        await replicas.close()


HOLDER = textwrap.dedent("""
    import asyncio, sys
    from gateway.limit_leases import LimitLedger, SharedOrgLimits
    from gateway.store.redis import RedisStore

    async def main():
        store = RedisStore(sys.argv[1], "lim", "doomed")
        limits = SharedOrgLimits(store.limit_ledger(), max_streams=10, slot_lease=float(sys.argv[2]))
        for _ in range(10):
            limits.open_stream("org-k")
            while limits._tasks:
                await asyncio.wait(set(limits._tasks))
        print(limits.open_streams("org-k"), flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
""")


async def test_a_killed_replica_gives_its_slots_back_within_its_lease(redis_server: RedisServer):
    lease = 2.0
    holder = await asyncio.create_subprocess_exec(sys.executable, "-c", HOLDER, redis_server.url, str(lease),
                                                  stdout=asyncio.subprocess.PIPE)
    replicas = Replicas(redis_server.url, max_streams=10)
    try:
        assert holder.stdout is not None
        assert (await asyncio.wait_for(holder.stdout.readline(), 30)).strip() == b"10"
        # all ten are the doomed one's: each replica that had not counted this org yet admits one on
        # credit (the stated tolerance: one per replica), then refuses
        assert await open_until_refused(replicas.limiters, "org-k", 9) == 3
        holder.send_signal(signal.SIGKILL)
        await holder.wait()
        killed = time.monotonic()
        async with asyncio.timeout(lease + 5):
            while await open_until_refused(replicas.limiters[:1], "org-k", 1) == 0:
                await asyncio.sleep(0.05)  # polling the lease's expiry: nothing announces it
        freed_after = time.monotonic() - killed
        assert freed_after <= lease + 0.5, freed_after
        assert await open_until_refused(replicas.limiters, "org-k", 12) == 6  # ten in all, again
    finally:
        if holder.returncode is None:
            holder.kill()
            await holder.wait()
        await replicas.close()


def test_the_startup_line_says_which_scope_is_in_force():
    from gateway.app import tenant_limits
    from gateway.settings import Settings
    from routing import default_policy

    shared = Settings(redis_url="redis://127.0.0.1:1/0", org_rate_limit=50)
    assert tenant_limits(shared, default_policy()).startswith("tenant limits (org limits for the installation): ")
    alone = Settings(redis_url="redis://127.0.0.1:1/0", org_rate_limit=50, org_limits_scope="replica")
    assert tenant_limits(alone, default_policy()).startswith("tenant limits (per replica): ")
    assert tenant_limits(Settings(org_rate_limit=50), default_policy()).startswith("tenant limits (per replica): ")

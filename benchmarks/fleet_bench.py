"""Background cost at fleet size: a replica's idle CPU, one page of GET /v1/sandboxes, a reaper pass.

    .venv/bin/python benchmarks/fleet_bench.py [--sandboxes 100000] [--seconds 30] [--url redis://...]

1. Fills a Redis with ``--sandboxes`` sessions, each bound to its own ready sandbox, through the
   store's own scripts (``RedisStore.load_ready``: ``put_binding``, ``reserve_sandbox`` and
   ``mark_ready`` pipelined; versions without it: those public calls, many in flight), so the
   layout is exactly what a running gateway writes; prints Redis ``used_memory`` per session.
2. Starts a real ``sandbox-gateway serve`` on that Redis (default policy, local provider, no
   traffic) and reads its CPU time from ``/proc/<pid>/stat`` over ``--seconds``: the idle cost of
   gauges, reaping and orphan sweeps at that size. Target: under 2% at 100,000.
   ``GET /v1/sandboxes?limit=100`` on that replica, unfiltered (target: under 50 ms) and filtered
   by ``?state=ready``, ``?pool=small`` and ``?state=suspended`` (nothing matches: the worst case
   of a filter run over the whole index): the median of ``--requests``. Target: under 20 ms.
3. Route resolution on a cache miss (``get_binding`` + ``get_sandbox``), median of 2,000.
4. One reaper pass (``reap_once`` + ``sweep_orphans``, what a replica runs every
   ``reap_interval``) in this process with nothing idle (the steady state), then with every
   sandbox idle (``--idle-pass``). With ``--drain S``, ``--due`` (0.58) of the fleet is left idle
   (the rest touched), and reaper passes run back to back until nothing is due or for up to S
   seconds: the reaping throughput, the drain time (target: under 10 minutes), and the serve
   replica's CPU meanwhile (it does not hold the reaper lease: what every other replica pays for a
   drain); then the pages again.

Before/after: run it with ``PYTHONPATH`` pointing at another checkout (e.g. an exported
``main``); it uses only calls that every version has. Each run prints one table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from redis.asyncio import Redis

if "PYTHONPATH" not in os.environ:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.model import Binding, Endpoint, Owner, SandboxRecord, SandboxState  # noqa: E402
from gateway.store.base import Caps  # noqa: E402
from gateway.store.redis import RedisStore  # noqa: E402
from routing import Isolation  # noqa: E402

PREFIX = "sgw"  # serve's default --redis-prefix
INFLIGHT = 256


def per_session(i: int) -> tuple[Binding, SandboxRecord]:
    """Session ``i`` bound to its own ``ses-`` sandbox; realistic lengths (UUID orgs and users)."""
    session_id = f"agent_{i:08d}-5453-4ae3-a51f-a8d2274a7b56"
    sandbox_id = "ses-" + hashlib.sha256(session_id.encode()).hexdigest()[:48]
    owner = Owner(f"{i % 977:08d}-5453-4ae3-a51f-a8d2274a7b56", f"{i:08d}-63c2-4d14-84b3-60d6ac3b592f", None)
    now = time.time()
    binding = Binding(session_id, sandbox_id, "small", Isolation.PER_SESSION, owner, now)
    return binding, SandboxRecord(sandbox_id, "small", owner.org_id, SandboxState.CREATING, created_at=now,
                                  owner=owner)


async def fill(url: str, count: int) -> tuple[float, float]:
    """Seconds to load ``count`` sessions, and Redis bytes per session (``used_memory`` delta)."""
    # Activity stamped an hour ahead: a serve replica's own reaper (the real clock) finds nothing idle,
    # however long the fill took (the drain's reaper runs its clock two days on).
    ahead = time.time() + 3600
    store = RedisStore(url, PREFIX, "bench-loader", max_connections=INFLIGHT, socket_timeout=60.0,
                       clock=lambda: ahead)
    started = time.perf_counter()
    endpoint = Endpoint("127.0.0.1", 9)
    client = Redis.from_url(url)
    used = (await client.info("memory"))["used_memory"]

    async def one(i: int) -> None:
        binding, record = per_session(i)
        await store.put_binding(binding)
        await store.reserve_sandbox(record, Caps(), 600)
        await store.mark_ready(record.sandbox_id, endpoint)

    try:
        if hasattr(store, "load_ready"):  # the bulk path: the same scripts, pipelined
            for start in range(0, count, 2000):
                await store.load_ready([(*per_session(i), endpoint) for i in range(start, min(count, start + 2000))])
        else:
            for start in range(0, count, INFLIGHT):
                await asyncio.gather(*(one(i) for i in range(start, min(count, start + INFLIGHT))))
        elapsed = time.perf_counter() - started
        per = ((await client.info("memory"))["used_memory"] - used) / count
    finally:
        await store.close()
        await client.aclose()
    return elapsed, per


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


@contextlib.asynccontextmanager
async def serving(url: str, workdir: Path) -> AsyncIterator[tuple[Any, set[int]]]:
    """A real ``sandbox-gateway serve`` on that Redis (no traffic), and the PIDs of its processes."""
    from tests.gateway_process import GatewayProcess

    gateway = await GatewayProcess(workdir, "--redis-url", url, "--no-access-log").start(timeout=120)
    try:
        assert gateway.proc is not None
        worker = next(int(line.split("pid ")[1].split(")")[0]) for line in gateway.log if "serving (worker" in line)
        await asyncio.sleep(5.0)  # past startup
        yield gateway, {gateway.proc.pid, worker}
    finally:
        await gateway.stop()


def cpu_of(pids: set[int]) -> float:
    return sum(cpu_seconds(pid) for pid in pids)


async def page_ms(gateway: Any, params: dict[str, str], requests: int) -> tuple[float, str]:
    """Median ms of ``GET /v1/sandboxes`` with ``params``, and what the last page held."""
    timings, outcome = [], ""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        for _ in range(requests):
            started = time.perf_counter()
            async with http.get(f"{gateway.control_url}/v1/sandboxes", params=params) as response:
                body = await response.json()
            timings.append(time.perf_counter() - started)
            if response.status != 200:
                return timings[-1] * 1000, f"{response.status} {body['error']['code']}"
            outcome = f"{len(body['sandboxes']):,} listed"
            if len(body["sandboxes"]) > 100:
                break  # a version without paging answered everything: one request says enough
    return statistics.median(timings) * 1000, outcome


PAGES = {  # what a page is timed for: limit=100, unfiltered and filtered
    "GET /v1/sandboxes?limit=100": {},
    "  ?state=ready": {"state": "ready"},
    "  ?pool=small": {"pool": "small"},
    "  ?state=suspended (no match)": {"state": "suspended"},
}


async def time_pages(gateway: Any, requests: int, when: str) -> list[tuple[str, str, str]]:
    rows = []
    for name, params in PAGES.items():
        ms, listed = await page_ms(gateway, {"limit": "100", **params}, requests)
        rows.append((f"{name}{when}", f"{ms:.1f} ms ({listed})", "< 20 ms" if params else "< 50 ms"))
    return rows


async def keep_active(url: str, count: int, fraction: float, offset: float) -> None:
    """Mark ``fraction`` of the fleet active at the reaper's clock (``offset`` seconds on): the rest is due."""
    store = RedisStore(url, PREFIX, "bench-activity", socket_timeout=60.0)
    try:
        at = time.time() + offset
        active = [per_session(i)[0].sandbox_id for i in range(int(count * fraction))]
        for start in range(0, len(active), 5000):
            await store.touch({sandbox_id: at for sandbox_id in active[start:start + 5000]}, {})
    finally:
        await store.close()


async def route_resolution(url: str, count: int, lookups: int = 2000) -> float:
    """Median ms of what a replica does on a route-cache miss (``get_binding`` then ``get_sandbox``)."""
    import random

    store = RedisStore(url, PREFIX, "bench-lookups")
    try:
        timings = []
        for i in random.Random(7).sample(range(count), min(lookups, count)):
            binding, _ = per_session(i)
            started = time.perf_counter()
            found = await store.get_binding(binding.session_id)
            assert found is not None and await store.get_sandbox(found.sandbox_id) is not None
            timings.append(time.perf_counter() - started)
        return statistics.median(timings) * 1000
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def reaper(url: str, workdir: Path, offset: float, name: str) -> AsyncIterator[Any]:
    """A router in this process holding the reaper lease, its clock ``offset`` seconds on."""
    from gateway.providers.base import PoolProviders
    from gateway.providers.local import LocalProvider
    from gateway.sessions import SessionRouter
    from routing import default_policy

    store = RedisStore(url, PREFIX, name, clock=lambda: time.time() + offset)
    local = LocalProvider(workdir, stop_on_close=False)
    providers = PoolProviders({"small": local, "shared": local})
    router = SessionRouter(store, providers, default_policy([]), replica_id=name, clock=lambda: time.time() + offset)
    await providers.start(router.sandbox_lost)
    try:
        await store._redis.delete(store.keys.lease("reaper"))  # the stopped replica's lease
        yield router
    finally:
        await providers.close()
        await store.close()


IDLE_OFFSET = 86_400.0 * 2  # the reaper's clock two days on: every sandbox (and session) not touched since is idle


async def reap_pass(url: str, workdir: Path, *, idle: bool) -> tuple[float, int]:
    offset = IDLE_OFFSET if idle else 0.0
    async with reaper(url, workdir, offset, "bench-reaper") as router:
        started = time.perf_counter()
        reaped = await router.lifecycle.reap_once()
        await router.lifecycle.sweep_orphans(600.0)
        return (time.perf_counter() - started) * 1000, len(reaped)


async def drain(url: str, workdir: Path, seconds: float) -> tuple[int, float, bool]:
    """Reaper passes back to back, for up to ``seconds`` or until nothing is due: (sandboxes reaped,
    seconds taken, drained). What the lease holder does while a backlog lasts, minus the sleep
    between passes (serve's pass goes on for up to 4 x reap_interval, then sleeps one)."""
    reaped = 0
    async with reaper(url, workdir, IDLE_OFFSET, "bench-drain") as router:
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            done = len(await router.lifecycle.reap_once())
            reaped += done
            if not done:
                return reaped, time.perf_counter() - started, True
        return reaped, time.perf_counter() - started, False


async def run(args: argparse.Namespace, url: str) -> None:
    rows: list[tuple[str, str, str]] = []
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        if args.fill:
            loaded, per_session_bytes = await fill(url, args.sandboxes)
            print(f"filled {args.sandboxes:,} sessions, each with its own ready sandbox, in {loaded:.1f} s: "
                  f"{per_session_bytes:,.0f} B of redis used_memory per session", flush=True)
        async with serving(url, Path(tmp) / "serve") as (gateway, pids):
            before = cpu_of(pids)
            await asyncio.sleep(args.seconds)
            cpu = (cpu_of(pids) - before) / args.seconds * 100
            rows.append(("replica idle CPU", f"{cpu:.2f}%", "< 2%"))
            rows += await time_pages(gateway, args.requests, "")
            print("\n".join(f"  {name}: {value}" for name, value, _ in rows), flush=True)
            lookup_ms = await route_resolution(url, args.sandboxes)
            steady_ms, _ = await reap_pass(url, Path(tmp) / "reaper", idle=False)
            rows += [("route resolution, cache miss (p50)", f"{lookup_ms:.2f} ms", ""),
                     ("reaper pass + sweep, nothing idle", f"{steady_ms:.1f} ms", "")]
            if args.idle_pass:
                idle_ms, reaped = await reap_pass(url, Path(tmp) / "reaper", idle=True)
                rows.append(("reaper pass + sweep, all idle", f"{idle_ms:.1f} ms ({reaped:,} reaped)", ""))
            if args.drain:
                await keep_active(url, args.sandboxes, 1 - args.due, IDLE_OFFSET)
                before = cpu_of(pids)
                drained, took, done = await drain(url, Path(tmp) / "drain", args.drain)
                during = (cpu_of(pids) - before) / took * 100 if took else 0.0
                rate = drained / took if took else 0.0
                backlog = args.due * args.sandboxes
                rows.append((f"reaping throughput, {args.due:.0%} due", f"{rate:,.0f}/s ({drained:,} in {took:.0f} s)", ""))
                rows.append((f"drain {args.due:.0%} of {args.sandboxes:,}",
                             f"{took / 60:.1f} min (drained)" if done else
                             f"{backlog / rate / 60:.1f} min (projected)" if rate else "-", "< 10 min"))
                rows.append(("non-holder replica CPU while it drains", f"{during:.2f}%", ""))
                rows += await time_pages(gateway, args.requests, ", after the drain")
    print(f"\n{args.sandboxes:,} sandboxes, code from {os.environ.get('PYTHONPATH') or 'this checkout'}")
    for name, value, target in rows:
        print(f"  {name:<42} {value:>34}  {target}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sandboxes", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=30.0, help="idle CPU measured over this long")
    parser.add_argument("--requests", type=int, default=20, help="GET /v1/sandboxes requests (median)")
    parser.add_argument("--idle-pass", action="store_true", help="also reap one batch with everything idle")
    parser.add_argument("--drain", type=float, default=0.0, metavar="SECONDS",
                        help="then reap passes back to back, --due of the fleet idle, until drained or for up to "
                             "this long: the reaping throughput, the drain time, a non-holder replica's CPU meanwhile")
    parser.add_argument("--due", type=float, default=0.58, help="the fraction of the fleet idle for --drain")
    parser.add_argument("--url", help="an existing Redis (flushed first!); default: a private redis-server")
    parser.add_argument("--no-fill", dest="fill", action="store_false",
                        help="with --url: measure what is there (a previous run's fill), flush nothing")
    args = parser.parse_args()
    from benchmarks.harness import reported

    with reported("fleet_bench.py"):
        if args.url:
            import redis

            if args.fill:
                redis.Redis.from_url(args.url).flushdb()
            asyncio.run(run(args, args.url))
            return
        from tests.redis_server import RedisServer

        with RedisServer() as server:  # a private one, removed with its data afterwards
            asyncio.run(run(args, server.url))


if __name__ == "__main__":
    main()
